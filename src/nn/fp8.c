/* fp8.c - the per-tensor float8 recipe (mixprec/fp8.h): its settings and
 * their names, the scale rule, amax and the scaled cast to fp8, and the
 * state of one quantized tensor (amax history, pending amax, scale) with
 * its commit after a step. Which layers use it and the model's collection
 * of these states are in fp8_model.c. */
#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "nn/model_internal.h"
#include "nn/quant.h"

/* ----------------------------------------------------------- settings */

static const char *const format_names[] = {"hybrid", "e4m3"};
static const char *const scaling_names[] = {"delayed", "current"};
static const char *const algorithm_names[] = {"max", "most_recent"};

mp_float8_params mp_float8_params_default(void)
{
    mp_float8_params p;
    memset(&p, 0, sizeof p);
    p.format = MP_FLOAT8_HYBRID;
    p.scaling = MP_FLOAT8_DELAYED;
    p.amax_history_len = 1024;
    p.algorithm = MP_FLOAT8_AMAX_MAX;
    p.margin = 0;
    p.keep_first_last = true;
    return p;
}

const char *mp_float8_format_name(mp_float8_format f)
{
    return (unsigned)f < 2 ? format_names[f] : "?";
}
const char *mp_float8_scaling_name(mp_float8_scaling s)
{
    return (unsigned)s < 2 ? scaling_names[s] : "?";
}
const char *mp_float8_algorithm_name(mp_float8_amax_algorithm a)
{
    return (unsigned)a < 2 ? algorithm_names[a] : "?";
}

mp_status mp_float8_params_validate(const mp_float8_params *p)
{
    if (!p) return mp_set_error(MP_ERR_INVALID, "float8: no settings (NULL)");
    if ((unsigned)p->format > MP_FLOAT8_E4M3)
        return mp_set_error(MP_ERR_INVALID, "float8: unknown format %d (expected hybrid or e4m3)",
                            (int)p->format);
    if ((unsigned)p->scaling > MP_FLOAT8_CURRENT)
        return mp_set_error(MP_ERR_INVALID,
                            "float8: unknown scaling %d (expected delayed or current)",
                            (int)p->scaling);
    if ((unsigned)p->algorithm > MP_FLOAT8_AMAX_MOST_RECENT)
        return mp_set_error(MP_ERR_INVALID,
                            "float8: unknown amax algorithm %d (expected max or most_recent)",
                            (int)p->algorithm);
    if (p->amax_history_len < 1 || p->amax_history_len > MP_FLOAT8_MAX_HISTORY)
        return mp_set_error(MP_ERR_INVALID, "float8: amax_history_len %d is not in 1..%d",
                            (int)p->amax_history_len, MP_FLOAT8_MAX_HISTORY);
    if (p->margin < 0 || p->margin > MP_FLOAT8_MAX_MARGIN)
        return mp_set_error(MP_ERR_INVALID, "float8: margin %d is not in 0..%d", (int)p->margin,
                            MP_FLOAT8_MAX_MARGIN);
    return MP_OK;
}

static int name_index(const char *v, const char *const *names, int n)
{
    for (int i = 0; v && i < n; i++)
        if (!strcmp(v, names[i])) return i;
    return -1;
}

static bool parse_int(const char *v, long lo, long hi, int32_t *out)
{
    if (!v || !*v) return false;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi) return false;
    *out = (int32_t)x;
    return true;
}

mp_status mp_float8_params_set(mp_float8_params *p, const char *key, const char *value)
{
    const char *v = value ? value : "(null)";
    int i;
    if (!p || !key) return mp_set_error(MP_ERR_INVALID, "float8: no setting named (NULL)");
    if (!strcmp(key, "format")) {
        if ((i = name_index(value, format_names, 2)) < 0)
            return mp_set_error(MP_ERR_INVALID,
                                "float8: unknown format '%s' (expected hybrid or e4m3)", v);
        p->format = (mp_float8_format)i;
    } else if (!strcmp(key, "scaling")) {
        if ((i = name_index(value, scaling_names, 2)) < 0)
            return mp_set_error(MP_ERR_INVALID,
                                "float8: unknown scaling '%s' (expected delayed or current)", v);
        p->scaling = (mp_float8_scaling)i;
    } else if (!strcmp(key, "algorithm")) {
        if ((i = name_index(value, algorithm_names, 2)) < 0)
            return mp_set_error(MP_ERR_INVALID,
                                "float8: unknown amax algorithm '%s' (expected max or most_recent)",
                                v);
        p->algorithm = (mp_float8_amax_algorithm)i;
    } else if (!strcmp(key, "amax_history_len")) {
        if (!parse_int(value, 1, MP_FLOAT8_MAX_HISTORY, &p->amax_history_len))
            return mp_set_error(MP_ERR_INVALID,
                                "float8: amax_history_len '%s' is not an integer in 1..%d", v,
                                MP_FLOAT8_MAX_HISTORY);
    } else if (!strcmp(key, "margin")) {
        if (!parse_int(value, 0, MP_FLOAT8_MAX_MARGIN, &p->margin))
            return mp_set_error(MP_ERR_INVALID, "float8: margin '%s' is not an integer in 0..%d", v,
                                MP_FLOAT8_MAX_MARGIN);
    } else if (!strcmp(key, "keep_first_last")) {
        if ((i = name_index(value, (const char *const[]){"false", "true"}, 2)) < 0)
            return mp_set_error(MP_ERR_INVALID,
                                "float8: keep_first_last '%s' (expected true or false)", v);
        p->keep_first_last = i == 1;
    } else {
        return mp_set_error(MP_ERR_INVALID,
                            "float8: unknown setting '%s' (expected format, scaling, "
                            "amax_history_len, algorithm, margin or keep_first_last)",
                            key);
    }
    return MP_OK;
}

mp_dtype mp_float8_dtype(const mp_float8_params *p, mp_float8_role role)
{
    return p->format == MP_FLOAT8_HYBRID && role == MP_FLOAT8_GRAD_OUTPUT ? MP_F8E5M2 : MP_F8E4M3;
}

/* The global settings: written rarely (before models are made), read when a
 * layer is created. */
static mp_float8_params global_params;
static atomic_bool global_set;

mp_status mp_set_global_float8_params(const mp_float8_params *p)
{
    mp_status s = mp_float8_params_validate(p);
    if (s) return s;
    global_params = *p;
    atomic_store(&global_set, true);
    return MP_OK;
}

mp_float8_params mp_global_float8_params(void)
{
    return atomic_load(&global_set) ? global_params : mp_float8_params_default();
}

/* ------------------------------------------------------- the scale rule */

float mp_float8_scale(float amax, float prev, mp_dtype fp8, int margin)
{
    if (!(amax > 0.0f) || !isfinite(amax)) return prev; /* 0 or non-finite: keep */
    mp_dtype_info info;
    mp_dtype_get_info(fp8, &info);
    float s = info.max / amax;                     /* one float32 rounding */
    s = s / ldexpf(1.0f, margin < 0 ? 0 : margin); /* a power of two */
    if (s > FLT_MAX) s = FLT_MAX;
    if (s < FLT_MIN) s = FLT_MIN;
    return s;
}

/* --------------------------------------------------- amax and the cast */

/* Values are handled in chunks of CHUNK: widened to float32 (exact), their
 * |bits| maxed as integers (a NaN's magnitude bits exceed inf's, so NaN
 * wins, as the max of the ordering NaN > inf > finite), scaled and cast by
 * the bulk converter. Chunks run in parallel; max is order-free. */
#define CHUNK 4096

static const float *widen(const void *x, mp_dtype t, size_t i, size_t n, float *buf)
{
    if (t == MP_F32) return (const float *)x + i;
    mp_convert(buf, MP_F32, (const char *)x + i * mp_dtype_size(t), t, n);
    return buf;
}

MP_SIMD_CLONES static uint32_t amax_bits(const float *v, size_t n)
{
    uint32_t m = 0;
#pragma omp simd reduction(max : m)
    for (size_t i = 0; i < n; i++) {
        uint32_t b = mp_f32_bits(v[i]) & 0x7FFFFFFFu;
        m = b > m ? b : m;
    }
    return m;
}

/* amax_bits(v) and y = v * scale in one pass (one float32 rounding each) */
MP_SIMD_CLONES static uint32_t amax_bits_scaled(const float *v, size_t n, float scale, float *y)
{
    uint32_t m = 0;
#pragma omp simd reduction(max : m)
    for (size_t i = 0; i < n; i++) {
        uint32_t b = mp_f32_bits(v[i]) & 0x7FFFFFFFu;
        m = b > m ? b : m;
        y[i] = v[i] * scale;
    }
    return m;
}

float mp_float8_amax(const void *x, mp_dtype t, size_t n)
{
    uint32_t m = 0;
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) reduction(max : m) if (nchunks > 8)
    for (size_t c = 0; c < nchunks; c++) {
        float buf[CHUNK];
        size_t i = c * CHUNK, k = n - i < CHUNK ? n - i : CHUNK;
        uint32_t b = amax_bits(widen(x, t, i, k, buf), k);
        m = b > m ? b : m;
    }
    return mp_bits_f32(m);
}

/* Codes that carry x > 0 (nn/quant.h, keeps_sign): +-0 to 0x00, a
 * positive x the cast took to zero to 0x80 (-0), a negative one to 0x00;
 * NaN stays NaN. So x > 0 exactly when the code is 0x80 or decodes to
 * more than 0 (mp_op_code_mask_grad), and every value keeps its
 * magnitude: only the signs of zeros change. */
MP_SIMD_CLONES static void carry_sign(uint8_t *q, const float *v, size_t n)
{
#pragma omp simd
    for (size_t j = 0; j < n; j++) {
        const uint8_t c = q[j];
        q[j] = v[j] > 0.0f ? (c == 0x00 ? 0x80 : c) : (c == 0x80 ? 0x00 : c);
    }
}

/* codes (or NULL) and their values in bfloat16 (or NULL) of x * scale
 * for k <= CHUNK values, the codes carrying x's sign when `sign`; the amax
 * bits of x. In one pass where the path has the kernel
 * (mp_fp8_scaled_cast), else one pass per step in L1: the same bits. */
static uint32_t quantize_chunk(uint8_t *codes, uint16_t *decoded, mp_dtype fp8, const void *x,
                               mp_dtype t, size_t k, float scale, bool sign)
{
    float buf[CHUNK], y[CHUNK];
    uint8_t own[CHUNK];
    uint32_t b;
    if (mp_fp8_scaled_cast(codes, decoded, fp8, x, t, k, scale, sign, &b)) return b;
    const float *v = widen(x, t, 0, k, buf);
    b = amax_bits_scaled(v, k, scale, y);
    uint8_t *q = codes ? codes : own;
    mp_convert_ex(q, fp8, y, MP_F32, k, MP_OVERFLOW_SATURATE);
    if (sign) carry_sign(q, v, k);
    if (!decoded) return b;
    mp_convert(y, MP_F32, q, fp8, k); /* exact, and exact again in bfloat16 */
    mp_convert(decoded, MP_BF16, y, MP_F32, k);
    return b;
}

/* quantize_chunk over n values, chunks in parallel; the amax of x. */
static float quantize(uint8_t *codes, uint16_t *decoded, mp_dtype fp8, const void *x, mp_dtype t,
                      size_t n, float scale, bool sign)
{
    uint32_t m = 0;
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) reduction(max : m) if (nchunks > 8)
    for (size_t c = 0; c < nchunks; c++) {
        size_t i = c * CHUNK, k = n - i < CHUNK ? n - i : CHUNK;
        uint32_t b = quantize_chunk(codes ? codes + i : NULL, decoded ? decoded + i : NULL, fp8,
                                    (const char *)x + i * mp_dtype_size(t), t, k, scale, sign);
        m = b > m ? b : m;
    }
    return mp_bits_f32(m);
}

float mp_float8_quantize(uint8_t *codes, mp_dtype fp8, const void *x, mp_dtype t, size_t n,
                         float scale)
{
    return quantize(codes, NULL, fp8, x, t, n, scale, false);
}

float mp_float8_quantize_bf16(uint8_t *codes, uint16_t *decoded, mp_dtype fp8, const void *x,
                              mp_dtype t, size_t n, float scale)
{
    return quantize(codes, decoded, fp8, x, t, n, scale, false);
}

/* ------------------------------------------------- one tensor's state */

mp_status mp_float8_meta_init(mp_float8_meta *q, const char *layer, mp_float8_role role,
                              const mp_float8_params *p)
{
    static const char *const roles[] = {"input", "kernel", "grad_output"};
    memset(q, 0, sizeof *q);
    mp_status s = mp_float8_params_validate(p);
    if (s) return s;
    snprintf(q->name, sizeof q->name, "%s/%s", layer, roles[role]);
    q->layer = layer;
    q->role = role;
    q->params = *p;
    q->dtype = mp_float8_dtype(p, role);
    q->ops = &mp_quantizer_float8;
    q->scale = 1.0f;
    q->history = calloc((size_t)p->amax_history_len, sizeof *q->history);
    if (!q->history) return mp_set_error(MP_ERR_NOMEM, "float8: out of memory for '%s'", q->name);
    return MP_OK;
}

void mp_float8_meta_release(mp_float8_meta *q)
{
    free(q->history);
    free(q->parts);
    mp_free(q->codes);
    memset(q, 0, sizeof *q);
}

void mp_float8_meta_record(mp_float8_meta *q, float amax)
{
    /* the largest; a NaN, once seen, stays (it marks the step) */
    if (!q->has_pending)
        q->pending = amax;
    else if (!isnan(q->pending) && (isnan(amax) || amax > q->pending))
        q->pending = amax;
    q->has_pending = true;
}

float mp_float8_meta_next_scale(const mp_float8_meta *q, bool keep)
{
    if (!keep || !q->has_pending || !isfinite(q->pending) || q->params.scaling != MP_FLOAT8_DELAYED)
        return q->scale;
    /* the history after the push: pending, then the newest len - 1 */
    float amax = q->pending;
    if (q->params.algorithm == MP_FLOAT8_AMAX_MAX)
        for (int32_t i = 0; i + 1 < q->params.amax_history_len; i++)
            amax = q->history[i] > amax ? q->history[i] : amax;
    return mp_float8_scale(amax, q->scale, q->dtype, q->params.margin);
}

void mp_float8_meta_commit(mp_float8_meta *q, bool keep)
{
    if (keep && q->has_pending && isfinite(q->pending)) {
        q->scale = mp_float8_meta_next_scale(q, true);
        memmove(q->history + 1, q->history,
                (size_t)(q->params.amax_history_len - 1) * sizeof *q->history);
        q->history[0] = q->pending;
    }
    q->has_pending = false;
    q->pending = 0.0f;
}

void mp_float8_meta_set_history(mp_float8_meta *q, const float *in, float scale)
{
    memcpy(q->history, in, (size_t)q->params.amax_history_len * sizeof *in);
    q->scale = scale;
    atomic_store(&q->fresh, false);
    q->has_pending = false;
    q->pending = 0.0f;
}

/* ------------------------------- the kernel's operand from the update */

/* One thread's share of the update under way: its amax bits and the
 * values it wrote, a cache line of its own. */
struct mp_float8_part {
    uint32_t amax_bits;
    int64_t n;
    char pad[64 - sizeof(uint32_t) - sizeof(int64_t)];
};

mp_status mp_float8_meta_arm(mp_float8_meta *q, float scale, int threads)
{
    if (threads > q->nparts) {
        struct mp_float8_part *p = realloc(q->parts, (size_t)threads * sizeof *p);
        if (!p) return mp_set_error(MP_ERR_NOMEM, "float8: out of memory for '%s'", q->name);
        q->parts = p;
        q->nparts = threads;
    }
    memset(q->parts, 0, (size_t)q->nparts * sizeof *q->parts);
    q->armed_scale = scale;
    q->armed = true;
    return MP_OK;
}

void mp_float8_meta_update_chunk(void *ctx, int thread, const float *w, int64_t off, int64_t len)
{
    mp_float8_meta *q = ctx;
    if (!q->armed || thread >= q->nparts) { /* the master moved under a forward's operand */
        if (atomic_load_explicit(&q->fresh, memory_order_relaxed))
            atomic_store_explicit(&q->fresh, false, memory_order_relaxed);
        return;
    }
    struct mp_float8_part *p = &q->parts[thread];
    for (int64_t i = 0; i < len; i += CHUNK) {
        size_t k = (size_t)(len - i < CHUNK ? len - i : CHUNK);
        uint32_t b = quantize_chunk(NULL, (uint16_t *)q->codes + off + i, q->dtype, w + i, MP_F32,
                                    k, q->armed_scale, q->keeps_sign);
        p->amax_bits = b > p->amax_bits ? b : p->amax_bits;
        p->n += (int64_t)k;
    }
}

void mp_float8_meta_settle(mp_float8_meta *q, int64_t n)
{
    if (!q->armed) return;
    q->armed = false;
    uint32_t amax = 0;
    int64_t wrote = 0;
    for (int t = 0; t < q->nparts; t++) {
        amax = q->parts[t].amax_bits > amax ? q->parts[t].amax_bits : amax;
        wrote += q->parts[t].n;
    }
    if (wrote == 0) return; /* no update ran: the operand is as it was */
    /* an update over all of it rewrote every value, whatever it held */
    atomic_store(&q->fresh, wrote == n && q->scale == q->armed_scale);
    q->fresh_scale = q->armed_scale;
    q->fresh_amax = mp_bits_f32(amax);
}

/* The per-tensor quantizer: delayed scaling quantizes with the scale the
 * last commit set, current scaling with that of the tensor's amax now;
 * MP_QUANT_AGAIN and restore use the scale the forward used, which stays
 * until the next forward (current) or commit (delayed). */
static void float8_quantize(mp_float8_meta *q, const mp_quant_input *in, mp_quant_mode mode,
                            void *stored, void *operand, mp_quant_operand *out)
{
    size_t n = (size_t)(in->rows * in->cols);
    if (operand && operand == q->codes && atomic_load(&q->fresh) && q->scale == q->fresh_scale &&
        !stored) {
        /* the update left this operand (mp_float8_meta_arm): the same bits */
        if (mode == MP_QUANT_TRAIN) mp_float8_meta_record(q, q->fresh_amax);
        q->fresh_uses++;
        *out = (mp_quant_operand){operand, MP_BF16, 1.0f / q->scale};
        return;
    }
    if (operand == q->codes) /* written now, from what the master holds */
        atomic_store(&q->fresh, false);
    if (q->params.scaling == MP_FLOAT8_CURRENT && mode != MP_QUANT_AGAIN)
        q->scale = mp_float8_scale(mp_float8_amax(in->x, in->dtype, n), q->scale, q->dtype,
                                   q->params.margin);
    float amax = quantize(stored, operand, q->dtype, in->x, in->dtype, n, q->scale, q->keeps_sign);
    if (mode == MP_QUANT_TRAIN) mp_float8_meta_record(q, amax);
    *out = (mp_quant_operand){operand, MP_BF16, 1.0f / q->scale};
}

static void float8_restore(const mp_float8_meta *q, const void *stored, int64_t rows, int64_t cols,
                           void *operand, mp_quant_operand *out)
{
    mp_convert(operand, MP_BF16, stored, q->dtype, (size_t)(rows * cols)); /* exact */
    *out = (mp_quant_operand){operand, MP_BF16, 1.0f / q->scale};
}

static size_t float8_operand_bytes(int64_t rows, int64_t cols)
{
    return (size_t)(rows * cols) * sizeof(uint16_t);
}
static size_t float8_stored_bytes(int64_t rows, int64_t cols) { return (size_t)(rows * cols); }

const mp_quantizer mp_quantizer_float8 = {
    .name = "float8",
    .pass_invariant = true,
    .operand_bytes = float8_operand_bytes,
    .stored_bytes = float8_stored_bytes,
    .quantize = float8_quantize,
    .restore = float8_restore,
};
