/* zero_padding.c - ZeroPadding2D (Keras, channels-last): rows of zeros above
 * and below and columns left and right of every image, [batch, h, w, c] ->
 * [batch, top + h + bottom, left + w + right, c] in the compute dtype. Only
 * bytes move (zero is all-zero bits in every float format); backward crops
 * the gradient back to the image. The padding setting takes Keras's forms:
 * an int (all four sides), a pair (vertical, horizontal) or a pair of pairs
 * ((top, bottom), (left, right)). */
#include <string.h>

#include "nn/layers/spatial.h"

typedef struct {
    int64_t pad[4]; /* top, bottom, left, right */
} zero_padding_config;

static mp_status zero_padding_build(mp_model *m, mp_layer *l)
{
    (void)m;
    const zero_padding_config *c = l->config;
    mp_status s = mp_spatial_input(l);
    if (s) return s;
    for (int i = 0; i < 4; i++)
        if (c->pad[i] < 0 || c->pad[i] > MP_SPATIAL_MAX)
            return mp_set_error(MP_ERR_INVALID,
                                "zero_padding2d '%s': padding ((%lld, %lld), (%lld, %lld)) "
                                "(each in 0..%lld)",
                                l->name, (long long)c->pad[0], (long long)c->pad[1],
                                (long long)c->pad[2], (long long)c->pad[3],
                                (long long)MP_SPATIAL_MAX);
    const int64_t h = l->shape[0] + c->pad[0] + c->pad[1], w = l->shape[1] + c->pad[2] + c->pad[3];
    if (h > ((int64_t)1 << 40) / w / l->shape[2])
        return mp_set_error(MP_ERR_INVALID,
                            "zero_padding2d '%s': more than 2^40 output elements per sample",
                            l->name);
    l->shape[0] = h;
    l->shape[1] = w;
    return MP_OK;
}

static size_t zero_padding_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    (void)m;
    return arena_bytes((size_t)layer_numel(l, batch) * mp_dtype_size(l->policy.compute));
}

/* Copy the image rows between x [n, h, w, c] and its padded frame y [n, H,
 * W, c] at (top, left): into the frame (zeroing the rest) when pad, else out
 * of it. es: bytes per element. */
static void frame_copy(char *x, char *y, int64_t n, int64_t h, int64_t w, int64_t c, int64_t H,
                       int64_t W, int64_t top, int64_t left, size_t es, bool pad)
{
    const size_t row = (size_t)(w * c) * es, frow = (size_t)(W * c) * es;
    const int64_t rows = n * H;
#pragma omp parallel for schedule(static) if (rows * W * c > (1 << 16))
    for (int64_t r = 0; r < rows; r++) {
        const int64_t b = r / H, i = r % H - top;
        char *yr = y + (size_t)r * frow;
        if (i < 0 || i >= h) {
            if (pad) memset(yr, 0, frow);
            continue;
        }
        char *xr = x + (size_t)(b * h + i) * row, *at = yr + (size_t)(left * c) * es;
        if (!pad) {
            memcpy(xr, at, row);
            continue;
        }
        memset(yr, 0, (size_t)(left * c) * es);
        memcpy(at, xr, row);
        memset(at + row, 0, frow - row - (size_t)(left * c) * es);
    }
}

static mp_status zero_padding_forward(mp_model *m, mp_layer *l, bool training)
{
    (void)training;
    const zero_padding_config *c = l->config;
    const mp_layer *src = mp_layer_csrc(m, l, 0);
    mp_tensor x;
    if (mp_layer_input_compute(m, l, 0, false, &x)) return MP_ERR_NOMEM;
    if (mp_layer_alloc(m, l, m->act, l->policy.compute, &l->out))
        return mp_layer_nomem(l, "its output");
    frame_copy(x.data, l->out.data, m->batch, src->shape[0], src->shape[1], src->shape[2],
               l->shape[0], l->shape[1], c->pad[0], c->pad[2], mp_dtype_size(l->policy.compute),
               true);
    return MP_OK;
}

static mp_status zero_padding_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    (void)accumulate;
    const zero_padding_config *c = l->config;
    const mp_layer *src = mp_layer_csrc(m, l, 0);
    if (mp_layer_input_is_data(m, l, 0)) return MP_OK;
    mp_tensor dx;
    bool direct;
    if (mp_layer_input_grad(m, l, 0, &dx, &direct)) return MP_ERR_NOMEM;
    /* the gradient of l's output is in its dtype, which is the compute
     * dtype dx has */
    frame_copy(dx.data, l->grad.data, m->batch, src->shape[0], src->shape[1], src->shape[2],
               l->shape[0], l->shape[1], c->pad[0], c->pad[2], mp_dtype_size(dx.dtype), false);
    return mp_layer_input_grad_done(m, l, 0, &dx, direct);
}

/* ------------------------------------------------------------------- JSON */

static mp_status zero_padding_to_json(const mp_layer *l, json_t *o)
{
    const zero_padding_config *c = l->config;
    json_t *p = json_array();
    json_array_append_new(p, mp_json_pair(c->pad));
    json_array_append_new(p, mp_json_pair(c->pad + 2));
    json_object_set_new(o, "padding", p);
    return MP_OK;
}

/* One axis's padding: an integer for both sides or a pair, each in
 * 0..MP_SPATIAL_MAX. */
static bool axis_padding(const json_t *v, int64_t out[2])
{
    const json_t *e[2] = {v, v};
    if (json_is_array(v)) {
        if (json_array_size(v) != 2) return false;
        e[0] = json_array_get(v, 0);
        e[1] = json_array_get(v, 1);
    }
    for (int i = 0; i < 2; i++) {
        if (!json_is_integer(e[i])) return false;
        out[i] = json_integer_value(e[i]);
        if (out[i] < 0 || out[i] > MP_SPATIAL_MAX) return false;
    }
    return true;
}

/* "padding": n, [v, h] or [[top, bottom], [left, right]] (each entry of
 * the list an integer or a pair, as Keras reads it); absent: 1, Keras's
 * default. */
static mp_status zero_padding_from_json(const json_t *o, void *config)
{
    zero_padding_config *c = config;
    const json_t *p = json_object_get(o, "padding");
    for (int i = 0; i < 4; i++) c->pad[i] = 1;
    if (!p) return MP_OK;
    bool ok = json_is_integer(p) ? axis_padding(p, c->pad) && axis_padding(p, c->pad + 2)
                                 : json_is_array(p) && json_array_size(p) == 2 &&
                                       axis_padding(json_array_get(p, 0), c->pad) &&
                                       axis_padding(json_array_get(p, 1), c->pad + 2);
    if (!ok)
        return mp_set_error(MP_ERR_FORMAT,
                            "'padding' must be an integer, a list of two or a list of two "
                            "pairs, each in 0..%lld",
                            (long long)MP_SPATIAL_MAX);
    return MP_OK;
}

const mp_layer_ops mp_zero_padding2d_ops = {
    .class_name = "ZeroPadding2D",
    .base_name = "zero_padding2d",
    .min_inputs = 1,
    .max_inputs = 1,
    .config_size = sizeof(zero_padding_config),
    .fields = (const char *const[]){"padding", NULL},
    .build = zero_padding_build,
    .forward = zero_padding_forward,
    .backward = zero_padding_backward,
    .saved_bytes = zero_padding_saved_bytes,
    .to_json = zero_padding_to_json,
    .from_json = zero_padding_from_json,
};

mp_node mp_zero_padding2d(mp_model *m, mp_node x, int64_t top, int64_t bottom, int64_t left,
                          int64_t right, const mp_layer_options *o)
{
    zero_padding_config c = {{top, bottom, left, right}};
    return mp_layer_create(m, &mp_zero_padding2d_ops, &x, 1, &c, o);
}
