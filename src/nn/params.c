/* params.c - a model's parameters and non-trainable state: declaration by
 * the layers (N-D, with a role), initializers with Keras's fan rules, and
 * the storage at build: float32 masters, compute-dtype copies, float32
 * gradients; state is float32 with no gradient under every policy. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/layer.h"

static const char *const role_names[MP_ROLE_COUNT] = {
    "kernel", "bias", "gamma", "beta", "embeddings", "moving_mean", "moving_variance"};
static const mp_initializer role_defaults[MP_ROLE_COUNT] = {
    MP_INIT_GLOROT_UNIFORM, MP_INIT_ZEROS, MP_INIT_ONES, MP_INIT_ZEROS,
    MP_INIT_UNIFORM,        MP_INIT_ZEROS, MP_INIT_ONES};
static const char *const init_names[MP_INIT_COUNT] = {
    "default", "zeros", "ones", "glorot_uniform", "he_uniform", "lecun_uniform", "uniform"};

const char *mp_param_role_name(mp_param_role r)
{
    return (unsigned)r < MP_ROLE_COUNT ? role_names[r] : "unknown";
}

const char *mp_initializer_name(mp_initializer i)
{
    return (unsigned)i < MP_INIT_COUNT ? init_names[i] : "unknown";
}

mp_status mp_initializer_from_name(const char *name, mp_initializer *out)
{
    for (int i = 1; name && i < MP_INIT_COUNT; i++)
        if (!strcmp(name, init_names[i])) {
            *out = (mp_initializer)i;
            return MP_OK;
        }
    return mp_set_error(MP_ERR_INVALID,
                        "unknown initializer '%s' (expected zeros, ones, glorot_uniform, "
                        "he_uniform, lecun_uniform or uniform)",
                        name ? name : "(null)");
}

/* ------------------------------------------------------------ declaring */

mp_status mp_layer_add_param(mp_model *m, mp_layer *l, mp_param_role role, const char *name,
                             int ndim, const int64_t *shape, unsigned flags)
{
    if (ndim < 0 || ndim > MP_MAX_DIMS)
        return mp_model_fail(m, MP_ERR_INVALID, "layer '%s': a parameter of %d dimensions", l->name,
                             ndim);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 1 || n > INT64_MAX / 8 / shape[d])
            return mp_model_fail(m, MP_ERR_INVALID, "layer '%s': parameter %s is too large",
                                 l->name, name ? name : role_names[role]);
        n *= shape[d];
    }
    if (m->nparams == m->pcap) {
        int cap = m->pcap ? 2 * m->pcap : 16;
        param_slot *np = realloc(m->params, (size_t)cap * sizeof *np);
        if (!np) return mp_model_fail(m, MP_ERR_NOMEM, "model: out of memory");
        m->params = np;
        m->pcap = cap;
        for (int i = 0; i < m->nparams; i++) m->params[i].p.name = m->params[i].name;
    }
    param_slot *s = &m->params[m->nparams];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s.%s", l->name, name ? name : role_names[role]);
    s->p.name = s->name;
    s->p.role = role;
    s->p.trainable = !(flags & MP_PARAM_STATE);
    s->float32_only = (flags & (MP_PARAM_FLOAT32 | MP_PARAM_STATE)) != 0;
    s->p.ndim = ndim;
    memcpy(s->p.shape, shape, (size_t)ndim * sizeof *shape);
    s->p.n = n;
    if (l->nparams == 0) l->param_first = m->nparams;
    l->nparams++;
    m->nparams++;
    return MP_OK;
}

/* ---------------------------------------------------------- initializers */

void mp_param_fans(const mp_model_param *p, double *fan_in, double *fan_out)
{
    if (p->ndim == 0) {
        *fan_in = *fan_out = 1;
    } else if (p->ndim == 1) {
        *fan_in = *fan_out = (double)p->shape[0];
    } else {
        double receptive = 1;
        for (int d = 0; d < p->ndim - 2; d++) receptive *= (double)p->shape[d];
        *fan_in = (double)p->shape[p->ndim - 2] * receptive;
        *fan_out = (double)p->shape[p->ndim - 1] * receptive;
    }
}

/* U(-limit, limit) from a counter-based stream of (seed, index). */
static void uniform_init(float *w, int64_t n, float limit, uint64_t seed)
{
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = mp_mix64(seed + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1));
        double u = (double)(r >> 11) * 0x1p-53; /* [0, 1) */
        w[i] = (float)((2.0 * u - 1.0) * limit);
    }
}

static void initialize(const mp_model_param *p, mp_initializer init, uint64_t seed, float *w)
{
    double fan_in, fan_out;
    mp_param_fans(p, &fan_in, &fan_out);
    switch (init) {
    case MP_INIT_ONES:
        for (int64_t i = 0; i < p->n; i++) w[i] = 1.0f;
        return;
    case MP_INIT_GLOROT_UNIFORM:
        uniform_init(w, p->n, (float)sqrt(6.0 / (fan_in + fan_out)), seed);
        return;
    case MP_INIT_HE_UNIFORM:
        uniform_init(w, p->n, (float)sqrt(6.0 / fan_in), seed);
        return;
    case MP_INIT_LECUN_UNIFORM:
        uniform_init(w, p->n, (float)sqrt(3.0 / fan_in), seed);
        return;
    case MP_INIT_UNIFORM:
        uniform_init(w, p->n, 0.05f, seed);
        return;
    default:
        memset(w, 0, (size_t)p->n * sizeof *w);
        return;
    }
}

/* ------------------------------------------------------------- storage */

static void *zalloc(size_t bytes, mp_mem_category cat)
{
    void *p = mp_alloc(bytes, cat);
    if (p) memset(p, 0, bytes);
    return p;
}

mp_status mp_model_init_params(mp_model *m, mp_layer *l)
{
    for (int j = 0; j < l->nparams; j++) {
        param_slot *s = &m->params[l->param_first + j];
        mp_model_param *p = &s->p;
        mp_dtype vt = l->policy.variable;
        mp_initializer init = l->init[p->role] ? l->init[p->role] : role_defaults[p->role];
        /* the first random parameter of a layer draws from the layer's seed */
        uint64_t seed = j == 0 ? l->seed : mp_mix64(l->seed + (uint64_t)j);
        float *w = mp_alloc((size_t)p->n * sizeof(float), MP_MEM_OTHER);
        if (!w)
            return mp_model_fail(m, MP_ERR_NOMEM, "model: cannot allocate parameter %s", p->name);
        initialize(p, init, seed, w);
        if (p->trainable) p->grad = zalloc((size_t)p->n * sizeof(float), MP_MEM_GRADS);
        const bool want_master = s->float32_only || vt == MP_F32;
        if (want_master) {
            p->master = mp_alloc((size_t)p->n * sizeof(float), MP_MEM_MASTER);
            if (p->master) memcpy(p->master, w, (size_t)p->n * sizeof(float));
            if (s->float32_only || !mp_policy_is_mixed(&l->policy)) {
                p->weight = p->master;
                p->weight_dtype = MP_F32;
            } else {
                p->weight_dtype = l->policy.compute;
                p->weight = mp_alloc((size_t)p->n * mp_dtype_size(p->weight_dtype), MP_MEM_WEIGHTS);
                if (p->weight) mp_convert(p->weight, p->weight_dtype, w, MP_F32, (size_t)p->n);
            }
        } else {
            /* pure low-precision policy: the weights themselves are low precision */
            p->master = NULL;
            p->weight_dtype = vt;
            p->weight = mp_alloc((size_t)p->n * mp_dtype_size(vt), MP_MEM_WEIGHTS);
            if (p->weight) mp_convert(p->weight, vt, w, MP_F32, (size_t)p->n);
        }
        mp_free(w);
        if ((p->trainable && !p->grad) || !p->weight || (want_master && !p->master))
            return mp_model_fail(m, MP_ERR_NOMEM, "model: cannot allocate parameter %s", p->name);
    }
    return MP_OK;
}

void mp_model_free_params(mp_model *m)
{
    for (int i = 0; i < m->nparams; i++) {
        mp_model_param *p = &m->params[i].p;
        if (p->weight != p->master) mp_free(p->weight);
        mp_free(p->master);
        mp_free(p->grad);
    }
    free(m->params);
}

int mp_model_num_params(const mp_model *m) { return m->nparams; }

mp_model_param *mp_model_get_param(mp_model *m, int i)
{
    return i >= 0 && i < m->nparams ? &m->params[i].p : NULL;
}

uint64_t mp_model_weight_refreshes(const mp_model *m) { return m->refreshes; }
