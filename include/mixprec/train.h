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
    float loss;       /* mean over the batch, unscaled */
    int64_t correct;  /* samples whose argmax equals the label (sparse labels) */
    bool applied;     /* false: the step was skipped (inf/NaN gradients) */
    float loss_scale; /* the scale used for this step (1 without scaling) */
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

/* ------------------------------------------------------------------ fit */

typedef struct mp_dataset mp_dataset; /* mixprec/data.h */

/* One epoch's figures (Keras History plus the mixed-precision ones). */
typedef struct {
    int epoch;     /* 1-based */
    int64_t steps; /* training steps run (applied + skipped) */
    double loss, accuracy;
    bool has_validation;
    double val_loss, val_accuracy;
    double seconds, ms_per_step;
    float loss_scale; /* at the end of the epoch (1 without scaling) */
    int64_t skipped;  /* steps skipped for inf/NaN gradients in this epoch */
} mp_epoch_log;

typedef struct {
    int count;
    mp_epoch_log *epochs;
} mp_history;
void mp_history_free(mp_history *h);

/* Called after each epoch; return false to stop training. */
typedef bool (*mp_epoch_callback)(const mp_epoch_log *log, void *user);

typedef struct {
    int64_t batch_size;                /* default 32 (Keras); <= the model's max_batch */
    int epochs;                        /* default 1 */
    double validation_split;           /* the last fraction, taken before shuffling */
    const mp_dataset *validation_data; /* instead of a split */
    bool shuffle;                      /* default true: a new order per epoch */
    uint64_t seed;                     /* shuffling */
    int64_t max_steps;                 /* stop after this many training steps (0: no limit) */
    int verbose;         /* 0 silent, 1 progress bar (plain lines when not a terminal) */
    FILE *out;           /* progress stream (default stdout) */
    const char *log_csv; /* write the history as CSV here (NULL: no file) */
    mp_epoch_callback on_epoch_end;
    void *user;
    /* early stopping: stop when `monitor` ("val_loss" or "loss"; default
     * val_loss with validation data, else loss) has not improved by more
     * than min_delta for `patience` epochs (0: off) */
    int patience;
    double min_delta;
    const char *monitor;
} mp_fit_options;

mp_fit_options mp_fit_options_default(void);
/* Keras Model.fit on a dataset with sparse labels. h (optional) receives the
 * history; free it with mp_history_free. */
mp_status mp_model_fit(mp_model *m, const mp_dataset *data, const mp_fit_options *o, mp_history *h);
/* Mean loss and accuracy over a dataset (inference mode). */
mp_status mp_model_evaluate(mp_model *m, const mp_dataset *data, int64_t batch_size, double *loss,
                            double *accuracy);
/* Model outputs (float32, [n, outputs]) for n samples of x ([n, input...]). */
mp_status mp_model_predict(mp_model *m, const float *x, int64_t n, int64_t batch_size, float *out);

#ifdef __cplusplus
}
#endif
#endif
