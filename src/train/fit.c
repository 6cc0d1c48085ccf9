/* fit.c - Keras-style fit / evaluate / predict over datasets: batches in a
 * seeded per-epoch order, validation, history, early stopping, and the
 * progress line (redrawn in place on a terminal, plain lines otherwise). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/train_internal.h"

void mp_history_free(mp_history *h)
{
    if (!h) return;
    free(h->epochs);
    h->epochs = NULL;
    h->count = 0;
}

mp_fit_options mp_fit_options_default(void)
{
    mp_fit_options o;
    memset(&o, 0, sizeof o);
    o.batch_size = 32;
    o.epochs = 1;
    o.shuffle = true;
    o.verbose = 1;
    return o;
}

/* Batch buffers shared by fit, evaluate and predict. */
typedef struct {
    int64_t cap, dim, label_dim;
    float *x; /* features; int32 token ids in place for an int32 input */
    int32_t *y;
    int64_t *order; /* a pass's order over the training data */
    int64_t *idx;   /* one batch's indices (evaluation) */
    mp_dtype in_dtype;
    int in_ndim;
    int64_t in_shape[MP_MAX_DIMS];
} batcher;

static mp_status batcher_init(batcher *b, mp_model *m, const mp_dataset *ds, int64_t batch,
                              int64_t n)
{
    memset(b, 0, sizeof *b);
    b->in_ndim = mp_model_input_shape(m, b->in_shape);
    b->in_dtype = mp_model_input_dtype(m);
    int64_t want = 1, dim = mp_dataset_dim(ds);
    for (int i = 0; i < b->in_ndim; i++) want *= b->in_shape[i];
    if (want != dim)
        return mp_set_error(MP_ERR_INVALID,
                            "data has %lld features per sample, the model's input takes %lld",
                            (long long)dim, (long long)want);
    if (batch < 1 || batch > mp_model_max_batch(m))
        return mp_set_error(MP_ERR_INVALID,
                            "batch size %lld outside 1..%lld (the model's max_batch)",
                            (long long)batch, (long long)mp_model_max_batch(m));
    b->cap = batch;
    b->dim = dim;
    b->label_dim = mp_dataset_label_dim(ds);
    b->x = malloc((size_t)(batch * dim) * sizeof *b->x);
    b->y = malloc((size_t)(batch * b->label_dim) * sizeof *b->y);
    b->order = malloc((size_t)(n > 0 ? n : 1) * sizeof *b->order);
    b->idx = malloc((size_t)batch * sizeof *b->idx);
    if (!b->x || !b->y || !b->order || !b->idx)
        return mp_set_error(MP_ERR_NOMEM, "fit: out of memory for batches");
    return MP_OK;
}

static void batcher_free(batcher *b)
{
    free(b->x);
    free(b->y);
    free(b->order);
    free(b->idx);
}

/* Float features as int32 token ids, in place (both are 4 bytes), for a
 * model whose input takes int32: each must be an integer in int32's range. */
mp_status mp_features_to_ids(float *x, int64_t n)
{
    int32_t *id = (int32_t *)(void *)x;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        if (!(v >= -2147483648.0f && v < 2147483648.0f) || v != (float)(int32_t)v)
            return mp_set_error(MP_ERR_INVALID,
                                "feature %lld is %g: the model's input takes int32 token ids",
                                (long long)i, (double)v);
        id[i] = (int32_t)v;
    }
    return MP_OK;
}

/* Gather samples idx[0..count) into the batch buffers. */
static mp_status batch_gather(batcher *b, const mp_dataset *ds, const int64_t *idx, int64_t count)
{
    mp_status s = mp_dataset_gather(ds, idx, count, b->x, b->y);
    if (!s && b->in_dtype == MP_I32) s = mp_features_to_ids(b->x, count * b->dim);
    return s;
}

static void batch_tensor(const batcher *b, int64_t count, mp_tensor *t)
{
    int64_t shape[MP_MAX_DIMS];
    shape[0] = count;
    memcpy(shape + 1, b->in_shape, (size_t)b->in_ndim * sizeof(int64_t));
    mp_tensor_wrap(t, b->in_dtype, b->in_ndim + 1, shape, b->x);
}

/* ------------------------------------------------------------- progress */

typedef struct {
    FILE *out;
    bool tty, on;
    int64_t total;
    double start, last_draw;
} progress;

static void fmt_metrics(char *buf, size_t len, double loss, double acc, const mp_epoch_log *log)
{
    int n = snprintf(buf, len, " - loss: %.4f - accuracy: %.4f", loss, acc);
    if (log && log->has_validation && n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, " - val_loss: %.4f - val_accuracy: %.4f", log->val_loss,
                 log->val_accuracy);
}

static void draw(progress *p, int64_t done, double loss, double acc, const mp_epoch_log *final)
{
    if (!p->on) return;
    double t = mp_seconds();
    if (!final && (!p->tty || t - p->last_draw < 0.1)) return;
    p->last_draw = t;
    char bar[31];
    int fill = p->total ? (int)(30 * done / p->total) : 30;
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '=' : '.';
    if (fill > 0 && fill < 30) bar[fill - 1] = '>';
    bar[30] = '\0';
    char metrics[160];
    fmt_metrics(metrics, sizeof metrics, loss, acc, final);
    double el = t - p->start;
    double per = done ? el / (double)done : 0;
    char timing[64];
    if (final)
        snprintf(timing, sizeof timing, "%.0fs %.0fms/step", el, per * 1e3);
    else
        snprintf(timing, sizeof timing, "ETA: %.0fs", per * (double)(p->total - done));
    fprintf(p->out, "%s%lld/%lld [%s] - %s%s%s", p->tty ? "\r" : "", (long long)done,
            (long long)p->total, bar, timing, metrics, final ? "\n" : "");
    if (p->tty) fprintf(p->out, "\033[K");
    fflush(p->out);
}

/* ---------------------------------------------------------- evaluation */

static mp_status run_eval(mp_model *m, const mp_dataset *ds, batcher *b, double *loss, double *acc)
{
    int64_t n = mp_dataset_count(ds);
    double lsum = 0;
    int64_t correct = 0;
    for (int64_t i = 0; i < n; i += b->cap) {
        int64_t c = n - i < b->cap ? n - i : b->cap;
        for (int64_t j = 0; j < c; j++) b->idx[j] = i + j;
        mp_status s = batch_gather(b, ds, b->idx, c);
        if (s) return s;
        mp_tensor x;
        batch_tensor(b, c, &x);
        mp_step_result r;
        if ((s = mp_model_test_step(m, &x, b->y, NULL, &r))) return s;
        lsum += (double)r.loss * (double)c;
        correct += r.correct;
    }
    *loss = n ? lsum / (double)n : NAN;
    *acc = n ? (double)correct / (double)(n * b->label_dim) : NAN; /* over label positions */
    return MP_OK;
}

mp_status mp_model_evaluate(mp_model *m, const mp_dataset *data, int64_t batch_size, double *loss,
                            double *accuracy)
{
    if (!data) return mp_set_error(MP_ERR_INVALID, "evaluate: no data");
    batcher b;
    mp_status s = batcher_init(&b, m, data, batch_size, 0);
    double l = NAN, a = NAN;
    if (!s) s = run_eval(m, data, &b, &l, &a);
    batcher_free(&b);
    if (loss) *loss = l;
    if (accuracy) *accuracy = a;
    return s;
}

mp_status mp_model_predict(mp_model *m, const float *x, int64_t n, int64_t batch_size, float *out)
{
    int64_t in_shape[MP_MAX_DIMS], out_shape[MP_MAX_DIMS];
    int in_ndim = mp_model_input_shape(m, in_shape), out_ndim = mp_model_output_shape(m, out_shape);
    int64_t dim = 1, odim = 1;
    for (int i = 0; i < in_ndim; i++) dim *= in_shape[i];
    for (int i = 0; i < out_ndim; i++) odim *= out_shape[i];
    if (batch_size < 1 || batch_size > mp_model_max_batch(m))
        return mp_set_error(MP_ERR_INVALID, "predict: batch size %lld outside 1..%lld",
                            (long long)batch_size, (long long)mp_model_max_batch(m));
    /* an int32 input takes the features as token ids, a batch at a time */
    bool ids = mp_model_input_dtype(m) == MP_I32;
    float *buf = ids ? malloc((size_t)(batch_size * dim) * sizeof *buf) : NULL;
    if (ids && !buf) return mp_set_error(MP_ERR_NOMEM, "predict: out of memory");
    mp_status s = MP_OK;
    for (int64_t i = 0; i < n && !s; i += batch_size) {
        int64_t c = n - i < batch_size ? n - i : batch_size, shape[MP_MAX_DIMS];
        shape[0] = c;
        memcpy(shape + 1, in_shape, (size_t)in_ndim * sizeof(int64_t));
        const float *xb = x + i * dim;
        if (ids) {
            memcpy(buf, xb, (size_t)(c * dim) * sizeof *buf);
            if ((s = mp_features_to_ids(buf, c * dim))) break;
            xb = buf;
        }
        mp_tensor t;
        mp_tensor_wrap(&t, ids ? MP_I32 : MP_F32, in_ndim + 1, shape, (void *)xb);
        const mp_tensor *y;
        if ((s = mp_model_forward(m, &t, false, &y))) break;
        mp_convert(out + i * odim, MP_F32, y->data, y->dtype, (size_t)(c * odim));
    }
    free(buf);
    return s;
}

/* ------------------------------------------------------------------ fit */

static mp_status write_csv(const char *path, const mp_history *h)
{
    FILE *f = fopen(path, "w");
    if (!f) return mp_set_error(MP_ERR_IO, "cannot write history to '%s'", path);
    fprintf(
        f,
        "epoch,loss,accuracy,val_loss,val_accuracy,seconds,ms_per_step,loss_scale,skipped_steps\n");
    for (int i = 0; i < h->count; i++) {
        const mp_epoch_log *e = &h->epochs[i];
        fprintf(f, "%d,%.6f,%.6f,", e->epoch, e->loss, e->accuracy);
        if (e->has_validation)
            fprintf(f, "%.6f,%.6f,", e->val_loss, e->val_accuracy);
        else
            fprintf(f, ",,");
        fprintf(f, "%.3f,%.3f,%g,%lld\n", e->seconds, e->ms_per_step, (double)e->loss_scale,
                (long long)e->skipped);
    }
    if (fclose(f) != 0) return mp_set_error(MP_ERR_IO, "cannot write history to '%s'", path);
    return MP_OK;
}

/* Resuming: the state must describe a fit of this data in this order. */
static mp_status check_resume(const mp_fit_state *r, const mp_fit_state *now, int64_t per_epoch)
{
    if (r->batch_size != now->batch_size || r->shuffle != now->shuffle || r->seed != now->seed ||
        r->validation_split != now->validation_split || r->steps_per_epoch != now->steps_per_epoch)
        return mp_set_error(MP_ERR_INVALID,
                            "resume: the checkpoint was made with batch size %lld, shuffle %s, "
                            "seed %llu, validation split %g, steps per epoch %lld; this fit uses "
                            "%lld, %s, %llu, %g, %lld",
                            (long long)r->batch_size, r->shuffle ? "on" : "off",
                            (unsigned long long)r->seed, r->validation_split,
                            (long long)r->steps_per_epoch, (long long)now->batch_size,
                            now->shuffle ? "on" : "off", (unsigned long long)now->seed,
                            now->validation_split, (long long)now->steps_per_epoch);
    if (r->data_count != now->data_count || r->data_hash != now->data_hash)
        return mp_set_error(MP_ERR_INVALID,
                            "resume: the checkpoint was made on other training data (%lld samples, "
                            "fingerprint %016llx; this data has %lld, %016llx)",
                            (long long)r->data_count, (unsigned long long)r->data_hash,
                            (long long)now->data_count, (unsigned long long)now->data_hash);
    if (r->batch > per_epoch)
        return mp_set_error(MP_ERR_INVALID, "resume: batch %lld of an epoch of %lld batches",
                            (long long)r->batch, (long long)per_epoch);
    return MP_OK;
}

/* fs with its history: the completed epochs of the fit's log. */
static mp_status write_checkpoint(mp_model *m, const mp_fit_options *o, const mp_fit_state *fs,
                                  mp_epoch_log *log, bool verbose)
{
    mp_fit_state view = *fs;
    view.history = (mp_history){fs->epoch, log};
    char path[4096];
    if (mkdir(o->checkpoint_dir, 0777) != 0 && errno != EEXIST)
        return mp_set_error(MP_ERR_IO, "cannot create the checkpoint directory '%s': %s",
                            o->checkpoint_dir, strerror(errno));
    snprintf(path, sizeof path, "%s/ckpt-%08lld.safetensors", o->checkpoint_dir,
             (long long)fs->steps);
    mp_status s = mp_model_save_checkpoint(m, path, &view);
    if (s) return s;
    mp_checkpoint_prune(o->checkpoint_dir, o->keep_last);
    if (verbose)
        fprintf(o->out, "%scheckpoint: %s\n", isatty(fileno(o->out)) ? "\r\033[K" : "", path);
    return MP_OK;
}

/* Data parallel: rank 0 writes, every rank learns whether it could. */
static mp_status save_checkpoint(mp_model *m, const mp_fit_options *o, const mp_fit_state *fs,
                                 mp_epoch_log *log, bool verbose)
{
    if (!o->data_parallel) return write_checkpoint(m, o, fs, log, verbose);
    /* a sharded optimizer's state whole first (the next step shards it) */
    mp_status s = mp_train_unshard(mp_model_optimizer(m));
    if (s) return s;
    s = mp_dist_rank() == 0 ? write_checkpoint(m, o, fs, log, verbose) : MP_OK;
    return mp_dist_agree(s, "writing the checkpoint on rank 0");
}

mp_status mp_model_fit(mp_model *m, const mp_dataset *data, const mp_fit_options *opt,
                       mp_history *hist)
{
    mp_fit_options o = opt ? *opt : mp_fit_options_default();
    if (!data) return mp_set_error(MP_ERR_INVALID, "fit: no data");
    if (!mp_model_training_state(m))
        return mp_set_error(MP_ERR_INVALID, "fit: compile the model first");
    if (o.epochs < 1) return mp_set_error(MP_ERR_INVALID, "fit: epochs = %d", o.epochs);
    if (!(o.validation_split >= 0 && o.validation_split < 1))
        return mp_set_error(MP_ERR_INVALID, "fit: validation_split %g outside [0, 1)",
                            o.validation_split);
    if (o.monitor && strcmp(o.monitor, "loss") && strcmp(o.monitor, "val_loss"))
        return mp_set_error(MP_ERR_INVALID, "fit: unknown monitor '%s' (loss or val_loss)",
                            o.monitor);
    if (o.checkpoint_every < 0 || o.keep_last < 0 ||
        ((o.checkpoint_every || o.keep_last) && !o.checkpoint_dir))
        return mp_set_error(MP_ERR_INVALID,
                            "fit: checkpoint_every %lld / keep_last %d need a checkpoint_dir",
                            (long long)o.checkpoint_every, o.keep_last);
    if (!o.out) o.out = stdout;
    int rank = 0, nranks = 1; /* data parallel: this rank's shard of each batch */
    mp_status s0 = o.data_parallel ? mp_fit_dist_begin(o.batch_size, &rank, &nranks) : MP_OK;
    if (s0) return s0;

    mp_dataset *train = NULL, *val = NULL;
    const mp_dataset *tr = data, *va = o.validation_data;
    mp_status s = MP_OK;
    if (o.validation_split > 0 && !va) {
        if ((s = mp_dataset_split(data, o.validation_split, &train, &val))) return s;
        tr = train;
        va = val;
    }
    int64_t n = mp_dataset_count(tr);
    mp_history h = {0, NULL};
    batcher b;
    mp_diagnostics *dg = NULL; /* with a run_dir: its log (diagnostics.c) */
    if ((s = batcher_init(&b, m, tr, o.batch_size / nranks, n))) goto done;
    if (va && mp_dataset_dim(va) != mp_dataset_dim(tr)) {
        s = mp_set_error(MP_ERR_INVALID,
                         "fit: validation data has %lld features, training data %lld",
                         (long long)mp_dataset_dim(va), (long long)mp_dataset_dim(tr));
        goto done;
    }
    bool watch_val = o.monitor ? !strcmp(o.monitor, "val_loss") : va != NULL;
    if (watch_val && !va) {
        s = mp_set_error(MP_ERR_INVALID, "fit: monitor val_loss needs validation data");
        goto done;
    }
    if (o.steps_per_epoch < 0) {
        s = mp_set_error(MP_ERR_INVALID, "fit: steps_per_epoch %lld", (long long)o.steps_per_epoch);
        goto done;
    }
    /* nb batches make a pass over the data; an epoch is a pass, or
     * steps_per_epoch batches of consecutive passes */
    int64_t nb = mp_dataset_batch_count(tr, o.batch_size);
    int64_t per_epoch = o.steps_per_epoch ? o.steps_per_epoch : nb, pass = -1;
    /* where the fit stands; a resumed fit starts where its checkpoint was */
    mp_fit_state fs;
    memset(&fs, 0, sizeof fs);
    fs.best = INFINITY;
    fs.batch_size = o.batch_size;
    fs.shuffle = o.shuffle;
    fs.seed = o.seed;
    fs.validation_split = o.validation_data ? 0 : o.validation_split;
    fs.data_count = n;
    fs.data_hash = mp_dataset_fingerprint(tr);
    fs.steps_per_epoch = o.steps_per_epoch;
    if (o.data_parallel && (s = mp_fit_dist_check_data(&fs))) goto done;
    const mp_fit_state *r = o.resume;
    if (r) {
        if ((s = check_resume(r, &fs, per_epoch))) goto done;
        fs = *r;
    }
    fs.epochs = o.epochs;
    fs.checkpoint_every = o.checkpoint_every;
    fs.keep_last = o.keep_last;
    fs.history = (mp_history){0, NULL}; /* the completed part of h, where it is written */
    int cap = o.epochs > fs.epoch ? o.epochs : fs.epoch;
    h.epochs = calloc((size_t)(cap ? cap : 1), sizeof(mp_epoch_log));
    if (!h.epochs) {
        s = mp_set_error(MP_ERR_NOMEM, "fit: out of memory");
        goto done;
    }
    if (r) {
        memcpy(h.epochs, r->history.epochs, (size_t)r->history.count * sizeof(mp_epoch_log));
        h.count = r->history.count;
    }
    progress p = {o.out, isatty(fileno(o.out)) != 0, o.verbose > 0 && rank == 0, per_epoch, 0, 0};
    if (o.run_dir && rank == 0 &&
        (s = mp_diagnostics_open(&dg, m, o.run_dir, o.diagnostics_every, o.batch_size)))
        goto done;
    bool stop = false, saved = false;
    while (fs.epoch < o.epochs && !stop) {
        mp_epoch_log *log = &h.epochs[fs.epoch];
        memset(log, 0, sizeof *log);
        log->epoch = fs.epoch + 1;
        if (fs.batch == 0) {
            fs.loss_sum = 0;
            fs.loss_samples = fs.samples = fs.correct = 0;
            fs.skipped_before = mp_model_steps_skipped(m);
            fs.seconds = 0;
        }
        if (p.on) fprintf(o.out, "Epoch %d/%d\n", fs.epoch + 1, o.epochs);
        p.start = mp_seconds() - fs.seconds;
        p.last_draw = 0;
        while (fs.batch < per_epoch) {
            bool interrupted = o.interrupt && *o.interrupt;
            if (o.data_parallel) interrupted = mp_dist_any(interrupted); /* stop together */
            if ((o.max_steps && fs.steps >= o.max_steps) || interrupted) {
                stop = true;
                break;
            }
            /* batch g of the fit is batch g % nb of pass g / nb */
            int64_t g = (int64_t)fs.epoch * per_epoch + fs.batch;
            if (g / nb != pass) {
                pass = g / nb;
                if ((s = mp_dataset_order(tr, (uint64_t)pass, o.seed, o.shuffle, b.order))) break;
            }
            int64_t i = g % nb * o.batch_size;
            int64_t c = n - i < o.batch_size ? n - i : o.batch_size;
            int64_t lo = 0, hi = c; /* this rank's rows of the global batch */
            if (o.data_parallel) mp_dist_shard(c, rank, nranks, &lo, &hi);
            if ((s = batch_gather(&b, tr, b.order + i + lo, hi - lo))) break;
            mp_tensor x;
            batch_tensor(&b, hi - lo, &x);
            mp_step_result res;
            if (dg && (s = mp_diagnostics_before_step(dg, m, fs.steps + 1))) break;
            mp_shard_options so = mp_shard_options_default(c, lo);
            so.reduce = o.reduce;
            so.bucket_bytes = o.bucket_bytes;
            so.local = !o.data_parallel;
            so.shard_optimizer = o.shard_optimizer;
            if (o.deterministic) {
                so.slices =
                    o.deterministic_slices ? o.deterministic_slices : (nranks > 4 ? nranks : 4);
                if (so.reduce == MP_REDUCE_FLOAT32) so.reduce = MP_REDUCE_ORDERED;
            }
            if ((s = o.data_parallel || o.deterministic
                         ? mp_model_train_step_shard(m, &x, b.y, NULL, &so, &res)
                         : mp_model_train_step(m, &x, b.y, NULL, &res)))
                break;
            if (dg && (s = mp_diagnostics_after_step(dg, m, &res, c, fs.epoch + 1))) break;
            fs.steps++;
            fs.batch++;
            if (isfinite(res.loss)) { /* a skipped step's NaN loss would poison the mean */
                fs.loss_sum += (double)res.loss * (double)c;
                fs.loss_samples += c;
            }
            fs.correct += res.correct;
            fs.samples += c * b.label_dim; /* label positions */
            saved = false;
            if (o.checkpoint_every && fs.steps % o.checkpoint_every == 0) {
                fs.seconds = mp_seconds() - p.start;
                if ((s = save_checkpoint(m, &o, &fs, h.epochs, p.on))) break;
                saved = true;
            }
            draw(&p, fs.batch, fs.loss_samples ? fs.loss_sum / (double)fs.loss_samples : NAN,
                 (double)fs.correct / (double)fs.samples, NULL);
        }
        if (s) break;
        if (stop) { /* stopped by max_steps or an interrupt: resumable from here */
            if (o.checkpoint_dir && !saved) {
                fs.seconds = mp_seconds() - p.start;
                s = save_checkpoint(m, &o, &fs, h.epochs, p.on);
                saved = true;
            }
            if (fs.batch == 0) break; /* nothing of this epoch ran */
        }
        mp_loss_scaler *ls = mp_model_loss_scaler(m);
        log->steps = fs.batch;
        log->seconds = mp_seconds() - p.start;
        log->ms_per_step = fs.batch ? 1e3 * log->seconds / (double)fs.batch : 0;
        log->loss = fs.loss_samples ? fs.loss_sum / (double)fs.loss_samples : NAN;
        log->accuracy = fs.samples ? (double)fs.correct / (double)fs.samples : NAN;
        log->loss_scale = ls ? mp_loss_scaler_scale(ls) : 1.0f;
        log->skipped = mp_model_steps_skipped(m) - fs.skipped_before;
        if (va) {
            if ((s = run_eval(m, va, &b, &log->val_loss, &log->val_accuracy))) break;
            log->has_validation = true;
        }
        h.count = fs.epoch + 1;
        if (dg && (s = mp_diagnostics_epoch_end(dg, log, fs.steps))) break;
        draw(&p, fs.batch, log->loss, log->accuracy, log);
        if (stop) break; /* a partial epoch: logged, but not counted as done */
        fs.epoch++;
        fs.batch = 0;
        if (o.on_epoch_end && !o.on_epoch_end(log, o.user)) stop = true;
        double monitored = watch_val ? log->val_loss : log->loss;
        if (monitored < fs.best - o.min_delta) {
            fs.best = monitored;
            fs.bad_epochs = 0;
        } else if (o.patience > 0 && ++fs.bad_epochs >= o.patience) {
            if (p.on)
                fprintf(o.out, "Early stopping: %s did not improve for %d epochs\n",
                        watch_val ? "val_loss" : "loss", o.patience);
            stop = true;
        }
        saved = false;
    }
    if (!s && o.checkpoint_dir && !saved) s = save_checkpoint(m, &o, &fs, h.epochs, p.on);
    if (!s && o.data_parallel) s = mp_train_unshard(mp_model_optimizer(m)); /* whole again */
    if (!s && o.log_csv && rank == 0) s = write_csv(o.log_csv, &h);
    if (!s && dg) s = write_csv(mp_diagnostics_history_path(dg), &h);
    if (!s && o.state_out) { /* a copy with its own completed-epoch history */
        *o.state_out = fs;
        o.state_out->history.count = fs.epoch;
        o.state_out->history.epochs =
            malloc((size_t)(fs.epoch ? fs.epoch : 1) * sizeof(mp_epoch_log));
        if (!o.state_out->history.epochs)
            s = mp_set_error(MP_ERR_NOMEM, "fit: out of memory");
        else
            memcpy(o.state_out->history.epochs, h.epochs,
                   (size_t)o.state_out->history.count * sizeof(mp_epoch_log));
    }
done:
    if (mp_diagnostics_close(dg) && !s) s = MP_ERR_IO;
    if (hist && !s)
        *hist = h;
    else
        free(h.epochs);
    batcher_free(&b);
    mp_dataset_free(train);
    mp_dataset_free(val);
    return s;
}
