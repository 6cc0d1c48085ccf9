/* inspect_cmd.c - `mixprec inspect FILE`: what a safetensors file holds
 * (tensors with statistics, metadata), and for a mixprec file the model it
 * rebuilds to, the training state and where the fit stands. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "mixprec.h"

static void shape_str(const mp_named_tensor *t, char *buf, size_t len)
{
    size_t off = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < t->ndim && off < len; d++)
        off +=
            (size_t)snprintf(buf + off, len - off, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (off < len) snprintf(buf + off, len - off, "]");
}

static void print_tensors(const mp_safetensors *f)
{
    int n = mp_safetensors_count(f);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const mp_named_tensor *t = mp_safetensors_tensor(f, i);
        size_t b = mp_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) b *= (size_t)t->shape[d];
        total += b;
    }
    printf("tensors: %d, %.1f KiB of data\n", n, (double)total / 1024);
    printf("  %-40s %-10s %-14s %10s %12s %12s %12s %12s %9s\n", "name", "dtype", "shape", "bytes",
           "min", "max", "mean", "std", "nonfinite");
    float *buf = NULL;
    size_t cap = 0;
    for (int i = 0; i < n; i++) {
        const mp_named_tensor *t = mp_safetensors_tensor(f, i);
        size_t count = 1;
        for (int d = 0; d < t->ndim; d++) count *= (size_t)t->shape[d];
        if (count > cap) {
            float *nb = realloc(buf, count * sizeof *nb);
            if (!nb) break;
            buf = nb;
            cap = count;
        }
        mp_convert(buf, MP_F32, t->data, t->dtype, count);
        double lo = INFINITY, hi = -INFINITY, sum = 0, sq = 0;
        size_t bad = 0, good = 0;
        for (size_t j = 0; j < count; j++) {
            double x = buf[j];
            if (!isfinite(x)) {
                bad++;
                continue;
            }
            good++;
            lo = x < lo ? x : lo;
            hi = x > hi ? x : hi;
            sum += x;
            sq += x * x;
        }
        double mean = good ? sum / (double)good : NAN;
        double var = good ? sq / (double)good - mean * mean : NAN;
        char shape[64];
        shape_str(t, shape, sizeof shape);
        printf("  %-40s %-10s %-14s %10zu %12.5g %12.5g %12.5g %12.5g %9zu\n", t->name,
               mp_dtype_name(t->dtype), shape, count * mp_dtype_size(t->dtype), good ? lo : NAN,
               good ? hi : NAN, mean, var > 0 ? sqrt(var) : 0.0, bad);
    }
    free(buf);
}

static void print_metadata(const mp_safetensors *f)
{
    static const char *const keys[] = {
        "format",         "mixprec_version",  "mixprec.global_policy",
        "mixprec.config", "mixprec.training", "mixprec.fit"};
    printf("metadata:\n");
    bool any = false;
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const char *v = mp_safetensors_metadata(f, keys[i]);
        if (!v) continue;
        any = true;
        if (strlen(v) > 60)
            printf("  %-22s (JSON, %zu bytes; shown below)\n", keys[i], strlen(v));
        else
            printf("  %-22s %s\n", keys[i], v);
    }
    if (!any) printf("  (none that mixprec knows)\n");
}

static void print_training(mp_model *m)
{
    mp_compile_options co;
    if (mp_model_get_compile_options(m, &co) != MP_OK) {
        printf("\ntraining state: none (weights only)\n");
        return;
    }
    mp_optimizer *opt = mp_model_optimizer(m);
    const mp_optimizer_config *c = &co.optimizer;
    static const char *const decay[] = {"constant", "step decay", "cosine"};
    printf("\ntraining state:\n");
    printf("  optimizer      %s: base lr %g (next step %g), ", mp_optimizer_kind_name(c->kind),
           (double)c->learning_rate, (double)mp_optimizer_learning_rate(opt));
    if (c->kind == MP_OPTIMIZER_SGD)
        printf("momentum %g%s", (double)c->momentum, c->nesterov ? " (Nesterov)" : "");
    else
        printf("betas %g/%g, epsilon %g", (double)c->beta1, (double)c->beta2, (double)c->epsilon);
    printf(", weight decay %g\n", (double)c->weight_decay);
    printf("  schedule       %s, warm-up %lld steps; rounding %s\n",
           (unsigned)c->schedule.decay < 3 ? decay[c->schedule.decay] : "?",
           (long long)c->schedule.warmup_steps,
           c->rounding == MP_ROUND_STOCHASTIC ? "stochastic" : "nearest");
    printf("  optimizer step %lld (state:", (long long)mp_optimizer_step_count(opt));
    for (int k = 0; k < mp_optimizer_num_slots(opt); k++)
        printf(" %s", mp_optimizer_slot_name(opt, k));
    printf("%s)\n", mp_optimizer_num_slots(opt) ? "" : " none");
    printf("  loss           %s%s\n", mp_loss_name(co.loss), co.from_logits ? " (logits)" : "");
    mp_loss_scaler *ls = mp_model_loss_scaler(m);
    if (ls) {
        mp_loss_scaler_config lc;
        mp_loss_scaler_state st;
        mp_loss_scaler_get_config(ls, &lc);
        mp_loss_scaler_get_state(ls, &st);
        if (lc.mode == MP_LOSS_SCALE_STATIC)
            printf("  loss scaling   static, scale %g\n", (double)st.scale);
        else
            printf("  loss scaling   dynamic: scale %g, %lld of %lld good steps to the next growth "
                   "(x%g; backoff x%g)\n",
                   (double)st.scale, (long long)st.counter, (long long)lc.growth_interval,
                   (double)lc.growth_factor, (double)lc.backoff_factor);
    } else
        printf("  loss scaling   none\n");
    printf("  steps          %lld applied, %lld skipped; dropout counter %llu\n",
           (long long)mp_model_steps_applied(m), (long long)mp_model_steps_skipped(m),
           (unsigned long long)mp_model_forward_count(m));
}

static void print_fit(const mp_fit_state *f)
{
    if (!f->batch_size) {
        printf("\nfit state: none\n");
        return;
    }
    printf("\nfit state:\n");
    printf("  position       epoch %d of %d, %lld batches into it, %lld steps in all\n",
           f->epoch + 1 > f->epochs ? f->epochs : f->epoch + 1, f->epochs, (long long)f->batch,
           (long long)f->steps);
    printf("  data order     batch size %lld, shuffle %s (seed %llu), validation split %g\n",
           (long long)f->batch_size, f->shuffle ? "on" : "off", (unsigned long long)f->seed,
           f->validation_split);
    printf("  data           %lld training samples, fingerprint %016llx\n",
           (long long)f->data_count, (unsigned long long)f->data_hash);
    if (f->samples)
        printf("  this epoch     loss %.4f, accuracy %.4f over %lld samples\n",
               f->loss_samples ? f->loss_sum / (double)f->loss_samples : NAN,
               (double)f->correct / (double)f->samples, (long long)f->samples);
    if (isfinite(f->best))
        printf("  early stopping best %.4f, %d epochs without improvement\n", f->best,
               f->bad_epochs);
    if (!f->history.count) return;
    printf("  history:\n  %5s %7s %9s %9s %9s %9s %11s %8s %8s\n", "epoch", "steps", "loss",
           "accuracy", "val_loss", "val_acc", "loss_scale", "skipped", "seconds");
    for (int i = 0; i < f->history.count; i++) {
        const mp_epoch_log *e = &f->history.epochs[i];
        printf("  %5d %7lld %9.4f %9.4f ", e->epoch, (long long)e->steps, e->loss, e->accuracy);
        if (e->has_validation)
            printf("%9.4f %9.4f", e->val_loss, e->val_accuracy);
        else
            printf("%9s %9s", "-", "-");
        printf(" %11g %8lld %8.1f\n", (double)e->loss_scale, (long long)e->skipped, e->seconds);
    }
}

int mp_cli_inspect(int argc, char **argv)
{
    if (argc == 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
        printf("usage: mixprec inspect FILE.safetensors\n"
               "Lists the tensors (dtype, shape, bytes, min/max/mean/std, non-finite count) and\n"
               "metadata; for a file mixprec wrote, also the model summary, the training state\n"
               "(optimizer, loss scaler, step counters) and the fit state with its history.\n");
        return 0;
    }
    if (argc != 1) {
        fprintf(stderr, "mixprec inspect: expected one file (mixprec inspect FILE.safetensors)\n");
        return 2;
    }
    const char *path = argv[0];
    mp_safetensors *f;
    if (mp_safetensors_read(path, &f)) {
        fprintf(stderr, "mixprec: %s\n", mp_last_error());
        return 1;
    }
    struct stat st;
    printf("file: %s (%lld bytes, safetensors)\n", path,
           stat(path, &st) == 0 ? (long long)st.st_size : -1LL);
    print_metadata(f);
    print_tensors(f);
    mp_model *m = NULL;
    mp_fit_state fit;
    int rc = 0;
    if (!mp_safetensors_metadata(f, "mixprec.config"))
        printf("\nmodel: no mixprec.config metadata (not a model mixprec saved)\n");
    else if (mp_model_from_safetensors(f, path, 1, &m, &fit)) {
        printf("\nmodel: cannot be rebuilt and loaded: %s\n", mp_last_error());
        rc = 1;
    } else {
        printf("\nmodel:\n");
        mp_model_summary(m, 1, stdout);
        print_training(m);
        print_fit(&fit);
        mp_fit_state_free(&fit);
        mp_model_free(m);
    }
    mp_safetensors_free(f);
    return rc;
}
