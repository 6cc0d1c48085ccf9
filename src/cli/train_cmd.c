/* train_cmd.c - `mixprec train` and `mixprec demo`: build an MLP from flags
 * (or any model from a JSON file), load data, compile, fit, evaluate on the
 * test set, report time and memory.
 * All the work is library calls; this file parses flags and prints. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/cli.h"
#include "mixprec.h"

typedef struct {
    const char *data; /* "fashion-mnist" or a CSV path */
    const char *data_dir;
    const char *test_data; /* CSV for evaluation (fashion-mnist uses its test split) */
    int64_t hidden[16];
    int nhidden;
    mp_activation act;
    const char *policy;
    mp_optimizer_kind optimizer;
    float lr;
    int64_t batch;
    bool batch_auto;     /* --batch-size auto: the largest that fits --memory-limit */
    size_t memory_limit; /* --memory-limit: bytes the planned step may take (0: none) */
    int epochs;
    double validation_split;
    uint64_t seed;
    int threads;
    int64_t max_steps;
    bool shuffle, quiet;
    mp_loss_scaling loss_scaling;
    float static_scale;
    const char *log;
    const char *run_dir;       /* --run-dir: config, plan, history, diagnostics */
    int64_t diagnostics_every; /* --diagnostics N */
    int patience;
    const char *save, *init_from;
    bool deterministic; /* data parallel: gradients summed in rank order */
    bool save_state;
    int64_t checkpoint_every;
    const char *checkpoint_dir, *resume;
    int keep_last;
    const char *model_flag; /* the first flag that --resume takes from the checkpoint */
    const char *mlp_flag;   /* the first flag that only the --hidden MLP takes */
    bool epochs_given, policy_given;
    const char *model_file; /* --model */
    mp_model *model;        /* built from model_file before the data is read */
    size_t model_base;      /* library bytes before it was built */
} train_args;

static void train_usage(FILE *f)
{
    fprintf(
        f,
        "usage: mixprec train [options]\n"
        "  --data fashion-mnist|PATH.csv   training data (default fashion-mnist)\n"
        "  --data-dir DIR                  Fashion-MNIST files (default $" MP_FASHION_MNIST_ENV
        " or /usr/share/datasets/fashion-mnist)\n"
        "  --test-data PATH.csv            evaluate on this CSV after training\n"
        "  --model FILE.json|resnet20      build the model from a JSON configuration (the schema\n"
        "                                  of the README's \"Model files\"; --policy, if given,\n"
        "                                  replaces the file's policy), or the built-in ResNet-20\n"
        "  --hidden N,N,...                hidden layer sizes of the MLP (default 4096,4096)\n"
        "  --activation NAME               relu, gelu, gelu_tanh, sigmoid, tanh (default relu)\n"
        "  --policy NAME                   float32, mixed_float16, mixed_bfloat16, float16, "
        "bfloat16\n"
        "  --optimizer sgd|adam|adamw      (default adam)\n"
        "  --lr X                          learning rate (default 1e-3, sgd 1e-2)\n"
        "  --batch-size N|auto             (default 256; auto: the largest batch whose planned\n"
        "                                  memory fits --memory-limit)\n"
        "  --memory-limit SIZE             refuse a batch whose planned memory (the summary's\n"
        "                                  categories, optimizer state included) exceeds SIZE\n"
        "                                  bytes (suffixes K, M, G: powers of 1024)\n"
        "  --epochs N                      (default 5)\n"
        "  --validation-split X            last fraction held out for validation (default 0)\n"
        "  --seed N                        initialisation, shuffling, dropout (default 1)\n"
        "  --threads N                     kernel threads (default: all cores)\n"
        "  --max-steps N                   stop after N training steps\n"
        "  --no-shuffle                    keep the data order\n"
        "  --loss-scale dynamic|static:X|none   (default: dynamic for float16 compute)\n"
        "  --patience N                    early stopping on val_loss (or loss)\n"
        "  --log FILE                      write the history as CSV\n"
        "  --run-dir DIR                   collect the run in DIR: config.json, plan.json,\n"
        "                                  history.csv, diagnostics.jsonl (mixprec report DIR)\n"
        "  --diagnostics N                 with --run-dir: per-layer numerics (amax, underflow,\n"
        "                                  overflow, copy error, update ratio) every N steps\n"
        "  --init-from FILE.safetensors    start from these weights (<layer>.kernel / .bias)\n"
        "  --save FILE.safetensors         save the trained weights and the model's configuration\n"
        "  --save-state                    with --save: the full training state too (resumable)\n"
        "  --checkpoint-dir DIR            write checkpoints DIR/ckpt-<step>.safetensors (and one\n"
        "                                  at the end)\n"
        "  --checkpoint-every N            a checkpoint every N steps\n"
        "  --keep-last K                   keep only the newest K checkpoints\n"
        "  --resume FILE|DIR               continue the run a checkpoint (or DIR's newest valid\n"
        "                                  one) describes: model, optimizer, loss scaler, data\n"
        "                                  order, history and checkpoint cadence come from it;\n"
        "                                  give the same --data\n"
        "  --quiet                         no progress output\n"
        "  --deterministic                 under mpirun: sum gradients in rank order (the same\n"
        "                                  bits on every run with the same number of ranks)\n"
        "Under mpirun -np N (a build with MPI) the ranks train data parallel: each takes 1/N of\n"
        "every batch (--batch-size is the global batch and must divide by N); rank 0 prints and\n"
        "writes --log, --save and checkpoints.\n"
        "Ctrl-C (SIGINT) or SIGTERM while training: the step in progress finishes, a checkpoint\n"
        "goes to --checkpoint-dir, and mixprec exits with status 130 (a second signal kills).\n");
}

static int bad(const char *flag, const char *value, const char *why)
{
    fprintf(stderr, "mixprec train: %s %s: %s\n", flag, value ? value : "", why);
    return 2;
}

bool mp_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || errno || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool parse_f(const char *s, double lo, double hi, double *out)
{
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

/* "2G", "512M", "64K", "1000000": bytes (powers of 1024). */
static bool parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = s && *s ? strtod(s, &end) : -1;
    if (errno || !(v > 0) || (s && end == s)) return false;
    double unit = 1;
    if (*end == 'K' || *end == 'k')
        unit = 1024.0, end++;
    else if (*end == 'M' || *end == 'm')
        unit = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        unit = 1024.0 * 1024 * 1024, end++;
    else if (*end == 'T' || *end == 't')
        unit = 1024.0 * 1024 * 1024 * 1024, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || v * unit > 1e18) return false;
    *out = (size_t)(v * unit);
    return true;
}

static int parse_train_args(int argc, char **argv, train_args *a)
{
    memset(a, 0, sizeof *a);
    a->data = "fashion-mnist";
    a->hidden[0] = a->hidden[1] = 4096;
    a->nhidden = 2;
    a->act = MP_ACT_RELU;
    a->policy = "float32";
    a->optimizer = MP_OPTIMIZER_ADAM;
    a->lr = -1;
    a->batch = 256;
    a->epochs = 5;
    a->seed = 1;
    a->shuffle = true;
    a->loss_scaling = MP_LOSS_SCALING_AUTO;
    for (int i = 0; i < argc; i++) {
        const char *f = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t iv;
        double dv;
#define NEED_VALUE                                                                                 \
    do {                                                                                           \
        if (!v) return bad(f, NULL, "needs a value");                                              \
        i++;                                                                                       \
    } while (0)
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            train_usage(stdout);
            return 1;
        } else if (!strcmp(f, "--data")) {
            NEED_VALUE;
            a->data = v;
        } else if (!strcmp(f, "--model")) {
            NEED_VALUE;
            a->model_file = v;
        } else if (!strcmp(f, "--data-dir")) {
            NEED_VALUE;
            a->data_dir = v;
        } else if (!strcmp(f, "--test-data")) {
            NEED_VALUE;
            a->test_data = v;
        } else if (!strcmp(f, "--hidden")) {
            NEED_VALUE;
            a->nhidden = 0;
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                if (a->nhidden == 16) return bad(f, v, "at most 16 hidden layers");
                if (!mp_cli_parse_i64(tok, 1, 1 << 20, &iv))
                    return bad(f, v, "expected sizes like 4096,4096");
                a->hidden[a->nhidden++] = iv;
            }
        } else if (!strcmp(f, "--activation")) {
            NEED_VALUE;
            if (mp_activation_from_name(v, &a->act) || a->act == MP_ACT_SOFTMAX)
                return bad(f, v, "expected relu, gelu, gelu_tanh, sigmoid, tanh or linear");
        } else if (!strcmp(f, "--policy")) {
            NEED_VALUE;
            mp_policy p;
            if (mp_policy_from_name(v, &p))
                return bad(f, v,
                           "expected float32, mixed_float16, mixed_bfloat16, float16 or bfloat16");
            a->policy = v;
            a->policy_given = true;
        } else if (!strcmp(f, "--optimizer")) {
            NEED_VALUE;
            if (!strcmp(v, "sgd"))
                a->optimizer = MP_OPTIMIZER_SGD;
            else if (!strcmp(v, "adam"))
                a->optimizer = MP_OPTIMIZER_ADAM;
            else if (!strcmp(v, "adamw"))
                a->optimizer = MP_OPTIMIZER_ADAMW;
            else
                return bad(f, v, "expected sgd, adam or adamw");
        } else if (!strcmp(f, "--lr")) {
            NEED_VALUE;
            if (!parse_f(v, 1e-12, 1e3, &dv)) return bad(f, v, "expected a positive number");
            a->lr = (float)dv;
        } else if (!strcmp(f, "--batch-size")) {
            NEED_VALUE;
            if (!strcmp(v, "auto")) {
                a->batch_auto = true;
                a->batch = 1; /* built for 1, then re-sized to what fits */
            } else if (!mp_cli_parse_i64(v, 1, 1 << 20, &a->batch)) {
                return bad(f, v, "expected a positive integer or auto");
            } else {
                a->batch_auto = false;
            }
        } else if (!strcmp(f, "--memory-limit")) {
            NEED_VALUE;
            if (!parse_size(v, &a->memory_limit))
                return bad(f, v, "expected a size in bytes such as 2G, 512M or 1000000");
        } else if (!strcmp(f, "--epochs")) {
            NEED_VALUE;
            if (!mp_cli_parse_i64(v, 1, 1000000, &iv))
                return bad(f, v, "expected a positive integer");
            a->epochs = (int)iv;
        } else if (!strcmp(f, "--validation-split")) {
            NEED_VALUE;
            if (!parse_f(v, 0, 0.999, &a->validation_split))
                return bad(f, v, "expected a fraction in [0, 1)");
        } else if (!strcmp(f, "--seed")) {
            NEED_VALUE;
            if (!mp_cli_parse_i64(v, 0, INT64_MAX, &iv))
                return bad(f, v, "expected a non-negative integer");
            a->seed = (uint64_t)iv;
        } else if (!strcmp(f, "--threads")) {
            NEED_VALUE;
            if (!mp_cli_parse_i64(v, 1, 4096, &iv)) return bad(f, v, "expected a positive integer");
            a->threads = (int)iv;
        } else if (!strcmp(f, "--max-steps")) {
            NEED_VALUE;
            if (!mp_cli_parse_i64(v, 1, INT64_MAX, &a->max_steps))
                return bad(f, v, "expected a positive integer");
        } else if (!strcmp(f, "--patience")) {
            NEED_VALUE;
            if (!mp_cli_parse_i64(v, 1, 1000000, &iv))
                return bad(f, v, "expected a positive integer");
            a->patience = (int)iv;
        } else if (!strcmp(f, "--no-shuffle")) {
            a->shuffle = false;
        } else if (!strcmp(f, "--quiet")) {
            a->quiet = true;
        } else if (!strcmp(f, "--log")) {
            NEED_VALUE;
            a->log = v;
        } else if (!strcmp(f, "--run-dir")) {
            NEED_VALUE;
            a->run_dir = v;
        } else if (!strcmp(f, "--diagnostics")) {
            NEED_VALUE;
            if (!mp_cli_parse_i64(v, 1, INT64_MAX, &a->diagnostics_every))
                return bad(f, v, "expected a positive integer");
        } else if (!strcmp(f, "--save")) {
            NEED_VALUE;
            a->save = v;
        } else if (!strcmp(f, "--init-from")) {
            NEED_VALUE;
            a->init_from = v;
        } else if (!strcmp(f, "--save-state")) {
            a->save_state = true;
        } else if (!strcmp(f, "--deterministic")) {
            a->deterministic = true;
        } else if (!strcmp(f, "--checkpoint-dir")) {
            NEED_VALUE;
            a->checkpoint_dir = v;
        } else if (!strcmp(f, "--checkpoint-every")) {
            NEED_VALUE;
            if (!mp_cli_parse_i64(v, 1, INT64_MAX, &a->checkpoint_every))
                return bad(f, v, "expected a positive integer");
        } else if (!strcmp(f, "--keep-last")) {
            NEED_VALUE;
            if (!mp_cli_parse_i64(v, 1, 1000000, &iv))
                return bad(f, v, "expected a positive integer");
            a->keep_last = (int)iv;
        } else if (!strcmp(f, "--resume")) {
            NEED_VALUE;
            a->resume = v;
        } else if (!strcmp(f, "--loss-scale")) {
            NEED_VALUE;
            if (!strcmp(v, "dynamic"))
                a->loss_scaling = MP_LOSS_SCALING_DYNAMIC;
            else if (!strcmp(v, "none"))
                a->loss_scaling = MP_LOSS_SCALING_NONE;
            else if (!strncmp(v, "static:", 7) && parse_f(v + 7, 1e-30, 1e30, &dv)) {
                a->loss_scaling = MP_LOSS_SCALING_STATIC;
                a->static_scale = (float)dv;
            } else
                return bad(f, v, "expected dynamic, none or static:VALUE");
        } else {
            fprintf(stderr, "mixprec train: unknown option '%s' (see mixprec train --help)\n", f);
            return 2;
        }
#undef NEED_VALUE
        static const char *const from_checkpoint[] = {
            "--hidden",     "--activation", "--policy",     "--optimizer",
            "--lr",         "--seed",       "--batch-size", "--validation-split",
            "--no-shuffle", "--loss-scale", "--init-from",  "--model"};
        for (size_t k = 0; k < sizeof from_checkpoint / sizeof *from_checkpoint; k++)
            if (!strcmp(f, from_checkpoint[k]) && !a->model_flag) a->model_flag = f;
        if (!strcmp(f, "--epochs")) a->epochs_given = true;
        if ((!strcmp(f, "--hidden") || !strcmp(f, "--activation")) && !a->mlp_flag) a->mlp_flag = f;
    }
    if (a->resume && a->model_flag) {
        fprintf(stderr,
                "mixprec train: --resume takes %s from the checkpoint; leave it out (it must not "
                "change mid-run)\n",
                a->model_flag + 2);
        return 2;
    }
    if (a->batch_auto && !a->memory_limit)
        return bad("--batch-size", "auto", "needs --memory-limit SIZE");
    if (a->model_file && a->mlp_flag) {
        fprintf(stderr, "mixprec train: %s shapes the built-in MLP; --model FILE gives the model\n",
                a->mlp_flag);
        return 2;
    }
    if ((a->checkpoint_every || a->keep_last) && !a->checkpoint_dir && !a->resume)
        return bad("--checkpoint-every/--keep-last", "", "needs --checkpoint-dir DIR");
    if (a->save_state && !a->save) return bad("--save-state", "", "needs --save FILE");
    if (a->diagnostics_every && !a->run_dir) return bad("--diagnostics", "", "needs --run-dir DIR");
    if (a->lr < 0) a->lr = a->optimizer == MP_OPTIMIZER_SGD ? 1e-2f : 1e-3f;
    return 0;
}

/* Library bytes of everything but MP_MEM_OTHER (the dataset), at their peaks. */
static size_t model_peak_bytes(void)
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

typedef struct {
    char policy[24];
    double test_loss, test_acc, ms_per_step;
    size_t peak, step_peak;
    int64_t skipped;
    float scale;
    bool scaled;
    int64_t batch_2g; /* the largest batch whose planned memory fits 2 GiB */
} run_result;

int mp_cli_load_spec(const char *spec, const char *dir, bool default_train, mp_dataset **out)
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

static int load_data(const train_args *a, bool train, mp_dataset **out)
{
    *out = NULL;
    if (train) return mp_cli_load_spec(a->data, a->data_dir, true, out);
    if (!strcmp(a->data, "fashion-mnist"))
        return mp_cli_load_spec("fashion-mnist:test", a->data_dir, false, out);
    return a->test_data ? mp_cli_load_spec(a->test_data, a->data_dir, false, out) : 0;
}

/* The model of --model FILE (its batch bound from --batch-size), or NULL
 * after printing the file's problem. */
static mp_model *model_from_file(const train_args *a)
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
    co.optimizer.seed = a->seed;
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

static int run_training(const train_args *a, const mp_dataset *train, const mp_dataset *test,
                        bool summary, run_result *res)
{
    if (a->threads) mp_set_num_threads(a->threads);
    mp_mem_reset_peaks();
    size_t base = a->model ? a->model_base : model_peak_bytes(), step_base = step_peak_bytes();
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
    mp_history_free(&h);
    res->test_loss = res->test_acc = NAN;
    if (test && mp_model_evaluate(m, test, fo.batch_size, &res->test_loss, &res->test_acc))
        goto out;
    res->peak = model_peak_bytes() - base;
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

int mp_cli_train(int argc, char **argv)
{
    train_args a;
    int rc = parse_train_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    if (mp_dist_launched() && !mp_dist_available()) {
        fprintf(stderr, "mixprec train: started by an MPI launcher, but %s\n",
                "this build has no MPI (sh scripts/deps.sh mpi, then make MPI=1)");
        return 2;
    }
    if (a.model_file) { /* a bad file is a usage error, found before the data loads */
        mp_mem_reset_peaks();
        a.model_base = model_peak_bytes();
        if (!(a.model = model_from_file(&a))) return 2;
    }
    mp_dataset *train = NULL, *test = NULL;
    if (load_data(&a, true, &train) || load_data(&a, false, &test)) {
        mp_dataset_free(train);
        mp_model_free(a.model);
        return 1;
    }
    if (!a.quiet)
        printf("data: %lld training samples of %lld features, %d classes%s\n",
               (long long)mp_dataset_count(train), (long long)mp_dataset_dim(train),
               (int)mp_dataset_classes(train), test ? "" : " (no test set)");
    run_result r;
    rc = run_training(&a, train, test, !a.quiet, &r);
    if (!rc) {
        if (test) printf("test: loss %.4f - accuracy %.4f\n", r.test_loss, r.test_acc);
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
int mp_cli_demo(int argc, char **argv)
{
    train_args a;
    /* defaults sized to finish in a few minutes on two cores */
    char *defaults[] = {"--epochs", "2", "--batch-size", "256", "--quiet"};
    int rc = parse_train_args(5, defaults, &a);
    train_args user;
    if ((rc = parse_train_args(argc, argv, &user))) return rc == 1 ? 0 : rc;
    for (int i = 0; i < argc; i++) /* user flags override the demo's defaults */
        if (!strcmp(argv[i], "--epochs"))
            a.epochs = user.epochs;
        else if (!strcmp(argv[i], "--batch-size"))
            a.batch = user.batch;
        else if (!strcmp(argv[i], "--data-dir"))
            a.data_dir = user.data_dir;
        else if (!strcmp(argv[i], "--max-steps"))
            a.max_steps = user.max_steps;
        else if (!strcmp(argv[i], "--threads"))
            a.threads = user.threads;
        else if (!strcmp(argv[i], "--model"))
            a.model_file = user.model_file;
        else if (!strcmp(argv[i], "--hidden")) {
            a.nhidden = user.nhidden;
            memcpy(a.hidden, user.hidden, sizeof a.hidden);
        }
    mp_dataset *train = NULL, *test = NULL;
    if (load_data(&a, true, &train) || load_data(&a, false, &test)) {
        mp_dataset_free(train);
        return 1;
    }
    const char *policies[3] = {"float32", "mixed_bfloat16", "mixed_float16"};
    run_result r[3];
    if (a.model_file) {
        printf("mixprec demo: %s", a.model_file);
    } else {
        printf("mixprec demo: MLP 784 -> ");
        for (int i = 0; i < a.nhidden; i++) printf("%lld -> ", (long long)a.hidden[i]);
        printf("10 (relu, float32 softmax)");
    }
    printf(", Adam lr %g, batch %lld, %d epoch%s%s on Fashion-MNIST (%lld train / %lld test)\n",
           (double)a.lr, (long long)a.batch, a.epochs, a.epochs > 1 ? "s" : "",
           a.max_steps ? " (capped by --max-steps)" : "", (long long)mp_dataset_count(train),
           (long long)mp_dataset_count(test));
    printf("kernel path %s, %d threads\n\n", mp_isa_name(mp_isa_active()), mp_num_threads());
    for (int p = 0; p < 3; p++) {
        a.policy = policies[p];
        a.policy_given = true;
        printf("training under %-15s ...", policies[p]);
        fflush(stdout);
        if (a.model_file) { /* a fresh model in this policy */
            mp_mem_reset_peaks();
            a.model_base = model_peak_bytes();
            if (!(a.model = model_from_file(&a))) {
                rc = 2;
                break;
            }
        }
        if ((rc = run_training(&a, train, test, false, &r[p]))) break;
        printf(" test accuracy %.4f, %.1f ms/step\n", r[p].test_acc, r[p].ms_per_step);
    }
    if (!rc) {
        printf("\n%-16s %9s %10s %9s %12s %8s %13s %8s %8s %11s %10s\n", "policy", "test acc",
               "ms/step", "speed-up", "peak memory", "saving", "act+workspace", "saving", "skipped",
               "loss scale", "batch@2GiB");
        for (int p = 0; p < 3; p++) {
            char scale[32];
            if (r[p].scaled)
                snprintf(scale, sizeof scale, "%g", (double)r[p].scale);
            else
                snprintf(scale, sizeof scale, "none");
            printf(
                "%-16s %9.4f %10.1f %8.2fx %8.1f MiB %7.1f%% %9.1f MiB %7.1f%% %8lld %11s %10lld\n",
                policies[p], r[p].test_acc, r[p].ms_per_step, r[0].ms_per_step / r[p].ms_per_step,
                (double)r[p].peak / (1 << 20),
                100.0 * (1.0 - (double)r[p].peak / (double)r[0].peak),
                (double)r[p].step_peak / (1 << 20),
                100.0 * (1.0 - (double)r[p].step_peak / (double)r[0].step_peak),
                (long long)r[p].skipped, scale, (long long)r[p].batch_2g);
        }
        printf(
            "\npeak memory: the library's own bytes (weights, masters, gradients, optimizer "
            "state,\n"
            "activations, workspace) at batch %lld; the dataset is not counted. Mixed policies add "
            "a\n"
            "low-precision copy of the weights and halve the per-step memory (act+workspace), so\n"
            "they save overall once batches are large (see make bench-step, batch 8192).\n"
            "batch@2GiB: the largest batch whose planned training memory (the summary's plan,\n"
            "Adam state included) fits 2 GiB.\n",
            (long long)a.batch);
    }
    mp_dataset_free(train);
    mp_dataset_free(test);
    return rc;
}
