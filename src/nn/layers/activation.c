/* activation.c - Activation: an elementwise function, or softmax over the
 * last axis (computed in float32). Also the activation names every layer
 * uses. A softmax that ends the model keeps its logits for the fused
 * softmax + cross-entropy of mp_model_loss_backward. */
#include <string.h>

#include "kernels/ops.h"
#include "nn/layer.h"

typedef struct {
    mp_activation act;
} activation_config;

typedef struct {
    mp_tensor in; /* input kept for backward (or the logits) */
} activation_state;

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

static bool keeps_input(const mp_model *m, const mp_layer *l)
{
    const activation_config *c = l->config;
    return mp_op_activation_grad_needs_input(c->act) ||
           (c->act == MP_ACT_SOFTMAX && mp_layer_is_output(m, l));
}

static mp_status activation_build(mp_model *m, mp_layer *l)
{
    (void)m;
    const activation_config *c = l->config;
    if ((unsigned)c->act > MP_ACT_SOFTMAX)
        return mp_set_error(MP_ERR_INVALID, "activation '%s': unknown activation %d", l->name,
                            (int)c->act);
    return MP_OK;
}

/* A relu and nothing else: its producer may fuse it (mp_layer.relu_fused). */
static bool activation_is_relu(const mp_layer *l)
{
    const activation_config *c = l->config;
    return c->act == MP_ACT_RELU;
}

static size_t activation_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    if (l->relu_view) return 0; /* a view of the producer's rectified result */
    size_t out = arena_bytes((size_t)layer_numel(l, batch) * mp_dtype_size(l->policy.compute));
    return out + (keeps_input(m, l) ? mp_layer_kept_input_bytes(m, l, 0, batch) : 0);
}

static mp_status activation_forward(mp_model *m, mp_layer *l, bool training)
{
    (void)training;
    const activation_config *c = l->config;
    activation_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    if (l->relu_view) { /* the producer rectified it already */
        l->out = mp_layer_csrc(m, l, 0)->out;
        l->out.owns_data = false;
        return MP_OK;
    }
    mp_tensor x;
    bool keep = keeps_input(m, l);
    if (mp_layer_input_compute(m, l, 0, keep, &x)) return MP_ERR_NOMEM;
    if (keep) st->in = x;
    if (mp_layer_alloc(m, l, m->act, ct, &l->out)) return mp_layer_nomem(l, "its output");
    int64_t cols = layer_cols(l), n = mp_tensor_numel(&l->out);
    if (c->act == MP_ACT_SOFTMAX)
        mp_op_softmax(x.data, ct, l->out.data, ct, n / cols, cols);
    else
        mp_op_activation(c->act, x.data, ct, l->out.data, ct, (size_t)n);
    return MP_OK;
}

static mp_status activation_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    (void)accumulate;
    const activation_config *c = l->config;
    const activation_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    const mp_tensor *g = &l->grad;
    if (mp_layer_input_is_data(m, l, 0)) return MP_OK;
    if (c->act == MP_ACT_NONE || l->relu_view) return mp_layer_pass_grad(m, l, 0, g);
    mp_tensor dx;
    bool direct;
    if (mp_layer_input_grad(m, l, 0, &dx, &direct)) return MP_ERR_NOMEM;
    int64_t cols = layer_cols(l), n = mp_tensor_numel(&l->out);
    if (c->act == MP_ACT_SOFTMAX) {
        mp_op_softmax_grad(l->out.data, ct, g->data, g->dtype, dx.data, ct, n / cols, cols);
    } else {
        const mp_tensor *saved = mp_op_activation_grad_needs_input(c->act) ? &st->in : &l->out;
        mp_op_activation_grad(c->act, saved->data, ct, g->data, g->dtype, dx.data, ct, (size_t)n);
    }
    return mp_layer_input_grad_done(m, l, 0, &dx, direct);
}

static const mp_tensor *activation_logits(const mp_model *m, const mp_layer *l)
{
    const activation_config *c = l->config;
    const activation_state *st = l->state;
    return c->act == MP_ACT_SOFTMAX && mp_layer_is_output(m, l) ? &st->in : NULL;
}

static mp_status activation_to_json(const mp_layer *l, json_t *o)
{
    const activation_config *c = l->config;
    json_object_set_new(o, "activation", json_string(mp_activation_name(c->act)));
    return MP_OK;
}

static mp_status activation_from_json(const json_t *o, void *config)
{
    activation_config *c = config;
    return mp_json_activation_field(o, "activation", &c->act);
}

const mp_layer_ops mp_activation_ops = {
    .class_name = "Activation",
    .base_name = "activation",
    .min_inputs = 1,
    .max_inputs = 1,
    .config_size = sizeof(activation_config),
    .state_size = sizeof(activation_state),
    .fields = (const char *const[]){"activation", NULL},
    .build = activation_build,
    .forward = activation_forward,
    .backward = activation_backward,
    .saved_bytes = activation_saved_bytes,
    .to_json = activation_to_json,
    .from_json = activation_from_json,
    .softmax_logits = activation_logits,
    .is_relu = activation_is_relu,
};

mp_node mp_activation_layer(mp_model *m, mp_node x, mp_activation act, const mp_layer_options *o)
{
    activation_config c = {act};
    return mp_layer_create(m, &mp_activation_ops, &x, 1, &c, o);
}
