/* quant_steps.c - the steps a quantized layer (float8 or MX; nn/quant.h)
 * runs through the quantizer's table: its GEMMs and their kernels, the
 * operands of one GEMM's forward and of its two backward GEMMs, what the
 * forward keeps of the input, the temporaries all this takes, and the
 * wrappers for kinds with one GEMM over their input's last axis (Dense;
 * Conv2D through its patches). */
#include <stdio.h>
#include <string.h>

#include "nn/layer.h"
#include "nn/quant.h"

/* ------------------------------------------------------ the GEMMs */

int mp_quant_gemms(const mp_layer *l)
{
    int n = 0;
    if (!l->ops->float8_gemms) return 1;
    while (l->ops->float8_gemms[n]) n++;
    return n;
}

void mp_quant_meta_name(mp_float8_meta *q, const mp_layer *l, int g)
{
    if (!l->ops->float8_gemms) return; /* "<layer>/<role>" */
    char buf[256];
    const char *slash = strrchr(q->name, '/');
    snprintf(buf, sizeof buf, "%s/%s/%s", l->name, l->ops->float8_gemms[g],
             slash ? slash + 1 : q->name);
    size_t n = strlen(buf) < sizeof q->name ? strlen(buf) : sizeof q->name - 1;
    memcpy(q->name, buf, n);
    q->name[n] = '\0';
}

mp_model_param *mp_quant_kernel(mp_model *m, const mp_layer *l, int g)
{
    for (int j = 0; j < l->nparams; j++) {
        mp_model_param *p = &m->params[l->param_first + j].p;
        if (p->role == MP_ROLE_KERNEL && g-- == 0) return p;
    }
    return NULL;
}

/* (the operand's size depends on the element count only) */
size_t mp_quant_kernel_bytes(const mp_model_param *w, const mp_quantizer *q)
{
    int64_t last = w->shape[w->ndim - 1];
    return q->operand_bytes(w->n / last, last);
}

/* A tensor [..., last] as the matrix [numel / last, last]. */
static mp_quant_input as_matrix(const void *x, mp_dtype t, int64_t numel, int64_t last, int k_axis)
{
    return (mp_quant_input){x, t, numel / last, last, k_axis};
}

/* The kernel as the GEMM reads it: [k, n / k], k the forward's reduction
 * (Dense [in, units]; Conv2D [kh kw cin, filters]; an attention
 * projection [model_dim, heads key_dim] or [heads key_dim, model_dim]). */
static mp_quant_input kernel_input(const mp_model_param *w, int64_t k, int k_axis)
{
    return as_matrix(w->master ? (const void *)w->master : w->weight,
                     w->master ? MP_F32 : w->weight_dtype, w->n, w->n / k, k_axis);
}

/* -------------------------------------------------- one GEMM's steps */

size_t mp_quant_gemm_workspace(const mp_model *m, const mp_layer *l, int g, int64_t x_rows,
                               int64_t x_cols, int64_t z_rows, int64_t z_cols)
{
    const mp_quantizer *qz = mp_quant_layer_metas(m, l)->ops;
    size_t x = arena_bytes(qz->operand_bytes(x_rows, x_cols));
    size_t z = arena_bytes(qz->operand_bytes(z_rows, z_cols));
    size_t w = arena_bytes(mp_quant_kernel_bytes(mp_quant_kernel((mp_model *)m, l, g), qz));
    /* backward's: x and dz (dW); per pass also dz and W again (dx), whose
     * forward (x and W, in here too) is within that */
    return x + z + (qz->pass_invariant ? 0 : z + w);
}

mp_status mp_quant_forward(mp_model *m, mp_layer *l, int g, bool training, const mp_quant_input *x,
                           void *stored, mp_quant_operand *xo, mp_quant_operand *wo)
{
    mp_float8_meta *q = mp_quant_layer_metas(m, l) + g * MP_FLOAT8_ROLES;
    const mp_quantizer *qz = q->ops;
    const mp_model_param *w = mp_quant_kernel(m, l, g);
    mp_quant_mode mode = training ? MP_QUANT_TRAIN : MP_QUANT_INFER;
    mp_quant_input wi = kernel_input(w, x->cols, 0);
    /* one operand serving every pass persists; a per-pass one is temporary */
    void *wop = qz->pass_invariant ? q[MP_FLOAT8_WEIGHT].codes
                                   : mp_arena_alloc(m->tmp, mp_quant_kernel_bytes(w, qz));
    void *op = wop ? mp_arena_alloc(m->tmp, qz->operand_bytes(x->rows, x->cols)) : NULL;
    if (!op) return mp_layer_nomem(l, "its quantized operands");
    qz->quantize(&q[MP_FLOAT8_WEIGHT], &wi, mode, NULL, wop, wo);
    qz->quantize(&q[MP_FLOAT8_INPUT], x, mode, stored, op, xo);
    return MP_OK;
}

mp_status mp_quant_backward(mp_model *m, mp_layer *l, int g, const mp_quant_input *dz,
                            const mp_quant_input *x, const void *stored,
                            mp_float8_grad_operands *out)
{
    mp_float8_meta *q = mp_quant_layer_metas(m, l) + g * MP_FLOAT8_ROLES;
    const mp_quantizer *qz = q->ops;
    mp_quant_input gi = *dz, xi = *x;
    gi.k_axis = xi.k_axis = 0;
    void *gq = mp_arena_alloc(m->tmp, qz->operand_bytes(gi.rows, gi.cols));
    void *xq = mp_arena_alloc(m->tmp, qz->operand_bytes(xi.rows, xi.cols));
    if (!gq || !xq) return mp_layer_nomem(l, "its quantized operands");
    qz->quantize(&q[MP_FLOAT8_GRAD_OUTPUT], &gi, MP_QUANT_TRAIN, NULL, gq, &out->dz_w);
    if (stored)
        qz->restore(&q[MP_FLOAT8_INPUT], stored, xi.rows, xi.cols, xq, &out->x);
    else
        qz->quantize(&q[MP_FLOAT8_INPUT], &xi, MP_QUANT_AGAIN, NULL, xq, &out->x);
    out->dz_x = out->dz_w;
    if (qz->pass_invariant) return MP_OK; /* out->w: the forward's */
    const mp_model_param *w = mp_quant_kernel(m, l, g);
    void *g2 = mp_arena_alloc(m->tmp, qz->operand_bytes(gi.rows, gi.cols));
    void *w2 = mp_arena_alloc(m->tmp, mp_quant_kernel_bytes(w, qz));
    if (!g2 || !w2) return mp_layer_nomem(l, "its quantized operands");
    gi.k_axis = 1;
    qz->quantize(&q[MP_FLOAT8_GRAD_OUTPUT], &gi, MP_QUANT_INFER, NULL, g2, &out->dz_x);
    mp_quant_input wi = kernel_input(w, xi.cols, 1);
    qz->quantize(&q[MP_FLOAT8_WEIGHT], &wi, MP_QUANT_AGAIN, NULL, w2, &out->w);
    return MP_OK;
}

mp_status mp_quant_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                        const mp_quant_operand *a, int64_t lda, const mp_quant_operand *b,
                        int64_t ldb, float beta, void *c, mp_dtype ct, int64_t ldc,
                        const float *bias)
{
    mp_gemm_args g = mp_gemm_args_default();
    g.trans_a = trans_a, g.trans_b = trans_b;
    g.m = m, g.n = n, g.k = k;
    g.alpha = a->inv_scale * b->inv_scale;
    g.a = a->data, g.a_type = a->dtype, g.lda = lda;
    g.b = b->data, g.b_type = b->dtype, g.ldb = ldb;
    g.beta = beta;
    g.c = c, g.c_type = ct, g.ldc = ldc;
    g.bias = bias;
    return mp_gemm_ex(&g);
}

/* ------------------------------- kinds with one GEMM over the input */

bool mp_float8_compact_input(const mp_model *m, const mp_layer *l, int j)
{
    (void)m; /* decided by the plan, before the metas exist */
    return j == 0 && l->fp8_active && mp_quantizer_float8.pass_invariant;
}

bool mp_float8_keeps_input(const mp_model *m, const mp_layer *l, int64_t batch)
{
    return mp_quant_layer_metas(m, l)->ops->pass_invariant &&
           (mp_layer_csrc(m, l, 0)->out_dropped || mp_layer_kept_input_bytes(m, l, 0, batch) > 0);
}

size_t mp_float8_input_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    if (!mp_float8_keeps_input(m, l, batch)) return mp_layer_kept_input_bytes(m, l, 0, batch);
    const mp_layer *src = mp_layer_csrc(m, l, 0);
    int64_t cols = layer_cols(src);
    return arena_bytes(
        mp_quant_layer_metas(m, l)->ops->stored_bytes(layer_numel(src, batch) / cols, cols));
}

size_t mp_float8_workspace_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    const mp_layer *src = mp_layer_csrc(m, l, 0);
    int64_t in = layer_cols(src), out = layer_cols(l);
    return mp_quant_gemm_workspace(m, l, 0, layer_numel(src, batch) / in, in,
                                   layer_numel(l, batch) / out, out);
}

mp_status mp_float8_forward(mp_model *m, mp_layer *l, bool training, mp_tensor *in,
                            const void **stored, mp_quant_operand *xo, mp_quant_operand *wo)
{
    const mp_quantizer *qz = mp_quant_layer_metas(m, l)->ops;
    bool save = mp_float8_keeps_input(m, l, m->batch);
    if (mp_layer_input_compute(m, l, 0, !save, in)) return MP_ERR_NOMEM;
    mp_quant_input xi =
        as_matrix(in->data, in->dtype, mp_tensor_numel(in), in->shape[in->ndim - 1], 1);
    *stored = save ? mp_arena_alloc(m->act, qz->stored_bytes(xi.rows, xi.cols)) : NULL;
    if (save && !*stored) return mp_layer_nomem(l, "its input's quantized form");
    mp_status s = mp_quant_forward(m, l, 0, training, &xi, (void *)*stored, xo, wo);
    const mp_float8_meta *q = mp_quant_layer_metas(m, l) + MP_FLOAT8_INPUT;
    if (!s && q->keeps_sign) {
        mp_layer *src = mp_layer_src(m, l, 0);
        src->sign_codes = *stored;
        src->sign_type = q->dtype;
    }
    return s;
}

mp_status mp_float8_backward(mp_model *m, mp_layer *l, const mp_tensor *dz, const mp_tensor *in,
                             const void *stored, mp_float8_grad_operands *out)
{
    const mp_layer *src = mp_layer_csrc(m, l, 0);
    int64_t in_cols = layer_cols(src);
    mp_quant_input gi = as_matrix(dz->data, dz->dtype, mp_tensor_numel(dz), layer_cols(l), 0);
    mp_quant_input xi =
        as_matrix(stored ? NULL : in->data, in->dtype, layer_numel(src, m->batch), in_cols, 0);
    return mp_quant_backward(m, l, 0, &gi, &xi, stored, out);
}
