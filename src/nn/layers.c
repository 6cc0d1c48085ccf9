/* layers.c - forward and backward passes of each layer kind, and the exact
 * arena bytes each one uses (the precision plan is computed from the same
 * rules, so the summary's figures are what the arena really hands out).
 *
 * Conventions: a layer computes in its policy's compute dtype c. Inputs in
 * another dtype are cast to c first (the cast copy lives in the workspace
 * unless the layer keeps its input for backward, then in the activation
 * arena). Outputs are in c. Gradients flowing between layers have the dtype
 * of the tensor they belong to; parameter gradients are float32. */
#include <string.h>

#include "kernels/ops.h"
#include "nn/model_internal.h"

static int64_t in_numel(const mp_model *m, const mp_layer *l, int j, int64_t batch)
{
    return layer_numel(&m->layers[l->inputs[j]], batch);
}

static bool from_input_layer(const mp_model *m, const mp_layer *l, int j)
{
    return m->layers[l->inputs[j]].kind == MP_LAYER_INPUT;
}

static bool keeps_input(const mp_model *m, const mp_layer *l)
{
    switch (l->kind) {
    case MP_LAYER_DENSE:
    case MP_LAYER_LAYER_NORM:
        return true;
    case MP_LAYER_ACTIVATION:
        /* softmax keeps its logits when it ends the model, for the fused
         * softmax + cross-entropy of mp_model_loss_backward */
        return mp_op_activation_grad_needs_input(l->act) ||
               (l->act == MP_ACT_SOFTMAX && (int)(l - m->layers) == m->output);
    default:
        return false;
    }
}

/* A kept input needs its own copy when it is user data (which may change
 * before backward) or in another dtype; otherwise it is a view of the
 * producer's output, which lives in the activation arena already. */
static bool kept_input_copied(const mp_model *m, const mp_layer *l)
{
    return from_input_layer(m, l, 0) || m->layers[l->inputs[0]].out_dtype != l->policy.compute;
}

static bool flatten_copies(const mp_model *m, const mp_layer *l) { return kept_input_copied(m, l); }

size_t mp_layer_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    mp_dtype c = l->policy.compute;
    size_t cs = mp_dtype_size(c), out = arena_bytes((size_t)layer_numel(l, batch) * cs);
    size_t bytes = 0;
    if (keeps_input(m, l) && kept_input_copied(m, l))
        bytes += arena_bytes((size_t)in_numel(m, l, 0, batch) * cs);
    int64_t rows = layer_numel(l, batch) / layer_cols(l);
    switch (l->kind) {
    case MP_LAYER_INPUT:
        break;
    case MP_LAYER_DENSE:
        bytes += out;
        if (mp_op_activation_grad_needs_input(l->act)) bytes += out; /* pre-activation */
        break;
    case MP_LAYER_ACTIVATION:
    case MP_LAYER_ADD:
        bytes += out;
        break;
    case MP_LAYER_DROPOUT:
        bytes += out + arena_bytes((size_t)layer_numel(l, batch));
        break;
    case MP_LAYER_FLATTEN:
        if (flatten_copies(m, l)) bytes += out;
        break;
    case MP_LAYER_LAYER_NORM:
        bytes += out + 2 * arena_bytes((size_t)rows * sizeof(float));
        break;
    }
    return bytes;
}

size_t mp_layer_workspace_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    mp_dtype c = l->policy.compute;
    size_t cs = mp_dtype_size(c);
    size_t n_out = (size_t)layer_numel(l, batch);
    size_t bytes =
        arena_bytes(n_out * mp_dtype_size(l->out_dtype)) + 64; /* gradient of the output */
    if ((int)(l - m->layers) == m->output)
        bytes += 2 * arena_bytes(n_out * sizeof(float)); /* loss */
    for (int j = 0; j < l->ninputs; j++) {
        size_t n_in = (size_t)in_numel(m, l, j, batch);
        bytes += arena_bytes(n_in * cs); /* transient cast of the input */
        bytes += arena_bytes(n_in * cs); /* gradient w.r.t. the input */
    }
    if (l->kind == MP_LAYER_DENSE)
        bytes += arena_bytes(n_out * cs) + arena_bytes((size_t)l->units * sizeof(float));
    return bytes;
}

/* ------------------------------------------------------------ helpers */

static mp_status nomem(const mp_layer *l, const char *what)
{
    return mp_set_error(MP_ERR_NOMEM, "layer '%s': cannot allocate %s (%s)", l->name, what,
                        mp_last_error());
}

/* [batch, l's shape] tensor in dtype t from arena a. */
static mp_status alloc_like(mp_model *m, const mp_layer *shape_of, mp_arena *a, mp_dtype t,
                            mp_tensor *out)
{
    int64_t shape[MP_MAX_DIMS];
    shape[0] = m->batch;
    memcpy(shape + 1, shape_of->shape, (size_t)shape_of->ndim * sizeof(int64_t));
    return mp_tensor_from_arena(out, a, t, shape_of->ndim + 1, shape);
}

/* Input j of l in l's compute dtype: a view if it already is, else a cast
 * copy from arena a (forced when `copy`). */
static mp_status input_as_compute(mp_model *m, mp_layer *l, int j, mp_arena *a, bool copy,
                                  mp_tensor *out)
{
    const mp_layer *src = &m->layers[l->inputs[j]];
    mp_dtype c = l->policy.compute;
    if (!copy && src->out.dtype == c) {
        *out = src->out;
        out->owns_data = false;
        return MP_OK;
    }
    if (alloc_like(m, src, a, c, out)) return nomem(l, "an input copy");
    mp_convert(out->data, c, src->out.data, src->out.dtype, (size_t)mp_tensor_numel(out));
    return MP_OK;
}

static mp_model_param *param(mp_model *m, const mp_layer *l, int j)
{
    return &m->params[l->param_first + j].p;
}

/* ------------------------------------------------------------ forward */

static mp_status dense_forward(mp_model *m, mp_layer *l)
{
    mp_dtype c = l->policy.compute;
    mp_model_param *w = param(m, l, 0), *b = param(m, l, 1);
    if (input_as_compute(m, l, 0, m->act, from_input_layer(m, l, 0), &l->in_saved))
        return MP_ERR_NOMEM;
    if (alloc_like(m, l, m->act, c, &l->out)) return nomem(l, "its output");
    const float *bias = b->master;
    if (!bias) { /* pure low-precision policy: widen the bias for the epilogue */
        float *tmp = mp_arena_alloc(m->ws, (size_t)l->units * sizeof(float));
        if (!tmp) return nomem(l, "a bias copy");
        mp_convert(tmp, MP_F32, b->weight, b->weight_dtype, (size_t)l->units);
        bias = tmp;
    }
    int64_t in = w->shape[0], rows = mp_tensor_numel(&l->in_saved) / in;
    bool fuse = l->act == MP_ACT_NONE || l->act == MP_ACT_RELU;
    mp_tensor *z = &l->out;
    if (mp_op_activation_grad_needs_input(l->act)) {
        if (alloc_like(m, l, m->act, c, &l->pre)) return nomem(l, "its pre-activation");
        z = &l->pre;
    }
    mp_gemm_args g = mp_gemm_args_default();
    g.m = rows;
    g.n = l->units;
    g.k = in;
    g.a = l->in_saved.data;
    g.a_type = c;
    g.lda = in;
    g.b = w->weight;
    g.b_type = w->weight_dtype;
    g.ldb = l->units;
    g.c = z->data;
    g.c_type = c;
    g.ldc = l->units;
    g.bias = bias;
    g.activation = fuse ? l->act : MP_ACT_NONE;
    mp_status s = mp_gemm_ex(&g);
    if (s) return s;
    if (!fuse)
        mp_op_activation(l->act, z->data, c, l->out.data, c, (size_t)mp_tensor_numel(&l->out));
    return MP_OK;
}

static mp_status activation_forward(mp_model *m, mp_layer *l)
{
    mp_dtype c = l->policy.compute;
    mp_tensor x;
    bool keep = keeps_input(m, l);
    if (input_as_compute(m, l, 0, keep ? m->act : m->ws, keep && from_input_layer(m, l, 0), &x))
        return MP_ERR_NOMEM;
    if (keep) l->in_saved = x;
    if (alloc_like(m, l, m->act, c, &l->out)) return nomem(l, "its output");
    int64_t cols = layer_cols(l), n = mp_tensor_numel(&l->out);
    if (l->act == MP_ACT_SOFTMAX)
        mp_op_softmax(x.data, c, l->out.data, c, n / cols, cols);
    else
        mp_op_activation(l->act, x.data, c, l->out.data, c, (size_t)n);
    return MP_OK;
}

static mp_status dropout_forward(mp_model *m, mp_layer *l, bool training)
{
    mp_dtype c = l->policy.compute;
    const mp_tensor *x = &m->layers[l->inputs[0]].out;
    if (alloc_like(m, l, m->act, c, &l->out)) return nomem(l, "its output");
    size_t n = (size_t)mp_tensor_numel(&l->out);
    l->mask = NULL;
    if (!training || l->rate == 0.0f) {
        mp_convert(l->out.data, c, x->data, x->dtype, n);
        return MP_OK;
    }
    l->mask = mp_arena_alloc(m->act, n);
    if (!l->mask) return nomem(l, "its mask");
    /* keep with probability 1 - rate: 24 random bits per element from a
     * counter-based hash of (layer seed, step, index) */
    uint64_t key = mp_mix64(l->seed ^ mp_mix64(m->step + 1));
    uint32_t threshold = (uint32_t)((double)l->rate * 16777216.0);
    for (size_t i = 0; i < n; i++)
        l->mask[i] = (uint32_t)(mp_mix64(key + 0x9E3779B97F4A7C15ull * (i + 1)) >> 40) >= threshold;
    /* the input is cast to c before scaling, as Keras's autocast does */
    mp_tensor xc;
    if (input_as_compute(m, l, 0, m->ws, false, &xc)) return MP_ERR_NOMEM;
    mp_op_mask_scale(xc.data, c, l->mask, 1.0f / (1.0f - l->rate), l->out.data, c, n);
    return MP_OK;
}

static mp_status flatten_forward(mp_model *m, mp_layer *l)
{
    mp_tensor x;
    if (flatten_copies(m, l)) {
        if (input_as_compute(m, l, 0, m->act, true, &x)) return MP_ERR_NOMEM;
    } else {
        x = m->layers[l->inputs[0]].out;
    }
    l->out = x;
    l->out.owns_data = false;
    l->out.ndim = 2;
    l->out.shape[0] = m->batch;
    l->out.shape[1] = l->shape[0];
    return MP_OK;
}

static mp_status add_forward(mp_model *m, mp_layer *l)
{
    mp_dtype c = l->policy.compute;
    mp_tensor a, b;
    if (input_as_compute(m, l, 0, m->ws, false, &a) || input_as_compute(m, l, 1, m->ws, false, &b))
        return MP_ERR_NOMEM;
    if (alloc_like(m, l, m->act, c, &l->out)) return nomem(l, "its output");
    mp_op_add(a.data, c, b.data, c, l->out.data, c, (size_t)mp_tensor_numel(&l->out));
    return MP_OK;
}

static mp_status layer_norm_forward(mp_model *m, mp_layer *l)
{
    mp_dtype c = l->policy.compute;
    if (input_as_compute(m, l, 0, m->act, from_input_layer(m, l, 0), &l->in_saved))
        return MP_ERR_NOMEM;
    if (alloc_like(m, l, m->act, c, &l->out)) return nomem(l, "its output");
    int64_t cols = layer_cols(l), rows = mp_tensor_numel(&l->out) / cols;
    l->mean = mp_arena_alloc(m->act, (size_t)rows * sizeof(float));
    l->rstd = mp_arena_alloc(m->act, (size_t)rows * sizeof(float));
    if (!l->mean || !l->rstd) return nomem(l, "its statistics");
    mp_op_layer_norm(l->in_saved.data, c, param(m, l, 0)->master, param(m, l, 1)->master, l->eps,
                     l->out.data, c, l->mean, l->rstd, rows, cols);
    return MP_OK;
}

mp_status mp_layer_forward(mp_model *m, mp_layer *l, const mp_tensor *x, bool training)
{
    switch (l->kind) {
    case MP_LAYER_INPUT:
        l->out = *x;
        l->out.owns_data = false;
        return MP_OK;
    case MP_LAYER_DENSE:
        return dense_forward(m, l);
    case MP_LAYER_ACTIVATION:
        return activation_forward(m, l);
    case MP_LAYER_DROPOUT:
        return dropout_forward(m, l, training);
    case MP_LAYER_FLATTEN:
        return flatten_forward(m, l);
    case MP_LAYER_ADD:
        return add_forward(m, l);
    case MP_LAYER_LAYER_NORM:
        return layer_norm_forward(m, l);
    }
    return mp_set_error(MP_ERR_INVALID, "layer '%s': unknown kind", l->name);
}

/* ----------------------------------------------------------- backward */

/* Where l writes the gradient for input j, in l's compute dtype: straight
 * into the producer's gradient when this is its first contribution and the
 * dtypes agree (no temporary, no copy; *direct = true), else a temporary that
 * finish_input_grad folds in. */
static mp_status input_grad(mp_model *m, mp_layer *l, int j, mp_tensor *dx, bool *direct)
{
    mp_layer *src = &m->layers[l->inputs[j]];
    *direct = !src->has_grad && src->out_dtype == l->policy.compute;
    mp_tensor *t = *direct ? &src->grad : dx;
    if (alloc_like(m, src, m->ws, l->policy.compute, t)) return nomem(l, "an input gradient");
    if (*direct) {
        src->has_grad = true;
        *dx = *t;
    }
    return MP_OK;
}

static mp_status finish_input_grad(mp_model *m, mp_layer *l, int j, const mp_tensor *dx,
                                   bool direct)
{
    return direct ? MP_OK : mp_model_add_grad(m, l->inputs[j], dx->data, dx->dtype);
}

static mp_status dense_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    mp_dtype c = l->policy.compute;
    mp_model_param *w = param(m, l, 0), *b = param(m, l, 1);
    int64_t in = w->shape[0], units = l->units, rows = mp_tensor_numel(&l->out) / units;
    const mp_tensor *g = &l->grad;
    mp_tensor dz = *g;
    if (l->act != MP_ACT_NONE) {
        if (alloc_like(m, l, m->ws, c, &dz)) return nomem(l, "its pre-activation gradient");
        const mp_tensor *saved = mp_op_activation_grad_needs_input(l->act) ? &l->pre : &l->out;
        mp_op_activation_grad(l->act, saved->data, c, g->data, g->dtype, dz.data, c,
                              (size_t)mp_tensor_numel(&dz));
    }
    /* dW = x^T dz and db = column sums of dz, float32 */
    mp_gemm(true, false, in, units, rows, 1.0f, l->in_saved.data, c, in, dz.data, dz.dtype, units,
            accumulate ? 1.0f : 0.0f, w->grad, MP_F32, units);
    mp_op_column_sum(dz.data, dz.dtype, rows, units, b->grad, accumulate);
    if (from_input_layer(m, l, 0)) return MP_OK;
    mp_tensor dx;
    bool direct;
    if (input_grad(m, l, 0, &dx, &direct)) return MP_ERR_NOMEM;
    mp_gemm(false, true, rows, in, units, 1.0f, dz.data, dz.dtype, units, w->weight,
            w->weight_dtype, units, 0.0f, dx.data, c, in);
    return finish_input_grad(m, l, 0, &dx, direct);
}

static mp_status activation_backward(mp_model *m, mp_layer *l)
{
    mp_dtype c = l->policy.compute;
    const mp_tensor *g = &l->grad;
    if (from_input_layer(m, l, 0)) return MP_OK;
    if (l->act == MP_ACT_NONE) return mp_model_add_grad(m, l->inputs[0], g->data, g->dtype);
    mp_tensor dx;
    bool direct;
    if (input_grad(m, l, 0, &dx, &direct)) return MP_ERR_NOMEM;
    int64_t cols = layer_cols(l), n = mp_tensor_numel(&l->out);
    if (l->act == MP_ACT_SOFTMAX)
        mp_op_softmax_grad(l->out.data, c, g->data, g->dtype, dx.data, c, n / cols, cols);
    else {
        const mp_tensor *saved = mp_op_activation_grad_needs_input(l->act) ? &l->in_saved : &l->out;
        mp_op_activation_grad(l->act, saved->data, c, g->data, g->dtype, dx.data, c, (size_t)n);
    }
    return finish_input_grad(m, l, 0, &dx, direct);
}

static mp_status dropout_backward(mp_model *m, mp_layer *l)
{
    const mp_tensor *g = &l->grad;
    if (from_input_layer(m, l, 0)) return MP_OK;
    if (!l->mask) return mp_model_add_grad(m, l->inputs[0], g->data, g->dtype);
    mp_tensor dx;
    bool direct;
    if (input_grad(m, l, 0, &dx, &direct)) return MP_ERR_NOMEM;
    mp_op_mask_scale(g->data, g->dtype, l->mask, 1.0f / (1.0f - l->rate), dx.data, dx.dtype,
                     (size_t)mp_tensor_numel(&dx));
    return finish_input_grad(m, l, 0, &dx, direct);
}

static mp_status layer_norm_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    mp_dtype c = l->policy.compute;
    mp_model_param *gm = param(m, l, 0), *bt = param(m, l, 1);
    int64_t cols = layer_cols(l), rows = mp_tensor_numel(&l->out) / cols;
    mp_tensor dx;
    bool direct = false;
    if (from_input_layer(m, l, 0)) { /* dgamma/dbeta still need the pass; dx is dropped */
        if (alloc_like(m, &m->layers[l->inputs[0]], m->ws, c, &dx)) return nomem(l, "a gradient");
    } else if (input_grad(m, l, 0, &dx, &direct)) {
        return MP_ERR_NOMEM;
    }
    mp_op_layer_norm_grad(l->in_saved.data, c, gm->master, l->mean, l->rstd, l->grad.data,
                          l->grad.dtype, dx.data, c, gm->grad, bt->grad, accumulate, rows, cols);
    if (from_input_layer(m, l, 0)) return MP_OK;
    return finish_input_grad(m, l, 0, &dx, direct);
}

mp_status mp_layer_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    const mp_tensor *g = &l->grad;
    switch (l->kind) {
    case MP_LAYER_INPUT:
        return MP_OK;
    case MP_LAYER_DENSE:
        return dense_backward(m, l, accumulate);
    case MP_LAYER_ACTIVATION:
        return activation_backward(m, l);
    case MP_LAYER_DROPOUT:
        return dropout_backward(m, l);
    case MP_LAYER_FLATTEN:
        if (from_input_layer(m, l, 0)) return MP_OK;
        return mp_model_add_grad(m, l->inputs[0], g->data, g->dtype);
    case MP_LAYER_ADD: {
        mp_status s = MP_OK;
        for (int j = 0; j < 2 && !s; j++)
            if (!from_input_layer(m, l, j))
                s = mp_model_add_grad(m, l->inputs[j], g->data, g->dtype);
        return s;
    }
    case MP_LAYER_LAYER_NORM:
        return layer_norm_backward(m, l, accumulate);
    }
    return mp_set_error(MP_ERR_INVALID, "layer '%s': unknown kind", l->name);
}
