/* multi_head_attention.c - Keras MultiHeadAttention with the causal mask
 * (use_causal_mask=True; the only mask supported): inputs query, value and
 * key, each [batch, T, model_dim] (one input: self-attention, query = value
 * = key; two: key = value, as in Keras), of one shape. Projections Q = x_q
 * Wq + bq (and K, V likewise) are GEMMs in the compute dtype with float32
 * accumulation, writing [batch, T, heads, key_dim] rows straight into the
 * layout of the fused attention kernel (kernels/attention.h), whose softmax
 * and statistics are float32 under every policy; the output is A Wo + bo.
 * Parameters as Keras names them: query/key/value kernels [model_dim, heads,
 * key_dim] and biases [heads, key_dim], attention_output kernel [heads,
 * key_dim, model_dim] and bias [model_dim] ("<layer>.query.kernel", ...).
 * Forward keeps Q, K, V, the attention output and the float32
 * log-sum-exp; backward recomputes the softmax tiles (no [T, T] matrix).
 * In float8 or MX (nn/quant.h) the four projection GEMMs, forward and
 * backward, read quantized operands as Dense's do, each projection with
 * its own tensors ("<layer>/query/input", ...: nn/quant_steps.c); the
 * attention kernel, its float32 softmax and the biases stay as they are.
 * Nothing more is kept: backward quantizes the kept inputs and attention
 * output again with the forward's scales (the same codes).
 * Decoding (decode.c) appends each new position's K and V rows to a cache
 * and attends the new queries over it: a token costs one position. A
 * prefill (m->prefill) takes the batch's rows as consecutive positions of
 * the first sequence instead: a prompt's projections are one GEMM each. */
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/ops.h"
#include "nn/layer.h"
#include "nn/quant.h"

enum { PQ, PK, PV, PO }; /* projections, in Keras's order */

typedef struct {
    int64_t num_heads, key_dim;
    bool use_bias, use_causal_mask;
} mha_config;

typedef struct {
    mp_tensor in[3]; /* the inputs in the compute dtype (distinct ones kept) */
    void *proj[3];   /* Q, K, V: [batch, T, heads, key_dim], compute dtype */
    void *att;       /* the attention output, same layout */
    float *lse;      /* [batch, heads, T] float32 */
    /* the kernels as the forward's GEMMs read them (quantized or not) */
    mp_quant_operand wq[4];
    /* decoding: K and V rows of the positions so far, [seqs, cap, heads,
     * key_dim] each in the compute dtype */
    void *kcache, *vcache;
    int64_t cap, seqs;
} mha_state;

/* Which input feeds projection p (query 0, value 1, key 2, Keras's call
 * order; missing ones default to the query, the key to the value). */
static int source(const mp_layer *l, int p)
{
    if (p == PQ) return 0;
    int value = l->ninputs > 1 ? 1 : 0;
    return p == PV ? value : (l->ninputs > 2 ? 2 : value);
}

static int64_t heads_dim(const mha_config *c) { return c->num_heads * c->key_dim; }

static mp_model_param *kernel_of(mp_model *m, const mp_layer *l, int p)
{
    const mha_config *c = l->config;
    return mp_layer_param(m, l, c->use_bias ? 2 * p : p);
}
static mp_model_param *bias_of(mp_model *m, const mp_layer *l, int p)
{
    const mha_config *c = l->config;
    return c->use_bias ? mp_layer_param(m, l, 2 * p + 1) : NULL;
}

static mp_status mha_build(mp_model *m, mp_layer *l)
{
    const mha_config *c = l->config;
    if (c->num_heads < 1 || c->key_dim < 1 || heads_dim(c) > MP_CONFIG_MAX_WIDTH)
        return mp_set_error(MP_ERR_INVALID,
                            "multi_head_attention '%s': num_heads %lld, key_dim %lld", l->name,
                            (long long)c->num_heads, (long long)c->key_dim);
    if (!c->use_causal_mask)
        return mp_set_error(MP_ERR_UNSUPPORTED,
                            "multi_head_attention '%s': use_causal_mask false is not supported "
                            "(causal attention only)",
                            l->name);
    const mp_layer *x = mp_layer_csrc(m, l, 0);
    char buf[64], buf2[64];
    if (x->ndim != 2)
        return mp_set_error(MP_ERR_INVALID,
                            "multi_head_attention '%s': input %s, expected (None, T, model_dim)",
                            l->name, mp_shape_str(x->ndim, x->shape, buf, sizeof buf));
    for (int j = 1; j < l->ninputs; j++) {
        const mp_layer *y = mp_layer_csrc(m, l, j);
        if (y->ndim != 2 || y->shape[0] != x->shape[0] || y->shape[1] != x->shape[1])
            return mp_set_error(MP_ERR_INVALID,
                                "multi_head_attention '%s': input %d is %s, the query %s (one "
                                "shape for all)",
                                l->name, j, mp_shape_str(y->ndim, y->shape, buf, sizeof buf),
                                mp_shape_str(x->ndim, x->shape, buf2, sizeof buf2));
    }
    const int64_t e = x->shape[1], h = c->num_heads, d = c->key_dim;
    static const char *const names[4][2] = {{"query.kernel", "query.bias"},
                                            {"key.kernel", "key.bias"},
                                            {"value.kernel", "value.bias"},
                                            {"attention_output.kernel", "attention_output.bias"}};
    for (int p = 0; p < 4; p++) {
        int64_t kin[3] = {e, h, d}, kout[3] = {h, d, e}, bin[2] = {h, d};
        if (mp_layer_add_param(m, l, MP_ROLE_KERNEL, names[p][0], 3, p == PO ? kout : kin, 0) ||
            (c->use_bias && mp_layer_add_param(m, l, MP_ROLE_BIAS, names[p][1], p == PO ? 1 : 2,
                                               p == PO ? &e : bin, 0)))
            return m->err;
    }
    return MP_OK;
}

/* -------------------------------------------------------------- sizes */

static size_t proj_bytes(const mp_layer *l, int64_t batch)
{
    const mha_config *c = l->config;
    return arena_bytes((size_t)(batch * l->shape[0] * heads_dim(c)) *
                       mp_dtype_size(l->policy.compute));
}

static size_t mha_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    const mha_config *c = l->config;
    size_t bytes = 0;
    for (int j = 0; j < l->ninputs; j++) bytes += mp_layer_kept_input_bytes(m, l, j, batch);
    bytes += 4 * proj_bytes(l, batch); /* Q, K, V, attention output */
    bytes += arena_bytes((size_t)(batch * c->num_heads * l->shape[0]) * sizeof(float));
    return bytes + arena_bytes((size_t)layer_numel(l, batch) * mp_dtype_size(l->policy.compute));
}

static size_t mha_workspace_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    const mha_config *c = l->config;
    /* forward: float32 bias copies; backward: dA, dQ, dK, dV and a float32
     * input gradient */
    size_t biases = 3 * arena_bytes((size_t)heads_dim(c) * sizeof(float)) +
                    arena_bytes((size_t)l->shape[1] * sizeof(float));
    size_t bytes = biases + 4 * proj_bytes(l, batch) +
                   arena_bytes((size_t)layer_numel(l, batch) * sizeof(float));
    /* quantized: one projection's operands at a time */
    const int64_t rows = batch * l->shape[0], e = l->shape[1], hd = heads_dim(c);
    size_t q = 0;
    for (int p = 0; mp_layer_quantized(l) && p < 4; p++) {
        size_t b = p == PO ? mp_quant_gemm_workspace(m, l, p, rows, hd, rows, e)
                           : mp_quant_gemm_workspace(m, l, p, rows, e, rows, hd);
        q = b > q ? b : q;
    }
    return bytes + q;
}

/* ------------------------------------------------------------ forward */

/* Projection p's bias as float32 (NULL without biases); pure low-precision
 * policies keep no master, so the compute copy is widened into m->tmp. */
static mp_status bias_f32(mp_model *m, mp_layer *l, int p, const float **out)
{
    mp_model_param *b = bias_of(m, l, p);
    *out = NULL;
    if (!b) return MP_OK;
    if (b->master) {
        *out = b->master;
        return MP_OK;
    }
    float *tmp = mp_arena_alloc(m->tmp, (size_t)b->n * sizeof(float));
    if (!tmp) return mp_layer_nomem(l, "a bias copy");
    mp_convert(tmp, MP_F32, b->weight, b->weight_dtype, (size_t)b->n);
    *out = tmp;
    return MP_OK;
}

/* ----------------------------------------------------------- decoding */

static void mha_release(mp_layer *l)
{
    mha_state *st = l->state;
    mp_free(st->kcache);
    mp_free(st->vcache);
    st->kcache = st->vcache = NULL;
    st->cap = st->seqs = 0;
}

static mp_status mha_decode_reset(mp_model *m, mp_layer *l, int64_t capacity)
{
    const mha_config *c = l->config;
    mha_state *st = l->state;
    const int64_t seqs = m->decode_sequences;
    /* positions past the new start are overwritten */
    if (capacity <= st->cap && seqs <= st->seqs) return MP_OK;
    mha_release(l);
    size_t bytes = (size_t)(seqs * capacity * heads_dim(c)) * mp_dtype_size(l->policy.compute);
    st->kcache = mp_alloc(bytes, MP_MEM_ACTIVATIONS);
    st->vcache = mp_alloc(bytes, MP_MEM_ACTIVATIONS);
    if (!st->kcache || !st->vcache) {
        mha_release(l);
        return mp_layer_nomem(l, "its key/value cache");
    }
    st->cap = capacity;
    st->seqs = seqs;
    return MP_OK;
}

/* The new positions m->position .. + T-1 of each sample (a prefill: the
 * positions m->position .. + batch T - 1 of the first sequence, row after
 * row): their K and V rows join the cache, then each query attends over
 * the cache up to its own position (the causal mask). decode.c checked
 * that they fit the cache and that the batch does not exceed its
 * sequences. */
static mp_status decode_attention(mp_model *m, mp_layer *l, int64_t batch)
{
    const mha_config *c = l->config;
    mha_state *st = l->state;
    const mp_dtype ct = l->policy.compute;
    const int64_t t = l->shape[0], hd = heads_dim(c);
    const size_t row = (size_t)hd * mp_dtype_size(ct);
    /* a prefill: one sequence of batch T rows; else batch sequences of T */
    const int64_t seqs = m->prefill ? 1 : batch, rows = m->prefill ? batch * t : t;
    if (m->position + rows > st->cap || seqs > st->seqs)
        return mp_set_error(MP_ERR_INVALID,
                            "multi_head_attention '%s': %lld sequences to position %lld; the "
                            "cache holds %lld of %lld positions",
                            l->name, (long long)seqs, (long long)(m->position + rows - 1),
                            (long long)st->seqs, (long long)st->cap);
    for (int64_t b = 0; b < seqs; b++) {
        char *kc = (char *)st->kcache + (size_t)(b * st->cap) * row;
        char *vc = (char *)st->vcache + (size_t)(b * st->cap) * row;
        const size_t r = (size_t)(b * rows) * row;
        memcpy(kc + (size_t)m->position * row, (const char *)st->proj[PK] + r, (size_t)rows * row);
        memcpy(vc + (size_t)m->position * row, (const char *)st->proj[PV] + r, (size_t)rows * row);
        mp_status s =
            mp_attention_decode_rows(c->num_heads, c->key_dim, (const char *)st->proj[PQ] + r, kc,
                                     vc, ct, m->position, rows, (char *)st->att + r, ct);
        if (s) return s;
    }
    return MP_OK;
}

/* y = x W_p + b_p, x [rows, in] and y [rows, out] in the compute dtype;
 * quantized, x and W_p through the quantizer (operands in temporaries
 * freed after the GEMM, the kernel's kept in st->wq for backward). */
static mp_status project(mp_model *m, mp_layer *l, int p, bool training, const void *x,
                         int64_t rows, int64_t in, int64_t out, void *y)
{
    mha_state *st = l->state;
    const mp_dtype ct = l->policy.compute;
    const mp_model_param *w = kernel_of(m, l, p);
    const float *bias;
    mp_status s = bias_f32(m, l, p, &bias);
    if (s) return s;
    size_t mark = mp_arena_mark(m->tmp);
    mp_quant_operand xo = {x, ct, 1.0f};
    st->wq[p] = (mp_quant_operand){w->weight, w->weight_dtype, 1.0f};
    if (mp_layer_quantized(l)) {
        mp_quant_input xi = {x, ct, rows, in, 1};
        if ((s = mp_quant_forward(m, l, p, training, &xi, NULL, &xo, &st->wq[p]))) return s;
    }
    s = mp_quant_gemm(false, false, rows, out, in, &xo, in, &st->wq[p], out, 0.0f, y, ct, out,
                      bias);
    mp_arena_release(m->tmp, mark);
    return s;
}

static mp_status mha_forward(mp_model *m, mp_layer *l, bool training)
{
    (void)training;
    const mha_config *c = l->config;
    mha_state *st = l->state;
    const mp_dtype ct = l->policy.compute;
    for (int j = 0; j < l->ninputs; j++)
        if (mp_layer_input_compute(m, l, j, true, &st->in[j])) return MP_ERR_NOMEM;
    const int64_t batch = st->in[0].shape[0], t = l->shape[0], e = l->shape[1];
    const int64_t hd = heads_dim(c), rows = batch * t;
    const size_t pb = (size_t)(rows * hd) * mp_dtype_size(ct);
    for (int p = 0; p < 3; p++)
        if (!(st->proj[p] = mp_arena_alloc(m->act, pb)))
            return mp_layer_nomem(l, "its projections");
    st->att = mp_arena_alloc(m->act, pb);
    st->lse = mp_arena_alloc(m->act, (size_t)(batch * c->num_heads * t) * sizeof(float));
    if (!st->att || !st->lse) return mp_layer_nomem(l, "its attention output");
    if (mp_layer_alloc(m, l, m->act, ct, &l->out)) return mp_layer_nomem(l, "its output");
    mp_status s;
    for (int p = 0; p < 3; p++)
        if ((s = project(m, l, p, training, st->in[source(l, p)].data, rows, e, hd, st->proj[p])))
            return s;
    const mp_attn_geom g = {batch, t, c->num_heads, c->key_dim};
    if (m->decode_capacity)
        s = decode_attention(m, l, batch);
    else
        s = mp_attention_forward(&g, st->proj[PQ], ct, st->proj[PK], ct, st->proj[PV], ct, st->att,
                                 ct, st->lse);
    if (s) return s;
    return project(m, l, PO, training, st->att, rows, hd, e, l->out.data);
}

/* ----------------------------------------------------------- backward */

/* The gradients of y = x W_p + b_p from dy [rows, out]: dW_p = x^T dy and
 * db_p = column sums of dy (float32, added when accumulating), and unless
 * dx is NULL dx = dy W_p^T + dx_beta dx; quantized, through the quantizer
 * (x as the forward quantized it). */
static mp_status project_backward(mp_model *m, mp_layer *l, int p, const void *x, const void *dy,
                                  mp_dtype dyt, int64_t rows, int64_t in, int64_t out,
                                  bool accumulate, void *dx, mp_dtype dxt, float dx_beta)
{
    const mha_state *st = l->state;
    const mp_dtype ct = l->policy.compute;
    mp_model_param *w = kernel_of(m, l, p), *b = bias_of(m, l, p);
    size_t mark = mp_arena_mark(m->tmp);
    mp_float8_grad_operands q = {{x, ct, 1.0f}, {dy, dyt, 1.0f}, {dy, dyt, 1.0f}, st->wq[p]};
    mp_status s = MP_OK;
    if (mp_layer_quantized(l)) {
        mp_quant_input gi = {dy, dyt, rows, out, 0}, xi = {x, ct, rows, in, 0};
        s = mp_quant_backward(m, l, p, &gi, &xi, NULL, &q);
    }
    if (!s)
        s = mp_quant_gemm(true, false, in, out, rows, &q.x, in, &q.dz_w, out,
                          accumulate ? 1.0f : 0.0f, w->grad, MP_F32, out, NULL);
    if (!s && b) mp_op_column_sum(dy, dyt, rows, out, b->grad, accumulate);
    if (!s && dx)
        s = mp_quant_gemm(false, true, rows, in, out, &q.dz_x, out, &q.w, out, dx_beta, dx, dxt, in,
                          NULL);
    mp_arena_release(m->tmp, mark);
    return s;
}

static mp_status mha_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    const mha_config *c = l->config;
    const mha_state *st = l->state;
    const mp_dtype ct = l->policy.compute;
    const mp_tensor *g = &l->grad;
    const int64_t batch = st->in[0].shape[0], t = l->shape[0], e = l->shape[1];
    const int64_t hd = heads_dim(c), rows = batch * t;
    const size_t pb = (size_t)(rows * hd) * mp_dtype_size(ct);
    void *da = mp_arena_alloc(m->tmp, pb), *dp[3];
    for (int p = 0; p < 3; p++) dp[p] = mp_arena_alloc(m->tmp, pb);
    /* each input's gradient: the sum of dP W^T over the projections it
     * feeds, in float32, rounded once */
    float *dx32 = mp_arena_alloc(m->tmp, (size_t)(rows * e) * sizeof(float));
    if (!da || !dp[0] || !dp[1] || !dp[2] || !dx32)
        return mp_layer_nomem(l, "its attention gradients");
    /* output projection: dWo = A^T dY, dbo = column sums, dA = dY Wo^T */
    mp_status s = project_backward(m, l, PO, st->att, g->data, g->dtype, rows, hd, e, accumulate,
                                   da, ct, 0.0f);
    if (s) return s;
    const mp_attn_geom geom = {batch, t, c->num_heads, c->key_dim};
    if ((s = mp_attention_backward(&geom, st->proj[PQ], ct, st->proj[PK], ct, st->proj[PV], ct,
                                   st->att, ct, st->lse, da, ct, dp[PQ], dp[PK], dp[PV], ct)))
        return s;
    /* input projections: dW = x^T dP, db = column sums of dP, dx += dP W^T */
    for (int j = 0; j < l->ninputs; j++) {
        bool data = mp_layer_input_is_data(m, l, j), first = true;
        for (int p = 0; p < 3; p++) {
            if (source(l, p) != j) continue;
            if ((s = project_backward(m, l, p, st->in[j].data, dp[p], ct, rows, e, hd, accumulate,
                                      data ? NULL : dx32, MP_F32, first ? 0.0f : 1.0f)))
                return s;
            first = false;
        }
        if (data) continue;
        mp_tensor dx;
        bool direct;
        if (mp_layer_input_grad(m, l, j, &dx, &direct)) return MP_ERR_NOMEM;
        mp_convert(dx.data, dx.dtype, dx32, MP_F32, (size_t)(rows * e));
        if ((s = mp_layer_input_grad_done(m, l, j, &dx, direct))) return s;
    }
    return MP_OK;
}

/* --------------------------------------------------------------- JSON */

static mp_status mha_to_json(const mp_layer *l, json_t *o)
{
    const mha_config *c = l->config;
    json_object_set_new(o, "num_heads", json_integer(c->num_heads));
    json_object_set_new(o, "key_dim", json_integer(c->key_dim));
    json_object_set_new(o, "value_dim", json_integer(c->key_dim));
    json_object_set_new(o, "dropout", json_real(0.0));
    json_object_set_new(o, "use_bias", json_boolean(c->use_bias));
    json_object_set_new(o, "use_causal_mask", json_boolean(c->use_causal_mask));
    return MP_OK;
}

static mp_status mha_from_json(const json_t *o, void *config)
{
    mha_config *c = config;
    c->use_bias = true;
    c->use_causal_mask = true;
    mp_status s = mp_json_int_field(o, "num_heads", 1, MP_CONFIG_MAX_WIDTH, &c->num_heads);
    if (!s) s = mp_json_int_field(o, "key_dim", 1, MP_CONFIG_MAX_WIDTH, &c->key_dim);
    const json_t *v = json_object_get(o, "value_dim");
    if (!s && v && !json_is_null(v)) {
        int64_t vd;
        if (!(s = mp_json_int_field(o, "value_dim", 1, MP_CONFIG_MAX_WIDTH, &vd)) &&
            vd != c->key_dim)
            s = mp_set_error(MP_ERR_UNSUPPORTED, "'value_dim' %lld must equal key_dim %lld",
                             (long long)vd, (long long)c->key_dim);
    }
    if (!s && json_object_get(o, "dropout")) {
        float rate;
        if (!(s = mp_json_float_field(o, "dropout", 0.0, false, 1.0, &rate)) && rate != 0.0f)
            s = mp_set_error(MP_ERR_UNSUPPORTED, "'dropout' %g: attention dropout is not supported",
                             (double)rate);
    }
    for (int i = 0; !s && i < 2; i++) {
        const char *key = i ? "attention_axes" : "output_shape";
        v = json_object_get(o, key);
        if (v && !json_is_null(v))
            s = mp_set_error(MP_ERR_UNSUPPORTED, "'%s' must be null (the default)", key);
    }
    if (!s) s = mp_json_bool_opt(o, "use_bias", &c->use_bias);
    if (!s) s = mp_json_bool_opt(o, "use_causal_mask", &c->use_causal_mask);
    return s;
}

const mp_layer_ops mp_multi_head_attention_ops = {
    .class_name = "MultiHeadAttention",
    .base_name = "multi_head_attention",
    .min_inputs = 1,
    .max_inputs = 3,
    .float8 = true,
    .float8_gemms = (const char *const[]){"query", "key", "value", "attention_output", NULL},
    .config_size = sizeof(mha_config),
    .state_size = sizeof(mha_state),
    .fields = (const char *const[]){"num_heads", "key_dim", "value_dim", "dropout", "use_bias",
                                    "use_causal_mask", "output_shape", "attention_axes", NULL},
    .build = mha_build,
    .forward = mha_forward,
    .backward = mha_backward,
    .saved_bytes = mha_saved_bytes,
    .workspace_bytes = mha_workspace_bytes,
    .to_json = mha_to_json,
    .from_json = mha_from_json,
    .decode_reset = mha_decode_reset,
    .release = mha_release,
};

mp_multi_head_attention_options mp_multi_head_attention_options_default(int64_t num_heads,
                                                                        int64_t key_dim)
{
    return (mp_multi_head_attention_options){
        .num_heads = num_heads, .key_dim = key_dim, .use_bias = true, .use_causal_mask = true};
}

mp_node mp_multi_head_attention_ex(mp_model *m, int n, const mp_node *inputs,
                                   const mp_multi_head_attention_options *a,
                                   const mp_layer_options *o)
{
    mha_config c = {a ? a->num_heads : 0, a ? a->key_dim : 0, a ? a->use_bias : true,
                    a ? a->use_causal_mask : true};
    return mp_layer_create(m, &mp_multi_head_attention_ops, inputs, n, &c, o);
}

mp_node mp_multi_head_attention(mp_model *m, mp_node x, const mp_multi_head_attention_options *a,
                                const mp_layer_options *o)
{
    return mp_multi_head_attention_ex(m, 1, &x, a, o);
}
