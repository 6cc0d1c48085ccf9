/* mixprec/train.h - compile a model with an optimizer, a loss and a loss
 * scaling rule, and train it step by step (the custom-loop pieces live in
 * mixprec/optim.h; fit/evaluate/predict build on these steps). Included by
 * mixprec.h. */
#ifndef MIXPREC_TRAIN_H
#define MIXPREC_TRAIN_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MP_LOSS_SCALING_AUTO = 0, /* dynamic for float16 compute, none otherwise */
    MP_LOSS_SCALING_NONE = 1,
    MP_LOSS_SCALING_DYNAMIC = 2,
    MP_LOSS_SCALING_STATIC = 3, /* fixed at scaler.initial_scale */
} mp_loss_scaling;

typedef struct {
    mp_optimizer_config optimizer;
    mp_loss_kind loss;
    bool from_logits;
    mp_loss_scaling loss_scaling;
    mp_loss_scaler_config scaler; /* dynamic/static settings (default: keras preset) */
} mp_compile_options;

/* Adam (lr 1e-3), sparse categorical cross-entropy, automatic loss scaling. */
mp_compile_options mp_compile_options_default(void);
/* Attach optimizer, loss and scaler to a built model (replacing any earlier
 * compile and its optimizer state). */
mp_status mp_model_compile(mp_model *m, const mp_compile_options *o);

typedef struct {
    float loss;         /* mean over the batch, unscaled */
    int64_t correct;    /* samples whose argmax equals the label (sparse labels) */
    bool applied;       /* false: the step was skipped (inf/NaN gradients) */
    float loss_scale;   /* the scale used for this step (1 without scaling) */
} mp_step_result;

/* One optimizer step on a batch: forward (training), loss, scaled backward,
 * unscale + inf/NaN check, step or skip, scaler update. x: [b, input...];
 * labels (sparse losses) or target (others, output-shaped). */
mp_status mp_model_train_step(mp_model *m, const mp_tensor *x, const int32_t *labels,
                              const mp_tensor *target, mp_step_result *r);
/* Loss and correct count without training (inference mode). */
mp_status mp_model_test_step(mp_model *m, const mp_tensor *x, const int32_t *labels,
                             const mp_tensor *target, mp_step_result *r);

/* The compiled pieces (NULL before compile / without scaling). */
mp_optimizer *mp_model_optimizer(mp_model *m);
mp_loss_scaler *mp_model_loss_scaler(mp_model *m);
/* Optimizer steps applied and skipped since compile. */
int64_t mp_model_steps_applied(const mp_model *m);
int64_t mp_model_steps_skipped(const mp_model *m);
/* The model's parameters in the optimizer's form (n entries). */
int mp_model_optim_params(mp_model *m, mp_param *out, int n);

#ifdef __cplusplus
}
#endif
#endif
