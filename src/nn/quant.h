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
#include <stdatomic.h>

#include "core/internal.h"

/* A quantized GEMM operand. */
typedef struct {
    const void *data;
    mp_dtype dtype;
    float inv_scale; /* the GEMM result is multiplied by the product of both operands' */
} mp_quant_operand;

/* A tensor as one GEMM pass reads it: rows x cols, row-major, the
 * reduction running down the rows (k_axis 0) or along each row (1). */
typedef struct {
    const void *x;
    mp_dtype dtype;
    int64_t rows, cols;
    int k_axis;
} mp_quant_input;

typedef enum {
    MP_QUANT_TRAIN = 0, /* a training pass: the tensor's statistics are recorded */
    MP_QUANT_INFER = 1, /* an inference pass: nothing is recorded */
    MP_QUANT_AGAIN = 2, /* backward: give what the last forward gave for this tensor */
} mp_quant_mode;

typedef struct mp_float8_meta mp_float8_meta;

/* A quantizer: how a tensor becomes a GEMM operand, and the compact form
 * a layer may keep of it for backward. */
typedef struct {
    const char *name;
    /* the operand of one pass serves the other passes too (per-tensor
     * scales); false (MX blocks along the reduction): each pass quantizes */
    bool pass_invariant;
    /* bytes of the GEMM operand, and of the kept form, for rows x cols */
    size_t (*operand_bytes)(int64_t rows, int64_t cols);
    size_t (*stored_bytes)(int64_t rows, int64_t cols);
    /* in -> operand (and the kept form into `stored` unless NULL) */
    void (*quantize)(mp_float8_meta *q, const mp_quant_input *in, mp_quant_mode mode, void *stored,
                     void *operand, mp_quant_operand *out);
    /* the operand again from the kept form, as the forward gave it */
    void (*restore)(const mp_float8_meta *q, const void *stored, int64_t rows, int64_t cols,
                    void *operand, mp_quant_operand *out);
} mp_quantizer;

/* Per-tensor float8 (mixprec/fp8.h): the operand is the fp8 values decoded
 * to bfloat16 (exact), so the GEMM runs at the bfloat16 rate and gives the
 * numbers fp8 inputs with float32 accumulation give; the kept form is the
 * fp8 codes, one byte an element. */
extern const mp_quantizer mp_quantizer_float8;

/* MX blocks (mixprec/mx.h, nn/mx_quant.c): each pass quantizes its
 * operands in blocks of 32 along its reduction axis, decoded to bfloat16
 * where exact, else float32, factor 1; nothing is kept for backward. */
extern const mp_quantizer mp_quantizer_mx;

/* The state of one quantized tensor (one role of one layer). */
struct mp_float8_meta {
    const mp_quantizer *ops; /* how its tensor is quantized */
    mp_mx_format mx_format;  /* the MX quantizer's element format */
    char name[96];
    const char *layer;
    mp_float8_role role;
    mp_dtype dtype;
    mp_float8_params params;
    float scale;    /* what the next pass quantizes with */
    float *history; /* params.amax_history_len amaxes, newest first */
    float pending;  /* the max amax seen since the last commit */
    bool has_pending;
    /* the kept codes (stored) carry x > 0 for x's producer (layer.h): the
     * cast takes +-0 to 0x00 and a positive x that it would take to zero
     * to 0x80 (-0), a negative one to 0x00; only signs of zeros change, and
     * every GEMM sum starts from +0, on which a zero's sign has no effect.
     * x > 0 is then: code 0x80, or a code that decodes to more than 0
     * (mp_op_code_mask_grad). Set at setup from the plan (sign_from). */
    bool keeps_sign;
    void *codes;    /* a persistent operand buffer (kernels), or NULL */
    size_t codes_n; /* its bytes */
    /* A kernel's operand written by the optimizer as it updates the master
     * (delayed scaling; mp_float8_meta_arm below): the threads' shares of
     * the update under way, the scale it quantizes with, and whether the
     * operand holds the master quantized with fresh_scale (fresh_amax its
     * amax), which spares the next forward its quantization. Atomic: an
     * update that runs unarmed clears it from its threads. */
    struct mp_float8_part *parts;
    int nparts;
    bool armed;
    atomic_bool fresh;
    float armed_scale, fresh_scale, fresh_amax;
    uint64_t fresh_uses; /* forwards that took the update's operand (tests) */
};

/* Initialise / release one meta (history zeroed, scale 1). */
mp_status mp_float8_meta_init(mp_float8_meta *q, const char *layer, mp_float8_role role,
                              const mp_float8_params *p);
void mp_float8_meta_release(mp_float8_meta *q);
/* Record an amax seen in a training pass (kept as the max until commit). */
void mp_float8_meta_record(mp_float8_meta *q, float amax);
/* keep: push the pending amax (if any) into the history and recompute the
 * scale (delayed scaling); else drop it. */
void mp_float8_meta_commit(mp_float8_meta *q, bool keep);
/* The scale mp_float8_meta_commit(q, keep) would set now. */
float mp_float8_meta_next_scale(const mp_float8_meta *q, bool keep);
/* A kernel's operand from the optimizer's update (Transformer Engine
 * quantizes its fp8 weights in the optimizer too): arm before the update
 * with the scale the commit after it will set (threads: the update's);
 * mp_float8_meta_update_chunk is the optimizer's update hook (ctx = q),
 * quantizing each chunk of the new master into q->codes while it is in
 * cache; settle after the commit, n the kernel's values: the operand is
 * fresh when the update wrote all of it with the scale the commit set.
 * The next forward then takes it as it is: the same bits as quantizing the
 * master there. An update that does not run leaves the operand as it was
 * (a skipped step); one that runs unarmed (a custom loop) makes it stale. */
mp_status mp_float8_meta_arm(mp_float8_meta *q, float scale, int threads);
void mp_float8_meta_update_chunk(void *ctx, int thread, const float *w, int64_t off, int64_t len);
void mp_float8_meta_settle(mp_float8_meta *q, int64_t n);
/* Restore a history (newest first) and scale, as a checkpoint holds them. */
void mp_float8_meta_set_history(mp_float8_meta *q, const float *in, float scale);

/* ------------------------------------------------------ in the model */

typedef struct mp_model mp_model;
typedef struct mp_layer mp_layer;

/* At build, before the parameters are allocated: decide which layers
 * compute in float8 (l->fp8_active; their kernels then keep no compute
 * copy, being quantized from the float32 master). After: create their
 * metas (3 each, in layer order) and the kernels' operand buffers. */
void mp_float8_model_plan(mp_model *m);
mp_status mp_float8_model_setup(mp_model *m);
void mp_float8_model_free(mp_model *m);
/* Kernels quantized by the optimizer's update (mp_float8_meta_arm): the
 * kernel meta whose float32 master is `master` (a float8 GEMM's kernel
 * with delayed scaling: the one to hook to its update), else NULL; arm
 * them all before an optimizer step that will be committed (the scales
 * the commit will set, all pending amaxes known), settle them after the
 * commit; masters changed outside the optimizer: none is fresh. */
mp_float8_meta *mp_float8_kernel_meta(mp_model *m, const float *master);
mp_status mp_float8_model_arm(mp_model *m);
void mp_float8_model_settle(mp_model *m);
void mp_float8_model_masters_changed(mp_model *m);
/* The metas of layer l (MP_FLOAT8_ROLES of them), NULL when l is not float8. */
mp_float8_meta *mp_float8_layer_metas(mp_model *m, const mp_layer *l);
/* Those of a quantized layer (float8 or MX; mp_layer_quantized), else NULL. */
mp_float8_meta *mp_quant_layer_metas(const mp_model *m, const mp_layer *l);

/* MX in the model (nn/mx_quant.c). At creation: the layer's options (its
 * formats and choice, checked; the error names the layer). At plan: whether
 * it computes on MX inputs (edge: the first or last quantizable layer).
 * After: its metas (3 each, in layer order). */
mp_status mp_mx_layer_init(mp_layer *l, const mp_layer_options *o);
bool mp_mx_layer_plan(const mp_layer *l, bool edge);
mp_status mp_mx_model_setup(mp_model *m);
void mp_mx_model_free(mp_model *m);
/* The layer fields "mx" (a format name, or false) and "mx_grad" as JSON,
 * and back into options (fmt holds the formats o->mx_params points to). */
void mp_mx_layer_json(const mp_layer *l, json_t *o);
mp_status mp_mx_options_from_json(const json_t *lj, mp_layer_options *o, mp_mx_params *fmt);
/* Bytes of the persistent code buffers (counted as weights). */
size_t mp_float8_model_bytes(const mp_model *m);

/* Tensor i's history (newest first, amax_history_len values of dtype ht)
 * and scale (one value of dtype st), as a checkpoint holds them. */
void mp_float8_model_restore(mp_model *m, int i, const void *history, mp_dtype ht,
                             const void *scale, mp_dtype st);

/* A quantized layer's steps (float8 or MX: mp_layer_quantized; the names
 * say float8 for history; nn/quant_steps.c). A kind quantizes one GEMM
 * (ops->float8_gemms NULL) or several, each with its own MP_FLOAT8_ROLES
 * metas (in that order from mp_quant_layer_metas) and its own kernel: the
 * g-th MP_ROLE_KERNEL parameter. */
int mp_quant_gemms(const mp_layer *l);
mp_model_param *mp_quant_kernel(mp_model *m, const mp_layer *l, int g);
/* Bytes of the operand of kernel w. */
size_t mp_quant_kernel_bytes(const mp_model_param *w, const mp_quantizer *q);
/* A meta's name for GEMM g: "<layer>/<role>" for a kind of one GEMM, else
 * "<layer>/<gemm>/<role>" (q->name holds "<layer>/<role>" on entry). */
void mp_quant_meta_name(mp_float8_meta *q, const mp_layer *l, int g);

/* One GEMM y = x W, x [x_rows, x_cols], y [z_rows, z_cols]: the
 * temporaries its steps take (backward's bound the forward's). */
size_t mp_quant_gemm_workspace(const mp_model *m, const mp_layer *l, int g, int64_t x_rows,
                               int64_t x_cols, int64_t z_rows, int64_t z_cols);
/* Forward: the kernel's operand (from the float32 master when there is
 * one; persistent when one operand serves every pass, else a temporary)
 * and x's (k_axis 1; a temporary), x's compact form into `stored` unless
 * NULL. */
mp_status mp_quant_forward(mp_model *m, mp_layer *l, int g, bool training, const mp_quant_input *x,
                           void *stored, mp_quant_operand *xo, mp_quant_operand *wo);
/* Backward: the operands of the filter gradient (x, dz_w) and of the data
 * gradient (dz_x, w: left as is, the forward's, when one operand serves
 * every pass), from dz [z_rows, z_cols] and x as the forward saw it (its
 * data unused when `stored` holds its compact form); k_axis is set here. */
typedef struct {
    mp_quant_operand x, dz_w, dz_x, w;
} mp_float8_grad_operands;
mp_status mp_quant_backward(mp_model *m, mp_layer *l, int g, const mp_quant_input *dz,
                            const mp_quant_input *x, const void *stored,
                            mp_float8_grad_operands *out);
/* C = op(A) op(B) + beta C (+ bias) on quantized operands: alpha is the
 * product of their 1/scale. */
mp_status mp_quant_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                        const mp_quant_operand *a, int64_t lda, const mp_quant_operand *b,
                        int64_t ldb, float beta, void *c, mp_dtype ct, int64_t ldc,
                        const float *bias);

/* Kinds with one GEMM, over input 0's last axis (Dense; Conv2D through its
 * patches). Whether it can keep input j's compact form (ops->compact_input:
 * a float8 layer's input 0, one operand serving every pass), known at plan.
 * Its compact form is one code an element, so it can carry the input's
 * sign as well (ops->sign_input: the same test; keeps_sign above). Whether
 * its forward keeps it (the input would be copied otherwise, or its
 * producer drops it; layer.h); the activation bytes of its input; its
 * temporaries beyond the kind's own. */
bool mp_float8_compact_input(const mp_model *m, const mp_layer *l, int j);
bool mp_float8_keeps_input(const mp_model *m, const mp_layer *l, int64_t batch);
size_t mp_float8_input_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch);
size_t mp_float8_workspace_bytes(const mp_model *m, const mp_layer *l, int64_t batch);
/* Forward: the input in the compute dtype into *in (kept by the producer,
 * or a temporary when its compact form goes to *stored in the activation
 * arena) and the operands (mp_quant_forward); codes that carry the sign
 * are handed to the producer (its sign_codes). */
mp_status mp_float8_forward(mp_model *m, mp_layer *l, bool training, mp_tensor *in,
                            const void **stored, mp_quant_operand *xo, mp_quant_operand *wo);
/* Backward (mp_quant_backward) from dz and the forward's input. */
mp_status mp_float8_backward(mp_model *m, mp_layer *l, const mp_tensor *dz, const mp_tensor *in,
                             const void *stored, mp_float8_grad_operands *out);

/* A layer's settings as a JSON object of names, and back (defaults for
 * what is absent; an unknown key or bad value fails naming it). */
json_t *mp_float8_params_json(const mp_float8_params *p);
mp_status mp_float8_params_from_json(const json_t *o, mp_float8_params *p);
bool mp_float8_params_equal(const mp_float8_params *a, const mp_float8_params *b);

#endif
