/* model_internal.h - the model's records: its layers (each with the table of
 * operations of its kind), parameters and arenas. Shared by the graph code
 * (model.c, params.c, summary.c), the layer kinds (the files under layers/, through
 * layer.h) and the losses (loss.c). */
#ifndef MP_MODEL_INTERNAL_H
#define MP_MODEL_INTERNAL_H

#include "core/internal.h"

typedef struct mp_layer mp_layer;
typedef struct mp_layer_ops mp_layer_ops;
struct json_t;

struct mp_layer {
    const mp_layer_ops *ops;
    int index;
    char name[64];
    bool auto_named;
    mp_policy policy;
    bool policy_explicit;
    int *inputs;
    int ninputs;
    int ndim; /* output, batch excluded */
    int64_t shape[MP_MAX_DIMS];
    mp_dtype out_dtype;
    uint64_t seed;
    mp_initializer init[MP_ROLE_COUNT]; /* overrides; MP_INIT_DEFAULT: the role's */
    int param_first, nparams;
    bool reachable;
    void *config; /* the kind's settings (ops->config_size bytes) */
    void *state;  /* the kind's per-step records (ops->state_size bytes) */
    /* every layer's step state */
    mp_tensor out;  /* output (activation arena, or a view) */
    mp_tensor grad; /* gradient w.r.t. the output (workspace arena) */
    bool has_out, has_grad;
    /* grad is another node's gradient, shared as it was passed through
     * unchanged (mp_model_share_grad): read-only, replaced on a second
     * contribution */
    bool grad_shared;
    /* relu fusion (model.c, plan_relu_fusion): a layer whose kind fuses
     * relu (ops->fuses_relu) and whose only consumer is a relu (ops->is_relu)
     * writes its result rectified, reports no output or gradient of its own
     * (mp_model_node_output, mp_model_node_grad: NULL) and applies relu's
     * derivative to the gradient it gets; that consumer (relu_view) views
     * the result and hands its gradient on unchanged. The same bits as the
     * two passes. */
    bool relu_fused, relu_view;
    /* its output lives only through the forward (layer.h, mp_output_use) */
    bool out_dropped;
    /* a dropped output whose backward reads its sign (y > 0) reads it from
     * the float8 codes its consumer sign_from keeps of it (nn/quant.h,
     * keeps_sign; that consumer's forward sets sign_codes, of sign_type)
     * or, sign_from -1, from a bit mask it keeps itself (sign_bits) */
    int sign_from;
    const uint8_t *sign_codes;
    mp_dtype sign_type;
    uint8_t *sign_bits;
    /* float8 (kinds whose ops->float8 is set; nn/fp8_model.c): the
     * recipe's settings, the layer's choice (0 as the policy says, 1 on, -1
     * off), whether build made it compute in float8 and its first meta */
    mp_float8_params fp8_params;
    int fp8_mode;
    bool fp8_active;
    int fp8_first;
    /* MX (the same kinds; nn/mx_quant.c): the formats, the layer's choice
     * (0 as the policy says, 1 on, -1 off), whether build made it compute
     * on MX inputs and its first meta */
    mp_mx_params mx_params;
    int mx_mode;
    bool mx_active;
    int mx_first;
};

/* Whether layer l's GEMMs read quantized operands (float8 or MX): the
 * quantized steps of nn/quant.h then run them. */
static inline bool mp_layer_quantized(const mp_layer *l) { return l->fp8_active || l->mx_active; }

typedef struct {
    mp_model_param p;
    char name[80];
    bool float32_only; /* read as float32: no compute copy under any policy */
    /* set by the first layer that writes p.grad in a backward pass, cleared
     * when the pass starts: a parameter two layers share (a tied embedding
     * table) takes the second writer's part as a sum */
    bool grad_written;
    /* set by a layer whose backward wrote all of p.grad and saw every
     * value finite as it did (Dense: its GEMM's c_nonfinite), cleared when
     * the pass starts: the step's check before the optimizer need not read
     * that gradient again (mp_model_grad_seen_finite) */
    bool grad_finite;
} param_slot;

struct mp_model {
    mp_layer *layers;
    int nlayers, cap;
    param_slot *params;
    int nparams, pcap;
    uint64_t seed, step;
    mp_policy policy; /* of the layers without an explicit one */
    bool has_policy;
    bool policy_fixed; /* mp_model_new_with_policy: not the global one */
    mp_status err;
    char errmsg[256];
    bool built, masters_changed, ran_forward;
    int output, input; /* nodes; input: the data input the output depends on */
    int64_t max_batch, batch;
    /* the global index of this batch's first row (data parallel: the
     * shard's), which random layers draw by (mp_model_set_row_offset) */
    int64_t row_offset;
    /* called after each layer's backward (mp_model_set_backward_hook) */
    mp_backward_hook after_backward;
    void *after_backward_user;
    const mp_tensor *x; /* the data of the forward in progress */
    /* incremental decoding (decode.c): the sequence position of the input's
     * first token (0 otherwise), the positions and sequences the layers'
     * key/value caches hold (capacity 0: not decoding), and whether the
     * forward in progress is a prefill: its batch's rows are consecutive
     * positions of the first sequence, not sequences of their own */
    int64_t position, decode_capacity, decode_sequences;
    bool prefill;
    /* act: what forward keeps for backward; ws: the gradients of the nodes
     * during backward; tmp: one layer's temporaries, emptied after each
     * layer's forward or backward (so it is as big as the largest layer
     * needs, not their sum) */
    mp_arena *act, *ws, *tmp;
    uint64_t refreshes;
    /* the float8 recipe's tensors, MP_FLOAT8_ROLES per float8 layer */
    struct mp_float8_meta *fp8;
    int nfp8;
    /* the MX quantizer's tensors, MP_FLOAT8_ROLES per MX layer (stateless:
     * their formats only) */
    struct mp_float8_meta *mx;
    int nmx;
    /* compile/fit state owned by train/ (the model only frees it) */
    void *training;
    void (*training_free)(void *);
};

/* Rows and columns of a [batch, shape...] tensor seen as a matrix over the
 * last axis. */
static inline int64_t layer_cols(const mp_layer *l) { return l->ndim ? l->shape[l->ndim - 1] : 1; }
static inline int64_t layer_numel(const mp_layer *l, int64_t batch)
{
    int64_t n = batch;
    for (int i = 0; i < l->ndim; i++) n *= l->shape[i];
    return n;
}

/* Bytes an arena hands out for a request (64-byte granules). */
static inline size_t arena_bytes(size_t n) { return (n + 63) & ~(size_t)63; }

/* Record the model's first error (sticky) and return its status. */
mp_status mp_model_fail(mp_model *m, mp_status s, const char *fmt, ...) MP_PRINTF(3, 4);

/* Build's output plans (plan.c): dropped outputs (layer.h, mp_output_use;
 * after the float8 plan, on which compact forms depend), then relu fusion
 * (mp_layer.relu_fused). */
void mp_plan_dropped_outputs(mp_model *m);
void mp_plan_relu_fusion(mp_model *m);

/* Parameters (params.c): allocation and initialisation at build. */
mp_status mp_model_init_params(mp_model *m, mp_layer *l);
void mp_model_free_params(mp_model *m);

/* Exact arena bytes of layer l's forward; the bytes its output's gradient
 * takes in the gradient arena; the upper bound of its temporaries in a
 * forward or backward (the precision plan uses the same). */
size_t mp_layer_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch);
size_t mp_layer_grad_bytes(const mp_model *m, const mp_layer *l, int64_t batch);
size_t mp_layer_temp_bytes(const mp_model *m, const mp_layer *l, int64_t batch);
/* Add g (any dtype) to the gradient of node `node`. */
mp_status mp_model_add_grad(mp_model *m, int node, const void *g, mp_dtype gt);
/* The same for a gradient g that stays unchanged in the workspace arena
 * until backward ends (a layer's own gradient passed through): node's
 * gradient becomes a view of it when it is the first contribution in the
 * node's dtype and shape, so no copy is made; a later contribution then
 * sums into a new buffer (the same bits as a copy accumulated in place). */
mp_status mp_model_share_grad(mp_model *m, int node, const mp_tensor *g);

/* Whether the backward pass just run saw every value of gradient `grad`
 * finite as it wrote it (param_slot.grad_finite); false when unknown. */
bool mp_model_grad_seen_finite(const mp_model *m, const float *grad);

#endif
