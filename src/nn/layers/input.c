/* input.c - InputLayer: where data enters the model. Float data (any float
 * dtype, declared float32 as Keras keeps inputs) or int32 (token ids, class
 * indices) that only integer-reading layers accept. Its output is a view of
 * the caller's tensor; it takes no gradient. */
#include <string.h>

#include "nn/layer.h"

typedef struct {
    int ndim;
    int64_t shape[MP_MAX_DIMS];
    mp_dtype dtype;
} input_config;

static mp_status input_build(mp_model *m, mp_layer *l)
{
    (void)m;
    const input_config *c = l->config;
    if (c->ndim < 1 || c->ndim > MP_MAX_DIMS - 1)
        return mp_set_error(MP_ERR_INVALID, "input: %d dimensions (1..%d allowed)", c->ndim,
                            MP_MAX_DIMS - 1);
    int64_t n = 1;
    for (int i = 0; i < c->ndim; i++) {
        if (c->shape[i] < 1)
            return mp_set_error(MP_ERR_INVALID, "input: dimension %d is %lld (must be >= 1)", i,
                                (long long)c->shape[i]);
        if (n > ((int64_t)1 << 40) / c->shape[i]) /* batch * elements must stay addressable */
            return mp_set_error(MP_ERR_INVALID, "input: more than 2^40 elements per sample");
        n *= c->shape[i];
    }
    if (c->dtype != MP_F32 && c->dtype != MP_I32)
        return mp_set_error(MP_ERR_INVALID, "input '%s': dtype %s (float32 or int32 allowed)",
                            l->name, mp_dtype_name(c->dtype));
    l->ndim = c->ndim;
    memcpy(l->shape, c->shape, (size_t)c->ndim * sizeof *c->shape);
    l->out_dtype = c->dtype;
    return MP_OK;
}

static mp_status input_forward(mp_model *m, mp_layer *l, bool training)
{
    (void)training;
    l->out = *m->x;
    l->out.owns_data = false;
    return MP_OK;
}

static mp_status input_to_json(const mp_layer *l, json_t *o)
{
    const input_config *c = l->config;
    json_object_set_new(o, "shape", mp_json_shape(c->ndim, c->shape));
    json_object_set_new(o, "dtype", json_string(mp_dtype_name(c->dtype)));
    return MP_OK;
}

static mp_status input_from_json(const json_t *o, void *config)
{
    input_config *c = config;
    mp_status s = mp_json_shape_field(o, "shape", 1, MP_CONFIG_MAX_WIDTH, &c->ndim, c->shape);
    if (s) return s;
    int64_t width = 1;
    for (int d = 0; d < c->ndim; d++)
        if ((width *= c->shape[d]) > MP_CONFIG_MAX_WIDTH)
            return mp_set_error(MP_ERR_FORMAT, "'shape' has more than %lld elements",
                                (long long)MP_CONFIG_MAX_WIDTH);
    c->dtype = MP_F32;
    const json_t *dt = json_object_get(o, "dtype");
    if (dt && (!json_string_value(dt) || mp_dtype_from_name(json_string_value(dt), &c->dtype) ||
               (c->dtype != MP_F32 && c->dtype != MP_I32)))
        return mp_set_error(MP_ERR_FORMAT, "'dtype' must be \"float32\" or \"int32\"");
    return MP_OK;
}

const mp_layer_ops mp_input_ops = {
    .class_name = "InputLayer",
    .base_name = "input",
    .min_inputs = 0,
    .max_inputs = 0,
    .config_size = sizeof(input_config),
    .fields = (const char *const[]){"shape", "dtype", NULL},
    .build = input_build,
    .forward = input_forward,
    .to_json = input_to_json,
    .from_json = input_from_json,
};

mp_node mp_input_ex(mp_model *m, int ndim, const int64_t *shape, mp_dtype dtype,
                    const mp_layer_options *o)
{
    input_config c = {.ndim = ndim, .dtype = dtype};
    if (ndim >= 1 && ndim < MP_MAX_DIMS) memcpy(c.shape, shape, (size_t)ndim * sizeof *shape);
    return mp_layer_create(m, &mp_input_ops, NULL, 0, &c, o);
}

mp_node mp_input(mp_model *m, int ndim, const int64_t *shape, const mp_layer_options *o)
{
    return mp_input_ex(m, ndim, shape, MP_F32, o);
}
