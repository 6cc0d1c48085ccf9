/* quant.h - the hook through which a layer quantizes its GEMM operands, and
 * the per-tensor float8 recipe state behind it (nn/fp8.c) with the model's
 * collection of them (nn/fp8_model.c). Not part of the API.
 *
 * A layer asks for an operand "quantized for this GEMM" and gets what the
 * GEMM reads plus the factor its result must be multiplied by. The
 * per-tensor float8 quantizer gives fp8 codes and 1/scale; a block-scaled
 * (MX) quantizer can fill the same record with decoded values and factor 1
 * (its block scales applied while decoding), along the reduction axis the
 * layer names, without the layer changing. */
#ifndef MP_QUANT_H
#define MP_QUANT_H

#include <jansson.h>

#include "core/internal.h"

/* A quantized GEMM operand. */
typedef struct {
    const void *data;
    mp_dtype dtype;
    float inv_scale; /* the GEMM result is multiplied by the product of both operands' */
} mp_quant_operand;

/* The state of one quantized tensor (one role of one layer). */
typedef struct mp_float8_meta {
    char name[96];
    const char *layer;
    mp_float8_role role;
    mp_dtype dtype;
    mp_float8_params params;
    float scale;    /* what the next pass quantizes with */
    float *history; /* params.amax_history_len amaxes, newest first */
    float pending;  /* the max amax seen since the last commit */
    bool has_pending;
    uint8_t *codes; /* a persistent code buffer (kernels), or NULL */
    size_t codes_n;
} mp_float8_meta;

/* Initialise / release one meta (history zeroed, scale 1). */
mp_status mp_float8_meta_init(mp_float8_meta *q, const char *layer, mp_float8_role role,
                              const mp_float8_params *p);
void mp_float8_meta_release(mp_float8_meta *q);
/* Record an amax seen in a training pass (kept as the max until commit). */
void mp_float8_meta_record(mp_float8_meta *q, float amax);
/* keep: push the pending amax (if any) into the history and recompute the
 * scale (delayed scaling); else drop it. */
void mp_float8_meta_commit(mp_float8_meta *q, bool keep);
/* Restore a history (newest first) and scale, as a checkpoint holds them. */
void mp_float8_meta_set_history(mp_float8_meta *q, const float *in, float scale);

/* Quantize n values x (dtype xt) into codes for q's role: the scale of
 * delayed scaling, or (current scaling) of x's amax now, which becomes q's
 * scale. record: a training pass (the amax goes to pending). */
void mp_float8_quantize_tensor(mp_float8_meta *q, const void *x, mp_dtype xt, size_t n,
                               uint8_t *codes, bool record, mp_quant_operand *out);
/* Quantize with a given scale, recording nothing (re-quantizing what a
 * forward pass quantized, for its backward). */
void mp_float8_requantize(const mp_float8_meta *q, const void *x, mp_dtype xt, size_t n,
                          float scale, uint8_t *codes, mp_quant_operand *out);

/* ------------------------------------------------------ in the model */

typedef struct mp_model mp_model;
typedef struct mp_layer mp_layer;

/* At build: decide which layers compute in float8 (l->fp8_active) and
 * create their metas (3 each, in layer order). */
mp_status mp_float8_model_setup(mp_model *m);
void mp_float8_model_free(mp_model *m);
/* The metas of layer l (MP_FLOAT8_ROLES of them), NULL when l is not float8. */
mp_float8_meta *mp_float8_layer_metas(mp_model *m, const mp_layer *l);
/* Bytes of the persistent code buffers (counted as weights). */
size_t mp_float8_model_bytes(const mp_model *m);

/* Tensor i's history (newest first, amax_history_len values of dtype ht)
 * and scale (one value of dtype st), as a checkpoint holds them. */
void mp_float8_model_restore(mp_model *m, int i, const void *history, mp_dtype ht,
                             const void *scale, mp_dtype st);

/* A layer's settings as a JSON object of names, and back (defaults for
 * what is absent; an unknown key or bad value fails naming it). */
json_t *mp_float8_params_json(const mp_float8_params *p);
mp_status mp_float8_params_from_json(const json_t *o, mp_float8_params *p);
bool mp_float8_params_equal(const mp_float8_params *a, const mp_float8_params *b);

#endif
