/* layer_norm.c - LayerNormalization over the last axis: statistics in
 * float32 from float64 sums under every policy, gamma and beta read as
 * float32 (no compute copy); the input, mean and 1/std are kept for
 * backward, which never reads the output (so consumers that keep their
 * own compact form of it let the model drop it; layer.h). */
#include "kernels/ops.h"
#include "nn/layer.h"

typedef struct {
    float epsilon;
} layer_norm_config;

typedef struct {
    mp_tensor in;
    float *mean, *rstd;
} layer_norm_state;

static mp_status layer_norm_build(mp_model *m, mp_layer *l)
{
    const layer_norm_config *c = l->config;
    if (!(c->epsilon > 0.0f))
        return mp_set_error(MP_ERR_INVALID, "layer_norm '%s': epsilon %g must be > 0", l->name,
                            (double)c->epsilon);
    int64_t cols = layer_cols(l);
    if (mp_layer_add_param(m, l, MP_ROLE_GAMMA, NULL, 1, &cols, MP_PARAM_FLOAT32) ||
        mp_layer_add_param(m, l, MP_ROLE_BETA, NULL, 1, &cols, MP_PARAM_FLOAT32))
        return m->err;
    return MP_OK;
}

static size_t layer_norm_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    int64_t n = layer_numel(l, batch), rows = n / layer_cols(l);
    return mp_layer_kept_input_bytes(m, l, 0, batch) +
           mp_layer_output_saved_bytes(l, n, l->policy.compute, false) +
           2 * arena_bytes((size_t)rows * sizeof(float));
}

static mp_output_use layer_norm_output_use(const mp_layer *l)
{
    (void)l;
    return MP_OUTPUT_UNREAD;
}

static mp_status layer_norm_forward(mp_model *m, mp_layer *l, bool training)
{
    (void)training;
    const layer_norm_config *c = l->config;
    layer_norm_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    if (mp_layer_input_compute(m, l, 0, true, &st->in)) return MP_ERR_NOMEM;
    if (mp_layer_alloc_output(m, l, ct)) return MP_ERR_NOMEM;
    int64_t cols = layer_cols(l), rows = mp_tensor_numel(&l->out) / cols;
    st->mean = mp_arena_alloc(m->act, (size_t)rows * sizeof(float));
    st->rstd = mp_arena_alloc(m->act, (size_t)rows * sizeof(float));
    if (!st->mean || !st->rstd) return mp_layer_nomem(l, "its statistics");
    mp_op_layer_norm(st->in.data, ct, mp_layer_param(m, l, 0)->master,
                     mp_layer_param(m, l, 1)->master, c->epsilon, l->out.data, ct, st->mean,
                     st->rstd, rows, cols);
    return MP_OK;
}

static mp_status layer_norm_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    const layer_norm_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    mp_model_param *gm = mp_layer_param(m, l, 0), *bt = mp_layer_param(m, l, 1);
    int64_t cols = layer_cols(l), rows = mp_tensor_numel(&l->out) / cols;
    bool data = mp_layer_input_is_data(m, l, 0), direct = false;
    mp_tensor dx;
    if (data) { /* dgamma/dbeta still need the pass; dx is dropped */
        if (mp_layer_alloc(m, mp_layer_src(m, l, 0), m->tmp, ct, &dx))
            return mp_layer_nomem(l, "a gradient");
    } else if (mp_layer_input_grad(m, l, 0, &dx, &direct)) {
        return MP_ERR_NOMEM;
    }
    mp_op_layer_norm_grad(st->in.data, ct, gm->master, st->mean, st->rstd, l->grad.data,
                          l->grad.dtype, dx.data, ct, gm->grad, bt->grad, accumulate, rows, cols);
    return data ? MP_OK : mp_layer_input_grad_done(m, l, 0, &dx, direct);
}

static mp_status layer_norm_to_json(const mp_layer *l, json_t *o)
{
    const layer_norm_config *c = l->config;
    json_object_set_new(o, "epsilon", json_real(c->epsilon));
    return MP_OK;
}

static mp_status layer_norm_from_json(const json_t *o, void *config)
{
    layer_norm_config *c = config;
    return mp_json_float_field(o, "epsilon", 0.0, true, 1.0, &c->epsilon);
}

const mp_layer_ops mp_layer_norm_ops = {
    .class_name = "LayerNormalization",
    .base_name = "layer_normalization",
    .min_inputs = 1,
    .max_inputs = 1,
    .config_size = sizeof(layer_norm_config),
    .state_size = sizeof(layer_norm_state),
    .fields = (const char *const[]){"epsilon", NULL},
    .build = layer_norm_build,
    .forward = layer_norm_forward,
    .backward = layer_norm_backward,
    .saved_bytes = layer_norm_saved_bytes,
    .to_json = layer_norm_to_json,
    .from_json = layer_norm_from_json,
    .output_use = layer_norm_output_use,
};

mp_node mp_layer_norm(mp_model *m, mp_node x, float epsilon, const mp_layer_options *o)
{
    layer_norm_config c = {epsilon};
    return mp_layer_create(m, &mp_layer_norm_ops, &x, 1, &c, o);
}
