/* train.h - what `mixprec train` and `mixprec demo` share: the parsed
 * flags, one training run and its figures. */
#ifndef MP_CLI_TRAIN_H
#define MP_CLI_TRAIN_H

#include <stddef.h>

#include "cli/cli.h"

typedef struct {
    const char *data; /* "fashion-mnist", "text:PATH" or a CSV path */
    const char *data_dir;
    const char *test_data; /* CSV for evaluation (fashion-mnist uses its test split) */
    int64_t hidden[16];
    int nhidden;
    mp_activation act;
    const char *policy;
    mp_float8_params fp8; /* --fp8-*: the global float8 settings */
    bool fp8_given;
    mp_mx_params mx; /* --mx-grad: the global MX settings */
    bool mx_given;
    mp_optimizer_kind optimizer;
    float lr;
    float weight_decay; /* --weight-decay; < 0: the optimizer's default */
    int64_t batch;
    bool batch_auto;     /* --batch-size auto: the largest that fits --memory-limit */
    size_t memory_limit; /* --memory-limit: bytes the planned step may take (0: none) */
    int epochs;
    bool cosine;          /* --lr-decay cosine */
    int64_t warmup_steps; /* --warmup-steps */
    double validation_split;
    bool validation_split_given;
    int64_t steps_per_epoch; /* --steps-per-epoch (0: a pass over the data) */
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
    bool deterministic;       /* fixed-order sums in slices (mp_fit_options) */
    int deterministic_slices; /* 0: the default */
    mp_reduce_mode reduce;    /* data parallel: float32 or bfloat16 sums */
    size_t bucket_bytes;      /* 0: the default */
    bool shard_optimizer;     /* ZeRO stage 1 */
    double dist_timeout;      /* 0: the default */
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

/* Parse train's flags into a (defaults first); 0, 1 after --help, or the
 * exit status of a usage error (printed). */
int mp_cli_parse_train_args(int argc, char **argv, train_args *a);

typedef struct {
    char policy[24];
    double test_loss, test_acc, ms_per_step;
    double val_loss; /* the last epoch's (NaN without validation) */
    size_t peak, step_peak;
    int64_t skipped;
    float scale;
    bool scaled;
    int64_t batch_2g; /* the largest batch whose planned memory fits 2 GiB */
} run_result;

/* Library bytes of everything but MP_MEM_OTHER (the dataset), at their peaks. */
size_t mp_cli_model_peak_bytes(void);
/* The training (train) or test (train = false) data the flags name; a text
 * is cut in windows of `context` tokens (the model's input length). */
int mp_cli_load_data(const train_args *a, bool train, int64_t context, mp_dataset **out);
/* The model of --model (a file or a built-in name), or NULL after printing. */
mp_model *mp_cli_model_from_file(const train_args *a);
/* Build (or take a->model), compile, fit, evaluate; fills res. */
int mp_cli_run_training(const train_args *a, const mp_dataset *train, const mp_dataset *test,
                        bool summary, run_result *res);

#endif
