/* embedding.c - Embedding: int32 ids [batch, d1, ...] pick rows of a table
 * [input_dim, output_dim] (role "embeddings", float32 master with a compute
 * copy under mixed policies): output [batch, d1, ..., output_dim] in the
 * compute dtype, each row a bit-exact copy of the compute copy's. Every id
 * is checked before anything is written; one outside 0..input_dim-1 fails
 * the forward pass. Backward scatter-adds the output gradient's rows into
 * the float32 table gradient, sequentially over the ids (deterministic:
 * repeated ids sum in the order they occur); the ids are data and take no
 * gradient. */
#include <string.h>

#include "kernels/ops.h"
#include "nn/layer.h"

typedef struct {
    int64_t input_dim;  /* rows: ids 0..input_dim-1 */
    int64_t output_dim; /* columns: the width of each row */
} embedding_config;

typedef struct {
    /* the ids of the forward, copied into the activation arena: the input
     * is user data, which may change before backward */
    mp_tensor ids;
} embedding_state;

static mp_status embedding_build(mp_model *m, mp_layer *l)
{
    const embedding_config *c = l->config;
    const mp_layer *src = mp_layer_csrc(m, l, 0);
    if (c->input_dim < 1 || c->input_dim > MP_CONFIG_MAX_WIDTH)
        return mp_set_error(MP_ERR_INVALID, "embedding '%s': input_dim = %lld (1..%lld allowed)",
                            l->name, (long long)c->input_dim, (long long)MP_CONFIG_MAX_WIDTH);
    if (c->output_dim < 1 || c->output_dim > MP_CONFIG_MAX_WIDTH)
        return mp_set_error(MP_ERR_INVALID, "embedding '%s': output_dim = %lld (1..%lld allowed)",
                            l->name, (long long)c->output_dim, (long long)MP_CONFIG_MAX_WIDTH);
    if (src->out_dtype != MP_I32)
        return mp_set_error(MP_ERR_INVALID,
                            "embedding '%s': input '%s' is %s; an Embedding reads int32 ids "
                            "(an Input of dtype int32)",
                            l->name, src->name, mp_dtype_name(src->out_dtype));
    if (src->ndim + 1 > MP_MAX_DIMS - 1)
        return mp_set_error(MP_ERR_INVALID,
                            "embedding '%s': input of %d dimensions (at most %d: the output "
                            "adds one)",
                            l->name, src->ndim, MP_MAX_DIMS - 2);
    if (layer_numel(src, 1) > INT64_MAX / 8 / c->output_dim)
        return mp_set_error(MP_ERR_INVALID, "embedding '%s': the output per sample is too large",
                            l->name);
    l->shape[l->ndim++] = c->output_dim; /* the input's shape (set by the model) + the row */
    int64_t table[2] = {c->input_dim, c->output_dim};
    if (mp_layer_add_param(m, l, MP_ROLE_EMBEDDINGS, NULL, 2, table, 0)) return m->err;
    return MP_OK;
}

static size_t embedding_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    size_t ids = (size_t)layer_numel(mp_layer_csrc(m, l, 0), batch) * sizeof(int32_t);
    return arena_bytes(ids) +
           arena_bytes((size_t)layer_numel(l, batch) * mp_dtype_size(l->policy.compute));
}

static mp_status embedding_forward(mp_model *m, mp_layer *l, bool training)
{
    (void)training;
    const embedding_config *c = l->config;
    embedding_state *st = l->state;
    mp_layer *src = mp_layer_src(m, l, 0);
    mp_dtype ct = l->policy.compute;
    const mp_model_param *w = mp_layer_param(m, l, 0);
    const int32_t *ids = src->out.data;
    int64_t n = mp_tensor_numel(&src->out), od = c->output_dim, per = layer_numel(src, 1);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->input_dim)
            return mp_set_error(MP_ERR_INVALID,
                                "embedding '%s': id %d (sample %lld, position %lld) is outside "
                                "0..%lld (input_dim %lld)",
                                l->name, (int)ids[i], (long long)(i / per), (long long)(i % per),
                                (long long)c->input_dim - 1, (long long)c->input_dim);
    /* always a copy: the only int32 producer is an Input (user data); the
     * copy is n * 4 bytes against the output's n * output_dim elements */
    if (mp_layer_alloc(m, src, m->act, MP_I32, &st->ids)) return mp_layer_nomem(l, "its ids");
    memcpy(st->ids.data, ids, (size_t)n * sizeof *ids);
    if (mp_layer_alloc(m, l, m->act, ct, &l->out)) return mp_layer_nomem(l, "its output");
    size_t ws = mp_dtype_size(w->weight_dtype), cs = mp_dtype_size(ct);
    const char *table = w->weight;
    char *out = l->out.data;
    for (int64_t i = 0; i < n; i++) {
        const char *row = table + (size_t)ids[i] * (size_t)od * ws;
        if (w->weight_dtype == ct) /* the compute copy is already in ct: copy bits */
            memcpy(out + (size_t)i * (size_t)od * cs, row, (size_t)od * cs);
        else
            mp_convert(out + (size_t)i * (size_t)od * cs, ct, row, w->weight_dtype, (size_t)od);
    }
    return MP_OK;
}

static mp_status embedding_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    const embedding_config *c = l->config;
    const embedding_state *st = l->state;
    mp_model_param *w = mp_layer_param(m, l, 0);
    const mp_tensor *g = &l->grad;
    const int32_t *ids = st->ids.data;
    int64_t n = mp_tensor_numel(&st->ids), od = c->output_dim;
    size_t gs = mp_dtype_size(g->dtype);
    /* The whole table is zeroed, not just the rows the last backward
     * touched: p->grad is public and others write all of it between two
     * backwards (mp_grad_accumulator_finish stores the window's mean into
     * every element, a user may edit it), so a list of rows we last wrote
     * would not be the rows that are nonzero. The optimizer's dense update
     * reads the whole table each step anyway, so this costs no more. */
    /* a ReversibleEmbedding tied to this table may have written its part */
    bool *written = &m->params[l->param_first].grad_written;
    if (!accumulate && !*written) memset(w->grad, 0, (size_t)w->n * sizeof *w->grad);
    *written = true;
    /* sequential over the ids: each element of a row sums its contributions
     * in order, one float32 rounding each (the kernel may split a wide row
     * across threads by columns, never the sum of one element) */
    for (int64_t i = 0; i < n; i++)
        mp_op_accumulate(w->grad + (size_t)ids[i] * (size_t)od, MP_F32,
                         (const char *)g->data + (size_t)i * (size_t)od * gs, g->dtype, (size_t)od);
    return MP_OK; /* the ids are data: no gradient */
}

static mp_status embedding_to_json(const mp_layer *l, json_t *o)
{
    const embedding_config *c = l->config;
    json_object_set_new(o, "input_dim", json_integer(c->input_dim));
    json_object_set_new(o, "output_dim", json_integer(c->output_dim));
    return MP_OK;
}

static mp_status embedding_from_json(const json_t *o, void *config)
{
    embedding_config *c = config;
    mp_status s = mp_json_int_field(o, "input_dim", 1, MP_CONFIG_MAX_WIDTH, &c->input_dim);
    return s ? s : mp_json_int_field(o, "output_dim", 1, MP_CONFIG_MAX_WIDTH, &c->output_dim);
}

const mp_layer_ops mp_embedding_ops = {
    .class_name = "Embedding",
    .base_name = "embedding",
    .min_inputs = 1,
    .max_inputs = 1,
    .int_inputs = true,
    .config_size = sizeof(embedding_config),
    .state_size = sizeof(embedding_state),
    .fields = (const char *const[]){"input_dim", "output_dim", NULL},
    .build = embedding_build,
    .forward = embedding_forward,
    .backward = embedding_backward,
    .saved_bytes = embedding_saved_bytes,
    .to_json = embedding_to_json,
    .from_json = embedding_from_json,
};

mp_node mp_embedding(mp_model *m, mp_node ids, int64_t input_dim, int64_t output_dim,
                     const mp_layer_options *o)
{
    embedding_config c = {input_dim, output_dim};
    return mp_layer_create(m, &mp_embedding_ops, &ids, 1, &c, o);
}
