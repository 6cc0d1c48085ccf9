/* layer.h - the layer interface. A layer kind is one file under nn/layers/
 * that fills one mp_layer_ops table and one line of the registry
 * (nn/registry.c). The model, the summary, the config loader and the
 * checkpoints reach a kind only through its table: nothing outside the
 * kind's file tests which kind a layer is.
 *
 * The life of a layer:
 *   create   mp_layer_create(m, &ops, inputs, config, options): the model
 *            resolves name, policy, seed and inputs, copies the kind's config
 *            and calls ops->build, which checks it against the inputs, sets
 *            the output shape and dtype and declares parameters and state
 *            (mp_layer_add_param). Constructors (mp_dense, ...) and the JSON
 *            loader (ops->from_json fills the same config) both end here.
 *   build    the model allocates and initialises what was declared, and
 *            sizes its arenas from ops->saved_bytes and workspace_bytes.
 *   forward  ops->forward writes l->out (activation arena or a view).
 *   backward ops->backward reads l->grad, adds float32 parameter gradients
 *            and hands input gradients on (mp_layer_input_grad or
 *            mp_model_add_grad).
 *
 * Conventions: a layer computes in its policy's compute dtype c and casts
 * floating inputs to c (mp_layer_input_compute). Outputs are in l->out_dtype
 * (c unless build says otherwise). Gradients between layers have the dtype
 * of the tensor they belong to; parameter gradients are float32. */
#ifndef MP_LAYER_H
#define MP_LAYER_H

#include <jansson.h>

#include "nn/model_internal.h"

/* What a layer's backward reads of its own output. An output that no
 * backward reads in full (its own reads at most its sign; every consumer
 * keeps a compact form of it) is "dropped": it lives only through the
 * forward, in the gradient arena (unused until backward). When the layer
 * needs the sign, its first consumer's compact form carries it when it can
 * (ops->sign_input: float8 codes, nn/quant.h), else the layer keeps a bit
 * mask. */
typedef enum {
    MP_OUTPUT_READ = 0, /* all of it */
    MP_OUTPUT_SIGN,     /* only whether each element is > 0 (relu) */
    MP_OUTPUT_UNREAD,   /* nothing */
} mp_output_use;

struct mp_layer_ops {
    const char *class_name; /* Keras class: "Dense" */
    const char *base_name;  /* default names: "dense", "dense_1", ... */
    int min_inputs;
    int max_inputs;                  /* -1: any number */
    bool int_inputs;                 /* reads int32 inputs (token ids); others refuse them */
    bool float8;                     /* its GEMMs can take float8 or MX inputs (nn/quant.h): one set
                                      * of MP_FLOAT8_ROLES quantized tensors per GEMM, GEMM g's
                                      * kernel being its g-th MP_ROLE_KERNEL parameter */
    const char *const *float8_gemms; /* their names, NULL-terminated (NULL: one GEMM) */
    size_t config_size;              /* the kind's settings, copied at creation */
    size_t state_size;               /* its per-step records (zeroed at creation) */
    const char *const *fields;       /* its JSON settings, NULL-terminated */

    mp_status (*build)(mp_model *m, mp_layer *l);
    mp_status (*forward)(mp_model *m, mp_layer *l, bool training);
    /* NULL: the layer passes no gradient (a data source) */
    mp_status (*backward)(mp_model *m, mp_layer *l, bool accumulate);
    /* activation-arena bytes of a forward at this batch, exactly */
    size_t (*saved_bytes)(const mp_model *m, const mp_layer *l, int64_t batch);
    /* temporaries (m->tmp) of its forward or backward beyond the input casts
     * and input-gradient temporaries every layer gets (NULL: none) */
    size_t (*workspace_bytes)(const mp_model *m, const mp_layer *l, int64_t batch);
    /* the settings as fields of obj; and back into a zeroed config (errors
     * name the field) */
    mp_status (*to_json)(const mp_layer *l, json_t *obj);
    mp_status (*from_json)(const json_t *obj, void *config);
    /* optional: the float32-softmax logits this layer kept when it is a
     * softmax ending the model, for the fused cross-entropy (else NULL) */
    const mp_tensor *(*softmax_logits)(const mp_model *m, const mp_layer *l);
    /* optional, incremental decoding (decode.c): start m->decode_sequences
     * new sequences with room for `capacity` positions each, in a cache
     * kept outside the arenas (NULL: the layer treats every position alike
     * and keeps none); a forward with m->prefill takes its batch's rows as
     * consecutive positions of the first sequence */
    mp_status (*decode_reset)(mp_model *m, mp_layer *l, int64_t capacity);
    /* optional: free what the layer allocated outside the arenas */
    void (*release)(mp_layer *l);
    /* optional, dropped outputs (model.c plans them): what its backward
     * reads of its own output (NULL: all of it, so it is kept) */
    mp_output_use (*output_use)(const mp_layer *l);
    /* optional: whether its forward keeps a compact form of its own of
     * input j (float8 codes), so that no backward reads the producer's
     * output (NULL: never) */
    bool (*compact_input)(const mp_model *m, const mp_layer *l, int j);
    /* optional: whether that compact form can also carry the sign of input
     * j (x > 0) for its producer's backward, which then keeps no mask:
     * one code an element, cast so when the plan asks (NULL: never) */
    bool (*sign_input)(const mp_model *m, const mp_layer *l, int j);
    /* optional, relu fusion (model.c plans it): whether the layer is a relu
     * and nothing else (an Activation), and whether a layer of this kind
     * can write its result rectified for such a consumer and take that
     * consumer's gradient (see mp_layer.relu_fused) */
    bool (*is_relu)(const mp_layer *l);
    bool fuses_relu;
};

/* ------------------------------------------------------------- registry */

/* The kind with this Keras class name, or NULL. */
const mp_layer_ops *mp_layer_ops_find(const char *class_name);

/* -------------------------------------------------------------- creation */

/* Add a layer of kind ops reading `inputs` with `config` (ops->config_size
 * bytes): the node, or -1 with the model's sticky error. */
mp_node mp_layer_create(mp_model *m, const mp_layer_ops *ops, const mp_node *inputs, int ninputs,
                        const void *config, const mp_layer_options *o);

/* Declare a parameter (or, with MP_PARAM_STATE, non-trainable state) of
 * layer l; build allocates it. Named "<layer>.<name>", name NULL meaning the
 * role's name ("kernel"); its initializer is the layer's override for the
 * role, else the role's default. */
enum {
    MP_PARAM_FLOAT32 = 1, /* read as float32 under every policy (no compute copy) */
    MP_PARAM_STATE = 2,   /* non-trainable float32 state: no gradient, no optimizer slot */
};
mp_status mp_layer_add_param(mp_model *m, mp_layer *l, mp_param_role role, const char *name,
                             int ndim, const int64_t *shape, unsigned flags);
/* Keras's fans of a parameter's shape: the receptive field is the product of
 * all but the last two dimensions; fan_in = shape[-2] * receptive, fan_out =
 * shape[-1] * receptive; a 1-D shape has both equal to its length. */
void mp_param_fans(const mp_model_param *p, double *fan_in, double *fan_out);
/* The j-th parameter l declared. */
static inline mp_model_param *mp_layer_param(mp_model *m, const mp_layer *l, int j)
{
    return &m->params[l->param_first + j].p;
}

/* ---------------------------------------------------- forward/backward aids */

static inline mp_layer *mp_layer_src(mp_model *m, const mp_layer *l, int j)
{
    return &m->layers[l->inputs[j]];
}
static inline const mp_layer *mp_layer_csrc(const mp_model *m, const mp_layer *l, int j)
{
    return &m->layers[l->inputs[j]];
}
/* Input j is user data (a source layer): it takes no gradient and may change
 * before backward. */
static inline bool mp_layer_input_is_data(const mp_model *m, const mp_layer *l, int j)
{
    return mp_layer_csrc(m, l, j)->ops->backward == NULL;
}
static inline bool mp_layer_is_output(const mp_model *m, const mp_layer *l)
{
    return l->index == m->output;
}

mp_status mp_layer_nomem(const mp_layer *l, const char *what);
/* A [batch, shape_of's shape] tensor in dtype t from arena a. */
mp_status mp_layer_alloc(mp_model *m, const mp_layer *shape_of, mp_arena *a, mp_dtype t,
                         mp_tensor *out);
/* l->out, [batch, l's shape] in dtype t: in the activation arena, or in
 * the gradient arena when the output is dropped (l->out_dropped). */
mp_status mp_layer_alloc_output(mp_model *m, mp_layer *l, mp_dtype t);
/* Bytes the activation arena keeps of l's output (of n elements of dtype
 * t): all of it; a dropped one nothing, or its sign mask when `sign` and
 * no consumer's codes carry the sign (l->sign_from). */
size_t mp_layer_output_saved_bytes(const mp_layer *l, int64_t n, mp_dtype t, bool sign);
/* At the end of the forward of a dropped output whose backward reads only
 * its sign: the sign mask (mp_op_positive_mask, in the activation arena),
 * unless a consumer's codes will carry the sign. */
mp_status mp_layer_keep_sign(mp_model *m, mp_layer *l);
/* dx = dy where that output was > 0, else dy * 0 (relu's derivative, the
 * bits mp_op_activation_grad gives from the output), from the mask or the
 * consumer's codes. */
mp_status mp_layer_sign_grad(const mp_layer *l, const mp_tensor *dy, mp_tensor *dx);
/* Input j of l in l's compute dtype: a view when it already is, else a cast
 * copy. keep: it must last until backward (activation arena; user data is
 * always copied, it may change). */
mp_status mp_layer_input_compute(mp_model *m, mp_layer *l, int j, bool keep, mp_tensor *out);
/* Activation-arena bytes mp_layer_input_compute(keep = true) takes. */
size_t mp_layer_kept_input_bytes(const mp_model *m, const mp_layer *l, int j, int64_t batch);
/* Where l writes the gradient for input j, in l's compute dtype: straight
 * into the producer's gradient when it is the first contribution and the
 * dtypes agree, else a temporary; mp_layer_input_grad_done folds it in. */
mp_status mp_layer_input_grad(mp_model *m, mp_layer *l, int j, mp_tensor *dx, bool *direct);
mp_status mp_layer_input_grad_done(mp_model *m, mp_layer *l, int j, const mp_tensor *dx,
                                   bool direct);
/* C = op(A) op(B) + beta C (+ bias, float32, one per column) with float32
 * accumulation: mp_gemm_ex with the arguments a layer varies. */
mp_status mp_layer_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void *a,
                        mp_dtype at, int64_t lda, const void *b, mp_dtype bt, int64_t ldb,
                        float beta, void *c, mp_dtype ct, int64_t ldc, const float *bias);
/* Hand g on to input j unchanged (identity layers); data inputs ignore it.
 * g must stay as it is until backward ends (the layer's own gradient):
 * the input's gradient may become a view of it (mp_model_share_grad). */
mp_status mp_layer_pass_grad(mp_model *m, mp_layer *l, int j, const mp_tensor *g);

/* ----------------------------------------------------------- JSON fields */

/* The largest output a configuration may ask of a layer, per sample. */
#define MP_CONFIG_MAX_WIDTH ((int64_t)1 << 26)

/* Read one setting; on failure the message names the field. */
mp_status mp_json_int_field(const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out);
/* A number in [lo, hi] (lo excluded when lo_open). */
mp_status mp_json_float_field(const json_t *o, const char *key, double lo, bool lo_open, double hi,
                              float *out);
/* An optional boolean (absent: *out keeps its default). */
mp_status mp_json_bool_opt(const json_t *o, const char *key, bool *out);
mp_status mp_json_activation_field(const json_t *o, const char *key, mp_activation *out);
/* A list of 1..MP_MAX_DIMS-1 dimensions, each in lo..hi (lo may be -1 for
 * Reshape's inferred one). */
mp_status mp_json_shape_field(const json_t *o, const char *key, int64_t lo, int64_t hi, int *ndim,
                              int64_t *shape);
json_t *mp_json_shape(int ndim, const int64_t *shape);

/* "(None, 28, 28)" */
const char *mp_shape_str(int ndim, const int64_t *shape, char *buf, size_t len);

#endif
