/* flatten.c - Flatten and Reshape: a new shape over the same elements. The
 * output is a view of the input (no data moves) unless the input is user
 * data (which may change before backward) or in another dtype, then one
 * cast copy. The gradient passes through unchanged. */
#include <string.h>

#include "nn/layer.h"

typedef struct {
    int ndim; /* 0: flatten */
    int64_t shape[MP_MAX_DIMS];
} reshape_config;

static bool copies(const mp_model *m, const mp_layer *l)
{
    return mp_layer_kept_input_bytes(m, l, 0, 1) != 0;
}

static size_t reshape_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    return copies(m, l) ? mp_layer_kept_input_bytes(m, l, 0, batch) : 0;
}

static mp_status flatten_build(mp_model *m, mp_layer *l)
{
    (void)m;
    int64_t n = layer_numel(l, 1);
    l->ndim = 1;
    l->shape[0] = n;
    return MP_OK;
}

static mp_status reshape_build(mp_model *m, mp_layer *l)
{
    (void)m;
    const reshape_config *c = l->config;
    char s1[96], s2[96];
    int64_t n = layer_numel(l, 1), known = 1;
    int infer = -1;
    if (c->ndim < 1 || c->ndim > MP_MAX_DIMS - 1)
        return mp_set_error(MP_ERR_INVALID, "reshape '%s': %d dimensions (1..%d allowed)", l->name,
                            c->ndim, MP_MAX_DIMS - 1);
    for (int d = 0; d < c->ndim; d++) {
        if (c->shape[d] == -1 && infer < 0) {
            infer = d;
        } else if (c->shape[d] < 1 || known > n / c->shape[d]) {
            return mp_set_error(MP_ERR_INVALID, "reshape '%s': target %s does not fit input %s",
                                l->name, mp_shape_str(c->ndim, c->shape, s1, sizeof s1),
                                mp_shape_str(l->ndim, l->shape, s2, sizeof s2));
        } else {
            known *= c->shape[d];
        }
    }
    if (infer >= 0 ? n % known != 0 : known != n)
        return mp_set_error(MP_ERR_INVALID, "reshape '%s': target %s does not fit input %s",
                            l->name, mp_shape_str(c->ndim, c->shape, s1, sizeof s1),
                            mp_shape_str(l->ndim, l->shape, s2, sizeof s2));
    l->ndim = c->ndim;
    memcpy(l->shape, c->shape, (size_t)c->ndim * sizeof *c->shape);
    if (infer >= 0) l->shape[infer] = n / known;
    return MP_OK;
}

static mp_status reshape_forward(mp_model *m, mp_layer *l, bool training)
{
    (void)training;
    mp_tensor x;
    if (copies(m, l)) {
        if (mp_layer_input_compute(m, l, 0, true, &x)) return MP_ERR_NOMEM;
    } else {
        x = mp_layer_src(m, l, 0)->out;
    }
    l->out = x;
    l->out.owns_data = false;
    l->out.ndim = l->ndim + 1;
    l->out.shape[0] = m->batch;
    memcpy(l->out.shape + 1, l->shape, (size_t)l->ndim * sizeof *l->shape);
    return MP_OK;
}

static mp_status reshape_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    (void)accumulate;
    return mp_layer_pass_grad(m, l, 0, &l->grad);
}

static mp_status reshape_to_json(const mp_layer *l, json_t *o)
{
    const reshape_config *c = l->config;
    json_object_set_new(o, "target_shape", mp_json_shape(c->ndim, c->shape));
    return MP_OK;
}

static mp_status reshape_from_json(const json_t *o, void *config)
{
    reshape_config *c = config;
    return mp_json_shape_field(o, "target_shape", -1, MP_CONFIG_MAX_WIDTH, &c->ndim, c->shape);
}

const mp_layer_ops mp_flatten_ops = {
    .class_name = "Flatten",
    .base_name = "flatten",
    .min_inputs = 1,
    .max_inputs = 1,
    .build = flatten_build,
    .forward = reshape_forward,
    .backward = reshape_backward,
    .saved_bytes = reshape_saved_bytes,
};

const mp_layer_ops mp_reshape_ops = {
    .class_name = "Reshape",
    .base_name = "reshape",
    .min_inputs = 1,
    .max_inputs = 1,
    .config_size = sizeof(reshape_config),
    .fields = (const char *const[]){"target_shape", NULL},
    .build = reshape_build,
    .forward = reshape_forward,
    .backward = reshape_backward,
    .saved_bytes = reshape_saved_bytes,
    .to_json = reshape_to_json,
    .from_json = reshape_from_json,
};

mp_node mp_flatten(mp_model *m, mp_node x, const mp_layer_options *o)
{
    return mp_layer_create(m, &mp_flatten_ops, &x, 1, NULL, o);
}

mp_node mp_reshape(mp_model *m, mp_node x, int ndim, const int64_t *shape,
                   const mp_layer_options *o)
{
    reshape_config c = {.ndim = ndim};
    if (ndim >= 1 && ndim < MP_MAX_DIMS) memcpy(c.shape, shape, (size_t)ndim * sizeof *shape);
    return mp_layer_create(m, &mp_reshape_ops, &x, 1, &c, o);
}
