/* tune_cmd.c - `mixprec tune-precision --model M.json --data ... --budget E`:
 * measure on a few probe batches which number format each layer with a
 * kernel can take within the error budget (mixprec/tune.h), print the
 * table and write the model file with the per-layer choices. All the work
 * is library calls; this file parses flags and prints. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "mixprec.h"

static void tune_usage(FILE *f)
{
    fprintf(f,
            "usage: mixprec tune-precision --model M.json [options]\n"
            "  --model FILE        the model file to tune (JSON, as `mixprec train --model`)\n"
            "  --data SPEC         fashion-mnist (default), a CSV file, or text:PATH /\n"
            "                      text:fortunes for a sequence model\n"
            "  --data-dir DIR      where fashion-mnist is\n"
            "  --budget E          the largest error a layer's format may give (default 0.08:\n"
            "                      admits 8-bit formats where they fit, not MXFP4; 0.02 keeps\n"
            "                      16 bits everywhere):\n"
            "                      per tensor max(||q(x)-x||/||x||, fraction of non-zeros\n"
            "                      flushed to 0), worst of activation, kernel and gradient\n"
            "  --probe-batches N   batches measured (default 4)\n"
            "  --batch-size N      samples per batch (default 32)\n"
            "  --candidates LIST   formats to consider, comma-separated (default all:\n"
            "                      float32,bfloat16,float16,fp8,mxfp8,mxfp6,mxfp4)\n"
            "  --all-layers        let the first and last Dense/Conv2D go below 16 bits too\n"
            "  --init-from FILE    probe with these weights (a safetensors file or checkpoint\n"
            "                      of this model; default: its initial weights)\n"
            "  --seed S            which samples probe (default 1)\n"
            "  --any-format        every candidate eligible, even one this build cannot train\n"
            "                      (MX before the MX trainer): the file may need a newer mixprec\n"
            "  --details           each tensor's relative error and flushed fraction too\n"
            "  --output FILE       the tuned model file (default: M-tuned.json)\n"
            "Then: mixprec train --model FILE ...\n");
}

/* The whole of a small file, or NULL after printing. */
static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "mixprec tune-precision: --model '%s': cannot open (%s)\n", path,
                strerror(errno));
        return NULL;
    }
    size_t cap = 16u << 20;
    char *text = malloc(cap + 1);
    size_t n = text ? fread(text, 1, cap + 1, f) : 0;
    bool bad = !text || ferror(f) || n > cap;
    fclose(f);
    if (bad) {
        fprintf(stderr, "mixprec tune-precision: --model '%s': unreadable or over 16 MiB\n", path);
        free(text);
        return NULL;
    }
    text[n] = 0;
    return text;
}

int mp_cli_tune(int argc, char **argv)
{
    mp_tune_options o = mp_tune_options_default();
    const char *model = NULL, *data = "fashion-mnist", *dir = NULL, *output = NULL;
    bool details = false;
    for (int i = 0; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t iv;
        bool takes = strcmp(f, "--help") && strcmp(f, "-h") && strcmp(f, "--all-layers") &&
                     strcmp(f, "--details") && strcmp(f, "--any-format");
        if (takes && f[0] == '-' && !v)
            return mp_cli_bad_option("tune-precision", f, NULL, "needs a value");
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            tune_usage(stdout);
            return 0;
        } else if (!strcmp(f, "--all-layers")) {
            o.keep_first_last = false;
            continue;
        } else if (!strcmp(f, "--any-format")) {
            o.trainable_only = false;
            continue;
        } else if (!strcmp(f, "--details")) {
            details = true;
            continue;
        } else if (!strcmp(f, "--model")) {
            model = v;
        } else if (!strcmp(f, "--data")) {
            data = v;
        } else if (!strcmp(f, "--data-dir")) {
            dir = v;
        } else if (!strcmp(f, "--output")) {
            output = v;
        } else if (!strcmp(f, "--init-from")) {
            o.weights = v;
        } else if (!strcmp(f, "--budget")) {
            char *end;
            errno = 0;
            o.budget = strtod(v, &end);
            if (*end || end == v || errno || !(o.budget > 0) || !isfinite(o.budget))
                return mp_cli_bad_option(
                    "tune-precision", f, v,
                    "expected a finite number > 0 (a relative error, e.g. 0.08)");
        } else if (!strcmp(f, "--probe-batches")) {
            if (!mp_cli_parse_i64(v, 1, 1000, &iv))
                return mp_cli_bad_option("tune-precision", f, v, "expected an integer in 1..1000");
            o.probe_batches = (int)iv;
        } else if (!strcmp(f, "--batch-size")) {
            if (!mp_cli_parse_i64(v, 1, 1 << 20, &o.batch_size))
                return mp_cli_bad_option("tune-precision", f, v,
                                         "expected an integer in 1..1048576");
        } else if (!strcmp(f, "--seed")) {
            if (!mp_cli_parse_i64(v, 0, INT64_MAX, &iv))
                return mp_cli_bad_option("tune-precision", f, v, "expected a non-negative integer");
            o.seed = (uint64_t)iv;
        } else if (!strcmp(f, "--candidates")) {
            if (mp_tune_formats_from_list(v, &o.candidates))
                return mp_cli_bad_option("tune-precision", f, v, mp_last_error());
        } else {
            fprintf(stderr, "mixprec tune-precision: unknown argument '%s' (see --help)\n", f);
            return 2;
        }
        i++;
    }
    if (!model)
        return mp_cli_bad_option("tune-precision", "--model", NULL,
                                 "required (a model file, JSON)");
    char def_out[4096];
    if (!output) {
        size_t n = strlen(model);
        if (n > 5 && !strcmp(model + n - 5, ".json")) n -= 5;
        if (n + 12 > sizeof def_out)
            return mp_cli_bad_option("tune-precision", "--model", model, "path too long");
        snprintf(def_out, sizeof def_out, "%.*s-tuned.json", (int)n, model);
        output = def_out;
    }
    /* the model once, small, for its input (a sequence model reads text in
     * windows of its length) and to report a bad file before the data loads */
    mp_model *m = NULL;
    if (mp_model_from_config_file(model, "float32", 0, 1, &m)) {
        fprintf(stderr, "mixprec tune-precision: --model %s\n", mp_last_error());
        return 2;
    }
    int64_t shape[MP_MAX_DIMS];
    int nd = mp_model_input_shape(m, shape);
    int64_t context = mp_model_input_dtype(m) == MP_I32 && nd >= 1 ? shape[0] : 0;
    mp_model_free(m);
    char *text = read_text(model);
    if (!text) return 1;
    mp_dataset *ds = NULL;
    int rc = mp_cli_load_spec_ex(data, dir, true, context, &ds);
    if (rc) {
        free(text);
        return rc;
    }
    mp_tune_result r;
    mp_status s = mp_tune_precision(text, ds, &o, &r);
    free(text);
    mp_dataset_free(ds);
    if (s) {
        fprintf(stderr, "mixprec tune-precision: %s\n", mp_last_error());
        return s == MP_ERR_INVALID ? 2 : 1;
    }
    mp_tune_print(&r, details, stdout);
    s = mp_tune_write_config(&r, output);
    if (s)
        fprintf(stderr, "mixprec tune-precision: %s\n", mp_last_error());
    else
        printf("wrote %s (mixprec train --model %s)\n", output, output);
    mp_tune_result_free(&r);
    return s ? 1 : 0;
}
