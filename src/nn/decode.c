/* decode.c - incremental decoding for text generation: a model built for
 * one position per call keeps, in the layers that look across positions
 * (MultiHeadAttention), a cache of what earlier positions left (their keys
 * and values), so each new token costs one position instead of a rerun of
 * the whole prefix. Layers that treat positions alike need nothing; the
 * position-dependent ones read m->position. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "io/io_internal.h"
#include "nn/layer.h"

mp_status mp_model_decode_reset(mp_model *m, int64_t capacity)
{
    if (!m || !m->built) return mp_set_error(MP_ERR_INVALID, "decode: build the model first");
    if (capacity < 1)
        return mp_set_error(MP_ERR_INVALID, "decode: capacity %lld", (long long)capacity);
    for (int i = 0; i < m->nlayers; i++) {
        mp_layer *l = &m->layers[i];
        mp_status s =
            l->reachable && l->ops->decode_reset ? l->ops->decode_reset(m, l, capacity) : MP_OK;
        if (s) {
            m->decode_capacity = 0;
            return s;
        }
    }
    m->decode_capacity = capacity;
    m->position = 0;
    return MP_OK;
}

int64_t mp_model_decode_position(const mp_model *m) { return m ? m->position : 0; }

mp_status mp_model_decode_step(mp_model *m, const mp_tensor *x, const mp_tensor **y)
{
    if (!m || !m->decode_capacity)
        return mp_set_error(MP_ERR_INVALID, "decode: call mp_model_decode_reset first");
    int64_t in_shape[MP_MAX_DIMS];
    int nd = mp_model_input_shape(m, in_shape);
    int64_t t = nd ? in_shape[0] : 1;
    if (m->position + t > m->decode_capacity)
        return mp_set_error(MP_ERR_INVALID,
                            "decode: position %lld is past the context of %lld positions",
                            (long long)(m->position + t - 1), (long long)m->decode_capacity);
    mp_status s = mp_model_forward(m, x, false, y);
    if (s) return s;
    m->position += t;
    return MP_OK;
}

/* The configuration with its input's first dimension (the sequence) set to
 * `len`; *context receives the dimension it had. */
static mp_status with_sequence_length(const char *config, int64_t len, char **out, int64_t *context)
{
    json_error_t e;
    json_t *j = json_loads(config, JSON_REJECT_DUPLICATES, &e);
    if (!j) return mp_set_error(MP_ERR_FORMAT, "the model configuration: %s", e.text);
    json_t *layers = json_object_get(j, "layers"), *l;
    size_t i;
    mp_status s = mp_set_error(MP_ERR_FORMAT, "the model has no sequence input to decode");
    json_array_foreach(layers, i, l)
    {
        const char *cls = json_string_value(json_object_get(l, "class_name"));
        json_t *shape = json_object_get(l, "shape");
        if (!cls || strcmp(cls, "InputLayer") || !json_is_array(shape) ||
            json_array_size(shape) < 1 || !json_is_integer(json_array_get(shape, 0)))
            continue;
        *context = json_integer_value(json_array_get(shape, 0));
        json_array_set_new(shape, 0, json_integer(len));
        s = MP_OK;
        break;
    }
    *out = s ? NULL : json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s && !*out) s = mp_set_error(MP_ERR_NOMEM, "decode: out of memory");
    return s;
}

mp_status mp_model_decoder_from_checkpoint(const char *path, mp_model **out, int64_t *context)
{
    *out = NULL;
    mp_safetensors *f;
    mp_status s = mp_safetensors_read(path, &f);
    if (s) return s;
    const char *config = mp_safetensors_metadata(f, "mixprec.config");
    char *one = NULL;
    int64_t ctx = 0;
    mp_model *m = NULL;
    if (!config)
        s = mp_set_error(MP_ERR_FORMAT, "'%s' has no mixprec.config: not a mixprec model file",
                         path);
    else if ((s = with_sequence_length(config, 1, &one, &ctx)))
        s = mp_set_error(s, "'%s': %s", path, mp_last_error());
    else if ((s = mp_model_from_config(one, 1, (int64_t)mp_safetensors_data_bytes(f), &m)))
        s = mp_set_error(s, "'%s': %s", path, mp_last_error());
    if (!s) {
        const mp_named_tensor **found = calloc((size_t)mp_model_num_params(m) + 1, sizeof *found);
        if (!found)
            s = mp_set_error(MP_ERR_NOMEM, "decode: out of memory");
        else if (!(s = mp_model_check_weights(m, f, path, found)))
            mp_model_commit_weights(m, found);
        free(found);
    }
    if (!s) s = mp_model_decode_reset(m, ctx);
    free(one);
    mp_safetensors_free(f);
    if (s) {
        mp_model_free(m);
        return s;
    }
    *out = m;
    if (context) *context = ctx;
    return MP_OK;
}
