/* step.c - compile and the training step: forward, loss, backward seeded
 * with the loss scale, unscale and inf/NaN check, optimizer step or skip,
 * scaler update, the float8 recipe's commit. Everything above (fit, the
 * CLI) is built on this. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/model_internal.h"
#include "nn/quant.h"
#include "optim/optim_internal.h"
#include "train/train_internal.h"

typedef struct {
    mp_compile_options opts;
    mp_optimizer *opt;
    mp_loss_scaler *scaler; /* NULL: no loss scaling */
    int64_t applied, skipped;
    float *row; /* one output row in float32, for the accuracy count */
    int64_t row_cap;
    mp_grad_sync *sync; /* data parallel: the gradients' way over the ranks */
    uint32_t *amax;     /* and the float8 amaxes' */
    size_t amax_cap;
    float *state; /* and the moving statistics' */
    size_t state_cap;
} training;

static void training_free(void *p)
{
    training *t = p;
    if (!t) return;
    mp_optimizer_free(t->opt);
    mp_loss_scaler_free(t->scaler);
    free(t->row);
    mp_grad_sync_free(t->sync);
    free(t->amax);
    free(t->state);
    free(t);
}

mp_compile_options mp_compile_options_default(void)
{
    mp_compile_options o;
    memset(&o, 0, sizeof o);
    o.optimizer = mp_optimizer_config_default(MP_OPTIMIZER_ADAM);
    o.loss = MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY;
    o.loss_scaling = MP_LOSS_SCALING_AUTO;
    o.scaler = mp_loss_scaler_config_keras();
    return o;
}

int mp_model_optim_params(mp_model *m, mp_param *out, int n)
{
    /* the trainable ones: state has no gradient and no optimizer slot */
    int np = mp_model_num_params(m), k = 0;
    for (int i = 0; i < np; i++) {
        const mp_model_param *p = mp_model_get_param(m, i);
        if (!p->trainable) continue;
        if (k < n)
            out[k] = (mp_param){p->name,
                                p->master,
                                p->weight,
                                p->weight_dtype,
                                p->grad,
                                p->n,
                                p->role != MP_ROLE_KERNEL};
        k++;
    }
    return k;
}

mp_status mp_model_compile(mp_model *m, const mp_compile_options *o)
{
    if (!mp_model_is_built(m))
        return mp_set_error(MP_ERR_INVALID, "compile: build the model first");
    mp_compile_options d = o ? *o : mp_compile_options_default();
    training *t = calloc(1, sizeof *t);
    if (!t) return mp_set_error(MP_ERR_NOMEM, "compile: out of memory");
    t->opts = d;
    int np = mp_model_num_params(m); /* the optimizer keeps its own copy */
    mp_param *params = calloc((size_t)(np ? np : 1), sizeof *params);
    if (!params) {
        free(t);
        return mp_set_error(MP_ERR_NOMEM, "compile: out of memory");
    }
    np = mp_model_optim_params(m, params, np);
    t->opt = mp_optimizer_new(&d.optimizer, params, np);
    if (!t->opt) {
        free(params);
        training_free(t);
        return MP_ERR_INVALID; /* the optimizer left its message */
    }
    /* float8 kernels: quantized as their masters are updated (nn/quant.h) */
    for (int i = 0; i < np; i++) {
        mp_float8_meta *q = mp_float8_kernel_meta(m, params[i].master);
        mp_status s = q ? mp_optimizer_set_update_hook(
                              t->opt, i, (mp_update_hook){mp_float8_meta_update_chunk, q})
                        : MP_OK;
        if (s) {
            free(params);
            training_free(t);
            return s;
        }
    }
    free(params);
    bool scaling = d.loss_scaling == MP_LOSS_SCALING_DYNAMIC ||
                   d.loss_scaling == MP_LOSS_SCALING_STATIC ||
                   (d.loss_scaling == MP_LOSS_SCALING_AUTO &&
                    mp_loss_scaling_default_for(mp_model_compute_dtype(m)));
    if (scaling) {
        mp_loss_scaler_config sc =
            d.scaler.initial_scale != 0.0f ? d.scaler : mp_loss_scaler_config_keras();
        if (d.loss_scaling != MP_LOSS_SCALING_AUTO)
            sc.mode = d.loss_scaling == MP_LOSS_SCALING_STATIC ? MP_LOSS_SCALE_STATIC
                                                               : MP_LOSS_SCALE_DYNAMIC;
        t->scaler = mp_loss_scaler_new(&sc);
        if (!t->scaler) {
            training_free(t);
            return MP_ERR_INVALID;
        }
    }
    mp_model_set_training_state(m, t, training_free);
    return MP_OK;
}

static training *get(const mp_model *m) { return mp_model_training_state(m); }

mp_optimizer *mp_model_optimizer(mp_model *m) { return get(m) ? get(m)->opt : NULL; }
mp_loss_scaler *mp_model_loss_scaler(mp_model *m) { return get(m) ? get(m)->scaler : NULL; }
int64_t mp_model_steps_applied(const mp_model *m) { return get(m) ? get(m)->applied : 0; }
int64_t mp_model_steps_skipped(const mp_model *m) { return get(m) ? get(m)->skipped : 0; }

void mp_model_set_step_counts(mp_model *m, int64_t applied, int64_t skipped)
{
    if (!get(m)) return;
    get(m)->applied = applied;
    get(m)->skipped = skipped;
}

mp_status mp_model_get_compile_options(const mp_model *m, mp_compile_options *out)
{
    if (!get(m)) return mp_set_error(MP_ERR_INVALID, "the model is not compiled");
    *out = get(m)->opts;
    return MP_OK;
}

static int64_t count_correct(training *t, const mp_tensor *y, const int32_t *labels)
{
    if (!labels) return 0;
    int64_t cols = y->shape[y->ndim - 1], rows = mp_tensor_numel(y) / cols, correct = 0;
    if (cols > t->row_cap) {
        float *r = realloc(t->row, (size_t)cols * sizeof *r);
        if (!r) return 0;
        t->row = r;
        t->row_cap = cols;
    }
    float *row = t->row;
    size_t es = mp_dtype_size(y->dtype);
    for (int64_t r = 0; r < rows; r++) {
        mp_convert(row, MP_F32, (const char *)y->data + (size_t)(r * cols) * es, y->dtype,
                   (size_t)cols);
        int64_t best = 0;
        for (int64_t c = 1; c < cols; c++)
            if (row[c] > row[best]) best = c; /* first maximum, as argmax */
        correct += best == labels[r];
    }
    return correct;
}

static mp_status check_ready(mp_model *m, const char *what)
{
    if (!get(m)) return mp_set_error(MP_ERR_INVALID, "%s: compile the model first", what);
    return MP_OK;
}

mp_status mp_train_forward_backward(mp_model *m, const mp_tensor *x, const int32_t *labels,
                                    const mp_tensor *target, int64_t global_batch, float scale,
                                    float *loss, int64_t *correct)
{
    training *t = get(m);
    const mp_tensor *y;
    mp_status s = mp_model_forward(m, x, true, &y);
    if (s) return s;
    *correct = count_correct(t, y, labels);
    /* the mean is over the global batch's label rows (a sequence has one
     * per position) */
    int64_t per_sample = mp_tensor_numel(y) / y->shape[y->ndim - 1] / x->shape[0];
    mp_loss_spec spec = {t->opts.loss, t->opts.from_logits, labels, target,
                         global_batch * per_sample};
    return mp_model_loss_backward(m, &spec, scale, false, loss);
}

/* Whether every gradient the optimizer holds is finite: a read-only pass
 * over each, except, when `seen` (this process's backward wrote the
 * gradients and nothing has changed them since), those the backward saw
 * whole as it wrote them (a Dense layer's weight gradient: its GEMM
 * reports non-finite values while each tile is still in L1; the seed
 * MLP's weights are 99.9% of its values, 80 MB read again otherwise). */
static bool grads_all_finite(const mp_model *m, mp_optimizer *opt, bool seen)
{
    const mp_param *p = mp_optimizer_params(opt);
    for (int i = 0; i < mp_optimizer_num_params(opt); i++)
        if (!(seen && mp_model_grad_seen_finite(m, p[i].grad)) && !mp_grads_all_finite(&p[i], 1))
            return false;
    return true;
}

/* The optimizer's step, or its skip where a gradient is not finite;
 * seen: as grads_all_finite. */
static mp_status update(mp_model *m, training *t, bool seen, bool *applied)
{
    mp_status s;
    if (t->scaler) {
        bool found_inf = false;
        if ((s = mp_loss_scaler_get_unscaled_gradients(t->scaler, t->opt, &found_inf))) return s;
        return mp_loss_scaler_apply_gradients(t->scaler, t->opt, applied);
    }
    /* without scaling a non-finite gradient still must not reach the
     * weights: check (a read-only pass over what the backward did not see)
     * and skip the step as the scaler would */
    if (!grads_all_finite(m, t->opt, seen)) return MP_OK;
    if ((s = mp_optimizer_step(t->opt))) return s;
    *applied = true;
    return MP_OK;
}

/* o: data parallel (or sliced), x is this rank's shard (possibly empty) */
static mp_status train_step(mp_model *m, const mp_tensor *x, const int32_t *labels,
                            const mp_tensor *target, const mp_shard_options *o, mp_step_result *r)
{
    mp_status s = check_ready(m, "train_step");
    if (s) return s;
    training *t = get(m);
    mp_step_result res = {0, 0, false, 1.0f};
    float scale = t->scaler ? mp_loss_scaler_scale(t->scaler) : 1.0f;
    res.loss_scale = scale;
    if (!o)
        s = mp_train_forward_backward(m, x, labels, target, x->shape[0], scale, &res.loss,
                                      &res.correct);
    else if (!(s = mp_train_shard_step(m, t->opt, &t->sync, x, labels, target, o, scale, &res.loss,
                                       &res.correct)) &&
             !o->local && !(s = mp_train_reduce_figures(&res.loss, &res.correct)))
        s = mp_train_reduce_amax(m, &t->amax, &t->amax_cap);
    if (s) return s;
    bool sharded = o && !o->local && o->shard_optimizer && mp_dist_size() > 1;
    if (sharded)
        s = mp_optimizer_shard(t->opt, mp_dist_rank(), mp_dist_size());
    else if (mp_optimizer_shards(t->opt) > 1)
        s = mp_train_unshard(t->opt);
    if (s) return s;
    /* the float8 kernels' operands are quantized by the update itself
     * (nn/quant.h); an arming that fails (out of memory) leaves them to the
     * next forward, as a sharded update does */
    if (!sharded) (void)mp_float8_model_arm(m);
    s = update(m, t, !o, &res.applied);
    if (s) {
        mp_float8_model_settle(m); /* what the update wrote, under the scale it has */
        return s;
    }
    if (res.applied && sharded) {
        mp_float8_model_masters_changed(m); /* the other ranks' parts */
        if ((s = mp_train_gather_update(t->opt))) return s;
    }
    if (o && !o->local && (s = mp_train_average_state(m, &t->state, &t->state_cap))) return s;
    if (res.applied)
        t->applied++;
    else
        t->skipped++;
    /* the float8 recipe: the step's amaxes go into the histories only if it
     * applied (mixprec/fp8.h) */
    mp_model_float8_commit(m, res.applied);
    mp_float8_model_settle(m);
    if (r) *r = res;
    return MP_OK;
}

mp_status mp_model_train_step(mp_model *m, const mp_tensor *x, const int32_t *labels,
                              const mp_tensor *target, mp_step_result *r)
{
    return train_step(m, x, labels, target, NULL, r);
}

mp_shard_options mp_shard_options_default(int64_t global_batch, int64_t first_row)
{
    mp_shard_options o;
    memset(&o, 0, sizeof o);
    o.global_batch = global_batch;
    o.first_row = first_row;
    o.reduce = MP_REDUCE_FLOAT32;
    return o;
}

mp_status mp_model_train_step_shard(mp_model *m, const mp_tensor *x, const int32_t *labels,
                                    const mp_tensor *target, const mp_shard_options *o,
                                    mp_step_result *r)
{
    if (!o || o->global_batch < 1 || !x || x->ndim < 1 || x->shape[0] > o->global_batch ||
        o->first_row < 0 || o->first_row + x->shape[0] > o->global_batch)
        return mp_set_error(MP_ERR_INVALID,
                            "train_step_shard: a shard of %lld rows from row %lld of a global "
                            "batch of %lld",
                            x && x->ndim ? (long long)x->shape[0] : -1LL,
                            o ? (long long)o->first_row : -1LL,
                            o ? (long long)o->global_batch : -1LL);
    return train_step(m, x, labels, target, o, r);
}

void mp_model_last_reduction(const mp_model *m, mp_dist_reducer_stats *out)
{
    mp_grad_sync_last(get(m) ? get(m)->sync : NULL, out);
}

mp_status mp_model_test_step(mp_model *m, const mp_tensor *x, const int32_t *labels,
                             const mp_tensor *target, mp_step_result *r)
{
    mp_status s = check_ready(m, "test_step");
    if (s) return s;
    training *t = get(m);
    const mp_tensor *y;
    if ((s = mp_model_forward(m, x, false, &y))) return s;
    mp_step_result res = {0, count_correct(t, y, labels), false, 1.0f};
    mp_loss_spec spec = {t->opts.loss, t->opts.from_logits, labels, target, 0};
    if ((s = mp_loss_compute(&spec, y, 1.0f, &res.loss, NULL))) return s;
    if (r) *r = res;
    return MP_OK;
}
