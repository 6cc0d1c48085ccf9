/* dense.c - Dense: y = act(x W + b) over the last axis, W [in, units]. The
 * GEMM reads x and W in the compute dtype, accumulates in float32 and fuses
 * bias, relu and the cast to the output; activations whose derivative needs
 * the pre-activation keep it. Backward: dW = x^T dz, db = column sums of dz
 * (float32), dx = dz W^T.
 *
 * In float8 (nn/quant.h, mixprec/fp8.h) the GEMMs read quantized operands:
 * x (in the compute dtype) and W (from its float32 master) per tensor in
 * E4M3, dz in E5M2 (HYBRID) or E4M3, their fp8 values decoded exactly to
 * bfloat16, each GEMM's result multiplied by the product of its operands'
 * 1/scale in the epilogue; db stays the float32 column sum of dz. What
 * the forward keeps of x for dW: its fp8 codes (one byte an element) when
 * x would otherwise be copied (data, another dtype) or its producer drops
 * it (layer.h: no backward reads it in full); when x is a tensor the
 * producer keeps anyway, nothing, and backward quantizes it again with the
 * forward's scale (the same codes). A relu Dense whose output is dropped
 * reads y > 0 for its derivative from its consumer's codes, which then
 * carry it (nn/quant.h, keeps_sign), else from a bit mask it keeps instead
 * of y (layer.h). Everything goes through the quantizer's table
 * (nn/quant.h), which also serves one whose operands differ per pass: in
 * MX (nn/mx_quant.c) each of the three GEMMs gets x, W and dz in blocks
 * along its own reduction axis, decoded exactly, alpha 1, and the forward
 * keeps only what mixed_bfloat16 keeps. */
#include "kernels/ops.h"
#include "nn/layer.h"
#include "nn/quant.h"

typedef struct {
    int64_t units;
    mp_activation act;
} dense_config;

typedef struct {
    mp_tensor in;  /* input in the compute dtype, kept for dW */
    mp_tensor pre; /* pre-activation when the derivative needs it */
    /* float8 (nn/quant.h): the input's kept form for dW (NULL: quantize
     * `in` again) and the kernel's operand */
    const void *xs;
    mp_quant_operand wq;
} dense_state;

static bool keeps_pre(const dense_config *c) { return mp_op_activation_grad_needs_input(c->act); }

/* What backward reads of y: nothing (no activation, or one whose
 * derivative takes the pre-activation), its sign (relu), else all. */
static mp_output_use dense_output_use(const mp_layer *l)
{
    const dense_config *c = l->config;
    if (c->act == MP_ACT_NONE || keeps_pre(c)) return MP_OUTPUT_UNREAD;
    return c->act == MP_ACT_RELU ? MP_OUTPUT_SIGN : MP_OUTPUT_READ;
}

static mp_status dense_build(mp_model *m, mp_layer *l)
{
    const dense_config *c = l->config;
    if (c->units < 1)
        return mp_set_error(MP_ERR_INVALID, "dense '%s': units = %lld", l->name,
                            (long long)c->units);
    if ((unsigned)c->act > MP_ACT_SOFTMAX || c->act == MP_ACT_SOFTMAX)
        return mp_set_error(
            MP_ERR_INVALID,
            "dense '%s': activation %d cannot be fused (use an Activation layer for softmax)",
            l->name, (int)c->act);
    int64_t kernel[2] = {layer_cols(l), c->units};
    l->shape[l->ndim - 1] = c->units;
    if (mp_layer_add_param(m, l, MP_ROLE_KERNEL, NULL, 2, kernel, 0) ||
        mp_layer_add_param(m, l, MP_ROLE_BIAS, NULL, 1, &c->units, 0))
        return m->err;
    return MP_OK;
}

static size_t dense_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    int64_t n = layer_numel(l, batch);
    size_t pre = arena_bytes((size_t)n * mp_dtype_size(l->policy.compute));
    size_t out =
        mp_layer_output_saved_bytes(l, n, l->policy.compute, dense_output_use(l) == MP_OUTPUT_SIGN);
    size_t in = mp_layer_quantized(l) ? mp_float8_input_saved_bytes(m, l, batch) /* its codes */
                                      : mp_layer_kept_input_bytes(m, l, 0, batch);
    return in + out + (keeps_pre(l->config) ? pre : 0);
}

static size_t dense_workspace_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    const dense_config *c = l->config;
    size_t dz = (size_t)layer_numel(l, batch) * mp_dtype_size(l->policy.compute);
    size_t bytes = arena_bytes(dz) + arena_bytes((size_t)c->units * sizeof(float)); /* dz, bias */
    if (mp_layer_quantized(l)) bytes += mp_float8_workspace_bytes(m, l, batch);
    return bytes;
}

static mp_status dense_forward(mp_model *m, mp_layer *l, bool training)
{
    const dense_config *c = l->config;
    dense_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    mp_model_param *w = mp_layer_param(m, l, 0), *b = mp_layer_param(m, l, 1);
    mp_quant_operand xo = {NULL, ct, 1.0f}, wo = {w->weight, w->weight_dtype, 1.0f};
    if (mp_layer_quantized(l)) {
        if (mp_float8_forward(m, l, training, &st->in, &st->xs, &xo, &st->wq)) return MP_ERR_NOMEM;
        wo = st->wq;
    } else if (mp_layer_input_compute(m, l, 0, true, &st->in)) {
        return MP_ERR_NOMEM;
    }
    if (!xo.data) xo.data = st->in.data;
    if (mp_layer_alloc_output(m, l, ct)) return MP_ERR_NOMEM;
    const float *bias = b->master;
    if (!bias) { /* pure low-precision policy: widen the bias for the epilogue */
        float *tmp = mp_arena_alloc(m->tmp, (size_t)c->units * sizeof(float));
        if (!tmp) return mp_layer_nomem(l, "a bias copy");
        mp_convert(tmp, MP_F32, b->weight, b->weight_dtype, (size_t)c->units);
        bias = tmp;
    }
    int64_t in = w->shape[0], rows = layer_numel(l, m->batch) / c->units;
    bool fuse = c->act == MP_ACT_NONE || c->act == MP_ACT_RELU;
    mp_tensor *z = &l->out;
    if (keeps_pre(c)) {
        if (mp_layer_alloc(m, l, m->act, ct, &st->pre))
            return mp_layer_nomem(l, "its pre-activation");
        z = &st->pre;
    }
    mp_gemm_args g = mp_gemm_args_default();
    g.m = rows;
    g.n = c->units;
    g.k = in;
    g.alpha = xo.inv_scale * wo.inv_scale;
    g.a = xo.data;
    g.a_type = xo.dtype;
    g.lda = in;
    g.b = wo.data;
    g.b_type = wo.dtype;
    g.ldb = c->units;
    g.c = z->data;
    g.c_type = ct;
    g.ldc = c->units;
    g.bias = bias;
    g.activation = fuse ? c->act : MP_ACT_NONE;
    mp_status s = mp_gemm_ex(&g);
    if (s) return s;
    if (!fuse)
        mp_op_activation(c->act, z->data, ct, l->out.data, ct, (size_t)mp_tensor_numel(&l->out));
    if (l->out_dropped && dense_output_use(l) == MP_OUTPUT_SIGN) return mp_layer_keep_sign(m, l);
    return MP_OK;
}

static mp_status dense_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    const dense_config *c = l->config;
    const dense_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    mp_model_param *w = mp_layer_param(m, l, 0), *b = mp_layer_param(m, l, 1);
    int64_t in = w->shape[0], units = c->units, rows = mp_tensor_numel(&l->out) / units;
    const mp_tensor *g = &l->grad;
    mp_tensor dz = *g;
    if (c->act != MP_ACT_NONE) {
        if (mp_layer_alloc(m, l, m->tmp, ct, &dz))
            return mp_layer_nomem(l, "its pre-activation gradient");
        const mp_tensor *saved = keeps_pre(c) ? &st->pre : &l->out;
        mp_status s = MP_OK;
        if (l->out_dropped && dense_output_use(l) == MP_OUTPUT_SIGN)
            s = mp_layer_sign_grad(l, g, &dz);
        else
            mp_op_activation_grad(c->act, saved->data, ct, g->data, g->dtype, dz.data, ct,
                                  (size_t)mp_tensor_numel(&dz));
        if (s) return s;
    }
    mp_float8_grad_operands q = {{st->in.data, ct, 1.0f},
                                 {dz.data, dz.dtype, 1.0f},
                                 {dz.data, dz.dtype, 1.0f},
                                 {w->weight, w->weight_dtype, 1.0f}};
    if (mp_layer_quantized(l)) {
        q.w = st->wq;
        if (mp_float8_backward(m, l, &dz, &st->in, st->xs, &q)) return MP_ERR_NOMEM;
    }
    /* dW = x^T dz and db = column sums of dz, float32 */
    mp_gemm_args gw = mp_gemm_args_default();
    gw.trans_a = true;
    gw.m = in;
    gw.n = units;
    gw.k = rows;
    gw.alpha = q.x.inv_scale * q.dz_w.inv_scale;
    gw.a = q.x.data;
    gw.a_type = q.x.dtype;
    gw.lda = in;
    gw.b = q.dz_w.data;
    gw.b_type = q.dz_w.dtype;
    gw.ldb = units;
    gw.beta = accumulate ? 1.0f : 0.0f;
    gw.c = w->grad;
    gw.c_type = MP_F32;
    gw.ldc = units;
    bool dw_nonfinite = false;
    gw.c_nonfinite = &dw_nonfinite;
    mp_status s = mp_gemm_ex(&gw);
    if (s) return s;
    /* the GEMM wrote all of dW (its sum, when accumulating) and saw it */
    m->params[l->param_first].grad_finite = !dw_nonfinite;
    mp_op_column_sum(dz.data, dz.dtype, rows, units, b->grad, accumulate);
    if (mp_layer_input_is_data(m, l, 0)) return MP_OK;
    mp_tensor dx;
    bool direct;
    if (mp_layer_input_grad(m, l, 0, &dx, &direct)) return MP_ERR_NOMEM;
    mp_gemm_args gx = mp_gemm_args_default();
    gx.trans_b = true;
    gx.m = rows;
    gx.n = in;
    gx.k = units;
    gx.alpha = q.dz_x.inv_scale * q.w.inv_scale;
    gx.a = q.dz_x.data;
    gx.a_type = q.dz_x.dtype;
    gx.lda = units;
    gx.b = q.w.data;
    gx.b_type = q.w.dtype;
    gx.ldb = units;
    gx.c = dx.data;
    gx.c_type = ct;
    gx.ldc = in;
    if ((s = mp_gemm_ex(&gx))) return s;
    return mp_layer_input_grad_done(m, l, 0, &dx, direct);
}

static mp_status dense_to_json(const mp_layer *l, json_t *o)
{
    const dense_config *c = l->config;
    json_object_set_new(o, "units", json_integer(c->units));
    json_object_set_new(o, "activation", json_string(mp_activation_name(c->act)));
    return MP_OK;
}

static mp_status dense_from_json(const json_t *o, void *config)
{
    dense_config *c = config;
    mp_status s = mp_json_int_field(o, "units", 1, MP_CONFIG_MAX_WIDTH, &c->units);
    c->act = MP_ACT_NONE;
    if (!s && json_object_get(o, "activation"))
        s = mp_json_activation_field(o, "activation", &c->act);
    return s;
}

const mp_layer_ops mp_dense_ops = {
    .class_name = "Dense",
    .base_name = "dense",
    .min_inputs = 1,
    .max_inputs = 1,
    .float8 = true,
    .config_size = sizeof(dense_config),
    .state_size = sizeof(dense_state),
    .fields = (const char *const[]){"units", "activation", NULL},
    .build = dense_build,
    .forward = dense_forward,
    .backward = dense_backward,
    .saved_bytes = dense_saved_bytes,
    .workspace_bytes = dense_workspace_bytes,
    .to_json = dense_to_json,
    .from_json = dense_from_json,
    .output_use = dense_output_use,
    .compact_input = mp_float8_compact_input,
    .sign_input = mp_float8_compact_input,
};

mp_node mp_dense(mp_model *m, mp_node x, int64_t units, mp_activation act,
                 const mp_layer_options *o)
{
    dense_config c = {units, act};
    return mp_layer_create(m, &mp_dense_ops, &x, 1, &c, o);
}
