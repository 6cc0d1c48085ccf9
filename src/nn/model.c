/* model.c - functional models: a DAG of layers added in topological order,
 * parameter storage (float32 masters, compute-dtype copies, float32
 * gradients), the per-step arenas, forward/backward orchestration and the
 * precision plan. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "nn/model_internal.h"

/* ----------------------------------------------------------- errors */

/* The same from a layer constructor, which returns a node (-1 on error). */
#define FAIL_NODE(...) (fail(__VA_ARGS__), (mp_node)-1)

/* Record the model's first error (sticky) and return its status. */
static mp_status fail(mp_model *m, mp_status s, const char *fmt, ...) MP_PRINTF(3, 4);
static mp_status fail(mp_model *m, mp_status s, const char *fmt, ...)
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
    m->output = -1;
    return m;
}

void mp_model_free(mp_model *m)
{
    if (!m) return;
    if (m->training_free) m->training_free(m->training);
    for (int i = 0; i < m->nparams; i++) {
        mp_model_param *p = &m->params[i].p;
        if (p->weight != p->master) mp_free(p->weight);
        mp_free(p->master);
        mp_free(p->grad);
    }
    mp_arena_destroy(m->act);
    mp_arena_destroy(m->ws);
    free(m->params);
    free(m->layers);
    free(m);
}

static const char *const kind_names[] = {"input",   "dense", "activation",         "dropout",
                                         "flatten", "add",   "layer_normalization"};
static const char *const kind_types[] = {"InputLayer", "Dense", "Activation",        "Dropout",
                                         "Flatten",    "Add",   "LayerNormalization"};

/* A new layer record with its name and policy resolved, or NULL. */
static mp_layer *add_layer(mp_model *m, mp_layer_kind kind, const mp_layer_options *o,
                           const mp_node *inputs, int ninputs)
{
    if (sticky(m)) return NULL;
    if (m->built) {
        fail(m, MP_ERR_INVALID, "model: cannot add layers after mp_model_build");
        return NULL;
    }
    for (int i = 0; i < ninputs; i++)
        if (inputs[i] < 0 || inputs[i] >= m->nlayers) {
            fail(m, MP_ERR_INVALID, "model: %s layer input %d is not a node of this model",
                 kind_names[kind], (int)inputs[i]);
            return NULL;
        }
    mp_policy pol = mp_global_policy();
    if (o && o->policy && mp_policy_from_name(o->policy, &pol) != MP_OK) {
        fail(m, MP_ERR_INVALID, "%s", mp_last_error());
        return NULL;
    }
    char name[64];
    if (o && o->name) {
        if (strlen(o->name) == 0 || strlen(o->name) >= sizeof name) {
            fail(m, MP_ERR_INVALID, "model: layer name '%s' must have 1 to 63 characters", o->name);
            return NULL;
        }
        snprintf(name, sizeof name, "%s", o->name);
    } else {
        int c = m->name_counts[kind]++;
        const char *base = kind_names[kind];
        if (kind == MP_LAYER_INPUT) /* Keras numbers inputs from 1 */
            snprintf(name, sizeof name, "input_%d", c + 1);
        else if (c == 0)
            snprintf(name, sizeof name, "%s", base);
        else
            snprintf(name, sizeof name, "%s_%d", base, c);
    }
    for (int i = 0; i < m->nlayers; i++)
        if (strcmp(m->layers[i].name, name) == 0) {
            fail(m, MP_ERR_INVALID, "model: duplicate layer name '%s'", name);
            return NULL;
        }
    if (m->nlayers == m->cap) {
        int cap = m->cap ? 2 * m->cap : 16;
        mp_layer *nl = realloc(m->layers, (size_t)cap * sizeof *nl);
        if (!nl) {
            fail(m, MP_ERR_NOMEM, "model: out of memory");
            return NULL;
        }
        m->layers = nl;
        m->cap = cap;
    }
    mp_layer *l = &m->layers[m->nlayers];
    memset(l, 0, sizeof *l);
    l->kind = kind;
    snprintf(l->name, sizeof l->name, "%s", name);
    l->policy = pol;
    l->out_dtype = pol.compute;
    l->ninputs = ninputs;
    for (int i = 0; i < ninputs; i++) l->inputs[i] = inputs[i];
    l->seed = (o && o->seed)
                  ? o->seed
                  : mp_mix64(m->seed + 0x9E3779B97F4A7C15ull * (uint64_t)(m->nlayers + 1));
    if (ninputs) {
        const mp_layer *src = &m->layers[inputs[0]];
        l->ndim = src->ndim;
        memcpy(l->shape, src->shape, sizeof l->shape);
    }
    return l;
}

static mp_node commit(mp_model *m) { return m->nlayers++; }

static mp_status add_param(mp_model *m, mp_layer *l, const char *suffix, int ndim, int64_t d0,
                           int64_t d1)
{
    if (m->nparams == m->pcap) {
        int cap = m->pcap ? 2 * m->pcap : 16;
        param_slot *np = realloc(m->params, (size_t)cap * sizeof *np);
        if (!np) return fail(m, MP_ERR_NOMEM, "model: out of memory");
        m->params = np;
        m->pcap = cap;
    }
    param_slot *s = &m->params[m->nparams];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s.%s", l->name, suffix);
    s->p.name = s->name;
    s->p.ndim = ndim;
    s->p.shape[0] = d0;
    s->p.shape[1] = ndim > 1 ? d1 : 0;
    s->p.n = ndim > 1 ? d0 * d1 : d0;
    if (l->nparams == 0) l->param_first = m->nparams;
    l->nparams++;
    m->nparams++;
    return MP_OK;
}

mp_node mp_input(mp_model *m, int ndim, const int64_t *shape, const mp_layer_options *o)
{
    mp_layer *l = add_layer(m, MP_LAYER_INPUT, o, NULL, 0);
    if (!l) return -1;
    if (ndim < 1 || ndim > MP_MAX_DIMS - 1)
        return FAIL_NODE(m, MP_ERR_INVALID, "input: %d dimensions (1..%d allowed)", ndim,
                         MP_MAX_DIMS - 1);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 1)
            return FAIL_NODE(m, MP_ERR_INVALID, "input: dimension %d is %lld (must be >= 1)", i,
                             (long long)shape[i]);
    l->ndim = ndim;
    memcpy(l->shape, shape, (size_t)ndim * sizeof *shape);
    /* Inputs arrive as data; Keras keeps them float32 whatever the policy. */
    l->out_dtype = MP_F32;
    return commit(m);
}

static bool valid_activation(mp_activation a) { return (unsigned)a <= MP_ACT_SOFTMAX; }

mp_node mp_dense(mp_model *m, mp_node x, int64_t units, mp_activation act,
                 const mp_layer_options *o)
{
    mp_layer *l = add_layer(m, MP_LAYER_DENSE, o, &x, 1);
    if (!l) return -1;
    if (units < 1)
        return FAIL_NODE(m, MP_ERR_INVALID, "dense '%s': units = %lld", l->name, (long long)units);
    if (!valid_activation(act) || act == MP_ACT_SOFTMAX)
        return FAIL_NODE(
            m, MP_ERR_INVALID,
            "dense '%s': activation %d cannot be fused (use an Activation layer for softmax)",
            l->name, (int)act);
    int64_t in = layer_cols(l);
    l->units = units;
    l->act = act;
    l->shape[l->ndim - 1] = units;
    if (add_param(m, l, "kernel", 2, in, units) || add_param(m, l, "bias", 1, units, 0)) return -1;
    return commit(m);
}

mp_node mp_activation_layer(mp_model *m, mp_node x, mp_activation act, const mp_layer_options *o)
{
    mp_layer *l = add_layer(m, MP_LAYER_ACTIVATION, o, &x, 1);
    if (!l) return -1;
    if (!valid_activation(act))
        return FAIL_NODE(m, MP_ERR_INVALID, "activation '%s': unknown activation %d", l->name,
                         (int)act);
    l->act = act;
    return commit(m);
}

mp_node mp_dropout(mp_model *m, mp_node x, float rate, const mp_layer_options *o)
{
    mp_layer *l = add_layer(m, MP_LAYER_DROPOUT, o, &x, 1);
    if (!l) return -1;
    if (!(rate >= 0.0f && rate < 1.0f))
        return FAIL_NODE(m, MP_ERR_INVALID, "dropout '%s': rate %g outside [0, 1)", l->name,
                         (double)rate);
    l->rate = rate;
    return commit(m);
}

mp_node mp_flatten(mp_model *m, mp_node x, const mp_layer_options *o)
{
    mp_layer *l = add_layer(m, MP_LAYER_FLATTEN, o, &x, 1);
    if (!l) return -1;
    int64_t n = 1;
    for (int i = 0; i < l->ndim; i++) n *= l->shape[i];
    l->ndim = 1;
    l->shape[0] = n;
    return commit(m);
}

static const char *shape_str(const mp_layer *l, char *buf, size_t len)
{
    size_t off = (size_t)snprintf(buf, len, "(None");
    for (int i = 0; i < l->ndim && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, ", %lld", (long long)l->shape[i]);
    if (off < len) snprintf(buf + off, len - off, ")");
    return buf;
}

mp_node mp_add(mp_model *m, mp_node a, mp_node b, const mp_layer_options *o)
{
    mp_node in[2] = {a, b};
    mp_layer *l = add_layer(m, MP_LAYER_ADD, o, in, 2);
    if (!l) return -1;
    const mp_layer *la = &m->layers[a], *lb = &m->layers[b];
    if (la->ndim != lb->ndim || memcmp(la->shape, lb->shape, (size_t)la->ndim * sizeof(int64_t))) {
        char s1[96], s2[96];
        return FAIL_NODE(m, MP_ERR_INVALID, "add '%s': shapes %s and %s differ", l->name,
                         shape_str(la, s1, sizeof s1), shape_str(lb, s2, sizeof s2));
    }
    return commit(m);
}

mp_node mp_layer_norm(mp_model *m, mp_node x, float epsilon, const mp_layer_options *o)
{
    mp_layer *l = add_layer(m, MP_LAYER_LAYER_NORM, o, &x, 1);
    if (!l) return -1;
    if (!(epsilon > 0.0f))
        return FAIL_NODE(m, MP_ERR_INVALID, "layer_norm '%s': epsilon %g must be > 0", l->name,
                         (double)epsilon);
    l->eps = epsilon;
    int64_t c = layer_cols(l);
    if (add_param(m, l, "gamma", 1, c, 0) || add_param(m, l, "beta", 1, c, 0)) return -1;
    return commit(m);
}

/* ------------------------------------------------------------- build */

static void *zalloc(size_t bytes, mp_mem_category cat)
{
    void *p = mp_alloc(bytes, cat);
    if (p) memset(p, 0, bytes);
    return p;
}

/* Fill a float32 array with U(-limit, limit) from a counter-based stream. */
static void uniform_init(float *w, int64_t n, float limit, uint64_t seed)
{
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = mp_mix64(seed + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1));
        double u = (double)(r >> 11) * 0x1p-53; /* [0, 1) */
        w[i] = (float)((2.0 * u - 1.0) * limit);
    }
}

static mp_status init_params(mp_model *m, mp_layer *l)
{
    for (int j = 0; j < l->nparams; j++) {
        param_slot *s = &m->params[l->param_first + j];
        mp_model_param *p = &s->p;
        bool mixed = mp_policy_is_mixed(&l->policy);
        mp_dtype vt = l->policy.variable;
        /* LayerNorm computes in float32 internally: its parameters are read
         * as float32 and need no compute copy. */
        bool f32_only = l->kind == MP_LAYER_LAYER_NORM;
        float *init = mp_alloc((size_t)p->n * sizeof(float), MP_MEM_OTHER);
        if (!init) return fail(m, MP_ERR_NOMEM, "model: cannot allocate parameter %s", p->name);
        const char *suffix = strrchr(p->name, '.') + 1;
        if (!strcmp(suffix, "kernel"))
            uniform_init(init, p->n, (float)sqrt(6.0 / (double)(p->shape[0] + p->shape[1])),
                         l->seed);
        else
            for (int64_t i = 0; i < p->n; i++) init[i] = !strcmp(suffix, "gamma") ? 1.0f : 0.0f;
        p->grad = zalloc((size_t)p->n * sizeof(float), MP_MEM_GRADS);
        const bool want_master = f32_only || vt == MP_F32;
        if (want_master) {
            p->master = mp_alloc((size_t)p->n * sizeof(float), MP_MEM_MASTER);
            if (p->master) memcpy(p->master, init, (size_t)p->n * sizeof(float));
            if (f32_only || !mixed) {
                p->weight = p->master;
                p->weight_dtype = MP_F32;
            } else {
                p->weight_dtype = l->policy.compute;
                p->weight = mp_alloc((size_t)p->n * mp_dtype_size(p->weight_dtype), MP_MEM_WEIGHTS);
                if (p->weight) mp_convert(p->weight, p->weight_dtype, init, MP_F32, (size_t)p->n);
            }
        } else {
            /* pure low-precision policy: the weights themselves are low precision */
            p->master = NULL;
            p->weight_dtype = vt;
            p->weight = mp_alloc((size_t)p->n * mp_dtype_size(vt), MP_MEM_WEIGHTS);
            if (p->weight) mp_convert(p->weight, vt, init, MP_F32, (size_t)p->n);
        }
        mp_free(init);
        if (!p->grad || !p->weight || (want_master && !p->master))
            return fail(m, MP_ERR_NOMEM, "model: cannot allocate parameter %s", p->name);
    }
    return MP_OK;
}

mp_status mp_model_build(mp_model *m, mp_node output, int64_t max_batch)
{
    if (sticky(m)) return m->err;
    if (m->built) return fail(m, MP_ERR_INVALID, "model: already built");
    if (output < 0 || output >= m->nlayers)
        return fail(m, MP_ERR_INVALID, "model: output %d is not a node of this model", (int)output);
    if (max_batch < 1)
        return fail(m, MP_ERR_INVALID, "model: max_batch = %lld", (long long)max_batch);
    /* reachability from the output, walking inputs backwards */
    m->layers[output].reachable = true;
    int ninputs = 0;
    for (int i = output; i >= 0; i--) {
        mp_layer *l = &m->layers[i];
        if (!l->reachable) continue;
        if (l->kind == MP_LAYER_INPUT) ninputs++;
        for (int j = 0; j < l->ninputs; j++) m->layers[l->inputs[j]].reachable = true;
    }
    if (ninputs != 1)
        return fail(m, MP_ERR_INVALID,
                    "model: the output depends on %d inputs (exactly 1 supported)", ninputs);
    m->output = output;
    m->max_batch = max_batch;
    for (int i = 0; i < m->nlayers; i++)
        if (init_params(m, &m->layers[i])) return m->err;
    size_t act = 0, ws = 0;
    for (int i = 0; i < m->nlayers; i++) {
        if (!m->layers[i].reachable) continue;
        act += mp_layer_saved_bytes(m, &m->layers[i], max_batch);
        ws += mp_layer_workspace_bytes(m, &m->layers[i], max_batch);
    }
    m->act = mp_arena_create(act + 64, MP_MEM_ACTIVATIONS);
    m->ws = mp_arena_create(ws + 64, MP_MEM_WORKSPACE);
    if (!m->act || !m->ws) return fail(m, MP_ERR_NOMEM, "model: %s", mp_last_error());
    m->built = true;
    return MP_OK;
}

/* ---------------------------------------------------------- passes */

/* Refresh compute copies from masters when masters changed outside the
 * optimizer (which writes the copies itself in its fused update). */
static void refresh_weights(mp_model *m)
{
    if (!m->masters_changed) return;
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
    const mp_layer *in = NULL;
    for (int i = 0; i < m->nlayers && !in; i++)
        if (m->layers[i].reachable && m->layers[i].kind == MP_LAYER_INPUT) in = &m->layers[i];
    char want[128], got[128];
    if (!x || !x->data || x->ndim != in->ndim + 1 ||
        memcmp(x->shape + 1, in->shape, (size_t)in->ndim * sizeof(int64_t)) != 0) {
        shape_str(in, want, sizeof want);
        return mp_set_error(MP_ERR_INVALID, "model: input %s does not match the model's input %s",
                            x ? mp_tensor_describe(x, got, sizeof got) : "(null)", want);
    }
    if (x->shape[0] < 1 || x->shape[0] > m->max_batch)
        return mp_set_error(MP_ERR_INVALID,
                            "model: batch %lld outside 1..%lld (max_batch at build)",
                            (long long)x->shape[0], (long long)m->max_batch);
    refresh_weights(m);
    mp_arena_reset(m->act);
    mp_arena_reset(m->ws);
    m->batch = x->shape[0];
    for (int i = 0; i < m->nlayers; i++) {
        mp_layer *l = &m->layers[i];
        l->has_out = l->has_grad = false;
        if (!l->reachable) continue;
        mp_status s = mp_layer_forward(m, l, x, training);
        if (s) return s;
        l->has_out = true;
    }
    if (training) m->step++;
    m->ran_forward = true;
    if (out) *out = &m->layers[m->output].out;
    return MP_OK;
}

mp_status mp_model_add_grad(mp_model *m, int node, const void *g, mp_dtype gt)
{
    mp_layer *l = &m->layers[node];
    if (l->kind == MP_LAYER_INPUT) return MP_OK; /* no gradient for data */
    size_t n = (size_t)layer_numel(l, m->batch);
    if (l->has_grad) {
        mp_op_accumulate(l->grad.data, l->grad.dtype, g, gt, n);
        return MP_OK;
    }
    int64_t shape[MP_MAX_DIMS];
    shape[0] = m->batch;
    memcpy(shape + 1, l->shape, (size_t)l->ndim * sizeof(int64_t));
    if (mp_tensor_from_arena(&l->grad, m->ws, l->out_dtype, l->ndim + 1, shape))
        return fail(m, MP_ERR_NOMEM, "model: workspace exhausted in backward (%s)",
                    mp_last_error());
    mp_convert(l->grad.data, l->out_dtype, g, gt, n);
    l->has_grad = true;
    return MP_OK;
}

/* Backward from the gradients already placed on nodes. */
static mp_status run_backward(mp_model *m, bool accumulate)
{
    for (int i = m->nlayers - 1; i >= 0; i--) {
        mp_layer *l = &m->layers[i];
        if (!l->reachable || !l->has_grad || l->kind == MP_LAYER_INPUT) continue;
        mp_status s = mp_layer_backward(m, l, accumulate);
        if (s) return s;
    }
    return MP_OK;
}

static mp_status begin_backward(mp_model *m)
{
    if (sticky(m)) return m->err;
    if (!m->ran_forward)
        return mp_set_error(MP_ERR_INVALID, "model: backward without a forward pass");
    mp_arena_reset(m->ws);
    for (int i = 0; i < m->nlayers; i++) m->layers[i].has_grad = false;
    return MP_OK;
}

mp_status mp_model_backward(mp_model *m, const mp_tensor *dy, bool accumulate)
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

mp_status mp_model_loss_backward(mp_model *m, const mp_loss_spec *spec, float scale,
                                 bool accumulate, float *loss)
{
    mp_status s = begin_backward(m);
    if (s) return s;
    mp_layer *o = &m->layers[m->output];
    bool fused = o->kind == MP_LAYER_ACTIVATION && o->act == MP_ACT_SOFTMAX && !spec->from_logits &&
                 (spec->kind == MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY ||
                  spec->kind == MP_LOSS_CATEGORICAL_CROSSENTROPY);
    mp_tensor g;
    if (fused) {
        /* softmax + cross-entropy from the logits the softmax kept */
        const mp_tensor *z = &o->in_saved;
        if (mp_tensor_from_arena(&g, m->ws, MP_F32, z->ndim, z->shape))
            return fail(m, MP_ERR_NOMEM, "model: workspace exhausted (%s)", mp_last_error());
        mp_loss_spec logit_spec = *spec;
        logit_spec.from_logits = true;
        s = mp_loss_compute(&logit_spec, z, scale, loss, &g);
        if (s) return s;
        s = mp_model_add_grad(m, o->inputs[0], g.data, MP_F32);
    } else {
        const mp_tensor *out = &o->out;
        if (mp_tensor_from_arena(&g, m->ws, out->dtype, out->ndim, out->shape))
            return fail(m, MP_ERR_NOMEM, "model: workspace exhausted (%s)", mp_last_error());
        s = mp_loss_compute(spec, out, scale, loss, &g);
        if (s) return s;
        s = mp_model_add_grad(m, m->output, g.data, g.dtype);
    }
    return s ? s : run_backward(m, accumulate);
}

/* ------------------------------------------------------- inspection */

int mp_model_num_layers(const mp_model *m) { return m->nlayers; }
int mp_model_num_params(const mp_model *m) { return m->nparams; }
mp_model_param *mp_model_get_param(mp_model *m, int i)
{
    return i >= 0 && i < m->nparams ? &m->params[i].p : NULL;
}
void mp_model_mark_masters_changed(mp_model *m) { m->masters_changed = true; }
uint64_t mp_model_weight_refreshes(const mp_model *m) { return m->refreshes; }
size_t mp_model_activation_bytes(const mp_model *m) { return m->act ? mp_arena_used(m->act) : 0; }
size_t mp_model_workspace_bytes(const mp_model *m) { return m->ws ? mp_arena_peak(m->ws) : 0; }

const mp_tensor *mp_model_node_output(const mp_model *m, mp_node node)
{
    if (node < 0 || node >= m->nlayers || !m->layers[node].has_out) return NULL;
    return &m->layers[node].out;
}

const mp_tensor *mp_model_node_grad(const mp_model *m, mp_node node)
{
    if (node < 0 || node >= m->nlayers || !m->layers[node].has_grad) return NULL;
    return &m->layers[node].grad;
}

static size_t param_bytes(const mp_model *m, const mp_layer *l, int64_t *count)
{
    size_t bytes = 0;
    *count = 0;
    for (int j = 0; j < l->nparams; j++) {
        const mp_model_param *p = &m->params[l->param_first + j].p;
        *count += p->n;
        bool f32_only = l->kind == MP_LAYER_LAYER_NORM;
        if (f32_only || l->policy.variable == MP_F32) bytes += (size_t)p->n * 4;
        if (!f32_only && l->policy.compute != MP_F32)
            bytes += (size_t)p->n * mp_dtype_size(l->policy.compute);
    }
    return bytes;
}

mp_status mp_model_layer_info(const mp_model *m, int layer, int64_t batch, mp_layer_info *out)
{
    if (layer < 0 || layer >= m->nlayers)
        return mp_set_error(MP_ERR_INVALID, "model: no layer %d (model has %d)", layer, m->nlayers);
    const mp_layer *l = &m->layers[layer];
    memset(out, 0, sizeof *out);
    out->name = l->name;
    out->kind = l->kind;
    out->policy = l->policy;
    out->output_dtype = l->out_dtype;
    out->ndim = l->ndim;
    memcpy(out->shape, l->shape, sizeof out->shape);
    out->param_bytes = param_bytes(m, l, &out->params);
    out->saved_bytes = l->reachable ? mp_layer_saved_bytes(m, l, batch) : 0;
    return MP_OK;
}

static void human(size_t b, char *buf, size_t len)
{
    if (b >= (1u << 20))
        snprintf(buf, len, "%.2f MiB", (double)b / (1 << 20));
    else if (b >= 1024)
        snprintf(buf, len, "%.1f KiB", (double)b / 1024);
    else
        snprintf(buf, len, "%zu B", b);
}

mp_status mp_model_summary(const mp_model *m, int64_t batch, FILE *out)
{
    if (!m->built) return mp_set_error(MP_ERR_INVALID, "model: summary before mp_model_build");
    if (batch < 1 || batch > m->max_batch)
        return mp_set_error(MP_ERR_INVALID, "model: summary batch %lld outside 1..%lld",
                            (long long)batch, (long long)m->max_batch);
    fprintf(out, "Model: %d layers, precision plan at batch %lld\n", m->nlayers, (long long)batch);
    const char *rule =
        "---------------------------------------------------------------------------------------"
        "--------------------------\n";
    fprintf(out, "%s", rule);
    fprintf(out, "%-34s %-16s %10s  %-15s %-9s %-9s %12s %12s\n", "Layer (type)", "Output Shape",
            "Param #", "Policy", "Compute", "Output", "Param bytes", "Saved act.");
    fprintf(out, "%s", rule);
    int64_t total = 0;
    size_t master = 0, weights = 0, saved = 0;
    for (int i = 0; i < m->nlayers; i++) {
        mp_layer_info in;
        mp_model_layer_info(m, i, batch, &in);
        const mp_layer *l = &m->layers[i];
        char label[80], shape[64];
        snprintf(label, sizeof label, "%s (%s)", l->name, kind_types[l->kind]);
        shape_str(l, shape, sizeof shape);
        fprintf(out, "%-34s %-16s %10lld  %-15s %-9s %-9s %12zu %12zu\n", label, shape,
                (long long)in.params, l->policy.name,
                mp_dtype_name(l->kind == MP_LAYER_INPUT ? MP_F32 : l->policy.compute),
                mp_dtype_name(l->out_dtype), in.param_bytes, in.saved_bytes);
        total += in.params;
        saved += in.saved_bytes;
        for (int j = 0; j < l->nparams; j++) {
            const mp_model_param *p = &m->params[l->param_first + j].p;
            if (p->master) master += (size_t)p->n * 4;
            if (p->weight != p->master) weights += (size_t)p->n * mp_dtype_size(p->weight_dtype);
        }
    }
    fprintf(out, "%s", rule);
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    human(master, b1, sizeof b1);
    human(weights, b2, sizeof b2);
    human((size_t)total * 4, b3, sizeof b3);
    human(saved, b4, sizeof b4);
    size_t ws = 0;
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i].reachable) ws += mp_layer_workspace_bytes(m, &m->layers[i], batch);
    human(ws, b5, sizeof b5);
    fprintf(out, "Total params: %lld\n", (long long)total);
    fprintf(out, "Memory by category at batch %lld:\n", (long long)batch);
    fprintf(out, "  master_weights   %14zu  (%s, float32)\n", master, b1);
    fprintf(out, "  weights          %14zu  (%s, compute copies)\n", weights, b2);
    fprintf(out, "  gradients        %14zu  (%s, float32)\n", (size_t)total * 4, b3);
    fprintf(out, "  activations      %14zu  (%s, saved for backward)\n", saved, b4);
    fprintf(out, "  workspace        %14zu  (%s, upper bound of the backward pass)\n", ws, b5);
    return MP_OK;
}

/* ------------------------------------------------------ activation names */

static const char *const act_names[] = {"linear",  "relu", "gelu",   "gelu_tanh",
                                        "sigmoid", "tanh", "softmax"};

const char *mp_activation_name(mp_activation a)
{
    return (unsigned)a <= MP_ACT_SOFTMAX ? act_names[a] : "unknown";
}

mp_status mp_activation_from_name(const char *name, mp_activation *out)
{
    for (int i = 0; name && i <= (int)MP_ACT_SOFTMAX; i++)
        if (!strcmp(name, act_names[i])) {
            *out = (mp_activation)i;
            return MP_OK;
        }
    if (name && !strcmp(name, "none")) {
        *out = MP_ACT_NONE;
        return MP_OK;
    }
    return mp_set_error(MP_ERR_INVALID,
                        "unknown activation '%s' (expected linear, relu, gelu, gelu_tanh, sigmoid, "
                        "tanh or softmax)",
                        name ? name : "(null)");
}

mp_status mp_model_layer_config(const mp_model *m, int layer, mp_layer_config *out)
{
    if (layer < 0 || layer >= m->nlayers)
        return mp_set_error(MP_ERR_INVALID, "model: no layer %d (it has %d)", layer, m->nlayers);
    const mp_layer *l = &m->layers[layer];
    memset(out, 0, sizeof *out);
    out->kind = l->kind;
    out->name = l->name;
    out->type = kind_types[l->kind];
    out->policy = l->policy.name;
    out->ninputs = l->ninputs;
    for (int i = 0; i < l->ninputs; i++) out->inputs[i] = l->inputs[i];
    out->ndim = l->ndim;
    memcpy(out->shape, l->shape, sizeof out->shape);
    out->units = l->units;
    out->act = l->act;
    out->rate = l->rate;
    out->epsilon = l->eps;
    out->seed = l->seed;
    return MP_OK;
}

uint64_t mp_model_seed(const mp_model *m) { return m->seed; }
mp_node mp_model_output(const mp_model *m) { return m->built ? m->output : -1; }
uint64_t mp_model_forward_count(const mp_model *m) { return m->step; }
void mp_model_set_forward_count(mp_model *m, uint64_t count) { m->step = count; }

/* ------------------------------------------------- hooks for train/ */

void *mp_model_training_state(const mp_model *m) { return m->training; }

void mp_model_set_training_state(mp_model *m, void *state, void (*free_fn)(void *))
{
    if (m->training_free) m->training_free(m->training);
    m->training = state;
    m->training_free = free_fn;
}

bool mp_model_is_built(const mp_model *m) { return m->built; }
int64_t mp_model_max_batch(const mp_model *m) { return m->max_batch; }

mp_dtype mp_model_compute_dtype(const mp_model *m)
{
    /* the dtype most of the work runs in: that of the first weight layer */
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i].nparams) return m->layers[i].policy.compute;
    return MP_F32;
}

int mp_model_input_shape(const mp_model *m, int64_t *shape)
{
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i].reachable && m->layers[i].kind == MP_LAYER_INPUT) {
            memcpy(shape, m->layers[i].shape, (size_t)m->layers[i].ndim * sizeof(int64_t));
            return m->layers[i].ndim;
        }
    return 0;
}

int mp_model_output_shape(const mp_model *m, int64_t *shape)
{
    if (m->output < 0) return 0;
    const mp_layer *l = &m->layers[m->output];
    memcpy(shape, l->shape, (size_t)l->ndim * sizeof(int64_t));
    return l->ndim;
}
