/* random_translation.c - RandomTranslation, a Keras preprocessing layer for
 * images [batch, height, width, channels] that acts only in training. There
 * each sample is shifted by dy rows and dx columns, drawn uniformly as Keras
 * draws them (dy / height in [-height_factor, height_factor), dx / width in
 * [-width_factor, width_factor)) and rounded to whole pixels (half away from
 * zero):
 *   y[n, i, j, :] = x[n, i - dy, j - dx, :], 0 where that lies outside,
 * so positive shifts move the content down and right (Keras's sign). The
 * fill is "constant" with fill_value 0, the only one this build has;
 * whole-pixel shifts make the interpolation "nearest". Outside training it
 * is the identity: a view of the input, or one cast copy when the input is
 * user data or in another dtype.
 *
 * The shifts are a counter-based hash of (layer seed, training forward
 * count, sample, axis), so a resumed run (whose checkpoint restores the
 * count) draws the same; they are kept as int32 in the activation arena for
 * backward, which shifts the gradient back (the transpose: zeros for input
 * pixels the forward shifted out). Values are only moved, never rounded. */
#include <math.h>
#include <string.h>

#include "nn/layer.h"

typedef struct {
    float height_factor; /* [0, 1) */
    float width_factor;  /* [0, 1) */
} random_translation_config;

typedef struct {
    int32_t *shifts; /* [batch][2] (dy, dx) of the last training forward, else NULL */
} random_translation_state;

/* Keeps these draws apart from other kinds' streams under the same seed. */
#define TRANSLATION_STREAM 0x52414E445452414Eull

static bool factor_valid(float f) { return f >= 0.0f && f < 1.0f; }

static mp_status random_translation_build(mp_model *m, mp_layer *l)
{
    (void)m;
    const random_translation_config *c = l->config;
    char s[96];
    if (l->ndim != 3)
        return mp_set_error(MP_ERR_INVALID,
                            "random_translation '%s': input %s is not an image [batch, height, "
                            "width, channels]",
                            l->name, mp_shape_str(l->ndim, l->shape, s, sizeof s));
    if (l->shape[0] > INT32_MAX || l->shape[1] > INT32_MAX) /* shifts are int32 */
        return mp_set_error(MP_ERR_INVALID, "random_translation '%s': image %s is too large",
                            l->name, mp_shape_str(l->ndim, l->shape, s, sizeof s));
    if (!factor_valid(c->height_factor))
        return mp_set_error(MP_ERR_INVALID,
                            "random_translation '%s': height_factor %g outside [0, 1)", l->name,
                            (double)c->height_factor);
    if (!factor_valid(c->width_factor))
        return mp_set_error(MP_ERR_INVALID,
                            "random_translation '%s': width_factor %g outside [0, 1)", l->name,
                            (double)c->width_factor);
    return MP_OK;
}

/* A training forward takes its output and the shifts; outside training it
 * takes at most a cast copy of the input, which is no more. */
static size_t random_translation_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    (void)m;
    size_t n = (size_t)layer_numel(l, batch);
    return arena_bytes(n * mp_dtype_size(l->policy.compute)) +
           arena_bytes((size_t)batch * 2 * sizeof(int32_t));
}

/* The shift along one axis of `size` pixels for draw z: factor * size *
 * (2r - 1), r = 53 bits of z in [0, 1), rounded half away from zero; its
 * magnitude is at most size. */
static int32_t shift_of(uint64_t z, float factor, int64_t size)
{
    double r = (double)(z >> 11) * 0x1p-53;
    return (int32_t)llround((double)factor * (2.0 * r - 1.0) * (double)size);
}

/* dst[n] = src[n] moved by (dy, dx) = sign * shifts[n]:
 * dst[i][j] = src[i - dy][j - dx], zero bits (+0) outside. sign -1 is the
 * transpose of sign +1 (backward). pix: bytes per pixel. */
static void shift_move(char *dst, const char *src, const int32_t *shifts, int sign, int64_t batch,
                       int64_t h, int64_t w, size_t pix)
{
    size_t row = (size_t)w * pix, img = (size_t)h * row;
    for (int64_t n = 0; n < batch; n++) {
        int64_t dy = sign * (int64_t)shifts[2 * n], dx = sign * (int64_t)shifts[2 * n + 1];
        /* the columns j with 0 <= j - dx < w */
        int64_t j0 = dx > 0 ? dx : 0, j1 = dx < 0 ? w + dx : w;
        if (j1 < j0) j1 = j0;
        for (int64_t i = 0; i < h; i++) {
            char *d = dst + (size_t)n * img + (size_t)i * row;
            int64_t si = i - dy;
            if (si < 0 || si >= h || j1 == j0) {
                memset(d, 0, row);
                continue;
            }
            const char *s = src + (size_t)n * img + (size_t)si * row;
            memset(d, 0, (size_t)j0 * pix);
            memcpy(d + (size_t)j0 * pix, s + (size_t)(j0 - dx) * pix, (size_t)(j1 - j0) * pix);
            memset(d + (size_t)j1 * pix, 0, (size_t)(w - j1) * pix);
        }
    }
}

static mp_status random_translation_forward(mp_model *m, mp_layer *l, bool training)
{
    const random_translation_config *c = l->config;
    random_translation_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    st->shifts = NULL;
    if (!training) /* the identity: a view, or a copy kept as the output */
        return mp_layer_input_compute(m, l, 0, true, &l->out) ? MP_ERR_NOMEM : MP_OK;
    mp_tensor x;
    if (mp_layer_input_compute(m, l, 0, false, &x)) return MP_ERR_NOMEM;
    if (mp_layer_alloc(m, l, m->act, ct, &l->out)) return mp_layer_nomem(l, "its output");
    int64_t batch = m->batch;
    st->shifts = mp_arena_alloc(m->act, (size_t)batch * 2 * sizeof(int32_t));
    if (!st->shifts) return mp_layer_nomem(l, "its shifts");
    uint64_t key = mp_mix64(l->seed ^ mp_mix64((m->step + 1) ^ TRANSLATION_STREAM));
    for (int64_t n = 0; n < batch; n++) {
        uint64_t g = (uint64_t)(m->row_offset + n); /* the global row */
        uint64_t zy = mp_mix64(key + 0x9E3779B97F4A7C15ull * (2 * g + 1));
        uint64_t zx = mp_mix64(key + 0x9E3779B97F4A7C15ull * (2 * g + 2));
        st->shifts[2 * n] = shift_of(zy, c->height_factor, l->shape[0]);
        st->shifts[2 * n + 1] = shift_of(zx, c->width_factor, l->shape[1]);
    }
    shift_move(l->out.data, x.data, st->shifts, 1, batch, l->shape[0], l->shape[1],
               (size_t)l->shape[2] * mp_dtype_size(ct));
    return MP_OK;
}

static mp_status random_translation_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    (void)accumulate;
    const random_translation_state *st = l->state;
    const mp_tensor *g = &l->grad;
    if (mp_layer_input_is_data(m, l, 0)) return MP_OK;
    if (!st->shifts) return mp_layer_pass_grad(m, l, 0, g);
    mp_tensor dx;
    bool direct;
    if (mp_layer_input_grad(m, l, 0, &dx, &direct)) return MP_ERR_NOMEM;
    if (g->dtype != dx.dtype) /* both are the compute dtype by construction */
        return mp_set_error(MP_ERR_INVALID, "random_translation '%s': gradient in %s, want %s",
                            l->name, mp_dtype_name(g->dtype), mp_dtype_name(dx.dtype));
    shift_move(dx.data, g->data, st->shifts, -1, m->batch, l->shape[0], l->shape[1],
               (size_t)l->shape[2] * mp_dtype_size(dx.dtype));
    return mp_layer_input_grad_done(m, l, 0, &dx, direct);
}

static mp_status random_translation_to_json(const mp_layer *l, json_t *o)
{
    const random_translation_config *c = l->config;
    json_object_set_new(o, "height_factor", json_real(c->height_factor));
    json_object_set_new(o, "width_factor", json_real(c->width_factor));
    json_object_set_new(o, "fill_mode", json_string("constant"));
    json_object_set_new(o, "fill_value", json_real(0.0));
    json_object_set_new(o, "interpolation", json_string("nearest"));
    return MP_OK;
}

static mp_status factor_field(const json_t *o, const char *key, float *out)
{
    mp_status s = mp_json_float_field(o, key, 0.0, false, 1.0, out);
    if (!s && *out == 1.0f) /* 1 excluded (also what rounds up to it) */
        s = mp_set_error(MP_ERR_FORMAT, "'%s' must be a number in [0, 1)", key);
    return s;
}

/* The factors are required (as in Keras); fill_mode, fill_value and
 * interpolation are optional and, when present, must name what this build
 * does: "constant", 0, "nearest". */
static mp_status random_translation_from_json(const json_t *o, void *config)
{
    random_translation_config *c = config;
    mp_status s = factor_field(o, "height_factor", &c->height_factor);
    if (!s) s = factor_field(o, "width_factor", &c->width_factor);
    if (s) return s;
    const json_t *v = json_object_get(o, "fill_mode");
    if (v && (!json_is_string(v) || strcmp(json_string_value(v), "constant")))
        return mp_set_error(MP_ERR_FORMAT,
                            "'fill_mode' must be \"constant\" (the only fill this build has)");
    v = json_object_get(o, "fill_value");
    if (v && !(json_is_number(v) && json_number_value(v) == 0.0))
        return mp_set_error(MP_ERR_FORMAT, "'fill_value' must be 0 (the only fill this build has)");
    v = json_object_get(o, "interpolation");
    if (v && (!json_is_string(v) || strcmp(json_string_value(v), "nearest")))
        return mp_set_error(MP_ERR_FORMAT,
                            "'interpolation' must be \"nearest\" (shifts are whole pixels)");
    return MP_OK;
}

const mp_layer_ops mp_random_translation_ops = {
    .class_name = "RandomTranslation",
    .base_name = "random_translation",
    .min_inputs = 1,
    .max_inputs = 1,
    .config_size = sizeof(random_translation_config),
    .state_size = sizeof(random_translation_state),
    .fields = (const char *const[]){"height_factor", "width_factor", "fill_mode", "fill_value",
                                    "interpolation", NULL},
    .build = random_translation_build,
    .forward = random_translation_forward,
    .backward = random_translation_backward,
    .saved_bytes = random_translation_saved_bytes,
    .to_json = random_translation_to_json,
    .from_json = random_translation_from_json,
};

mp_node mp_random_translation(mp_model *m, mp_node x, float height_factor, float width_factor,
                              const mp_layer_options *o)
{
    random_translation_config c = {height_factor, width_factor};
    return mp_layer_create(m, &mp_random_translation_ops, &x, 1, &c, o);
}
