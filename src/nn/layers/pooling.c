/* pooling.c - MaxPooling2D, AveragePooling2D and GlobalAveragePooling2D
 * (Keras, channels-last), per channel over windows of [batch, h, w, c], in
 * float32 on the compute-dtype input with each output rounded once.
 *
 * Max: the largest element of the window, NaN winning (a pooled overflow
 * must reach the loss scaler); the int32 position (ih * w + iw) of the first
 * maximal element in window order is kept, and backward routes the gradient
 * there. Average: the window's float32 sum divided by the number of its
 * elements inside the image (with `same` padding the edge windows count
 * fewer, as Keras/TensorFlow do); backward gives each of them dy / count.
 * Global average: the mean over h and w from float64 sums, output [batch, c].
 *
 * Backward gathers per input row from the windows that reach it (in window
 * order), so every element is summed by one thread in a fixed order:
 * results do not depend on the thread count. */
#include <math.h>
#include <string.h>

#include "nn/layers/spatial.h"

typedef mp_pooling2d_options pool_config;

typedef struct {
    mp_conv_geom g;  /* of the last forward; g.o == g.c */
    int32_t *argmax; /* max pooling: per output element, the input pixel */
} pool_state;

enum { SLOT_IN = 3, SLOT_OUT = 4, SLOT_AUX = 5 }; /* per-thread scratch */
enum { PARALLEL_WORK = 1 << 15 };                 /* below this: one thread */

extern const mp_layer_ops mp_max_pooling2d_ops;

mp_pooling2d_options mp_pooling2d_options_default(void)
{
    return (mp_pooling2d_options){
        .pool_size = {2, 2}, .strides = {2, 2}, .padding = MP_PADDING_VALID};
}

static bool is_max(const mp_layer *l) { return l->ops == &mp_max_pooling2d_ops; }

static size_t row_at(int64_t n, int64_t r, int64_t rows, int64_t cols, int64_t ch)
{
    return (size_t)(((n * rows + r) * cols) * ch);
}

/* Elements of window o (along one axis) inside 0..in-1. */
static int64_t inside(int64_t o, int64_t stride, int64_t pad, int64_t k, int64_t in)
{
    int64_t lo = o * stride - pad, hi = lo + k;
    return (hi < in ? hi : in) - (lo > 0 ? lo : 0);
}

/* ---------------------------------------------------------------- kernels */

/* Max (argmax != NULL) or average pooling of x into y, per output row. */
static mp_status pool_forward(const mp_conv_geom *g, const void *x, mp_dtype xt, void *y,
                              mp_dtype yt, int32_t *argmax)
{
    const int64_t rows = g->n * g->oh, C = g->c, oc = g->ow * C;
    const size_t xs = mp_dtype_size(xt), ys = mp_dtype_size(yt);
    int nomem = 0;
#pragma omp parallel for schedule(static)                                                          \
    reduction(||                                                                                   \
              : nomem) if (rows * oc * g->kh * g->kw > PARALLEL_WORK)
    for (int64_t r = 0; r < rows; r++) {
        float *xr = mp_scratch(SLOT_IN, (size_t)(g->w * C) * sizeof *xr);
        float *acc = mp_scratch(SLOT_OUT, (size_t)oc * sizeof *acc);
        int32_t *idx = argmax ? argmax + r * oc : NULL;
        if (!xr || !acc) {
            nomem = 1;
            continue;
        }
        const int64_t n = r / g->oh, oh = r % g->oh;
        if (idx)
            for (int64_t i = 0; i < oc; i++) idx[i] = -1;
        else
            memset(acc, 0, (size_t)oc * sizeof *acc);
        for (int64_t kh = 0; kh < g->kh; kh++) {
            const int64_t ih = oh * g->sh - g->pt + kh;
            if (ih < 0 || ih >= g->h) continue;
            mp_convert(xr, MP_F32, (const char *)x + row_at(n, ih, g->h, g->w, C) * xs, xt,
                       (size_t)(g->w * C));
            for (int64_t ow = 0; ow < g->ow; ow++)
                for (int64_t kw = 0; kw < g->kw; kw++) {
                    const int64_t iw = ow * g->sw - g->pl + kw;
                    if (iw < 0 || iw >= g->w) continue;
                    const float *xp = xr + iw * C;
                    float *ap = acc + ow * C;
                    if (!idx) {
                        for (int64_t c = 0; c < C; c++) ap[c] += xp[c];
                        continue;
                    }
                    int32_t *ip = idx + ow * C, at = (int32_t)(ih * g->w + iw);
                    for (int64_t c = 0; c < C; c++) {
                        const float v = xp[c];
                        /* the first element, a larger one, or the first NaN */
                        if (ip[c] < 0 || v > ap[c] || (isnan(v) && !isnan(ap[c]))) {
                            ap[c] = v;
                            ip[c] = at;
                        }
                    }
                }
        }
        if (!idx)
            for (int64_t ow = 0; ow < g->ow; ow++) {
                const float cnt = (float)(inside(oh, g->sh, g->pt, g->kh, g->h) *
                                          inside(ow, g->sw, g->pl, g->kw, g->w));
                for (int64_t c = 0; c < C; c++) acc[ow * C + c] /= cnt;
            }
        mp_convert((char *)y + (size_t)(r * oc) * ys, yt, acc, MP_F32, (size_t)oc);
    }
    return nomem ? MP_ERR_NOMEM : MP_OK;
}

/* dx from dy: per input row, the windows that reach it in window order;
 * max pooling takes dy where the window's argmax is this pixel, average
 * pooling dy / count of every window. */
static mp_status pool_backward(const mp_conv_geom *g, const void *dy, mp_dtype yt,
                               const int32_t *argmax, void *dx, mp_dtype xt)
{
    const int64_t rows = g->n * g->h, C = g->c, wc = g->w * C, oc = g->ow * C;
    const size_t ys = mp_dtype_size(yt), xs = mp_dtype_size(xt);
    int nomem = 0;
#pragma omp parallel for schedule(static)                                                          \
    reduction(||                                                                                   \
              : nomem) if (rows * wc * g->kh * g->kw > PARALLEL_WORK)
    for (int64_t r = 0; r < rows; r++) {
        float *gr = mp_scratch(SLOT_IN, (size_t)oc * sizeof *gr);
        float *acc = mp_scratch(SLOT_OUT, (size_t)wc * sizeof *acc);
        if (!gr || !acc) {
            nomem = 1;
            continue;
        }
        const int64_t n = r / g->h, ih = r % g->h;
        memset(acc, 0, (size_t)wc * sizeof *acc);
        for (int64_t kh = 0; kh < g->kh; kh++) {
            const int64_t t = ih + g->pt - kh;
            if (t < 0 || t % g->sh || t / g->sh >= g->oh) continue;
            const int64_t oh = t / g->sh, orow = n * g->oh + oh;
            mp_convert(gr, MP_F32, (const char *)dy + (size_t)(orow * oc) * ys, yt, (size_t)oc);
            const int32_t *idx = argmax ? argmax + orow * oc : NULL;
            const int64_t cnt_h = inside(oh, g->sh, g->pt, g->kh, g->h);
            for (int64_t iw = 0; iw < g->w; iw++)
                for (int64_t kw = 0; kw < g->kw; kw++) {
                    const int64_t u = iw + g->pl - kw;
                    if (u < 0 || u % g->sw || u / g->sw >= g->ow) continue;
                    const int64_t ow = u / g->sw;
                    const float *gp = gr + ow * C;
                    float *ap = acc + iw * C;
                    if (idx) {
                        const int32_t *ip = idx + ow * C, at = (int32_t)(ih * g->w + iw);
                        for (int64_t c = 0; c < C; c++)
                            if (ip[c] == at) ap[c] += gp[c];
                    } else {
                        const float cnt = (float)(cnt_h * inside(ow, g->sw, g->pl, g->kw, g->w));
                        for (int64_t c = 0; c < C; c++) ap[c] += gp[c] / cnt;
                    }
                }
        }
        mp_convert((char *)dx + (size_t)(r * wc) * xs, xt, acc, MP_F32, (size_t)wc);
    }
    return nomem ? MP_ERR_NOMEM : MP_OK;
}

/* ------------------------------------------------- Max/AveragePooling2D */

static mp_status pool_build(mp_model *m, mp_layer *l)
{
    (void)m;
    const pool_config *c = l->config;
    mp_status s = mp_spatial_input(l);
    if (!s) s = mp_spatial_check(l, "pool_size", c->pool_size, c->strides, NULL, c->padding);
    if (s) return s;
    if (l->shape[0] > INT32_MAX / l->shape[1])
        return mp_set_error(MP_ERR_INVALID, "%s '%s': more than 2^31 pixels per image",
                            l->ops->base_name, l->name);
    mp_conv_geom g;
    if ((s = mp_spatial_geom(l, &g, c->pool_size, c->strides, NULL, l->shape[2], c->padding)))
        return s;
    l->shape[0] = g.oh;
    l->shape[1] = g.ow;
    return MP_OK;
}

static size_t pool_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    (void)m;
    const size_t n = (size_t)layer_numel(l, batch);
    return arena_bytes(n * mp_dtype_size(l->policy.compute)) +
           (is_max(l) ? arena_bytes(n * sizeof(int32_t)) : 0);
}

static mp_status pool_layer_forward(mp_model *m, mp_layer *l, bool training)
{
    (void)training;
    const pool_config *c = l->config;
    pool_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    mp_tensor x;
    if (mp_layer_input_compute(m, l, 0, false, &x)) return MP_ERR_NOMEM;
    if (mp_layer_alloc(m, l, m->act, ct, &l->out)) return mp_layer_nomem(l, "its output");
    st->argmax = NULL;
    if (is_max(l) &&
        !(st->argmax = mp_arena_alloc(m->act, (size_t)mp_tensor_numel(&l->out) * sizeof(int32_t))))
        return mp_layer_nomem(l, "its argmax indices");
    const mp_layer *src = mp_layer_csrc(m, l, 0);
    st->g = (mp_conv_geom){.n = m->batch,
                           .h = src->shape[0],
                           .w = src->shape[1],
                           .c = src->shape[2],
                           .kh = c->pool_size[0],
                           .kw = c->pool_size[1],
                           .o = src->shape[2],
                           .sh = c->strides[0],
                           .sw = c->strides[1],
                           .dh = 1,
                           .dw = 1};
    mp_status s = mp_conv_geom_init(&st->g, c->padding == MP_PADDING_SAME);
    if (s) return s;
    if (pool_forward(&st->g, x.data, ct, l->out.data, ct, st->argmax))
        return mp_layer_nomem(l, "its row buffers");
    return MP_OK;
}

static mp_status pool_layer_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    (void)accumulate;
    const pool_state *st = l->state;
    if (mp_layer_input_is_data(m, l, 0)) return MP_OK;
    mp_tensor dx;
    bool direct;
    if (mp_layer_input_grad(m, l, 0, &dx, &direct)) return MP_ERR_NOMEM;
    if (pool_backward(&st->g, l->grad.data, l->grad.dtype, st->argmax, dx.data, dx.dtype))
        return mp_layer_nomem(l, "its row buffers");
    return mp_layer_input_grad_done(m, l, 0, &dx, direct);
}

static mp_status pool_to_json(const mp_layer *l, json_t *o)
{
    const pool_config *c = l->config;
    json_object_set_new(o, "pool_size", mp_json_pair(c->pool_size));
    json_object_set_new(o, "strides", mp_json_pair(c->strides));
    json_object_set_new(o, "padding", json_string(mp_padding_name(c->padding)));
    return MP_OK;
}

/* Keras's defaults: pool 2x2, strides = pool_size (also for "strides":
 * null), valid. */
static mp_status pool_from_json(const json_t *o, void *config)
{
    pool_config *c = config;
    *c = mp_pooling2d_options_default();
    mp_status s = mp_json_pair_opt(o, "pool_size", 1, MP_SPATIAL_MAX, c->pool_size);
    c->strides[0] = c->pool_size[0];
    c->strides[1] = c->pool_size[1];
    if (!s && !json_is_null(json_object_get(o, "strides")))
        s = mp_json_pair_opt(o, "strides", 1, MP_SPATIAL_MAX, c->strides);
    if (!s && json_object_get(o, "padding")) s = mp_json_padding_field(o, "padding", &c->padding);
    return s;
}

#define POOL_OPS(kind, cls)                                                                        \
    const mp_layer_ops mp_##kind##_ops = {                                                         \
        .class_name = cls,                                                                         \
        .base_name = #kind,                                                                        \
        .min_inputs = 1,                                                                           \
        .max_inputs = 1,                                                                           \
        .config_size = sizeof(pool_config),                                                        \
        .state_size = sizeof(pool_state),                                                          \
        .fields = (const char *const[]){"pool_size", "strides", "padding", NULL},                  \
        .build = pool_build,                                                                       \
        .forward = pool_layer_forward,                                                             \
        .backward = pool_layer_backward,                                                           \
        .saved_bytes = pool_saved_bytes,                                                           \
        .to_json = pool_to_json,                                                                   \
        .from_json = pool_from_json,                                                               \
    };
POOL_OPS(max_pooling2d, "MaxPooling2D")
POOL_OPS(average_pooling2d, "AveragePooling2D")

/* NULL: the defaults; strides {0, 0}: the pool size. */
static pool_config pool_options(const mp_pooling2d_options *p)
{
    pool_config c = p ? *p : mp_pooling2d_options_default();
    if (c.strides[0] == 0 && c.strides[1] == 0) {
        c.strides[0] = c.pool_size[0];
        c.strides[1] = c.pool_size[1];
    }
    return c;
}

mp_node mp_max_pooling2d(mp_model *m, mp_node x, const mp_pooling2d_options *p,
                         const mp_layer_options *o)
{
    pool_config c = pool_options(p);
    return mp_layer_create(m, &mp_max_pooling2d_ops, &x, 1, &c, o);
}

mp_node mp_average_pooling2d(mp_model *m, mp_node x, const mp_pooling2d_options *p,
                             const mp_layer_options *o)
{
    pool_config c = pool_options(p);
    return mp_layer_create(m, &mp_average_pooling2d_ops, &x, 1, &c, o);
}

/* ------------------------------------------------- GlobalAveragePooling2D */

static mp_status gap_build(mp_model *m, mp_layer *l)
{
    (void)m;
    mp_status s = mp_spatial_input(l);
    if (s) return s;
    l->ndim = 1;
    l->shape[0] = l->shape[2];
    return MP_OK;
}

static size_t gap_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    (void)m;
    return arena_bytes((size_t)layer_numel(l, batch) * mp_dtype_size(l->policy.compute));
}

static mp_status gap_forward(mp_model *m, mp_layer *l, bool training)
{
    (void)training;
    const mp_layer *src = mp_layer_csrc(m, l, 0);
    const int64_t H = src->shape[0], W = src->shape[1], C = src->shape[2], hw = H * W;
    mp_dtype ct = l->policy.compute;
    mp_tensor x;
    if (mp_layer_input_compute(m, l, 0, false, &x)) return MP_ERR_NOMEM;
    if (mp_layer_alloc(m, l, m->act, ct, &l->out)) return mp_layer_nomem(l, "its output");
    const size_t cs = mp_dtype_size(ct);
    int nomem = 0;
#pragma omp parallel for schedule(static)                                                          \
    reduction(||                                                                                   \
              : nomem) if (m->batch * hw * C > PARALLEL_WORK)
    for (int64_t n = 0; n < m->batch; n++) {
        float *xr = mp_scratch(SLOT_IN, (size_t)(W * C) * sizeof *xr);
        float *y = mp_scratch(SLOT_OUT, (size_t)C * sizeof *y);
        double *s = mp_scratch(SLOT_AUX, (size_t)C * sizeof *s);
        if (!xr || !y || !s) {
            nomem = 1;
            continue;
        }
        memset(s, 0, (size_t)C * sizeof *s);
        for (int64_t ih = 0; ih < H; ih++) {
            mp_convert(xr, MP_F32, (const char *)x.data + row_at(n, ih, H, W, C) * cs, ct,
                       (size_t)(W * C));
            for (int64_t iw = 0; iw < W; iw++)
                for (int64_t c = 0; c < C; c++) s[c] += xr[iw * C + c];
        }
        for (int64_t c = 0; c < C; c++) y[c] = (float)(s[c] / (double)hw);
        mp_convert((char *)l->out.data + (size_t)(n * C) * cs, ct, y, MP_F32, (size_t)C);
    }
    return nomem ? mp_layer_nomem(l, "its row buffers") : MP_OK;
}

/* dx[n, i, j, c] = dy[n, c] / (h w), the quotient rounded once to float32. */
static mp_status gap_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    (void)accumulate;
    if (mp_layer_input_is_data(m, l, 0)) return MP_OK;
    const mp_layer *src = mp_layer_csrc(m, l, 0);
    const int64_t H = src->shape[0], W = src->shape[1], C = src->shape[2], rows = m->batch * H;
    const double hw = (double)(H * W);
    mp_tensor dx;
    bool direct;
    if (mp_layer_input_grad(m, l, 0, &dx, &direct)) return MP_ERR_NOMEM;
    const size_t gs = mp_dtype_size(l->grad.dtype), xs = mp_dtype_size(dx.dtype);
    int nomem = 0;
#pragma omp parallel for schedule(static) reduction(|| : nomem) if (rows * W * C > PARALLEL_WORK)
    for (int64_t r = 0; r < rows; r++) {
        float *g = mp_scratch(SLOT_IN, (size_t)C * sizeof *g);
        float *row = mp_scratch(SLOT_OUT, (size_t)(W * C) * sizeof *row);
        if (!g || !row) {
            nomem = 1;
            continue;
        }
        mp_convert(g, MP_F32, (const char *)l->grad.data + (size_t)(r / H * C) * gs, l->grad.dtype,
                   (size_t)C);
        for (int64_t c = 0; c < C; c++) g[c] = (float)((double)g[c] / hw);
        for (int64_t iw = 0; iw < W; iw++) memcpy(row + iw * C, g, (size_t)C * sizeof *g);
        mp_convert((char *)dx.data + (size_t)(r * W * C) * xs, dx.dtype, row, MP_F32,
                   (size_t)(W * C));
    }
    if (nomem) return mp_layer_nomem(l, "its row buffers");
    return mp_layer_input_grad_done(m, l, 0, &dx, direct);
}

const mp_layer_ops mp_global_average_pooling2d_ops = {
    .class_name = "GlobalAveragePooling2D",
    .base_name = "global_average_pooling2d",
    .min_inputs = 1,
    .max_inputs = 1,
    .build = gap_build,
    .forward = gap_forward,
    .backward = gap_backward,
    .saved_bytes = gap_saved_bytes,
};

mp_node mp_global_average_pooling2d(mp_model *m, mp_node x, const mp_layer_options *o)
{
    return mp_layer_create(m, &mp_global_average_pooling2d_ops, &x, 1, NULL, o);
}
