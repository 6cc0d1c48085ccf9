/* fuzz_checkpoint.c - the checkpoint loader under a fuzzer. One input is a
 * whole safetensors file image; it goes through everything a file read
 * from disk goes through when a model is rebuilt from it:
 *   mp_safetensors_parse     header length, JSON, dtypes, shapes, offsets
 *   mp_model_from_config     the mixprec.config metadata on its own (also
 *                            under another global policy, _ex), and the
 *                            configuration of the model it builds, written
 *                            back and read again (it must round-trip)
 *   mp_model_from_safetensors the model, its weights, the optimizer state
 *                            (mixprec.training + optimizer/<param>/<slot>)
 *                            and the fit state (mixprec.fit)
 *   mp_model_forward         a batch of one zero sample through a loaded
 *                            model, when the model is small.
 * Any input must come back as a status: no crash, no leak, no read out of
 * bounds, no undefined behaviour. A broken invariant (an accepted file
 * whose pieces disagree) aborts, so the fuzzer reports it.
 *
 * Built two ways: with -DMP_LIBFUZZER as a libFuzzer target (make fuzz,
 * mk/fuzz.mk), and #included by tests/test_fuzz_regress.c, which runs the
 * seed corpus and the regression inputs in the normal test suite. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz_checkpoint"
#include "fuzz_check.h"
#include "mixprec.h"
#include "train/train_internal.h"

/* What mp_fuzz_checkpoint_one got to. */
enum {
    MP_FUZZ_REFUSED = 0, /* not a safetensors file */
    MP_FUZZ_PARSED = 1,  /* a safetensors file, but no model loads from it */
    MP_FUZZ_LOADED = 2,  /* a model (and its training and fit state) loaded */
};

/* Run one input through the loader; returns one of the values above. */
int mp_fuzz_checkpoint_one(const uint8_t *data, size_t size);

/* The largest model a forward pass is tried on: activation elements per
 * sample over all layers (about the parameters a 64 KiB input can hold;
 * layers without parameters can make the activations far larger). */
#define FUZZ_MAX_FORWARD_ELEMS ((int64_t)1 << 16)

/* Read every byte a parsed file hands out (AddressSanitizer checks the
 * ranges) and check what the accessors promise. */
static void fuzz_walk_file(const mp_safetensors *f)
{
    int n = mp_safetensors_count(f);
    FUZZ_CHECK(n >= 0);
    volatile uint8_t sink = 0;
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        const mp_named_tensor *t = mp_safetensors_tensor(f, i);
        FUZZ_CHECK(t && t->name && t->ndim >= 0 && t->ndim <= MP_MAX_DIMS);
        FUZZ_CHECK(mp_safetensors_find(f, t->name) == t); /* names are unique */
        size_t bytes = mp_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) {
            FUZZ_CHECK(t->shape[d] >= 0);
            bytes *= (size_t)t->shape[d];
        }
        const uint8_t *p = t->data;
        if (bytes) sink ^= (uint8_t)(p[0] ^ p[bytes - 1]);
        for (size_t b = 0; b < bytes; b += 61) sink ^= p[b];
        total += bytes;
    }
    FUZZ_CHECK(total == mp_safetensors_data_bytes(f)); /* exact tiling */
    FUZZ_CHECK(mp_safetensors_tensor(f, -1) == NULL && mp_safetensors_tensor(f, n) == NULL);
    (void)sink;
}

/* A configuration read back must describe the same model. */
static void fuzz_config_round_trip(mp_model *m, int64_t max_params)
{
    char *json = mp_model_config_json(m);
    FUZZ_CHECK(json != NULL);
    mp_model *again = NULL;
    mp_status s = mp_model_from_config(json, 1, max_params, &again);
    FUZZ_CHECK(s == MP_OK && again != NULL);
    FUZZ_CHECK(mp_model_num_layers(again) == mp_model_num_layers(m));
    FUZZ_CHECK(mp_model_num_params(again) == mp_model_num_params(m));
    for (int i = 0; i < mp_model_num_params(m); i++)
        FUZZ_CHECK(!strcmp(mp_model_get_param(m, i)->name, mp_model_get_param(again, i)->name) &&
                   mp_model_get_param(m, i)->n == mp_model_get_param(again, i)->n);
    char *json2 = mp_model_config_json(again);
    FUZZ_CHECK(json2 != NULL && !strcmp(json, json2));
    free(json2);
    free(json);
    mp_model_free(again);
}

/* The configuration alone, with the same parameter bound a checkpoint load
 * uses (what the file can hold), then under another global policy (one
 * the input picks). */
static void fuzz_config(const char *config, int64_t max_params, const char *policy)
{
    for (int pass = 0; pass < (policy ? 2 : 1); pass++) {
        mp_model *m = (mp_model *)&m; /* must be reset to NULL on failure */
        mp_status s = pass ? mp_model_from_config_ex(config, policy, 1, max_params, &m)
                           : mp_model_from_config(config, 1, max_params, &m);
        if (s != MP_OK) {
            /* (mp_model_build once returned -1 here: regress/bad-config-two-inputs) */
            FUZZ_CHECK(fuzz_refused_well(s) && m == NULL);
            continue;
        }
        FUZZ_CHECK(m != NULL && mp_model_is_built(m));
        fuzz_config_round_trip(m, max_params);
        mp_model_free(m);
    }
}

/* One zero sample (id 0 for an int32 input) through a loaded model, when
 * its activations are small. */
static void fuzz_forward(mp_model *m)
{
    int64_t elems = 0;
    mp_dtype in_type = MP_F32;
    for (int l = 0; l < mp_model_num_layers(m); l++) {
        mp_layer_info li;
        FUZZ_CHECK(mp_model_layer_info(m, l, 1, &li) == MP_OK);
        if (li.ninputs == 0 && li.output_dtype == MP_I32) in_type = MP_I32;
        int64_t w = 1;
        for (int d = 0; d < li.ndim; d++) w *= li.shape[d];
        if ((elems += w) > FUZZ_MAX_FORWARD_ELEMS) return;
    }
    int64_t shape[MP_MAX_DIMS];
    shape[0] = 1;
    int nd = mp_model_input_shape(m, shape + 1);
    FUZZ_CHECK(nd >= 1 && nd < MP_MAX_DIMS);
    mp_tensor x;
    if (mp_tensor_init(&x, in_type, nd + 1, shape, MP_MEM_OTHER) != MP_OK) return;
    const mp_tensor *y = NULL;
    if (mp_model_forward(m, &x, false, &y) == MP_OK) {
        FUZZ_CHECK(y != NULL && y->shape[0] == 1);
        int64_t oshape[MP_MAX_DIMS];
        int ond = mp_model_output_shape(m, oshape);
        FUZZ_CHECK(ond == y->ndim - 1);
        /* read every output element (AddressSanitizer checks the range) */
        volatile uint8_t sink = 0;
        const uint8_t *p = y->data;
        for (size_t b = 0; b < mp_tensor_bytes(y); b++) sink ^= p[b];
        (void)sink;
    }
    mp_tensor_release(&x);
}

int mp_fuzz_checkpoint_one(const uint8_t *data, size_t size)
{
    mp_safetensors *f = (mp_safetensors *)&f; /* must be reset to NULL on failure */
    mp_status ps = mp_safetensors_parse(data, size, "fuzz-input", &f);
    if (ps != MP_OK) {
        FUZZ_CHECK((ps == MP_ERR_FORMAT || ps == MP_ERR_NOMEM) && f == NULL && mp_last_error()[0]);
        return MP_FUZZ_REFUSED;
    }
    FUZZ_CHECK(f != NULL);
    fuzz_walk_file(f);

    const char *config = mp_safetensors_metadata(f, "mixprec.config");
    static const char *const policies[] = {NULL,      "float32", "mixed_float16", "mixed_bfloat16",
                                           "float16", "bfloat16"};
    if (config) fuzz_config(config, (int64_t)mp_safetensors_data_bytes(f), policies[size % 6]);

    mp_model *m = (mp_model *)&m;
    mp_fit_state fit;
    memset(&fit, 0xA5, sizeof fit); /* must be zeroed or filled in */
    int result = MP_FUZZ_PARSED;
    mp_status s = mp_model_from_safetensors(f, "fuzz-input", 1, &m, &fit);
    if (s == MP_OK) {
        FUZZ_CHECK(m != NULL && mp_model_is_built(m));
        FUZZ_CHECK(fit.history.count == fit.epoch && fit.history.count >= 0);
        FUZZ_CHECK(fit.correct <= fit.samples && fit.loss_samples <= fit.samples);
        for (int e = 0; e < fit.history.count; e++)
            FUZZ_CHECK(fit.history.epochs[e].epoch == e + 1);
        mp_optimizer *opt = mp_model_optimizer(m);
        if (opt) {
            FUZZ_CHECK(mp_optimizer_step_count(opt) >= 0);
            mp_loss_scaler *ls = mp_model_loss_scaler(m);
            if (ls) {
                mp_loss_scaler_state st;
                mp_loss_scaler_get_state(ls, &st);
                FUZZ_CHECK(st.scale > 0);
            }
        }
        fuzz_forward(m);
        mp_fit_state_free(&fit);
        mp_model_free(m);
        result = MP_FUZZ_LOADED;
    } else {
        FUZZ_CHECK(fuzz_refused_well(s) && m == NULL);
        FUZZ_CHECK(fit.history.epochs == NULL && fit.history.count == 0);
    }
    mp_safetensors_free(f);
    return result;
}

#ifdef MP_LIBFUZZER
/* ---------------------------------------------------------- libFuzzer */

#include <jansson.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mp_fuzz_checkpoint_one(data, size);
    return 0;
}

/* A structure-aware mutator. Byte mutations rarely keep the JSON inside a
 * JSON string (the mixprec.* metadata) valid, or the data section in step
 * with the header, so besides libFuzzer's own mutations (a quarter of the
 * time, and whenever the input is not a safetensors file) this one:
 *   - decodes the header and one of the documents (the header itself,
 *     mixprec.config, mixprec.training, mixprec.fit), changes one to three
 *     of its values (boundary numbers, names the loader knows, deletions,
 *     duplications, swaps) and encodes everything again;
 *   - after a change to mixprec.config, half of the time rebuilds the
 *     tensors for the new configuration (weights and the optimizer slots
 *     the file had, kept where they still fit), so that changed models get
 *     past the shape checks and into the loader, the optimizer and a
 *     forward pass. */

typedef struct {
    uint64_t s;
} fz_rng;

static uint64_t fz_next(fz_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static size_t fz_below(fz_rng *r, size_t n) { return n ? (size_t)(fz_next(r) % n) : 0; }

/* One place in a JSON document: the node and where it hangs. */
typedef struct {
    json_t *parent; /* NULL for the root */
    const char *key;
    size_t index;
    json_t *node;
} fz_slot;

#define FZ_MAX_SLOTS 2048

static void fz_collect(json_t *parent, const char *key, size_t index, json_t *node, fz_slot *slots,
                       int *n)
{
    if (*n >= FZ_MAX_SLOTS) return;
    slots[(*n)++] = (fz_slot){parent, key, index, node};
    const char *k;
    json_t *v;
    size_t i;
    if (json_is_object(node)) {
        json_object_foreach(node, k, v) fz_collect(node, k, 0, v, slots, n);
    } else if (json_is_array(node)) {
        json_array_foreach(node, i, v) fz_collect(node, NULL, i, v, slots, n);
    }
}

static void fz_replace(const fz_slot *s, json_t *v)
{
    if (!v) return;
    if (!s->parent) {
        json_decref(v);
    } else if (json_is_object(s->parent)) {
        char key[256];
        snprintf(key, sizeof key, "%s", s->key);
        json_object_set_new(s->parent, key, v);
    } else {
        json_array_set_new(s->parent, s->index, v);
    }
}

static const char *const fz_words[] = {"dense",
                                       "dense_1",
                                       "input_1",
                                       "activation",
                                       "add",
                                       "dropout",
                                       "layer_normalization",
                                       "flatten",
                                       "InputLayer",
                                       "Dense",
                                       "Activation",
                                       "Dropout",
                                       "Flatten",
                                       "Add",
                                       "LayerNormalization",
                                       "Reshape",
                                       "BatchNormalization",
                                       "Embedding",
                                       "Conv2D",
                                       "DepthwiseConv2D",
                                       "MaxPooling2D",
                                       "AveragePooling2D",
                                       "GlobalAveragePooling2D",
                                       "ZeroPadding2D",
                                       "RandomFlip",
                                       "RandomTranslation",
                                       "MultiHeadAttention",
                                       "num_heads",
                                       "key_dim",
                                       "same",
                                       "valid",
                                       "horizontal",
                                       "reshape",
                                       "batch_normalization",
                                       "embedding",
                                       "int32",
                                       "float64",
                                       "zeros",
                                       "ones",
                                       "glorot_uniform",
                                       "he_uniform",
                                       "lecun_uniform",
                                       "uniform",
                                       "kernel_initializer",
                                       "embeddings_initializer",
                                       "moving_variance_initializer",
                                       "linear",
                                       "relu",
                                       "gelu",
                                       "gelu_tanh",
                                       "sigmoid",
                                       "tanh",
                                       "softmax",
                                       "float32",
                                       "mixed_float16",
                                       "mixed_bfloat16",
                                       "float16",
                                       "bfloat16",
                                       "adam",
                                       "adamw",
                                       "sgd",
                                       "nearest",
                                       "stochastic",
                                       "dynamic",
                                       "static",
                                       "auto",
                                       "none",
                                       "sparse_categorical_crossentropy",
                                       "categorical_crossentropy",
                                       "binary_crossentropy",
                                       "mean_squared_error",
                                       "0x0000000000000000",
                                       "0xffffffffffffffff",
                                       "0x1",
                                       "F32",
                                       "F16",
                                       "BF16",
                                       "F8_E4M3",
                                       "F8_E5M2",
                                       "",
                                       "mixprec.model"};

static const json_int_t fz_ints[] = {0,
                                     1,
                                     -1,
                                     2,
                                     3,
                                     4,
                                     7,
                                     8,
                                     255,
                                     256,
                                     4096,
                                     4097,
                                     65535,
                                     65536,
                                     100000000,
                                     1000000000,
                                     (json_int_t)1 << 26,
                                     ((json_int_t)1 << 26) + 1,
                                     INT32_MAX,
                                     (json_int_t)INT32_MAX + 1,
                                     (json_int_t)1 << 32,
                                     (json_int_t)1 << 53,
                                     INT64_MAX,
                                     INT64_MIN};

static const double fz_reals[] = {0.0,   -0.0, 0.5,    1.0,    -1.0,  1e-45, 1e-8,
                                  0.999, 1e38, 3.4e38, 3.5e38, 1e300, 1e308, 65504.0};

/* Change one value of a document. */
static void fz_mutate_json(json_t *doc, fz_rng *r)
{
    fz_slot *slots = malloc(FZ_MAX_SLOTS * sizeof *slots);
    if (!slots) return;
    int n = 0;
    fz_collect(NULL, NULL, 0, doc, slots, &n);
    const fz_slot *s = &slots[fz_below(r, (size_t)n)];
    json_t *v = s->node;
    switch (fz_below(r, 10)) {
    case 0:
        fz_replace(s, json_integer(fz_ints[fz_below(r, sizeof fz_ints / sizeof *fz_ints)]));
        break;
    case 1:
        if (json_is_integer(v)) {
            json_int_t x = json_integer_value(v), d = (json_int_t)fz_below(r, 16) + 1;
            json_int_t y =
                fz_below(r, 2) ? (x > INT64_MAX - d ? x : x + d) : (x < INT64_MIN + d ? x : x - d);
            fz_replace(s, json_integer(y));
        } else if (json_is_real(v)) {
            double x = json_real_value(v);
            fz_replace(s, json_real(fz_below(r, 2) ? x * 2 : -x));
        } else {
            fz_replace(s, json_integer((json_int_t)fz_below(r, 10)));
        }
        break;
    case 2:
        fz_replace(s, json_real(fz_reals[fz_below(r, sizeof fz_reals / sizeof *fz_reals)]));
        break;
    case 3:
        fz_replace(s, fz_below(r, 3) == 0 ? json_null() : json_boolean(fz_below(r, 2)));
        break;
    case 4:
        if (fz_below(r, 2)) {
            fz_replace(s, json_string(fz_words[fz_below(r, sizeof fz_words / sizeof *fz_words)]));
        } else { /* another string of the same document */
            const fz_slot *o = &slots[fz_below(r, (size_t)n)];
            if (json_is_string(o->node)) fz_replace(s, json_string(json_string_value(o->node)));
        }
        break;
    case 5: /* delete */
        if (s->parent && json_is_object(s->parent)) {
            char key[256];
            snprintf(key, sizeof key, "%s", s->key);
            json_object_del(s->parent, key);
        } else if (s->parent) {
            json_array_remove(s->parent, s->index);
        }
        break;
    case 6: /* duplicate into the array it is in (a layer, an input, a dimension) */
        if (s->parent && json_is_array(s->parent))
            json_array_insert_new(s->parent, fz_below(r, json_array_size(s->parent) + 1),
                                  json_deep_copy(v));
        break;
    case 7: /* swap with a sibling */
        if (s->parent && json_is_array(s->parent) && json_array_size(s->parent) > 1) {
            size_t j = fz_below(r, json_array_size(s->parent));
            json_t *a = json_incref(v), *b = json_incref(json_array_get(s->parent, j));
            json_array_set_new(s->parent, s->index, b);
            json_array_set_new(s->parent, j, a);
        }
        break;
    case 8:
        fz_replace(s, fz_below(r, 2) ? json_array() : json_object());
        break;
    default: /* the bytes of a string */
        if (json_is_string(v) && json_string_length(v) < 200) {
            uint8_t buf[256];
            size_t len = json_string_length(v);
            memcpy(buf, json_string_value(v), len);
            len = LLVMFuzzerMutate(buf, len, sizeof buf);
            fz_replace(s, json_stringn((const char *)buf, len)); /* NULL (kept) if not UTF-8 */
        }
        break;
    }
    free(slots);
}

/* Fill n elements of dtype t at out with small values (non-negative when
 * asked: second moments). */
static void fz_fill(void *out, mp_dtype t, int64_t n, bool nonneg, uint64_t salt)
{
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    if (!x) return;
    for (int64_t i = 0; i < n; i++) {
        float v = (float)((int64_t)((salt + (uint64_t)i * 37u) % 17u) - 8) * 0.0625f;
        x[i] = nonneg ? (v < 0 ? -v : v) : v;
    }
    mp_convert(out, t, x, MP_F32, (size_t)n);
    free(x);
}

/* The bytes of an old tensor entry of the same name and shape, if any. */
static const uint8_t *fz_old_tensor(json_t *root, const char *name, const mp_model_param *p,
                                    const uint8_t *data, size_t dlen, mp_dtype *dt)
{
    json_t *e = json_object_get(root, name), *sh = json_object_get(e, "shape");
    json_t *of = json_object_get(e, "data_offsets");
    const char *dn = json_string_value(json_object_get(e, "dtype"));
    if (!dn || !json_is_array(sh) || (int)json_array_size(sh) != p->ndim) return NULL;
    for (int d = 0; d < p->ndim; d++)
        if (json_integer_value(json_array_get(sh, (size_t)d)) != p->shape[d]) return NULL;
    static const char *const names[] = {"F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"};
    static const mp_dtype types[] = {MP_F32, MP_F16, MP_BF16, MP_F8E4M3, MP_F8E5M2};
    int k = -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(dn, names[i])) k = i;
    if (k < 0) return NULL;
    json_int_t b = json_integer_value(json_array_get(of, 0));
    json_int_t e1 = json_integer_value(json_array_get(of, 1));
    if (b < 0 || e1 < b || (uint64_t)e1 > dlen ||
        (uint64_t)(e1 - b) != (uint64_t)p->n * mp_dtype_size(types[k]))
        return NULL;
    *dt = types[k];
    return data + b;
}

static const char *fz_dtype_name(mp_dtype t)
{
    static const char *const names[] = {"F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"};
    return (unsigned)t < 5 ? names[t] : "F32";
}

/* New tensors for the configuration in the header's metadata: every
 * parameter and, for each optimizer slot name the file had, its state.
 * Replaces *root and returns the new data section (malloc'd). */
static uint8_t *fz_resync(json_t **root, const uint8_t *data, size_t dlen, fz_rng *r,
                          size_t max_bytes, size_t *out_len)
{
    json_t *meta = json_object_get(*root, "__metadata__");
    const char *config = json_string_value(json_object_get(meta, "mixprec.config"));
    mp_model *m;
    if (!config || mp_model_from_config(config, 1, 4096, &m) != MP_OK) return NULL;
    char slots[4][32];
    int ns = 0;
    const char *key;
    json_t *val;
    json_object_foreach(*root, key, val)
    {
        const char *slash = strrchr(key, '/');
        if (strncmp(key, "optimizer/", 10) || !slash || strlen(slash + 1) >= sizeof slots[0])
            continue;
        bool seen = false;
        for (int i = 0; i < ns; i++) seen |= !strcmp(slots[i], slash + 1);
        if (!seen && ns < 4) snprintf(slots[ns++], sizeof slots[0], "%s", slash + 1);
    }
    int np = mp_model_num_params(m);
    size_t total = 0;
    for (int i = 0; i < np; i++)
        total += (size_t)mp_model_get_param(m, i)->n * 4 * (size_t)(1 + ns);
    uint8_t *out = total <= max_bytes ? malloc(total ? total : 1) : NULL;
    json_t *nroot = out ? json_object() : NULL;
    if (!nroot) {
        free(out);
        mp_model_free(m);
        return NULL;
    }
    if (meta) json_object_set(nroot, "__metadata__", meta);
    size_t off = 0;
    for (int i = 0; i < np; i++)
        for (int k = -1; k < ns; k++) {
            const mp_model_param *p = mp_model_get_param(m, i);
            char name[256];
            if (k < 0)
                snprintf(name, sizeof name, "%s", p->name);
            else
                snprintf(name, sizeof name, "optimizer/%s/%s", p->name, slots[k]);
            mp_dtype dt = MP_F32;
            const uint8_t *old = fz_old_tensor(*root, name, p, data, dlen, &dt);
            if (!old && k < 0) dt = (mp_dtype)fz_below(r, 3); /* F32, F16 or BF16 */
            size_t bytes = (size_t)p->n * mp_dtype_size(dt);
            if (old)
                memcpy(out + off, old, bytes);
            else
                fz_fill(out + off, dt, p->n, k >= 0, fz_next(r));
            json_t *shape = json_array();
            for (int d = 0; d < p->ndim; d++)
                json_array_append_new(shape, json_integer(p->shape[d]));
            json_object_set_new(nroot, name,
                                json_pack("{s:s, s:o, s:[I, I]}", "dtype", fz_dtype_name(dt),
                                          "shape", shape, "data_offsets", (json_int_t)off,
                                          (json_int_t)(off + bytes)));
            off += bytes;
        }
    mp_model_free(m);
    json_decref(*root);
    *root = nroot;
    *out_len = off;
    return out;
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    fz_rng r = {seed};
    if (fz_below(&r, 4) == 0 || size < 8) return LLVMFuzzerMutate(data, size, max_size);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)data[i] << (8 * i);
    json_t *root =
        hlen <= size - 8 ? json_loadb((const char *)data + 8, (size_t)hlen, 0, NULL) : NULL;
    if (!json_is_object(root)) {
        json_decref(root);
        return LLVMFuzzerMutate(data, size, max_size);
    }
    const uint8_t *body = data + 8 + hlen;
    size_t blen = size - 8 - (size_t)hlen;
    /* the document to change: the header, or one of the mixprec.* metadata */
    static const char *const keys[] = {NULL, "mixprec.config", "mixprec.training", "mixprec.fit",
                                       "mixprec.config"};
    const char *key = keys[fz_below(&r, sizeof keys / sizeof *keys)];
    json_t *meta = json_object_get(root, "__metadata__");
    json_t *doc = root;
    if (key) {
        const char *text = json_string_value(json_object_get(meta, key));
        doc = text ? json_loads(text, 0, NULL) : NULL;
        if (!doc) key = NULL, doc = root;
    }
    int changes = 1 + (int)fz_below(&r, 3);
    for (int i = 0; i < changes; i++) fz_mutate_json(doc, &r);
    if (key) {
        char *text = json_dumps(doc, JSON_COMPACT | JSON_ENCODE_ANY);
        if (text) json_object_set_new(meta, key, json_string(text));
        free(text);
        json_decref(doc);
    }
    uint8_t *nbody = NULL;
    if (key && !strcmp(key, "mixprec.config") && fz_below(&r, 2))
        nbody = fz_resync(&root, body, blen, &r, max_size, &blen);
    char *hdr = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    size_t hl = hdr ? strlen(hdr) : 0, n = 8 + hl + blen;
    if (!hdr || n > max_size) {
        free(hdr);
        free(nbody);
        return LLVMFuzzerMutate(data, size, max_size);
    }
    /* the data section moves (the header changed length): through a copy */
    uint8_t *out = malloc(n);
    if (!out) {
        free(hdr);
        free(nbody);
        return LLVMFuzzerMutate(data, size, max_size);
    }
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(out + 8, hdr, hl);
    if (blen) memcpy(out + 8 + hl, nbody ? nbody : body, blen);
    memcpy(data, out, n);
    free(out);
    free(hdr);
    free(nbody);
    return n;
}
#endif
