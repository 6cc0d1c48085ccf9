/* mx_quant.c - MX (microscaling) training (mixprec/mx.h): the quantizer
 * behind the hook of nn/quant.h that fake-quantizes each GEMM operand in
 * blocks of 32 along the reduction axis of its pass, the MX settings and
 * their global default, which layers compute on MX inputs, their metas in
 * the model, and the layer fields "mx" / "mx_grad" of model files. The
 * steps a quantized layer runs are shared with float8 (fp8_model.c). */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "nn/layer.h"
#include "nn/quant.h"

/* ------------------------------------------------------------- settings */

mp_mx_params mp_mx_params_default(void) { return (mp_mx_params){MP_MXFP8_E4M3, MP_MXFP8_E5M2}; }

mp_status mp_mx_params_validate(const mp_mx_params *p)
{
    if (!p) return mp_set_error(MP_ERR_INVALID, "mx: no settings (NULL)");
    if ((unsigned)p->format >= MP_MX_FORMAT_COUNT)
        return mp_set_error(MP_ERR_INVALID, "mx: unknown format %d", (int)p->format);
    if ((unsigned)p->grad_format >= MP_MX_FORMAT_COUNT)
        return mp_set_error(MP_ERR_INVALID, "mx: unknown gradient format %d", (int)p->grad_format);
    return MP_OK;
}

/* Written rarely (before models are made), read when a layer is created. */
static mp_mx_params global_params;
static atomic_bool global_set;

mp_status mp_set_global_mx_params(const mp_mx_params *p)
{
    mp_status s = mp_mx_params_validate(p);
    if (s) return s;
    global_params = *p;
    atomic_store(&global_set, true);
    return MP_OK;
}

mp_mx_params mp_global_mx_params(void)
{
    return atomic_load(&global_set) ? global_params : mp_mx_params_default();
}

/* ------------------------------------------------------------ quantizer */

/* Another dtype (the compute dtype's activations and gradients) is built in
 * tiles of TILE_R x TILE_C elements, both multiples of the block: every MX block (32 consecutive
 * elements of a row, or 32 rows of a column; the last one of a row or column shorter) lies in one
 * tile, so tiles are independent, run in parallel and give the bits mp_mx_quantize_2d gives on the
 * whole matrix. A tile is widened to float32 on the stack, quantized there, and written out in
 * bfloat16 as long as every value is exact there (its low 16 bits zero; NaN and inf are); if one is
 * not (an MXFP8 block with a tiny scale), the whole operand is made again in float32. */
#define TILE_R MP_MX_BLOCK
#define TILE_C (8 * MP_MX_BLOCK)

/* Tile (tr, tc) of the input into dst (dt); false when dt is bfloat16 and
 * a value is not exact there. */
static bool quantize_tile(mp_mx_format f, const mp_quant_input *in, int64_t r0, int64_t c0,
                          int64_t tr, int64_t tc, void *dst, mp_dtype dt)
{
    float buf[TILE_R * TILE_C];
    size_t es = mp_dtype_size(in->dtype);
    for (int64_t r = 0; r < tr; r++)
        mp_convert(buf + r * tc, MP_F32, (const char *)in->x + ((r0 + r) * in->cols + c0) * es,
                   in->dtype, (size_t)tc);
    /* valid arguments: it cannot fail */
    (void)mp_mx_quantize_2d(f, MP_MX_BLOCK, tr, tc, in->k_axis, buf, buf, MP_F32);
    uint32_t low = 0;
    for (int64_t r = 0; r < tr; r++) {
        const float *s = buf + r * tc;
        int64_t at = (r0 + r) * in->cols + c0;
        if (dt == MP_F32) {
            memcpy((float *)dst + at, s, (size_t)tc * sizeof(float));
            continue;
        }
        uint16_t *d = (uint16_t *)dst + at;
#pragma omp simd reduction(| : low)
        for (int64_t c = 0; c < tc; c++) {
            uint32_t b = mp_f32_bits(s[c]);
            low |= b & 0xFFFFu;
            d[c] = (uint16_t)(b >> 16);
        }
    }
    return low == 0;
}

/* A float32 input needs no staging: bands of 32 whole rows (which hold
 * whole blocks along either axis) are quantized straight into the operand,
 * in bfloat16 unless an MXFP8 block might have a scale too small for it:
 * bfloat16 (8 significant bits, down to 2^-133) holds scale * element when
 * scale * min_subnormal >= 2^-133, which every block whose amax reaches
 * T = 2^(emax - 133) / min_subnormal has (2^-116 for E4M3, 2^-102 for
 * E5M2; the other formats are exact even at the least scale, 2^-127). A
 * finite non-zero |x| below T anywhere sends the whole operand to float32. */
/* The float32 bits of T for format info fi; 0 when every block is exact. */
static uint32_t tiny_bits(const mp_mx_format_info *fi)
{
    if (ldexpf(fi->min_subnormal, -127) >= 0x1p-133f) return 0; /* even at the least scale */
    return mp_f32_bits(ldexpf(1.0f, fi->emax - 133) / fi->min_subnormal);
}

/* Whether a finite non-zero |x[i]| is below the float32 whose bits are tb. */
static int has_tiny(const float *x, size_t n, uint32_t tb)
{
    int tiny = 0;
#pragma omp simd reduction(| : tiny)
    for (size_t i = 0; i < n; i++) {
        uint32_t b = mp_f32_bits(x[i]) & 0x7FFFFFFFu;
        tiny |= (b - 1u) < (tb - 1u); /* 0 < b < tb */
    }
    return tiny;
}

/* Each band is checked for tiny values, then (in cache) quantized into
 * bfloat16; a tiny value anywhere makes it all again in float32. */
static void quantize_f32(mp_mx_format f, const mp_quant_input *in, void *operand,
                         mp_quant_operand *out)
{
    mp_mx_format_info fi;
    (void)mp_mx_get_info(f, &fi);
    uint32_t tb = tiny_bits(&fi);
    const float *x = in->x;
    int64_t nb = (in->rows + TILE_R - 1) / TILE_R, cols = in->cols;
    bool par = nb > 1 && in->rows * cols > (1 << 16);
    int tiny = 0;
#pragma omp parallel for schedule(static) reduction(| : tiny) if (par)
    for (int64_t b = 0; b < nb; b++) {
        int64_t r0 = b * TILE_R, br = in->rows - r0 < TILE_R ? in->rows - r0 : TILE_R;
        if (tb) tiny |= has_tiny(x + r0 * cols, (size_t)(br * cols), tb);
        (void)mp_mx_quantize_2d(f, MP_MX_BLOCK, br, cols, in->k_axis, x + r0 * cols,
                                (uint16_t *)operand + r0 * cols, MP_BF16);
    }
    if (tiny) {
#pragma omp parallel for schedule(static) if (par)
        for (int64_t b = 0; b < nb; b++) {
            int64_t r0 = b * TILE_R, br = in->rows - r0 < TILE_R ? in->rows - r0 : TILE_R;
            (void)mp_mx_quantize_2d(f, MP_MX_BLOCK, br, cols, in->k_axis, x + r0 * cols,
                                    (float *)operand + r0 * cols, MP_F32);
        }
    }
    *out = (mp_quant_operand){operand, tiny ? MP_F32 : MP_BF16, 1.0f};
}

static void mx_quantize(mp_float8_meta *q, const mp_quant_input *in, mp_quant_mode mode,
                        void *stored, void *operand, mp_quant_operand *out)
{
    (void)mode;   /* stateless: nothing to record */
    (void)stored; /* never asked to keep a form (not pass-invariant) */
    if (in->dtype == MP_F32) {
        quantize_f32(q->mx_format, in, operand, out);
        return;
    }
    int64_t nr = (in->rows + TILE_R - 1) / TILE_R, nc = (in->cols + TILE_C - 1) / TILE_C;
    int64_t nt = nr * nc;
    mp_dtype dt = MP_BF16;
    for (;;) {
        int inexact = 0;
#pragma omp parallel for schedule(static) reduction(| : inexact) if (nt > 4)
        for (int64_t t = 0; t < nt; t++) {
            int64_t r0 = t / nc * TILE_R, c0 = t % nc * TILE_C;
            int64_t tr = in->rows - r0 < TILE_R ? in->rows - r0 : TILE_R;
            int64_t tc = in->cols - c0 < TILE_C ? in->cols - c0 : TILE_C;
            inexact |= !quantize_tile(q->mx_format, in, r0, c0, tr, tc, operand, dt);
        }
        if (!inexact || dt == MP_F32) break;
        dt = MP_F32;
    }
    *out = (mp_quant_operand){operand, dt, 1.0f};
}

/* room for the float32 form, which an MXFP8 operand may need */
static size_t mx_operand_bytes(int64_t rows, int64_t cols)
{
    return (size_t)(rows * cols) * sizeof(float);
}
static size_t mx_stored_bytes(int64_t rows, int64_t cols)
{
    (void)rows;
    (void)cols;
    return 0;
}

const mp_quantizer mp_quantizer_mx = {
    .name = "mx",
    .pass_invariant = false,
    .operand_bytes = mx_operand_bytes,
    .stored_bytes = mx_stored_bytes,
    .quantize = mx_quantize,
    .restore = NULL, /* nothing is kept: backward quantizes per pass */
};

/* ------------------------------------------------------- in the model */

mp_status mp_mx_layer_init(mp_layer *l, const mp_layer_options *o)
{
    const mp_mx_params *p = o ? o->mx_params : NULL;
    if (p && mp_mx_params_validate(p))
        return mp_set_error(MP_ERR_INVALID, "layer '%s': %s", l->name, mp_last_error());
    l->mx_params = p ? *p : mp_global_mx_params();
    if (!p && l->policy.mx) l->mx_params.format = l->policy.mx_format;
    l->mx_mode = o ? o->mx : 0;
    if (l->mx_mode < -1 || l->mx_mode > 1)
        return mp_set_error(MP_ERR_INVALID,
                            "layer '%s': mx = %d (expected 0 as the policy says, 1 or -1)", l->name,
                            l->mx_mode);
    if (l->mx_mode == 1 && !l->ops->float8)
        return mp_set_error(MP_ERR_INVALID, "layer '%s': %s has no MX GEMM", l->name,
                            l->ops->class_name);
    if (l->mx_mode == 1 && l->fp8_mode == 1)
        return mp_set_error(MP_ERR_INVALID,
                            "layer '%s': float8 and mx are both on (a layer has one quantizer)",
                            l->name);
    return MP_OK;
}

bool mp_mx_layer_plan(const mp_layer *l, bool edge)
{
    if (!l->ops->float8 || !l->reachable || l->mx_mode < 0) return false;
    if (l->mx_mode > 0) return true;
    /* the policy's, less the edges and a layer that asked for float8 */
    return l->policy.mx && l->fp8_mode <= 0 && !edge;
}

/* The formats layer l computes with: an MX policy's forward format unless
 * the layer named its own. */
static mp_mx_params layer_formats(const mp_layer *l)
{
    mp_mx_params p = l->mx_params;
    if (l->mx_mode <= 0 && l->policy.mx) p.format = l->policy.mx_format;
    return p;
}

mp_status mp_mx_model_setup(mp_model *m)
{
    static const char *const roles[] = {"input", "kernel", "grad_output"};
    int n = 0;
    for (int i = 0; i < m->nlayers; i++)
        n += m->layers[i].mx_active * mp_quant_gemms(&m->layers[i]);
    if (!n) return MP_OK;
    m->mx = calloc((size_t)n * MP_FLOAT8_ROLES, sizeof *m->mx);
    if (!m->mx) return mp_set_error(MP_ERR_NOMEM, "mx: out of memory");
    for (int i = 0; i < m->nlayers; i++) {
        mp_layer *l = &m->layers[i];
        l->mx_first = -1;
        if (!l->mx_active) continue;
        mp_mx_params p = layer_formats(l);
        l->mx_first = m->nmx;
        for (int r = 0; r < MP_FLOAT8_ROLES * mp_quant_gemms(l); r++) {
            mp_float8_meta *q = &m->mx[m->nmx++];
            snprintf(q->name, sizeof q->name, "%s/%s", l->name, roles[r % MP_FLOAT8_ROLES]);
            mp_quant_meta_name(q, l, r / MP_FLOAT8_ROLES);
            q->ops = &mp_quantizer_mx;
            q->layer = l->name;
            q->role = (mp_float8_role)(r % MP_FLOAT8_ROLES);
            q->mx_format = q->role == MP_FLOAT8_GRAD_OUTPUT ? p.grad_format : p.format;
            q->dtype = MP_F32;
            q->scale = 1.0f;
        }
    }
    return MP_OK;
}

void mp_mx_model_free(mp_model *m)
{
    free(m->mx); /* the metas own nothing */
    m->mx = NULL;
    m->nmx = 0;
}

bool mp_model_layer_mx(const mp_model *m, int layer, mp_mx_params *out)
{
    if (!m || layer < 0 || layer >= m->nlayers || !m->layers[layer].mx_active) return false;
    const mp_float8_meta *q = &m->mx[m->layers[layer].mx_first];
    if (out)
        *out = (mp_mx_params){q[MP_FLOAT8_INPUT].mx_format, q[MP_FLOAT8_GRAD_OUTPUT].mx_format};
    return true;
}

/* ------------------------------------------------------------- JSON */

void mp_mx_layer_json(const mp_layer *l, json_t *o)
{
    if (l->mx_mode > 0)
        json_object_set_new(o, "mx", json_string(mp_mx_format_name(l->mx_params.format)));
    else if (l->mx_mode < 0)
        json_object_set_new(o, "mx", json_false());
    if (l->mx_params.grad_format != mp_mx_params_default().grad_format)
        json_object_set_new(o, "mx_grad", json_string(mp_mx_format_name(l->mx_params.grad_format)));
}

mp_status mp_mx_options_from_json(const json_t *lj, mp_layer_options *o, mp_mx_params *fmt)
{
    const json_t *mx = json_object_get(lj, "mx"), *grad = json_object_get(lj, "mx_grad");
    if (!mx && !grad) return MP_OK;
    *fmt = mp_global_mx_params();
    if (json_is_false(mx)) {
        o->mx = -1;
    } else if (mx) {
        const char *name = json_string_value(mx);
        if (!name)
            return mp_set_error(MP_ERR_FORMAT, "'mx' must be an MX format name (such as "
                                               "mxfp8_e4m3) or false");
        if (mp_mx_format_from_name(name, &fmt->format))
            return mp_set_error(MP_ERR_FORMAT, "'mx': %s", mp_last_error());
        o->mx = 1;
    }
    if (grad) {
        const char *name = json_string_value(grad);
        if (!name) return mp_set_error(MP_ERR_FORMAT, "'mx_grad' must be an MX format name");
        if (mp_mx_format_from_name(name, &fmt->grad_format))
            return mp_set_error(MP_ERR_FORMAT, "'mx_grad': %s", mp_last_error());
    }
    o->mx_params = fmt;
    return MP_OK;
}
