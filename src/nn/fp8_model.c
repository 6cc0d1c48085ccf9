/* fp8_model.c - the float8 recipe inside a model: which layers compute in
 * float8 (decided at build: the layer's choice, else its policy minus the
 * first and last float8-capable layer; the same edges for MX, whose layers
 * nn/mx_quant.c decides), their quantized tensors (three each: input,
 * kernel, grad_output), the commit after a training step, the public views
 * of that state and the layer settings as JSON. The steps every quantized
 * layer (float8 or MX) runs through the quantizer's table are in
 * quant_steps.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/layer.h"
#include "nn/quant.h"

static bool layer_active(const mp_layer *l, bool edge)
{
    if (!l->ops->float8 || !l->reachable || l->fp8_mode < 0) return false;
    if (l->fp8_mode > 0) return true;
    return l->policy.float8 && !(edge && l->fp8_params.keep_first_last);
}

void mp_float8_model_plan(mp_model *m)
{
    int first = -1, last = -1;
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i].ops->float8 && m->layers[i].reachable) {
            if (first < 0) first = i;
            last = i;
        }
    for (int i = 0; i < m->nlayers; i++) {
        mp_layer *l = &m->layers[i];
        bool edge = i == first || i == last;
        l->mx_active = mp_mx_layer_plan(l, edge); /* MX, else float8, else neither */
        l->fp8_active = !l->mx_active && layer_active(l, edge);
        l->fp8_first = l->mx_first = -1;
        /* the kernel is quantized from its float32 master: no compute copy */
        for (int j = 0; mp_layer_quantized(l) && l->policy.variable == MP_F32 && j < l->nparams;
             j++)
            if (m->params[l->param_first + j].p.role == MP_ROLE_KERNEL)
                m->params[l->param_first + j].float32_only = true;
    }
}

mp_status mp_float8_model_setup(mp_model *m)
{
    int n = 0;
    for (int i = 0; i < m->nlayers; i++)
        n += m->layers[i].fp8_active * mp_quant_gemms(&m->layers[i]);
    if (!n) return mp_mx_model_setup(m);
    m->fp8 = calloc((size_t)n * MP_FLOAT8_ROLES, sizeof *m->fp8);
    if (!m->fp8) return mp_set_error(MP_ERR_NOMEM, "float8: out of memory");
    for (int i = 0; i < m->nlayers; i++) {
        mp_layer *l = &m->layers[i];
        if (!l->fp8_active) continue;
        l->fp8_first = m->nfp8;
        for (int g = 0; g < mp_quant_gemms(l); g++) {
            for (int r = 0; r < MP_FLOAT8_ROLES; r++) {
                mp_float8_meta *q = &m->fp8[m->nfp8];
                mp_status s = mp_float8_meta_init(q, l->name, (mp_float8_role)r, &l->fp8_params);
                if (s) return s;
                mp_quant_meta_name(q, l, g);
                /* its input's producer reads its sign from the codes (layer.h) */
                q->keeps_sign = g == 0 && r == MP_FLOAT8_INPUT && l->ninputs > 0 &&
                                mp_layer_csrc(m, l, 0)->sign_from == l->index;
                m->nfp8++;
            }
            /* the kernel's operand lives as long as the model (counted as weights) */
            mp_float8_meta *w = &m->fp8[m->nfp8 - MP_FLOAT8_ROLES + MP_FLOAT8_WEIGHT];
            w->codes_n = mp_quant_kernel_bytes(mp_quant_kernel(m, l, g), w->ops);
            if (w->codes_n && !(w->codes = mp_alloc(w->codes_n, MP_MEM_WEIGHTS)))
                return mp_set_error(MP_ERR_NOMEM, "float8: out of memory for '%s'", w->name);
        }
    }
    return mp_mx_model_setup(m);
}

void mp_float8_model_free(mp_model *m)
{
    for (int i = 0; i < m->nfp8; i++) mp_float8_meta_release(&m->fp8[i]);
    free(m->fp8);
    m->fp8 = NULL;
    m->nfp8 = 0;
    mp_mx_model_free(m);
}

mp_float8_meta *mp_float8_layer_metas(mp_model *m, const mp_layer *l)
{
    return l->fp8_active ? &m->fp8[l->fp8_first] : NULL;
}

mp_float8_meta *mp_quant_layer_metas(const mp_model *m, const mp_layer *l)
{
    return l->fp8_active ? &m->fp8[l->fp8_first] : l->mx_active ? &m->mx[l->mx_first] : NULL;
}

size_t mp_float8_model_bytes(const mp_model *m)
{
    size_t b = 0;
    for (int i = 0; i < m->nfp8; i++) b += m->fp8[i].codes_n;
    return b;
}

/* Whether the step's amaxes may enter the histories: all finite. */
static bool pending_finite(const mp_model *m)
{
    for (int i = 0; i < m->nfp8; i++)
        if (m->fp8[i].has_pending && !isfinite(m->fp8[i].pending)) return false;
    return true;
}

bool mp_model_float8_commit(mp_model *m, bool applied)
{
    bool keep = applied && pending_finite(m), any = false;
    for (int i = 0; i < m->nfp8; i++) any |= m->fp8[i].has_pending;
    for (int i = 0; i < m->nfp8; i++) mp_float8_meta_commit(&m->fp8[i], keep);
    return keep && any;
}

/* --------------------------------------- kernels from the optimizer */

/* Calls fn on the kernel meta of every float8 GEMM with delayed scaling
 * and its kernel parameter until fn returns true; whether one did. */
typedef bool (*kernel_fn)(mp_float8_meta *q, mp_model_param *p, void *arg);
static bool each_kernel(mp_model *m, kernel_fn fn, void *arg)
{
    for (int i = 0; i < m->nlayers; i++) {
        const mp_layer *l = &m->layers[i];
        for (int g = 0; l->fp8_active && g < mp_quant_gemms(l); g++) {
            mp_float8_meta *q = &m->fp8[l->fp8_first + g * MP_FLOAT8_ROLES + MP_FLOAT8_WEIGHT];
            mp_model_param *p = mp_quant_kernel(m, l, g);
            if (q->params.scaling == MP_FLOAT8_DELAYED && q->codes && p && p->master &&
                fn(q, p, arg))
                return true;
        }
    }
    return false;
}

typedef struct {
    const float *master;
    mp_float8_meta *q;
} finding;

static bool find(mp_float8_meta *q, mp_model_param *p, void *arg)
{
    finding *f = arg;
    f->q = q;
    return p->master == f->master;
}

mp_float8_meta *mp_float8_kernel_meta(mp_model *m, const float *master)
{
    finding f = {master, NULL};
    return master && each_kernel(m, find, &f) ? f.q : NULL;
}

typedef struct {
    bool keep;
    mp_status s;
} arming;

static bool arm(mp_float8_meta *q, mp_model_param *p, void *arg)
{
    (void)p;
    arming *a = arg;
    a->s = mp_float8_meta_arm(q, mp_float8_meta_next_scale(q, a->keep), mp_num_threads());
    return a->s != MP_OK;
}

mp_status mp_float8_model_arm(mp_model *m)
{
    arming a = {pending_finite(m), MP_OK}; /* the commit's keep, where the update runs */
    each_kernel(m, arm, &a);
    return a.s;
}

static bool settle(mp_float8_meta *q, mp_model_param *p, void *arg)
{
    (void)arg;
    mp_float8_meta_settle(q, p->n);
    return false;
}

void mp_float8_model_settle(mp_model *m) { each_kernel(m, settle, NULL); }

static bool forget(mp_float8_meta *q, mp_model_param *p, void *arg)
{
    (void)p, (void)arg;
    atomic_store(&q->fresh, false);
    return false;
}

void mp_float8_model_masters_changed(mp_model *m) { each_kernel(m, forget, NULL); }

int mp_model_float8_num_tensors(const mp_model *m) { return m->nfp8; }

mp_status mp_model_float8_tensor(const mp_model *m, int i, mp_float8_tensor_info *out)
{
    if (i < 0 || i >= m->nfp8)
        return mp_set_error(MP_ERR_INVALID, "float8: no tensor %d (the model has %d)", i, m->nfp8);
    const mp_float8_meta *q = &m->fp8[i];
    out->name = q->name;
    out->layer = q->layer;
    out->role = q->role;
    out->dtype = q->dtype;
    out->params = q->params;
    out->scale = q->scale;
    out->has_pending = q->has_pending;
    out->pending_amax = q->pending;
    out->history = q->history;
    return MP_OK;
}

bool mp_model_layer_float8(const mp_model *m, int layer)
{
    return layer >= 0 && layer < m->nlayers && m->layers[layer].fp8_active;
}

/* ------------------------------------------------------------- JSON */

json_t *mp_float8_params_json(const mp_float8_params *p)
{
    return json_pack("{s:s, s:s, s:i, s:s, s:i, s:b}", "format", mp_float8_format_name(p->format),
                     "scaling", mp_float8_scaling_name(p->scaling), "amax_history_len",
                     (int)p->amax_history_len, "algorithm", mp_float8_algorithm_name(p->algorithm),
                     "margin", (int)p->margin, "keep_first_last", p->keep_first_last);
}

mp_status mp_float8_params_from_json(const json_t *o, mp_float8_params *p)
{
    *p = mp_float8_params_default();
    if (!json_is_object(o))
        return mp_set_error(MP_ERR_INVALID, "float8_params must be an object of settings");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)o, key, v)
    {
        char buf[32];
        const char *text = json_string_value(v);
        if (json_is_integer(v)) {
            snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
            text = buf;
        } else if (json_is_boolean(v)) {
            text = json_is_true(v) ? "true" : "false";
        } else if (!text) {
            text = "(not a string, integer or boolean)";
        }
        mp_status s = mp_float8_params_set(p, key, text);
        if (s) return s;
    }
    return MP_OK;
}

bool mp_float8_params_equal(const mp_float8_params *a, const mp_float8_params *b)
{
    return a->format == b->format && a->scaling == b->scaling &&
           a->amax_history_len == b->amax_history_len && a->algorithm == b->algorithm &&
           a->margin == b->margin && a->keep_first_last == b->keep_first_last;
}

void mp_float8_model_restore(mp_model *m, int i, const void *history, mp_dtype ht,
                             const void *scale, mp_dtype st)
{
    mp_float8_meta *q = &m->fp8[i];
    float s;
    mp_convert(&s, MP_F32, scale, st, 1);
    mp_convert(q->history, MP_F32, history, ht, (size_t)q->params.amax_history_len);
    mp_float8_meta_set_history(q, q->history, s);
}
