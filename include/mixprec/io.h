/* mixprec/io.h - safetensors files: named tensors with a JSON header
 * (8-byte little-endian header length, the header, raw little-endian data),
 * and model weights saved and loaded through them. Included by mixprec.h. */
/* The whole API, in order: this part compiles when included alone. */
#include "../mixprec.h"

#ifndef MIXPREC_IO_H
#define MIXPREC_IO_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;
    mp_dtype dtype;
    int ndim;
    int64_t shape[MP_MAX_DIMS];
    const void *data; /* little-endian, numel * dtype size bytes */
} mp_named_tensor;

/* Write tensors (and optional string metadata pairs key[i] -> value[i]) to
 * `path` atomically: a temporary file in the same directory, fsync'd,
 * renamed over `path`, the directory fsync'd. On failure the old file, if
 * any, is untouched and no temporary is left behind. */
mp_status mp_safetensors_write(const char *path, const mp_named_tensor *tensors, int n,
                               const char *const *meta_keys, const char *const *meta_values,
                               int n_meta);

/* A loaded, validated file. */
typedef struct mp_safetensors mp_safetensors;
/* Reads and validates everything before returning: header length bounds,
 * JSON shape, dtypes, shapes against byte ranges, offsets in bounds,
 * contiguous and non-overlapping, total size, duplicate names. */
mp_status mp_safetensors_read(const char *path, mp_safetensors **out);
/* The same checks on a file image in memory (copied); `name` labels errors. */
mp_status mp_safetensors_parse(const void *image, size_t len, const char *name,
                               mp_safetensors **out);
void mp_safetensors_free(mp_safetensors *f);
int mp_safetensors_count(const mp_safetensors *f);
/* Bytes of tensor data in the file (the tensors tile it exactly): a bound on
 * the parameters any model loaded from it can have. */
uint64_t mp_safetensors_data_bytes(const mp_safetensors *f);
/* Tensor i (names sorted as in the file's header); NULL if out of range. */
const mp_named_tensor *mp_safetensors_tensor(const mp_safetensors *f, int i);
const mp_named_tensor *mp_safetensors_find(const mp_safetensors *f, const char *name);
/* A __metadata__ value, or NULL. */
const char *mp_safetensors_metadata(const mp_safetensors *f, const char *key);

/* The model's configuration as JSON (version 2; the README's "Model files"
 * gives the schema): format, version, seed, the model's policy, output and
 * the layers (class_name, name, inputs by name, seed, the policy when it is
 * the layer's own, initializer overrides and each kind's settings).
 * malloc'd; free() it. NULL with mp_last_error. */
char *mp_model_config_json(const mp_model *m);
/* Create and build (for batches up to max_batch) the model a configuration
 * describes. Everything is checked first; a model with more than max_params
 * parameter elements is refused before anything is allocated. */
mp_status mp_model_from_config(const char *json, int64_t max_batch, int64_t max_params,
                               mp_model **out);
/* The same under another policy: the layers that followed the model's
 * policy get `policy`, explicit per-layer overrides (such as a float32
 * softmax) stay, as if the model had been built under it. */
mp_status mp_model_from_config_ex(const char *json, const char *policy, int64_t max_batch,
                                  int64_t max_params, mp_model **out);
/* A model from a JSON file a person wrote (the same schema; "seed",
 * "policy", "output" and layer seeds may be left out: `seed` stands in for
 * the model seed, the global policy for the model's, the last layer is the
 * output). `policy`, when not NULL, replaces the model's policy as in
 * mp_model_from_config_ex. Errors name the file, the layer and the field. */
mp_status mp_model_from_config_file(const char *path, const char *policy, uint64_t seed,
                                    int64_t max_batch, mp_model **out);

/* Model weights as `<layer>.kernel` ([in, out]), `<layer>.bias`,
 * `<layer>.gamma`, `<layer>.beta`: float32 masters (or the weights
 * themselves under a pure low-precision policy). */
mp_status mp_model_save_weights(mp_model *m, const char *path);
/* The same with extra __metadata__ entries (e.g. the model's configuration). */
mp_status mp_model_save_weights_ex(mp_model *m, const char *path, const char *const *meta_keys,
                                   const char *const *meta_values, int n_meta);
/* Load every parameter of the model from the file (any float dtype, shapes
 * must match), check for NaN/inf, then refresh the compute copies. On any
 * error nothing in the model is changed. */
mp_status mp_model_load_weights(mp_model *m, const char *path);
/* The same from a file already read (name labels errors). */
mp_status mp_model_load_weights_from(mp_model *m, const mp_safetensors *f, const char *name);

#ifdef __cplusplus
}
#endif
#endif
