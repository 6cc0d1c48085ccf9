/* train_internal.h - what checkpoint.c needs of the compiled state in
 * step.c, not part of the API. */
#ifndef MP_TRAIN_INTERNAL_H
#define MP_TRAIN_INTERNAL_H

#include "io/io_internal.h"

/* Restore the applied/skipped step counts of a compiled model. */
void mp_model_set_step_counts(mp_model *m, int64_t applied, int64_t skipped);

/* Forward (training) and the loss's backward seeded with `scale` on x, the
 * loss's mean taken over `global_batch` samples (step.c). */
mp_status mp_train_forward_backward(mp_model *m, const mp_tensor *x, const int32_t *labels,
                                    const mp_tensor *target, int64_t global_batch, float scale,
                                    float *loss, int64_t *correct);

/* The data-parallel step's forward, backward and gradient sum over the ranks
 * (grad_sync.c; *g made on first use, kept for the next steps): every rank's
 * gradients hold the global batch's on return; loss and correct are this
 * rank's parts. */
typedef struct mp_grad_sync mp_grad_sync;
mp_status mp_train_shard_step(mp_model *m, mp_optimizer *opt, mp_grad_sync **g, const mp_tensor *x,
                              const int32_t *labels, const mp_tensor *target,
                              const mp_shard_options *o, float scale, float *loss,
                              int64_t *correct);
void mp_grad_sync_last(const mp_grad_sync *g, mp_dist_reducer_stats *out);
/* ZeRO stage 1: after a sharded optimizer step, every rank's part of the
 * masters (or low-precision weights) all-gathered, the compute copies of
 * the other parts refreshed; and the state made whole on every rank (before
 * a checkpoint, at the end of a fit). */
mp_status mp_train_gather_update(mp_optimizer *opt);
mp_status mp_train_unshard(mp_optimizer *opt);
void mp_grad_sync_free(mp_grad_sync *g);

/* The loss and the correct count summed over the ranks (float64: a
 * non-finite part anywhere makes the loss non-finite everywhere, as the
 * summed gradients are). */
mp_status mp_train_reduce_figures(float *loss, int64_t *correct);

/* Data parallel, after a step: every non-trainable float32 state tensor
 * (BatchNormalization's moving mean and variance) becomes its mean over the
 * ranks (summed in rank order, times 1/N), so every rank holds, evaluates
 * with and saves the same statistics. Each rank's moving mean followed its
 * shard's batch means; with equal shards their mean is the update the
 * global batch's mean gives (the variance misses the spread between the
 * shards' means, as without SyncBatchNorm). *buf of *cap floats is the
 * exchange buffer (grown). */
mp_status mp_train_average_state(mp_model *m, float **buf, size_t *cap);

/* Data parallel, before the float8 recipe's commit: each quantized
 * tensor's pending amax becomes its maximum over the ranks (pending where
 * any rank has one), as Transformer Engine reduces amaxes over the
 * data-parallel group, so that every rank commits the same histories and
 * delayed scales. *buf of *cap words is the exchange buffer (grown). */
mp_status mp_train_reduce_amax(mp_model *m, uint32_t **buf, size_t *cap);

/* fit, data parallel: this rank and the number of ranks, which the batch
 * size must divide by; then every rank must fit the same data in the same
 * order (fingerprint, count, batch size, seed). */
mp_status mp_fit_dist_begin(int64_t batch_size, int *rank, int *nranks);
mp_status mp_fit_dist_check_data(const mp_fit_state *fs);
/* Every rank learns whether s failed on any rank (the failing rank keeps its
 * message, the others name `what`). */
mp_status mp_dist_agree(mp_status s, const char *what);
/* Whether flag is set on any rank (a stop request). */
bool mp_dist_any(bool flag);

/* The float8 recipe's state in checkpoints (checkpoint_fp8.c): how many
 * tensors; them into t (names in the returned buffer, free() it after the
 * write; NULL if out of memory); every one checked in f into found[]
 * without changing the model; then written into the model. */
int mp_checkpoint_float8_count(const mp_model *m);
char *mp_checkpoint_float8_tensors(const mp_model *m, mp_named_tensor *t);
mp_status mp_checkpoint_float8_check(const mp_model *m, const mp_safetensors *f, const char *path,
                                     const mp_named_tensor **found);
void mp_checkpoint_float8_apply(mp_model *m, const mp_named_tensor *const *found);

/* Checkpoints in a directory: ckpt-<steps>.safetensors, ascending steps. */
typedef struct {
    int64_t steps;
    char name[256];
} mp_checkpoint_entry;
/* The entries (malloc'd, free()); -1 if the directory cannot be read. */
int mp_checkpoint_list(const char *dir, mp_checkpoint_entry **out);
/* Delete all but the newest keep_last (0: keep all), and temporaries a
 * killed writer left behind. */
void mp_checkpoint_prune(const char *dir, int keep_last);

/* Float features as int32 token ids, in place (both are 4 bytes), for a
 * model whose input takes int32: each must be an integer in int32's range
 * (fit.c; the tuner's probe uses it too). */
mp_status mp_features_to_ids(float *x, int64_t n);

#endif
