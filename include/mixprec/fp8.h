/* mixprec/fp8.h - per-tensor float8 training (Transformer Engine's and
 * Keras 3's float8 recipes), emulated bit-exactly: the GEMM inputs of a
 * layer are quantized per tensor to OCP FP8 with a scale, the GEMM reads the
 * fp8 values (each decodes exactly to bfloat16) and accumulates in
 * float32, and its result is multiplied by (1/scale_a) * (1/scale_b).
 * Included by mixprec.h.
 *
 * The recipe (one tensor):
 *   code  = cast(x * scale) with saturation (x * scale rounded to float32
 *           once, then round-to-nearest-even to fp8; finite overflow gives
 *           +-max, NaN stays NaN, inf becomes NaN in E4M3 and stays inf in
 *           E5M2);
 *   scale = (fp8_max / amax) / 2^margin in float32, clamped to
 *           [FLT_MIN, FLT_MAX] so that 1/scale is finite and non-zero;
 *           an amax that is 0 or not finite keeps the previous scale (the
 *           first scale is 1), as Transformer Engine does;
 *   GEMM  = alpha * (codes_a . codes_b), alpha = (1/scale_a) * (1/scale_b),
 *           each reciprocal and the product rounded to float32.
 * Delayed scaling: a tensor is quantized with the scale computed after the
 * previous step from its amax history, the amaxes (max |x|) of its last
 * amax_history_len steps: their maximum (algorithm max) or the newest
 * (most_recent). Current scaling: the scale of the tensor's own amax now.
 * With delayed scaling the training step's optimizer update quantizes each
 * float8 kernel as it updates its float32 master, with the scale the
 * commit then sets, and the next forward uses those values (Transformer
 * Engine quantizes fp8 weights in the optimizer too): the same bits as
 * quantizing the master in the forward, one pass over it fewer. Masters
 * changed otherwise (mp_model_mark_masters_changed, a checkpoint, an
 * optimizer step outside mp_model_train_step) are quantized in the forward.
 *
 * Steps and non-finite values. The amaxes seen during a training step
 * (the maximum over every pass of the step, e.g. accumulated micro-batches)
 * are pending until the step is committed (mp_model_float8_commit, which
 * mp_model_train_step calls): an applied step whose pending amaxes are all
 * finite pushes them into the histories and updates the scales; a skipped
 * step (non-finite gradients, the loss scaler's backoff) or any non-finite
 * pending amax discards all of the step's amaxes, leaving histories and
 * scales as they were. A non-finite value in a forward input quantizes to
 * NaN (E4M3) and so makes the output and the loss non-finite; that step is
 * skipped by the finite check and its amaxes discarded: a non-finite amax
 * never reaches a history. Inference passes record nothing. Data
 * parallel (mp_model_train_step_shard, fit under mpirun), the pending
 * amaxes are first maxed over the ranks, so every rank commits the same
 * histories and delayed scales. */
/* The whole API, in order: this part compiles when included alone. */
#include "../mixprec.h"

#ifndef MIXPREC_FP8_H
#define MIXPREC_FP8_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MP_FLOAT8_HYBRID = 0, /* E4M3 forward inputs (activations, weights), E5M2 gradients */
    MP_FLOAT8_E4M3 = 1,   /* E4M3 everywhere */
} mp_float8_format;

typedef enum {
    MP_FLOAT8_DELAYED = 0, /* scale from the amax history, updated after each step */
    MP_FLOAT8_CURRENT = 1, /* scale from this tensor's amax now */
} mp_float8_scaling;

typedef enum {
    MP_FLOAT8_AMAX_MAX = 0,         /* the largest amax of the history */
    MP_FLOAT8_AMAX_MOST_RECENT = 1, /* the newest amax */
} mp_float8_amax_algorithm;

/* The tensors of one GEMM layer that are quantized. */
typedef enum {
    MP_FLOAT8_INPUT = 0,       /* the activation x (forward) */
    MP_FLOAT8_WEIGHT = 1,      /* the kernel */
    MP_FLOAT8_GRAD_OUTPUT = 2, /* dL/dy (backward) */
} mp_float8_role;
#define MP_FLOAT8_ROLES 3

#define MP_FLOAT8_MAX_HISTORY 65536
#define MP_FLOAT8_MAX_MARGIN 64

/* The recipe's settings (ggml style: start from the defaults, change what
 * you need). */
typedef struct mp_float8_params {
    mp_float8_format format;            /* HYBRID */
    mp_float8_scaling scaling;          /* DELAYED */
    int32_t amax_history_len;           /* 1024; 1 .. MP_FLOAT8_MAX_HISTORY */
    mp_float8_amax_algorithm algorithm; /* MAX */
    int32_t margin;                     /* 0; 0 .. MP_FLOAT8_MAX_MARGIN */
    /* the first and the last float8-capable layer of a model (in model
     * order) compute in the policy's compute dtype, as published fp8
     * recipes keep them; false quantizes them too */
    bool keep_first_last; /* true */
} mp_float8_params;

mp_float8_params mp_float8_params_default(void);
/* MP_ERR_INVALID with a message naming the bad value. */
mp_status mp_float8_params_validate(const mp_float8_params *p);
/* Set one setting from text: key "format" (hybrid, e4m3), "scaling"
 * (delayed, current), "amax_history_len" (1..65536), "algorithm" (max,
 * most_recent), "margin" (0..64), "keep_first_last" (true, false). The
 * error (one line) names the key and the value. */
mp_status mp_float8_params_set(mp_float8_params *p, const char *key, const char *value);
const char *mp_float8_format_name(mp_float8_format f);
const char *mp_float8_scaling_name(mp_float8_scaling s);
const char *mp_float8_algorithm_name(mp_float8_amax_algorithm a);
/* The fp8 dtype the recipe gives a role (E5M2 for gradients in HYBRID). */
mp_dtype mp_float8_dtype(const mp_float8_params *p, mp_float8_role role);

/* The settings layers take when they are created (as the global policy is
 * read in Keras); the default is mp_float8_params_default(). */
mp_status mp_set_global_float8_params(const mp_float8_params *p);
mp_float8_params mp_global_float8_params(void);

/* The scale rule above: the new scale for amax, keeping prev when amax is 0
 * or not finite. fp8 is MP_F8E4M3 or MP_F8E5M2. */
float mp_float8_scale(float amax, float prev, mp_dtype fp8, int margin);
/* max |x| of n values of any float dtype, in float32; NaN when one is NaN,
 * inf when one is infinite (and none is NaN). */
float mp_float8_amax(const void *x, mp_dtype t, size_t n);
/* codes[i] = cast(x[i] * scale) into fp8 as above; returns the amax of x. */
float mp_float8_quantize(uint8_t *codes, mp_dtype fp8, const void *x, mp_dtype t, size_t n,
                         float scale);
/* The same, with the codes' values in bfloat16 (exact) into decoded; codes
 * may be NULL. What a float8 layer hands its GEMM. */
float mp_float8_quantize_bf16(uint8_t *codes, uint16_t *decoded, mp_dtype fp8, const void *x,
                              mp_dtype t, size_t n, float scale);

/* ------------------------------------------------------------ in a model */

/* One quantized tensor of a model: where its recipe stands. */
typedef struct {
    const char *name;  /* "<layer>/input", "<layer>/kernel", "<layer>/grad_output" */
    const char *layer; /* the layer's name */
    mp_float8_role role;
    mp_dtype dtype; /* MP_F8E4M3 or MP_F8E5M2 */
    mp_float8_params params;
    float scale;      /* the scale the next pass uses */
    bool has_pending; /* an amax seen since the last commit */
    float pending_amax;
    const float *history; /* amax_history_len amaxes, newest first (zeros: none yet) */
} mp_float8_tensor_info;

/* The quantized tensors of a built model: 3 for each layer that computes in
 * float8 (its policy is mixed_float8 or its layer options say so, minus the
 * first and last such layer unless params.keep_first_last is false). */
int mp_model_float8_num_tensors(const mp_model *m);
mp_status mp_model_float8_tensor(const mp_model *m, int i, mp_float8_tensor_info *out);
/* Whether layer `layer` computes its GEMMs in float8. */
bool mp_model_layer_float8(const mp_model *m, int layer);
/* End a training step for the float8 recipe (see the rules above):
 * applied = the optimizer applied the step. Returns true when the step's
 * amaxes went into the histories. mp_model_train_step calls it; a custom
 * loop calls it once per optimizer step. */
bool mp_model_float8_commit(mp_model *m, bool applied);

#ifdef __cplusplus
}
#endif
#endif
