/* model.c - functional models: a DAG of layers added in topological order,
 * layer creation through the kinds' tables (layer.h), build (parameters and
 * the per-step arenas) and the forward/backward orchestration. What a layer
 * does is in its kind's file under layers/; this file never asks which kind
 * a layer is. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/profile.h"
#include "kernels/ops.h"
#include "nn/layer.h"
#include "nn/quant.h"

/* ----------------------------------------------------------- errors */

mp_status mp_model_fail(mp_model *m, mp_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->errmsg, sizeof m->errmsg, fmt, ap);
    va_end(ap);
    m->err = s;
    mp_set_error(s, "%s", m->errmsg);
    return s;
}

static bool sticky(mp_model *m)
{
    if (!m->err) return false;
    mp_set_error(m->err, "%s", m->errmsg);
    return true;
}

/* ----------------------------------------------------------- building */

mp_model *mp_model_new(uint64_t seed)
{
    mp_model *m = calloc(1, sizeof *m);
    if (!m) {
        mp_set_error(MP_ERR_NOMEM, "model: out of memory");
        return NULL;
    }
    m->seed = seed;
    m->output = m->input = -1;
    return m;
}

mp_model *mp_model_new_with_policy(uint64_t seed, const char *policy)
{
    mp_policy p;
    if (mp_policy_from_name(policy, &p)) return NULL;
    mp_model *m = mp_model_new(seed);
    if (m) {
        m->policy = p;
        m->has_policy = m->policy_fixed = true;
    }
    return m;
}

void mp_model_free(mp_model *m)
{
    if (!m) return;
    if (m->training_free) m->training_free(m->training);
    mp_model_free_params(m);
    mp_float8_model_free(m);
    mp_arena_destroy(m->act);
    mp_arena_destroy(m->ws);
    mp_arena_destroy(m->tmp);
    for (int i = 0; i < m->nlayers; i++) {
        if (m->layers[i].ops && m->layers[i].ops->release) m->layers[i].ops->release(&m->layers[i]);
        free(m->layers[i].inputs);
        free(m->layers[i].config);
        free(m->layers[i].state);
    }
    free(m->layers);
    free(m);
}

/* Keras-style default name: "dense", "dense_1", ...; inputs count from 1. */
static void default_name(const mp_model *m, const mp_layer_ops *ops, char *name, size_t len)
{
    int c = 0;
    for (int i = 0; i < m->nlayers; i++) c += m->layers[i].ops == ops && m->layers[i].auto_named;
    if (ops->min_inputs == 0 && ops->max_inputs == 0)
        snprintf(name, len, "input_%d", c + 1);
    else if (c == 0)
        snprintf(name, len, "%s", ops->base_name);
    else
        snprintf(name, len, "%s_%d", ops->base_name, c);
}

/* Resolve the record's name, policy, seed, initializers and inputs. */
static mp_status init_record(mp_model *m, mp_layer *l, const mp_layer_ops *ops,
                             const mp_node *inputs, int ninputs, const mp_layer_options *o)
{
    l->ops = ops;
    l->index = m->nlayers;
    if (ninputs < ops->min_inputs || (ops->max_inputs >= 0 && ninputs > ops->max_inputs))
        return mp_model_fail(m, MP_ERR_INVALID, "model: %s takes %d%s inputs, got %d",
                             ops->class_name, ops->min_inputs,
                             ops->max_inputs < 0 ? " or more" : "", ninputs);
    for (int i = 0; i < ninputs; i++)
        if (inputs[i] < 0 || inputs[i] >= m->nlayers)
            return mp_model_fail(m, MP_ERR_INVALID,
                                 "model: %s layer input %d is not a node of this model",
                                 ops->base_name, (int)inputs[i]);
    mp_policy global = m->policy_fixed ? m->policy : mp_global_policy(), pol = global;
    if (o && o->policy && mp_policy_from_name(o->policy, &pol) != MP_OK)
        return mp_model_fail(m, MP_ERR_INVALID, "%s", mp_last_error());
    if (!m->has_policy) { /* the model's policy: the global one at its first layer */
        m->policy = global;
        m->has_policy = true;
    }
    l->policy = pol;
    /* a layer made under another global policy is as good as explicit: a
     * saved model must rebuild it in that policy */
    l->policy_explicit = (o && o->policy) || strcmp(pol.name, m->policy.name) != 0;
    l->out_dtype = pol.compute;
    if (o && o->name) {
        if (strlen(o->name) == 0 || strlen(o->name) >= sizeof l->name)
            return mp_model_fail(m, MP_ERR_INVALID,
                                 "model: layer name '%s' must have 1 to 63 characters", o->name);
        snprintf(l->name, sizeof l->name, "%s", o->name);
    } else {
        default_name(m, ops, l->name, sizeof l->name);
        l->auto_named = true;
    }
    for (int i = 0; i < m->nlayers; i++)
        if (strcmp(m->layers[i].name, l->name) == 0)
            return mp_model_fail(m, MP_ERR_INVALID, "model: duplicate layer name '%s'", l->name);
    for (int r = 0; o && r < MP_ROLE_COUNT; r++) {
        if ((unsigned)o->initializers[r] >= MP_INIT_COUNT)
            return mp_model_fail(m, MP_ERR_INVALID, "layer '%s': unknown initializer %d", l->name,
                                 (int)o->initializers[r]);
        l->init[r] = o->initializers[r];
    }
    l->fp8_params = o && o->float8_params ? *o->float8_params : mp_global_float8_params();
    l->fp8_mode = o ? o->float8 : 0;
    if (o && o->float8_params && mp_float8_params_validate(o->float8_params))
        return mp_model_fail(m, MP_ERR_INVALID, "layer '%s': %s", l->name, mp_last_error());
    if (l->fp8_mode < -1 || l->fp8_mode > 1)
        return mp_model_fail(m, MP_ERR_INVALID,
                             "layer '%s': float8 = %d (expected 0 as the policy says, 1 or -1)",
                             l->name, l->fp8_mode);
    if (l->fp8_mode == 1 && !ops->float8)
        return mp_model_fail(m, MP_ERR_INVALID, "layer '%s': %s has no float8 GEMM", l->name,
                             ops->class_name);
    if (mp_mx_layer_init(l, o)) return mp_model_fail(m, MP_ERR_INVALID, "%s", mp_last_error());
    l->seed = (o && o->seed)
                  ? o->seed
                  : mp_mix64(m->seed + 0x9E3779B97F4A7C15ull * (uint64_t)(m->nlayers + 1));
    l->ninputs = ninputs;
    l->inputs = malloc((size_t)(ninputs ? ninputs : 1) * sizeof *l->inputs);
    l->config = calloc(1, ops->config_size ? ops->config_size : 1);
    l->state = calloc(1, ops->state_size ? ops->state_size : 1);
    if (!l->inputs || !l->config || !l->state)
        return mp_model_fail(m, MP_ERR_NOMEM, "model: out of memory");
    for (int i = 0; i < ninputs; i++) {
        const mp_layer *src = &m->layers[inputs[i]];
        if (src->out_dtype == MP_I32 && !ops->int_inputs)
            return mp_model_fail(m, MP_ERR_INVALID,
                                 "layer '%s' (%s): input '%s' is int32, which only layers that "
                                 "read integers take",
                                 l->name, ops->class_name, src->name);
        l->inputs[i] = inputs[i];
    }
    if (ninputs) { /* by default the output has the first input's shape */
        const mp_layer *src = &m->layers[inputs[0]];
        l->ndim = src->ndim;
        memcpy(l->shape, src->shape, sizeof l->shape);
    }
    return MP_OK;
}

mp_node mp_layer_create(mp_model *m, const mp_layer_ops *ops, const mp_node *inputs, int ninputs,
                        const void *config, const mp_layer_options *o)
{
    if (sticky(m)) return -1;
    if (m->built) {
        mp_model_fail(m, MP_ERR_INVALID, "model: cannot add layers after mp_model_build");
        return -1;
    }
    if (m->nlayers == m->cap) {
        int cap = m->cap ? 2 * m->cap : 16;
        mp_layer *nl = realloc(m->layers, (size_t)cap * sizeof *nl);
        if (!nl) {
            mp_model_fail(m, MP_ERR_NOMEM, "model: out of memory");
            return -1;
        }
        m->layers = nl;
        m->cap = cap;
    }
    mp_layer *l = &m->layers[m->nlayers];
    memset(l, 0, sizeof *l);
    int first_param = m->nparams;
    mp_status s = init_record(m, l, ops, inputs, ninputs, o);
    if (!s) {
        if (ops->config_size) memcpy(l->config, config, ops->config_size);
        if ((s = ops->build(m, l)) && !m->err) mp_model_fail(m, s, "%s", mp_last_error());
    }
    if (s) { /* drop the half-made record; the error stays sticky */
        free(l->inputs);
        free(l->config);
        free(l->state);
        m->nparams = first_param;
        return -1;
    }
    return m->nlayers++;
}

/* ------------------------------------------------------------- build */

static mp_status create_arenas(mp_model *m, int64_t max_batch);

mp_status mp_model_build(mp_model *m, mp_node output, int64_t max_batch)
{
    if (sticky(m)) return m->err;
    if (m->built) return mp_model_fail(m, MP_ERR_INVALID, "model: already built");
    if (output < 0 || output >= m->nlayers)
        return mp_model_fail(m, MP_ERR_INVALID, "model: output %d is not a node of this model",
                             (int)output);
    if (max_batch < 1)
        return mp_model_fail(m, MP_ERR_INVALID, "model: max_batch = %lld", (long long)max_batch);
    /* reachability from the output, walking inputs backwards */
    m->layers[output].reachable = true;
    int ninputs = 0;
    for (int i = output; i >= 0; i--) {
        mp_layer *l = &m->layers[i];
        if (!l->reachable) continue;
        if (l->ninputs == 0) {
            ninputs++;
            m->input = i;
        }
        for (int j = 0; j < l->ninputs; j++) m->layers[l->inputs[j]].reachable = true;
    }
    if (ninputs != 1)
        return mp_model_fail(m, MP_ERR_INVALID,
                             "model: the output depends on %d inputs (exactly 1 supported)",
                             ninputs);
    m->output = output;
    m->max_batch = max_batch;
    mp_float8_model_plan(m);
    mp_plan_dropped_outputs(m);
    mp_plan_relu_fusion(m);
    for (int i = 0; i < m->nlayers; i++)
        if (mp_model_init_params(m, &m->layers[i])) return m->err;
    if (mp_float8_model_setup(m)) return mp_model_fail(m, MP_ERR_NOMEM, "%s", mp_last_error());
    if (create_arenas(m, max_batch)) return mp_model_fail(m, MP_ERR_NOMEM, "%s", mp_last_error());
    m->built = true;
    return MP_OK;
}

/* Arenas for batches up to max_batch: the activations a forward keeps, the
 * gradients of every node during backward (summed over the layers the
 * output needs) and one layer's temporaries (the largest). */
static mp_status create_arenas(mp_model *m, int64_t max_batch)
{
    /* the gradient arena also holds the dropped outputs during forward,
     * each no bigger than its gradient (l->out_dtype), so grads covers them */
    size_t act = 0, grads = 0, tmp = 0;
    for (int i = 0; i < m->nlayers; i++) {
        const mp_layer *l = &m->layers[i];
        if (!l->reachable) continue;
        act += mp_layer_saved_bytes(m, l, max_batch);
        grads += mp_layer_grad_bytes(m, l, max_batch);
        size_t t = mp_layer_temp_bytes(m, l, max_batch);
        if (t > tmp) tmp = t;
    }
    mp_arena *a = mp_arena_create(act + 64, MP_MEM_ACTIVATIONS);
    mp_arena *w = a ? mp_arena_create(grads + 64, MP_MEM_WORKSPACE) : NULL;
    mp_arena *t = w ? mp_arena_create(tmp + 64, MP_MEM_WORKSPACE) : NULL;
    if (!a || !w || !t) {
        mp_arena_destroy(a);
        mp_arena_destroy(w);
        return mp_set_error(MP_ERR_NOMEM, "model: arenas for batch %lld: %s", (long long)max_batch,
                            mp_last_error());
    }
    mp_arena_destroy(m->act);
    mp_arena_destroy(m->ws);
    mp_arena_destroy(m->tmp);
    m->act = a;
    m->ws = w;
    m->tmp = t;
    m->max_batch = max_batch;
    m->ran_forward = false; /* the old arenas held the last step */
    return MP_OK;
}

mp_status mp_model_set_max_batch(mp_model *m, int64_t max_batch)
{
    if (sticky(m)) return m->err;
    if (!m->built) return mp_set_error(MP_ERR_INVALID, "model: set_max_batch before build");
    if (max_batch < 1)
        return mp_set_error(MP_ERR_INVALID, "model: max_batch = %lld", (long long)max_batch);
    return create_arenas(m, max_batch);
}

size_t mp_layer_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    return l->ops->saved_bytes ? l->ops->saved_bytes(m, l, batch) : 0;
}

size_t mp_layer_grad_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    (void)m;
    if (!l->ops->backward) return 0; /* data takes no gradient */
    return arena_bytes((size_t)layer_numel(l, batch) * mp_dtype_size(l->out_dtype));
}

size_t mp_layer_temp_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    /* every layer: a cast copy of each float input and a temporary for its
     * gradient unless it is data; the loss's two float32 tensors at the
     * output; and what the kind says */
    size_t bytes = 64, cs = mp_dtype_size(l->policy.compute);
    if (l->index == m->output)
        bytes += 2 * arena_bytes((size_t)layer_numel(l, batch) * sizeof(float));
    for (int j = 0; j < l->ninputs; j++) {
        const mp_layer *src = &m->layers[l->inputs[j]];
        if (src->out_dtype == MP_I32) continue;
        size_t in = arena_bytes((size_t)layer_numel(src, batch) * cs);
        bytes += src->ops->backward ? 2 * in : in;
    }
    if (l->ops->workspace_bytes) bytes += l->ops->workspace_bytes(m, l, batch);
    return bytes;
}

/* ---------------------------------------------------------- passes */

/* Refresh compute copies from masters when masters changed outside the
 * optimizer (which writes the copies itself in its fused update). */
static void refresh_weights(mp_model *m)
{
    if (!m->masters_changed) return;
    mp_float8_model_masters_changed(m);
    for (int i = 0; i < m->nparams; i++) {
        mp_model_param *p = &m->params[i].p;
        if (p->master && p->weight != p->master)
            mp_convert(p->weight, p->weight_dtype, p->master, MP_F32, (size_t)p->n);
    }
    m->refreshes++;
    m->masters_changed = false;
}

mp_status mp_model_forward(mp_model *m, const mp_tensor *x, bool training, const mp_tensor **out)
{
    if (sticky(m)) return m->err;
    if (!m->built) return mp_set_error(MP_ERR_INVALID, "model: forward before mp_model_build");
    const mp_layer *in = &m->layers[m->input];
    char want[128], got[128];
    if (!x || !x->data || x->ndim != in->ndim + 1 ||
        memcmp(x->shape + 1, in->shape, (size_t)in->ndim * sizeof(int64_t)) != 0 ||
        ((x->dtype == MP_I32) != (in->out_dtype == MP_I32))) {
        mp_shape_str(in->ndim, in->shape, want, sizeof want);
        return mp_set_error(MP_ERR_INVALID,
                            "model: input %s does not match the model's input %s %s",
                            x ? mp_tensor_describe(x, got, sizeof got) : "(null)",
                            mp_dtype_name(in->out_dtype), want);
    }
    if (x->shape[0] < 1 || x->shape[0] > m->max_batch)
        return mp_set_error(MP_ERR_INVALID,
                            "model: batch %lld outside 1..%lld (max_batch at build)",
                            (long long)x->shape[0], (long long)m->max_batch);
    refresh_weights(m);
    m->ran_forward = false; /* until this one succeeds: no backward over a failed pass */
    mp_arena_reset(m->act);
    mp_arena_reset(m->ws);
    mp_arena_reset(m->tmp);
    m->batch = x->shape[0];
    m->x = x;
    mp_status s = MP_OK;
    double t0 = mp_prof_region_enter(MP_PROF_FORWARD);
    for (int i = 0; i < m->nlayers && !s; i++) {
        mp_layer *l = &m->layers[i];
        l->has_out = l->has_grad = l->grad_shared = false;
        if (!l->reachable) continue;
        if (!(s = l->ops->forward(m, l, training))) l->has_out = !l->relu_fused;
        mp_arena_reset(m->tmp);
    }
    mp_prof_region_leave(t0);
    m->x = NULL;
    if (s) return s;
    if (training) m->step++;
    m->ran_forward = true;
    if (out) *out = &m->layers[m->output].out;
    return MP_OK;
}

mp_status mp_model_add_grad(mp_model *m, int node, const void *g, mp_dtype gt)
{
    mp_layer *l = &m->layers[node];
    if (!l->ops->backward) return MP_OK; /* no gradient for data */
    size_t n = (size_t)layer_numel(l, m->batch);
    if (l->has_grad && l->grad_shared) { /* the sum into a buffer of its own */
        mp_tensor t;
        if (mp_layer_alloc(m, l, m->ws, l->out_dtype, &t))
            return mp_set_error(MP_ERR_NOMEM, "model: workspace exhausted in backward (%s)",
                                mp_last_error());
        mp_op_add(l->grad.data, l->grad.dtype, g, gt, t.data, t.dtype, n);
        l->grad = t;
        l->grad_shared = false;
        return MP_OK;
    }
    if (l->has_grad) {
        mp_op_accumulate(l->grad.data, l->grad.dtype, g, gt, n);
        return MP_OK;
    }
    if (mp_layer_alloc(m, l, m->ws, l->out_dtype, &l->grad))
        return mp_set_error(MP_ERR_NOMEM, "model: workspace exhausted in backward (%s)",
                            mp_last_error());
    mp_convert(l->grad.data, l->out_dtype, g, gt, n);
    l->has_grad = true;
    return MP_OK;
}

mp_status mp_model_share_grad(mp_model *m, int node, const mp_tensor *g)
{
    mp_layer *l = &m->layers[node];
    if (!l->ops->backward) return MP_OK; /* no gradient for data */
    if (l->has_grad || g->dtype != l->out_dtype || g->ndim != l->ndim + 1 ||
        g->shape[0] != m->batch ||
        memcmp(g->shape + 1, l->shape, (size_t)l->ndim * sizeof(int64_t)))
        return mp_model_add_grad(m, node, g->data, g->dtype);
    l->grad = *g;
    l->grad.owns_data = false;
    l->has_grad = l->grad_shared = true;
    return MP_OK;
}

bool mp_model_grad_seen_finite(const mp_model *m, const float *grad)
{
    for (int i = 0; grad && i < m->nparams; i++)
        if (m->params[i].p.grad == grad) return m->params[i].grad_finite;
    return false;
}

/* Backward from the gradients already placed on nodes. */
static mp_status run_backward(mp_model *m, bool accumulate)
{
    for (int i = 0; i < m->nparams; i++)
        m->params[i].grad_written = m->params[i].grad_finite = false;
    for (int i = m->nlayers - 1; i >= 0; i--) {
        mp_layer *l = &m->layers[i];
        if (!l->reachable || !l->has_grad || !l->ops->backward) continue;
        mp_status s = l->ops->backward(m, l, accumulate);
        mp_arena_reset(m->tmp);
        if (s) return s;
        if (m->after_backward && (s = m->after_backward(m->after_backward_user, i))) return s;
    }
    return MP_OK;
}

static mp_status begin_backward(mp_model *m)
{
    if (sticky(m)) return m->err;
    if (!m->ran_forward)
        return mp_set_error(MP_ERR_INVALID, "model: backward without a forward pass");
    mp_arena_reset(m->ws);
    mp_arena_reset(m->tmp);
    for (int i = 0; i < m->nlayers; i++) {
        m->layers[i].has_grad = m->layers[i].grad_shared = false;
        if (m->layers[i].out_dropped) m->layers[i].has_out = false; /* gradients go there now */
    }
    return MP_OK;
}

static mp_status model_backward(mp_model *m, const mp_tensor *dy, bool accumulate)
{
    mp_status s = begin_backward(m);
    if (s) return s;
    const mp_tensor *out = &m->layers[m->output].out;
    char a[128], b[128];
    if (!dy || !dy->data || mp_tensor_numel(dy) != mp_tensor_numel(out) || dy->ndim != out->ndim)
        return mp_set_error(MP_ERR_INVALID, "model: gradient %s does not match the output %s",
                            dy ? mp_tensor_describe(dy, a, sizeof a) : "(null)",
                            mp_tensor_describe(out, b, sizeof b));
    s = mp_model_add_grad(m, m->output, dy->data, dy->dtype);
    return s ? s : run_backward(m, accumulate);
}

static mp_status loss_backward(mp_model *m, const mp_loss_spec *spec, float scale, bool accumulate,
                               float *loss)
{
    mp_status s = begin_backward(m);
    if (s) return s;
    mp_layer *o = &m->layers[m->output];
    const mp_tensor *z = o->ops->softmax_logits ? o->ops->softmax_logits(m, o) : NULL;
    bool fused = z && !spec->from_logits &&
                 (spec->kind == MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY ||
                  spec->kind == MP_LOSS_CATEGORICAL_CROSSENTROPY);
    mp_tensor g;
    if (fused) {
        /* softmax + cross-entropy from the logits the softmax kept */
        if (mp_tensor_from_arena(&g, m->tmp, MP_F32, z->ndim, z->shape))
            return mp_set_error(MP_ERR_NOMEM, "model: workspace exhausted (%s)", mp_last_error());
        mp_loss_spec logit_spec = *spec;
        logit_spec.from_logits = true;
        s = mp_loss_compute(&logit_spec, z, scale, loss, &g);
        if (s) return s;
        s = mp_model_add_grad(m, o->inputs[0], g.data, MP_F32);
    } else {
        const mp_tensor *out = &o->out;
        if (mp_tensor_from_arena(&g, m->tmp, out->dtype, out->ndim, out->shape))
            return mp_set_error(MP_ERR_NOMEM, "model: workspace exhausted (%s)", mp_last_error());
        s = mp_loss_compute(spec, out, scale, loss, &g);
        if (s) return s;
        s = mp_model_add_grad(m, m->output, g.data, g.dtype);
    }
    return s ? s : run_backward(m, accumulate);
}

mp_status mp_model_backward(mp_model *m, const mp_tensor *dy, bool accumulate)
{
    double t0 = mp_prof_region_enter(MP_PROF_BACKWARD);
    mp_status s = model_backward(m, dy, accumulate);
    mp_prof_region_leave(t0);
    return s;
}

mp_status mp_model_loss_backward(mp_model *m, const mp_loss_spec *spec, float scale,
                                 bool accumulate, float *loss)
{
    double t0 = mp_prof_region_enter(MP_PROF_BACKWARD);
    mp_status s = loss_backward(m, spec, scale, accumulate, loss);
    mp_prof_region_leave(t0);
    return s;
}

/* ------------------------------------------------- hooks for train/ */

void *mp_model_training_state(const mp_model *m) { return m->training; }

void mp_model_set_training_state(mp_model *m, void *state, void (*free_fn)(void *))
{
    if (m->training_free) m->training_free(m->training);
    m->training = state;
    m->training_free = free_fn;
}

void mp_model_set_row_offset(mp_model *m, int64_t first_row) { m->row_offset = first_row; }

void mp_model_set_backward_hook(mp_model *m, mp_backward_hook fn, void *user)
{
    m->after_backward = fn;
    m->after_backward_user = user;
}

int mp_model_params_final_after(const mp_model *m, int node)
{
    for (int i = node < 0 ? 0 : node; i < m->nlayers; i++)
        if (m->layers[i].nparams) return m->layers[i].param_first;
    return m->nparams;
}

uint64_t mp_model_forward_count(const mp_model *m) { return m->step; }
void mp_model_set_forward_count(mp_model *m, uint64_t count) { m->step = count; }
void mp_model_mark_masters_changed(mp_model *m) { m->masters_changed = true; }
