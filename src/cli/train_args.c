/* train_args.c - the flags of `mixprec train` (and the demo's, which are a
 * subset): parsing with one clear line for every bad value, and --help. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/train.h"

static void train_usage(FILE *f)
{
    fprintf(
        f,
        "usage: mixprec train [options]\n"
        "  --data fashion-mnist|PATH.csv   training data (default fashion-mnist)\n"
        "  --data text:FILE|DIR|fortunes   a text as bytes for a language model (--model with an\n"
        "                                  int32 sequence input): random windows as long as the\n"
        "                                  model's input; fortunes = " MP_FORTUNES_DIR "\n"
        "  --data-dir DIR                  Fashion-MNIST files (default $" MP_FASHION_MNIST_ENV
        " or /usr/share/datasets/fashion-mnist)\n"
        "  --test-data PATH.csv            evaluate on this CSV after training\n"
        "  --model FILE.json|resnet20      build the model from a JSON configuration (the schema\n"
        "                                  of the README's \"Model files\"; --policy, if given,\n"
        "                                  replaces the file's policy), or the built-in ResNet-20\n"
        "  --hidden N,N,...                hidden layer sizes of the MLP (default 4096,4096)\n"
        "  --activation NAME               relu, gelu, gelu_tanh, sigmoid, tanh (default relu)\n"
        "  --policy NAME                   float32, mixed_float16, mixed_bfloat16, float16, "
        "bfloat16,\n"
        "                                  mixed_float8 (bfloat16 with Dense GEMM inputs in fp8),\n"
        "                                  mixed_mxfp8, mixed_mxfp6, mixed_mxfp4 (bfloat16 with\n"
        "                                  Dense GEMM inputs in MX blocks: E4M3, E2M3, E2M1)\n"
        "  --optimizer sgd|adam|adamw      (default adam)\n"
        "  --lr X                          learning rate (default 1e-3, sgd 1e-2)\n"
        "  --weight-decay X                sgd, adam: L2 added to the gradient (default 0);\n"
        "                                  adamw: decoupled, kernels only (default 0.01)\n"
        "  --lr-decay constant|cosine      cosine: from --lr down to 0 over the run's steps\n"
        "  --warmup-steps N                rise linearly to --lr over the first N steps\n"
        "  --batch-size N|auto             (default 256; auto: the largest batch whose planned\n"
        "                                  memory fits --memory-limit)\n"
        "  --memory-limit SIZE             refuse a batch whose planned memory (the summary's\n"
        "                                  categories, optimizer state included) exceeds SIZE\n"
        "                                  bytes (suffixes K, M, G: powers of 1024)\n"
        "  --epochs N                      (default 5)\n");
    fprintf(
        f,
        "  --validation-split X            last fraction held out for validation (default 0;\n"
        "                                  0.1 for text)\n"
        "  --steps-per-epoch N             an epoch is N batches (default: a pass over the data;\n"
        "                                  200 for text): validation and the log run per epoch\n"
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
        "  --deterministic[=S]             fixed-order sums: each batch in S slices (default 4,\n"
        "                                  a power of two), their gradients summed pairwise in\n"
        "                                  order: the same weights on 1, 2, 4.. ranks up to S\n"
        "Under mpirun -np N (a build with MPI) the ranks train data parallel: each takes 1/N of\n"
        "every batch (--batch-size is the global batch and must divide by N); rank 0 prints and\n"
        "writes --log, --save and checkpoints. Gradients travel in buckets while backward runs:\n"
        "  --allreduce float32|bfloat16    sum them in float32 (default), or send bfloat16 and\n"
        "                                  add in float32 (half the bytes, a bfloat16 rounding)\n"
        "  --bucket-mb M                   bucket size in MiB (default 4)\n"
        "  --shard-optimizer               each rank keeps and updates 1/N of the optimizer\n"
        "                                  state (ZeRO stage 1); the same weights\n"
        "  --dist-timeout S                stop the job when the other ranks are silent for S\n"
        "                                  seconds (default 300)\n"
        "Ctrl-C (SIGINT) or SIGTERM while training: the step in progress finishes, a checkpoint\n"
        "goes to --checkpoint-dir, and mixprec exits with status 130 (a second signal kills).\n");
    fputs(
        "float8 (--policy mixed_float8, or a layer's \"float8\": true in --model):\n"
        "  --fp8-format hybrid|e4m3        mixed_float8: E4M3 forward and E5M2 gradients, or E4M3\n"
        "                                  everywhere (default hybrid)\n"
        "  --fp8-scaling delayed|current   scale from the amax history or this tensor's amax\n"
        "                                  (default delayed)\n"
        "  --fp8-history N                 amax history length (default 1024)\n"
        "  --fp8-algorithm max|most_recent amax of the history used (default max)\n"
        "  --fp8-margin M                  scale = fp8_max / amax / 2^M (default 0)\n"
        "  --fp8-all-layers                quantize the first and last layers too\n"
        "MX (--policy mixed_mxfp8|mixed_mxfp6|mixed_mxfp4, or \"mx\": \"FORMAT\" on a layer):\n"
        "  --mx-grad FORMAT                the gradients' MX format (default mxfp8_e5m2; any of\n"
        "                                  mxfp8_e4m3, mxfp8_e5m2, mxfp6_e2m3, mxfp6_e3m2,\n"
        "                                  mxfp4_e2m1, mxint8)\n",
        f);
}

static int bad(const char *flag, const char *value, const char *why)
{
    fprintf(stderr, "mixprec train: %s %s: %s\n", flag, value ? value : "", why);
    return 2;
}

int mp_cli_bad_option(const char *cmd, const char *flag, const char *v, const char *why)
{
    fprintf(stderr, "mixprec %s: %s %s: %s\n", cmd, flag, v ? v : "", why);
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

int mp_cli_parse_train_args(int argc, char **argv, train_args *a)
{
    memset(a, 0, sizeof *a);
    a->data = "fashion-mnist";
    a->hidden[0] = a->hidden[1] = 4096;
    a->nhidden = 2;
    a->act = MP_ACT_RELU;
    a->policy = "float32";
    a->optimizer = MP_OPTIMIZER_ADAM;
    a->lr = -1;
    a->weight_decay = -1;
    a->batch = 256;
    a->epochs = 5;
    a->seed = 1;
    a->shuffle = true;
    a->loss_scaling = MP_LOSS_SCALING_AUTO;
    a->fp8 = mp_float8_params_default();
    a->mx = mp_mx_params_default();
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
                           "expected float32, mixed_float16, mixed_bfloat16, float16, bfloat16, "
                           "mixed_float8, mixed_mxfp8, mixed_mxfp6 or mixed_mxfp4");
            a->policy = v;
            a->policy_given = true;
        } else if (!strncmp(f, "--fp8-", 6)) {
            static const char *const keys[][2] = {{"--fp8-format", "format"},
                                                  {"--fp8-scaling", "scaling"},
                                                  {"--fp8-history", "amax_history_len"},
                                                  {"--fp8-algorithm", "algorithm"},
                                                  {"--fp8-margin", "margin"},
                                                  {"--fp8-all-layers", "keep_first_last"}};
            const char *key = NULL;
            for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
                if (!strcmp(f, keys[k][0])) key = keys[k][1];
            if (!key) {
                fprintf(stderr, "mixprec train: unknown option '%s' (see mixprec train --help)\n",
                        f);
                return 2;
            }
            if (!strcmp(key, "keep_first_last")) {
                a->fp8.keep_first_last = false;
            } else {
                NEED_VALUE;
                if (mp_float8_params_set(&a->fp8, key, v)) return bad(f, v, mp_last_error());
            }
            a->fp8_given = true;
        } else if (!strcmp(f, "--mx-grad")) {
            NEED_VALUE;
            if (mp_mx_format_from_name(v, &a->mx.grad_format)) return bad(f, v, mp_last_error());
            a->mx_given = true;
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
        } else if (!strcmp(f, "--weight-decay")) {
            NEED_VALUE;
            if (!parse_f(v, 0, 1e3, &dv)) return bad(f, v, "expected a number >= 0");
            a->weight_decay = (float)dv;
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
            a->validation_split_given = true;
        } else if (!strcmp(f, "--steps-per-epoch")) {
            NEED_VALUE;
            if (!mp_cli_parse_i64(v, 1, INT64_MAX, &a->steps_per_epoch))
                return bad(f, v, "expected a positive integer");
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
        } else if (!strncmp(f, "--deterministic=", 16)) {
            a->deterministic = true;
            if (!mp_cli_parse_i64(f + 16, 2, 1 << 20, &iv) || (iv & (iv - 1)))
                return bad("--deterministic", f + 16, "expected a power of two >= 2");
            a->deterministic_slices = (int)iv;
        } else if (!strcmp(f, "--allreduce")) {
            NEED_VALUE;
            if (!strcmp(v, "float32"))
                a->reduce = MP_REDUCE_FLOAT32;
            else if (!strcmp(v, "bfloat16"))
                a->reduce = MP_REDUCE_BFLOAT16;
            else
                return bad(f, v, "expected float32 or bfloat16");
        } else if (!strcmp(f, "--lr-decay")) {
            NEED_VALUE;
            if (strcmp(v, "constant") && strcmp(v, "cosine"))
                return bad(f, v, "expected constant or cosine");
            a->cosine = !strcmp(v, "cosine");
        } else if (!strcmp(f, "--warmup-steps")) {
            NEED_VALUE;
            if (!mp_cli_parse_i64(v, 0, INT64_MAX, &a->warmup_steps))
                return bad(f, v, "expected a count of steps");
        } else if (!strcmp(f, "--shard-optimizer")) {
            a->shard_optimizer = true;
        } else if (!strcmp(f, "--bucket-mb")) {
            NEED_VALUE;
            if (!mp_cli_parse_i64(v, 1, 1024, &iv)) return bad(f, v, "expected 1..1024");
            a->bucket_bytes = (size_t)iv << 20;
        } else if (!strcmp(f, "--dist-timeout")) {
            NEED_VALUE;
            if (!mp_cli_parse_i64(v, 1, 86400, &iv)) return bad(f, v, "expected 1..86400 seconds");
            a->dist_timeout = (double)iv;
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
            "--hidden",       "--activation", "--policy",     "--optimizer",        "--lr",
            "--weight-decay", "--seed",       "--batch-size", "--validation-split", "--no-shuffle",
            "--loss-scale",   "--init-from",  "--model",      "--steps-per-epoch"};
        for (size_t k = 0; k < sizeof from_checkpoint / sizeof *from_checkpoint; k++)
            if (!strcmp(f, from_checkpoint[k]) && !a->model_flag) a->model_flag = f;
        if ((!strncmp(f, "--fp8-", 6) || !strncmp(f, "--mx-", 5)) && !a->model_flag)
            a->model_flag = f;
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
    if (!strncmp(a->data, "text:", 5)) { /* a language model's defaults */
        if (!a->validation_split_given) a->validation_split = 0.1;
        if (!a->steps_per_epoch) a->steps_per_epoch = 200;
        if (!a->model_file && !a->resume)
            return bad("--data", a->data,
                       "text needs --model (a sequence model such as examples/gpt_mini.json)");
    }
    return 0;
}
