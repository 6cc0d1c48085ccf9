/* reversible_embedding.c - ReversibleEmbedding (keras_hub's layer called
 * with reverse=True): the output projection of a language model tied to its
 * input embedding. It reads x [..., width] and the table E [vocabulary,
 * width] of the Embedding layer it names, and gives logits x E^T [...,
 * vocabulary] in the compute dtype (float32 accumulation, no bias, as GPT-2
 * ties them). It owns no parameter: the table stays the Embedding's, one
 * set of weights, optimizer slots and checkpoint entries for both uses.
 * Backward: dx = dy E, and dE += dy^T x into the table's float32 gradient,
 * summed with the Embedding's rows (whichever writes first in a pass sets
 * it; see param_slot.grad_written). */
#include <stdio.h>
#include <string.h>

#include "nn/layer.h"

typedef struct {
    char embedding[64]; /* the Embedding layer whose table is used */
} reversible_config;

typedef struct {
    int table; /* the table's index in m->params */
    mp_tensor in;
} reversible_state;

static mp_status rev_build(mp_model *m, mp_layer *l)
{
    const reversible_config *c = l->config;
    reversible_state *st = l->state;
    const mp_layer *src = mp_layer_csrc(m, l, 0), *e = NULL;
    for (int i = 0; i < l->index; i++)
        if (!strcmp(m->layers[i].name, c->embedding)) e = &m->layers[i];
    const mp_model_param *t = e && e->nparams == 1 ? &m->params[e->param_first].p : NULL;
    if (!t || t->role != MP_ROLE_EMBEDDINGS || t->ndim != 2)
        return mp_set_error(MP_ERR_INVALID,
                            "reversible_embedding '%s': embedding '%s' is not an earlier "
                            "Embedding layer",
                            l->name, c->embedding);
    if (t->shape[1] != layer_cols(src))
        return mp_set_error(MP_ERR_INVALID,
                            "reversible_embedding '%s': input width %lld, the table of '%s' "
                            "has rows of %lld",
                            l->name, (long long)layer_cols(src), c->embedding,
                            (long long)t->shape[1]);
    st->table = e->param_first;
    l->shape[l->ndim - 1] = t->shape[0];
    return MP_OK;
}

static size_t rev_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    return mp_layer_kept_input_bytes(m, l, 0, batch) +
           arena_bytes((size_t)layer_numel(l, batch) * mp_dtype_size(l->policy.compute));
}

static mp_status rev_forward(mp_model *m, mp_layer *l, bool training)
{
    (void)training;
    reversible_state *st = l->state;
    const mp_model_param *t = &m->params[st->table].p;
    const mp_dtype ct = l->policy.compute;
    if (mp_layer_input_compute(m, l, 0, true, &st->in)) return MP_ERR_NOMEM;
    if (mp_layer_alloc(m, l, m->act, ct, &l->out)) return mp_layer_nomem(l, "its output");
    const int64_t v = t->shape[0], w = t->shape[1], rows = mp_tensor_numel(&st->in) / w;
    return mp_layer_gemm(false, true, rows, v, w, st->in.data, ct, w, t->weight, t->weight_dtype, w,
                         0.0f, l->out.data, ct, v, NULL);
}

static mp_status rev_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    reversible_state *st = l->state;
    param_slot *slot = &m->params[st->table];
    const mp_model_param *t = &slot->p;
    const mp_tensor *g = &l->grad;
    const int64_t v = t->shape[0], w = t->shape[1], rows = mp_tensor_numel(g) / v;
    /* dE (+)= dy^T x */
    mp_status s =
        mp_layer_gemm(true, false, v, w, rows, g->data, g->dtype, v, st->in.data, st->in.dtype, w,
                      accumulate || slot->grad_written ? 1.0f : 0.0f, t->grad, MP_F32, w, NULL);
    if (s) return s;
    slot->grad_written = true;
    if (mp_layer_input_is_data(m, l, 0)) return MP_OK;
    mp_tensor dx;
    bool direct;
    if (mp_layer_input_grad(m, l, 0, &dx, &direct)) return MP_ERR_NOMEM;
    if ((s = mp_layer_gemm(false, false, rows, w, v, g->data, g->dtype, v, t->weight,
                           t->weight_dtype, w, 0.0f, dx.data, dx.dtype, w, NULL)))
        return s;
    return mp_layer_input_grad_done(m, l, 0, &dx, direct);
}

static mp_status rev_to_json(const mp_layer *l, json_t *o)
{
    const reversible_config *c = l->config;
    json_object_set_new(o, "embedding", json_string(c->embedding));
    json_object_set_new(o, "reverse", json_true());
    return MP_OK;
}

static mp_status rev_from_json(const json_t *o, void *config)
{
    reversible_config *c = config;
    const char *name = json_string_value(json_object_get(o, "embedding"));
    if (!name || !*name || strlen(name) >= sizeof c->embedding)
        return mp_set_error(MP_ERR_FORMAT,
                            "'embedding' must name the Embedding layer (1..%zu characters)",
                            sizeof c->embedding - 1);
    strcpy(c->embedding, name);
    bool reverse = true;
    mp_status s = mp_json_bool_opt(o, "reverse", &reverse);
    if (!s && !reverse)
        s = mp_set_error(MP_ERR_UNSUPPORTED,
                         "'reverse' false: use the Embedding itself (only the reverse use is a "
                         "separate layer here)");
    return s;
}

const mp_layer_ops mp_reversible_embedding_ops = {
    .class_name = "ReversibleEmbedding",
    .base_name = "reversible_embedding",
    .min_inputs = 1,
    .max_inputs = 1,
    .config_size = sizeof(reversible_config),
    .state_size = sizeof(reversible_state),
    .fields = (const char *const[]){"embedding", "reverse", NULL},
    .build = rev_build,
    .forward = rev_forward,
    .backward = rev_backward,
    .saved_bytes = rev_saved_bytes,
    .to_json = rev_to_json,
    .from_json = rev_from_json,
};

mp_node mp_reversible_embedding(mp_model *m, mp_node x, const char *embedding,
                                const mp_layer_options *o)
{
    reversible_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.embedding, sizeof c.embedding, "%s", embedding ? embedding : "");
    return mp_layer_create(m, &mp_reversible_embedding_ops, &x, 1, &c, o);
}
