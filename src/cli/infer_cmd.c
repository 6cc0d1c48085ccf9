/* infer_cmd.c - `mixprec evaluate` and `mixprec predict`: rebuild a saved
 * model from its file alone (mixprec.config), optionally under another
 * policy, and run it over a dataset. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "mixprec.h"

/* Rebuild the model a file describes (its mixprec.config), optionally under
 * another policy, and load its weights. */
static mp_model *model_from_file(const char *path, const char *policy_flag, int64_t batch)
{
    mp_safetensors *f;
    if (mp_safetensors_read(path, &f)) {
        fprintf(stderr, "mixprec: %s\n", mp_last_error());
        return NULL;
    }
    const char *config = mp_safetensors_metadata(f, "mixprec.config");
    int64_t bytes = 0; /* a model has no more parameters than the file has bytes */
    for (int i = 0; i < mp_safetensors_count(f); i++) {
        const mp_named_tensor *t = mp_safetensors_tensor(f, i);
        int64_t n = (int64_t)mp_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
        bytes += n;
    }
    mp_model *m = NULL;
    if (!config)
        fprintf(stderr, "mixprec: '%s' has no mixprec.config metadata: not a model mixprec saved\n",
                path);
    else if (mp_model_from_config_ex(config, policy_flag, batch, bytes, &m) ||
             mp_model_load_weights(m, path) || mp_model_compile(m, NULL)) {
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

int mp_cli_evaluate(int argc, char **argv)
{
    infer_args a;
    int rc = parse_infer("evaluate", argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    mp_dataset *ds;
    if ((rc = mp_cli_load_spec(a.data, a.data_dir, false, &ds))) return rc;
    mp_model *m = model_from_file(a.file, a.policy, a.batch);
    double loss, acc;
    if (!m || mp_model_evaluate(m, ds, a.batch, &loss, &acc)) {
        if (m) fprintf(stderr, "mixprec: %s\n", mp_last_error());
        mp_model_free(m);
        mp_dataset_free(ds);
        return 1;
    }
    printf("%lld samples: loss %.4f - accuracy %.4f\n", (long long)mp_dataset_count(ds), loss, acc);
    mp_model_free(m);
    mp_dataset_free(ds);
    return 0;
}

int mp_cli_predict(int argc, char **argv)
{
    infer_args a;
    int rc = parse_infer("predict", argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    mp_dataset *ds;
    if ((rc = mp_cli_load_spec(a.data, a.data_dir, false, &ds))) return rc;
    mp_model *m = model_from_file(a.file, a.policy, a.batch);
    int64_t n = mp_dataset_count(ds), shape[MP_MAX_DIMS];
    int64_t classes = m ? (mp_model_output_shape(m, shape), shape[0]) : 1;
    float *out = malloc((size_t)(n * classes) * sizeof *out);
    FILE *o = a.output ? fopen(a.output, "w") : stdout;
    if (!m || !out || !o || mp_model_predict(m, mp_dataset_features(ds), n, a.batch, out)) {
        if (m)
            fprintf(stderr, "mixprec: %s\n", !o ? "cannot open the output file" : mp_last_error());
        if (o && o != stdout) fclose(o);
        free(out);
        mp_model_free(m);
        mp_dataset_free(ds);
        return 1;
    }
    fprintf(o, "index,predicted,probability,label\n");
    for (int64_t i = 0; i < n; i++) {
        int64_t best = 0;
        for (int64_t c = 1; c < classes; c++)
            if (out[i * classes + c] > out[i * classes + best]) best = c;
        fprintf(o, "%lld,%lld,%.6f,%d\n", (long long)i, (long long)best,
                (double)out[i * classes + best], (int)mp_dataset_labels(ds)[i]);
    }
    if (o != stdout) fclose(o);
    free(out);
    mp_model_free(m);
    mp_dataset_free(ds);
    return 0;
}
