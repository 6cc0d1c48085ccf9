/* spatial.c - the checks and JSON readers the 2-D image layers share (see
 * spatial.h): a channels-last input, Keras's window geometry, and the
 * settings Keras writes as int pairs ("kernel_size": [3, 3]), padding
 * names and booleans. */
#include <string.h>

#include "nn/layers/spatial.h"

mp_status mp_spatial_input(const mp_layer *l)
{
    char s[96];
    if (l->ndim != 3)
        return mp_set_error(
            MP_ERR_INVALID, "%s '%s': input %s must be 4-D [batch, height, width, channels]",
            l->ops->base_name, l->name, mp_shape_str(l->ndim, l->shape, s, sizeof s));
    return MP_OK;
}

mp_status mp_spatial_check(const mp_layer *l, const char *what, const int64_t window[2],
                           const int64_t strides[2], const int64_t dilation[2], mp_padding padding)
{
    const char *kind = l->ops->base_name;
    const struct {
        const char *name;
        const int64_t *v;
    } pairs[3] = {{what, window}, {"strides", strides}, {"dilation_rate", dilation}};
    for (int i = 0; i < 3; i++)
        if (pairs[i].v && (pairs[i].v[0] < 1 || pairs[i].v[1] < 1 ||
                           pairs[i].v[0] > MP_SPATIAL_MAX || pairs[i].v[1] > MP_SPATIAL_MAX))
            return mp_set_error(MP_ERR_INVALID, "%s '%s': %s %lldx%lld (each in 1..%lld)", kind,
                                l->name, pairs[i].name, (long long)pairs[i].v[0],
                                (long long)pairs[i].v[1], (long long)MP_SPATIAL_MAX);
    if (padding != MP_PADDING_VALID && padding != MP_PADDING_SAME)
        return mp_set_error(MP_ERR_INVALID, "%s '%s': padding %d (valid or same)", kind, l->name,
                            (int)padding);
    if (dilation && (strides[0] > 1 || strides[1] > 1) && (dilation[0] > 1 || dilation[1] > 1))
        return mp_set_error(MP_ERR_INVALID,
                            "%s '%s': strides %lldx%lld with dilation_rate %lldx%lld (Keras "
                            "allows strides > 1 or dilation > 1, not both)",
                            kind, l->name, (long long)strides[0], (long long)strides[1],
                            (long long)dilation[0], (long long)dilation[1]);
    return MP_OK;
}

mp_status mp_spatial_geom(const mp_layer *l, mp_conv_geom *g, const int64_t kernel[2],
                          const int64_t strides[2], const int64_t dilation[2], int64_t o,
                          mp_padding padding)
{
    char s[96];
    *g = (mp_conv_geom){.n = 1,
                        .h = l->shape[0],
                        .w = l->shape[1],
                        .c = l->shape[2],
                        .kh = kernel[0],
                        .kw = kernel[1],
                        .o = o,
                        .sh = strides[0],
                        .sw = strides[1],
                        .dh = dilation ? dilation[0] : 1,
                        .dw = dilation ? dilation[1] : 1};
    if (mp_conv_geom_init(g, padding == MP_PADDING_SAME))
        return mp_set_error(MP_ERR_INVALID, "%s '%s' on input %s, padding %s: %s",
                            l->ops->base_name, l->name,
                            mp_shape_str(l->ndim, l->shape, s, sizeof s), mp_padding_name(padding),
                            mp_last_error());
    if (g->oh > ((int64_t)1 << 40) / g->ow / g->o)
        return mp_set_error(MP_ERR_INVALID, "%s '%s': more than 2^40 output elements per sample",
                            l->ops->base_name, l->name);
    return MP_OK;
}

mp_status mp_spatial_activation(const mp_layer *l, mp_activation a)
{
    if ((unsigned)a < MP_ACT_SOFTMAX) return MP_OK;
    return mp_set_error(MP_ERR_INVALID,
                        "%s '%s': activation %s cannot be applied elementwise (softmax needs "
                        "its own Activation layer)",
                        l->ops->base_name, l->name, mp_activation_name(a));
}

/* ------------------------------------------------------------ JSON */

mp_status mp_json_pair_field(const json_t *o, const char *key, int64_t lo, int64_t hi,
                             int64_t out[2])
{
    const json_t *v = json_object_get(o, key);
    const json_t *e[2] = {v, v};
    if (json_is_array(v)) {
        e[0] = json_array_size(v) == 2 ? json_array_get(v, 0) : NULL;
        e[1] = json_array_size(v) == 2 ? json_array_get(v, 1) : NULL;
    }
    for (int i = 0; i < 2; i++)
        if (!json_is_integer(e[i]) || json_integer_value(e[i]) < lo ||
            json_integer_value(e[i]) > hi)
            return mp_set_error(MP_ERR_FORMAT,
                                "'%s' must be an integer or a list of two integers in %lld..%lld",
                                key, (long long)lo, (long long)hi);
    out[0] = json_integer_value(e[0]);
    out[1] = json_integer_value(e[1]);
    return MP_OK;
}

json_t *mp_json_pair(const int64_t v[2])
{
    json_t *a = json_array();
    json_array_append_new(a, json_integer(v[0]));
    json_array_append_new(a, json_integer(v[1]));
    return a;
}

const char *mp_padding_name(mp_padding p) { return p == MP_PADDING_SAME ? "same" : "valid"; }

mp_status mp_json_padding_field(const json_t *o, const char *key, mp_padding *out)
{
    const char *v = json_string_value(json_object_get(o, key));
    if (v && !strcmp(v, "valid")) {
        *out = MP_PADDING_VALID;
    } else if (v && !strcmp(v, "same")) {
        *out = MP_PADDING_SAME;
    } else {
        return mp_set_error(MP_ERR_FORMAT, "'%s' must be \"valid\" or \"same\"", key);
    }
    return MP_OK;
}

mp_status mp_json_pair_opt(const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t out[2])
{
    return json_object_get(o, key) ? mp_json_pair_field(o, key, lo, hi, out) : MP_OK;
}

mp_status mp_json_activation_opt(const json_t *o, const char *key, mp_activation *out)
{
    return json_object_get(o, key) ? mp_json_activation_field(o, key, out) : MP_OK;
}
