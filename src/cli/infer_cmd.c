/* infer_cmd.c - `mixprec evaluate` and `mixprec predict`: rebuild a saved
 * model from its file alone (mixprec.config), optionally under another
 * policy, and run it over a dataset. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "mixprec.h"

/* Rebuild the model a file describes (its mixprec.config), optionally under
 * another policy, and load its weights: one read of the file. */
static mp_model *model_from_file(const char *path, const char *policy_flag, int64_t batch)
{
    mp_safetensors *f;
    if (mp_safetensors_read(path, &f)) {
        fprintf(stderr, "mixprec: %s\n", mp_last_error());
        return NULL;
    }
    const char *config = mp_safetensors_metadata(f, "mixprec.config");
    mp_model *m = NULL;
    if (!config)
        fprintf(stderr, "mixprec: '%s' has no mixprec.config metadata: not a model mixprec saved\n",
                path);
    else if (mp_model_from_config_ex(config, policy_flag, batch,
                                     (int64_t)mp_safetensors_data_bytes(f), &m) ||
             mp_model_load_weights_from(m, f, path)) {
        fprintf(stderr, "mixprec: '%s': %s\n", path, mp_last_error());
        mp_model_free(m);
        m = NULL;
    }
    mp_safetensors_free(f);
    return m;
}

typedef struct {
    const char *file, *data, *data_dir, *policy, *output;
    int64_t batch;
} infer_args;

static int parse_infer(const char *cmd, int argc, char **argv, infer_args *a)
{
    memset(a, 0, sizeof *a);
    a->data = "fashion-mnist:test";
    a->batch = 256;
    for (int i = 0; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            printf("usage: mixprec %s FILE.safetensors [--data "
                   "fashion-mnist[:train|:test]|PATH.csv] [--data-dir DIR]\n"
                   "       [--batch-size N] [--policy NAME]%s\n",
                   cmd, strcmp(cmd, "predict") ? "" : " [--output FILE.csv]");
            return 1;
        }
        if (f[0] != '-') {
            if (a->file) {
                fprintf(stderr, "mixprec %s: unexpected argument '%s'\n", cmd, f);
                return 2;
            }
            a->file = f;
            continue;
        }
        if (!v) {
            fprintf(stderr, "mixprec %s: %s needs a value\n", cmd, f);
            return 2;
        }
        i++;
        if (!strcmp(f, "--data"))
            a->data = v;
        else if (!strcmp(f, "--data-dir"))
            a->data_dir = v;
        else if (!strcmp(f, "--policy"))
            a->policy = v;
        else if (!strcmp(f, "--output") && !strcmp(cmd, "predict"))
            a->output = v;
        else if (!strcmp(f, "--batch-size")) {
            if (!mp_cli_parse_i64(v, 1, 1 << 20, &a->batch)) {
                fprintf(stderr, "mixprec %s: --batch-size %s: expected a positive integer\n", cmd,
                        v);
                return 2;
            }
        } else {
            fprintf(stderr, "mixprec %s: unknown option '%s'\n", cmd, f);
            return 2;
        }
    }
    if (!a->file) {
        fprintf(stderr, "mixprec %s: which model file? (mixprec %s FILE.safetensors)\n", cmd, cmd);
        return 2;
    }
    mp_policy p;
    if (a->policy && mp_policy_from_name(a->policy, &p)) {
        fprintf(stderr, "mixprec %s: %s\n", cmd, mp_last_error());
        return 2;
    }
    return 0;
}

/* Flags, data and model of evaluate/predict; the exit status on failure. */
static int infer_setup(const char *cmd, int argc, char **argv, infer_args *a, mp_dataset **ds,
                       mp_model **m)
{
    *ds = NULL;
    *m = NULL;
    int rc = parse_infer(cmd, argc, argv, a);
    if (rc) return rc == 1 ? -1 : rc; /* -1: --help was printed */
    if ((rc = mp_cli_load_spec(a->data, a->data_dir, false, ds))) return rc;
    if (!(*m = model_from_file(a->file, a->policy, a->batch))) {
        mp_dataset_free(*ds);
        *ds = NULL;
        return 1;
    }
    return 0;
}

int mp_cli_evaluate(int argc, char **argv)
{
    infer_args a;
    mp_dataset *ds;
    mp_model *m;
    int rc = infer_setup("evaluate", argc, argv, &a, &ds, &m);
    if (rc) return rc < 0 ? 0 : rc;
    /* the loss is all evaluate needs: SGD without momentum keeps no state */
    mp_compile_options co = mp_compile_options_default();
    co.optimizer = mp_optimizer_config_default(MP_OPTIMIZER_SGD);
    double loss, acc;
    rc = mp_model_compile(m, &co) || mp_model_evaluate(m, ds, a.batch, &loss, &acc);
    if (rc)
        fprintf(stderr, "mixprec: %s\n", mp_last_error());
    else
        printf("%lld samples: loss %.8g - accuracy %.4f (policy %s)\n",
               (long long)mp_dataset_count(ds), loss, acc, mp_model_policy(m).name);
    mp_model_free(m);
    mp_dataset_free(ds);
    return rc;
}

int mp_cli_predict(int argc, char **argv)
{
    infer_args a;
    mp_dataset *ds;
    mp_model *m;
    int rc = infer_setup("predict", argc, argv, &a, &ds, &m);
    if (rc) return rc < 0 ? 0 : rc;
    int64_t n = mp_dataset_count(ds), shape[MP_MAX_DIMS];
    mp_model_output_shape(m, shape);
    int64_t classes = shape[0];
    float *out = malloc((size_t)(n * classes) * sizeof *out);
    FILE *o = NULL;
    if (!out || mp_model_predict(m, mp_dataset_features(ds), n, a.batch, out))
        fprintf(stderr, "mixprec: %s\n", out ? mp_last_error() : "out of memory");
    else if (!(o = a.output ? fopen(a.output, "w") : stdout))      /* only now: a failure above */
        fprintf(stderr, "mixprec: cannot write '%s'\n", a.output); /* keeps an old file */
    else {
        fprintf(o, "index,predicted,probability,label\n");
        for (int64_t i = 0; i < n; i++) {
            int64_t best = 0;
            for (int64_t c = 1; c < classes; c++)
                if (out[i * classes + c] > out[i * classes + best]) best = c;
            fprintf(o, "%lld,%lld,%.6f,%d\n", (long long)i, (long long)best,
                    (double)out[i * classes + best], (int)mp_dataset_labels(ds)[i]);
        }
        rc = o != stdout && fclose(o) != 0;
        if (rc) fprintf(stderr, "mixprec: cannot write '%s'\n", a.output);
    }
    if (!o) rc = 1;
    free(out);
    mp_model_free(m);
    mp_dataset_free(ds);
    return rc;
}
