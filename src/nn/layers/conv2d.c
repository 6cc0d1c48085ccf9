/* conv2d.c - Conv2D (Keras, channels-last): y = act(conv(x, W) + b) with x
 * [batch, h, w, in], W [kh, kw, in, filters], strides, dilations and
 * valid/same padding (kernels/conv.h). Forward is one implicit GEMM in the
 * compute dtype with float32 accumulation, fused bias, relu and the cast to
 * the output; activations whose derivative needs the pre-activation keep
 * it. Backward: dW = patches(x)^T dz and dx = the transposed convolution of
 * dz, both implicit GEMMs; db = column sums of dz (float32). In float8
 * (nn/quant.h) the three GEMMs read the per-tensor quantized x, W and dz as
 * Dense does, each result multiplied by its operands' 1/scale (alpha); in
 * MX (nn/mx_quant.c) x as [pixels, channels] and W as [kh*kw*in, filters]
 * in blocks along each GEMM's reduction axis, alpha 1. */
#include "kernels/ops.h"
#include "nn/layers/spatial.h"
#include "nn/quant.h"

typedef mp_conv2d_options conv2d_config;

typedef struct {
    mp_tensor in;   /* input in the compute dtype, kept for dW */
    mp_tensor pre;  /* pre-activation when the derivative needs it */
    mp_conv_geom g; /* of the last forward (its batch) */
    /* float8 or MX: the input's kept form (NULL: quantize `in` again), the
     * kernel's operand */
    const void *xs;
    mp_quant_operand wq;
} conv2d_state;

mp_conv2d_options mp_conv2d_options_default(int64_t filters, int64_t kh, int64_t kw)
{
    return (mp_conv2d_options){.filters = filters,
                               .kernel_size = {kh, kw},
                               .strides = {1, 1},
                               .padding = MP_PADDING_VALID,
                               .dilation_rate = {1, 1},
                               .use_bias = true,
                               .activation = MP_ACT_NONE};
}

static bool keeps_pre(const conv2d_config *c)
{
    return mp_op_activation_grad_needs_input(c->activation);
}
static bool fused(const conv2d_config *c)
{
    return c->activation == MP_ACT_NONE || c->activation == MP_ACT_RELU;
}

/* A kernel's failure (its buffers) as the layer's, naming it. */
static mp_status kernel_failed(const mp_layer *l, mp_status s)
{
    return s == MP_ERR_NOMEM ? mp_layer_nomem(l, "the convolution's buffers")
                             : mp_set_error(s, "layer '%s': %s", l->name, mp_last_error());
}

static mp_status conv2d_build(mp_model *m, mp_layer *l)
{
    const conv2d_config *c = l->config;
    mp_status s = mp_spatial_input(l);
    if (s) return s;
    if (c->filters < 1 || c->filters > MP_CONFIG_MAX_WIDTH)
        return mp_set_error(MP_ERR_INVALID, "conv2d '%s': filters = %lld (1..%lld allowed)",
                            l->name, (long long)c->filters, (long long)MP_CONFIG_MAX_WIDTH);
    if ((s = mp_spatial_activation(l, c->activation))) return s;
    if ((s = mp_spatial_check(l, "kernel_size", c->kernel_size, c->strides, c->dilation_rate,
                              c->padding)))
        return s;
    mp_conv_geom g;
    if ((s = mp_spatial_geom(l, &g, c->kernel_size, c->strides, c->dilation_rate, c->filters,
                             c->padding)))
        return s;
    int64_t kernel[4] = {g.kh, g.kw, g.c, g.o};
    l->shape[0] = g.oh;
    l->shape[1] = g.ow;
    l->shape[2] = g.o;
    if (mp_layer_add_param(m, l, MP_ROLE_KERNEL, NULL, 4, kernel, 0) ||
        (c->use_bias && mp_layer_add_param(m, l, MP_ROLE_BIAS, NULL, 1, &c->filters, 0)))
        return m->err;
    return MP_OK;
}

static size_t conv2d_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    size_t out = arena_bytes((size_t)layer_numel(l, batch) * mp_dtype_size(l->policy.compute));
    size_t in = mp_layer_quantized(l) ? mp_float8_input_saved_bytes(m, l, batch) /* its codes */
                                      : mp_layer_kept_input_bytes(m, l, 0, batch);
    return in + out + (keeps_pre(l->config) ? out : 0);
}

static size_t conv2d_workspace_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    const conv2d_config *c = l->config;
    size_t dz = c->activation == MP_ACT_NONE
                    ? 0
                    : arena_bytes((size_t)layer_numel(l, batch) * mp_dtype_size(l->policy.compute));
    size_t bias = c->use_bias ? arena_bytes((size_t)c->filters * sizeof(float)) : 0;
    size_t fp8 = mp_layer_quantized(l) ? mp_float8_workspace_bytes(m, l, batch) : 0;
    return dz + bias + fp8; /* the pre-activation gradient; a float32 bias copy in forward */
}

static mp_status conv2d_forward(mp_model *m, mp_layer *l, bool training)
{
    const conv2d_config *c = l->config;
    conv2d_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    const mp_model_param *w = mp_layer_param(m, l, 0);
    mp_quant_operand xo = {NULL, ct, 1.0f}, wo = {w->weight, w->weight_dtype, 1.0f};
    if (mp_layer_quantized(l)) {
        if (mp_float8_forward(m, l, training, &st->in, &st->xs, &xo, &st->wq)) return MP_ERR_NOMEM;
        wo = st->wq;
    } else if (mp_layer_input_compute(m, l, 0, true, &st->in)) {
        return MP_ERR_NOMEM;
    }
    if (!xo.data) xo.data = st->in.data;
    if (mp_layer_alloc(m, l, m->act, ct, &l->out)) return mp_layer_nomem(l, "its output");
    mp_tensor *z = &l->out;
    if (keeps_pre(c)) {
        if (mp_layer_alloc(m, l, m->act, ct, &st->pre))
            return mp_layer_nomem(l, "its pre-activation");
        z = &st->pre;
    }
    const float *bias = NULL;
    if (c->use_bias) {
        const mp_model_param *b = mp_layer_param(m, l, 1);
        bias = b->master;
        if (!bias) { /* pure low-precision policy: widen the bias for the epilogue */
            float *tmp = mp_arena_alloc(m->tmp, (size_t)c->filters * sizeof(float));
            if (!tmp) return mp_layer_nomem(l, "a bias copy");
            mp_convert(tmp, MP_F32, b->weight, b->weight_dtype, (size_t)c->filters);
            bias = tmp;
        }
    }
    const mp_layer *src = mp_layer_csrc(m, l, 0);
    st->g = (mp_conv_geom){.n = m->batch,
                           .h = src->shape[0],
                           .w = src->shape[1],
                           .c = src->shape[2],
                           .kh = c->kernel_size[0],
                           .kw = c->kernel_size[1],
                           .o = c->filters,
                           .sh = c->strides[0],
                           .sw = c->strides[1],
                           .dh = c->dilation_rate[0],
                           .dw = c->dilation_rate[1]};
    mp_status s = mp_conv_geom_init(&st->g, c->padding == MP_PADDING_SAME);
    mp_conv_geom g = st->g;
    g.alpha = xo.inv_scale * wo.inv_scale;
    if (!s)
        s = mp_conv2d_forward(&g, xo.data, xo.dtype, wo.data, wo.dtype, bias,
                              fused(c) ? c->activation : MP_ACT_NONE, z->data, ct);
    if (s) return kernel_failed(l, s);
    if (!fused(c))
        mp_op_activation(c->activation, z->data, ct, l->out.data, ct,
                         (size_t)mp_tensor_numel(&l->out));
    return MP_OK;
}

static mp_status conv2d_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    const conv2d_config *c = l->config;
    const conv2d_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    mp_model_param *w = mp_layer_param(m, l, 0);
    const mp_tensor *g = &l->grad;
    mp_tensor dz = *g;
    if (c->activation != MP_ACT_NONE) {
        if (mp_layer_alloc(m, l, m->tmp, ct, &dz))
            return mp_layer_nomem(l, "its pre-activation gradient");
        const mp_tensor *saved = keeps_pre(c) ? &st->pre : &l->out;
        mp_op_activation_grad(c->activation, saved->data, ct, g->data, g->dtype, dz.data, ct,
                              (size_t)mp_tensor_numel(&dz));
    }
    mp_float8_grad_operands q = {{st->in.data, ct, 1.0f},
                                 {dz.data, dz.dtype, 1.0f},
                                 {dz.data, dz.dtype, 1.0f},
                                 {w->weight, w->weight_dtype, 1.0f}};
    if (mp_layer_quantized(l)) {
        q.w = st->wq;
        if (mp_float8_backward(m, l, &dz, &st->in, st->xs, &q)) return MP_ERR_NOMEM;
    }
    mp_conv_geom gf = st->g, gd = st->g;
    gf.alpha = q.x.inv_scale * q.dz_w.inv_scale;
    gd.alpha = q.dz_x.inv_scale * q.w.inv_scale;
    mp_status s = mp_conv2d_backward_filter(&gf, q.x.data, q.x.dtype, q.dz_w.data, q.dz_w.dtype,
                                            w->grad, accumulate);
    if (s) return kernel_failed(l, s);
    if (c->use_bias)
        mp_op_column_sum(dz.data, dz.dtype, mp_tensor_numel(&dz) / c->filters, c->filters,
                         mp_layer_param(m, l, 1)->grad, accumulate);
    if (mp_layer_input_is_data(m, l, 0)) return MP_OK;
    mp_tensor dx;
    bool direct;
    if (mp_layer_input_grad(m, l, 0, &dx, &direct)) return MP_ERR_NOMEM;
    if ((s = mp_conv2d_backward_data(&gd, q.dz_x.data, q.dz_x.dtype, q.w.data, q.w.dtype, dx.data,
                                     ct)))
        return kernel_failed(l, s);
    return mp_layer_input_grad_done(m, l, 0, &dx, direct);
}

/* ------------------------------------------------------------------- JSON */

static mp_status conv2d_to_json(const mp_layer *l, json_t *o)
{
    const conv2d_config *c = l->config;
    json_object_set_new(o, "filters", json_integer(c->filters));
    json_object_set_new(o, "kernel_size", mp_json_pair(c->kernel_size));
    json_object_set_new(o, "strides", mp_json_pair(c->strides));
    json_object_set_new(o, "padding", json_string(mp_padding_name(c->padding)));
    json_object_set_new(o, "dilation_rate", mp_json_pair(c->dilation_rate));
    json_object_set_new(o, "use_bias", json_boolean(c->use_bias));
    json_object_set_new(o, "activation", json_string(mp_activation_name(c->activation)));
    return MP_OK;
}

/* filters and kernel_size are required (as in Keras's constructor); the
 * others take Keras's defaults when absent. */
static mp_status conv2d_from_json(const json_t *o, void *config)
{
    conv2d_config *c = config;
    *c = mp_conv2d_options_default(0, 0, 0);
    mp_status s = mp_json_int_field(o, "filters", 1, MP_CONFIG_MAX_WIDTH, &c->filters);
    if (!s) s = mp_json_pair_field(o, "kernel_size", 1, MP_SPATIAL_MAX, c->kernel_size);
    if (!s) s = mp_json_pair_opt(o, "strides", 1, MP_SPATIAL_MAX, c->strides);
    if (!s && json_object_get(o, "padding")) s = mp_json_padding_field(o, "padding", &c->padding);
    if (!s) s = mp_json_pair_opt(o, "dilation_rate", 1, MP_SPATIAL_MAX, c->dilation_rate);
    if (!s) s = mp_json_bool_opt(o, "use_bias", &c->use_bias);
    if (!s) s = mp_json_activation_opt(o, "activation", &c->activation);
    return s;
}

const mp_layer_ops mp_conv2d_ops = {
    .float8 = true,
    .class_name = "Conv2D",
    .base_name = "conv2d",
    .min_inputs = 1,
    .max_inputs = 1,
    .config_size = sizeof(conv2d_config),
    .state_size = sizeof(conv2d_state),
    .fields = (const char *const[]){"filters", "kernel_size", "strides", "padding", "dilation_rate",
                                    "use_bias", "activation", NULL},
    .build = conv2d_build,
    .forward = conv2d_forward,
    .backward = conv2d_backward,
    .saved_bytes = conv2d_saved_bytes,
    .workspace_bytes = conv2d_workspace_bytes,
    .to_json = conv2d_to_json,
    .from_json = conv2d_from_json,
    .compact_input = mp_float8_compact_input,
    .sign_input = mp_float8_compact_input,
};

mp_node mp_conv2d(mp_model *m, mp_node x, const mp_conv2d_options *c, const mp_layer_options *o)
{
    conv2d_config cfg = c ? *c : mp_conv2d_options_default(0, 0, 0);
    return mp_layer_create(m, &mp_conv2d_ops, &x, 1, &cfg, o);
}
