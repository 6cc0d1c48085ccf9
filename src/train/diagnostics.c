/* diagnostics.c - per-layer numerics while training (what rounding into the
 * compute dtype does to activations, weights, gradients and updates), logged
 * as JSON Lines into a run directory with the model's config and precision
 * plan, for `mixprec report`. Work happens on diagnostic steps only: the
 * optimizer's update pass gathers the weights' and gradients' figures as it
 * goes (master before and after, its copy, the gradient: chunks still in
 * cache), the rest takes one pass per tensor (core/numerics.c). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "optim/optim_internal.h"
#include "train/train_internal.h"

/* ------------------------------------------------------------- the log */

typedef struct {
    int node;
    const char *name, *cls;
    mp_dtype compute, output;
    int nparams;
    int *params; /* indices into the model's parameters */
} dlayer;

struct mp_diagnostics {
    int fd;
    int64_t every;
    char history[4096];
    int nlayers;
    dlayer *layers;
    /* per model parameter its index among the optimizer's (-1: none); per
     * optimizer parameter the figures its update pass gathers on a
     * diagnostic step (n 0: not gathered, the step was skipped) */
    int *opt_index;
    int nopt;
    mp_numerics *num_weights, *num_grads;
    /* the step in progress */
    int64_t step;
    bool diag;
    float lr;
    double t0; /* the step's start */
};

/* JSON has no inf/NaN: those become null. */
static json_t *jnum(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* One record, one write() of the whole line (a short write continues). */
static mp_status write_record(mp_diagnostics *d, json_t *rec)
{
    char *s = json_dumps(rec, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(rec);
    if (!s) return mp_set_error(MP_ERR_NOMEM, "diagnostics: out of memory");
    size_t len = strlen(s);
    char *line = realloc(s, len + 2);
    if (!line) {
        free(s);
        return mp_set_error(MP_ERR_NOMEM, "diagnostics: out of memory");
    }
    line[len++] = '\n';
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(d->fd, line + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            free(line);
            return mp_set_error(MP_ERR_IO, "diagnostics: cannot write: %s", strerror(e));
        }
        done += (size_t)w;
    }
    free(line);
    return MP_OK;
}

/* text to dir/name through a temporary and a rename: never a torn file */
static mp_status write_file(const char *dir, const char *name, const char *text)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return mp_set_error(MP_ERR_IO, "cannot write '%s': %s", tmp, strerror(errno));
    bool ok =
        fputs(text, f) >= 0 && fputc('\n', f) != EOF && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return mp_set_error(MP_ERR_IO, "cannot write '%s'", path);
    }
    return MP_OK;
}

static json_t *dtype_range(mp_dtype t)
{
    mp_dtype_info in;
    mp_dtype_get_info(t, &in);
    return json_pack("{s:o,s:o,s:o}", "max", jnum((double)in.max), "min_normal",
                     jnum((double)in.min_normal), "min_subnormal", jnum((double)in.min_subnormal));
}

static int optimizer_slots(mp_model *m)
{
    mp_optimizer *o = mp_model_optimizer(m);
    return o ? mp_optimizer_num_slots(o) : 0;
}

/* plan.json: the precision plan and the planned memory at the fit's batch */
static mp_status write_plan(mp_model *m, const char *dir, int64_t batch)
{
    json_t *layers = json_array();
    for (int i = 0; i < mp_model_num_layers(m); i++) {
        mp_layer_info li;
        mp_status s = mp_model_layer_info(m, i, batch, &li);
        if (s) {
            json_decref(layers);
            return s;
        }
        json_array_append_new(
            layers, json_pack("{s:s,s:s,s:s,s:b,s:s,s:s,s:I,s:I,s:I,s:I,s:I}", "name", li.name,
                              "class", li.type, "policy", li.policy.name, "policy_explicit",
                              li.policy_explicit, "compute_dtype", mp_dtype_name(li.policy.compute),
                              "output_dtype", mp_dtype_name(li.output_dtype), "params",
                              (json_int_t)li.params, "state", (json_int_t)li.state, "param_bytes",
                              (json_int_t)li.param_bytes, "saved_bytes", (json_int_t)li.saved_bytes,
                              "workspace_bytes", (json_int_t)li.workspace_bytes));
    }
    mp_memory_plan mp;
    mp_status s = mp_model_memory_plan(m, batch, optimizer_slots(m), &mp);
    if (s) {
        json_decref(layers);
        return s;
    }
    json_t *plan = json_pack(
        "{s:s,s:I,s:o,s:{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}}", "policy", mp_model_policy(m).name,
        "batch_size", (json_int_t)batch, "layers", layers, "memory_plan", "master_weights",
        (json_int_t)mp.master_weights, "weights", (json_int_t)mp.weights, "state",
        (json_int_t)mp.state, "gradients", (json_int_t)mp.gradients, "optimizer_state",
        (json_int_t)mp.optimizer_state, "activations", (json_int_t)mp.activations, "workspace",
        (json_int_t)mp.workspace, "total", (json_int_t)mp.total);
    char *text = plan ? json_dumps(plan, JSON_INDENT(2)) : NULL;
    json_decref(plan);
    if (!text) return mp_set_error(MP_ERR_NOMEM, "diagnostics: out of memory");
    s = write_file(dir, "plan.json", text);
    free(text);
    return s;
}

static mp_status build_layers(mp_diagnostics *d, mp_model *m)
{
    int nl = mp_model_num_layers(m), np = mp_model_num_params(m);
    d->layers = calloc((size_t)(nl ? nl : 1), sizeof *d->layers);
    mp_optimizer *opt = mp_model_optimizer(m);
    d->nopt = mp_optimizer_num_params(opt);
    d->opt_index = malloc((size_t)(np ? np : 1) * sizeof *d->opt_index);
    d->num_weights = calloc((size_t)(d->nopt ? d->nopt : 1) * 2, sizeof *d->num_weights);
    if (!d->layers || !d->opt_index || !d->num_weights)
        return mp_set_error(MP_ERR_NOMEM, "diagnostics: no memory");
    d->num_grads = d->num_weights + d->nopt;
    for (int p = 0; p < np; p++) { /* the optimizer holds the trainable ones, by their master */
        mp_model_param *mpp = mp_model_get_param(m, p);
        d->opt_index[p] = -1;
        for (int i = 0; i < d->nopt && mpp->trainable && mpp->master; i++)
            if (mp_optimizer_param(opt, i)->master == mpp->master) d->opt_index[p] = i;
    }
    for (int i = 0; i < nl; i++) {
        mp_layer_info li;
        mp_status s = mp_model_layer_info(m, i, 1, &li);
        if (s) return s;
        if (!strcmp(li.type, "InputLayer")) continue;
        dlayer *l = &d->layers[d->nlayers++];
        *l = (dlayer){i, li.name, li.type, li.policy.compute, li.output_dtype, 0, NULL};
        l->params = malloc((size_t)(np ? np : 1) * sizeof *l->params);
        if (!l->params) return mp_set_error(MP_ERR_NOMEM, "diagnostics: out of memory");
        size_t len = strlen(li.name);
        for (int p = 0; p < np; p++) {
            const char *pn = mp_model_get_param(m, p)->name;
            if (!strncmp(pn, li.name, len) && pn[len] == '.') l->params[l->nparams++] = p;
        }
    }
    return MP_OK;
}

static mp_status write_run_record(mp_diagnostics *d, mp_model *m, int64_t batch)
{
    json_t *layers = json_array(), *formats = json_object();
    for (int i = 0; i < d->nlayers; i++) {
        const dlayer *l = &d->layers[i];
        json_array_append_new(layers, json_pack("{s:s,s:s,s:s,s:s}", "name", l->name, "class",
                                                l->cls, "compute_dtype", mp_dtype_name(l->compute),
                                                "output_dtype", mp_dtype_name(l->output)));
    }
    for (int t = 0; t < MP_DTYPE_COUNT; t++)
        json_object_set_new(formats, mp_dtype_name((mp_dtype)t), dtype_range((mp_dtype)t));
    mp_policy p = mp_model_policy(m);
    json_t *rec = json_pack("{s:s,s:i,s:s,s:s,s:s,s:I,s:I,s:o,s:o}", "type", "run", "version", 1,
                            "mixprec", MP_VERSION_STRING, "policy", p.name, "compute_dtype",
                            mp_dtype_name(p.compute), "diagnostics_every", (json_int_t)d->every,
                            "batch_size", (json_int_t)batch, "formats", formats, "layers", layers);
    if (!rec) return mp_set_error(MP_ERR_NOMEM, "diagnostics: out of memory");
    return write_record(d, rec);
}

mp_status mp_diagnostics_open(mp_diagnostics **out, mp_model *m, const char *run_dir, int64_t every,
                              int64_t batch_size)
{
    *out = NULL;
    if (!run_dir || !*run_dir) return mp_set_error(MP_ERR_INVALID, "diagnostics: no run directory");
    if (every < 0)
        return mp_set_error(MP_ERR_INVALID, "diagnostics: every %lld steps", (long long)every);
    if (mkdir(run_dir, 0777) != 0 && errno != EEXIST)
        return mp_set_error(MP_ERR_IO, "cannot create the run directory '%s': %s", run_dir,
                            strerror(errno));
    mp_diagnostics *d = calloc(1, sizeof *d);
    if (!d) return mp_set_error(MP_ERR_NOMEM, "diagnostics: out of memory");
    d->fd = -1;
    d->every = every;
    snprintf(d->history, sizeof d->history, "%s/history.csv", run_dir);
    mp_status s = build_layers(d, m);
    char *config = s ? NULL : mp_model_config_json(m);
    if (!s && !config) s = MP_ERR_INVALID; /* it left its message */
    if (!s) s = write_file(run_dir, "config.json", config);
    free(config);
    if (!s) s = write_plan(m, run_dir, batch_size);
    if (!s) {
        char path[4200];
        snprintf(path, sizeof path, "%s/diagnostics.jsonl", run_dir);
        d->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
        if (d->fd < 0) s = mp_set_error(MP_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    }
    if (!s) s = write_run_record(d, m, batch_size);
    if (s) {
        mp_diagnostics_close(d);
        return s;
    }
    *out = d;
    return MP_OK;
}

const char *mp_diagnostics_history_path(const mp_diagnostics *d) { return d ? d->history : NULL; }

mp_status mp_diagnostics_before_step(mp_diagnostics *d, mp_model *m, int64_t step)
{
    d->step = step;
    d->diag = d->every > 0 && (step == 1 || step % d->every == 0);
    mp_optimizer *opt = mp_model_optimizer(m);
    d->lr = opt ? mp_optimizer_learning_rate(opt) : NAN;
    if (d->diag && opt && d->nopt == mp_optimizer_num_params(opt)) {
        /* the update pass gathers the weights' and gradients' figures */
        memset(d->num_weights, 0, (size_t)d->nopt * 2 * sizeof *d->num_weights);
        mp_optimizer_collect_numerics(opt, d->num_weights, d->num_grads);
    }
    d->t0 = mp_seconds();
    return MP_OK;
}

static json_t *numerics_json(const char *kind, const char *name, mp_dtype dtype, mp_dtype target,
                             const mp_numerics *s)
{
    mp_dtype_info in;
    mp_dtype_get_info(target, &in);
    double n = (double)(s->n ? s->n : 1);
    return json_pack("{s:s,s:s,s:s,s:s,s:I,s:o,s:o,s:I,s:I,s:I,s:o,s:I,s:I,s:o}", "kind", kind,
                     "name", name, "dtype", mp_dtype_name(dtype), "target", mp_dtype_name(target),
                     "n", (json_int_t)s->n, "amax", jnum(s->amax), "amax_rel",
                     jnum(s->amax / (double)in.max), "zeros", (json_int_t)s->zeros, "flush",
                     (json_int_t)s->flush, "subnormal", (json_int_t)s->subnormal, "underflow_frac",
                     jnum((double)(s->flush + s->subnormal) / n), "overflow",
                     (json_int_t)s->overflow, "nonfinite", (json_int_t)s->nonfinite, "norm",
                     jnum(sqrt(s->sumsq)));
}

/* One layer's tensors; adds its gradients' squares to *gsq. */
static json_t *layer_json(mp_diagnostics *d, mp_model *m, const dlayer *l, float scale, bool scaled,
                          double *gsq)
{
    json_t *ts = json_array();
    mp_numerics st;
    const mp_tensor *t = mp_model_node_output(m, l->node);
    if (t) {
        mp_numerics_compute(t->data, t->dtype, mp_tensor_numel(t), t->dtype, NULL, MP_F32, NULL,
                            &st);
        json_array_append_new(ts, numerics_json("activation", l->name, t->dtype, t->dtype, &st));
    }
    for (int k = 0; k < l->nparams; k++) {
        const mp_model_param *p = mp_model_get_param(m, l->params[k]);
        if (!p->trainable) continue;
        int oi = d->opt_index[l->params[k]];
        bool master = p->master != NULL, gathered = oi >= 0 && d->num_weights[oi].n == p->n;
        /* gathered by the update; else the step was skipped (the masters
         * did not move) or a pure low-precision policy has no master: the
         * copy is all there is */
        if (gathered)
            st = d->num_weights[oi];
        else
            mp_numerics_compute(master ? (const void *)p->master : p->weight,
                                master ? MP_F32 : p->weight_dtype, p->n, p->weight_dtype,
                                master ? p->weight : NULL, p->weight_dtype, NULL, &st);
        json_t *w = numerics_json("weight", p->name, master ? MP_F32 : p->weight_dtype,
                                  p->weight_dtype, &st);
        json_object_set_new(w, "rel_error", jnum(st.sumsq > 0 ? sqrt(st.err_sumsq / st.sumsq) : 0));
        json_array_append_new(ts, w);
        if (master)
            json_array_append_new(
                ts, json_pack("{s:s,s:s,s:I,s:o,s:o,s:o}", "kind", "update", "name", p->name, "n",
                              (json_int_t)p->n, "amax", jnum(st.upd_amax), "norm",
                              jnum(sqrt(st.upd_sumsq)), "ratio",
                              jnum(st.sumsq > 0 ? sqrt(st.upd_sumsq / st.sumsq) : 0)));
        if (p->grad) {
            if (gathered)
                st = d->num_grads[oi];
            else
                mp_numerics_compute(p->grad, MP_F32, p->n, p->weight_dtype, NULL, MP_F32, NULL,
                                    &st);
            json_t *g = numerics_json("gradient", p->name, MP_F32, p->weight_dtype, &st);
            json_object_set_new(g, "scaled", json_boolean(scaled));
            json_object_set_new(g, "loss_scale", jnum((double)scale));
            json_array_append_new(ts, g);
            *gsq += st.nonfinite ? INFINITY : st.sumsq;
        }
    }
    const mp_tensor *g = mp_model_node_grad(m, l->node);
    if (g) { /* what backward carried, in its dtype and multiplied by the loss scale */
        mp_numerics_compute(g->data, g->dtype, mp_tensor_numel(g), g->dtype, NULL, MP_F32, NULL,
                            &st);
        json_t *o = numerics_json("output_grad", l->name, g->dtype, g->dtype, &st);
        json_object_set_new(o, "scaled", json_boolean(scale != 1.0f));
        json_object_set_new(o, "loss_scale", jnum((double)scale));
        json_array_append_new(ts, o);
    }
    return json_pack("{s:s,s:s,s:s,s:s,s:o}", "name", l->name, "class", l->cls, "compute_dtype",
                     mp_dtype_name(l->compute), "output_dtype", mp_dtype_name(l->output), "tensors",
                     ts);
}

static json_t *memory_json(void)
{
    mp_mem_stats ms;
    mp_mem_get_stats(&ms);
    json_t *cur = json_object(), *peak = json_object();
    for (int c = 0; c < MP_MEM_CATEGORY_COUNT; c++) {
        json_object_set_new(cur, mp_mem_category_name((mp_mem_category)c),
                            json_integer((json_int_t)ms.current[c]));
        json_object_set_new(peak, mp_mem_category_name((mp_mem_category)c),
                            json_integer((json_int_t)ms.peak[c]));
    }
    return json_pack("{s:o,s:o,s:I,s:I}", "current", cur, "peak", peak, "total",
                     (json_int_t)ms.total_current, "total_peak", (json_int_t)ms.total_peak);
}

mp_status mp_diagnostics_after_step(mp_diagnostics *d, mp_model *m, const mp_step_result *r,
                                    int64_t batch, int epoch)
{
    double ms = 1e3 * (mp_seconds() - d->t0);
    mp_optimizer_collect_numerics(mp_model_optimizer(m), NULL, NULL); /* a skipped step's */
    mp_loss_scaler *ls = mp_model_loss_scaler(m);
    float next = ls ? mp_loss_scaler_scale(ls) : 1.0f;
    if (!d->diag) { /* a skipped step or a new scale is an event the report marks */
        if (r->applied && next == r->loss_scale) return MP_OK;
        return write_record(d, json_pack("{s:s,s:I,s:i,s:o,s:o,s:o,s:b}", "type", "event", "step",
                                         (json_int_t)d->step, "epoch", epoch, "loss",
                                         jnum((double)r->loss), "loss_scale",
                                         jnum((double)r->loss_scale), "next_loss_scale",
                                         jnum((double)next), "skipped", !r->applied));
    }
    /* the scaler unscales in place before the optimizer reads them, unless
     * 1/scale overflows (then the step is skipped with them as they were) */
    bool scaled = ls && !isfinite((float)(1.0 / (double)r->loss_scale));
    double gsq = 0;
    json_t *layers = json_array();
    for (int i = 0; i < d->nlayers; i++)
        json_array_append_new(layers, layer_json(d, m, &d->layers[i], r->loss_scale, scaled, &gsq));
    json_t *rec =
        json_pack("{s:s,s:I,s:i,s:o,s:o,s:o,s:o,s:b,s:o,s:o,s:o,s:o,s:o,s:o}", "type", "step",
                  "step", (json_int_t)d->step, "epoch", epoch, "loss", jnum((double)r->loss),
                  "accuracy", jnum(batch ? (double)r->correct / (double)batch : NAN), "loss_scale",
                  jnum((double)r->loss_scale), "next_loss_scale", jnum((double)next), "skipped",
                  !r->applied, "grad_norm", jnum(sqrt(gsq)), "lr", jnum((double)d->lr), "step_ms",
                  jnum(ms), "diagnostics_ms", jnum(0), "memory", memory_json(), "layers", layers);
    if (!rec) return mp_set_error(MP_ERR_NOMEM, "diagnostics: out of memory");
    /* the diagnostics' own time after the step (what the update pass
     * gathered is in step_ms) */
    json_object_set_new(rec, "diagnostics_ms", jnum(1e3 * (mp_seconds() - d->t0) - ms));
    return write_record(d, rec);
}

mp_status mp_diagnostics_epoch_end(mp_diagnostics *d, const mp_epoch_log *e, int64_t step)
{
    json_t *rec = json_pack(
        "{s:s,s:i,s:I,s:I,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:I}", "type", "epoch", "epoch", e->epoch,
        "step", (json_int_t)step, "steps", (json_int_t)e->steps, "loss", jnum(e->loss), "accuracy",
        jnum(e->accuracy), "val_loss", e->has_validation ? jnum(e->val_loss) : json_null(),
        "val_accuracy", e->has_validation ? jnum(e->val_accuracy) : json_null(), "seconds",
        jnum(e->seconds), "ms_per_step", jnum(e->ms_per_step), "loss_scale",
        jnum((double)e->loss_scale), "skipped", (json_int_t)e->skipped);
    if (!rec) return mp_set_error(MP_ERR_NOMEM, "diagnostics: out of memory");
    mp_status s = write_record(d, rec);
    if (!s && fsync(d->fd) != 0)
        s = mp_set_error(MP_ERR_IO, "diagnostics: fsync: %s", strerror(errno));
    return s;
}

mp_status mp_diagnostics_close(mp_diagnostics *d)
{
    if (!d) return MP_OK;
    mp_status s = MP_OK;
    if (d->fd >= 0) {
        bool ok = fsync(d->fd) == 0;
        ok = close(d->fd) == 0 && ok;
        if (!ok)
            s = mp_set_error(MP_ERR_IO, "diagnostics: cannot close the log: %s", strerror(errno));
    }
    for (int i = 0; i < d->nlayers; i++) free(d->layers[i].params);
    free(d->layers);
    free(d->opt_index);
    free(d->num_weights);
    free(d);
    return s;
}
