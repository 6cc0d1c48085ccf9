/* decode.c - incremental decoding for text generation: a model built for
 * one position per call keeps, in the layers that look across positions
 * (MultiHeadAttention), a cache of what earlier positions left (their keys
 * and values), so each new token costs one position instead of a rerun of
 * the whole prefix. Layers that treat positions alike need nothing; the
 * position-dependent ones read m->position. A prefill runs a prompt's
 * positions as the rows of one batch (m->prefill), so each weight layer
 * makes one GEMM of them instead of one GEMM row per step; every layer
 * works on each row alone, so the outputs are those of steps taken one
 * position at a time, bit for bit. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "io/io_internal.h"
#include "nn/layer.h"

mp_status mp_model_decode_reset_sequences(mp_model *m, int64_t capacity, int64_t sequences)
{
    if (!m || !m->built) return mp_set_error(MP_ERR_INVALID, "decode: build the model first");
    if (capacity < 1)
        return mp_set_error(MP_ERR_INVALID, "decode: capacity %lld", (long long)capacity);
    if (sequences < 1 || sequences > m->max_batch)
        return mp_set_error(MP_ERR_INVALID, "decode: %lld sequences (1..%lld, the max_batch)",
                            (long long)sequences, (long long)m->max_batch);
    m->decode_sequences = sequences;
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

mp_status mp_model_decode_reset(mp_model *m, int64_t capacity)
{
    /* as many sequences as the last reset (max_batch before any) */
    const int64_t seqs = !m ? 1 : m->decode_sequences ? m->decode_sequences : m->max_batch;
    return mp_model_decode_reset_sequences(m, capacity, seqs);
}

int64_t mp_model_decode_position(const mp_model *m) { return m ? m->position : 0; }

/* The forward of x at the next positions: `prefill` takes x's rows as
 * consecutive positions of the first sequence, else each row is a sequence
 * of its own at the same positions. */
static mp_status decode_forward(mp_model *m, const mp_tensor *x, bool prefill, const mp_tensor **y)
{
    if (!m || !m->decode_capacity)
        return mp_set_error(MP_ERR_INVALID, "decode: call mp_model_decode_reset first");
    if (!x || x->ndim < 1 || x->shape[0] < 1)
        return mp_set_error(MP_ERR_INVALID, "decode: an input with no rows");
    const int64_t rows = x->shape[0];
    if (prefill && m->decode_sequences != 1)
        return mp_set_error(MP_ERR_INVALID,
                            "decode: a prefill fills one sequence; the caches hold %lld "
                            "(mp_model_decode_reset_sequences with 1)",
                            (long long)m->decode_sequences);
    if (!prefill && rows > m->decode_sequences)
        return mp_set_error(MP_ERR_INVALID,
                            "decode: a batch of %lld sequences; the caches hold %lld",
                            (long long)rows, (long long)m->decode_sequences);
    int64_t in_shape[MP_MAX_DIMS];
    int nd = mp_model_input_shape(m, in_shape);
    const int64_t t = (nd ? in_shape[0] : 1) * (prefill ? rows : 1);
    if (m->position + t > m->decode_capacity)
        return mp_set_error(MP_ERR_INVALID,
                            "decode: position %lld is past the context of %lld positions",
                            (long long)(m->position + t - 1), (long long)m->decode_capacity);
    m->prefill = prefill;
    mp_status s = mp_model_forward(m, x, false, y);
    m->prefill = false;
    if (s) return s;
    m->position += t;
    return MP_OK;
}

mp_status mp_model_decode_step(mp_model *m, const mp_tensor *x, const mp_tensor **y)
{
    return decode_forward(m, x, false, y);
}

mp_status mp_model_decode_prefill(mp_model *m, const mp_tensor *x, const mp_tensor **y)
{
    return decode_forward(m, x, true, y);
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

/* The decoder's max_batch: the positions one prefill call takes (its
 * caches hold one sequence). Every call packs each weight matrix again, so
 * longer chunks amortize it; the activations grow with them. gpt_mini at
 * context 1024, 511 prompt positions, AMD EPYC (Zen 3), 2 threads, medians
 * of 11 prefills in one process, s, mixed_bfloat16 / float32: chunks of 64
 * 0.038 / 0.040, 128 0.036 / 0.035, 256 0.033 / 0.034 (one position per
 * step: 0.39). */
#define DECODER_PREFILL_ROWS 128

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
    else if ((s = mp_model_from_config(one, ctx < DECODER_PREFILL_ROWS ? ctx : DECODER_PREFILL_ROWS,
                                       (int64_t)mp_safetensors_data_bytes(f), &m)))
        s = mp_set_error(s, "'%s': %s", path, mp_last_error());
    if (!s) {
        const mp_named_tensor **found = calloc((size_t)mp_model_num_params(m) + 1, sizeof *found);
        if (!found)
            s = mp_set_error(MP_ERR_NOMEM, "decode: out of memory");
        else if (!(s = mp_model_check_weights(m, f, path, found)))
            mp_model_commit_weights(m, found);
        free(found);
    }
    if (!s) s = mp_model_decode_reset_sequences(m, ctx, 1);
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
