/* mixprec/nn.h - precision policies, layers, functional models, losses and
 * the precision plan (model summary). Included by mixprec.h. */
/* The whole API, in order: this part compiles when included alone. */
#include "../mixprec.h"

#ifndef MIXPREC_NN_H
#define MIXPREC_NN_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- policy */

/* A Keras dtype policy: layers compute in `compute` and keep variables in
 * `variable`. Names: float32, mixed_float16, mixed_bfloat16, float16,
 * bfloat16, and mixed_float8: mixed_bfloat16 whose float8-capable layers
 * (Dense, Conv2D, MultiHeadAttention's projections) quantize their GEMM
 * inputs per tensor to fp8 (mixprec/fp8.h:
 * HYBRID, delayed scaling by default; the first and the last such layer,
 * softmax, normalisations and losses stay higher); mixed_mxfp8, mixed_mxfp6
 * and mixed_mxfp4: the same layers with MX block-scaled GEMM inputs
 * (mixprec/mx.h: MXFP8 E4M3, MXFP6 E2M3, MXFP4 E2M1 forward, MXFP8 E5M2
 * gradients). */
typedef struct {
    char name[24];
    mp_dtype compute;
    mp_dtype variable;
    bool float8;            /* GEMM inputs in float8 (mixprec/fp8.h) */
    bool mx;                /* GEMM inputs in MX blocks (mixprec/mx.h) ... */
    mp_mx_format mx_format; /* ... of this element format (forward inputs) */
} mp_policy;

mp_status mp_policy_from_name(const char *name, mp_policy *out);
/* The policy layers get when none is given (default float32). Layers read
 * it when they are created, as in Keras. */
mp_status mp_set_global_policy(const char *name);
mp_policy mp_global_policy(void);
/* Whether the policy keeps float32 master weights apart from the compute copy. */
bool mp_policy_is_mixed(const mp_policy *p);

/* ------------------------------------------------------------------ model */

const char *mp_activation_name(mp_activation a);
mp_status mp_activation_from_name(const char *name, mp_activation *out);

/* What a parameter is for. The role names the tensor ("<layer>.<role>" for
 * the first of its role in a layer) and picks its default initializer:
 * kernels glorot_uniform, embeddings uniform, gamma and moving_variance ones,
 * the others zeros. Moving statistics are non-trainable state. */
typedef enum {
    MP_ROLE_KERNEL = 0,
    MP_ROLE_BIAS = 1,
    MP_ROLE_GAMMA = 2,
    MP_ROLE_BETA = 3,
    MP_ROLE_EMBEDDINGS = 4,
    MP_ROLE_MOVING_MEAN = 5,
    MP_ROLE_MOVING_VARIANCE = 6,
} mp_param_role;
#define MP_ROLE_COUNT 7
const char *mp_param_role_name(mp_param_role r);

/* Initializers, with Keras's names and fan computation: for a shape
 * [..., fan_in_axis, fan_out_axis] the receptive field is the product of the
 * leading dimensions, fan_in = shape[-2] * receptive, fan_out = shape[-1] *
 * receptive (a conv kernel [kh, kw, in, out] gets kh*kw*in and kh*kw*out);
 * a 1-D shape has fan_in = fan_out = its length. */
typedef enum {
    MP_INIT_DEFAULT = 0, /* the role's default */
    MP_INIT_ZEROS = 1,
    MP_INIT_ONES = 2,
    MP_INIT_GLOROT_UNIFORM = 3, /* U(-l, l), l = sqrt(6 / (fan_in + fan_out)) */
    MP_INIT_HE_UNIFORM = 4,     /* l = sqrt(6 / fan_in) */
    MP_INIT_LECUN_UNIFORM = 5,  /* l = sqrt(3 / fan_in) */
    MP_INIT_UNIFORM = 6,        /* U(-0.05, 0.05), Keras's "uniform" */
} mp_initializer;
#define MP_INIT_COUNT 7
const char *mp_initializer_name(mp_initializer i);
mp_status mp_initializer_from_name(const char *name, mp_initializer *out);

struct mp_float8_params;
struct mp_mx_params;

typedef struct {
    const char *name;   /* NULL: Keras-style default (dense, dense_1, ...) */
    const char *policy; /* NULL: the global policy when the layer is added */
    uint64_t seed;      /* initialisers / dropout; 0: derived from the model seed */
    /* per role: MP_INIT_DEFAULT keeps the role's default */
    mp_initializer initializers[MP_ROLE_COUNT];
    /* float8-capable layers (Dense, Conv2D, MultiHeadAttention; mixprec/fp8.h):
     * the recipe's settings
     * (NULL: the global ones when the layer is added), and whether the
     * layer computes in float8: 0 as its policy says (the first and last
     * such layer excepted unless keep_first_last is false), 1 always, -1
     * never */
    const struct mp_float8_params *float8_params;
    int float8;
    /* the same layers in MX (mixprec/mx.h): the formats (NULL: the global
     * ones, with an MX policy's forward format when the policy has one),
     * and whether the layer computes on MX inputs: 0 as its policy says, 1
     * always, -1 never. A layer is not float8 and MX at once. */
    const struct mp_mx_params *mx_params;
    int mx;
} mp_layer_options;

typedef struct mp_model mp_model;
/* A layer's output inside its model: an index >= 0, or -1 after an error
 * (which is sticky: later calls on the model fail with the first message). */
typedef int32_t mp_node;

mp_model *mp_model_new(uint64_t seed);
/* A model whose layers without an explicit policy take `policy` instead of
 * the global policy (NULL with mp_last_error for an unknown name). */
mp_model *mp_model_new_with_policy(uint64_t seed, const char *policy);
void mp_model_free(mp_model *m);

/* Layers, with Keras's class names, in the order of nn/layers/. Shapes
 * exclude the batch dimension. A layer computes in its policy's compute
 * dtype and casts floating inputs to it. */

/* InputLayer: float32 data (mp_input) or another dtype: MP_I32 for token ids
 * and class indices, which only layers that read integers accept. */
mp_node mp_input(mp_model *m, int ndim, const int64_t *shape, const mp_layer_options *o);
mp_node mp_input_ex(mp_model *m, int ndim, const int64_t *shape, mp_dtype dtype,
                    const mp_layer_options *o);
/* Dense: y = act(x W + b) over the last axis; W [in, units]. Softmax needs
 * its own Activation layer. */
mp_node mp_dense(mp_model *m, mp_node x, int64_t units, mp_activation act,
                 const mp_layer_options *o);
mp_node mp_activation_layer(mp_model *m, mp_node x, mp_activation act, const mp_layer_options *o);
/* Dropout: in training, zero with probability rate and scale the rest by
 * 1 / (1 - rate); the mask is keyed by (layer seed, forward count). */
mp_node mp_dropout(mp_model *m, mp_node x, float rate, const mp_layer_options *o);
/* Flatten and Reshape move no data (a view) unless the input is user data or
 * in another dtype. Reshape: one dimension may be -1 (inferred). */
mp_node mp_flatten(mp_model *m, mp_node x, const mp_layer_options *o);
mp_node mp_reshape(mp_model *m, mp_node x, int ndim, const int64_t *shape,
                   const mp_layer_options *o);
/* Add: the elementwise sum of two or more inputs of one shape. */
mp_node mp_add(mp_model *m, mp_node a, mp_node b, const mp_layer_options *o);
mp_node mp_add_n(mp_model *m, int n, const mp_node *inputs, const mp_layer_options *o);
/* LayerNormalization over the last axis; statistics and gamma/beta float32. */
mp_node mp_layer_norm(mp_model *m, mp_node x, float epsilon, const mp_layer_options *o);

/* BatchNormalization over every axis but the last (channels-last), with
 * Keras's semantics: in training the batch's mean and (biased) variance
 * normalize, and the moving statistics follow
 *   moving = moving * momentum + batch * (1 - momentum);
 * outside training the moving statistics normalize. Statistics, gamma, beta
 * and the moving statistics (non-trainable state) are float32 under every
 * policy; the output is in the compute dtype. */
typedef struct {
    float momentum; /* 0.99 */
    float epsilon;  /* 1e-3 */
    bool center;    /* beta */
    bool scale;     /* gamma */
} mp_batch_norm_options;
mp_batch_norm_options mp_batch_norm_options_default(void);
mp_node mp_batch_norm(mp_model *m, mp_node x, const mp_batch_norm_options *bn,
                      const mp_layer_options *o);

/* Embedding: int32 ids [batch, ...] in 0..input_dim-1 become rows of an
 * [input_dim, output_dim] table: output [batch, ..., output_dim] in the
 * compute dtype. An id outside the table fails the forward pass. */
mp_node mp_embedding(mp_model *m, mp_node ids, int64_t input_dim, int64_t output_dim,
                     const mp_layer_options *o);

/* PositionEmbedding: a learned table [sequence_length, width] added to a
 * sequence x [batch, T, width] (T <= sequence_length): out[b, t] = x[b, t] +
 * P[t] in the compute dtype (keras_hub's PositionEmbedding followed by the
 * Add, in one layer). A context longer than the table is refused at build. */
mp_node mp_position_embedding(mp_model *m, mp_node x, int64_t sequence_length,
                              const mp_layer_options *o);

/* ReversibleEmbedding (keras_hub's, used with reverse=True): logits x E^T
 * [..., vocabulary] from x [..., width] and the table E [vocabulary, width]
 * of the earlier Embedding layer named `embedding` - a language model's
 * output projection tied to its input embedding (no bias, no parameter of
 * its own: the table's gradient sums both uses). */
mp_node mp_reversible_embedding(mp_model *m, mp_node x, const char *embedding,
                                const mp_layer_options *o);

/* MultiHeadAttention (Keras) with the causal mask, use_causal_mask = true
 * being the only mask supported: query, value and key [batch, T, model_dim]
 * of one shape (mp_multi_head_attention: self-attention on x; _ex takes 1-3
 * inputs in Keras's call order, the key defaulting to the value and the
 * value to the query). Per head h: softmax(Q_h K_h^T / sqrt(key_dim) + mask)
 * V_h with Q = x_q Wq + bq, ...; output [batch, T, model_dim] = A Wo + bo.
 * Kernels query/key/value [model_dim, num_heads, key_dim] (biases
 * [num_heads, key_dim]) and attention_output [num_heads, key_dim,
 * model_dim] (bias [model_dim]), named "<layer>.query.kernel", ...; glorot
 * with Keras's fans. value_dim = key_dim, no attention dropout. Projections
 * in the compute dtype with float32 accumulation; the softmax and its
 * statistics float32 under every policy, in a fused kernel that stores no
 * [T, T] matrix. */
typedef struct {
    int64_t num_heads;
    int64_t key_dim;
    bool use_bias;        /* true */
    bool use_causal_mask; /* true (false is refused) */
} mp_multi_head_attention_options;
mp_multi_head_attention_options mp_multi_head_attention_options_default(int64_t num_heads,
                                                                        int64_t key_dim);
mp_node mp_multi_head_attention(mp_model *m, mp_node x, const mp_multi_head_attention_options *a,
                                const mp_layer_options *o);
mp_node mp_multi_head_attention_ex(mp_model *m, int n, const mp_node *inputs,
                                   const mp_multi_head_attention_options *a,
                                   const mp_layer_options *o);

/* Image layers, channels-last: inputs [batch, height, width, channels]; any
 * other rank is refused at creation. A window (kernel or pool) of kh x kw
 * moves by strides (sh, sw). Padding, as Keras computes it:
 *   valid  no padding: out = floor((in - span) / stride) + 1, span = (k - 1)
 *          * dilation + 1; a window larger than the input is refused;
 *   same   out = ceil(in / stride), padded by max((out - 1) * stride + span
 *          - in, 0) of which the odd one goes at the bottom/right. */
typedef enum { MP_PADDING_VALID = 0, MP_PADDING_SAME = 1 } mp_padding;

/* Conv2D: y[n, i, j, o] = act(b[o] + sum over (a, e, c) of
 * x[n, i*sh - pt + a*dh, j*sw - pl + e*dw, c] * w[a, e, c, o]), zero outside
 * the image. Kernel [kh, kw, in, filters] (glorot_uniform with Keras's conv
 * fans: kh*kw*in, kh*kw*filters), bias [filters]. One implicit GEMM in the
 * compute dtype with float32 accumulation; linear and relu fuse into it, the
 * other activations keep the pre-activation. Keras refuses strides > 1
 * together with dilation > 1, and so does this. */
typedef struct {
    int64_t filters;
    int64_t kernel_size[2];   /* kh, kw */
    int64_t strides[2];       /* {1, 1} */
    mp_padding padding;       /* valid */
    int64_t dilation_rate[2]; /* {1, 1} */
    bool use_bias;            /* true */
    mp_activation activation; /* linear; not softmax */
} mp_conv2d_options;
mp_conv2d_options mp_conv2d_options_default(int64_t filters, int64_t kh, int64_t kw);
mp_node mp_conv2d(mp_model *m, mp_node x, const mp_conv2d_options *c, const mp_layer_options *o);

/* DepthwiseConv2D: each channel convolved with its own kh x kw filter,
 * y[n, i, j, c] = act(b[c] + sum over (a, e) of x[n, i*sh - pt + a*dh,
 * j*sw - pl + e*dw, c] * w[a, e, c, 0]). Kernel [kh, kw, channels, 1] as
 * Keras stores it (glorot_uniform with its fans kh*kw*channels, kh*kw),
 * bias [channels]. Depth multiplier 1 only. Direct loops, float32
 * arithmetic; the kernel gradient sums the batch in a fixed order. */
typedef struct {
    int64_t kernel_size[2];
    int64_t strides[2];       /* {1, 1} */
    mp_padding padding;       /* valid */
    int64_t depth_multiplier; /* 1 (the only one supported) */
    int64_t dilation_rate[2]; /* {1, 1} */
    bool use_bias;            /* true */
    mp_activation activation; /* linear; not softmax */
} mp_depthwise_conv2d_options;
mp_depthwise_conv2d_options mp_depthwise_conv2d_options_default(int64_t kh, int64_t kw);
mp_node mp_depthwise_conv2d(mp_model *m, mp_node x, const mp_depthwise_conv2d_options *c,
                            const mp_layer_options *o);

/* MaxPooling2D and AveragePooling2D over pool_size windows, per channel, in
 * float32 on the compute-dtype input. Max: the largest element (NaN wins),
 * its gradient to the first maximal element of the window. Average with
 * `same` padding divides by the number of elements inside the image, as
 * Keras does. NULL options: pool 2x2, strides = pool, valid. */
typedef struct {
    int64_t pool_size[2]; /* {2, 2} */
    int64_t strides[2];   /* {0, 0}: pool_size (Keras's None) */
    mp_padding padding;   /* valid */
} mp_pooling2d_options;
mp_pooling2d_options mp_pooling2d_options_default(void);
mp_node mp_max_pooling2d(mp_model *m, mp_node x, const mp_pooling2d_options *p,
                         const mp_layer_options *o);
mp_node mp_average_pooling2d(mp_model *m, mp_node x, const mp_pooling2d_options *p,
                             const mp_layer_options *o);
/* GlobalAveragePooling2D: the mean over height and width (float64 sums),
 * output [batch, channels]. */
mp_node mp_global_average_pooling2d(mp_model *m, mp_node x, const mp_layer_options *o);
/* ZeroPadding2D: top/bottom rows and left/right columns of zeros (each >= 0). */
mp_node mp_zero_padding2d(mp_model *m, mp_node x, int64_t top, int64_t bottom, int64_t left,
                          int64_t right, const mp_layer_options *o);

/* Data augmentation: Keras preprocessing layers for images [batch, height,
 * width, channels] (any other rank is refused at creation) that act only in
 * training; outside training (evaluate, predict) they are the identity. In
 * training each sample draws its own transform from a hash of (layer seed,
 * training forward count, sample), so a run resumed from a checkpoint draws
 * the same. Values are moved, never rounded (the output is the input in the
 * compute dtype, rearranged), and backward moves the gradient back.
 *
 * RandomFlip: each sample mirrored with probability 1/2 per axis of `mode`
 * (horizontal_and_vertical: each axis independently). */
typedef enum {
    MP_FLIP_HORIZONTAL = 1,              /* left-right; the default in JSON */
    MP_FLIP_VERTICAL = 2,                /* top-bottom */
    MP_FLIP_HORIZONTAL_AND_VERTICAL = 3, /* both axes, each with its own draw */
} mp_flip_mode;
mp_node mp_random_flip(mp_model *m, mp_node x, mp_flip_mode mode, const mp_layer_options *o);
/* RandomTranslation: each sample shifted by dy = round(u * height) rows and
 * dx = round(v * width) columns (half away from zero), u uniform in
 * [-height_factor, height_factor), v in [-width_factor, width_factor)
 * (factors in [0, 1)), y[i][j] = x[i - dy][j - dx]: positive shifts move the
 * content down and right, and what comes in is 0 (fill_mode "constant",
 * fill_value 0; the only fill supported). */
mp_node mp_random_translation(mp_model *m, mp_node x, float height_factor, float width_factor,
                              const mp_layer_options *o);

/* Fix the model's output, allocate and initialise parameters and state (each
 * by its role's initializer unless the layer overrides it) and size the
 * per-step arenas for batches of up to max_batch. */
mp_status mp_model_build(mp_model *m, mp_node output, int64_t max_batch);

/* Forward pass. x: [batch, input shape...] in any float dtype (in MP_I32 for
 * an integer Input); it must stay
 * valid until backward. *out points into the model's arena (valid until the
 * next forward). training enables dropout. */
mp_status mp_model_forward(mp_model *m, const mp_tensor *x, bool training, const mp_tensor **out);

/* Backward pass from dy (the gradient of the loss with respect to the model
 * output, any float dtype, output shape). Parameter gradients are float32;
 * accumulate adds to them instead of overwriting. */
mp_status mp_model_backward(mp_model *m, const mp_tensor *dy, bool accumulate);

/* ----------------------------------------------------------------- losses */

typedef enum {
    MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY,
    MP_LOSS_CATEGORICAL_CROSSENTROPY,
    MP_LOSS_BINARY_CROSSENTROPY,
    MP_LOSS_MEAN_SQUARED_ERROR,
} mp_loss_kind;

typedef struct {
    mp_loss_kind kind;
    bool from_logits;
    const int32_t *labels;   /* sparse: one class index per sample */
    const mp_tensor *target; /* other losses: same shape as the prediction */
    /* samples the mean is taken over (0: this batch's rows); data parallel
     * passes the global batch, so that each rank's share of the loss and of
     * its gradient is exactly its rows' part of the global mean */
    int64_t mean_rows;
} mp_loss_spec;

const char *mp_loss_name(mp_loss_kind k);
mp_status mp_loss_from_name(const char *name, mp_loss_kind *out);

/* Mean loss over the batch, computed in float32 (float64 sums) whatever the
 * prediction's dtype. If grad is non-NULL it receives d(loss * scale)/d(pred)
 * in grad->dtype (same shape as pred). */
mp_status mp_loss_compute(const mp_loss_spec *spec, const mp_tensor *pred, float scale, float *loss,
                          mp_tensor *grad);

/* Loss of the last forward's output and backward through the model, with the
 * gradient scaled by `scale` (loss scaling). When the model ends in a softmax
 * and the loss is a cross-entropy on probabilities, loss and gradient are
 * computed from the softmax's logits in one stable pass (as Keras does). */
mp_status mp_model_loss_backward(mp_model *m, const mp_loss_spec *spec, float scale,
                                 bool accumulate, float *loss);

/* ------------------------------------------------------------- inspection */

typedef struct {
    const char *name;
    const char *type; /* Keras class name: "Dense", "InputLayer", ... */
    mp_policy policy;
    bool policy_explicit; /* given to this layer (kept when a saved model is
                           * rebuilt under another policy) */
    int ninputs;
    const mp_node *inputs;
    mp_dtype output_dtype;
    int ndim; /* of the output, batch excluded */
    int64_t shape[MP_MAX_DIMS];
    int64_t params;         /* trainable parameter elements */
    int64_t state;          /* non-trainable state elements (moving statistics) */
    size_t param_bytes;     /* masters + compute copies + state */
    size_t saved_bytes;     /* activation arena bytes per forward at batch */
    size_t workspace_bytes; /* upper bound of its backward's workspace at batch */
    bool float8;            /* its GEMM inputs are quantized to float8 (mixprec/fp8.h):
                             * saved_bytes then holds the input's fp8 codes, one byte
                             * an element, when the input would otherwise be copied */
    bool mx;                /* its GEMM inputs are MX-quantized (mixprec/mx.h) */
} mp_layer_info;

int mp_model_num_layers(const mp_model *m);
/* Plan for batch size `batch` (<= max_batch). */
mp_status mp_model_layer_info(const mp_model *m, int layer, int64_t batch, mp_layer_info *out);
/* Keras-like summary with the precision plan and per-category memory totals. */
mp_status mp_model_summary(const mp_model *m, int64_t batch, FILE *out);

/* The memory a training step at `batch` plans, per category, for an
 * optimizer keeping `optimizer_slots` float32 values per trainable
 * parameter (Adam 2, SGD with momentum 1, plain SGD 0). Activations are what
 * the arena hands out, workspace the backward pass's upper bound; the GEMM's
 * per-thread packing buffers (a few MiB) are not in it. Any batch >= 1,
 * also above the built max_batch (see mp_model_set_max_batch). */
typedef struct {
    size_t master_weights, weights, state, gradients, optimizer_state, activations, workspace;
    size_t total;
} mp_memory_plan;
mp_status mp_model_memory_plan(const mp_model *m, int64_t batch, int optimizer_slots,
                               mp_memory_plan *out);
/* The largest batch (<= limit_batch) whose planned total fits `bytes`, or 0
 * when not even a batch of 1 fits. */
int64_t mp_model_batch_for_memory(const mp_model *m, size_t bytes, int optimizer_slots,
                                  int64_t limit_batch);
/* Re-size a built model's arenas for batches up to max_batch. */
mp_status mp_model_set_max_batch(mp_model *m, int64_t max_batch);

/* Parameters and non-trainable state, in creation order. State (trainable
 * false) has no gradient and no optimizer slot, is float32 under every
 * policy, and is saved and restored with the parameters. */
typedef struct {
    const char *name; /* "<layer>.kernel", "<layer>.bias", "<layer>.moving_mean", ... */
    mp_param_role role;
    bool trainable;
    int ndim;
    int64_t shape[MP_MAX_DIMS];
    int64_t n;
    float *master; /* float32 master (NULL under a pure low-precision policy) */
    void *weight;  /* what the forward pass reads, in weight_dtype (== master for float32);
                    * after masters change outside the optimizer (a load) it is
                    * refreshed at the next forward */
    mp_dtype weight_dtype;
    float *grad; /* float32 gradient (NULL for state) */
} mp_model_param;

int mp_model_num_params(const mp_model *m);
mp_model_param *mp_model_get_param(mp_model *m, int i);
/* Tell the model that masters changed outside the optimizer: the compute
 * copies are refreshed before the next forward. */
void mp_model_mark_masters_changed(mp_model *m);
/* How many times compute copies were refreshed from masters (for tests). */
uint64_t mp_model_weight_refreshes(const mp_model *m);
/* The arenas' figures of the last forward/backward. */
size_t mp_model_activation_bytes(const mp_model *m);
size_t mp_model_workspace_bytes(const mp_model *m);
/* The tensor a node produced in the last forward (NULL if none). An output
 * no backward reads in full (a relu Dense or LayerNormalization whose
 * consumers are all float8 layers, which keep its codes) lives only until
 * the backward begins: NULL after it. A BatchNormalization whose only
 * consumer is a relu Activation writes its result rectified for that
 * Activation (one pass less each way) and reports none of its own: NULL
 * (and NULL for its gradient, mp_model_node_grad). */
const mp_tensor *mp_model_node_output(const mp_model *m, mp_node node);
/* The gradient reaching a node in the last backward (NULL if none, or for
 * a BatchNormalization with its relu fused: see mp_model_node_output). */
const mp_tensor *mp_model_node_grad(const mp_model *m, mp_node node);

/* Incremental decoding (text generation with a key/value cache). m is a
 * model whose input holds one position ([batch, 1] int32 ids, batch up to
 * max_batch; mp_model_decoder_from_checkpoint builds one from a trained
 * sequence model). reset starts new sequences with room for `capacity`
 * positions; each step runs the input at the next position and returns the
 * model's output there ([batch, 1, ...]): attention layers attend over every
 * position so far from their cache, so a token costs one position, not a
 * rerun of the prefix. A step past the capacity is MP_ERR_INVALID.
 * reset_sequences keeps caches for `sequences` sequences (1..max_batch),
 * and a step's batch may not exceed them; reset for as many as the last
 * reset_sequences said (max_batch before any). */
mp_status mp_model_decode_reset(mp_model *m, int64_t capacity);
mp_status mp_model_decode_reset_sequences(mp_model *m, int64_t capacity, int64_t sequences);
mp_status mp_model_decode_step(mp_model *m, const mp_tensor *x, const mp_tensor **y);
/* A prompt's next positions in one call, for a decoder of one sequence
 * (reset_sequences with 1): x's rows (up to max_batch) are consecutive
 * positions of that sequence, [n, 1] ids for n positions, and y holds the
 * output at each ([n, 1, ...]; the last row predicts the next token). The
 * weight layers make one GEMM of the n rows instead of n one-row GEMMs;
 * the outputs and the cache are bit for bit those of n steps (where no
 * layer quantizes with a scale taken over the whole input: float8 and MX
 * layers may round the rows differently together). */
mp_status mp_model_decode_prefill(mp_model *m, const mp_tensor *x, const mp_tensor **y);
/* Positions decoded since the reset. */
int64_t mp_model_decode_position(const mp_model *m);

/* Shapes without the batch dimension; return the number of dimensions. */
int mp_model_input_shape(const mp_model *m, int64_t *shape);
int mp_model_output_shape(const mp_model *m, int64_t *shape);
/* What the input layer takes: MP_F32, or MP_I32 (token ids). */
mp_dtype mp_model_input_dtype(const mp_model *m);
bool mp_model_is_built(const mp_model *m);
int64_t mp_model_max_batch(const mp_model *m);
/* The compute dtype of the model's first weight layer. */
mp_dtype mp_model_compute_dtype(const mp_model *m);
/* The policy the model was built under: that of its layers without an
 * explicit policy (the global policy when its first layer was added). */
mp_policy mp_model_policy(const mp_model *m);
/* The seed given to mp_model_new; the output node after build (else -1). */
uint64_t mp_model_seed(const mp_model *m);
mp_node mp_model_output(const mp_model *m);
/* Training forward passes so far: the counter that keys dropout masks.
 * Checkpoints save and restore it so a resumed run draws the same masks. */
uint64_t mp_model_forward_count(const mp_model *m);
void mp_model_set_forward_count(mp_model *m, uint64_t count);

/* The global index of the first row of the batches passed from now on
 * (default 0). Random layers (Dropout, RandomFlip, RandomTranslation) draw
 * by global row, so a data-parallel shard or a slice of a batch draws what
 * one process draws for the same rows. */
void mp_model_set_row_offset(mp_model *m, int64_t first_row);
/* Called after each layer's backward, in backward order (node: the layer),
 * until set to NULL; an error stops the backward. After node's backward the
 * gradients of parameters mp_model_params_final_after(m, node) onwards are
 * final: a layer may use the parameters of layers added before it (a tied
 * embedding), never of those after. Data parallel hands them on to the
 * reduction over the ranks while the layers below still run. */
typedef mp_status (*mp_backward_hook)(void *user, int node);
void mp_model_set_backward_hook(mp_model *m, mp_backward_hook fn, void *user);
int mp_model_params_final_after(const mp_model *m, int node);

/* Opaque training state (compile/fit) attached to the model and freed with it. */
void *mp_model_training_state(const mp_model *m);
void mp_model_set_training_state(mp_model *m, void *state, void (*free_fn)(void *));

#ifdef __cplusplus
}
#endif
#endif
