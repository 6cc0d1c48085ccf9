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
 * 1/scale in the epilogue; db stays the float32 column sum of dz. What the forward keeps of x for
 * dW: its fp8 codes (one byte an element) when x would otherwise be copied (data, another dtype);
 * when x is a tensor the producer keeps anyway, nothing, and backward
 * quantizes it again with the forward's scale (the same codes). Everything
 * goes through the quantizer's table (nn/quant.h), which also serves one
 * whose operands differ per pass (MX blocks along the reduction). */
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
    /* quantized (nn/quant.h): the input's kept form for dW (NULL: quantize
     * `in` again) and the kernel's operand */
    const void *xs;
    mp_quant_operand wq;
} dense_state;

/* The quantizer of a float8 layer (all its tensors share one). */
static const mp_quantizer *quantizer(const mp_model *m, const mp_layer *l)
{
    return m->fp8[l->fp8_first].ops;
}

/* Quantized: the compact form of x's operand is kept for dW when it can
 * serve that pass and x would otherwise be copied; else x itself is kept. */
static bool keeps_x_operand(const mp_model *m, const mp_layer *l, int64_t batch)
{
    return quantizer(m, l)->pass_invariant && mp_layer_kept_input_bytes(m, l, 0, batch) > 0;
}

static bool keeps_pre(const dense_config *c) { return mp_op_activation_grad_needs_input(c->act); }

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
    size_t out = arena_bytes((size_t)layer_numel(l, batch) * mp_dtype_size(l->policy.compute));
    size_t in = mp_layer_kept_input_bytes(m, l, 0, batch);
    if (l->fp8_active && keeps_x_operand(m, l, batch)) /* float8: one byte an element */
        in = arena_bytes(quantizer(m, l)->stored_bytes(layer_numel(mp_layer_csrc(m, l, 0), batch) /
                                                           layer_cols(mp_layer_csrc(m, l, 0)),
                                                       layer_cols(mp_layer_csrc(m, l, 0))));
    return in + out + (keeps_pre(l->config) ? out : 0);
}

static size_t dense_workspace_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    const dense_config *c = l->config;
    size_t dz = (size_t)layer_numel(l, batch) * mp_dtype_size(l->policy.compute);
    size_t bytes = arena_bytes(dz) + arena_bytes((size_t)c->units * sizeof(float)); /* dz, bias */
    if (l->fp8_active) { /* dz's operand, x's (forward or again); per pass: dz's, W's again */
        const mp_quantizer *qz = quantizer(m, l);
        int64_t rows = layer_numel(l, batch) / c->units, in = layer_cols(mp_layer_csrc(m, l, 0));
        bytes += arena_bytes(qz->operand_bytes(rows, c->units)) +
                 arena_bytes(qz->operand_bytes(rows, in));
        if (!qz->pass_invariant)
            bytes += arena_bytes(qz->operand_bytes(rows, c->units)) +
                     arena_bytes(qz->operand_bytes(in, c->units));
    }
    return bytes;
}

/* The kernel as the quantizer reads it: its float32 master when there is
 * one, the reduction along `in` (k_axis 0, forward) or units (1, dX). */
static mp_quant_input kernel_input(const mp_model_param *w, int k_axis)
{
    return (mp_quant_input){w->master ? (const void *)w->master : w->weight,
                            w->master ? MP_F32 : w->weight_dtype, w->shape[0], w->shape[1], k_axis};
}

/* Quantized: the kernel's operand into its persistent buffer, and the input's into the temporaries,
 * its compact form kept in the activation arena unless backward quantizes
 * x again. */
static mp_status quantize_forward(mp_model *m, mp_layer *l, bool training, mp_quant_operand *xo)
{
    const dense_config *c = l->config;
    dense_state *st = l->state;
    mp_float8_meta *q = mp_float8_layer_metas(m, l);
    const mp_quantizer *qz = q->ops;
    mp_quant_mode mode = training ? MP_QUANT_TRAIN : MP_QUANT_INFER;
    mp_model_param *w = mp_layer_param(m, l, 0);
    int64_t in = w->shape[0], rows = layer_numel(l, m->batch) / c->units;
    mp_quant_input wi = kernel_input(w, 0);
    qz->quantize(&q[MP_FLOAT8_WEIGHT], &wi, mode, NULL, q[MP_FLOAT8_WEIGHT].codes, &st->wq);
    bool save = keeps_x_operand(m, l, m->batch);
    if (mp_layer_input_compute(m, l, 0, !save, &st->in)) return MP_ERR_NOMEM;
    void *stored = save ? mp_arena_alloc(m->act, qz->stored_bytes(rows, in)) : NULL;
    void *op = mp_arena_alloc(m->tmp, qz->operand_bytes(rows, in));
    if (!op || (save && !stored)) return mp_layer_nomem(l, "its input's quantized operand");
    mp_quant_input xi = {st->in.data, st->in.dtype, rows, in, 1};
    qz->quantize(&q[MP_FLOAT8_INPUT], &xi, mode, stored, op, xo);
    st->xs = stored;
    return MP_OK;
}

static mp_status dense_forward(mp_model *m, mp_layer *l, bool training)
{
    const dense_config *c = l->config;
    dense_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    mp_model_param *w = mp_layer_param(m, l, 0), *b = mp_layer_param(m, l, 1);
    mp_quant_operand xo = {NULL, ct, 1.0f}, wo = {w->weight, w->weight_dtype, 1.0f};
    if (l->fp8_active) {
        if (quantize_forward(m, l, training, &xo)) return MP_ERR_NOMEM;
        wo = st->wq;
    } else if (mp_layer_input_compute(m, l, 0, true, &st->in)) {
        return MP_ERR_NOMEM;
    }
    if (!xo.data) xo.data = st->in.data;
    if (mp_layer_alloc(m, l, m->act, ct, &l->out)) return mp_layer_nomem(l, "its output");
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
    return MP_OK;
}

/* Quantized: dz's operands (its statistics recorded once), x's for dW
 * (kept, or quantized again as the forward did) and W's for dX (the
 * forward's, or quantized again along units). */
static void *tmp_operand(mp_model *m, const mp_quantizer *qz, int64_t rows, int64_t cols)
{
    return mp_arena_alloc(m->tmp, qz->operand_bytes(rows, cols));
}

static mp_status quantize_backward(mp_model *m, mp_layer *l, const mp_tensor *dz,
                                   mp_quant_operand *xo, mp_quant_operand *dzw,
                                   mp_quant_operand *dzx, mp_quant_operand *wo)
{
    const dense_config *c = l->config;
    const dense_state *st = l->state;
    mp_float8_meta *q = mp_float8_layer_metas(m, l);
    const mp_quantizer *qz = q->ops;
    mp_model_param *w = mp_layer_param(m, l, 0);
    int64_t in = w->shape[0], rows = mp_tensor_numel(dz) / c->units;
    void *gq = tmp_operand(m, qz, rows, c->units), *xq = tmp_operand(m, qz, rows, in);
    if (!gq || !xq) return mp_layer_nomem(l, "its quantized operands");
    mp_quant_input gi = {dz->data, dz->dtype, rows, c->units, 0};
    qz->quantize(&q[MP_FLOAT8_GRAD_OUTPUT], &gi, MP_QUANT_TRAIN, NULL, gq, dzw);
    if (st->xs) {
        qz->restore(&q[MP_FLOAT8_INPUT], st->xs, rows, in, xq, xo);
    } else {
        mp_quant_input xi = {st->in.data, st->in.dtype, rows, in, 0};
        qz->quantize(&q[MP_FLOAT8_INPUT], &xi, MP_QUANT_AGAIN, NULL, xq, xo);
    }
    *dzx = *dzw;
    *wo = st->wq;
    if (qz->pass_invariant) return MP_OK;
    void *g2 = tmp_operand(m, qz, rows, c->units), *w2 = tmp_operand(m, qz, in, c->units);
    if (!g2 || !w2) return mp_layer_nomem(l, "its quantized operands");
    gi.k_axis = 1;
    qz->quantize(&q[MP_FLOAT8_GRAD_OUTPUT], &gi, MP_QUANT_INFER, NULL, g2, dzx);
    mp_quant_input wi = kernel_input(w, 1);
    qz->quantize(&q[MP_FLOAT8_WEIGHT], &wi, MP_QUANT_AGAIN, NULL, w2, wo);
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
        mp_op_activation_grad(c->act, saved->data, ct, g->data, g->dtype, dz.data, ct,
                              (size_t)mp_tensor_numel(&dz));
    }
    mp_quant_operand xo = {st->in.data, ct, 1.0f}, wo = {w->weight, w->weight_dtype, 1.0f};
    mp_quant_operand dzo = {dz.data, dz.dtype, 1.0f}, dzx = dzo;
    if (l->fp8_active && quantize_backward(m, l, &dz, &xo, &dzo, &dzx, &wo)) return MP_ERR_NOMEM;
    /* dW = x^T dz and db = column sums of dz, float32 */
    mp_gemm_args gw = mp_gemm_args_default();
    gw.trans_a = true;
    gw.m = in;
    gw.n = units;
    gw.k = rows;
    gw.alpha = xo.inv_scale * dzo.inv_scale;
    gw.a = xo.data;
    gw.a_type = xo.dtype;
    gw.lda = in;
    gw.b = dzo.data;
    gw.b_type = dzo.dtype;
    gw.ldb = units;
    gw.beta = accumulate ? 1.0f : 0.0f;
    gw.c = w->grad;
    gw.c_type = MP_F32;
    gw.ldc = units;
    mp_status s = mp_gemm_ex(&gw);
    if (s) return s;
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
    gx.alpha = dzx.inv_scale * wo.inv_scale;
    gx.a = dzx.data;
    gx.a_type = dzx.dtype;
    gx.lda = units;
    gx.b = wo.data;
    gx.b_type = wo.dtype;
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
};

mp_node mp_dense(mp_model *m, mp_node x, int64_t units, mp_activation act,
                 const mp_layer_options *o)
{
    dense_config c = {units, act};
    return mp_layer_create(m, &mp_dense_ops, &x, 1, &c, o);
}
