/* model_internal.h - the model's layer records, shared by the graph code
 * (model.c), the per-layer passes (layers.c) and the losses (loss.c). */
#ifndef MP_MODEL_INTERNAL_H
#define MP_MODEL_INTERNAL_H

#include "core/internal.h"

typedef struct {
    mp_layer_kind kind;
    char name[64];
    mp_policy policy;
    int inputs[2];
    int ninputs;
    int ndim; /* output, batch excluded */
    int64_t shape[MP_MAX_DIMS];
    mp_dtype out_dtype;
    /* configuration */
    int64_t units;
    mp_activation act;
    float rate, eps;
    uint64_t seed;
    int param_first, nparams;
    bool reachable;
    /* state of the current step */
    mp_tensor out;      /* output (activation arena, or a view) */
    mp_tensor in_saved; /* input kept for backward in the compute dtype */
    mp_tensor pre;      /* Dense pre-activation when the derivative needs it */
    uint8_t *mask;      /* Dropout keep mask */
    float *mean, *rstd; /* LayerNorm statistics */
    mp_tensor grad;     /* gradient w.r.t. the output (workspace arena) */
    bool has_out, has_grad;
} mp_layer;

typedef struct {
    mp_model_param p;
    char name[80];
} param_slot;

struct mp_model {
    mp_layer *layers;
    int nlayers, cap;
    param_slot *params;
    int nparams, pcap;
    uint64_t seed, step;
    mp_status err;
    char errmsg[256];
    bool built, masters_changed, ran_forward;
    int output;
    int64_t max_batch, batch;
    mp_arena *act, *ws;
    uint64_t refreshes;
    int name_counts[8];
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

/* Per-layer passes (layers.c). */
mp_status mp_layer_forward(mp_model *m, mp_layer *l, const mp_tensor *x, bool training);
mp_status mp_layer_backward(mp_model *m, mp_layer *l, bool accumulate);
/* Activation-arena bytes layer l allocates in a forward at this batch. */
size_t mp_layer_saved_bytes(const mp_model *m, const mp_layer *l, int64_t batch);
/* Upper bound of the workspace bytes of l's backward at this batch. */
size_t mp_layer_workspace_bytes(const mp_model *m, const mp_layer *l, int64_t batch);
/* Add g (any dtype) to the gradient of node `node`. */
mp_status mp_model_add_grad(mp_model *m, int node, const void *g, mp_dtype gt);

#endif
