/* random_flip.c - RandomFlip, a Keras preprocessing layer for images
 * [batch, height, width, channels] that acts only in training. There each
 * sample is mirrored left-right ("horizontal", the default), top-bottom
 * ("vertical"), or along each axis independently ("horizontal_and_vertical"),
 * with probability 1/2 per axis. Outside training it is the identity: a view
 * of the input, or one cast copy when the input is user data or in another
 * dtype.
 *
 * The decisions are a counter-based hash of (layer seed, training forward
 * count, sample, axis), so a resumed run (whose checkpoint restores the
 * count) draws the same ones; they are kept as int32 in the activation arena
 * for backward, which flips the gradient back the same way (a flip is its
 * own inverse). Values are only moved, never rounded: the output is the
 * compute-dtype input, bit for bit, rearranged. */
#include <string.h>

#include "nn/layer.h"

typedef struct {
    mp_flip_mode mode;
} random_flip_config;

typedef struct {
    int32_t *flips; /* [batch][2] (vertical, horizontal) of the last training forward, else NULL */
} random_flip_state;

/* Keeps these draws apart from other kinds' streams under the same seed. */
#define FLIP_STREAM 0x52414E44464C4950ull

static const char *const mode_names[] = {NULL, "horizontal", "vertical", "horizontal_and_vertical"};

static bool mode_valid(mp_flip_mode mode)
{
    return mode == MP_FLIP_HORIZONTAL || mode == MP_FLIP_VERTICAL ||
           mode == MP_FLIP_HORIZONTAL_AND_VERTICAL;
}

static mp_status random_flip_build(mp_model *m, mp_layer *l)
{
    (void)m;
    const random_flip_config *c = l->config;
    char s[96];
    if (l->ndim != 3)
        return mp_set_error(MP_ERR_INVALID,
                            "random_flip '%s': input %s is not an image [batch, height, width, "
                            "channels]",
                            l->name, mp_shape_str(l->ndim, l->shape, s, sizeof s));
    if (!mode_valid(c->mode))
        return mp_set_error(MP_ERR_INVALID,
                            "random_flip '%s': mode %d is not horizontal, vertical or "
                            "horizontal_and_vertical",
                            l->name, (int)c->mode);
    return MP_OK;
}

/* A training forward takes its output and the decisions; outside training
 * it takes at most a cast copy of the input, which is no more. */
static size_t random_flip_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch)
{
    (void)m;
    size_t n = (size_t)layer_numel(l, batch);
    return arena_bytes(n * mp_dtype_size(l->policy.compute)) +
           arena_bytes((size_t)batch * 2 * sizeof(int32_t));
}

/* dst = src with sample n flipped as flips[n] says; the map is its own
 * inverse, so backward runs it on the gradient. pix: bytes per pixel. */
static void flip_move(char *dst, const char *src, const int32_t *flips, int64_t batch, int64_t h,
                      int64_t w, size_t pix)
{
    size_t row = (size_t)w * pix, img = (size_t)h * row;
    for (int64_t n = 0; n < batch; n++) {
        bool fv = flips[2 * n], fh = flips[2 * n + 1];
        for (int64_t i = 0; i < h; i++) {
            const char *s = src + (size_t)n * img + (size_t)(fv ? h - 1 - i : i) * row;
            char *d = dst + (size_t)n * img + (size_t)i * row;
            if (!fh) {
                memcpy(d, s, row);
                continue;
            }
            for (int64_t j = 0; j < w; j++)
                memcpy(d + (size_t)j * pix, s + (size_t)(w - 1 - j) * pix, pix);
        }
    }
}

static mp_status random_flip_forward(mp_model *m, mp_layer *l, bool training)
{
    const random_flip_config *c = l->config;
    random_flip_state *st = l->state;
    mp_dtype ct = l->policy.compute;
    st->flips = NULL;
    if (!training) /* the identity: a view, or a copy kept as the output */
        return mp_layer_input_compute(m, l, 0, true, &l->out) ? MP_ERR_NOMEM : MP_OK;
    mp_tensor x;
    if (mp_layer_input_compute(m, l, 0, false, &x)) return MP_ERR_NOMEM;
    if (mp_layer_alloc(m, l, m->act, ct, &l->out)) return mp_layer_nomem(l, "its output");
    int64_t batch = m->batch;
    st->flips = mp_arena_alloc(m->act, (size_t)batch * 2 * sizeof(int32_t));
    if (!st->flips) return mp_layer_nomem(l, "its flip decisions");
    /* one 64-bit draw per (sample, axis); its top bit decides */
    uint64_t key = mp_mix64(l->seed ^ mp_mix64((m->step + 1) ^ FLIP_STREAM));
    for (int64_t n = 0; n < batch; n++)
        for (int a = 0; a < 2; a++) {
            bool on = c->mode & (a ? MP_FLIP_HORIZONTAL : MP_FLIP_VERTICAL);
            uint64_t g = (uint64_t)(m->row_offset + n); /* the global row */
            uint64_t z = mp_mix64(key + 0x9E3779B97F4A7C15ull * (2 * g + (uint64_t)a + 1));
            st->flips[2 * n + a] = on && (z >> 63);
        }
    flip_move(l->out.data, x.data, st->flips, batch, l->shape[0], l->shape[1],
              (size_t)l->shape[2] * mp_dtype_size(ct));
    return MP_OK;
}

static mp_status random_flip_backward(mp_model *m, mp_layer *l, bool accumulate)
{
    (void)accumulate;
    const random_flip_state *st = l->state;
    const mp_tensor *g = &l->grad;
    if (mp_layer_input_is_data(m, l, 0)) return MP_OK;
    if (!st->flips) return mp_layer_pass_grad(m, l, 0, g);
    mp_tensor dx;
    bool direct;
    if (mp_layer_input_grad(m, l, 0, &dx, &direct)) return MP_ERR_NOMEM;
    if (g->dtype != dx.dtype) /* both are the compute dtype by construction */
        return mp_set_error(MP_ERR_INVALID, "random_flip '%s': gradient in %s, want %s", l->name,
                            mp_dtype_name(g->dtype), mp_dtype_name(dx.dtype));
    flip_move(dx.data, g->data, st->flips, m->batch, l->shape[0], l->shape[1],
              (size_t)l->shape[2] * mp_dtype_size(dx.dtype));
    return mp_layer_input_grad_done(m, l, 0, &dx, direct);
}

static mp_status random_flip_to_json(const mp_layer *l, json_t *o)
{
    const random_flip_config *c = l->config;
    json_object_set_new(o, "mode", json_string(mode_names[c->mode]));
    return MP_OK;
}

/* "mode" is optional (absent: horizontal). */
static mp_status random_flip_from_json(const json_t *o, void *config)
{
    random_flip_config *c = config;
    c->mode = MP_FLIP_HORIZONTAL;
    const json_t *v = json_object_get(o, "mode");
    if (!v) return MP_OK;
    const char *name = json_string_value(v);
    for (int k = MP_FLIP_HORIZONTAL; name && k <= MP_FLIP_HORIZONTAL_AND_VERTICAL; k++)
        if (!strcmp(name, mode_names[k])) {
            c->mode = (mp_flip_mode)k;
            return MP_OK;
        }
    return mp_set_error(MP_ERR_FORMAT, "'mode' must be \"horizontal\", \"vertical\" or "
                                       "\"horizontal_and_vertical\"");
}

const mp_layer_ops mp_random_flip_ops = {
    .class_name = "RandomFlip",
    .base_name = "random_flip",
    .min_inputs = 1,
    .max_inputs = 1,
    .config_size = sizeof(random_flip_config),
    .state_size = sizeof(random_flip_state),
    .fields = (const char *const[]){"mode", NULL},
    .build = random_flip_build,
    .forward = random_flip_forward,
    .backward = random_flip_backward,
    .saved_bytes = random_flip_saved_bytes,
    .to_json = random_flip_to_json,
    .from_json = random_flip_from_json,
};

mp_node mp_random_flip(mp_model *m, mp_node x, mp_flip_mode mode, const mp_layer_options *o)
{
    random_flip_config c = {mode};
    return mp_layer_create(m, &mp_random_flip_ops, &x, 1, &c, o);
}
