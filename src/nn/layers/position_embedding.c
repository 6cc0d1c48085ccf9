/* position_embedding.c - PositionEmbedding: a learned position table
 * [sequence_length, width] (role "embeddings", as keras_hub's
 * PositionEmbedding) added to a sequence x [batch, T, width] with T <=
 * sequence_length: out[b, t] = x[b, t] + P[position + t], summed in float32
 * from the compute-dtype values and rounded once to the compute dtype.
 * position is 0 in training; while decoding with a cache (decode.c) it is
 * the sequence position of the input's first token (a prefill: row b of
 * the batch starts at position + b T). (keras_hub returns the
 * table rows alone for an Add; here the sum is the layer, which saves a node
 * and a pass.) Backward passes the gradient to x unchanged and sums it over
 * the batch into the table's rows, in float32, batch by batch in order. */
#include <string.h>

#include "kernels/ops.h"
#include "nn/layer.h"

typedef struct {
    int64_t sequence_length; /* rows of the table: the longest sequence */
} position_embedding_config;

static mp_status pe_build(mp_model *m, mp_layer *l)
{
    const position_embedding_config *c = l->config;
    const mp_layer *src = mp_layer_csrc(m, l, 0);
    char buf[64];
    if (src->ndim != 2)
        return mp_set_error(MP_ERR_INVALID,
                            "position_embedding '%s': input %s, expected (None, T, width)", l->name,
                            mp_shape_str(src->ndim, src->shape, buf, sizeof buf));
    if (c->sequence_length < 1 || c->sequence_length > MP_CONFIG_MAX_WIDTH)
        return mp_set_error(MP_ERR_INVALID,
                            "position_embedding '%s': sequence_length = %lld (1..%lld allowed)",
                            l->name, (long long)c->sequence_length, (long long)MP_CONFIG_MAX_WIDTH);
    if (src->shape[0] > c->sequence_length)
        return mp_set_error(MP_ERR_INVALID,
                            "position_embedding '%s': a context of %lld positions is longer than "
                            "the position table (sequence_length %lld)",
                            l->name, (long long)src->shape[0], (long long)c->sequence_length);
    int64_t table[2] = {c->sequence_length, src->shape[1]};
    if (mp_layer_add_param(m, l, MP_ROLE_EMBEDDINGS, NULL, 2, table, 0)) return m->err;
    return MP_OK;
}

static size_t pe_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    (void)m;
    return arena_bytes((size_t)layer_numel(l, batch) * mp_dtype_size(l->policy.compute));
}

static mp_status pe_forward(mp_model *m, mp_layer *l, bool training)
{
    (void)training;
    const position_embedding_config *c = l->config;
    const mp_model_param *w = mp_layer_param(m, l, 0);
    const mp_dtype ct = l->policy.compute;
    const int64_t t = l->shape[0], e = l->shape[1];
    mp_tensor x;
    if (mp_layer_input_compute(m, l, 0, false, &x)) return MP_ERR_NOMEM;
    const int64_t batch = x.shape[0];
    /* a prefill's rows are consecutive positions of one sequence */
    const int64_t span = m->prefill ? batch * t : t;
    if (m->position < 0 || m->position + span > c->sequence_length)
        return mp_set_error(MP_ERR_INVALID,
                            "position_embedding '%s': position %lld is past the position table "
                            "(sequence_length %lld)",
                            l->name, (long long)(m->position + span - 1),
                            (long long)c->sequence_length);
    if (mp_layer_alloc(m, l, m->act, ct, &l->out)) return mp_layer_nomem(l, "its output");
    const size_t cs = mp_dtype_size(ct), ws = mp_dtype_size(w->weight_dtype);
    for (int64_t b = 0; b < batch; b++) {
        const int64_t first = m->position + (m->prefill ? b * t : 0);
        const char *rows = (const char *)w->weight + (size_t)(first * e) * ws;
        size_t off = (size_t)(b * t * e);
        mp_op_add((const char *)x.data + off * cs, ct, rows, w->weight_dtype,
                  (char *)l->out.data + off * cs, ct, (size_t)(t * e));
    }
    return MP_OK;
}

static mp_status pe_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    mp_model_param *w = mp_layer_param(m, l, 0);
    const mp_tensor *g = &l->grad;
    const int64_t t = l->shape[0], e = l->shape[1], batch = g->shape[0];
    const size_t gs = mp_dtype_size(g->dtype);
    float *dp = w->grad + (size_t)(m->position * e);
    if (!accumulate) memset(w->grad, 0, (size_t)w->n * sizeof *w->grad);
    for (int64_t b = 0; b < batch; b++)
        mp_op_accumulate(dp, MP_F32, (const char *)g->data + (size_t)(b * t * e) * gs, g->dtype,
                         (size_t)(t * e));
    return mp_layer_pass_grad(m, l, 0, g);
}

static mp_status pe_to_json(const mp_layer *l, json_t *o)
{
    const position_embedding_config *c = l->config;
    json_object_set_new(o, "sequence_length", json_integer(c->sequence_length));
    return MP_OK;
}

static mp_status pe_from_json(const json_t *o, void *config)
{
    position_embedding_config *c = config;
    return mp_json_int_field(o, "sequence_length", 1, MP_CONFIG_MAX_WIDTH, &c->sequence_length);
}

const mp_layer_ops mp_position_embedding_ops = {
    .class_name = "PositionEmbedding",
    .base_name = "position_embedding",
    .min_inputs = 1,
    .max_inputs = 1,
    .config_size = sizeof(position_embedding_config),
    .fields = (const char *const[]){"sequence_length", NULL},
    .build = pe_build,
    .forward = pe_forward,
    .backward = pe_backward,
    .saved_bytes = pe_saved_bytes,
    .to_json = pe_to_json,
    .from_json = pe_from_json,
};

mp_node mp_position_embedding(mp_model *m, mp_node x, int64_t sequence_length,
                              const mp_layer_options *o)
{
    position_embedding_config c = {sequence_length};
    return mp_layer_create(m, &mp_position_embedding_ops, &x, 1, &c, o);
}
