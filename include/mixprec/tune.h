/* mixprec/tune.h - automatic per-layer precision: run a few probe batches
 * of the training data through a model in float32, measure for every layer
 * with a kernel how much each candidate number format would change that
 * layer's real GEMM operands, pick per layer the cheapest format that stays
 * within an error budget, and write the model file with those choices
 * (`mixprec tune-precision`). Included by mixprec.h.
 *
 * What is measured. For each layer with an MP_ROLE_KERNEL parameter, three
 * tensors: its input activation (the output of its first input node), its
 * kernels (the float32 masters; every kernel of the layer) and the gradient
 * reaching its output (dL/dy, at loss scale 1), each seen as a matrix over
 * its last axis. A candidate quantizes each tensor as training would:
 *   float32             exact (error 0, the reference)
 *   bfloat16, float16   round to nearest even (float16 overflow is inf)
 *   fp8                 per tensor, scale = 448 / amax (E4M3) for activation
 *                       and kernels, 57344 / amax (E5M2) for the gradient,
 *                       amax the largest |x| of this tensor over the probe
 *                       batches so far (delayed scaling's `max` algorithm
 *                       with its history on these batches: a batch after a
 *                       larger one is scaled for the larger; a lone tensor,
 *                       as mp_tune_tensor_error takes, by its own amax)
 *   mxfp8/mxfp6/mxfp4   MX blocks of 32 (E4M3 / E2M3 / E2M1 for activation
 *                       and kernels, MXFP8 E5M2 for the gradient), along
 *                       each axis in turn - the reduction of each of the
 *                       two GEMMs the tensor takes part in - the worse kept.
 * The error of a tensor is the larger of
 *   rel   = ||q(x) - x||_2 / ||x||_2 (float64 sums over every probe batch);
 *   flush = the fraction of its non-zero values that quantize to zero.
 * rel alone is blind to dynamic range (it is dominated by the largest
 * values, so a format that flushes half the tensor to zero can still score
 * well); flush is what catches it. A layer's error for a candidate is the
 * largest of its tensors' errors. The chosen format is the cheapest
 * eligible candidate whose error is <= budget (cost: bytes per element,
 * MX scale bytes included; bfloat16 before float16 at equal cost); float32
 * always qualifies. */
/* The whole API, in order: this part compiles when included alone. */
#include "../mixprec.h"

#ifndef MIXPREC_TUNE_H
#define MIXPREC_TUNE_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The candidates, from the most to the least expensive. */
typedef enum {
    MP_TUNE_FLOAT32 = 0,
    MP_TUNE_BFLOAT16 = 1,
    MP_TUNE_FLOAT16 = 2,
    MP_TUNE_FP8 = 3,   /* per-tensor E4M3 forward / E5M2 gradient (mixprec/fp8.h) */
    MP_TUNE_MXFP8 = 4, /* mxfp8_e4m3 forward, mxfp8_e5m2 gradient */
    MP_TUNE_MXFP6 = 5, /* mxfp6_e2m3 forward, mxfp8_e5m2 gradient */
    MP_TUNE_MXFP4 = 6, /* mxfp4_e2m1 forward, mxfp8_e5m2 gradient */
} mp_tune_format;
#define MP_TUNE_FORMAT_COUNT 7
#define MP_TUNE_ALL_FORMATS ((1u << MP_TUNE_FORMAT_COUNT) - 1u)

/* "float32", "bfloat16", "float16", "fp8", "mxfp8", "mxfp6", "mxfp4". */
const char *mp_tune_format_name(mp_tune_format f);
/* One of the names above; MP_ERR_INVALID naming the value otherwise. */
mp_status mp_tune_format_from_name(const char *name, mp_tune_format *out);
/* A comma-separated list of names as a mask of (1u << format);
 * MP_ERR_INVALID naming the first unknown name. */
mp_status mp_tune_formats_from_list(const char *list, unsigned *mask);
/* Bytes per element of the forward operands: 4, 2, 2, 1, 1 + 1/32,
 * 0.75 + 1/32, 0.5 + 1/32 (an E8M0 scale per block of 32). */
double mp_tune_format_bytes(mp_tune_format f);

/* Which tensor of a layer. */
typedef enum {
    MP_TUNE_ACTIVATION = 0,
    MP_TUNE_WEIGHT = 1,
    MP_TUNE_GRADIENT = 2,
} mp_tune_role;
#define MP_TUNE_ROLES 3

/* The error of one rows x cols float32 tensor of role `role` under format
 * f, as defined above: *rel and *flush (either may be NULL). A tensor of
 * zeros has error 0; a non-finite value gives NaN. */
mp_status mp_tune_tensor_error(mp_tune_format f, mp_tune_role role, int64_t rows, int64_t cols,
                               const float *x, double *rel, double *flush);

/* The choice rule: the cheapest format of `eligible` (a mask of
 * 1u << format) whose error[format] <= budget (NaN never qualifies);
 * MP_TUNE_FLOAT32 when none does. */
mp_tune_format mp_tune_choose(const double errors[MP_TUNE_FORMAT_COUNT], unsigned eligible,
                              double budget);

typedef struct {
    /* the error threshold, > 0 and finite; 0.08. What the formats give on
     * ordinary tensors: 16-bit ~0.002 (float16 ~0.0003 until it flushes),
     * E4M3 / MXFP8 / MXFP6 forward ~0.025-0.035, E5M2 gradients ~0.05-0.055,
     * MXFP4 ~0.11-0.14. 0.08 lies between the 8-bit and the 4-bit cluster:
     * it admits the 8-bit recipes where a layer's tensors fit them and
     * refuses MXFP4; below ~0.05 no format with E5M2 gradients qualifies
     * (16 bits everywhere). */
    double budget;
    int probe_batches;   /* 4 (1 .. 1000) */
    int64_t batch_size;  /* 32 */
    uint64_t seed;       /* which samples (a shuffled order); 1 */
    unsigned candidates; /* mask of 1u << format; MP_TUNE_ALL_FORMATS (float32 always in) */
    /* the first and the last layer that could take fp8 or MX (Dense,
     * Conv2D, in model order) take 16 bits or more, as mixed_float8 keeps
     * them; true */
    bool keep_first_last;
    /* only formats this build can train are eligible: an MX format only when
     * a model file's "mx" field loads (the MX trainer); true. false makes
     * every candidate eligible (the written file may then need a newer
     * mixprec) */
    bool trainable_only;
    /* weights to probe with: a safetensors file of this model (weights or
     * a checkpoint, as `mixprec train --init-from`); NULL: the model's
     * initial weights. A trained model's tensors are what training will
     * see; the initial ones can differ much (gradients above all). */
    const char *weights;
    bool from_logits; /* the loss (sparse categorical cross-entropy on the data's
                       * labels, as `mixprec train`) reads logits; false */
} mp_tune_options;

mp_tune_options mp_tune_options_default(void);
/* Whether this build trains a Dense layer whose model file says
 * "mx": "<f's element format>" (false for a format that is not MX). */
bool mp_tune_format_trainable(mp_tune_format f);
/* MP_ERR_INVALID with one line naming the bad value. */
mp_status mp_tune_options_validate(const mp_tune_options *o);

/* One tuned layer. */
typedef struct {
    char name[64];
    char type[32];     /* Keras class */
    char shape[48];    /* its kernel's shape: "784x4096" */
    int64_t weights;   /* kernel elements */
    int64_t acts;      /* input activation elements per probe batch */
    unsigned eligible; /* formats this layer can take (mask) */
    bool first, last;  /* the first / last layer that could take fp8 or MX */
    /* per format: the layer's error (NaN: not measured) and its parts */
    double error[MP_TUNE_FORMAT_COUNT];
    double rel[MP_TUNE_FORMAT_COUNT][MP_TUNE_ROLES];
    double flush[MP_TUNE_FORMAT_COUNT][MP_TUNE_ROLES];
    mp_tune_format chosen;
    double bytes_saved; /* (2 - bytes(chosen)) * (weights + acts): vs bfloat16 */
} mp_tune_layer;

typedef struct {
    mp_tune_options options;
    int nlayers;
    mp_tune_layer *layers;
    int64_t samples; /* probe samples actually run */
    double loss;     /* mean probe loss */
    char *config;    /* the tuned model file (JSON text) */
} mp_tune_result;

/* Tune the model of `config` (model file JSON text) on `data`: the model is
 * built in float32 with batches of o->batch_size, o->probe_batches batches
 * (fewer when the data is short) run forward and backward (no optimizer
 * step), and each layer with a kernel is measured and given a format. The
 * tuned config: the same layers, the model policy mixed_bfloat16, and on
 * each tuned layer "policy" (float32, mixed_bfloat16 or mixed_float16),
 * "float8" (true for fp8, false otherwise on float8-capable kinds) or "mx"
 * (the MX format's forward element format, e.g. "mxfp6_e2m3"). fp8 and MX
 * are eligible only on kinds whose GEMMs take quantized operands (Dense,
 * Conv2D), MX only where this build trains it (o->trainable_only). A model
 * without a layer with a kernel is an error. */
mp_status mp_tune_precision(const char *config, const mp_dataset *data, const mp_tune_options *o,
                            mp_tune_result *out);
/* The table: one row per layer (errors per candidate, '*' on the choice,
 * '-' for a format not measured, brackets around one the layer cannot
 * take, a letter for the tensor that sets the error), then totals;
 * details: each tensor's relative error and flushed fraction too. */
void mp_tune_print(const mp_tune_result *r, bool details, FILE *out);
/* Write r->config to path (atomically: a temporary file renamed). */
mp_status mp_tune_write_config(const mp_tune_result *r, const char *path);
void mp_tune_result_free(mp_tune_result *r);

#ifdef __cplusplus
}
#endif
#endif
