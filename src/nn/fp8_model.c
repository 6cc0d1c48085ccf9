/* fp8_model.c - the float8 recipe inside a model: which layers compute in
 * float8 (decided at build: the layer's choice, else its policy minus the
 * first and last float8-capable layer), their quantized tensors (three
 * each: input, kernel, grad_output), the commit after a training step, the
 * public views of that state, and the layer settings as JSON. */
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

/* Bytes of the kernel's operand: the kernel seen as [n / last, last]. */
static size_t kernel_operand_bytes(const mp_model *m, const mp_layer *l, const mp_quantizer *q)
{
    for (int j = 0; j < l->nparams; j++) {
        const mp_model_param *p = &m->params[l->param_first + j].p;
        int64_t last = p->shape[p->ndim - 1];
        if (p->role == MP_ROLE_KERNEL) return q->operand_bytes(p->n / last, last);
    }
    return 0;
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
        l->fp8_active = layer_active(l, i == first || i == last);
        l->fp8_first = -1;
        /* the kernel is quantized from its float32 master: no compute copy */
        for (int j = 0; l->fp8_active && l->policy.variable == MP_F32 && j < l->nparams; j++)
            if (m->params[l->param_first + j].p.role == MP_ROLE_KERNEL)
                m->params[l->param_first + j].float32_only = true;
    }
}

mp_status mp_float8_model_setup(mp_model *m)
{
    int n = 0;
    for (int i = 0; i < m->nlayers; i++) n += m->layers[i].fp8_active;
    if (!n) return MP_OK;
    m->fp8 = calloc((size_t)n * MP_FLOAT8_ROLES, sizeof *m->fp8);
    if (!m->fp8) return mp_set_error(MP_ERR_NOMEM, "float8: out of memory");
    for (int i = 0; i < m->nlayers; i++) {
        mp_layer *l = &m->layers[i];
        if (!l->fp8_active) continue;
        l->fp8_first = m->nfp8;
        for (int r = 0; r < MP_FLOAT8_ROLES; r++) {
            mp_float8_meta *q = &m->fp8[m->nfp8];
            mp_status s = mp_float8_meta_init(q, l->name, (mp_float8_role)r, &l->fp8_params);
            if (s) return s;
            m->nfp8++;
        }
        /* the kernel's operand lives as long as the model (counted as weights) */
        mp_float8_meta *w = &m->fp8[l->fp8_first + MP_FLOAT8_WEIGHT];
        w->codes_n = kernel_operand_bytes(m, l, w->ops);
        if (w->codes_n && !(w->codes = mp_alloc(w->codes_n, MP_MEM_WEIGHTS)))
            return mp_set_error(MP_ERR_NOMEM, "float8: out of memory for '%s'", w->name);
    }
    return MP_OK;
}

void mp_float8_model_free(mp_model *m)
{
    for (int i = 0; i < m->nfp8; i++) mp_float8_meta_release(&m->fp8[i]);
    free(m->fp8);
    m->fp8 = NULL;
    m->nfp8 = 0;
}

mp_float8_meta *mp_float8_layer_metas(mp_model *m, const mp_layer *l)
{
    return l->fp8_active ? &m->fp8[l->fp8_first] : NULL;
}

size_t mp_float8_model_bytes(const mp_model *m)
{
    size_t b = 0;
    for (int i = 0; i < m->nfp8; i++) b += m->fp8[i].codes_n;
    return b;
}

bool mp_model_float8_commit(mp_model *m, bool applied)
{
    bool keep = applied, any = false;
    for (int i = 0; i < m->nfp8; i++) {
        const mp_float8_meta *q = &m->fp8[i];
        if (q->has_pending && !isfinite(q->pending)) keep = false;
        any |= q->has_pending;
    }
    for (int i = 0; i < m->nfp8; i++) mp_float8_meta_commit(&m->fp8[i], keep);
    return keep && any;
}

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
