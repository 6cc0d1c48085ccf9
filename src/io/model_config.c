/* model_config.c - a model's configuration as JSON (Keras-like: the model's
 * policy, seed and output, and a list of layers with their class, name,
 * inputs, seed, explicit policy and settings) and models rebuilt from it.
 * Checkpoints carry it in their __metadata__ so a file alone can rebuild its
 * model; `mixprec train --model FILE` builds from a hand-written one. Each
 * layer's settings are its kind's (ops->to_json / from_json): this file
 * handles what every layer has. Reading trusts nothing: every field is
 * type- and range-checked, and the sizes are bounded before anything is
 * allocated. Version 1 files (no model policy, every layer's policy
 * written) still load. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/io_internal.h"
#include "nn/layer.h"
#include "nn/quant.h"

#define CONFIG_FORMAT "mixprec.model"
#define CONFIG_VERSION 2

json_t *mp_json_hex(uint64_t x)
{
    char buf[24];
    snprintf(buf, sizeof buf, "0x%016" PRIx64, x);
    return json_string(buf);
}

bool mp_json_hex_value(const json_t *j, uint64_t *out)
{
    const char *s = json_string_value(j);
    /* hex digits only: strtoull alone would also take "0x-1", "0x+1", "0x 1", "0x0x1" */
    if (!s || strncmp(s, "0x", 2) || !s[2] || strlen(s) > 18 ||
        strspn(s + 2, "0123456789abcdefABCDEF") != strlen(s + 2))
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s + 2, &end, 16);
    if (errno || *end) return false;
    *out = (uint64_t)v;
    return true;
}

/* ---------------------------------------------------------------- writing */

static json_t *layer_json(const mp_model *m, const mp_layer *l)
{
    json_t *o = json_pack("{s:s, s:s}", "class_name", l->ops->class_name, "name", l->name);
    json_t *in = json_array();
    for (int k = 0; k < l->ninputs; k++)
        json_array_append_new(in, json_string(m->layers[l->inputs[k]].name));
    json_object_set_new(o, "inputs", in);
    if (l->policy_explicit) json_object_set_new(o, "policy", json_string(l->policy.name));
    json_object_set_new(o, "seed", mp_json_hex(l->seed));
    for (int r = 0; r < MP_ROLE_COUNT; r++)
        if (l->init[r]) {
            char key[48];
            snprintf(key, sizeof key, "%s_initializer", mp_param_role_name((mp_param_role)r));
            json_object_set_new(o, key, json_string(mp_initializer_name(l->init[r])));
        }
    if (l->ops->float8) { /* float8: the layer's choice and, where they matter, its settings */
        mp_float8_params d = mp_float8_params_default();
        if (l->fp8_mode) json_object_set_new(o, "float8", json_boolean(l->fp8_mode > 0));
        if (l->policy.float8 || l->fp8_mode > 0 || !mp_float8_params_equal(&l->fp8_params, &d))
            json_object_set_new(o, "float8_params", mp_float8_params_json(&l->fp8_params));
    }
    if (l->ops->float8) mp_mx_layer_json(l, o); /* MX: "mx", "mx_grad" where set */
    if (l->ops->to_json) l->ops->to_json(l, o);
    return o;
}

char *mp_model_config_json(const mp_model *m)
{
    json_t *layers = json_array();
    for (int i = 0; i < m->nlayers; i++)
        json_array_append_new(layers, layer_json(m, &m->layers[i]));
    mp_node outn = mp_model_output(m);
    json_t *root =
        json_pack("{s:s, s:i, s:o, s:s, s:s, s:o}", "format", CONFIG_FORMAT, "version",
                  CONFIG_VERSION, "seed", mp_json_hex(m->seed), "policy", mp_model_policy(m).name,
                  "output", outn >= 0 ? m->layers[outn].name : "", "layers", layers);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!s) mp_set_error(MP_ERR_NOMEM, "model config: cannot encode the JSON");
    return s;
}

/* ---------------------------------------------------------------- reading */

/* Bounds a configuration must respect before anything is allocated. */
#define MAX_LAYERS 4096
#define MAX_ACTIVATIONS ((int64_t)1 << 27) /* elements per sample, summed over the layers */
#define MAX_INPUTS 64

#define BAD(...)                                                                                   \
    do {                                                                                           \
        s = mp_set_error(MP_ERR_FORMAT, __VA_ARGS__);                                              \
        goto fail;                                                                                 \
    } while (0)

static const char *const common_fields[] = {"class_name", "name",   "inputs",        "policy",
                                            "seed",       "float8", "float8_params", "mx",
                                            "mx_grad",    NULL};

static bool listed(const char *const *list, const char *key)
{
    for (; list && *list; list++)
        if (!strcmp(*list, key)) return true;
    return false;
}

/* Is key "<role>_initializer"? Then its role. */
static bool initializer_key(const char *key, int *role)
{
    for (int r = 0; r < MP_ROLE_COUNT; r++) {
        const char *name = mp_param_role_name((mp_param_role)r);
        size_t n = strlen(name);
        if (!strncmp(key, name, n) && !strcmp(key + n, "_initializer")) {
            *role = r;
            return true;
        }
    }
    return false;
}

/* A version-1 file wrote every layer's policy and no model policy: take the
 * most common policy of the computing layers as the model's, the others as
 * explicit overrides. */
static const char *v1_model_policy(const json_t *layers)
{
    const char *best = NULL;
    size_t best_n = 0, i, k;
    const json_t *a, *b;
    json_array_foreach(layers, i, a)
    {
        const char *p = json_string_value(json_object_get(a, "policy"));
        if (!p || json_array_size(json_object_get(a, "inputs")) == 0) continue;
        size_t n = 0;
        json_array_foreach(layers, k, b)
        {
            const char *q = json_string_value(json_object_get(b, "policy"));
            n += q && !strcmp(p, q) && json_array_size(json_object_get(b, "inputs")) > 0;
        }
        if (n > best_n) {
            best = p;
            best_n = n;
        }
    }
    return best;
}

/* Create layer i of the file in m. */
static mp_status add_layer(mp_model *m, const json_t *lj, size_t i, int version,
                           const char *model_policy)
{
    mp_status s = MP_OK;
    void *config = NULL;
    const char *type = json_string_value(json_object_get(lj, "class_name"));
    const char *name = json_string_value(json_object_get(lj, "name"));
    const json_t *inputs = json_object_get(lj, "inputs");
    const json_t *pj = json_object_get(lj, "policy");
    if (!json_is_object(lj) || !type || !name || !json_is_array(inputs))
        BAD("model config: layer %zu needs class_name, name and inputs", i);
    const mp_layer_ops *ops = mp_layer_ops_find(type);
    if (!ops) BAD("model config: layer '%s' has unknown class_name '%s'", name, type);
    mp_layer_options o = {.name = name};
    mp_float8_params f8;
    const json_t *f8j = json_object_get(lj, "float8"), *f8p = json_object_get(lj, "float8_params");
    if ((f8j || f8p) && !ops->float8)
        BAD("model config: layer '%s' (%s): unknown field '%s'", name, type,
            f8j ? "float8" : "float8_params");
    if (f8j && !json_is_boolean(f8j))
        BAD("model config: layer '%s': 'float8' must be true or false", name);
    if (f8j) o.float8 = json_is_true(f8j) ? 1 : -1;
    if (f8p && mp_float8_params_from_json(f8p, &f8))
        BAD("model config: layer '%s': 'float8_params': %s", name, mp_last_error());
    if (f8p) o.float8_params = &f8;
    mp_mx_params mxp;
    const json_t *mxj = json_object_get(lj, "mx"), *mxg = json_object_get(lj, "mx_grad");
    if ((mxj || mxg) && !ops->float8)
        BAD("model config: layer '%s' (%s): unknown field '%s'", name, type,
            mxj ? "mx" : "mx_grad");
    if (mp_mx_options_from_json(lj, &o, &mxp))
        BAD("model config: layer '%s': %s", name, mp_last_error());
    const char *policy = json_string_value(pj);
    if ((pj && !policy) || (version == 1 && !policy))
        BAD("model config: layer '%s': 'policy' must be a policy name", name);
    /* in version 1 a layer in the model's policy followed it; with --policy
     * it follows the new one */
    if (policy && !(version == 1 && !strcmp(policy, model_policy))) o.policy = policy;
    const json_t *seed = json_object_get(lj, "seed");
    if ((seed || version == 1) && !mp_json_hex_value(seed, &o.seed))
        BAD("model config: layer '%s': 'seed' must be a hex string 0x...", name);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)lj, key, v)
    {
        int role;
        if (initializer_key(key, &role)) {
            if (mp_initializer_from_name(json_string_value(v), &o.initializers[role]))
                BAD("model config: layer '%s': '%s': %s", name, key, mp_last_error());
        } else if (!listed(common_fields, key) && !listed(ops->fields, key)) {
            BAD("model config: layer '%s' (%s): unknown field '%s'", name, type, key);
        }
    }
    size_t n = json_array_size(inputs);
    if (n > MAX_INPUTS)
        BAD("model config: layer '%s' lists %zu inputs (at most %d)", name, n, MAX_INPUTS);
    mp_node in[MAX_INPUTS];
    for (size_t k = 0; k < n; k++) {
        const char *src = json_string_value(json_array_get(inputs, k));
        in[k] = -1;
        for (int j = 0; src && j < m->nlayers; j++)
            if (!strcmp(m->layers[j].name, src)) in[k] = j;
        if (in[k] < 0)
            BAD("model config: layer '%s' takes input '%s', which is not an earlier layer", name,
                src ? src : "(not a string)");
    }
    if (!(config = calloc(1, ops->config_size ? ops->config_size : 1))) {
        s = mp_set_error(MP_ERR_NOMEM, "model config: out of memory");
        goto fail;
    }
    if (ops->from_json && (s = ops->from_json(lj, config)))
        BAD("model config: layer '%s' (%s): %s", name, type, mp_last_error());
    if (mp_layer_create(m, ops, in, (int)n, config, &o) < 0) /* the layer's own checks */
        BAD("model config: %s", mp_last_error());
fail:
    free(config);
    return s;
}

static mp_status from_config(const char *text, const char *policy_override, uint64_t seed_default,
                             int64_t max_batch, int64_t max_params, mp_model **out)
{
    *out = NULL;
    if (!text) return mp_set_error(MP_ERR_FORMAT, "model config: missing");
    mp_status s = MP_OK;
    mp_model *m = NULL;
    json_error_t je;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return mp_set_error(MP_ERR_FORMAT, "model config: not valid JSON (line %d: %s)", je.line,
                            je.text);
    const char *fmt = json_string_value(json_object_get(root, "format"));
    const json_t *vj = json_object_get(root, "version");
    uint64_t seed = seed_default;
    if (!json_is_object(root) || !fmt || strcmp(fmt, CONFIG_FORMAT))
        BAD("model config: not a %s configuration ('format' must be \"%s\")", CONFIG_FORMAT,
            CONFIG_FORMAT);
    if (!json_is_integer(vj) || json_integer_value(vj) < 1 ||
        json_integer_value(vj) > CONFIG_VERSION)
        BAD("model config: 'version' must be 1 to %d", CONFIG_VERSION);
    int version = (int)json_integer_value(vj);
    const json_t *sj = json_object_get(root, "seed");
    if ((sj || version == 1) && !mp_json_hex_value(sj, &seed))
        BAD("model config: 'seed' must be a hex string 0x...");
    const json_t *layers = json_object_get(root, "layers");
    if (!json_is_array(layers) || json_array_size(layers) < 1 ||
        json_array_size(layers) > MAX_LAYERS)
        BAD("model config: 'layers' must be a list of 1 to %d layers", MAX_LAYERS);
    const json_t *oj = json_object_get(root, "output");
    const char *out_name = json_string_value(oj);
    if ((oj || version == 1) && !out_name) BAD("model config: 'output' must name a layer");
    const json_t *pj = json_object_get(root, version == 1 ? "global_policy" : "policy");
    const char *policy = version == 1 ? v1_model_policy(layers) : json_string_value(pj);
    mp_policy pol;
    if ((pj && !json_string_value(pj)) ||
        (pj && mp_policy_from_name(json_string_value(pj), &pol) != MP_OK) ||
        (policy && mp_policy_from_name(policy, &pol) != MP_OK))
        BAD("model config: '%s': %s", version == 1 ? "global_policy" : "policy",
            json_string_value(pj) ? mp_last_error() : "must be a policy name");
    if (policy_override && mp_policy_from_name(policy_override, &pol) != MP_OK) {
        s = MP_ERR_INVALID;
        goto fail;
    }
    if (!policy) policy = mp_global_policy().name;
    if (!(m = mp_model_new_with_policy(seed, policy_override ? policy_override : policy))) {
        s = MP_ERR_NOMEM;
        goto fail;
    }
    size_t i;
    const json_t *lj;
    int64_t total = 0;
    json_array_foreach(layers, i, lj)
    {
        if ((s = add_layer(m, lj, i, version, policy))) goto fail;
        const mp_layer *l = &m->layers[m->nlayers - 1];
        if (layer_numel(l, 1) > MP_CONFIG_MAX_WIDTH)
            BAD("model config: layer '%s' has more than %lld elements per sample", l->name,
                (long long)MP_CONFIG_MAX_WIDTH);
        if ((total += layer_numel(l, 1)) > MAX_ACTIVATIONS)
            BAD("model config: more than %lld activation elements per sample",
                (long long)MAX_ACTIVATIONS);
    }
    mp_node output = out_name ? -1 : m->nlayers - 1;
    for (int j = 0; out_name && j < m->nlayers; j++)
        if (!strcmp(m->layers[j].name, out_name)) output = j;
    if (output < 0) BAD("model config: output '%s' is not a layer", out_name);
    total = 0;
    for (int p = 0; p < m->nparams; p++) {
        total += m->params[p].p.n;
        if (total > max_params)
            BAD("model config: more than %lld parameters (the bound for this file)",
                (long long)max_params);
    }
    if ((s = mp_model_build(m, output, max_batch))) goto fail;
    json_decref(root);
    *out = m;
    return MP_OK;
fail:
    json_decref(root);
    mp_model_free(m);
    return s;
}

mp_status mp_model_from_config(const char *text, int64_t max_batch, int64_t max_params,
                               mp_model **out)
{
    return from_config(text, NULL, 0, max_batch, max_params, out);
}

mp_status mp_model_from_config_ex(const char *text, const char *policy_override, int64_t max_batch,
                                  int64_t max_params, mp_model **out)
{
    return from_config(text, policy_override, 0, max_batch, max_params, out);
}

/* Files a person writes are small: bound what is read. */
#define MAX_CONFIG_FILE (16 << 20)

mp_status mp_model_from_config_file(const char *path, const char *policy, uint64_t seed,
                                    int64_t max_batch, mp_model **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return mp_set_error(MP_ERR_IO, "'%s': cannot open (%s)", path, strerror(errno));
    char *text = malloc(MAX_CONFIG_FILE + 1);
    size_t n = text ? fread(text, 1, MAX_CONFIG_FILE + 1, f) : 0;
    bool err = ferror(f);
    fclose(f);
    mp_status s;
    if (!text)
        s = mp_set_error(MP_ERR_NOMEM, "'%s': out of memory", path);
    else if (err)
        s = mp_set_error(MP_ERR_IO, "'%s': read error", path);
    else if (n > MAX_CONFIG_FILE)
        s = mp_set_error(MP_ERR_FORMAT, "'%s': larger than %d bytes", path, MAX_CONFIG_FILE);
    else {
        text[n] = 0;
        s = from_config(text, policy, seed, max_batch, INT64_MAX, out);
        if (s) mp_set_error(s, "'%s': %s", path, mp_last_error());
    }
    free(text);
    return s;
}
