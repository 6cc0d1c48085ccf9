/* dropout.c - Dropout: in training, each element is kept with probability
 * 1 - rate and scaled by 1 / (1 - rate); outside training it is the
 * identity. The mask comes from a counter-based hash of (layer seed,
 * training forward count, index in the global batch), so a resumed run, a
 * data-parallel shard or a slice draws the same masks as one process. */
#include "kernels/ops.h"
#include "nn/layer.h"

typedef struct {
    float rate;
} dropout_config;

typedef struct {
    uint8_t *mask; /* keep mask of the last training forward, else NULL */
} dropout_state;

static mp_status dropout_build(mp_model *m, mp_layer *l)
{
    (void)m;
    const dropout_config *c = l->config;
    if (!(c->rate >= 0.0f && c->rate < 1.0f))
        return mp_set_error(MP_ERR_INVALID, "dropout '%s': rate %g outside [0, 1)", l->name,
                            (double)c->rate);
    return MP_OK;
}

static size_t dropout_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    (void)m;
    size_t n = (size_t)layer_numel(l, batch);
    return arena_bytes(n * mp_dtype_size(l->policy.compute)) + arena_bytes(n);
}

static mp_status dropout_forward(mp_model *m, mp_layer *l, bool training)
{
    const dropout_config *c = l->config;
    dropout_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    const mp_tensor *x = &mp_layer_src(m, l, 0)->out;
    if (mp_layer_alloc(m, l, m->act, ct, &l->out)) return mp_layer_nomem(l, "its output");
    size_t n = (size_t)mp_tensor_numel(&l->out);
    st->mask = NULL;
    if (!training || c->rate == 0.0f) {
        mp_convert(l->out.data, ct, x->data, x->dtype, n);
        return MP_OK;
    }
    st->mask = mp_arena_alloc(m->act, n);
    if (!st->mask) return mp_layer_nomem(l, "its mask");
    /* keep with probability 1 - rate: 24 random bits per element */
    uint64_t key = mp_mix64(l->seed ^ mp_mix64(m->step + 1));
    uint32_t threshold = (uint32_t)((double)c->rate * 16777216.0);
    /* element i of the global batch: a shard or slice draws what one
     * process draws for the same rows */
    uint64_t first = (uint64_t)m->row_offset * (uint64_t)(n / (size_t)m->batch);
    for (size_t i = 0; i < n; i++)
        st->mask[i] =
            (uint32_t)(mp_mix64(key + 0x9E3779B97F4A7C15ull * (first + i + 1)) >> 40) >= threshold;
    /* the input is cast to the compute dtype before scaling, as Keras's autocast does */
    mp_tensor xc;
    if (mp_layer_input_compute(m, l, 0, false, &xc)) return MP_ERR_NOMEM;
    mp_op_mask_scale(xc.data, ct, st->mask, 1.0f / (1.0f - c->rate), l->out.data, ct, n);
    return MP_OK;
}

static mp_status dropout_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    (void)accumulate;
    const dropout_config *c = l->config;
    const dropout_state *st = l->state;
    const mp_tensor *g = &l->grad;
    if (mp_layer_input_is_data(m, l, 0)) return MP_OK;
    if (!st->mask) return mp_layer_pass_grad(m, l, 0, g);
    mp_tensor dx;
    bool direct;
    if (mp_layer_input_grad(m, l, 0, &dx, &direct)) return MP_ERR_NOMEM;
    mp_op_mask_scale(g->data, g->dtype, st->mask, 1.0f / (1.0f - c->rate), dx.data, dx.dtype,
                     (size_t)mp_tensor_numel(&dx));
    return mp_layer_input_grad_done(m, l, 0, &dx, direct);
}

static mp_status dropout_to_json(const mp_layer *l, json_t *o)
{
    const dropout_config *c = l->config;
    json_object_set_new(o, "rate", json_real(c->rate));
    return MP_OK;
}

static mp_status dropout_from_json(const json_t *o, void *config)
{
    dropout_config *c = config;
    mp_status s = mp_json_float_field(o, "rate", 0.0, false, 1.0, &c->rate);
    if (!s && c->rate == 1.0f) s = mp_set_error(MP_ERR_FORMAT, "'rate' must be in [0, 1)");
    return s;
}

const mp_layer_ops mp_dropout_ops = {
    .class_name = "Dropout",
    .base_name = "dropout",
    .min_inputs = 1,
    .max_inputs = 1,
    .config_size = sizeof(dropout_config),
    .state_size = sizeof(dropout_state),
    .fields = (const char *const[]){"rate", NULL},
    .build = dropout_build,
    .forward = dropout_forward,
    .backward = dropout_backward,
    .saved_bytes = dropout_saved_bytes,
    .to_json = dropout_to_json,
    .from_json = dropout_from_json,
};

mp_node mp_dropout(mp_model *m, mp_node x, float rate, const mp_layer_options *o)
{
    dropout_config c = {rate};
    return mp_layer_create(m, &mp_dropout_ops, &x, 1, &c, o);
}
