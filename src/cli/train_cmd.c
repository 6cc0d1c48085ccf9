/* train_cmd.c - `mixprec train`: build an MLP from flags (or any model from a
 * JSON file or by name), load data, compile, fit, evaluate on the test set,
 * report time and memory.
 * All the work is library calls; this file parses flags and prints. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

#include "cli/train.h"
#include "mixprec.h"

/* Library bytes of everything but MP_MEM_OTHER (the dataset), at their peaks. */
size_t mp_cli_model_peak_bytes(void)
{
    mp_mem_stats st;
    mp_mem_get_stats(&st);
    size_t s = 0;
    for (int c = 0; c < MP_MEM_CATEGORY_COUNT; c++)
        if (c != MP_MEM_OTHER) s += st.peak[c];
    return s;
}

/* The per-step part: activations and workspace, where mixed precision saves. */
static size_t step_peak_bytes(void)
{
    mp_mem_stats st;
    mp_mem_get_stats(&st);
    return st.peak[MP_MEM_ACTIVATIONS] + st.peak[MP_MEM_WORKSPACE];
}

int mp_cli_load_spec(const char *spec, const char *dir, bool default_train, mp_dataset **out)
{
    return mp_cli_load_spec_ex(spec, dir, default_train, 0, out);
}

int mp_cli_load_spec_ex(const char *spec, const char *dir, bool default_train, int64_t context,
                        mp_dataset **out)
{
    mp_status s;
    if (!strncmp(spec, "fashion-mnist", 13) && (spec[13] == '\0' || spec[13] == ':')) {
        const char *part = spec[13] ? spec + 14 : (default_train ? "train" : "test");
        if (strcmp(part, "train") && strcmp(part, "test")) {
            fprintf(stderr,
                    "mixprec: --data %s: expected fashion-mnist, fashion-mnist:train or "
                    "fashion-mnist:test\n",
                    spec);
            return 2;
        }
        s = mp_dataset_load_fashion_mnist(dir, !strcmp(part, "train"), out);
    } else if (!strncmp(spec, "text:", 5)) {
        if (context < 1) {
            fprintf(stderr,
                    "mixprec: --data %s: text data is read in windows as long as the "
                    "model's sequence input, and this command has no sequence model\n",
                    spec);
            return 2;
        }
        const char *path = !strcmp(spec + 5, "fortunes") ? MP_FORTUNES_DIR : spec + 5;
        s = mp_dataset_load_text(path, context, out);
    } else {
        mp_csv_options co = mp_csv_options_default();
        s = mp_dataset_load_csv(spec, &co, out);
    }
    if (s) {
        fprintf(stderr, "mixprec: %s\n", mp_last_error());
        return 1;
    }
    return 0;
}

int mp_cli_load_data(const train_args *a, bool train, int64_t context, mp_dataset **out)
{
    *out = NULL;
    if (train) return mp_cli_load_spec_ex(a->data, a->data_dir, true, context, out);
    if (!strcmp(a->data, "fashion-mnist"))
        return mp_cli_load_spec("fashion-mnist:test", a->data_dir, false, out);
    return a->test_data ? mp_cli_load_spec_ex(a->test_data, a->data_dir, false, context, out) : 0;
}

/* The model of --model FILE (its batch bound from --batch-size), or NULL
 * after printing the file's problem. */
mp_model *mp_cli_model_from_file(const train_args *a)
{
    mp_model *m = NULL;
    struct stat st;
    if (mp_cli_is_builtin_model(a->model_file) && stat(a->model_file, &st) != 0) {
        if (mp_cli_builtin_model(a->model_file, a->policy, a->seed, a->batch, &m))
            fprintf(stderr, "mixprec train: --model %s: %s\n", a->model_file, mp_last_error());
        return m;
    }
    if (mp_model_from_config_file(a->model_file, a->policy_given ? a->policy : NULL, a->seed,
                                  a->batch, &m)) {
        fprintf(stderr, "mixprec train: --model %s\n", mp_last_error());
        return NULL;
    }
    return m;
}

/* The model (from --model, else the seed MLP from the flags), built and
 * compiled. Takes a->model. */
static mp_model *build_from_flags(const train_args *a, const mp_dataset *train)
{
    mp_model *m = a->model;
    if (!m) {
        m = mp_model_new_with_policy(a->seed, a->policy);
        mp_node x = mp_input(m, 1, (int64_t[]){mp_dataset_dim(train)}, NULL);
        for (int i = 0; i < a->nhidden; i++) x = mp_dense(m, x, a->hidden[i], a->act, NULL);
        x = mp_dense(m, x, mp_dataset_classes(train), MP_ACT_NONE, NULL);
        /* the final softmax in float32 under every mixed policy (Keras' advice) */
        x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
        if (mp_model_build(m, x, a->batch)) {
            mp_model_free(m);
            return NULL;
        }
    }
    mp_compile_options co = mp_compile_options_default();
    co.optimizer = mp_optimizer_config_default(a->optimizer);
    co.optimizer.learning_rate = a->lr;
    if (a->weight_decay >= 0) co.optimizer.weight_decay = a->weight_decay;
    co.optimizer.seed = a->seed;
    if (a->cosine) { /* from --lr down to 0 over the run's steps, after a warm-up */
        int64_t rows = (int64_t)((double)mp_dataset_count(train) * (1.0 - a->validation_split));
        int64_t per_epoch = a->steps_per_epoch ? a->steps_per_epoch
                                               : (rows + a->batch - 1) / (a->batch ? a->batch : 1);
        int64_t total = a->max_steps ? a->max_steps : per_epoch * a->epochs;
        co.optimizer.schedule.decay = MP_LR_COSINE;
        co.optimizer.schedule.decay_steps = total > 1 ? total : 1;
        co.optimizer.schedule.final_lr = 0.0f;
        co.optimizer.schedule.warmup_steps = a->warmup_steps;
    }
    co.loss_scaling = a->loss_scaling;
    if (a->loss_scaling == MP_LOSS_SCALING_STATIC)
        co.scaler = mp_loss_scaler_config_static(a->static_scale);
    if ((a->init_from && mp_model_load_weights(m, a->init_from)) || mp_model_compile(m, &co)) {
        mp_model_free(m);
        return NULL;
    }
    return m;
}

/* The checkpoint --resume names: a file, or a directory's newest valid one. */
static mp_status resume_path(const char *resume, char *path, size_t len, bool *is_dir)
{
    struct stat st;
    *is_dir = stat(resume, &st) == 0 && S_ISDIR(st.st_mode);
    if (*is_dir) return mp_checkpoint_latest(resume, path, len);
    snprintf(path, len, "%s", resume);
    return MP_OK;
}

/* The batch to train with: --batch-size, checked against --memory-limit, or
 * with auto the largest the limit allows (the model re-sized for it). 0
 * after printing why none fits. */
/* float32 values per parameter the optimizer keeps (for memory plans). */
static int optimizer_slots(const train_args *a)
{
    mp_optimizer_config oc = mp_optimizer_config_default(a->optimizer);
    return a->optimizer == MP_OPTIMIZER_SGD ? (oc.momentum > 0) : 2;
}

static int64_t batch_for_limit(const train_args *a, mp_model *m)
{
    if (!a->memory_limit) return a->batch;
    int slots = optimizer_slots(a);
    int64_t fits = mp_model_batch_for_memory(m, a->memory_limit, slots, 1 << 20);
    mp_memory_plan p;
    mp_model_memory_plan(m, fits ? fits : 1, slots, &p);
    double mib = 1024.0 * 1024.0;
    if (!fits) {
        fprintf(stderr, "mixprec train: --memory-limit %.1f MiB: a batch of 1 plans %.1f MiB\n",
                (double)a->memory_limit / mib, (double)p.total / mib);
        return 0;
    }
    if (!a->batch_auto && a->batch > fits) {
        mp_memory_plan want;
        mp_model_memory_plan(m, a->batch, slots, &want);
        fprintf(stderr,
                "mixprec train: --memory-limit %.1f MiB: batch %lld plans %.1f MiB; the largest "
                "that fits is %lld\n",
                (double)a->memory_limit / mib, (long long)a->batch, (double)want.total / mib,
                (long long)fits);
        return 0;
    }
    if (!a->batch_auto) return a->batch;
    if (mp_model_set_max_batch(m, fits)) {
        fprintf(stderr, "mixprec: %s\n", mp_last_error());
        return 0;
    }
    if (!a->quiet)
        printf("batch size %lld: the largest whose planned memory (%.1f MiB) fits %.1f MiB\n",
               (long long)fits, (double)p.total / mib, (double)a->memory_limit / mib);
    return fits;
}

/* SIGINT/SIGTERM during training: finish the step, checkpoint, stop. A
 * second signal gets the default action (the handler resets itself). */
static volatile sig_atomic_t interrupted;
static void on_signal(int sig) { interrupted = sig; }

static void catch_signals(bool on)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on ? on_signal : SIG_DFL;
    sa.sa_flags = on ? (int)SA_RESETHAND : 0;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int mp_cli_run_training(const train_args *a, const mp_dataset *train, const mp_dataset *test,
                        bool summary, run_result *res)
{
    if (a->threads) mp_set_num_threads(a->threads);
    mp_mem_reset_peaks();
    size_t base = a->model ? a->model_base : mp_cli_model_peak_bytes(),
           step_base = step_peak_bytes();
    mp_fit_options fo = mp_fit_options_default();
    mp_fit_state resume, final_state;
    memset(&resume, 0, sizeof resume);
    memset(&final_state, 0, sizeof final_state);
    mp_model *m = NULL;
    int rc = 1;
    bool printed = false;
    if (a->resume) {
        char path[4096];
        bool is_dir;
        if (resume_path(a->resume, path, sizeof path, &is_dir) ||
            mp_model_from_checkpoint(path, 0, &m, &resume))
            goto out;
        if (!resume.batch_size) {
            fprintf(stderr,
                    "mixprec: '%s' holds no fit state to resume (write one with --checkpoint-dir "
                    "or --save-state)\n",
                    path);
            printed = true;
            goto out;
        }
        if (!a->quiet)
            printf("resuming %s: epoch %d, batch %lld, step %lld\n", path, resume.epoch + 1,
                   (long long)resume.batch, (long long)resume.steps);
        fo.batch_size = resume.batch_size;
        fo.shuffle = resume.shuffle;
        fo.seed = resume.seed;
        fo.validation_split = resume.validation_split;
        fo.steps_per_epoch = resume.steps_per_epoch;
        fo.epochs = a->epochs_given ? a->epochs : resume.epochs;
        fo.resume = &resume;
        fo.checkpoint_dir = a->checkpoint_dir ? a->checkpoint_dir : is_dir ? a->resume : NULL;
    } else {
        if (!(m = build_from_flags(a, train))) goto out;
        if (!(fo.batch_size = batch_for_limit(a, m))) {
            printed = true;
            goto out;
        }
        fo.epochs = a->epochs;
        fo.steps_per_epoch = a->steps_per_epoch;
        fo.validation_split = a->validation_split;
        fo.shuffle = a->shuffle;
        fo.seed = a->seed;
        fo.checkpoint_dir = a->checkpoint_dir;
    }
    if (summary) mp_model_summary(m, fo.batch_size, stdout);
    fo.max_steps = a->max_steps;
    fo.verbose = a->quiet ? 0 : 1;
    fo.log_csv = a->log;
    fo.run_dir = a->run_dir;
    fo.diagnostics_every = a->diagnostics_every;
    fo.patience = a->patience;
    /* a resumed run that writes checkpoints keeps its cadence unless the
     * flags change it */
    bool inherit = a->resume && fo.checkpoint_dir;
    fo.checkpoint_every =
        a->checkpoint_every || !inherit ? a->checkpoint_every : resume.checkpoint_every;
    fo.keep_last = a->keep_last || !inherit ? a->keep_last : resume.keep_last;
    fo.state_out = &final_state;
    fo.interrupt = &interrupted;
    fo.data_parallel = mp_dist_size() > 1; /* under mpirun */
    fo.deterministic = a->deterministic;
    fo.deterministic_slices = a->deterministic_slices;
    fo.reduce = a->reduce;
    fo.bucket_bytes = a->bucket_bytes;
    fo.shard_optimizer = a->shard_optimizer;
    if (a->dist_timeout > 0) mp_dist_set_timeout(a->dist_timeout);
    mp_history h;
    interrupted = 0;
    catch_signals(true);
    mp_status fs = mp_model_fit(m, train, &fo, &h);
    catch_signals(false);
    if (fs) goto out;
    if (interrupted) {
        fprintf(stderr, "\nmixprec: interrupted after step %lld; %s%s\n",
                (long long)final_state.steps,
                fo.checkpoint_dir ? "resume with: mixprec train --resume " : "",
                fo.checkpoint_dir ? fo.checkpoint_dir
                                  : "no --checkpoint-dir, so the run cannot be resumed");
        mp_history_free(&h);
        printed = true;
        rc = 130;
        goto out;
    }
    double ms = 0;
    int64_t steps = 0;
    for (int e = 0; e < h.count; e++) {
        ms += h.epochs[e].ms_per_step * (double)h.epochs[e].steps;
        steps += h.epochs[e].steps;
    }
    res->ms_per_step = steps ? ms / (double)steps : 0;
    res->skipped = mp_model_steps_skipped(m);
    mp_loss_scaler *ls = mp_model_loss_scaler(m);
    res->scaled = ls != NULL;
    res->scale = ls ? mp_loss_scaler_scale(ls) : 1.0f;
    snprintf(res->policy, sizeof res->policy, "%s", mp_model_policy(m).name);
    res->batch_2g = mp_model_batch_for_memory(m, (size_t)2 << 30, optimizer_slots(a), 1 << 20);
    res->val_loss =
        h.count && h.epochs[h.count - 1].has_validation ? h.epochs[h.count - 1].val_loss : NAN;
    mp_history_free(&h);
    res->test_loss = res->test_acc = NAN;
    if (test && mp_model_evaluate(m, test, fo.batch_size, &res->test_loss, &res->test_acc))
        goto out;
    res->peak = mp_cli_model_peak_bytes() - base;
    res->step_peak = step_peak_bytes() - step_base;
    if (a->save && mp_dist_rank() == 0) { /* data parallel: every rank holds the same */
        mp_status s = a->save_state ? mp_model_save_checkpoint(m, a->save, &final_state)
                                    : mp_model_save_weights(m, a->save);
        if (s) goto out;
        if (!a->quiet)
            printf("saved %s to %s\n", a->save_state ? "the training state" : "weights", a->save);
    }
    rc = 0;
out:
    if (rc && !printed) fprintf(stderr, "mixprec: %s\n", mp_last_error());
    mp_fit_state_free(&resume);
    mp_fit_state_free(&final_state);
    mp_model_free(m);
    return rc;
}

/* The sequence length of the model's input (what a text is cut into): from
 * --model, or the checkpoint --resume names; 0 for a model that takes no
 * sequence of ids; -1 after printing an error. */
static int64_t sequence_length(const train_args *a)
{
    mp_model *m = a->model;
    if (!m && a->resume && !strncmp(a->data, "text:", 5)) {
        char path[4096];
        bool is_dir;
        if (resume_path(a->resume, path, sizeof path, &is_dir) ||
            mp_model_from_checkpoint(path, 1, &m, NULL)) {
            fprintf(stderr, "mixprec: %s\n", mp_last_error());
            return -1;
        }
    }
    int64_t shape[MP_MAX_DIMS], len = 0;
    if (m && mp_model_input_dtype(m) == MP_I32 && mp_model_input_shape(m, shape) == 1)
        len = shape[0];
    if (m != a->model) mp_model_free(m);
    return len;
}

int mp_cli_train(int argc, char **argv)
{
    train_args a;
    int rc = mp_cli_parse_train_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    /* --fp8-*, --mx-*: the settings every float8 or MX layer made from here on takes */
    if ((a.fp8_given && mp_set_global_float8_params(&a.fp8)) ||
        (a.mx_given && mp_set_global_mx_params(&a.mx))) {
        fprintf(stderr, "mixprec train: %s\n", mp_last_error());
        return 2;
    }
    if (mp_dist_launched() && !mp_dist_available()) {
        fprintf(stderr, "mixprec train: started by an MPI launcher, but %s\n",
                "this build has no MPI (sh scripts/deps.sh mpi, then make MPI=1)");
        return 2;
    }
    if (a.model_file) { /* a bad file is a usage error, found before the data loads */
        mp_mem_reset_peaks();
        a.model_base = mp_cli_model_peak_bytes();
        if (!(a.model = mp_cli_model_from_file(&a))) return 2;
    }
    if (a.resume) { /* a checkpoint that is not there is found before the data loads */
        char path[4096];
        bool is_dir;
        if (resume_path(a.resume, path, sizeof path, &is_dir)) {
            fprintf(stderr, "mixprec: %s\n", mp_last_error());
            return 1;
        }
        if (access(path, R_OK)) {
            fprintf(stderr, "mixprec: cannot resume from '%s': %s\n", path, strerror(errno));
            return 1;
        }
    }
    mp_dataset *train = NULL, *test = NULL;
    int64_t context = sequence_length(&a);
    rc = context < 0 ? 1 : mp_cli_load_data(&a, true, context, &train);
    if (!rc) rc = mp_cli_load_data(&a, false, context, &test);
    if (rc) {
        mp_dataset_free(train);
        mp_model_free(a.model);
        return rc;
    }
    int64_t text_len;
    if (!a.quiet && mp_dataset_text(train, &text_len))
        printf("data: a text of %lld bytes: %lld windows of %lld tokens\n", (long long)text_len,
               (long long)mp_dataset_count(train), (long long)context);
    else if (!a.quiet)
        printf("data: %lld training samples of %lld features, %d classes%s\n",
               (long long)mp_dataset_count(train), (long long)mp_dataset_dim(train),
               (int)mp_dataset_classes(train), test ? "" : " (no test set)");
    run_result r;
    rc = mp_cli_run_training(&a, train, test, !a.quiet, &r);
    if (!rc) {
        if (test) printf("test: loss %.4f - accuracy %.4f\n", r.test_loss, r.test_acc);
        if (mp_dataset_text(train, NULL) && isfinite(r.val_loss)) /* a language model */
            printf("validation: %.4f nats per byte (%.4f bits), perplexity %.3f\n", r.val_loss,
                   r.val_loss / log(2.0), exp(r.val_loss));
        printf("policy %s: %.1f ms/step, peak memory %.1f MiB, %lld skipped steps, final loss "
               "scale %s",
               r.policy, r.ms_per_step, (double)r.peak / (1 << 20), (long long)r.skipped,
               r.scaled ? "" : "none\n");
        if (r.scaled) printf("%g\n", (double)r.scale);
    }
    mp_dataset_free(train);
    mp_dataset_free(test);
    return rc;
}

/* `mixprec demo`: the seed model on Fashion-MNIST under float32,
 * mixed_bfloat16 and mixed_float16, and one comparison table. */