/* model_config.c - a model's configuration as JSON (Keras-like: a list of
 * layers with their class, name, policy, inputs and settings) and models
 * rebuilt from it. Checkpoints carry it in their __metadata__ so a file
 * alone can rebuild its model. Reading trusts nothing: every field is
 * type- and range-checked, and the sizes are bounded before anything is
 * allocated. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/io_internal.h"

#define CONFIG_FORMAT "mixprec.model"
#define CONFIG_VERSION 1

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

char *mp_model_config_json(const mp_model *m)
{
    json_t *layers = json_array();
    mp_policy g = mp_global_policy();
    mp_node outn = mp_model_output(m);
    int n = mp_model_num_layers(m);
    mp_layer_config c;
    for (int i = 0; i < n; i++) {
        mp_model_layer_config(m, i, &c);
        json_t *l = json_pack("{s:s, s:s, s:s, s:o}", "class_name", c.type, "name", c.name,
                              "policy", c.policy, "seed", mp_json_hex(c.seed));
        json_t *in = json_array();
        for (int k = 0; k < c.ninputs; k++) {
            mp_layer_config src;
            mp_model_layer_config(m, c.inputs[k], &src);
            json_array_append_new(in, json_string(src.name));
        }
        json_object_set_new(l, "inputs", in);
        switch (c.kind) {
        case MP_LAYER_INPUT: {
            json_t *sh = json_array();
            for (int d = 0; d < c.ndim; d++) json_array_append_new(sh, json_integer(c.shape[d]));
            json_object_set_new(l, "shape", sh);
            break;
        }
        case MP_LAYER_DENSE:
            json_object_set_new(l, "units", json_integer(c.units));
            /* fallthrough */
        case MP_LAYER_ACTIVATION:
            json_object_set_new(l, "activation", json_string(mp_activation_name(c.act)));
            break;
        case MP_LAYER_DROPOUT:
            json_object_set_new(l, "rate", json_real(c.rate));
            break;
        case MP_LAYER_LAYER_NORM:
            json_object_set_new(l, "epsilon", json_real(c.epsilon));
            break;
        default:
            break;
        }
        json_array_append_new(layers, l);
    }
    const char *out_name = "";
    if (outn >= 0) {
        mp_model_layer_config(m, outn, &c);
        out_name = c.name;
    }
    json_t *root = json_pack("{s:s, s:i, s:o, s:s, s:s, s:o}", "format", CONFIG_FORMAT, "version",
                             CONFIG_VERSION, "seed", mp_json_hex(mp_model_seed(m)), "global_policy",
                             g.name, "output", out_name, "layers", layers);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!s) mp_set_error(MP_ERR_NOMEM, "model config: cannot encode the JSON");
    return s;
}

/* Bounds a configuration must respect before anything is allocated. */
#define MAX_LAYERS 4096
#define MAX_WIDTH ((int64_t)1 << 26)       /* elements per sample of any layer's output */
#define MAX_ACTIVATIONS ((int64_t)1 << 27) /* summed over the layers */

#define BAD(...)                                                                                   \
    do {                                                                                           \
        s = mp_set_error(MP_ERR_FORMAT, __VA_ARGS__);                                              \
        goto fail;                                                                                 \
    } while (0)

static const char *const type_names[] = {"InputLayer", "Dense", "Activation",        "Dropout",
                                         "Flatten",    "Add",   "LayerNormalization"};

static bool get_int(const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return false;
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) return false;
    *out = x;
    return true;
}

static bool get_float(const json_t *o, const char *key, double lo, double hi, float *out)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) return false;
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return false;
    *out = (float)x;
    return true;
}

mp_status mp_model_from_config(const char *text, int64_t max_batch, int64_t max_params,
                               mp_model **out)
{
    return mp_model_from_config_ex(text, NULL, max_batch, max_params, out);
}

mp_status mp_model_from_config_ex(const char *text, const char *policy_override, int64_t max_batch,
                                  int64_t max_params, mp_model **out)
{
    *out = NULL;
    if (!text) return mp_set_error(MP_ERR_FORMAT, "model config: missing");
    mp_status s = MP_OK;
    mp_model *m = NULL;
    json_error_t je;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!root) return mp_set_error(MP_ERR_FORMAT, "model config: not valid JSON (%s)", je.text);
    const char *fmt = json_string_value(json_object_get(root, "format"));
    int64_t version;
    uint64_t seed;
    if (!json_is_object(root) || !fmt || strcmp(fmt, CONFIG_FORMAT))
        BAD("model config: not a %s configuration", CONFIG_FORMAT);
    if (!get_int(root, "version", CONFIG_VERSION, CONFIG_VERSION, &version))
        BAD("model config: unsupported version (this build reads version %d)", CONFIG_VERSION);
    if (!mp_json_hex_value(json_object_get(root, "seed"), &seed))
        BAD("model config: 'seed' must be a hex string 0x...");
    const json_t *layers = json_object_get(root, "layers");
    const char *out_name = json_string_value(json_object_get(root, "output"));
    if (!json_is_array(layers) || json_array_size(layers) < 1 ||
        json_array_size(layers) > MAX_LAYERS)
        BAD("model config: 'layers' must be a list of 1 to %d layers", MAX_LAYERS);
    if (!out_name) BAD("model config: 'output' must name a layer");
    const char *gp = json_string_value(json_object_get(root, "global_policy"));
    mp_policy pol;
    if (gp && mp_policy_from_name(gp, &pol) != MP_OK)
        BAD("model config: global_policy: %s", mp_last_error());
    if (policy_override && mp_policy_from_name(policy_override, &pol) != MP_OK) {
        s = MP_ERR_INVALID;
        goto fail;
    }

    m = mp_model_new(seed);
    if (!m) {
        s = MP_ERR_NOMEM;
        goto fail;
    }
    mp_node output = -1;
    size_t i;
    const json_t *lj;
    json_array_foreach(layers, i, lj)
    {
        const char *type = json_string_value(json_object_get(lj, "class_name"));
        const char *name = json_string_value(json_object_get(lj, "name"));
        const char *policy = json_string_value(json_object_get(lj, "policy"));
        const json_t *inputs = json_object_get(lj, "inputs");
        if (policy_override && gp && policy && !strcmp(policy, gp)) policy = policy_override;
        mp_layer_options o = {name, policy, 0};
        if (!json_is_object(lj) || !type || !name || !policy || !json_is_array(inputs))
            BAD("model config: layer %zu needs class_name, name, policy and inputs", i);
        if (!mp_json_hex_value(json_object_get(lj, "seed"), &o.seed))
            BAD("model config: layer '%s' needs a hex 'seed'", name);
        int kind = -1;
        for (int k = 0; k < (int)(sizeof type_names / sizeof type_names[0]); k++)
            if (!strcmp(type, type_names[k])) kind = k;
        if (kind < 0) BAD("model config: layer '%s' has unknown class_name '%s'", name, type);
        size_t want = kind == MP_LAYER_INPUT ? 0 : kind == MP_LAYER_ADD ? 2 : 1;
        if (json_array_size(inputs) != want)
            BAD("model config: layer '%s' (%s) takes %zu inputs, the config lists %zu", name, type,
                want, json_array_size(inputs));
        mp_node in[2] = {-1, -1};
        for (size_t k = 0; k < want; k++) {
            const char *src = json_string_value(json_array_get(inputs, k));
            for (int j = 0; src && j < (int)i; j++) {
                mp_layer_config c;
                mp_model_layer_config(m, j, &c);
                if (!strcmp(c.name, src)) in[k] = j;
            }
            if (in[k] < 0)
                BAD("model config: layer '%s' takes input '%s', which is not an earlier layer",
                    name, src ? src : "(not a string)");
        }
        mp_node node = -1;
        int64_t units = 0;
        mp_activation act = MP_ACT_NONE;
        float f = 0;
        const char *act_name = json_string_value(json_object_get(lj, "activation"));
        if ((kind == MP_LAYER_DENSE || kind == MP_LAYER_ACTIVATION) &&
            mp_activation_from_name(act_name, &act) != MP_OK)
            BAD("model config: layer '%s': %s", name, mp_last_error());
        switch ((mp_layer_kind)kind) {
        case MP_LAYER_INPUT: {
            const json_t *sh = json_object_get(lj, "shape");
            int64_t shape[MP_MAX_DIMS], width = 1;
            if (!json_is_array(sh) || json_array_size(sh) < 1 ||
                json_array_size(sh) > MP_MAX_DIMS - 1)
                BAD("model config: input '%s' needs a shape of 1 to %d dimensions", name,
                    MP_MAX_DIMS - 1);
            for (size_t d = 0; d < json_array_size(sh); d++) {
                const json_t *e = json_array_get(sh, d);
                if (!json_is_integer(e) || json_integer_value(e) < 1 ||
                    json_integer_value(e) > MAX_WIDTH / width)
                    BAD("model config: input '%s' has a bad shape (at most %lld elements)", name,
                        (long long)MAX_WIDTH);
                shape[d] = json_integer_value(e);
                width *= shape[d];
            }
            node = mp_input(m, (int)json_array_size(sh), shape, &o);
            break;
        }
        case MP_LAYER_DENSE:
            if (!get_int(lj, "units", 1, MAX_WIDTH, &units))
                BAD("model config: dense '%s' needs units in 1..%lld", name, (long long)MAX_WIDTH);
            node = mp_dense(m, in[0], units, act, &o);
            break;
        case MP_LAYER_ACTIVATION:
            node = mp_activation_layer(m, in[0], act, &o);
            break;
        case MP_LAYER_DROPOUT:
            if (!get_float(lj, "rate", 0.0, 1.0, &f))
                BAD("model config: dropout '%s' needs a rate in [0, 1)", name);
            node = mp_dropout(m, in[0], f, &o);
            break;
        case MP_LAYER_FLATTEN:
            node = mp_flatten(m, in[0], &o);
            break;
        case MP_LAYER_ADD:
            node = mp_add(m, in[0], in[1], &o);
            break;
        case MP_LAYER_LAYER_NORM:
            if (!get_float(lj, "epsilon", 0.0, 1.0, &f))
                BAD("model config: layer normalization '%s' needs an epsilon in [0, 1]", name);
            node = mp_layer_norm(m, in[0], f, &o);
            break;
        }
        if (node < 0) { /* the layer's own check, e.g. a shape mismatch */
            s = mp_set_error(MP_ERR_FORMAT, "model config: %s", mp_last_error());
            goto fail;
        }
        if (!strcmp(name, out_name)) output = node;
    }
    if (output < 0) BAD("model config: output '%s' is not a layer", out_name);
    int64_t total = 0;
    for (int l = 0; l < mp_model_num_layers(m); l++) { /* the activations per sample */
        mp_layer_config c;
        mp_model_layer_config(m, l, &c);
        int64_t w = 1;
        for (int d = 0; d < c.ndim; d++) w *= c.shape[d];
        if ((total += w) > MAX_ACTIVATIONS)
            BAD("model config: more than %lld activation elements per sample",
                (long long)MAX_ACTIVATIONS);
    }
    total = 0;
    for (int p = 0; p < mp_model_num_params(m); p++) {
        total += mp_model_get_param(m, p)->n;
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
