/* batch_norm.c - BatchNormalization (Keras) over every axis but the last:
 * per channel, the statistics of the batch and all middle axes. In training
 * the batch's mean and biased variance normalize (float64 sums of the
 * shifted input in one pass, rounded once to float32) and the moving
 * statistics follow moving = moving * momentum + batch * (1 - momentum);
 * outside training the moving statistics normalize and stay. gamma, beta
 * and the moving statistics (non-trainable state) are float32 under every
 * policy; the output is in the compute dtype. The input, and the mean and
 * 1/std that normalized it, are kept for backward, which treats them as
 * batch statistics after a training forward and as constants otherwise.
 *
 * The per-channel sums run over a fixed partition of the rows (independent
 * of the thread count) whose float64 partials are added in block order, so
 * results do not depend on how many threads run.
 *
 * A following relu Activation that is our only consumer is fused (model.c,
 * mp_layer.relu_fused): the forward writes the output rectified (the
 * Activation views it) and the backward multiplies the gradient it gets by
 * relu's derivative at that output while reading it: one pass less each
 * way, the same bits. */
#include <math.h>
#include <string.h>

#include "kernels/activation.h"
#include "kernels/ops.h"
#include "nn/layer.h"

typedef mp_batch_norm_options batch_norm_config;

typedef struct {
    mp_tensor in;       /* input in the compute dtype */
    float *mean, *rstd; /* per channel: what normalized the last forward */
    bool batch_stats;   /* the last forward used the batch's statistics */
} batch_norm_state;

mp_batch_norm_options mp_batch_norm_options_default(void)
{
    return (mp_batch_norm_options){
        .momentum = 0.99f, .epsilon = 1e-3f, .center = true, .scale = true};
}

/* The parameter of role r (gamma, beta, moving_mean, moving_variance), or
 * NULL when the layer has none (no scale: no gamma, no center: no beta). */
static mp_model_param *bn_param(mp_model *m, const mp_layer *l, mp_param_role r)
{
    const batch_norm_config *c = l->config;
    int j = 0;
    if (r == MP_ROLE_GAMMA) return c->scale ? mp_layer_param(m, l, 0) : NULL;
    j += c->scale;
    if (r == MP_ROLE_BETA) return c->center ? mp_layer_param(m, l, j) : NULL;
    j += c->center;
    return mp_layer_param(m, l, j + (r == MP_ROLE_MOVING_VARIANCE));
}

/* ---------------------------------------------------------------- kernels */

enum {
    CHUNK = 2048,             /* floats decoded at a time */
    BLOCK_ELEMS = 32768,      /* elements a block of rows should have */
    MAX_BLOCKS = 64,          /* row blocks of a reduction at most */
    PARTIAL_DOUBLES = 1 << 20 /* their float64 partials at most */
};

/* The row loops for each vector width the CPU may have (MP_SIMD_CLONES,
 * chosen once at load; -O2 leaves loops of unknown length scalar
 * otherwise); the same arithmetic in each (ISO C: no FMA contraction), and
 * each channel's sums run over the rows in order, so the same bits on every
 * path. */

#if defined(__GNUC__)
#define BN_INLINE __attribute__((always_inline)) static inline
#else
#define BN_INLINE static inline
#endif

/* s1 += x - k, s2 += (x - k)^2 per channel, over nr rows of u. */
BN_INLINE void sums_x_rows(const float *u, int64_t nr, int64_t cols, const float *k, double *p1,
                           double *p2)
{
    for (int64_t i = 0; i < nr; i++) {
        const float *ui = u + i * cols;
#pragma omp simd
        for (int64_t c = 0; c < cols; c++) {
            double d = (double)ui[c] - (double)k[c];
            p1[c] += d;
            p2[c] += d * d;
        }
    }
}

/* s1 += dy, s2 += dy * xhat, xhat = (x - k) * r in float32. */
BN_INLINE void sums_dy_rows(const float *u, const float *g, int64_t nr, int64_t cols,
                            const float *k, const float *r, double *p1, double *p2)
{
    for (int64_t i = 0; i < nr; i++) {
        const float *ui = u + i * cols, *gi = g + i * cols;
#pragma omp simd
        for (int64_t c = 0; c < cols; c++) {
            float xh = (ui[c] - k[c]) * r[c];
            p1[c] += gi[c];
            p2[c] += (double)gi[c] * xh;
        }
    }
}

/* The three forms of channel_map on n = nr * cols values (see there). */
BN_INLINE void map_rows_of(const float *u, const float *g, int64_t nr, int64_t cols, const float *k,
                           const float *r, const float *a, const float *b, const float *e, float *y,
                           bool relu)
{
    for (int64_t i = 0; i < nr; i++) {
        const float *ui = u ? u + i * cols : NULL, *gi = g ? g + i * cols : NULL;
        float *yi = y + i * cols;
        if (!g && relu) {
#pragma omp simd
            for (int64_t c = 0; c < cols; c++)
                yi[c] = mp_activate(MP_ACT_RELU, (ui[c] - k[c]) * a[c] + b[c]);
        } else if (!g) {
#pragma omp simd
            for (int64_t c = 0; c < cols; c++) yi[c] = (ui[c] - k[c]) * a[c] + b[c];
        } else if (!u) {
#pragma omp simd
            for (int64_t c = 0; c < cols; c++) yi[c] = a[c] * gi[c];
        } else {
#pragma omp simd
            for (int64_t c = 0; c < cols; c++) {
                float xh = (ui[c] - k[c]) * r[c];
                yi[c] = a[c] * (gi[c] - b[c] - xh * e[c]);
            }
        }
    }
}

/* The loops above with the channel counts of a ResNet as constants (whole
 * vectors, no remainder per row), any other count as it comes. */
#define BY_COLS(f, ...)                                                                            \
    switch (cols) {                                                                                \
    case 16:                                                                                       \
        f(__VA_ARGS__, 16);                                                                        \
        break;                                                                                     \
    case 32:                                                                                       \
        f(__VA_ARGS__, 32);                                                                        \
        break;                                                                                     \
    case 64:                                                                                       \
        f(__VA_ARGS__, 64);                                                                        \
        break;                                                                                     \
    default:                                                                                       \
        f(__VA_ARGS__, cols);                                                                      \
    }
#define SUMS_X(u, nr, k, p1, p2, cc) sums_x_rows(u, nr, cc, k, p1, p2)
#define SUMS_DY(u, g, nr, k, r, p1, p2, cc) sums_dy_rows(u, g, nr, cc, k, r, p1, p2)
#define MAP_ROWS(u, g, nr, k, r, a, b, e, y, relu, cc)                                             \
    map_rows_of(u, g, nr, cc, k, r, a, b, e, y, relu)

MP_SIMD_CLONES static void sums_x(const float *u, int64_t nr, int64_t cols, const float *k,
                                  double *p1, double *p2)
{
    BY_COLS(SUMS_X, u, nr, k, p1, p2);
}

MP_SIMD_CLONES static void sums_dy(const float *u, const float *g, int64_t nr, int64_t cols,
                                   const float *k, const float *r, double *p1, double *p2)
{
    BY_COLS(SUMS_DY, u, g, nr, k, r, p1, p2);
}

MP_SIMD_CLONES static void map_rows(const float *u, const float *g, int64_t nr, int64_t cols,
                                    const float *k, const float *r, const float *a, const float *b,
                                    const float *e, float *y, bool relu)
{
    BY_COLS(MAP_ROWS, u, g, nr, k, r, a, b, e, y, relu);
}

/* n values of type t at element off of p as float32: in place when they
 * are float32, decoded into buf otherwise. */
static const float *as_f32(const void *p, mp_dtype t, size_t off, size_t n, float *buf)
{
    if (t == MP_F32) return (const float *)p + off;
    mp_convert(buf, MP_F32, (const char *)p + off * mp_dtype_size(t), t, n);
    return buf;
}

/* n values of the gradient dy at element off as float32, times relu's
 * derivative at the rectified output z (type zt) when z is not NULL (a
 * fused relu): into g, zb decoding z. */
static const float *grad_f32(const void *dy, mp_dtype dyt, const void *z, mp_dtype zt, size_t off,
                             size_t n, float *g, float *zb)
{
    const float *gf = as_f32(dy, dyt, off, n, g);
    if (!z) return gf;
    mp_op_relu_grad_f32(gf, as_f32(z, zt, off, n, zb), n, g);
    return g;
}

/* Rows decoded at a time: whole rows, about CHUNK values. */
static int64_t chunk_rows(int64_t cols) { return cols >= CHUNK ? 1 : CHUNK / cols; }

/* Per-channel sums over the rows of x [rows, cols], float64.
 *   dy == NULL: s1 = sum (x - k), s2 = sum (x - k)^2, k a shift per channel
 *               (the first row: it keeps the cancellation in s2/n - (s1/n)^2
 *               at the size of the data's spread, not its offset);
 *   else:       s1 = sum dy, s2 = sum dy * xhat with xhat = (x - k) * r in
 *               float32 (k the mean, r 1/std), as the forward computed it.
 * Each block of rows sums into its own partials; the blocks are fixed by
 * the shape alone and added in order, so the result is deterministic. */
static mp_status channel_sums(const void *x, mp_dtype xt, const void *dy, mp_dtype dyt,
                              const void *z, const float *k, const float *r, int64_t rows,
                              int64_t cols, double *s1, double *s2)
{
    int64_t nb = rows * cols / BLOCK_ELEMS;
    if (nb > MAX_BLOCKS) nb = MAX_BLOCKS;
    if (nb > PARTIAL_DOUBLES / (2 * cols)) nb = PARTIAL_DOUBLES / (2 * cols);
    if (nb > rows) nb = rows;
    if (nb < 1) nb = 1;
    const int64_t brows = (rows + nb - 1) / nb, rc = chunk_rows(cols);
    nb = (rows + brows - 1) / brows;
    double *part = mp_scratch(5, (size_t)(nb * 2 * cols) * sizeof *part);
    if (!part) return MP_ERR_NOMEM;
    int nomem = 0;
#pragma omp parallel for schedule(static) if (nb > 1) reduction(|| : nomem)
    for (int64_t b = 0; b < nb; b++) {
        float *u = mp_scratch(3, (size_t)(rc * cols) * sizeof *u);
        float *g = dy ? mp_scratch(4, (size_t)(rc * cols) * sizeof *g) : NULL;
        float *zb = z && xt != MP_F32 ? mp_scratch(14, (size_t)(rc * cols) * sizeof *zb) : NULL;
        if (!u || (dy && !g) || (z && xt != MP_F32 && !zb)) {
            nomem = 1;
            continue;
        }
        double *p1 = part + b * 2 * cols, *p2 = p1 + cols;
        memset(p1, 0, (size_t)(2 * cols) * sizeof *p1);
        const int64_t end = (b + 1) * brows < rows ? (b + 1) * brows : rows;
        for (int64_t r0 = b * brows; r0 < end; r0 += rc) {
            const int64_t nr = end - r0 < rc ? end - r0 : rc;
            const size_t off = (size_t)(r0 * cols), n = (size_t)(nr * cols);
            const float *xf = as_f32(x, xt, off, n, u);
            if (!dy)
                sums_x(xf, nr, cols, k, p1, p2);
            else
                sums_dy(xf, grad_f32(dy, dyt, z, xt, off, n, g, zb), nr, cols, k, r, p1, p2);
        }
    }
    if (nomem) return MP_ERR_NOMEM;
    for (int64_t c = 0; c < cols; c++) s1[c] = s2[c] = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        const double *p1 = part + b * 2 * cols, *p2 = p1 + cols;
        for (int64_t c = 0; c < cols; c++) {
            s1[c] += p1[c];
            s2[c] += p2[c];
        }
    }
    return MP_OK;
}

/* Row-parallel elementwise pass over [rows, cols], per channel c:
 *   dy == NULL: y = (x - k) * a + b                        (normalize;
 *               relu: rectified, as mp_activate)
 *   else:       y = a * (dy - b - xhat * e), xhat = (x - k) * r (input
 *               gradient; x == NULL: y = a * dy, constant statistics)
 * float32 arithmetic, each output rounded once to yt. */
static mp_status channel_map(const void *x, mp_dtype xt, const void *dy, mp_dtype dyt,
                             const void *z, const float *k, const float *r, const float *a,
                             const float *b, const float *e, void *y, mp_dtype yt, int64_t rows,
                             int64_t cols, bool relu)
{
    const int64_t rc = chunk_rows(cols), nc = (rows + rc - 1) / rc;
    const size_t ys = mp_dtype_size(yt);
    int nomem = 0;
#pragma omp parallel for schedule(static) if (rows * cols > 65536) reduction(|| : nomem)
    for (int64_t ch = 0; ch < nc; ch++) {
        float *u = mp_scratch(3, (size_t)(rc * cols) * sizeof *u);
        float *g = dy ? mp_scratch(4, (size_t)(rc * cols) * sizeof *g) : NULL;
        float *zb = z && yt != MP_F32 ? mp_scratch(14, (size_t)(rc * cols) * sizeof *zb) : NULL;
        if (!u || (dy && !g) || (z && yt != MP_F32 && !zb)) {
            nomem = 1;
            continue;
        }
        const int64_t r0 = ch * rc, nr = rows - r0 < rc ? rows - r0 : rc;
        const size_t off = (size_t)(r0 * cols), n = (size_t)(nr * cols);
        const float *xf = x ? as_f32(x, xt, off, n, u) : NULL;
        const float *gf = dy ? grad_f32(dy, dyt, z, yt, off, n, g, zb) : NULL;
        /* into y when it is float32, else into u (after x was read) */
        float *o = yt == MP_F32 ? (float *)y + off : u;
        map_rows(xf, gf, nr, cols, k, r, a, b, e, o, relu);
        if (yt != MP_F32) mp_convert((char *)y + off * ys, yt, u, MP_F32, n);
    }
    return nomem ? MP_ERR_NOMEM : MP_OK;
}

/* ------------------------------------------------------------------ layer */

static mp_status batch_norm_build(mp_model *m, mp_layer *l)
{
    const batch_norm_config *c = l->config;
    if (!(c->momentum >= 0.0f && c->momentum < 1.0f))
        return mp_set_error(MP_ERR_INVALID, "batch_norm '%s': momentum %g must be in [0, 1)",
                            l->name, (double)c->momentum);
    if (!(c->epsilon > 0.0f) || isinf(c->epsilon))
        return mp_set_error(MP_ERR_INVALID, "batch_norm '%s': epsilon %g must be > 0", l->name,
                            (double)c->epsilon);
    if (l->ndim < 1)
        return mp_set_error(MP_ERR_INVALID, "batch_norm '%s': the input has no channel axis",
                            l->name);
    int64_t ch = layer_cols(l);
    if ((c->scale && mp_layer_add_param(m, l, MP_ROLE_GAMMA, NULL, 1, &ch, MP_PARAM_FLOAT32)) ||
        (c->center && mp_layer_add_param(m, l, MP_ROLE_BETA, NULL, 1, &ch, MP_PARAM_FLOAT32)) ||
        mp_layer_add_param(m, l, MP_ROLE_MOVING_MEAN, NULL, 1, &ch, MP_PARAM_STATE) ||
        mp_layer_add_param(m, l, MP_ROLE_MOVING_VARIANCE, NULL, 1, &ch, MP_PARAM_STATE))
        return m->err;
    return MP_OK;
}

static size_t batch_norm_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    /* the kept input, the output, mean and 1/std per channel */
    return mp_layer_kept_input_bytes(m, l, 0, batch) +
           arena_bytes((size_t)layer_numel(l, batch) * mp_dtype_size(l->policy.compute)) +
           2 * arena_bytes((size_t)layer_cols(l) * sizeof(float));
}

static mp_status batch_norm_forward(mp_model *m, mp_layer *l, bool training)
{
    const batch_norm_config *c = l->config;
    batch_norm_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    const int64_t ch = layer_cols(l);
    if (mp_layer_input_compute(m, l, 0, true, &st->in)) return MP_ERR_NOMEM;
    if (mp_layer_alloc(m, l, m->act, ct, &l->out)) return mp_layer_nomem(l, "its output");
    const int64_t rows = mp_tensor_numel(&l->out) / ch;
    st->mean = mp_arena_alloc(m->act, (size_t)ch * sizeof(float));
    st->rstd = mp_arena_alloc(m->act, (size_t)ch * sizeof(float));
    /* float64 sums s1, s2, then float32 coefficients a, b and the shift */
    double *s1 = mp_scratch(6, (size_t)ch * (2 * sizeof(double) + 3 * sizeof(float)));
    if (!st->mean || !st->rstd || !s1) return mp_layer_nomem(l, "its statistics");
    double *s2 = s1 + ch;
    float *a = (float *)(s2 + ch), *b = a + ch, *shift = b + ch;
    float *mm = bn_param(m, l, MP_ROLE_MOVING_MEAN)->master;
    float *mv = bn_param(m, l, MP_ROLE_MOVING_VARIANCE)->master;
    st->batch_stats = training;
    if (training) {
        mp_convert(shift, MP_F32, st->in.data, ct, (size_t)ch); /* the first row */
        if (channel_sums(st->in.data, ct, NULL, MP_F32, NULL, shift, NULL, rows, ch, s1, s2))
            return mp_layer_nomem(l, "its reduction buffers");
        for (int64_t j = 0; j < ch; j++) { /* s1, s2 become the mean and variance */
            double d = s1[j] / (double)rows, var = s2[j] / (double)rows - d * d;
            s1[j] = shift[j] + d;
            s2[j] = var > 0.0 ? var : 0.0;
            st->mean[j] = (float)s1[j];
            st->rstd[j] = (float)(1.0 / sqrt(s2[j] + (double)c->epsilon));
        }
    } else {
        for (int64_t j = 0; j < ch; j++) {
            st->mean[j] = mm[j];
            st->rstd[j] = (float)(1.0 / sqrt((double)mv[j] + (double)c->epsilon));
        }
    }
    const mp_model_param *gm = bn_param(m, l, MP_ROLE_GAMMA), *bt = bn_param(m, l, MP_ROLE_BETA);
    for (int64_t j = 0; j < ch; j++) {
        a[j] = gm ? gm->master[j] * st->rstd[j] : st->rstd[j];
        b[j] = bt ? bt->master[j] : 0.0f;
    }
    if (channel_map(st->in.data, ct, NULL, MP_F32, NULL, st->mean, NULL, a, b, NULL, l->out.data,
                    ct, rows, ch, l->relu_fused))
        return mp_layer_nomem(l, "a conversion buffer");
    /* the moving statistics follow once nothing can fail: a failed pass
     * leaves them as they were */
    const double mom = c->momentum;
    for (int64_t j = 0; j < ch && training; j++) {
        mm[j] = (float)((double)mm[j] * mom + s1[j] * (1.0 - mom));
        mv[j] = (float)((double)mv[j] * mom + s2[j] * (1.0 - mom));
    }
    return MP_OK;
}

static mp_status batch_norm_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    const batch_norm_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    mp_model_param *gm = bn_param(m, l, MP_ROLE_GAMMA), *bt = bn_param(m, l, MP_ROLE_BETA);
    const int64_t ch = layer_cols(l), rows = mp_tensor_numel(&l->out) / ch;
    const bool data = mp_layer_input_is_data(m, l, 0);
    if (data && !gm && !bt) return MP_OK; /* nothing takes a gradient */
    double *s1 = mp_scratch(6, (size_t)ch * (2 * sizeof(double) + 3 * sizeof(float)));
    if (!s1) return mp_layer_nomem(l, "its reduction buffers");
    double *s2 = s1 + ch;
    float *a = (float *)(s2 + ch), *b = a + ch, *e = b + ch;
    /* a fused relu (mp_layer.relu_fused): the gradient is the relu's, dy
     * is that times relu'(z) at our rectified output z */
    const void *z = l->relu_fused ? l->out.data : NULL;
    /* s1 = sum dy (dbeta), s2 = sum dy * xhat (dgamma) */
    const bool sums = gm || bt || st->batch_stats;
    if (sums && channel_sums(st->in.data, ct, l->grad.data, l->grad.dtype, z, st->mean, st->rstd,
                             rows, ch, s1, s2))
        return mp_layer_nomem(l, "its reduction buffers");
    for (int64_t j = 0; j < ch && gm; j++)
        gm->grad[j] = (float)((accumulate ? (double)gm->grad[j] : 0.0) + s2[j]);
    for (int64_t j = 0; j < ch && bt; j++)
        bt->grad[j] = (float)((accumulate ? (double)bt->grad[j] : 0.0) + s1[j]);
    if (data) return MP_OK;
    /* dx = gamma * rstd * (dy - mean(dy) - xhat * mean(dy * xhat)) with batch
     * statistics; gamma * rstd * dy when they were constants */
    for (int64_t j = 0; j < ch; j++) {
        a[j] = gm ? gm->master[j] * st->rstd[j] : st->rstd[j];
        b[j] = st->batch_stats ? (float)(s1[j] / (double)rows) : 0.0f;
        e[j] = st->batch_stats ? (float)(s2[j] / (double)rows) : 0.0f;
    }
    mp_tensor dx;
    bool direct;
    if (mp_layer_input_grad(m, l, 0, &dx, &direct)) return MP_ERR_NOMEM;
    if (channel_map(st->batch_stats ? st->in.data : NULL, ct, l->grad.data, l->grad.dtype, z,
                    st->mean, st->rstd, a, b, e, dx.data, ct, rows, ch, false))
        return mp_layer_nomem(l, "a conversion buffer");
    return mp_layer_input_grad_done(m, l, 0, &dx, direct);
}

/* ------------------------------------------------------------------- JSON */

static mp_status batch_norm_to_json(const mp_layer *l, json_t *o)
{
    const batch_norm_config *c = l->config;
    json_object_set_new(o, "momentum", json_real(c->momentum));
    json_object_set_new(o, "epsilon", json_real(c->epsilon));
    json_object_set_new(o, "center", json_boolean(c->center));
    json_object_set_new(o, "scale", json_boolean(c->scale));
    return MP_OK;
}

/* Every field is optional, as in Keras's from_config: absent ones take the
 * constructor's defaults. */
static mp_status batch_norm_from_json(const json_t *o, void *config)
{
    batch_norm_config *c = config;
    *c = mp_batch_norm_options_default();
    if (json_object_get(o, "momentum")) {
        mp_status s = mp_json_float_field(o, "momentum", 0.0, false, 1.0, &c->momentum);
        if (s || c->momentum >= 1.0f) /* 1 excluded (also what rounds up to it) */
            return mp_set_error(MP_ERR_FORMAT, "'momentum' must be a number in [0, 1)");
    }
    if (json_object_get(o, "epsilon")) {
        mp_status s = mp_json_float_field(o, "epsilon", 0.0, true, 1.0, &c->epsilon);
        if (s) return s;
        if (!(c->epsilon > 0.0f)) /* below float32's range */
            return mp_set_error(MP_ERR_FORMAT, "'epsilon' must be a number in (0, 1]");
    }
    mp_status s = mp_json_bool_opt(o, "center", &c->center);
    return s ? s : mp_json_bool_opt(o, "scale", &c->scale);
}

const mp_layer_ops mp_batch_norm_ops = {
    .class_name = "BatchNormalization",
    .base_name = "batch_normalization",
    .min_inputs = 1,
    .max_inputs = 1,
    .config_size = sizeof(batch_norm_config),
    .state_size = sizeof(batch_norm_state),
    .fields = (const char *const[]){"momentum", "epsilon", "center", "scale", NULL},
    .build = batch_norm_build,
    .forward = batch_norm_forward,
    .backward = batch_norm_backward,
    .saved_bytes = batch_norm_saved_bytes,
    .to_json = batch_norm_to_json,
    .from_json = batch_norm_from_json,
    .fuses_relu = true,
};

mp_node mp_batch_norm(mp_model *m, mp_node x, const mp_batch_norm_options *bn,
                      const mp_layer_options *o)
{
    batch_norm_config c = bn ? *bn : mp_batch_norm_options_default();
    return mp_layer_create(m, &mp_batch_norm_ops, &x, 1, &c, o);
}
