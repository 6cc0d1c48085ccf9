/* checkpoint.c - training checkpoints: the model's parameters, the
 * optimizer's moments, the loss scaler, the step counters, the dropout
 * counter, the float8 recipe's state (checkpoint_fp8.c) and where a fit
 * stands, in one atomically written safetensors
 * file, and their exact restoration. Loading checks everything before it
 * changes anything. Directories of checkpoints: checkpoint_dir.c. */
#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/train_internal.h"

#define STATE_VERSION 1

/* Optimizer state tensors are named optimizer/<param>/<slot>. */
#define SLOT_NAME_MAX 192
static void slot_name(char *buf, const char *param, const mp_optimizer *opt, int slot)
{
    snprintf(buf, SLOT_NAME_MAX, "optimizer/%s/%s", param, mp_optimizer_slot_name(opt, slot));
}

/* ------------------------------------------------------------ JSON helpers */

/* Reals are written with 17 significant digits (jansson's default), which
 * round-trips every double and so every float exactly. NaN and inf have no
 * JSON form: they are written as null. */
static json_t *jnum(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* A number, or null for a value that was not finite (read as `nonfinite`). */
static bool get_num(const json_t *o, const char *k, double nonfinite, double *out)
{
    const json_t *v = json_object_get(o, k);
    if (json_is_null(v)) {
        *out = nonfinite;
        return true;
    }
    if (!json_is_number(v)) return false;
    *out = json_number_value(v);
    return true;
}

static bool get_f32(const json_t *o, const char *k, float *out)
{
    double d;
    if (!get_num(o, k, NAN, &d) || !isfinite(d) || fabs(d) > FLT_MAX) return false;
    *out = (float)d;
    return true;
}

static bool get_i64(const json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out)
{
    const json_t *v = json_object_get(o, k);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return false;
    *out = json_integer_value(v);
    return true;
}

static bool get_bool(const json_t *o, const char *k, bool *out)
{
    const json_t *v = json_object_get(o, k);
    if (!json_is_boolean(v)) return false;
    *out = json_is_true(v);
    return true;
}

static bool get_hex(const json_t *o, const char *k, uint64_t *out)
{
    return mp_json_hex_value(json_object_get(o, k), out);
}

#define BAD(...)                                                                                   \
    do {                                                                                           \
        s = mp_set_error(MP_ERR_FORMAT, __VA_ARGS__);                                              \
        goto fail;                                                                                 \
    } while (0)

/* ------------------------------------------------------- compile options */

static const char *const scaling_names[] = {"auto", "none", "dynamic", "static"};
static const char *const mode_names[] = {"dynamic", "static"};
static const char *const rounding_names[] = {"nearest", "stochastic"};

static int name_index(const char *s, const char *const *names, int n)
{
    for (int i = 0; s && i < n; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

static json_t *scaler_config_json(const mp_loss_scaler_config *c)
{
    return json_pack("{s:o, s:o, s:o, s:I, s:o, s:o, s:s}", "initial_scale", jnum(c->initial_scale),
                     "growth_factor", jnum(c->growth_factor), "backoff_factor",
                     jnum(c->backoff_factor), "growth_interval", (json_int_t)c->growth_interval,
                     "min_scale", jnum(c->min_scale), "max_scale", jnum(c->max_scale), "mode",
                     mode_names[c->mode == MP_LOSS_SCALE_STATIC]);
}

static bool scaler_config_parse(const json_t *j, mp_loss_scaler_config *c)
{
    int mode = name_index(json_string_value(json_object_get(j, "mode")), mode_names, 2);
    c->mode = mode == 1 ? MP_LOSS_SCALE_STATIC : MP_LOSS_SCALE_DYNAMIC;
    return json_is_object(j) && mode >= 0 && get_f32(j, "initial_scale", &c->initial_scale) &&
           get_f32(j, "growth_factor", &c->growth_factor) &&
           get_f32(j, "backoff_factor", &c->backoff_factor) &&
           get_i64(j, "growth_interval", 1, INT64_MAX, &c->growth_interval) &&
           get_f32(j, "min_scale", &c->min_scale) && get_f32(j, "max_scale", &c->max_scale);
}

static json_t *compile_json(const mp_compile_options *o)
{
    const mp_optimizer_config *c = &o->optimizer;
    const mp_lr_schedule *l = &c->schedule;
    json_t *sched =
        json_pack("{s:i, s:I, s:o, s:I, s:o, s:I, s:o}", "decay", (int)l->decay, "warmup_steps",
                  (json_int_t)l->warmup_steps, "warmup_start_factor", jnum(l->warmup_start_factor),
                  "step_size", (json_int_t)l->step_size, "gamma", jnum(l->gamma), "decay_steps",
                  (json_int_t)l->decay_steps, "final_lr", jnum(l->final_lr));
    json_t *opt =
        json_pack("{s:s, s:o, s:o, s:b, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:s, s:o}", "kind",
                  mp_optimizer_kind_name(c->kind), "learning_rate", jnum(c->learning_rate),
                  "momentum", jnum(c->momentum), "nesterov", c->nesterov, "beta1", jnum(c->beta1),
                  "beta2", jnum(c->beta2), "epsilon", jnum(c->epsilon), "weight_decay",
                  jnum(c->weight_decay), "clip_norm", jnum(c->clip_norm), "clip_value",
                  jnum(c->clip_value), "schedule", sched, "rounding",
                  rounding_names[c->rounding == MP_ROUND_STOCHASTIC], "seed", mp_json_hex(c->seed));
    if (opt) json_object_set_new(opt, "decay_all", json_boolean(c->decay_all));
    return json_pack("{s:o, s:s, s:b, s:s, s:o}", "optimizer", opt, "loss", mp_loss_name(o->loss),
                     "from_logits", o->from_logits, "loss_scaling",
                     scaling_names[o->loss_scaling & 3], "scaler", scaler_config_json(&o->scaler));
}

static bool compile_parse(const json_t *j, mp_compile_options *o)
{
    memset(o, 0, sizeof *o);
    const json_t *opt = json_object_get(j, "optimizer"), *sc = json_object_get(opt, "schedule");
    mp_optimizer_config *c = &o->optimizer;
    mp_lr_schedule *l = &c->schedule;
    const char *kind = json_string_value(json_object_get(opt, "kind"));
    int k = -1;
    for (int i = 0; i < 3; i++)
        if (kind && !strcmp(kind, mp_optimizer_kind_name((mp_optimizer_kind)i))) k = i;
    int rounding =
        name_index(json_string_value(json_object_get(opt, "rounding")), rounding_names, 2);
    int scaling =
        name_index(json_string_value(json_object_get(j, "loss_scaling")), scaling_names, 4);
    int64_t decay;
    if (k < 0 || rounding < 0 || scaling < 0 || !json_is_object(sc)) return false;
    c->kind = (mp_optimizer_kind)k;
    c->rounding = rounding ? MP_ROUND_STOCHASTIC : MP_ROUND_NEAREST;
    o->loss_scaling = (mp_loss_scaling)scaling;
    if (!(get_f32(opt, "learning_rate", &c->learning_rate) &&
          get_f32(opt, "momentum", &c->momentum) && get_bool(opt, "nesterov", &c->nesterov) &&
          get_f32(opt, "beta1", &c->beta1) && get_f32(opt, "beta2", &c->beta2) &&
          get_f32(opt, "epsilon", &c->epsilon) && get_f32(opt, "weight_decay", &c->weight_decay) &&
          get_f32(opt, "clip_norm", &c->clip_norm) && get_f32(opt, "clip_value", &c->clip_value) &&
          get_hex(opt, "seed", &c->seed) && get_i64(sc, "decay", 0, 2, &decay) &&
          get_i64(sc, "warmup_steps", 0, INT64_MAX, &l->warmup_steps) &&
          get_f32(sc, "warmup_start_factor", &l->warmup_start_factor) &&
          get_i64(sc, "step_size", 0, INT64_MAX, &l->step_size) &&
          get_f32(sc, "gamma", &l->gamma) &&
          get_i64(sc, "decay_steps", 0, INT64_MAX, &l->decay_steps) &&
          get_f32(sc, "final_lr", &l->final_lr)))
        return false;
    l->decay = (mp_lr_decay)decay;
    /* files from before decay_all decayed every parameter */
    c->decay_all = true;
    if (json_object_get(opt, "decay_all") && !get_bool(opt, "decay_all", &c->decay_all))
        return false;
    return mp_loss_from_name(json_string_value(json_object_get(j, "loss")), &o->loss) == MP_OK &&
           get_bool(j, "from_logits", &o->from_logits) &&
           scaler_config_parse(json_object_get(j, "scaler"), &o->scaler);
}

/* --------------------------------------------------------------- fit state */

void mp_fit_state_free(mp_fit_state *st)
{
    if (!st) return;
    mp_history_free(&st->history);
    memset(st, 0, sizeof *st);
}

static json_t *fit_json(const mp_fit_state *f)
{
    json_t *hist = json_array();
    for (int i = 0; i < f->history.count; i++) {
        const mp_epoch_log *e = &f->history.epochs[i];
        json_array_append_new(
            hist, json_pack("{s:i, s:I, s:o, s:o, s:b, s:o, s:o, s:o, s:o, s:o, s:I}", "epoch",
                            e->epoch, "steps", (json_int_t)e->steps, "loss", jnum(e->loss),
                            "accuracy", jnum(e->accuracy), "has_validation", e->has_validation,
                            "val_loss", jnum(e->val_loss), "val_accuracy", jnum(e->val_accuracy),
                            "seconds", jnum(e->seconds), "ms_per_step", jnum(e->ms_per_step),
                            "loss_scale", jnum(e->loss_scale), "skipped", (json_int_t)e->skipped));
    }
    return json_pack(
        "{s:i, s:I, s:I, s:o, s:I, s:I, s:I, s:I, s:o, s:o, s:i, s:I, s:b, s:o, s:o, "
        "s:I, s:o, s:o, s:i, s:I, s:i, s:I}",
        "epoch", f->epoch, "batch", (json_int_t)f->batch, "steps", (json_int_t)f->steps, "loss_sum",
        jnum(f->loss_sum), "loss_samples", (json_int_t)f->loss_samples, "samples",
        (json_int_t)f->samples, "correct", (json_int_t)f->correct, "skipped_before",
        (json_int_t)f->skipped_before, "seconds", jnum(f->seconds), "best", jnum(f->best),
        "bad_epochs", f->bad_epochs, "batch_size", (json_int_t)f->batch_size, "shuffle", f->shuffle,
        "seed", mp_json_hex(f->seed), "validation_split", jnum(f->validation_split), "data_count",
        (json_int_t)f->data_count, "data_hash", mp_json_hex(f->data_hash), "history", hist,
        "epochs", f->epochs, "checkpoint_every", (json_int_t)f->checkpoint_every, "keep_last",
        f->keep_last, "steps_per_epoch", (json_int_t)f->steps_per_epoch);
}

#define MAX_EPOCHS 100000000

static mp_status fit_parse(const json_t *j, const char *path, mp_fit_state *f)
{
    mp_status s = MP_OK;
    memset(f, 0, sizeof *f);
    int64_t epoch, bad, epochs;
    const json_t *hist = json_object_get(j, "history");
    if (!json_is_object(j) || !get_i64(j, "epoch", 0, MAX_EPOCHS, &epoch) ||
        !get_i64(j, "batch", 0, INT64_MAX, &f->batch) ||
        !get_i64(j, "steps", 0, INT64_MAX, &f->steps) ||
        !get_num(j, "loss_sum", NAN, &f->loss_sum) ||
        !get_i64(j, "loss_samples", 0, INT64_MAX, &f->loss_samples) ||
        !get_i64(j, "samples", 0, INT64_MAX, &f->samples) ||
        !get_i64(j, "correct", 0, INT64_MAX, &f->correct) ||
        !get_i64(j, "skipped_before", 0, INT64_MAX, &f->skipped_before) ||
        !get_num(j, "seconds", 0, &f->seconds) || !get_num(j, "best", INFINITY, &f->best) ||
        !get_i64(j, "bad_epochs", 0, MAX_EPOCHS, &bad) ||
        !get_i64(j, "batch_size", 1, INT64_MAX, &f->batch_size) ||
        !get_i64(j, "epochs", 0, MAX_EPOCHS, &epochs) || !get_bool(j, "shuffle", &f->shuffle) ||
        !get_hex(j, "seed", &f->seed) ||
        !get_num(j, "validation_split", NAN, &f->validation_split) ||
        !(f->validation_split >= 0 && f->validation_split < 1) ||
        !get_i64(j, "data_count", 0, INT64_MAX, &f->data_count) ||
        !get_hex(j, "data_hash", &f->data_hash) || !json_is_array(hist) ||
        json_array_size(hist) != (size_t)epoch)
        BAD("'%s': mixprec.fit is incomplete or out of range", path);
    f->epoch = (int)epoch;
    f->epochs = (int)epochs;
    f->bad_epochs = (int)bad;
    /* the checkpoint cadence came later: absent in older files */
    int64_t every = 0, keep = 0;
    if ((json_object_get(j, "checkpoint_every") &&
         !get_i64(j, "checkpoint_every", 0, INT64_MAX, &every)) ||
        (json_object_get(j, "keep_last") && !get_i64(j, "keep_last", 0, 1000000, &keep)))
        BAD("'%s': mixprec.fit has a bad checkpoint cadence", path);
    f->checkpoint_every = every;
    f->keep_last = (int)keep;
    /* so did steps_per_epoch (0: an epoch is a pass over the data) */
    if (json_object_get(j, "steps_per_epoch") &&
        !get_i64(j, "steps_per_epoch", 0, INT64_MAX, &f->steps_per_epoch))
        BAD("'%s': mixprec.fit has a bad steps_per_epoch", path);
    if (f->correct > f->samples || f->loss_samples > f->samples)
        BAD("'%s': mixprec.fit counts are inconsistent", path);
    f->history.epochs = calloc((size_t)(epoch ? epoch : 1), sizeof *f->history.epochs);
    if (!f->history.epochs) BAD("'%s': out of memory for the history", path);
    for (int i = 0; i < f->epoch; i++) {
        const json_t *e = json_array_get(hist, (size_t)i);
        mp_epoch_log *l = &f->history.epochs[i];
        int64_t ep;
        double scale;
        if (!get_i64(e, "epoch", i + 1, i + 1, &ep) ||
            !get_i64(e, "steps", 0, INT64_MAX, &l->steps) || !get_num(e, "loss", NAN, &l->loss) ||
            !get_num(e, "accuracy", NAN, &l->accuracy) ||
            !get_bool(e, "has_validation", &l->has_validation) ||
            !get_num(e, "val_loss", NAN, &l->val_loss) ||
            !get_num(e, "val_accuracy", NAN, &l->val_accuracy) ||
            !get_num(e, "seconds", NAN, &l->seconds) ||
            !get_num(e, "ms_per_step", NAN, &l->ms_per_step) ||
            !get_num(e, "loss_scale", NAN, &scale) ||
            !get_i64(e, "skipped", 0, INT64_MAX, &l->skipped))
            BAD("'%s': mixprec.fit history entry %d is incomplete", path, i + 1);
        l->epoch = (int)ep;
        l->loss_scale = (float)scale;
        f->history.count = i + 1;
    }
    return MP_OK;
fail:
    mp_fit_state_free(f);
    return s;
}

/* -------------------------------------------------------------------- save */

mp_status mp_model_save_checkpoint(mp_model *m, const char *path, const mp_fit_state *fit)
{
    mp_optimizer *opt = mp_model_optimizer(m);
    int np = mp_model_num_params(m), ns = opt ? mp_optimizer_num_slots(opt) : 0;
    int nf8 = opt ? mp_checkpoint_float8_count(m) : 0; /* float8 state goes with training state */
    int nt = np * (1 + ns) + nf8;
    mp_named_tensor *t = calloc((size_t)(nt ? nt : 1), sizeof *t);
    char *names = calloc((size_t)(np * ns + 1), SLOT_NAME_MAX);
    char *config = mp_model_config_json(m), *training = NULL, *fitj = NULL, *f8names = NULL;
    mp_status s = MP_OK;
    if (!t || !names || !config) {
        s = mp_set_error(MP_ERR_NOMEM, "checkpoint: out of memory");
        goto done;
    }
    mp_model_param_tensors(m, t);
    int nopt = 0; /* the optimizer's index: trainable parameters only */
    for (int i = 0; i < np; i++) {
        if (!mp_model_get_param(m, i)->trainable) continue;
        for (int k = 0; k < ns; k++) {
            mp_named_tensor *x = &t[np + nopt * ns + k];
            char *name = names + (size_t)(nopt * ns + k) * SLOT_NAME_MAX;
            slot_name(name, t[i].name, opt, k);
            *x = t[i];
            x->name = name;
            x->dtype = MP_F32;
            x->data = mp_optimizer_slot(opt, nopt, k, NULL);
        }
        nopt++;
    }
    nt = np + nopt * ns;
    if (nf8 && !(f8names = mp_checkpoint_float8_tensors(m, t + nt))) {
        s = MP_ERR_NOMEM;
        goto done;
    }
    nt += nf8;
    if (opt) {
        mp_compile_options co;
        mp_model_get_compile_options(m, &co);
        mp_loss_scaler *ls = mp_model_loss_scaler(m);
        json_t *scaler = json_null();
        if (ls) {
            mp_loss_scaler_config lc;
            mp_loss_scaler_state st;
            mp_loss_scaler_get_config(ls, &lc);
            mp_loss_scaler_get_state(ls, &st);
            scaler = json_pack("{s:o, s:o, s:I}", "config", scaler_config_json(&lc), "scale",
                               jnum(st.scale), "counter", (json_int_t)st.counter);
        }
        json_t *j =
            json_pack("{s:i, s:o, s:I, s:o, s:I, s:I, s:o}", "version", STATE_VERSION, "compile",
                      compile_json(&co), "optimizer_step", (json_int_t)mp_optimizer_step_count(opt),
                      "loss_scaler", scaler, "steps_applied", (json_int_t)mp_model_steps_applied(m),
                      "steps_skipped", (json_int_t)mp_model_steps_skipped(m), "forward_count",
                      mp_json_hex(mp_model_forward_count(m)));
        training = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (!training) {
            s = mp_set_error(MP_ERR_NOMEM, "checkpoint: cannot encode the training state");
            goto done;
        }
    }
    if (fit) {
        json_t *j = fit_json(fit);
        fitj = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (!fitj) {
            s = mp_set_error(MP_ERR_NOMEM, "checkpoint: cannot encode the fit state");
            goto done;
        }
    }
    mp_policy g = mp_model_policy(m); /* the policy it was built under */
    const char *keys[6] = {"format", "mixprec_version", "mixprec.config", "mixprec.global_policy"};
    const char *vals[6] = {"pt", MP_VERSION_STRING, config, g.name};
    int nm = 4;
    if (training) keys[nm] = "mixprec.training", vals[nm++] = training;
    if (fitj) keys[nm] = "mixprec.fit", vals[nm++] = fitj;
    s = mp_safetensors_write(path, t, opt ? nt : np, keys, vals, nm);
done:
    free(t);
    free(names);
    free(f8names);
    free(config);
    free(training);
    free(fitj);
    return s;
}

/* -------------------------------------------------------------------- load */

/* Everything a checkpoint will change, checked (in the file's memory, not
 * copied) before any of it is written into the model. */
typedef struct {
    int np, ns;
    const mp_named_tensor **weights, **slots, **float8;
    bool has_training, compiled_here;
    mp_compile_options co;
    int64_t opt_step, applied, skipped;
    uint64_t forward_count;
    bool has_scaler;
    mp_loss_scaler_state scaler;
} staged;

static void staged_free(staged *st)
{
    free(st->weights);
    free(st->slots);
    free(st->float8);
}

static mp_status stage_training(mp_model *m, const mp_safetensors *f, const char *path, staged *st)
{
    mp_status s = MP_OK;
    const char *text = mp_safetensors_metadata(f, "mixprec.training");
    json_t *j = NULL;
    if (!text) return MP_OK; /* weights only */
    json_error_t je;
    if (!(j = json_loads(text, JSON_REJECT_DUPLICATES, &je)))
        BAD("'%s': mixprec.training is not valid JSON (%s)", path, je.text);
    int64_t version;
    if (!get_i64(j, "version", STATE_VERSION, STATE_VERSION, &version))
        BAD("'%s': mixprec.training has an unsupported version", path);
    if (!compile_parse(json_object_get(j, "compile"), &st->co))
        BAD("'%s': mixprec.training has incomplete or bad compile options", path);
    if (!get_i64(j, "optimizer_step", 0, INT64_MAX, &st->opt_step) ||
        !get_i64(j, "steps_applied", 0, INT64_MAX, &st->applied) ||
        !get_i64(j, "steps_skipped", 0, INT64_MAX, &st->skipped) ||
        !get_hex(j, "forward_count", &st->forward_count))
        BAD("'%s': mixprec.training has bad step counters", path);
    const json_t *lsj = json_object_get(j, "loss_scaler");
    mp_loss_scaler_config lc;
    if (!json_is_null(lsj)) {
        double scale;
        if (!scaler_config_parse(json_object_get(lsj, "config"), &lc) ||
            !get_num(lsj, "scale", NAN, &scale) || !(scale > 0 && scale <= FLT_MAX) ||
            !get_i64(lsj, "counter", 0, lc.growth_interval - 1, &st->scaler.counter))
            BAD("'%s': mixprec.training has a bad loss-scaler state", path);
        st->scaler.scale = (float)scale;
        st->has_scaler = true;
    }
    st->has_training = true;

    /* the optimizer the state goes into: the model's, or one compiled now
     * from the file's options (apply() drops it again on a later error) */
    mp_optimizer *opt = mp_model_optimizer(m);
    if (!opt) {
        if (mp_model_compile(m, &st->co) != MP_OK)
            BAD("'%s': mixprec.training: %s", path, mp_last_error());
        st->compiled_here = true;
        opt = mp_model_optimizer(m);
    } else {
        mp_compile_options mine;
        mp_model_get_compile_options(m, &mine);
        if (mine.optimizer.kind != st->co.optimizer.kind)
            BAD("'%s' holds %s state; the model is compiled with %s", path,
                mp_optimizer_kind_name(st->co.optimizer.kind),
                mp_optimizer_kind_name(mine.optimizer.kind));
    }
    mp_loss_scaler *ls = mp_model_loss_scaler(m);
    if (st->has_scaler != (ls != NULL))
        BAD("'%s' %s loss-scaler state, but the model %s loss scaling", path,
            st->has_scaler ? "holds" : "has no", st->has_scaler ? "has no" : "uses");
    if (ls) { /* the file's scaler config must be valid, and its state must suit
               * the scaler it goes into */
        mp_loss_scaler_config mine;
        mp_loss_scaler_get_config(ls, &mine);
        if (mp_loss_scaler_config_validate(&lc) || mp_loss_scaler_state_check(&mine, &st->scaler))
            BAD("'%s': mixprec.training has a bad loss-scaler state (%s)", path, mp_last_error());
    }
    st->ns = mp_optimizer_num_slots(opt);
    st->slots = calloc((size_t)(st->np * st->ns + 1), sizeof *st->slots);
    if (!st->slots) BAD("'%s': out of memory", path);
    for (int i = 0, nopt = 0; i < st->np && !s; i++) {
        const mp_model_param *p = mp_model_get_param(m, i);
        if (!p->trainable) continue;
        for (int k = 0; k < st->ns && !s; k++) {
            char name[SLOT_NAME_MAX];
            slot_name(name, p->name, opt, k);
            const mp_named_tensor *t = mp_safetensors_find(f, name);
            if (!t) {
                s = mp_set_error(MP_ERR_FORMAT, "'%s' has no optimizer state '%s'", path, name);
                break;
            }
            /* a second moment is a mean of squares: never negative */
            bool square = !strcmp(mp_optimizer_slot_name(opt, k), "exp_avg_sq");
            if ((s = mp_check_tensor(t, path, name, p->ndim, p->shape, p->n, square))) break;
            st->slots[nopt * st->ns + k] = t;
        }
        nopt++;
    }
    /* the float8 recipe's histories and scales */
    st->float8 = calloc((size_t)mp_checkpoint_float8_count(m) + 1, sizeof *st->float8);
    if (!s && !st->float8) s = mp_set_error(MP_ERR_NOMEM, "'%s': out of memory", path);
    if (!s) s = mp_checkpoint_float8_check(m, f, path, st->float8);
fail:
    json_decref(j);
    return s;
}

static mp_status apply(mp_model *m, const mp_safetensors *f, const char *path, mp_fit_state *fit)
{
    staged st;
    memset(&st, 0, sizeof st);
    st.np = mp_model_num_params(m);
    mp_fit_state fs;
    memset(&fs, 0, sizeof fs);
    mp_status s = MP_OK;
    st.weights = calloc((size_t)(st.np ? st.np : 1), sizeof *st.weights);
    if (!st.weights) BAD("'%s': out of memory", path);
    if ((s = mp_model_check_weights(m, f, path, st.weights))) goto fail;
    if ((s = stage_training(m, f, path, &st))) goto fail;
    const char *ftext = fit ? mp_safetensors_metadata(f, "mixprec.fit") : NULL;
    if (ftext) {
        json_error_t je;
        json_t *j = json_loads(ftext, JSON_REJECT_DUPLICATES, &je);
        if (!j) BAD("'%s': mixprec.fit is not valid JSON (%s)", path, je.text);
        s = fit_parse(j, path, &fs);
        json_decref(j);
        if (s) goto fail;
    }
    /* everything is checked: now change the model */
    mp_model_commit_weights(m, st.weights);
    if (st.has_training) {
        mp_optimizer *opt = mp_model_optimizer(m);
        for (int i = 0, nopt = 0; i < st.np; i++) {
            const mp_model_param *p = mp_model_get_param(m, i);
            if (!p->trainable) continue;
            for (int k = 0; k < st.ns; k++) {
                const mp_named_tensor *t = st.slots[nopt * st.ns + k];
                mp_convert(mp_optimizer_slot(opt, nopt, k, NULL), MP_F32, t->data, t->dtype,
                           (size_t)p->n);
            }
            nopt++;
        }
        mp_optimizer_set_step_count(opt, st.opt_step);
        if (st.has_scaler) mp_loss_scaler_set_state(mp_model_loss_scaler(m), &st.scaler);
        mp_model_set_step_counts(m, st.applied, st.skipped);
        mp_model_set_forward_count(m, st.forward_count);
        mp_checkpoint_float8_apply(m, st.float8);
    }
    if (fit) *fit = fs;
    staged_free(&st);
    return MP_OK;
fail:
    if (st.compiled_here) mp_model_set_training_state(m, NULL, NULL); /* not compiled, as before */
    mp_fit_state_free(&fs);
    staged_free(&st);
    return s;
}

mp_status mp_model_load_checkpoint(mp_model *m, const char *path, mp_fit_state *fit)
{
    if (fit) memset(fit, 0, sizeof *fit);
    if (!mp_model_is_built(m)) return mp_set_error(MP_ERR_INVALID, "load: build the model first");
    mp_safetensors *f;
    mp_status s = mp_safetensors_read(path, &f);
    if (s) return s;
    s = apply(m, f, path, fit);
    mp_safetensors_free(f);
    return s;
}

mp_status mp_model_from_safetensors(const mp_safetensors *f, const char *path, int64_t max_batch,
                                    mp_model **out, mp_fit_state *fit)
{
    *out = NULL;
    if (fit) memset(fit, 0, sizeof *fit);
    const char *config = mp_safetensors_metadata(f, "mixprec.config");
    if (!config)
        return mp_set_error(MP_ERR_FORMAT, "'%s' has no mixprec.config: not a mixprec model file",
                            path);
    if (max_batch <= 0) { /* the fit's batch size, if the file has a fit state */
        max_batch = 1;
        const char *ft = mp_safetensors_metadata(f, "mixprec.fit");
        json_t *j = ft ? json_loads(ft, JSON_REJECT_DUPLICATES, NULL) : NULL;
        int64_t b;
        if (j && get_i64(j, "batch_size", 1, (int64_t)1 << 24, &b)) max_batch = b;
        json_decref(j);
    }
    mp_model *m;
    mp_status s =
        mp_model_from_config(config, max_batch, (int64_t)mp_safetensors_data_bytes(f), &m);
    if (s) return mp_set_error(s, "'%s': %s", path, mp_last_error());
    if ((s = apply(m, f, path, fit))) {
        mp_model_free(m);
        return s;
    }
    *out = m;
    return MP_OK;
}

mp_status mp_model_from_checkpoint(const char *path, int64_t max_batch, mp_model **out,
                                   mp_fit_state *fit)
{
    *out = NULL;
    if (fit) memset(fit, 0, sizeof *fit);
    mp_safetensors *f;
    mp_status s = mp_safetensors_read(path, &f);
    if (s) return s;
    s = mp_model_from_safetensors(f, path, max_batch, out, fit);
    mp_safetensors_free(f);
    return s;
}
