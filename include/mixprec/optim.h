/* mixprec/optim.h - optimizers on float32 master weights, learning-rate
 * schedules, gradient clipping, gradient accumulation and loss scaling.
 * Included by mixprec.h.
 *
 * Everything here works on parameters (mp_param), not on models: the model
 * hands its parameters over and keeps owning their storage. */
/* The whole API, in order: this part compiles when included alone. */
#include "../mixprec.h"

#ifndef MIXPREC_OPTIM_H
#define MIXPREC_OPTIM_H

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------- parameters */

/* One trainable tensor. The optimizer keeps a copy of this struct (and of
 * the name) but never owns the buffers, which must outlive it.
 *   master      float32 master values, or NULL in pure low-precision mode
 *               (then `weight` itself is updated: computed in float32, stored
 *               back in weight_dtype, see mp_rounding);
 *   weight      the copy the forward pass reads, in weight_dtype; may equal
 *               master when weight_dtype is MP_F32; may be NULL when there is
 *               no separate copy (master only);
 *   grad        float32 gradient of the same length; NULL = frozen (skipped
 *               by every function here). */
typedef struct {
    const char *name;
    float *master;
    void *weight;
    mp_dtype weight_dtype;
    float *grad;
    int64_t n;
    /* a bias, a normalisation scale or offset, or an embedding table:
     * AdamW's decoupled weight decay leaves it alone (unless decay_all) */
    bool decay_exempt;
} mp_param;

/* ------------------------------------------------------ learning-rate schedule */

typedef enum {
    MP_LR_CONSTANT = 0,
    MP_LR_STEP_DECAY = 1, /* base * gamma^floor(s / step_size) */
    MP_LR_COSINE = 2,     /* final + (base - final) * (1 + cos(pi * min(s, D) / D)) / 2 */
} mp_lr_decay;

/* A schedule is a pure function of the optimizer's step count (the number of
 * applied steps: a step skipped by the loss scaler does not advance it).
 * Linear warm-up composes with every decay: for step t < warmup_steps the
 * rate is base * (f0 + (1 - f0) * (t + 1) / warmup_steps) with
 * f0 = warmup_start_factor, so the last warm-up step reaches base; the decay
 * then runs on s = t - warmup_steps. Computed in double, returned as float. */
typedef struct {
    mp_lr_decay decay;
    int64_t warmup_steps;      /* 0 = no warm-up */
    float warmup_start_factor; /* in [0, 1] */
    int64_t step_size;         /* MP_LR_STEP_DECAY: steps per decay (>= 1) */
    float gamma;               /* MP_LR_STEP_DECAY: factor per decay */
    int64_t decay_steps;       /* MP_LR_COSINE: D (>= 1); constant final_lr after */
    float final_lr;            /* MP_LR_COSINE: absolute rate reached at s = D */
} mp_lr_schedule;

mp_lr_schedule mp_lr_schedule_default(void); /* constant, no warm-up */
mp_status mp_lr_schedule_validate(const mp_lr_schedule *s);
/* Learning rate of the step with 0-based index `step`. */
float mp_lr_schedule_at(const mp_lr_schedule *s, float base_lr, int64_t step);

/* -------------------------------------------------------------- optimizers */

typedef enum {
    MP_OPTIMIZER_SGD = 0,
    MP_OPTIMIZER_ADAM = 1,
    MP_OPTIMIZER_ADAMW = 2,
} mp_optimizer_kind;

/* How a pure low-precision parameter (master == NULL) is written back. */
typedef enum {
    MP_ROUND_NEAREST = 0,    /* round to nearest even (mp_convert) */
    MP_ROUND_STOCHASTIC = 1, /* mp_convert_stochastic_at, keyed by (seed, step,
                                parameter index, element index): reproducible */
} mp_rounding;

/* The update rules (PyTorch's forms; lr = the schedule's rate for this step,
 * t = 1-based step number, all per-element arithmetic in float32):
 *   SGD:   g += weight_decay * w;  if momentum: b = momentum * b + g,
 *          g = nesterov ? g + momentum * b : b;  w -= lr * g.
 *   Adam:  g += weight_decay * w (L2);  AdamW: w *= 1 - lr * weight_decay
 *          (kernels only: decay_exempt parameters keep w, unless decay_all).
 *          m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g;
 *          w -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + epsilon)
 *          with bc1 = 1 - beta1^t, bc2 = 1 - beta2^t computed in double: this
 *          is m_hat / (sqrt(v_hat) + epsilon), epsilon applied to the
 *          bias-corrected root in float32 (PyTorch), not Keras' epsilon-hat.
 * Clipping (at most one of clip_norm / clip_value) is applied to the
 * gradients the step reads, which must already be unscaled. */
typedef struct {
    mp_optimizer_kind kind;
    float learning_rate; /* base rate fed to the schedule */
    float momentum;      /* SGD, in [0, 1) */
    bool nesterov;       /* SGD, needs momentum > 0 */
    float beta1, beta2, epsilon;
    float weight_decay; /* SGD/Adam: L2 added to the gradient; AdamW: decoupled */
    /* AdamW: decay every parameter (Keras's default) instead of only those
     * without decay_exempt, the kernels (GPT recipes; mixprec's default) */
    bool decay_all;
    float clip_norm;  /* > 0: clip by global L2 norm (see mp_clip_grad_norm) */
    float clip_value; /* > 0: clamp every gradient to [-clip_value, clip_value] */
    mp_lr_schedule schedule;
    mp_rounding rounding; /* pure low-precision parameters only */
    uint64_t seed;        /* for MP_ROUND_STOCHASTIC */
} mp_optimizer_config;

/* Defaults: SGD lr 0.01 (Keras); Adam lr 1e-3, betas 0.9/0.999, eps 1e-8
 * (PyTorch, matching the epsilon form above); AdamW the same with
 * weight_decay 0.01. Constant schedule, round-to-nearest, no clipping. */
mp_optimizer_config mp_optimizer_config_default(mp_optimizer_kind kind);
const char *mp_optimizer_kind_name(mp_optimizer_kind kind); /* "sgd", "adam", "adamw" */

typedef struct mp_optimizer mp_optimizer;

/* NULL (with mp_last_error) on a bad config or parameter. The state (moments)
 * is allocated zeroed, in the MP_MEM_OPTIMIZER category. */
mp_optimizer *mp_optimizer_new(const mp_optimizer_config *cfg, const mp_param *params,
                               int n_params);
void mp_optimizer_free(mp_optimizer *opt);

/* One update of every parameter from its (unscaled) gradient: one fused pass
 * per tensor reads the gradient, updates moments and master and writes the
 * low-precision weight copy. Then the step count advances. */
mp_status mp_optimizer_step(mp_optimizer *opt);

/* Rewrite every low-precision weight copy from its master (round to nearest),
 * e.g. after restoring masters from a checkpoint. */
void mp_optimizer_refresh_weights(mp_optimizer *opt);

const mp_optimizer_config *mp_optimizer_get_config(const mp_optimizer *opt);
/* The rate the next step will use (schedule at the current step count). */
float mp_optimizer_learning_rate(const mp_optimizer *opt);
/* Change the base rate (e.g. reduce on plateau); the schedule still applies. */
mp_status mp_optimizer_set_learning_rate(mp_optimizer *opt, float base_lr);

/* Serialisable state: the step count and, per parameter, num_slots float32
 * tensors of the parameter's length. Restoring = writing them back. */
int64_t mp_optimizer_step_count(const mp_optimizer *opt);
mp_status mp_optimizer_set_step_count(mp_optimizer *opt, int64_t steps);
int mp_optimizer_num_params(const mp_optimizer *opt);
const mp_param *mp_optimizer_param(const mp_optimizer *opt, int index); /* NULL if out of range */
/* All its parameters (mp_optimizer_num_params of them), in order. */
const mp_param *mp_optimizer_params(const mp_optimizer *opt);
/* SGD without momentum 0, SGD with momentum 1 ("momentum_buffer"),
 * Adam/AdamW 2 ("exp_avg", "exp_avg_sq"). */
int mp_optimizer_num_slots(const mp_optimizer *opt);
const char *mp_optimizer_slot_name(const mp_optimizer *opt, int slot); /* NULL if none */
/* State tensor `slot` of parameter `index` (its length in *n if n != NULL):
 * the whole tensor's, or a sharded optimizer's part of it
 * (mp_optimizer_shard_range); NULL with mp_last_error if out of range. */
float *mp_optimizer_slot(mp_optimizer *opt, int index, int slot, int64_t *n);
/* Optimizer-state sharding (ZeRO stage 1): keep the state of, and update,
 * only part `rank` of `nranks` of every parameter, elements
 * [n rank / nranks, n (rank + 1) / nranks): each rank holds 1/nranks of the
 * moments. A step changes only that part of the masters and weight copies;
 * the data-parallel step then all-gathers them. The updated elements are
 * the bits an unsharded step gives. (rank 0, 1) makes the optimizer whole
 * again, the other parts of its state zero until filled in (the
 * data-parallel fit all-gathers them). */
mp_status mp_optimizer_shard(mp_optimizer *opt, int rank, int nranks);
int mp_optimizer_shards(const mp_optimizer *opt); /* nranks, 1 when whole */
void mp_optimizer_shard_range(const mp_optimizer *opt, int index, int64_t *lo, int64_t *hi);

/* ---------------------------------------------------------------- clipping */

/* Global L2 norm over every gradient, accumulated in float64 (each square is
 * exact in double; the result rounded to float once). */
float mp_grad_global_norm(const mp_param *params, int n_params);
/* If the global norm exceeds max_norm, multiply every gradient by
 * (float)(max_norm / norm) (Keras clip_by_global_norm). A non-finite norm
 * leaves the gradients as they are. The norm before clipping goes to
 * *norm_out if not NULL. Call it on unscaled gradients. */
mp_status mp_clip_grad_norm(const mp_param *params, int n_params, float max_norm, float *norm_out);
/* Clamp every gradient element to [-clip_value, clip_value] (NaN stays NaN). */
mp_status mp_clip_grad_value(const mp_param *params, int n_params, float clip_value);

/* ---------------------------------------------------- gradient accumulation */

/* Sums the gradients of N micro-batches (float32 buffers of its own, charged
 * to MP_MEM_GRADS) and hands over their mean once per window.
 * With loss scaling: every micro-batch's loss is scaled by the same scale
 * (the scaler only changes scale in its update, which the window calls
 * once); _add checks it. The mean of scaled gradients is the scaled mean,
 * so one unscale, one step and one scaler update follow each window; an
 * overflow in any micro-batch stays inf/NaN in the sum and skips the window. */
typedef struct mp_grad_accumulator mp_grad_accumulator;

mp_grad_accumulator *mp_grad_accumulator_new(const mp_param *params, int n_params, int window);
void mp_grad_accumulator_free(mp_grad_accumulator *acc);
/* Add the parameters' current gradients. loss_scale: the scale this
 * micro-batch's loss was multiplied by (1 without scaling); MP_ERR_INVALID if
 * it differs inside a window or the window is already full. */
mp_status mp_grad_accumulator_add(mp_grad_accumulator *acc, float loss_scale);
int mp_grad_accumulator_count(const mp_grad_accumulator *acc);
bool mp_grad_accumulator_ready(const mp_grad_accumulator *acc); /* count == window */
/* Write sum / count into the parameters' gradients and start a new window.
 * MP_ERR_INVALID if nothing was added. */
mp_status mp_grad_accumulator_finish(mp_grad_accumulator *acc);

/* ------------------------------------------------------------- loss scaling */

typedef enum {
    MP_LOSS_SCALE_DYNAMIC = 0,
    MP_LOSS_SCALE_STATIC = 1, /* scale fixed at initial_scale */
} mp_loss_scale_mode;

/* Dynamic rules (PyTorch GradScaler / Keras LossScaleOptimizer):
 *   found_inf: scale = max(scale * backoff_factor, min_scale), counter = 0;
 *   else if counter + 1 == growth_interval: scale *= growth_factor when the
 *     product is finite and <= max_scale (else scale unchanged), counter = 0;
 *   else counter += 1.
 * All in float32. min_scale 0 = no lower bound, max_scale 0 = no upper bound. */
typedef struct {
    float initial_scale;
    float growth_factor;
    float backoff_factor;
    int64_t growth_interval;
    float min_scale;
    float max_scale;
    mp_loss_scale_mode mode;
} mp_loss_scaler_config;

mp_loss_scaler_config mp_loss_scaler_config_keras(void); /* 2^15, 2, 0.5, 2000, no bounds */
mp_loss_scaler_config mp_loss_scaler_config_torch(void); /* 2^16, 2, 0.5, 2000, no bounds */
mp_loss_scaler_config mp_loss_scaler_config_static(float scale);
/* Loss scaling is on by default for float16 compute only. */
bool mp_loss_scaling_default_for(mp_dtype compute_dtype);

typedef struct mp_loss_scaler mp_loss_scaler;

/* cfg NULL = keras preset. NULL with mp_last_error on a bad config. */
mp_loss_scaler *mp_loss_scaler_new(const mp_loss_scaler_config *cfg);
void mp_loss_scaler_free(mp_loss_scaler *s);
float mp_loss_scaler_scale(const mp_loss_scaler *s);
/* Apply the rules above (static mode: nothing changes). */
void mp_loss_scaler_update(mp_loss_scaler *s, bool found_inf);

/* Save / restore (checkpoints). set_state validates (scale > 0 and finite,
 * 0 <= counter < growth_interval). */
typedef struct {
    float scale;
    int64_t counter; /* growth counter: finite steps since the last change */
} mp_loss_scaler_state;
void mp_loss_scaler_get_state(const mp_loss_scaler *s, mp_loss_scaler_state *out);
mp_status mp_loss_scaler_set_state(mp_loss_scaler *s, const mp_loss_scaler_state *st);
/* The checks mp_loss_scaler_new and set_state apply, without a scaler. */
mp_status mp_loss_scaler_config_validate(const mp_loss_scaler_config *cfg);
mp_status mp_loss_scaler_state_check(const mp_loss_scaler_config *cfg,
                                     const mp_loss_scaler_state *st);
void mp_loss_scaler_get_config(const mp_loss_scaler *s, mp_loss_scaler_config *out);

/* Unscale gradients in place: g *= (float)(1.0 / (double)scale), and report
 * whether any still-scaled value was inf or NaN (ORed into *found_inf). A
 * scale whose reciprocal is not a finite float32 (below 2^-128, reachable
 * only after ~143 backoffs without min_scale) also reports found_inf and
 * leaves the gradients untouched, so the step is skipped rather than applied
 * with infinite gradients. */
void mp_grads_unscale(const mp_param *params, int n_params, float scale, bool *found_inf);
/* Whether every gradient is finite (frozen parameters skipped): one read of
 * the gradients, in parallel; the answer does not depend on the threads. */
bool mp_grads_all_finite(const mp_param *params, int n_params);

/* The custom training loop (Keras LossScaleOptimizer):
 *   loss_for_backward = mp_loss_scaler_get_scaled_loss(s, loss)
 *     (equivalently, seed the backward pass with mp_loss_scaler_scale(s));
 *   backward;  mp_loss_scaler_get_unscaled_gradients(s, opt, &found_inf);
 *   optional clipping;  mp_loss_scaler_apply_gradients(s, opt, &applied).
 * apply_gradients steps the optimizer unless found_inf (then masters,
 * moments, step count and schedule stay unchanged: the step is skipped in
 * static mode too, since an infinite update would destroy the weights), then
 * calls mp_loss_scaler_update. MP_ERR_INVALID for misuse: unscaling twice
 * before applying, applying without unscaling, applying twice. */
float mp_loss_scaler_get_scaled_loss(const mp_loss_scaler *s, float loss);
mp_status mp_loss_scaler_get_unscaled_gradients(mp_loss_scaler *s, mp_optimizer *opt,
                                                bool *found_inf);
mp_status mp_loss_scaler_apply_gradients(mp_loss_scaler *s, mp_optimizer *opt, bool *applied);
/* found_inf of the most recent unscale. */
bool mp_loss_scaler_found_inf(const mp_loss_scaler *s);

#ifdef __cplusplus
}
#endif
#endif
