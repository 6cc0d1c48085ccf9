/* depthwise_conv2d.c - DepthwiseConv2D (Keras, channels-last, depth
 * multiplier 1): every channel convolved with its own kh x kw filter,
 *   y[n, i, j, c] = act(b[c] + sum_{a, e} x[n, i*sh - pt + a*dh, j*sw - pl + e*dw, c] w[a, e, c]),
 * kernel [kh, kw, channels, 1] as Keras stores it, bias [channels]. Direct
 * loops over rows of the image, in float32 on the compute-dtype input (rows
 * are decoded into per-thread scratch and each output rounded once). Every
 * element is summed by one thread in the fixed (a, e) order, and the kernel
 * gradient sums the batch over row blocks fixed by the shape, added in
 * block order: the results do not depend on the thread count. */
#include <string.h>

#include "kernels/activation.h"
#include "kernels/ops.h"
#include "nn/layers/spatial.h"

typedef mp_depthwise_conv2d_options dw_config;

typedef struct {
    mp_tensor in;   /* input in the compute dtype, kept for dkernel */
    mp_tensor pre;  /* pre-activation when the derivative needs it */
    mp_conv_geom g; /* of the last forward (its batch); g.o == g.c */
} dw_state;

/* Scratch slots (core/internal.h): 3, 4 per thread in the loops, 5 and 6
 * on the calling thread around them. */
enum { SLOT_IN = 3, SLOT_OUT = 4, SLOT_W = 5, SLOT_PART = 6 };
enum {
    MAX_BLOCKS = 32,        /* row blocks of the kernel gradient at most */
    BLOCK_WORK = 1 << 16,   /* multiply-adds a block should have at least */
    PARALLEL_WORK = 1 << 15 /* below this a loop runs on one thread */
};

mp_depthwise_conv2d_options mp_depthwise_conv2d_options_default(int64_t kh, int64_t kw)
{
    return (mp_depthwise_conv2d_options){.kernel_size = {kh, kw},
                                         .strides = {1, 1},
                                         .padding = MP_PADDING_VALID,
                                         .depth_multiplier = 1,
                                         .dilation_rate = {1, 1},
                                         .use_bias = true,
                                         .activation = MP_ACT_NONE};
}

static bool keeps_pre(const dw_config *c)
{
    return mp_op_activation_grad_needs_input(c->activation);
}
static bool fused(const dw_config *c)
{
    return c->activation == MP_ACT_NONE || c->activation == MP_ACT_RELU;
}

/* Element offset of row (n, r) of an [n, rows, cols, ch] tensor. */
static size_t row_at(int64_t n, int64_t r, int64_t rows, int64_t cols, int64_t ch)
{
    return (size_t)(((n * rows + r) * cols) * ch);
}

/* ---------------------------------------------------------------- kernels */

/* y = act(depthwise(x, w) + b), w float32 [kh, kw, c], b float32 or NULL;
 * act is linear or relu (applied in float32 before the one rounding). */
static mp_status dw_forward(const mp_conv_geom *g, const void *x, mp_dtype xt, const float *w,
                            const float *b, mp_activation act, void *y, mp_dtype yt)
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
        if (!xr || !acc) {
            nomem = 1;
            continue;
        }
        const int64_t n = r / g->oh, oh = r % g->oh;
        memset(acc, 0, (size_t)oc * sizeof *acc);
        for (int64_t kh = 0; kh < g->kh; kh++) {
            const int64_t ih = oh * g->sh - g->pt + kh * g->dh;
            if (ih < 0 || ih >= g->h) continue;
            mp_convert(xr, MP_F32, (const char *)x + row_at(n, ih, g->h, g->w, C) * xs, xt,
                       (size_t)(g->w * C));
            for (int64_t ow = 0; ow < g->ow; ow++)
                for (int64_t kw = 0; kw < g->kw; kw++) {
                    const int64_t iw = ow * g->sw - g->pl + kw * g->dw;
                    if (iw < 0 || iw >= g->w) continue;
                    const float *xp = xr + iw * C, *wp = w + (kh * g->kw + kw) * C;
                    float *ap = acc + ow * C;
                    for (int64_t c = 0; c < C; c++) ap[c] += xp[c] * wp[c];
                }
        }
        for (int64_t ow = 0; ow < g->ow; ow++)
            for (int64_t c = 0; c < C; c++)
                acc[ow * C + c] = mp_activate(act, b ? acc[ow * C + c] + b[c] : acc[ow * C + c]);
        mp_convert((char *)y + (size_t)(r * oc) * ys, yt, acc, MP_F32, (size_t)oc);
    }
    return nomem ? MP_ERR_NOMEM : MP_OK;
}

/* dx = the gradient for x: per input row, gathered from the output rows
 * whose windows reach it, in (a, e) order. */
static mp_status dw_backward_data(const mp_conv_geom *g, const void *dz, mp_dtype zt,
                                  const float *w, void *dx, mp_dtype xt)
{
    const int64_t rows = g->n * g->h, C = g->c, wc = g->w * C, oc = g->ow * C;
    const size_t zs = mp_dtype_size(zt), xs = mp_dtype_size(xt);
    int nomem = 0;
#pragma omp parallel for schedule(static)                                                          \
    reduction(||                                                                                   \
              : nomem) if (rows * wc * g->kh * g->kw > PARALLEL_WORK)
    for (int64_t r = 0; r < rows; r++) {
        float *zr = mp_scratch(SLOT_IN, (size_t)oc * sizeof *zr);
        float *acc = mp_scratch(SLOT_OUT, (size_t)wc * sizeof *acc);
        if (!zr || !acc) {
            nomem = 1;
            continue;
        }
        const int64_t n = r / g->h, ih = r % g->h;
        memset(acc, 0, (size_t)wc * sizeof *acc);
        for (int64_t kh = 0; kh < g->kh; kh++) {
            const int64_t t = ih + g->pt - kh * g->dh;
            if (t < 0 || t % g->sh || t / g->sh >= g->oh) continue;
            mp_convert(zr, MP_F32, (const char *)dz + row_at(n, t / g->sh, g->oh, g->ow, C) * zs,
                       zt, (size_t)oc);
            for (int64_t iw = 0; iw < g->w; iw++)
                for (int64_t kw = 0; kw < g->kw; kw++) {
                    const int64_t u = iw + g->pl - kw * g->dw;
                    if (u < 0 || u % g->sw || u / g->sw >= g->ow) continue;
                    const float *zp = zr + (u / g->sw) * C, *wp = w + (kh * g->kw + kw) * C;
                    float *ap = acc + iw * C;
                    for (int64_t c = 0; c < C; c++) ap[c] += zp[c] * wp[c];
                }
        }
        mp_convert((char *)dx + (size_t)(r * wc) * xs, xt, acc, MP_F32, (size_t)wc);
    }
    return nomem ? MP_ERR_NOMEM : MP_OK;
}

/* dw (float32 [kh, kw, c]) = (accumulate ? dw : 0) + sum over the batch and
 * output pixels of dz * x. Output rows (n, oh) fall into blocks fixed by the
 * shape; each block sums into its own float32 partials, and the partials
 * are added in block order. */
static mp_status dw_backward_filter(const mp_conv_geom *g, const void *x, mp_dtype xt,
                                    const void *dz, mp_dtype zt, float *dw, bool accumulate)
{
    const int64_t rows = g->n * g->oh, C = g->c, kk = g->kh * g->kw * C, oc = g->ow * C;
    const size_t xs = mp_dtype_size(xt), zs = mp_dtype_size(zt);
    int64_t nb = rows * oc * g->kh * g->kw / BLOCK_WORK;
    if (nb > MAX_BLOCKS) nb = MAX_BLOCKS;
    if (nb > rows) nb = rows;
    if (nb < 1) nb = 1;
    const int64_t brows = (rows + nb - 1) / nb;
    nb = (rows + brows - 1) / brows;
    float *part = mp_scratch(SLOT_PART, (size_t)(nb * kk) * sizeof *part);
    if (!part) return MP_ERR_NOMEM;
    int nomem = 0;
#pragma omp parallel for schedule(static) reduction(|| : nomem) if (nb > 1)
    for (int64_t blk = 0; blk < nb; blk++) {
        float *xr = mp_scratch(SLOT_IN, (size_t)(g->w * C) * sizeof *xr);
        float *zr = mp_scratch(SLOT_OUT, (size_t)oc * sizeof *zr);
        if (!xr || !zr) {
            nomem = 1;
            continue;
        }
        float *p = part + blk * kk;
        memset(p, 0, (size_t)kk * sizeof *p);
        const int64_t end = (blk + 1) * brows < rows ? (blk + 1) * brows : rows;
        for (int64_t r = blk * brows; r < end; r++) {
            const int64_t n = r / g->oh, oh = r % g->oh;
            mp_convert(zr, MP_F32, (const char *)dz + (size_t)(r * oc) * zs, zt, (size_t)oc);
            for (int64_t kh = 0; kh < g->kh; kh++) {
                const int64_t ih = oh * g->sh - g->pt + kh * g->dh;
                if (ih < 0 || ih >= g->h) continue;
                mp_convert(xr, MP_F32, (const char *)x + row_at(n, ih, g->h, g->w, C) * xs, xt,
                           (size_t)(g->w * C));
                for (int64_t ow = 0; ow < g->ow; ow++)
                    for (int64_t kw = 0; kw < g->kw; kw++) {
                        const int64_t iw = ow * g->sw - g->pl + kw * g->dw;
                        if (iw < 0 || iw >= g->w) continue;
                        const float *xp = xr + iw * C, *zp = zr + ow * C;
                        float *pp = p + (kh * g->kw + kw) * C;
                        for (int64_t c = 0; c < C; c++) pp[c] += zp[c] * xp[c];
                    }
            }
        }
    }
    if (nomem) return MP_ERR_NOMEM;
    for (int64_t i = 0; i < kk; i++) {
        float s = accumulate ? dw[i] : 0.0f;
        for (int64_t blk = 0; blk < nb; blk++) s += part[blk * kk + i];
        dw[i] = s;
    }
    return MP_OK;
}

/* ------------------------------------------------------------------ layer */

static mp_status dw_build(mp_model *m, mp_layer *l)
{
    const dw_config *c = l->config;
    mp_status s = mp_spatial_input(l);
    if (s) return s;
    if (c->depth_multiplier != 1)
        return mp_set_error(MP_ERR_INVALID,
                            "depthwise_conv2d '%s': depth_multiplier %lld (only 1 is supported)",
                            l->name, (long long)c->depth_multiplier);
    if ((s = mp_spatial_activation(l, c->activation))) return s;
    if ((s = mp_spatial_check(l, "kernel_size", c->kernel_size, c->strides, c->dilation_rate,
                              c->padding)))
        return s;
    mp_conv_geom g;
    if ((s = mp_spatial_geom(l, &g, c->kernel_size, c->strides, c->dilation_rate, l->shape[2],
                             c->padding)))
        return s;
    int64_t kernel[4] = {g.kh, g.kw, g.c, 1};
    l->shape[0] = g.oh;
    l->shape[1] = g.ow;
    if (mp_layer_add_param(m, l, MP_ROLE_KERNEL, NULL, 4, kernel, 0) ||
        (c->use_bias && mp_layer_add_param(m, l, MP_ROLE_BIAS, NULL, 1, &g.c, 0)))
        return m->err;
    return MP_OK;
}

static size_t dw_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    size_t out = arena_bytes((size_t)layer_numel(l, batch) * mp_dtype_size(l->policy.compute));
    return mp_layer_kept_input_bytes(m, l, 0, batch) + out + (keeps_pre(l->config) ? out : 0);
}

static size_t dw_workspace_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    (void)m;
    const dw_config *c = l->config; /* the pre-activation gradient */
    return c->activation == MP_ACT_NONE
               ? 0
               : arena_bytes((size_t)layer_numel(l, batch) * mp_dtype_size(l->policy.compute));
}

/* The kernel as float32 in the calling thread's scratch; the bias's float32
 * master, or under a pure low-precision policy its widened copy there. */
static float *weights_f32(mp_model *m, const mp_layer *l, const float **bias)
{
    const dw_config *c = l->config;
    const mp_model_param *w = mp_layer_param(m, l, 0);
    const int64_t ch = w->shape[2];
    float *f = mp_scratch(SLOT_W, (size_t)(w->n + ch) * sizeof *f);
    if (!f) return NULL;
    mp_convert(f, MP_F32, w->weight, w->weight_dtype, (size_t)w->n);
    *bias = NULL;
    if (c->use_bias) {
        const mp_model_param *b = mp_layer_param(m, l, 1);
        if (b->master) { /* float32 as in Conv2D's epilogue */
            *bias = b->master;
        } else { /* pure low-precision policy: widened */
            mp_convert(f + w->n, MP_F32, b->weight, b->weight_dtype, (size_t)ch);
            *bias = f + w->n;
        }
    }
    return f;
}

static mp_status dw_layer_forward(mp_model *m, mp_layer *l, bool training)
{
    (void)training;
    const dw_config *c = l->config;
    dw_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    if (mp_layer_input_compute(m, l, 0, true, &st->in)) return MP_ERR_NOMEM;
    if (mp_layer_alloc(m, l, m->act, ct, &l->out)) return mp_layer_nomem(l, "its output");
    mp_tensor *z = &l->out;
    if (keeps_pre(c)) {
        if (mp_layer_alloc(m, l, m->act, ct, &st->pre))
            return mp_layer_nomem(l, "its pre-activation");
        z = &st->pre;
    }
    const mp_layer *src = mp_layer_csrc(m, l, 0);
    st->g = (mp_conv_geom){.n = m->batch,
                           .h = src->shape[0],
                           .w = src->shape[1],
                           .c = src->shape[2],
                           .kh = c->kernel_size[0],
                           .kw = c->kernel_size[1],
                           .o = src->shape[2],
                           .sh = c->strides[0],
                           .sw = c->strides[1],
                           .dh = c->dilation_rate[0],
                           .dw = c->dilation_rate[1]};
    mp_status s = mp_conv_geom_init(&st->g, c->padding == MP_PADDING_SAME);
    if (s) return s;
    const float *bias, *w = weights_f32(m, l, &bias);
    if (!w || dw_forward(&st->g, st->in.data, ct, w, bias, fused(c) ? c->activation : MP_ACT_NONE,
                         z->data, ct))
        return mp_layer_nomem(l, "its row buffers");
    if (!fused(c))
        mp_op_activation(c->activation, z->data, ct, l->out.data, ct,
                         (size_t)mp_tensor_numel(&l->out));
    return MP_OK;
}

static mp_status dw_layer_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    const dw_config *c = l->config;
    const dw_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    const mp_tensor *g = &l->grad;
    mp_tensor dz = *g;
    if (c->activation != MP_ACT_NONE) {
        if (mp_layer_alloc(m, l, m->tmp, ct, &dz))
            return mp_layer_nomem(l, "its pre-activation gradient");
        const mp_tensor *saved = keeps_pre(c) ? &st->pre : &l->out;
        mp_op_activation_grad(c->activation, saved->data, ct, g->data, g->dtype, dz.data, ct,
                              (size_t)mp_tensor_numel(&dz));
    }
    if (dw_backward_filter(&st->g, st->in.data, ct, dz.data, dz.dtype,
                           mp_layer_param(m, l, 0)->grad, accumulate))
        return mp_layer_nomem(l, "its kernel-gradient buffers");
    if (c->use_bias)
        mp_op_column_sum(dz.data, dz.dtype, mp_tensor_numel(&dz) / st->g.c, st->g.c,
                         mp_layer_param(m, l, 1)->grad, accumulate);
    if (mp_layer_input_is_data(m, l, 0)) return MP_OK;
    const float *bias, *w = weights_f32(m, l, &bias);
    mp_tensor dx;
    bool direct;
    if (!w) return mp_layer_nomem(l, "a kernel copy");
    if (mp_layer_input_grad(m, l, 0, &dx, &direct)) return MP_ERR_NOMEM;
    if (dw_backward_data(&st->g, dz.data, dz.dtype, w, dx.data, ct))
        return mp_layer_nomem(l, "its row buffers");
    return mp_layer_input_grad_done(m, l, 0, &dx, direct);
}

/* ------------------------------------------------------------------- JSON */

static mp_status dw_to_json(const mp_layer *l, json_t *o)
{
    const dw_config *c = l->config;
    json_object_set_new(o, "kernel_size", mp_json_pair(c->kernel_size));
    json_object_set_new(o, "strides", mp_json_pair(c->strides));
    json_object_set_new(o, "padding", json_string(mp_padding_name(c->padding)));
    json_object_set_new(o, "depth_multiplier", json_integer(c->depth_multiplier));
    json_object_set_new(o, "dilation_rate", mp_json_pair(c->dilation_rate));
    json_object_set_new(o, "use_bias", json_boolean(c->use_bias));
    json_object_set_new(o, "activation", json_string(mp_activation_name(c->activation)));
    return MP_OK;
}

/* kernel_size is required; the others take Keras's defaults when absent. */
static mp_status dw_from_json(const json_t *o, void *config)
{
    dw_config *c = config;
    *c = mp_depthwise_conv2d_options_default(0, 0);
    mp_status s = mp_json_pair_field(o, "kernel_size", 1, MP_SPATIAL_MAX, c->kernel_size);
    if (!s) s = mp_json_pair_opt(o, "strides", 1, MP_SPATIAL_MAX, c->strides);
    if (!s && json_object_get(o, "padding")) s = mp_json_padding_field(o, "padding", &c->padding);
    if (!s && json_object_get(o, "depth_multiplier"))
        s = mp_json_int_field(o, "depth_multiplier", 1, 1, &c->depth_multiplier);
    if (!s) s = mp_json_pair_opt(o, "dilation_rate", 1, MP_SPATIAL_MAX, c->dilation_rate);
    if (!s) s = mp_json_bool_opt(o, "use_bias", &c->use_bias);
    if (!s) s = mp_json_activation_opt(o, "activation", &c->activation);
    return s;
}

const mp_layer_ops mp_depthwise_conv2d_ops = {
    .class_name = "DepthwiseConv2D",
    .base_name = "depthwise_conv2d",
    .min_inputs = 1,
    .max_inputs = 1,
    .config_size = sizeof(dw_config),
    .state_size = sizeof(dw_state),
    .fields = (const char *const[]){"kernel_size", "strides", "padding", "depth_multiplier",
                                    "dilation_rate", "use_bias", "activation", NULL},
    .build = dw_build,
    .forward = dw_layer_forward,
    .backward = dw_layer_backward,
    .saved_bytes = dw_saved_bytes,
    .workspace_bytes = dw_workspace_bytes,
    .to_json = dw_to_json,
    .from_json = dw_from_json,
};

mp_node mp_depthwise_conv2d(mp_model *m, mp_node x, const mp_depthwise_conv2d_options *c,
                            const mp_layer_options *o)
{
    dw_config cfg = c ? *c : mp_depthwise_conv2d_options_default(0, 0);
    return mp_layer_create(m, &mp_depthwise_conv2d_ops, &x, 1, &cfg, o);
}
