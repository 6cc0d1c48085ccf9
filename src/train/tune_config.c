/* tune_config.c - automatic per-layer precision around the measurement
 * (tune.c): the model file in (built in float32 for the probe, every
 * layer's own precision settings dropped), the tuned model file out (the
 * same layers with the chosen settings, one layer a line), the table, and
 * mp_tune_precision itself. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "train/tune_internal.h"

/* Per-layer fields that set a layer's precision: dropped for the probe,
 * replaced on the tuned layers. */
static const char *const precision_fields[] = {"policy", "float8", "mx"};

static void drop_precision(json_t *layer)
{
    for (size_t i = 0; i < sizeof precision_fields / sizeof *precision_fields; i++)
        json_object_del(layer, precision_fields[i]);
}

/* The tuned settings of one layer. */
static void set_choice(json_t *layer, const mp_tune_layer *r, bool float8_kind)
{
    static const char *const policy[MP_TUNE_FORMAT_COUNT] = {
        "float32",        "mixed_bfloat16", "mixed_float16", "mixed_bfloat16",
        "mixed_bfloat16", "mixed_bfloat16", "mixed_bfloat16"};
    drop_precision(layer);
    json_object_set_new(layer, "policy", json_string(policy[r->chosen]));
    if (mp_tune_is_mx(r->chosen))
        json_object_set_new(layer, "mx", json_string(mp_tune_mx_name(r->chosen)));
    else if (float8_kind)
        json_object_set_new(layer, "float8", json_boolean(r->chosen == MP_TUNE_FP8));
}

/* The model file as a person writes it: top-level fields a line each, one
 * layer a line. */
static char *dump_config(const json_t *root)
{
    size_t cap = 4096, len = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    const char *key;
    json_t *v;
    size_t nkeys = json_object_size(root), k = 0;
    out[len++] = '{';
    out[len++] = '\n';
    json_object_foreach((json_t *)root, key, v)
    {
        json_t *kj = json_string(key);
        char *ks = json_dumps(kj, JSON_ENCODE_ANY);
        json_decref(kj);
        size_t nel = json_is_array(v) ? json_array_size(v) : 0;
        char **parts = calloc(nel + 1, sizeof *parts);
        bool layers = !strcmp(key, "layers") && json_is_array(v);
        size_t need = (ks ? strlen(ks) : 0) + 16;
        if (parts && layers) {
            for (size_t i = 0; i < nel; i++) {
                parts[i] = json_dumps(json_array_get(v, i), JSON_ENCODE_ANY);
                need += (parts[i] ? strlen(parts[i]) : 0) + 8;
            }
        } else if (parts) {
            parts[0] = json_dumps(v, JSON_ENCODE_ANY);
            need += parts[0] ? strlen(parts[0]) : 0;
        }
        if (len + need + 8 > cap) {
            while (len + need + 8 > cap) cap *= 2;
            char *grown = realloc(out, cap);
            if (!grown) {
                free(out);
                out = NULL;
            }
            out = grown;
        }
        bool ok = out && ks && parts;
        for (size_t i = 0; ok && i < (layers ? nel : 1); i++) ok = parts[i] != NULL;
        if (ok) {
            len += (size_t)sprintf(out + len, "  %s: ", ks);
            if (layers) {
                len += (size_t)sprintf(out + len, "[\n");
                for (size_t i = 0; i < nel; i++)
                    len +=
                        (size_t)sprintf(out + len, "    %s%s\n", parts[i], i + 1 < nel ? "," : "");
                len += (size_t)sprintf(out + len, "  ]");
            } else {
                len += (size_t)sprintf(out + len, "%s", parts[0]);
            }
            len += (size_t)sprintf(out + len, "%s\n", ++k < nkeys ? "," : "");
        }
        for (size_t i = 0; parts && i < (layers ? nel : 1); i++) free(parts[i]);
        free(parts);
        free(ks);
        if (!ok) {
            free(out);
            return NULL;
        }
    }
    out[len++] = '}';
    out[len++] = '\n';
    out[len] = 0;
    return out;
}

/* The file's JSON, in version 2 (a version-1 file is rebuilt and written
 * again by the library, which gives version 2). */
static mp_status load_root(const char *config, json_t **out)
{
    json_error_t je;
    json_t *root = json_loads(config ? config : "", JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return mp_set_error(MP_ERR_FORMAT, "model config: not valid JSON (line %d: %s)", je.line,
                            je.text);
    const json_t *v = json_object_get(root, "version");
    if (json_is_integer(v) && json_integer_value(v) == 1) {
        mp_model *m;
        mp_status s = mp_model_from_config(config, 1, INT64_MAX, &m);
        json_decref(root);
        if (s) return s;
        char *text = mp_model_config_json(m);
        mp_model_free(m);
        root = text ? json_loads(text, 0, &je) : NULL;
        free(text);
        if (!root) return mp_set_error(MP_ERR_NOMEM, "model config: cannot re-encode");
    }
    if (!json_is_object(root) || !json_is_array(json_object_get(root, "layers"))) {
        json_decref(root);
        return mp_set_error(MP_ERR_FORMAT, "model config: 'layers' must be a list of layers");
    }
    *out = root;
    return MP_OK;
}

mp_status mp_tune_precision(const char *config, const mp_dataset *data, const mp_tune_options *o,
                            mp_tune_result *out)
{
    memset(out, 0, sizeof *out);
    mp_status s = mp_tune_options_validate(o);
    if (s) return s;
    if (!data) return mp_set_error(MP_ERR_INVALID, "tune-precision: no data");
    json_t *root = NULL, *probe = NULL;
    mp_model *m = NULL;
    char *text = NULL;
    int *idx = NULL;
    if ((s = load_root(config, &root))) goto done;
    /* the probe: everything float32, whatever the file says */
    probe = json_deep_copy(root);
    json_object_set_new(probe, "policy", json_string("float32"));
    size_t i;
    json_t *lj;
    json_array_foreach(json_object_get(probe, "layers"), i, lj)
    {
        if (json_is_object(lj)) drop_precision(lj);
    }
    text = json_dumps(probe, JSON_COMPACT);
    if (!text) {
        s = mp_set_error(MP_ERR_NOMEM, "tune-precision: out of memory");
        goto done;
    }
    if ((s = mp_model_from_config(text, o->batch_size, INT64_MAX, &m))) goto done;
    if (o->weights && (s = mp_model_load_weights(m, o->weights))) goto done;
    int nl = mp_model_num_layers(m);
    idx = malloc((size_t)nl * sizeof *idx);
    out->layers = calloc((size_t)nl, sizeof *out->layers);
    if (!idx || !out->layers) {
        s = mp_set_error(MP_ERR_NOMEM, "tune-precision: out of memory");
        goto done;
    }
    out->options = *o;
    out->nlayers = mp_tune_find_layers(m, o, idx, out->layers);
    if (out->nlayers == 0) {
        s = mp_set_error(MP_ERR_INVALID,
                         "tune-precision: the model has no layer with a kernel (Dense, Conv2D, "
                         "MultiHeadAttention, ...): nothing to tune");
        goto done;
    }
    if ((s = mp_tune_probe(m, data, o, out->nlayers, idx, out->layers, &out->samples, &out->loss)))
        goto done;
    /* the tuned file: the model policy mixed_bfloat16, each tuned layer's choice */
    json_object_set_new(root, "policy", json_string("mixed_bfloat16"));
    json_array_foreach(json_object_get(root, "layers"), i, lj)
    {
        const char *name = json_string_value(json_object_get(lj, "name"));
        for (int k = 0; name && k < out->nlayers; k++)
            if (!strcmp(out->layers[k].name, name))
                set_choice(lj, &out->layers[k], mp_tune_layer_float8(m, name));
    }
    if (!(out->config = dump_config(root)))
        s = mp_set_error(MP_ERR_NOMEM, "tune-precision: cannot encode the tuned model");
done:
    json_decref(root);
    json_decref(probe);
    free(text);
    free(idx);
    mp_model_free(m);
    if (s) mp_tune_result_free(out);
    return s;
}

void mp_tune_result_free(mp_tune_result *r)
{
    if (!r) return;
    free(r->layers);
    free(r->config);
    memset(r, 0, sizeof *r);
}

mp_status mp_tune_write_config(const mp_tune_result *r, const char *path)
{
    if (!r || !r->config || !path)
        return mp_set_error(MP_ERR_INVALID, "tune-precision: no tuned model to write");
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (!tmp) return mp_set_error(MP_ERR_NOMEM, "tune-precision: out of memory");
    snprintf(tmp, n, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    int err = 0;
    if (!f)
        err = errno;
    else {
        size_t len = strlen(r->config);
        if (fwrite(r->config, 1, len, f) != len || fflush(f) || fsync(fileno(f))) err = errno;
        if (fclose(f) && !err) err = errno;
        if (!err && rename(tmp, path)) err = errno;
        if (err) remove(tmp);
    }
    free(tmp);
    if (err)
        return mp_set_error(MP_ERR_IO, "'%s': cannot write (%s)", path, strerror(err ? err : EIO));
    return MP_OK;
}

/* ------------------------------------------------------------ the table */

static void human_bytes(double b, char *buf, size_t len)
{
    double a = fabs(b);
    if (a >= 1024.0 * 1024.0)
        snprintf(buf, len, "%+.1f MiB", b / (1024.0 * 1024.0));
    else
        snprintf(buf, len, "%+.1f KiB", b / 1024.0);
}

/* The role whose error is the layer's for format f: 'a', 'w' or 'g'. */
static char worst_role(const mp_tune_layer *l, int f)
{
    static const char letters[MP_TUNE_ROLES] = {'a', 'w', 'g'};
    int best = 0;
    double e = -1;
    for (int role = 0; role < MP_TUNE_ROLES; role++) {
        double v = l->rel[f][role] > l->flush[f][role] ? l->rel[f][role] : l->flush[f][role];
        if (v > e) {
            e = v;
            best = role;
        }
    }
    return e > 0 ? letters[best] : ' ';
}

/* Each tensor's two figures per format. */
static void print_details(const mp_tune_result *r, FILE *out)
{
    static const char *const roles[MP_TUNE_ROLES] = {"activation", "kernel", "gradient"};
    fprintf(out, "\nper tensor: relative error / fraction flushed to 0\n");
    for (int k = 0; k < r->nlayers; k++) {
        const mp_tune_layer *l = &r->layers[k];
        fprintf(out, "%s\n", l->name);
        for (int role = 0; role < MP_TUNE_ROLES; role++) {
            fprintf(out, "  %-10s", roles[role]);
            for (int f = 1; f < MP_TUNE_FORMAT_COUNT; f++)
                fprintf(out, "  %s %.4f/%.4f", mp_tune_format_name((mp_tune_format)f),
                        l->rel[f][role], l->flush[f][role]);
            fprintf(out, "\n");
        }
    }
}

void mp_tune_print(const mp_tune_result *r, bool details, FILE *out)
{
    const mp_tune_options *o = &r->options;
    fprintf(out,
            "tune-precision: %lld probe samples (%d batches of %lld), float32 loss %.4f, "
            "budget %g\n",
            (long long)r->samples, o->probe_batches, (long long)o->batch_size, r->loss, o->budget);
    fprintf(out, "error = worst of activation, kernel, gradient of max(||q(x)-x||/||x||, "
                 "fraction of non-zeros flushed to 0)\n\n");
    int w = 5;
    for (int k = 0; k < r->nlayers; k++)
        if ((int)strlen(r->layers[k].name) > w) w = (int)strlen(r->layers[k].name);
    fprintf(out, "%-*s  %-18s %-10s", w, "layer", "kind", "kernel");
    for (int f = 0; f < MP_TUNE_FORMAT_COUNT; f++)
        fprintf(out, " %10s", mp_tune_format_name((mp_tune_format)f));
    fprintf(out, "  %-8s %14s\n", "chosen", "saved vs bf16");
    double saved = 0;
    int counts[MP_TUNE_FORMAT_COUNT] = {0};
    for (int k = 0; k < r->nlayers; k++) {
        const mp_tune_layer *l = &r->layers[k];
        fprintf(out, "%-*s  %-18s %-10s", w, l->name, l->type, l->shape);
        for (int f = 0; f < MP_TUNE_FORMAT_COUNT; f++) {
            char cell[24];
            double e = l->error[f];
            if (isnan(e))
                snprintf(cell, sizeof cell, "-");
            else if (isinf(e))
                snprintf(cell, sizeof cell, "inf");
            else
                snprintf(cell, sizeof cell, "%.4f%c", e, worst_role(l, f));
            char shown[32];
            if (!(l->eligible & (1u << f)))
                snprintf(shown, sizeof shown, "(%s)", cell);
            else
                snprintf(shown, sizeof shown, "%s%s", cell, (int)l->chosen == f ? "*" : " ");
            fprintf(out, " %10s", shown);
        }
        char b[32];
        human_bytes(l->bytes_saved, b, sizeof b);
        fprintf(out, "  %-8s %14s%s\n", mp_tune_format_name(l->chosen), b,
                o->keep_first_last && (l->first || l->last) ? (l->first ? "  (first)" : "  (last)")
                                                            : "");
        saved += l->bytes_saved;
        counts[l->chosen]++;
    }
    char b[32];
    human_bytes(saved, b, sizeof b);
    fprintf(out, "\n%d layers:", r->nlayers);
    for (int f = 0; f < MP_TUNE_FORMAT_COUNT; f++)
        if (counts[f]) fprintf(out, " %d %s", counts[f], mp_tune_format_name((mp_tune_format)f));
    fprintf(out, "; kernels + input activations at batch %lld, saved vs all-bfloat16: %s\n",
            (long long)o->batch_size, b);
    fprintf(out, "a/w/g: the activation, kernel or gradient gives the error; * chosen (the "
                 "cheapest within the budget);\n(x): measured, not eligible (first/last layer "
                 "kept, or the kind has no fp8/MX GEMM)\n");
    if (o->trainable_only && !mp_tune_format_trainable(MP_TUNE_MXFP8))
        fprintf(out, "MX formats are measured but not eligible: this build does not train them "
                     "(no \"mx\" field in model files)\n");
    if (details) print_details(r, out);
}
