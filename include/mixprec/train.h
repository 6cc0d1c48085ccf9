/* mixprec/train.h - compile a model with an optimizer, a loss and a loss
 * scaling rule, and train it step by step (the custom-loop pieces live in
 * mixprec/optim.h; fit/evaluate/predict build on these steps). Included by
 * mixprec.h. */
/* The whole API, in order: this part compiles when included alone. */
#include "../mixprec.h"

#ifndef MIXPREC_TRAIN_H
#define MIXPREC_TRAIN_H

#include <signal.h>

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
/* Data parallel (mixprec/dist.h): where a shard lies in its global batch
 * and how its gradients are summed over the ranks. */
typedef struct {
    int64_t global_batch;  /* rows of the global batch */
    int64_t first_row;     /* the shard's first row in it (random layers draw by global row) */
    mp_reduce_mode reduce; /* MP_REDUCE_FLOAT32 (default), ORDERED or BFLOAT16 */
    /* > 1: the global batch is cut into this many slices, slice s holding
     * rows [c s / S, c (s + 1) / S) of a batch of c rows; each slice's
     * gradient is computed alone and the slices' gradients are summed
     * pairwise in slice order ((s0 + s1) + (s2 + s3)), first within the rank,
     * then over the ranks (reduce must be ORDERED). The weights are then the
     * same bits on 1, 2, 4, ... ranks, up to `slices` (a power of two that the
     * number of ranks divides; each rank's shard is then whole slices).
     * Layers with batch statistics (BatchNormalization) see a slice. */
    int slices;
    size_t bucket_bytes; /* gradients summed in buckets of about this size (0: 4 MiB) */
    /* this process alone, as the one rank of its own job, even under
     * mpirun (a single-process reference, or sliced steps without MPI) */
    bool local;
    /* ZeRO stage 1: each rank keeps the optimizer state of, and updates,
     * 1/N of every tensor (mp_optimizer_shard); the updated parts are then
     * all-gathered. The same weights as without it, 1/N of the state. */
    bool shard_optimizer;
    /* hand the gradients over only after the whole backward (what the
     * overlap saves, measured by bench-mpi) */
    bool no_overlap;
} mp_shard_options;
mp_shard_options mp_shard_options_default(int64_t global_batch, int64_t first_row);
/* One step on this rank's shard x (0 rows allowed): rows
 * [c r / N, c (r + 1) / N) of the global batch of c rows (mp_dist_shard;
 * anything else is refused), with every rank calling it together. The loss and its gradient are
 * this rank's part of the global batch's mean; each layer's gradients start on their way to the
 * other ranks as soon as its backward is done (mp_dist_reducer), and are summed before unscaling,
 * so a non-finite gradient anywhere makes every rank skip. r gets the global batch's loss and
 * correct count. With one process (no MPI) it is a plain step, sliced when o->slices > 1. */
mp_status mp_model_train_step_shard(mp_model *m, const mp_tensor *x, const int32_t *labels,
                                    const mp_tensor *target, const mp_shard_options *o,
                                    mp_step_result *r);
/* What the last shard step's gradient sum took (zeros before one). */
void mp_model_last_reduction(const mp_model *m, mp_dist_reducer_stats *out);
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

/* Where a fit stands between two steps: enough to continue it exactly.
 * Checkpoints carry it; mp_fit_options.resume continues from it. */
typedef struct {
    int epoch;     /* 0-based epoch in progress (== epochs when the fit ended) */
    int64_t batch; /* batches of that epoch already run */
    int64_t steps; /* training steps run in all epochs (applied + skipped) */
    /* running figures of the epoch in progress */
    double loss_sum;          /* sum of loss * batch over finite-loss batches */
    int64_t loss_samples;     /* samples in loss_sum */
    int64_t samples, correct; /* samples seen, argmax hits */
    int64_t skipped_before;   /* the model's skipped-step count when the epoch began */
    double seconds;           /* time spent in the epoch so far */
    double best;              /* early stopping: best monitored value (inf: none yet) */
    int bad_epochs;
    /* the settings that fix the data order, checked on resume */
    int epochs;               /* the fit's target (informative: a resumed fit may change it) */
    int64_t checkpoint_every; /* the fit's checkpoint cadence (informative) */
    int keep_last;
    int64_t batch_size;
    bool shuffle;
    uint64_t seed;
    double validation_split;
    int64_t steps_per_epoch; /* the fit's epoch length (0: a pass over the data) */
    int64_t data_count;      /* training samples (after the split) */
    uint64_t data_hash;      /* of their features and labels */
    mp_history history;      /* the completed epochs */
} mp_fit_state;
void mp_fit_state_free(mp_fit_state *st);

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
    /* Keras steps_per_epoch: an epoch is this many batches (0: one pass
     * over the data); batch g of the fit is batch g mod P of pass g / P of
     * the data (P batches a pass, each pass in its own seeded order), so
     * epochs may end mid-pass - for a text, whose windows make passes far
     * longer than the stretch between two validations */
    int64_t steps_per_epoch;
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
    /* checkpoints: every `checkpoint_every` steps (0: never) and when the fit
     * ends, a full checkpoint (mp_model_save_checkpoint) is written to
     * checkpoint_dir/ckpt-<steps>.safetensors; only the newest keep_last
     * are kept (0: all) */
    int64_t checkpoint_every;
    const char *checkpoint_dir;
    int keep_last;
    /* continue the fit a checkpoint describes (from mp_model_load_checkpoint
     * or mp_model_from_checkpoint): same data, batch size, shuffle and seed;
     * `epochs` and max_steps count from the start of the first run */
    const mp_fit_state *resume;
    /* data parallel over the MPI ranks (mixprec/dist.h, after
     * mp_dist_init): every rank runs fit on the same data and options and
     * takes rows [r*c/N, (r+1)*c/N) of each global batch of c rows (the
     * single-process order); batch_size must divide by N. Gradients are
     * summed over the ranks in float32 (reduce: or bfloat16), every rank
     * takes the same step or skip; only rank 0 prints, writes log_csv and
     * checkpoints. */
    bool data_parallel;
    mp_reduce_mode reduce;
    size_t bucket_bytes; /* 0: 4 MiB */
    /* fixed-order sums (mp_shard_options.slices): each batch in
     * deterministic_slices slices (0: 4, or the number of ranks when
     * larger), summed pairwise in slice order; with or without
     * data_parallel, so one process and N ranks give the same weights.
     * With reduce bfloat16 the runs repeat, but depend on N. */
    bool deterministic;
    int deterministic_slices;
    /* data parallel: ZeRO stage 1 (mp_shard_options.shard_optimizer); the
     * optimizer is whole again when fit returns */
    bool shard_optimizer;
    /* if not NULL and *interrupt becomes nonzero (e.g. from a SIGINT
     * handler), the fit stops after the step in progress, as max_steps
     * would: it writes a checkpoint when checkpoint_dir is set and returns
     * MP_OK, and state_out says where it stopped */
    const volatile sig_atomic_t *interrupt;
    /* if not NULL, receives where the fit ended (e.g. for a final
     * checkpoint); free with mp_fit_state_free */
    mp_fit_state *state_out;
    /* run directory (created if missing; NULL: none): config.json, plan.json
     * (the precision plan), history.csv at the end and diagnostics.jsonl
     * (mp_diagnostics) go there */
    const char *run_dir;
    /* with run_dir: per-layer numerics at step 1 and every this many steps
     * (0: only per-step events and epoch records) */
    int64_t diagnostics_every;
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

/* ---------------------------------------------------------- diagnostics */

/* What rounding a set of values into a target dtype does to them: one pass,
 * in parallel. Underflow and overflow are those of round-to-nearest-even into
 * `target` (values already in `target` round to themselves). */
typedef struct {
    int64_t n;
    int64_t zeros;     /* values that are zero before rounding */
    int64_t flush;     /* nonzero values that round to zero in the target */
    int64_t subnormal; /* nonzero values that round to a nonzero subnormal */
    int64_t overflow;  /* finite values that round past the target's largest finite value */
    int64_t nonfinite; /* inf or NaN before rounding */
    double amax;       /* largest finite magnitude */
    double sumsq;      /* sum of squares of the finite values (float64) */
    double err_sumsq;  /* with a copy: sum of (copy - value)^2 over finite pairs */
    double upd_amax;   /* with a before: largest |value - before| */
    double upd_sumsq;  /* with a before: sum of (value - before)^2 */
} mp_numerics;

/* Statistics of n values x (in x_type) against target. copy (optional, in
 * copy_type): a rounded copy of x (a compute copy of a master), giving
 * err_sumsq; before (optional, float32): earlier values of x, giving the
 * update figures. */
void mp_numerics_compute(const void *x, mp_dtype x_type, int64_t n, mp_dtype target,
                         const void *copy, mp_dtype copy_type, const float *before,
                         mp_numerics *out);

/* A run's diagnostics log: RUN_DIR/diagnostics.jsonl, one JSON object per
 * line, each line one write() on a file opened for appending and fsync'd at
 * epoch ends and on close (a killed run leaves whole lines, at worst a
 * truncated last one). Records: "run" (at open: policy, dtypes and their
 * ranges, layers), "step" (every `every` steps and step 1: loss, accuracy,
 * loss scale, skipped, global gradient norm, learning rate, step time, memory
 * by category, and per layer the output activation, each parameter's weight
 * (compute copy vs float32 master), gradient (float32, unscaled after the
 * step, with the scale used), update (master after vs before the step) and
 * the gradient reaching the layer's output (in its dtype, scaled)), "event"
 * (any other step that was skipped or changed the loss scale) and "epoch".
 * Opening also writes RUN_DIR/config.json and RUN_DIR/plan.json. */
typedef struct mp_diagnostics mp_diagnostics;
mp_status mp_diagnostics_open(mp_diagnostics **out, mp_model *m, const char *run_dir, int64_t every,
                              int64_t batch_size);
/* Around each training step (step: 1-based count of the fit's steps). On a
 * diagnostic step the optimizer's update pass gathers the weights' and
 * gradients' figures as it goes (a step it skips leaves them to a pass
 * after it); the rest is measured after the step. */
mp_status mp_diagnostics_before_step(mp_diagnostics *d, mp_model *m, int64_t step);
mp_status mp_diagnostics_after_step(mp_diagnostics *d, mp_model *m, const mp_step_result *r,
                                    int64_t batch, int epoch);
/* An epoch's record (step: training steps so far), then fsync. */
mp_status mp_diagnostics_epoch_end(mp_diagnostics *d, const mp_epoch_log *log, int64_t step);
/* RUN_DIR/history.csv, where fit writes the history. */
const char *mp_diagnostics_history_path(const mp_diagnostics *d);
/* fsync, close and free (NULL: nothing). */
mp_status mp_diagnostics_close(mp_diagnostics *d);

/* ----------------------------------------------------------- checkpoints */

/* Options the model was compiled with; MP_ERR_INVALID before compile. */
mp_status mp_model_get_compile_options(const mp_model *m, mp_compile_options *out);

/* Everything needed to continue training exactly, in one safetensors file
 * written atomically (mp_safetensors_write):
 *   tensors   the model's parameters (float32 masters, as
 *             mp_model_save_weights) and, once compiled, the optimizer's
 *             state as optimizer/<param>/<slot> (float32);
 *   metadata  mixprec.config (mp_model_config_json), mixprec.global_policy,
 *             mixprec.training (compile options, optimizer step count,
 *             loss-scaler config and state, applied/skipped steps, the
 *             dropout counter) and, with fit != NULL, mixprec.fit (the
 *             mp_fit_state: position in the data order, running sums,
 *             early stopping, history). */
mp_status mp_model_save_checkpoint(mp_model *m, const char *path, const mp_fit_state *fit);
/* Restore a checkpoint into a built model with the same parameters. A model
 * not yet compiled is compiled with the file's options; a compiled one keeps
 * its options and must use the same optimizer kind. Everything is checked
 * before anything changes. fit (optional) receives the mixprec.fit state
 * (zeroed when the file has none; free it with mp_fit_state_free). */
mp_status mp_model_load_checkpoint(mp_model *m, const char *path, mp_fit_state *fit);
/* Build the model a checkpoint (or weights file) describes, for batches up
 * to max_batch (0: the batch size in its fit state, else 1), and load it:
 * the file alone is enough. */
mp_status mp_model_from_checkpoint(const char *path, int64_t max_batch, mp_model **out,
                                   mp_fit_state *fit);
/* The same from a file already read (name labels errors). */
typedef struct mp_safetensors mp_safetensors; /* mixprec/io.h */
mp_status mp_model_from_safetensors(const mp_safetensors *f, const char *name, int64_t max_batch,
                                    mp_model **out, mp_fit_state *fit);
/* The model of a checkpoint (or weights file) of a sequence model, rebuilt
 * for incremental decoding (mp_model_decode_step): its input takes one
 * position, the weights loaded and a cache for one sequence reset for the
 * trained context, which *context (optional) receives. Its max_batch (128,
 * or the context if shorter) is how many prompt positions one
 * mp_model_decode_prefill takes. */
mp_status mp_model_decoder_from_checkpoint(const char *path, mp_model **out, int64_t *context);
/* The newest checkpoint in dir (ckpt-<steps>.safetensors) that reads and
 * validates, into path; MP_ERR_IO when there is none. */
mp_status mp_checkpoint_latest(const char *dir, char *path, size_t len);

#ifdef __cplusplus
}
#endif
#endif
