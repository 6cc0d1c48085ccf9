/* make_corpus.c - writes the checkpoint fuzz target's inputs:
 *   CORPUS/valid-*   small files the loader must accept: checkpoints after
 *                    a few training steps (Adam, AdamW, SGD with and
 *                    without momentum; float32, mixed_float16 with dynamic
 *                    and static loss scaling, mixed_bfloat16, pure
 *                    bfloat16 and float16), checkpoints a fit wrote (with
 *                    its mixprec.fit state), weights-only files, and
 *                    hand-made variations that are still valid (other
 *                    dtypes, no header padding, reordered data, extra
 *                    tensors and metadata);
 *   REGRESS/bad-*    hostile files the loader must refuse: broken headers,
 *                    offsets, shapes and dtypes, hostile configurations,
 *                    training and fit states out of range or non-finite.
 * Every file is checked against the library before the program ends: a
 * valid-* file that does not load or a bad-* file that does is reported
 * and the exit status is 1 (edge-* files may go either way). Models are
 * tiny (input 4, dense 3): each file stays under 8 KiB. Deterministic: the
 * same build writes the same bytes.
 *
 *   make fuzz-corpus       (mk/fuzz.mk) or
 *   build/fuzz/make_corpus tests/fuzz/corpus tests/fuzz/regress */
#include <dirent.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mixprec.h"

#define MAX_FILE_BYTES 8192

static const char *corpus_dir, *regress_dir;
static char tmp_dir[64];
static int n_valid, n_bad, n_wrong;

static void die(const char *what)
{
    fprintf(stderr, "make_corpus: %s: %s\n", what, mp_last_error());
    exit(2);
}

static void check(mp_status s, const char *what)
{
    if (s != MP_OK) die(what);
}

static void *xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        fprintf(stderr, "make_corpus: out of memory\n");
        exit(2);
    }
    return p;
}

static char *xstrdup(const char *s)
{
    char *p = xmalloc(strlen(s) + 1);
    memcpy(p, s, strlen(s) + 1);
    return p;
}

static const char *path_in(const char *dir, const char *name)
{
    static char p[2][512];
    static int k;
    k ^= 1;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

/* A written file is checked: valid-* must load, bad-* must not; both must
 * be small. */
static void verify(const char *path, const char *name)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "make_corpus: %s was not written\n", path);
        exit(2);
    }
    chmod(path, 0644); /* mp_safetensors_write's temporary is 0600 */
    if (st.st_size > MAX_FILE_BYTES) {
        fprintf(stderr, "make_corpus: %s has %lld bytes (at most %d)\n", path,
                (long long)st.st_size, MAX_FILE_BYTES);
        n_wrong++;
    }
    mp_model *m;
    mp_fit_state fit;
    mp_status s = mp_model_from_checkpoint(path, 1, &m, &fit);
    if (s == MP_OK) {
        mp_fit_state_free(&fit);
        mp_model_free(m);
    }
    bool valid = !strncmp(name, "valid-", 6), bad = !strncmp(name, "bad-", 4);
    if (valid && s != MP_OK) {
        fprintf(stderr, "make_corpus: %s does not load: %s\n", path, mp_last_error());
        n_wrong++;
    } else if (bad && s == MP_OK) {
        fprintf(stderr, "make_corpus: %s loads, but it should be refused\n", path);
        n_wrong++;
    }
    if (getenv("MAKE_CORPUS_VERBOSE"))
        printf("%-60s %s\n", name, s == MP_OK ? "loads" : mp_last_error());
    n_valid += valid;
    n_bad += bad;
}

/* ------------------------------------------------------------- models */

typedef enum {
    ARCH_MLP,      /* input 4 -> dense 3 relu -> dense 3 -> softmax (float32) */
    ARCH_RESIDUAL, /* input 4 -> dense 4 gelu -> dropout -> add input -> layer norm -> dense 3
                      -> softmax (float32) */
    ARCH_FLATTEN,  /* input [2, 2] -> flatten -> dense 3 -> softmax (float32) */
    ARCH_NORM,     /* input 4 -> dense 4 relu -> batch norm -> dense 3 -> softmax (float32) */
    ARCH_VIEWS,    /* input [2, 2] -> reshape [4] -> dense 4 (he_uniform, bias ones), dense 4
                      -> add of three -> dense 3 -> softmax (float32) */
    ARCH_TOKENS,   /* input int32 [3] -> embedding 5x4 -> flatten -> dense 3 -> softmax (float32) */
    ARCH_CNN,      /* input [2, 2, 1] -> random flip -> conv 3x3 same (2) -> batch norm -> zero
                      padding -> max pool -> global average pool -> dense 3 -> softmax (float32) */
    ARCH_GPT,      /* input int32 [3] -> embedding 5x4 "emb" -> position embedding 4 -> layer
                      norm -> causal attention (2 heads of 2) -> add -> reversible embedding
                      "emb" -> softmax (float32) */
} arch;

static mp_model *tiny(const char *policy, arch a)
{
    check(mp_set_global_policy(policy), policy);
    mp_model *m = mp_model_new(1234);
    mp_layer_options f32 = {.policy = "float32"};
    mp_node x, in, d[3];
    mp_layer_options he = {
        .initializers = {[MP_ROLE_KERNEL] = MP_INIT_HE_UNIFORM, [MP_ROLE_BIAS] = MP_INIT_ONES}};
    switch (a) {
    case ARCH_MLP:
        x = mp_input(m, 1, (int64_t[]){4}, NULL);
        x = mp_dense(m, x, 3, MP_ACT_RELU, NULL);
        x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
        break;
    case ARCH_RESIDUAL:
        in = mp_input(m, 1, (int64_t[]){4}, NULL);
        x = mp_dense(m, in, 4, MP_ACT_GELU, NULL);
        x = mp_dropout(m, x, 0.25f, NULL);
        x = mp_add(m, in, x, NULL);
        x = mp_layer_norm(m, x, 1e-3f, NULL);
        x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
        break;
    case ARCH_NORM:
        x = mp_input(m, 1, (int64_t[]){4}, NULL);
        x = mp_dense(m, x, 4, MP_ACT_RELU, NULL);
        x = mp_batch_norm(m, x, NULL, NULL);
        x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
        break;
    case ARCH_VIEWS:
        x = mp_input(m, 2, (int64_t[]){2, 2}, NULL);
        d[0] = mp_reshape(m, x, 1, (int64_t[]){4}, NULL);
        d[1] = mp_dense(m, d[0], 4, MP_ACT_NONE, &he);
        d[2] = mp_dense(m, d[0], 4, MP_ACT_TANH, NULL);
        x = mp_add_n(m, 3, d, NULL);
        x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
        break;
    case ARCH_CNN: {
        mp_conv2d_options c = mp_conv2d_options_default(2, 3, 3);
        c.padding = MP_PADDING_SAME;
        x = mp_input(m, 3, (int64_t[]){2, 2, 1}, NULL);
        x = mp_random_flip(m, x, MP_FLIP_HORIZONTAL, NULL);
        x = mp_conv2d(m, x, &c, NULL);
        x = mp_batch_norm(m, x, NULL, NULL);
        x = mp_zero_padding2d(m, x, 1, 1, 1, 1, NULL);
        x = mp_max_pooling2d(m, x, NULL, NULL);
        x = mp_global_average_pooling2d(m, x, NULL);
        x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
        break;
    }
    case ARCH_GPT: {
        mp_multi_head_attention_options a = mp_multi_head_attention_options_default(2, 2);
        x = mp_input_ex(m, 1, (int64_t[]){3}, MP_I32, NULL);
        x = mp_embedding(m, x, 5, 4, &(mp_layer_options){.name = "emb"});
        x = mp_position_embedding(m, x, 4, NULL);
        in = x;
        x = mp_multi_head_attention(m, mp_layer_norm(m, x, 1e-5f, NULL), &a, NULL);
        x = mp_add(m, in, x, NULL);
        x = mp_reversible_embedding(m, x, "emb", NULL);
        break;
    }
    case ARCH_TOKENS:
        x = mp_input_ex(m, 1, (int64_t[]){3}, MP_I32, NULL);
        x = mp_embedding(m, x, 5, 4, NULL);
        x = mp_flatten(m, x, NULL);
        x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
        break;
    default:
        x = mp_input(m, 2, (int64_t[]){2, 2}, NULL);
        x = mp_flatten(m, x, NULL);
        x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
        break;
    }
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &f32);
    check(mp_model_build(m, x, 8), "build");
    return m;
}

typedef struct {
    mp_optimizer_kind kind;
    float momentum;
    bool nesterov;
    mp_loss_scaling scaling;
    bool cosine, clip, stochastic;
    float max_scale; /* the loss scaler's upper bound (0: none) */
} compile_spec;

static void compile(mp_model *m, const compile_spec *c)
{
    mp_compile_options co = mp_compile_options_default();
    co.optimizer = mp_optimizer_config_default(c->kind);
    co.optimizer.learning_rate = c->kind == MP_OPTIMIZER_SGD ? 0.05f : 3e-3f;
    co.optimizer.momentum = c->momentum;
    co.optimizer.nesterov = c->nesterov;
    if (c->cosine) {
        co.optimizer.schedule.decay = MP_LR_COSINE;
        co.optimizer.schedule.decay_steps = 20;
        co.optimizer.schedule.final_lr = 1e-4f;
        co.optimizer.schedule.warmup_steps = 2;
    }
    if (c->clip) co.optimizer.clip_norm = 1.0f;
    if (c->stochastic) {
        co.optimizer.rounding = MP_ROUND_STOCHASTIC;
        co.optimizer.seed = 77;
    }
    co.loss_scaling = c->scaling;
    if (c->scaling == MP_LOSS_SCALING_STATIC)
        co.scaler = mp_loss_scaler_config_static(128.0f);
    else
        co.scaler.growth_interval = 3; /* so that the counter moves in a few steps */
    co.scaler.max_scale = c->max_scale;
    check(mp_model_compile(m, &co), "compile");
}

/* 3 classes in 4 dimensions, class c shifts feature c. */
static mp_dataset *data(int64_t n)
{
    float *x = xmalloc((size_t)n * 4 * sizeof *x);
    int32_t *y = xmalloc((size_t)n * sizeof *y);
    uint64_t s = 99;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        y[i] = (int32_t)((s >> 33) % 3);
        for (int j = 0; j < 4; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            x[i * 4 + j] = (float)((j == y[i] ? 1.5 : 0.0) + (double)(s >> 40) / (1 << 24) - 0.5);
        }
    }
    mp_dataset *ds;
    check(mp_dataset_from_arrays(x, y, n, 4, 3, &ds), "dataset");
    free(x);
    free(y);
    return ds;
}

/* A few steps of a fit that writes no checkpoint of its own. */
static void train(mp_model *m, mp_dataset *ds, int64_t steps)
{
    mp_fit_options fo = mp_fit_options_default();
    fo.batch_size = 8;
    fo.epochs = 2;
    fo.max_steps = steps;
    fo.seed = 3;
    fo.verbose = 0;
    check(mp_model_fit(m, ds, &fo, NULL), "fit");
}

/* Steps on token ids: label = first id mod 3 (per_sample 1), or every
 * position labelled with its own id (per_sample 3: a sequence model). */
static void train_tokens(mp_model *m, int64_t steps, int per_sample)
{
    int32_t ids[8 * 3], labels[8 * 3];
    uint64_t s = 7;
    for (int64_t k = 0; k < steps; k++) {
        for (int i = 0; i < 8 * 3; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)((s >> 33) % 5);
        }
        for (int i = 0; i < 8 * per_sample; i++)
            labels[i] = per_sample == 1 ? ids[i * 3] % 3 : ids[i];
        mp_tensor x;
        check(mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){8, 3}, ids), "ids");
        mp_step_result r;
        check(mp_model_train_step(m, &x, labels, NULL, &r), "train step");
    }
}

static void save_ckpt(const char *policy, arch a, const compile_spec *c, const char *name)
{
    mp_dataset *ds = data(24);
    mp_model *m = tiny(policy, a);
    if (c) {
        compile(m, c);
        if (a == ARCH_TOKENS || a == ARCH_GPT)
            train_tokens(m, 4, a == ARCH_GPT ? 3 : 1);
        else
            train(m, ds, 4);
    }
    const char *p = path_in(corpus_dir, name);
    check(mp_model_save_checkpoint(m, p, NULL), name);
    mp_set_global_policy("float32");
    verify(p, name);
    mp_model_free(m);
    mp_dataset_free(ds);
}

static void fix_times(const char *name);

/* A fit that writes its own checkpoint when it stops (mid-epoch, after
 * complete epochs, so that mixprec.fit has a history and a position). */
static void save_fit(const char *policy, arch a, const compile_spec *c, const char *name)
{
    mp_dataset *ds = data(30); /* 24 for training: 3 batches an epoch */
    mp_model *m = tiny(policy, a);
    compile(m, c);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/fit", tmp_dir);
    mp_fit_options fo = mp_fit_options_default();
    fo.batch_size = 8;
    fo.epochs = 4;
    fo.max_steps = 7;
    fo.validation_split = 0.2;
    fo.seed = 5;
    fo.verbose = 0;
    fo.patience = 3;
    fo.checkpoint_dir = dir;
    check(mp_model_fit(m, ds, &fo, NULL), "fit with checkpoints");
    char src[600];
    check(mp_checkpoint_latest(dir, src, sizeof src), "latest checkpoint");
    const char *p = path_in(corpus_dir, name);
    if (rename(src, p) != 0) {
        perror(p);
        exit(2);
    }
    rmdir(dir);
    mp_set_global_policy("float32");
    fix_times(name);
    mp_model_free(m);
    mp_dataset_free(ds);
}

static void save_weights(const char *policy, arch a, const char *name)
{
    mp_model *m = tiny(policy, a);
    const char *p = path_in(corpus_dir, name);
    check(mp_model_save_weights(m, p), name);
    mp_set_global_policy("float32");
    verify(p, name);
    mp_model_free(m);
}

/* ------------------------------------------------ files as editable documents */

#define DOC_MAX 64

/* A safetensors file's tensors (data owned) and metadata, to be changed
 * and written again. */
typedef struct {
    int nt, nm;
    mp_named_tensor t[DOC_MAX];
    char *names[DOC_MAX];
    void *owned[DOC_MAX];
    char *mk[DOC_MAX], *mv[DOC_MAX];
} doc;

static const char *const meta_keys[] = {"format",           "mixprec_version",
                                        "mixprec.config",   "mixprec.global_policy",
                                        "mixprec.training", "mixprec.fit"};

static size_t tensor_bytes(const mp_named_tensor *t)
{
    size_t n = mp_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

static void doc_load(doc *d, const char *path)
{
    memset(d, 0, sizeof *d);
    mp_safetensors *f;
    check(mp_safetensors_read(path, &f), path);
    for (int i = 0; i < mp_safetensors_count(f); i++) {
        const mp_named_tensor *t = mp_safetensors_tensor(f, i);
        d->t[d->nt] = *t;
        d->names[d->nt] = xstrdup(t->name);
        d->owned[d->nt] = xmalloc(tensor_bytes(t));
        memcpy(d->owned[d->nt], t->data, tensor_bytes(t));
        d->t[d->nt].name = d->names[d->nt];
        d->t[d->nt].data = d->owned[d->nt];
        d->nt++;
    }
    for (size_t k = 0; k < sizeof meta_keys / sizeof meta_keys[0]; k++) {
        const char *v = mp_safetensors_metadata(f, meta_keys[k]);
        if (!v) continue;
        d->mk[d->nm] = xstrdup(meta_keys[k]);
        d->mv[d->nm] = xstrdup(v);
        d->nm++;
    }
    mp_safetensors_free(f);
}

static void doc_free(doc *d)
{
    for (int i = 0; i < d->nt; i++) {
        free(d->names[i]);
        free(d->owned[i]);
    }
    for (int i = 0; i < d->nm; i++) {
        free(d->mk[i]);
        free(d->mv[i]);
    }
    memset(d, 0, sizeof *d);
}

static int doc_find(const doc *d, const char *name)
{
    for (int i = 0; i < d->nt; i++)
        if (!strcmp(d->t[i].name, name)) return i;
    fprintf(stderr, "make_corpus: no tensor '%s'\n", name);
    exit(2);
}

static void doc_remove(doc *d, const char *name)
{
    int i = doc_find(d, name);
    free(d->names[i]);
    free(d->owned[i]);
    for (int j = i; j + 1 < d->nt; j++) {
        d->t[j] = d->t[j + 1];
        d->names[j] = d->names[j + 1];
        d->owned[j] = d->owned[j + 1];
    }
    d->nt--;
}

static void doc_add(doc *d, const char *name, mp_dtype dt, int ndim, const int64_t *shape,
                    const void *data)
{
    mp_named_tensor *t = &d->t[d->nt];
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    d->names[d->nt] = xstrdup(name);
    d->owned[d->nt] = xmalloc(tensor_bytes(t));
    memcpy(d->owned[d->nt], data, tensor_bytes(t));
    t->name = d->names[d->nt];
    t->data = d->owned[d->nt];
    d->nt++;
}

/* Convert tensor i to another dtype (values as mp_convert rounds them). */
static void doc_retype(doc *d, int i, mp_dtype to)
{
    mp_named_tensor *t = &d->t[i];
    size_t n = tensor_bytes(t) / mp_dtype_size(t->dtype);
    void *x = xmalloc(n * mp_dtype_size(to));
    mp_convert(x, to, t->data, t->dtype, n);
    free(d->owned[i]);
    d->owned[i] = x;
    t->data = x;
    t->dtype = to;
}

static float *doc_f32(doc *d, const char *name)
{
    int i = doc_find(d, name);
    if (d->t[i].dtype != MP_F32) {
        fprintf(stderr, "make_corpus: '%s' is not float32\n", name);
        exit(2);
    }
    return d->owned[i];
}

static const char *doc_meta(const doc *d, const char *key)
{
    for (int i = 0; i < d->nm; i++)
        if (!strcmp(d->mk[i], key)) return d->mv[i];
    return NULL;
}

static void doc_set_meta(doc *d, const char *key, const char *value)
{
    for (int i = 0; i < d->nm; i++)
        if (!strcmp(d->mk[i], key)) {
            free(d->mv[i]);
            d->mv[i] = xstrdup(value);
            return;
        }
    d->mk[d->nm] = xstrdup(key);
    d->mv[d->nm] = xstrdup(value);
    d->nm++;
}

static json_t *doc_json(const doc *d, const char *key)
{
    json_error_t je;
    const char *text = doc_meta(d, key);
    json_t *j = text ? json_loads(text, 0, &je) : NULL;
    if (!j) {
        fprintf(stderr, "make_corpus: metadata '%s' missing or not JSON\n", key);
        exit(2);
    }
    return j;
}

/* Takes the reference to j. */
static void doc_set_json(doc *d, const char *key, json_t *j)
{
    char *text = json_dumps(j, JSON_COMPACT);
    if (!text) {
        fprintf(stderr, "make_corpus: cannot encode '%s'\n", key);
        exit(2);
    }
    doc_set_meta(d, key, text);
    free(text);
    json_decref(j);
}

static void doc_write(const doc *d, const char *dir, const char *name)
{
    const char *p = path_in(dir, name);
    check(mp_safetensors_write(p, d->t, d->nt, (const char *const *)d->mk,
                               (const char *const *)d->mv, d->nm),
          name);
    verify(p, name);
}

/* A fit's timings made fixed, so that the file's bytes are reproducible. */
static void fix_times(const char *name)
{
    doc d;
    doc_load(&d, path_in(corpus_dir, name));
    json_t *fit = doc_json(&d, "mixprec.fit"), *e;
    size_t i;
    json_object_set_new(fit, "seconds", json_real(0.25));
    json_array_foreach(json_object_get(fit, "history"), i, e)
    {
        json_object_set_new(e, "seconds", json_real(0.5));
        json_object_set_new(e, "ms_per_step", json_real(1.5));
    }
    doc_set_json(&d, "mixprec.fit", fit);
    doc_write(&d, corpus_dir, name);
    doc_free(&d);
}

/* ------------------------------------------------------------ raw files */

/* 8-byte little-endian length (claimed), header bytes, data bytes. */
static void write_raw_n(const char *dir, const char *name, uint64_t claimed, const char *header,
                        size_t hlen, const void *data, size_t dlen)
{
    const char *p = path_in(dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) {
        perror(p);
        exit(2);
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(claimed >> (8 * i));
    fwrite(len8, 1, 8, f);
    if (hlen) fwrite(header, 1, hlen, f);
    if (dlen) fwrite(data, 1, dlen, f);
    if (fclose(f) != 0) {
        perror(p);
        exit(2);
    }
    verify(p, name);
}

/* A header that tells its own length. */
static void write_raw(const char *dir, const char *name, const char *header, const void *data,
                      size_t dlen)
{
    write_raw_n(dir, name, strlen(header), header, strlen(header), data, dlen);
}

/* The bytes of a whole file. */
static void write_bytes(const char *dir, const char *name, const void *bytes, size_t n)
{
    const char *p = path_in(dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || (n && fwrite(bytes, 1, n, f) != n) || fclose(f) != 0) {
        perror(p);
        exit(2);
    }
    verify(p, name);
}

/* ------------------------------------------------------------ the seeds */

static void write_seeds(void)
{
    const compile_spec adam = {
        MP_OPTIMIZER_ADAM, 0, false, MP_LOSS_SCALING_AUTO, false, false, false, 0};
    const compile_spec sgd_nesterov = {
        MP_OPTIMIZER_SGD, 0.9f, true, MP_LOSS_SCALING_AUTO, true, true, false, 0};
    const compile_spec sgd_momentum = {
        MP_OPTIMIZER_SGD, 0.9f, false, MP_LOSS_SCALING_AUTO, false, false, false, 0};
    const compile_spec sgd_plain = {
        MP_OPTIMIZER_SGD, 0.0f, false, MP_LOSS_SCALING_DYNAMIC, false, false, true, 0};
    const compile_spec sgd_static = {
        MP_OPTIMIZER_SGD, 0.5f, false, MP_LOSS_SCALING_STATIC, false, true, false, 0};
    const compile_spec adamw_stochastic = {
        MP_OPTIMIZER_ADAMW, 0, false, MP_LOSS_SCALING_NONE, true, false, true, 0};

    save_ckpt("float32", ARCH_MLP, &adam, "valid-ckpt-float32-adam");
    save_ckpt("float32", ARCH_MLP, &sgd_nesterov, "valid-ckpt-float32-sgd-nesterov-cosine-clip");
    save_ckpt("mixed_float16", ARCH_MLP, &adam, "valid-ckpt-mixed_float16-adam-dynamic-scaler");
    save_ckpt("mixed_float16", ARCH_RESIDUAL, &sgd_static,
              "valid-ckpt-mixed_float16-residual-sgd-static-scaler");
    save_ckpt("bfloat16", ARCH_MLP, &adamw_stochastic, "valid-ckpt-bfloat16-adamw-stochastic");
    save_ckpt("mixed_bfloat16", ARCH_RESIDUAL, &adam, "valid-ckpt-mixed_bfloat16-residual-adam");
    save_ckpt("float16", ARCH_MLP, &sgd_plain, "valid-ckpt-float16-sgd-dynamic-scaler");
    save_ckpt("float32", ARCH_FLATTEN, &adam, "valid-ckpt-float32-flatten-adam");
    save_ckpt("float32", ARCH_MLP, NULL, "valid-ckpt-float32-uncompiled");
    /* version-2 configurations: non-trainable state, views, many inputs,
     * initializer overrides, int32 inputs */
    save_ckpt("mixed_bfloat16", ARCH_NORM, &adam, "valid-ckpt-mixed_bfloat16-batchnorm-adam");
    save_ckpt("float16", ARCH_NORM, &sgd_plain, "valid-ckpt-float16-batchnorm-sgd-scaler");
    save_ckpt("mixed_float16", ARCH_VIEWS, &sgd_static,
              "valid-ckpt-mixed_float16-reshape-add3-sgd-static");
    save_ckpt("mixed_bfloat16", ARCH_TOKENS, &adam, "valid-ckpt-mixed_bfloat16-embedding-adam");
    save_ckpt("mixed_float16", ARCH_CNN, &adam, "valid-ckpt-mixed_float16-cnn-adam");
    save_ckpt("mixed_bfloat16", ARCH_GPT, &adam, "valid-ckpt-mixed_bfloat16-gpt-tied-adam");
    /* float8 state (amax histories and scales), with short histories */
    mp_float8_params f8 = mp_float8_params_default();
    f8.amax_history_len = 4;
    check(mp_set_global_float8_params(&f8), "float8 params");
    save_ckpt("mixed_float8", ARCH_VIEWS, &adam, "valid-ckpt-mixed_float8-views-adam");
    f8 = mp_float8_params_default();
    check(mp_set_global_float8_params(&f8), "float8 params");
    /* the largest float a setting can have must survive its JSON round trip */
    const compile_spec flt_max = {
        MP_OPTIMIZER_ADAM, 0, false, MP_LOSS_SCALING_DYNAMIC, false, false, false, FLT_MAX};
    save_ckpt("float32", ARCH_MLP, &flt_max, "valid-ckpt-float32-adam-scaler-max-flt-max");

    save_fit("float32", ARCH_MLP, &adam, "valid-fit-float32-adam");
    save_fit("mixed_float16", ARCH_MLP, &sgd_momentum, "valid-fit-mixed_float16-sgd-momentum");
    save_fit("mixed_bfloat16", ARCH_RESIDUAL, &adamw_stochastic,
             "valid-fit-mixed_bfloat16-residual-adamw");
    save_fit("float32", ARCH_NORM, &sgd_momentum, "valid-fit-float32-batchnorm-sgd-momentum");

    save_weights("float32", ARCH_MLP, "valid-weights-float32");
    save_weights("mixed_bfloat16", ARCH_RESIDUAL, "valid-weights-mixed_bfloat16-residual");
    save_weights("bfloat16", ARCH_MLP, "valid-weights-bfloat16");
    save_weights("float32", ARCH_FLATTEN, "valid-weights-float32-flatten");
    save_weights("float32", ARCH_TOKENS, "valid-weights-float32-embedding");
    save_weights("mixed_bfloat16", ARCH_NORM, "valid-weights-mixed_bfloat16-batchnorm");
    save_weights("float32", ARCH_CNN, "valid-weights-float32-cnn");

    /* hand-made variations that must still load */
    doc d;
    const char *weights = path_in(corpus_dir, "valid-weights-float32");
    doc_load(&d, weights);
    for (int i = 0; i < d.nt; i++) doc_retype(&d, i, MP_F16);
    doc_write(&d, corpus_dir, "valid-hand-weights-as-float16");
    doc_free(&d);

    doc_load(&d, weights);
    for (int i = 0; i < d.nt; i++) doc_retype(&d, i, i % 2 ? MP_F8E4M3 : MP_F8E5M2);
    doc_write(&d, corpus_dir, "valid-hand-weights-as-float8");
    doc_free(&d);

    doc_load(&d, path_in(corpus_dir, "valid-ckpt-float32-adam"));
    float extra[2] = {1, 2};
    doc_add(&d, "zzz.unused", MP_F32, 1, (int64_t[]){2}, extra);
    doc_add(&d, "empty", MP_BF16, 2, (int64_t[]){0, 3}, extra);
    doc_set_meta(&d, "note", "extra tensors and metadata are ignored");
    doc_write(&d, corpus_dir, "valid-hand-extra-tensors-and-metadata");
    doc_free(&d);

    /* a fit state at the start of its first epoch, no history */
    doc_load(&d, path_in(corpus_dir, "valid-fit-float32-adam"));
    json_t *fit = doc_json(&d, "mixprec.fit");
    json_object_set_new(fit, "epoch", json_integer(0));
    json_object_set_new(fit, "batch", json_integer(0));
    json_object_set_new(fit, "steps", json_integer(0));
    json_object_set_new(fit, "history", json_array());
    json_object_set_new(fit, "best", json_null());
    json_object_set_new(fit, "loss_sum", json_real(0));
    json_object_set_new(fit, "loss_samples", json_integer(0));
    json_object_set_new(fit, "samples", json_integer(0));
    json_object_set_new(fit, "correct", json_integer(0));
    doc_set_json(&d, "mixprec.fit", fit);
    doc_write(&d, corpus_dir, "valid-hand-fit-at-start");
    doc_free(&d);

    /* the header unpadded and indented, the tensors' data in reverse order */
    doc_load(&d, weights);
    json_t *root = json_object(), *meta = json_object();
    for (int i = 0; i < d.nm; i++) json_object_set_new(meta, d.mk[i], json_string(d.mv[i]));
    size_t total = 0;
    for (int i = 0; i < d.nt; i++) total += tensor_bytes(&d.t[i]);
    uint8_t *bytes = xmalloc(total);
    size_t end = total;
    for (int i = 0; i < d.nt; i++) {
        size_t b = tensor_bytes(&d.t[i]);
        end -= b;
        memcpy(bytes + end, d.t[i].data, b);
        json_t *shape = json_array();
        for (int k = 0; k < d.t[i].ndim; k++)
            json_array_append_new(shape, json_integer(d.t[i].shape[k]));
        json_object_set_new(root, d.t[i].name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape,
                                      "data_offsets", (json_int_t)end, (json_int_t)(end + b)));
    }
    json_object_set_new(root, "__metadata__", meta);
    char *hdr = json_dumps(root, JSON_INDENT(1));
    json_decref(root);
    size_t hl = strlen(hdr);
    if (hl % 8 == 0) hdr[--hl] = '\0'; /* make sure it is not padded */
    write_raw(corpus_dir, "valid-hand-unpadded-reordered", hdr, bytes, total);
    free(hdr);
    free(bytes);
    doc_free(&d);
}

/* --------------------------------------------------------- hostile files */

static void bad_headers(void)
{
    const char *R = regress_dir;
    uint8_t zeros[64] = {0};
    const char *ok = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    write_bytes(R, "bad-file-empty", "", 0);
    write_bytes(R, "bad-file-seven-bytes", "\x02\0\0\0\0\0\0", 7);
    write_raw_n(R, "bad-header-len-huge", UINT64_MAX, ok, strlen(ok), zeros, 8);
    write_raw_n(R, "bad-header-len-2pow63", (uint64_t)1 << 63, ok, strlen(ok), zeros, 8);
    write_raw_n(R, "bad-header-len-100MiB-plus-1", ((uint64_t)100 << 20) + 1, ok, strlen(ok), zeros,
                8);
    write_raw_n(R, "bad-header-len-zero", 0, ok, strlen(ok), zeros, 8);
    write_raw_n(R, "bad-header-len-one", 1, ok, strlen(ok), zeros, 8);
    write_raw_n(R, "bad-header-len-past-end", strlen(ok) + 9, ok, strlen(ok), zeros, 8);
    write_raw_n(R, "bad-header-len-short", strlen(ok) - 1, ok, strlen(ok), zeros, 8);
    write_raw(R, "bad-json-not-object-array", "[1,2,3]", NULL, 0);
    write_raw(R, "bad-json-not-object-string", "\"x\"", NULL, 0);
    write_raw(R, "bad-json-not-object-null", "null", NULL, 0);
    write_raw(R, "bad-json-truncated", "{\"x\":{\"dtype\":", NULL, 0);
    write_raw_n(R, "bad-json-nul-byte", 10, "{\"a\0\":{}} ", 10, NULL, 0);
    write_raw(R, "bad-json-nul-escape", "{\"a\\u0000\":1}", NULL, 0);
    write_raw(R, "bad-json-invalid-utf8", "{\"\xff\xfe\":{}}", NULL, 0);
    char deep[4097];
    memset(deep, '[', 4096);
    deep[4096] = '\0';
    write_raw(R, "bad-json-deep-nesting", deep, NULL, 0);
    write_raw(R, "bad-duplicate-tensor-names",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
              zeros, 8);
    write_raw(R, "bad-duplicate-metadata",
              "{\"__metadata__\":{\"a\":\"1\"},\"__metadata__\":{\"a\":\"2\"}}", NULL, 0);
    write_raw(R, "bad-duplicate-metadata-keys", "{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}",
              NULL, 0);
    write_raw(R, "bad-offsets-overlapping",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
              zeros, 8);
    write_raw(R, "bad-offsets-same-range",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
              zeros, 8);
    write_raw(R, "bad-offsets-out-of-bounds",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", zeros, 8);
    write_raw(R, "bad-offsets-huge",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[9223372036854775799,"
              "9223372036854775807]}}",
              zeros, 8);
    write_raw(R, "bad-offsets-reversed",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", zeros, 8);
    write_raw(R, "bad-offsets-negative",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", zeros, 8);
    write_raw(R, "bad-offsets-real",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0.0,8.0]}}", zeros, 8);
    write_raw(R, "bad-offsets-three",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,16]}}", zeros, 8);
    write_raw(R, "bad-offsets-gap",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", zeros, 8);
    write_raw(R, "bad-offsets-missing", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2]}}", zeros, 8);
    write_raw(R, "bad-trailing-data", ok, zeros, 12);
    write_raw(R, "bad-shape-overflow",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4611686018427387904],"
              "\"data_offsets\":[0,8]}}",
              zeros, 8);
    write_raw(R, "bad-shape-overflow-to-size",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,1073741824],"
              "\"data_offsets\":[0,0]}}",
              NULL, 0);
    write_raw(R, "bad-shape-negative",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", zeros, 8);
    write_raw(R, "bad-shape-nine-dims",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}",
              zeros, 8);
    write_raw(R, "bad-shape-real",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", zeros, 8);
    write_raw(R, "bad-shape-not-array",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", zeros, 8);
    write_raw(R, "bad-dtype-unknown",
              "{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", zeros, 8);
    write_raw(R, "bad-dtype-not-string",
              "{\"x\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", zeros, 8);
    write_raw(R, "bad-tensor-not-object", "{\"x\":5}", NULL, 0);
    write_raw(R, "bad-metadata-not-string", "{\"__metadata__\":{\"k\":1}}", NULL, 0);
    write_raw(R, "bad-metadata-not-object", "{\"__metadata__\":[\"k\"]}", NULL, 0);
    /* a valid safetensors file that is not a mixprec model */
    write_raw(R, "bad-no-config", ok, zeros, 8);
    write_raw(R, "bad-no-config-empty", "{}", NULL, 0);
}

/* A copy of a corpus file with one metadata document changed by `edit`. */
typedef void (*json_edit)(json_t *root);

static void edit_meta(const char *base, const char *key, json_edit edit, const char *name)
{
    doc d;
    doc_load(&d, path_in(corpus_dir, base));
    json_t *j = doc_json(&d, key);
    edit(j);
    doc_set_json(&d, key, j);
    doc_write(&d, regress_dir, name);
    doc_free(&d);
}

static void set_meta_text(const char *base, const char *key, const char *text, const char *name)
{
    doc d;
    doc_load(&d, path_in(corpus_dir, base));
    doc_set_meta(&d, key, text);
    doc_write(&d, regress_dir, name);
    doc_free(&d);
}

static json_t *layer(json_t *cfg, size_t i)
{
    return json_array_get(json_object_get(cfg, "layers"), i);
}

static json_t *layer_named(json_t *cfg, const char *name)
{
    size_t i;
    json_t *l;
    json_array_foreach(json_object_get(cfg, "layers"), i, l)
    {
        if (!strcmp(json_string_value(json_object_get(l, "name")), name)) return l;
    }
    fprintf(stderr, "make_corpus: no layer '%s'\n", name);
    exit(2);
}

/* The residual model's layers: input_1, dense, dropout, add, layer_normalization,
 * dense_1, activation. */
static void cfg_huge_units(json_t *c)
{
    json_object_set_new(layer(c, 1), "units", json_integer(1000000000));
}
static void cfg_max_width_units(json_t *c)
{
    json_object_set_new(layer(c, 1), "units", json_integer((json_int_t)1 << 26));
}
static void cfg_zero_units(json_t *c)
{
    json_object_set_new(layer(c, 1), "units", json_integer(0));
}
static void cfg_negative_units(json_t *c)
{
    json_object_set_new(layer(c, 1), "units", json_integer(-3));
}
static void cfg_input_later_layer(json_t *c)
{
    json_t *in = json_pack("[s]", "layer_normalization");
    json_object_set_new(layer_named(c, "dense"), "inputs", in);
}
static void cfg_input_self(json_t *c)
{
    json_object_set_new(layer_named(c, "dense"), "inputs", json_pack("[s]", "dense"));
}
static void cfg_input_unknown(json_t *c)
{
    json_object_set_new(layer_named(c, "dense"), "inputs", json_pack("[s]", "nowhere"));
}
static void cfg_input_not_string(json_t *c)
{
    json_object_set_new(layer_named(c, "dense"), "inputs", json_pack("[i]", 0));
}
static void cfg_input_count(json_t *c)
{
    json_object_set_new(layer_named(c, "add"), "inputs", json_pack("[s]", "input_1"));
}
static void cfg_input_on_input_layer(json_t *c)
{
    json_object_set_new(layer_named(c, "input_1"), "inputs", json_pack("[s]", "dense"));
}
static void cfg_unknown_class(json_t *c)
{
    json_object_set_new(layer_named(c, "dropout"), "class_name", json_string("Conv2D"));
}
static void cfg_no_layers(json_t *c) { json_object_set_new(c, "layers", json_array()); }
static void cfg_layers_not_array(json_t *c) { json_object_set_new(c, "layers", json_object()); }
static void cfg_layer_not_object(json_t *c)
{
    json_array_set_new(json_object_get(c, "layers"), 2, json_string("dropout"));
}
static void cfg_output_unknown(json_t *c) { json_object_set_new(c, "output", json_string("nope")); }
static void cfg_output_not_string(json_t *c) { json_object_set_new(c, "output", json_integer(4)); }
static void cfg_output_mid(json_t *c) { json_object_set_new(c, "output", json_string("add")); }
static void cfg_two_inputs(json_t *c)
{
    json_t *in2 = json_deep_copy(layer_named(c, "input_1"));
    json_object_set_new(in2, "name", json_string("input_2"));
    json_array_insert_new(json_object_get(c, "layers"), 1, in2);
    json_object_set_new(layer_named(c, "add"), "inputs", json_pack("[s, s]", "input_1", "input_2"));
}
static void cfg_add_shape_mismatch(json_t *c)
{
    json_object_set_new(layer_named(c, "dense"), "units", json_integer(5));
}
static void cfg_huge_input(json_t *c)
{
    json_object_set_new(layer_named(c, "input_1"), "shape",
                        json_pack("[I, i]", (json_int_t)1 << 26, 2));
}
static void cfg_input_overflow(json_t *c)
{
    json_object_set_new(
        layer_named(c, "input_1"), "shape",
        json_pack("[I, I, I]", (json_int_t)1 << 40, (json_int_t)1 << 40, (json_int_t)1 << 40));
}
static void cfg_input_zero(json_t *c)
{
    json_object_set_new(layer_named(c, "input_1"), "shape", json_pack("[i]", 0));
}
static void cfg_input_eight_dims(json_t *c)
{
    json_object_set_new(layer_named(c, "input_1"), "shape",
                        json_pack("[i, i, i, i, i, i, i, i]", 1, 1, 1, 1, 1, 1, 1, 4));
}
static void cfg_input_no_shape(json_t *c) { json_object_del(layer_named(c, "input_1"), "shape"); }
/* a wide input, no parameters: only the activation bound stops it */
static void cfg_activation_flood(json_t *c)
{
    json_t *ls = json_array();
    json_array_append_new(ls, json_pack("{s:s, s:s, s:s, s:s, s:[], s:[I]}", "class_name",
                                        "InputLayer", "name", "in", "policy", "float32", "seed",
                                        "0x1", "inputs", "shape", (json_int_t)1 << 26));
    const char *prev = "in";
    char names[8][8];
    for (int i = 0; i < 8; i++) {
        snprintf(names[i], sizeof names[i], "a%d", i);
        json_array_append_new(ls, json_pack("{s:s, s:s, s:s, s:s, s:[s], s:s}", "class_name",
                                            "Activation", "name", names[i], "policy", "float32",
                                            "seed", "0x1", "inputs", prev, "activation", "relu"));
        prev = names[i];
    }
    json_object_set_new(c, "layers", ls);
    json_object_set_new(c, "output", json_string(prev));
}
static void cfg_duplicate_names(json_t *c)
{
    json_object_set_new(layer_named(c, "dropout"), "name", json_string("dense"));
}
static void cfg_bad_policy(json_t *c)
{
    json_object_set_new(layer_named(c, "dense"), "policy", json_string("mixed_float64"));
}
static void cfg_long_name(json_t *c)
{
    char name[81];
    memset(name, 'n', 80);
    name[80] = '\0';
    json_object_set_new(layer_named(c, "dropout"), "name", json_string(name));
    json_object_set_new(layer_named(c, "add"), "inputs", json_pack("[s, s]", "input_1", name));
}
static void cfg_empty_name(json_t *c)
{
    json_object_set_new(layer_named(c, "dropout"), "name", json_string(""));
    json_object_set_new(layer_named(c, "add"), "inputs", json_pack("[s, s]", "input_1", ""));
}
static void cfg_dropout_one(json_t *c)
{
    json_object_set_new(layer_named(c, "dropout"), "rate", json_real(1.0));
}
static void cfg_dropout_negative(json_t *c)
{
    json_object_set_new(layer_named(c, "dropout"), "rate", json_real(-0.5));
}
static void cfg_dropout_string(json_t *c)
{
    json_object_set_new(layer_named(c, "dropout"), "rate", json_string("0.5"));
}
static void cfg_norm_eps_negative(json_t *c)
{
    json_object_set_new(layer_named(c, "layer_normalization"), "epsilon", json_real(-1e-3));
}
static void cfg_norm_eps_zero(json_t *c)
{
    json_object_set_new(layer_named(c, "layer_normalization"), "epsilon", json_real(0));
}
static void cfg_seed_not_hex(json_t *c) { json_object_set_new(c, "seed", json_string("1234")); }
static void cfg_seed_long(json_t *c)
{
    json_object_set_new(layer_named(c, "dense"), "seed", json_string("0x0123456789abcdef0"));
}
static void cfg_seed_junk(json_t *c)
{
    json_object_set_new(layer_named(c, "dense"), "seed", json_string("0x12zz"));
}
static void cfg_seed_negative(json_t *c) { json_object_set_new(c, "seed", json_string("0x-1")); }
static void cfg_seed_double_prefix(json_t *c)
{
    json_object_set_new(layer_named(c, "dense"), "seed", json_string("0x0x5"));
}
static void cfg_seed_space(json_t *c)
{
    json_object_set_new(layer_named(c, "dense"), "seed", json_string("0x 5"));
}
static void cfg_version(json_t *c) { json_object_set_new(c, "version", json_integer(3)); }
static void cfg_format(json_t *c) { json_object_set_new(c, "format", json_string("keras")); }
static void cfg_activation_unknown(json_t *c)
{
    json_object_set_new(layer_named(c, "dense"), "activation", json_string("swish9"));
}
static void cfg_model_policy(json_t *c)
{
    json_object_set_new(c, "policy", json_string("float64"));
}
static void cfg_unknown_field(json_t *c)
{
    json_object_set_new(layer_named(c, "dense"), "unit", json_integer(4));
}
static void cfg_initializer(json_t *c)
{
    json_object_set_new(layer_named(c, "dense"), "kernel_initializer", json_string("normal"));
}
static void cfg_input_float16(json_t *c)
{
    json_object_set_new(layer_named(c, "input_1"), "dtype", json_string("float16"));
}
static void cfg_input_int32(json_t *c) /* int32 data into a Dense */
{
    json_object_set_new(layer_named(c, "input_1"), "dtype", json_string("int32"));
}
static void cfg_reshape_mismatch(json_t *c)
{
    json_t *r = json_pack("{s:s, s:s, s:[s], s:[i, i]}", "class_name", "Reshape", "name", "r",
                          "inputs", "input_1", "target_shape", 3, 3);
    json_array_insert_new(json_object_get(c, "layers"), 1, r);
}
static void cfg_batch_norm_momentum(json_t *c)
{
    json_t *r = json_pack("{s:s, s:s, s:[s], s:f}", "class_name", "BatchNormalization", "name",
                          "bn", "inputs", "input_1", "momentum", 1.0);
    json_array_insert_new(json_object_get(c, "layers"), 1, r);
}
static void cfg_embedding_zero(json_t *c)
{
    json_t *l = layer_named(c, "input_1");
    json_object_set_new(l, "dtype", json_string("int32"));
    json_t *r = json_pack("{s:s, s:s, s:[s], s:i, s:i}", "class_name", "Embedding", "name", "emb",
                          "inputs", "input_1", "input_dim", 5, "output_dim", 0);
    json_array_insert_new(json_object_get(c, "layers"), 1, r);
}
static void cfg_not_object(json_t *c)
{
    json_object_clear(c);
    json_object_set_new(c, "format", json_integer(1));
}

static void bad_configs(void)
{
    const char *base = "valid-fit-mixed_bfloat16-residual-adamw", *k = "mixprec.config";
    static const struct {
        json_edit edit;
        const char *name;
    } edits[] = {
        {cfg_huge_units, "bad-config-units-1e9"},
        {cfg_max_width_units, "bad-config-units-2pow26-more-params-than-file"},
        {cfg_zero_units, "bad-config-units-zero"},
        {cfg_negative_units, "bad-config-units-negative"},
        {cfg_input_later_layer, "bad-config-input-is-a-later-layer"},
        {cfg_input_self, "bad-config-input-is-itself"},
        {cfg_input_unknown, "bad-config-input-unknown"},
        {cfg_input_not_string, "bad-config-input-not-a-string"},
        {cfg_input_count, "bad-config-add-with-one-input"},
        {cfg_input_on_input_layer, "bad-config-input-layer-with-input"},
        {cfg_unknown_class, "bad-config-unknown-class"},
        {cfg_no_layers, "bad-config-no-layers"},
        {cfg_layers_not_array, "bad-config-layers-not-array"},
        {cfg_layer_not_object, "bad-config-layer-not-object"},
        {cfg_output_unknown, "bad-config-output-unknown"},
        {cfg_output_not_string, "bad-config-output-not-a-string"},
        {cfg_two_inputs, "bad-config-two-inputs"},
        {cfg_add_shape_mismatch, "bad-config-add-shape-mismatch"},
        {cfg_huge_input, "bad-config-input-shape-huge"},
        {cfg_input_overflow, "bad-config-input-shape-overflow"},
        {cfg_input_zero, "bad-config-input-shape-zero"},
        {cfg_input_eight_dims, "bad-config-input-shape-eight-dims"},
        {cfg_input_no_shape, "bad-config-input-no-shape"},
        {cfg_activation_flood, "bad-config-activations-2pow29-per-sample"},
        {cfg_duplicate_names, "bad-config-duplicate-layer-names"},
        {cfg_bad_policy, "bad-config-policy-unknown"},
        {cfg_long_name, "bad-config-layer-name-80-chars"},
        {cfg_empty_name, "bad-config-layer-name-empty"},
        {cfg_dropout_one, "bad-config-dropout-rate-one"},
        {cfg_dropout_negative, "bad-config-dropout-rate-negative"},
        {cfg_dropout_string, "bad-config-dropout-rate-string"},
        {cfg_norm_eps_negative, "bad-config-layernorm-epsilon-negative"},
        {cfg_norm_eps_zero, "bad-config-layernorm-epsilon-zero"},
        {cfg_seed_not_hex, "bad-config-seed-not-hex"},
        {cfg_seed_long, "bad-config-seed-17-digits"},
        {cfg_seed_junk, "bad-config-seed-junk"},
        {cfg_seed_negative, "bad-config-seed-negative-hex"},
        {cfg_seed_double_prefix, "bad-config-seed-0x0x"},
        {cfg_seed_space, "bad-config-seed-space"},
        {cfg_version, "bad-config-version-3"},
        {cfg_format, "bad-config-format-keras"},
        {cfg_activation_unknown, "bad-config-activation-unknown"},
        {cfg_model_policy, "bad-config-model-policy-unknown"},
        {cfg_unknown_field, "bad-config-unknown-field"},
        {cfg_initializer, "bad-config-initializer-unknown"},
        {cfg_input_float16, "bad-config-input-dtype-float16"},
        {cfg_input_int32, "bad-config-int32-into-dense"},
        {cfg_reshape_mismatch, "bad-config-reshape-mismatch"},
        {cfg_batch_norm_momentum, "bad-config-batchnorm-momentum-one"},
        {cfg_embedding_zero, "bad-config-embedding-output-dim-zero"},
        {cfg_not_object, "bad-config-format-not-string"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++)
        edit_meta(base, k, edits[i].edit, edits[i].name);
    /* accepted: the layers after the output are unused (their weights still load) */
    edit_meta(base, k, cfg_output_mid, "edge-config-output-mid-model");
    set_meta_text(base, k, "{\"format\":", "bad-config-not-json");
    set_meta_text(base, k, "[\"mixprec.model\"]", "bad-config-array");
    set_meta_text(base, k, "", "bad-config-empty-string");
}

static json_t *opt_of(json_t *t)
{
    return json_object_get(json_object_get(t, "compile"), "optimizer");
}
static json_t *scaler_of(json_t *t) { return json_object_get(t, "loss_scaler"); }

static void tr_version(json_t *t) { json_object_set_new(t, "version", json_integer(2)); }
static void tr_optimizer_unknown(json_t *t)
{
    json_object_set_new(opt_of(t), "kind", json_string("lion"));
}
static void tr_optimizer_other(json_t *t)
{
    json_object_set_new(opt_of(t), "kind", json_string("sgd")); /* the slots are Adam's */
}
static void tr_lr_null(json_t *t) { json_object_set_new(opt_of(t), "learning_rate", json_null()); }
static void tr_lr_huge(json_t *t)
{
    json_object_set_new(opt_of(t), "learning_rate", json_real(1e39));
}
static void tr_lr_negative(json_t *t)
{
    json_object_set_new(opt_of(t), "learning_rate", json_real(-1));
}
static void tr_beta1_one(json_t *t) { json_object_set_new(opt_of(t), "beta1", json_real(1.0)); }
static void tr_beta2_negative(json_t *t)
{
    json_object_set_new(opt_of(t), "beta2", json_real(-0.5));
}
static void tr_epsilon_negative(json_t *t)
{
    json_object_set_new(opt_of(t), "epsilon", json_real(-1e-8));
}
static void tr_clip_both(json_t *t)
{
    json_object_set_new(opt_of(t), "clip_norm", json_real(1));
    json_object_set_new(opt_of(t), "clip_value", json_real(1));
}
static void tr_rounding(json_t *t)
{
    json_object_set_new(opt_of(t), "rounding", json_string("truncate"));
}
static void tr_decay(json_t *t)
{
    json_object_set_new(json_object_get(opt_of(t), "schedule"), "decay", json_integer(3));
}
static void tr_warmup_negative(json_t *t)
{
    json_object_set_new(json_object_get(opt_of(t), "schedule"), "warmup_steps", json_integer(-1));
}
static void tr_schedule_missing(json_t *t) { json_object_del(opt_of(t), "schedule"); }
static void tr_loss_unknown(json_t *t)
{
    json_object_set_new(json_object_get(t, "compile"), "loss", json_string("hinge"));
}
static void tr_scaling_unknown(json_t *t)
{
    json_object_set_new(json_object_get(t, "compile"), "loss_scaling", json_string("magic"));
}
static void tr_steps_negative(json_t *t)
{
    json_object_set_new(t, "optimizer_step", json_integer(-1));
}
static void tr_applied_real(json_t *t) { json_object_set_new(t, "steps_applied", json_real(3)); }
static void tr_forward_count(json_t *t)
{
    json_object_set_new(t, "forward_count", json_integer(7));
}
static void tr_seed_negative(json_t *t)
{
    json_object_set_new(opt_of(t), "seed", json_string("0x-1"));
}
static void tr_seed_plus(json_t *t) { json_object_set_new(opt_of(t), "seed", json_string("0x+5")); }
static void tr_forward_count_prefix(json_t *t)
{
    json_object_set_new(t, "forward_count", json_string("0x0x10"));
}
static void tr_not_object(json_t *t)
{
    json_object_clear(t);
    json_object_set_new(t, "version", json_integer(1));
}
static void tr_nesterov_no_momentum(json_t *t)
{
    json_object_set_new(opt_of(t), "momentum", json_real(0));
    json_object_set_new(opt_of(t), "nesterov", json_true());
}
static void tr_momentum_one(json_t *t) { json_object_set_new(opt_of(t), "momentum", json_real(1)); }
static void tr_counter_too_big(json_t *t)
{
    json_int_t gi = json_integer_value(
        json_object_get(json_object_get(scaler_of(t), "config"), "growth_interval"));
    json_object_set_new(scaler_of(t), "counter", json_integer(gi));
}
static void tr_counter_negative(json_t *t)
{
    json_object_set_new(scaler_of(t), "counter", json_integer(-1));
}
static void tr_scale_zero(json_t *t) { json_object_set_new(scaler_of(t), "scale", json_real(0)); }
static void tr_scale_negative(json_t *t)
{
    json_object_set_new(scaler_of(t), "scale", json_real(-128));
}
static void tr_scale_null(json_t *t) { json_object_set_new(scaler_of(t), "scale", json_null()); }
static void tr_scale_huge(json_t *t)
{
    json_object_set_new(scaler_of(t), "scale", json_real(1e300));
}
static void tr_growth_interval_zero(json_t *t)
{
    json_object_set_new(json_object_get(scaler_of(t), "config"), "growth_interval",
                        json_integer(0));
    json_object_set_new(scaler_of(t), "counter", json_integer(0));
}
static void tr_growth_factor_half(json_t *t)
{
    json_object_set_new(json_object_get(scaler_of(t), "config"), "growth_factor", json_real(0.5));
}
static void tr_max_scale_above_flt_max(json_t *t)
{
    json_object_set_new(json_object_get(scaler_of(t), "config"), "max_scale", json_real(3.5e38));
}
static void tr_mode_unknown(json_t *t)
{
    json_object_set_new(json_object_get(scaler_of(t), "config"), "mode", json_string("auto"));
}
static void tr_scaler_not_object(json_t *t)
{
    json_object_set_new(t, "loss_scaler", json_integer(1));
}
static void tr_scaler_missing_in_scaled_file(json_t *t)
{
    json_object_set_new(t, "loss_scaler", json_string("none"));
}

static void bad_training(void)
{
    const char *adam = "valid-fit-float32-adam", *scaled = "valid-fit-mixed_float16-sgd-momentum",
               *k = "mixprec.training";
    static const struct {
        json_edit edit;
        const char *base, *name;
    } edits[] = {
        {tr_version, NULL, "bad-training-version-2"},
        {tr_optimizer_unknown, NULL, "bad-training-optimizer-unknown"},
        {tr_lr_null, NULL, "bad-training-learning-rate-null"},
        {tr_lr_huge, NULL, "bad-training-learning-rate-1e39"},
        {tr_lr_negative, NULL, "bad-training-learning-rate-negative"},
        {tr_beta1_one, NULL, "bad-training-beta1-one"},
        {tr_beta2_negative, NULL, "bad-training-beta2-negative"},
        {tr_epsilon_negative, NULL, "bad-training-epsilon-negative"},
        {tr_clip_both, NULL, "bad-training-clip-norm-and-value"},
        {tr_rounding, NULL, "bad-training-rounding-unknown"},
        {tr_decay, NULL, "bad-training-schedule-decay-3"},
        {tr_warmup_negative, NULL, "bad-training-schedule-warmup-negative"},
        {tr_schedule_missing, NULL, "bad-training-schedule-missing"},
        {tr_loss_unknown, NULL, "bad-training-loss-unknown"},
        {tr_scaling_unknown, NULL, "bad-training-loss-scaling-unknown"},
        {tr_steps_negative, NULL, "bad-training-optimizer-step-negative"},
        {tr_applied_real, NULL, "bad-training-steps-applied-real"},
        {tr_forward_count, NULL, "bad-training-forward-count-not-hex"},
        {tr_seed_negative, NULL, "bad-training-seed-negative-hex"},
        {tr_seed_plus, NULL, "bad-training-seed-plus-hex"},
        {tr_forward_count_prefix, NULL, "bad-training-forward-count-0x0x"},
        {tr_not_object, NULL, "bad-training-version-only"},
        {tr_nesterov_no_momentum, "scaled", "bad-training-nesterov-without-momentum"},
        {tr_momentum_one, "scaled", "bad-training-momentum-one"},
        {tr_counter_too_big, "scaled", "bad-training-scaler-counter-at-growth-interval"},
        {tr_counter_negative, "scaled", "bad-training-scaler-counter-negative"},
        {tr_scale_zero, "scaled", "bad-training-scaler-scale-zero"},
        {tr_scale_negative, "scaled", "bad-training-scaler-scale-negative"},
        {tr_scale_null, "scaled", "bad-training-scaler-scale-inf"},
        {tr_scale_huge, "scaled", "bad-training-scaler-scale-1e300"},
        {tr_growth_interval_zero, "scaled", "bad-training-scaler-growth-interval-zero"},
        {tr_growth_factor_half, "scaled", "bad-training-scaler-growth-factor-half"},
        {tr_max_scale_above_flt_max, "scaled", "bad-training-scaler-max-scale-3.5e38"},
        {tr_mode_unknown, "scaled", "bad-training-scaler-mode-unknown"},
        {tr_scaler_not_object, "scaled", "bad-training-scaler-not-object"},
        {tr_scaler_missing_in_scaled_file, "scaled", "bad-training-scaler-string"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++)
        edit_meta(edits[i].base ? scaled : adam, k, edits[i].edit, edits[i].name);
    /* accepted: SGD without momentum keeps no state, Adam's slots are ignored */
    edit_meta(adam, k, tr_optimizer_other, "edge-training-sgd-ignores-adam-slots");
    set_meta_text(adam, k, "{\"version\":", "bad-training-not-json");
    set_meta_text(adam, k, "[1]", "bad-training-array");

    /* the optimizer's tensors */
    doc d;
    const char *slot = "optimizer/dense.kernel/exp_avg",
               *slot2 = "optimizer/dense.kernel/exp_avg_sq";
    doc_load(&d, path_in(corpus_dir, adam));
    doc_f32(&d, slot)[5] = NAN;
    doc_write(&d, regress_dir, "bad-training-exp-avg-nan");
    doc_free(&d);

    doc_load(&d, path_in(corpus_dir, adam));
    doc_f32(&d, "optimizer/dense_1.bias/exp_avg")[0] = -INFINITY;
    doc_write(&d, regress_dir, "bad-training-exp-avg-inf");
    doc_free(&d);

    doc_load(&d, path_in(corpus_dir, adam));
    doc_f32(&d, slot2)[3] = -1e-6f;
    doc_write(&d, regress_dir, "bad-training-exp-avg-sq-negative");
    doc_free(&d);

    doc_load(&d, path_in(corpus_dir, adam));
    doc_retype(&d, doc_find(&d, slot2), MP_F16);
    ((uint16_t *)d.owned[doc_find(&d, slot2)])[1] = 0xFC00; /* -inf */
    doc_write(&d, regress_dir, "bad-training-exp-avg-sq-float16-minus-inf");
    doc_free(&d);

    doc_load(&d, path_in(corpus_dir, adam));
    doc_remove(&d, slot2);
    doc_write(&d, regress_dir, "bad-training-slot-missing");
    doc_free(&d);

    doc_load(&d, path_in(corpus_dir, adam));
    {
        mp_named_tensor *t = &d.t[doc_find(&d, slot)];
        t->shape[0] *= t->shape[1]; /* [4, 3] as [12]: same bytes, wrong shape */
        t->ndim = 1;
    }
    doc_write(&d, regress_dir, "bad-training-slot-flattened");
    doc_free(&d);

    doc_load(&d, path_in(corpus_dir, adam));
    {
        mp_named_tensor *t = &d.t[doc_find(&d, slot)];
        int64_t r = t->shape[0];
        t->shape[0] = t->shape[1];
        t->shape[1] = r;
    }
    doc_write(&d, regress_dir, "bad-training-slot-transposed");
    doc_free(&d);
}

static void fit_epoch_1e9(json_t *f) { json_object_set_new(f, "epoch", json_integer(1000000000)); }
static void fit_epoch_1e8(json_t *f) { json_object_set_new(f, "epoch", json_integer(100000000)); }
static void fit_epoch_int_max(json_t *f)
{
    json_object_set_new(f, "epoch", json_integer(INT32_MAX));
    json_object_set_new(f, "bad_epochs", json_integer(INT32_MAX));
}
static void fit_epoch_negative(json_t *f) { json_object_set_new(f, "epoch", json_integer(-1)); }
static void fit_history_long(json_t *f)
{
    json_t *h = json_object_get(f, "history");
    json_array_append(h, json_array_get(h, 0));
}
static void fit_batch_negative(json_t *f) { json_object_set_new(f, "batch", json_integer(-5)); }
static void fit_correct(json_t *f)
{
    json_object_set_new(f, "correct",
                        json_integer(json_integer_value(json_object_get(f, "samples")) + 1));
}
static void fit_loss_samples(json_t *f)
{
    json_object_set_new(f, "loss_samples",
                        json_integer(json_integer_value(json_object_get(f, "samples")) + 1));
}
static void fit_split_one(json_t *f) { json_object_set_new(f, "validation_split", json_real(1.0)); }
static void fit_split_null(json_t *f) { json_object_set_new(f, "validation_split", json_null()); }
static void fit_split_negative(json_t *f)
{
    json_object_set_new(f, "validation_split", json_real(-0.1));
}
static void fit_batch_size_zero(json_t *f)
{
    json_object_set_new(f, "batch_size", json_integer(0));
}
static void fit_seed(json_t *f) { json_object_set_new(f, "seed", json_integer(5)); }
static void fit_seed_negative(json_t *f) { json_object_set_new(f, "seed", json_string("0x-5")); }
static void fit_hash(json_t *f) { json_object_set_new(f, "data_hash", json_string("0x")); }
static void fit_history_epoch(json_t *f)
{
    json_object_set_new(json_array_get(json_object_get(f, "history"), 0), "epoch", json_integer(2));
}
static void fit_history_entry(json_t *f)
{
    json_array_set_new(json_object_get(f, "history"), 0, json_integer(1));
}
static void fit_history_skipped(json_t *f)
{
    json_object_set_new(json_array_get(json_object_get(f, "history"), 0), "skipped",
                        json_integer(-1));
}
static void fit_history_missing(json_t *f) { json_object_del(f, "history"); }
static void fit_shuffle(json_t *f) { json_object_set_new(f, "shuffle", json_integer(1)); }
static void fit_bad_epochs(json_t *f)
{
    json_object_set_new(f, "bad_epochs", json_integer(1000000000));
}

static void bad_fit(void)
{
    const char *base = "valid-fit-float32-adam", *k = "mixprec.fit";
    static const struct {
        json_edit edit;
        const char *name;
    } edits[] = {
        {fit_epoch_1e9, "bad-fit-epoch-1e9"},
        {fit_epoch_1e8, "bad-fit-epoch-1e8-short-history"},
        {fit_epoch_int_max, "bad-fit-epoch-int-max"},
        {fit_epoch_negative, "bad-fit-epoch-negative"},
        {fit_history_long, "bad-fit-history-longer-than-epoch"},
        {fit_batch_negative, "bad-fit-batch-negative"},
        {fit_correct, "bad-fit-correct-above-samples"},
        {fit_loss_samples, "bad-fit-loss-samples-above-samples"},
        {fit_split_one, "bad-fit-validation-split-one"},
        {fit_split_null, "bad-fit-validation-split-nan"},
        {fit_split_negative, "bad-fit-validation-split-negative"},
        {fit_batch_size_zero, "bad-fit-batch-size-zero"},
        {fit_seed, "bad-fit-seed-integer"},
        {fit_seed_negative, "bad-fit-seed-negative-hex"},
        {fit_hash, "bad-fit-data-hash-empty"},
        {fit_history_epoch, "bad-fit-history-epoch-numbering"},
        {fit_history_entry, "bad-fit-history-entry-not-object"},
        {fit_history_skipped, "bad-fit-history-skipped-negative"},
        {fit_history_missing, "bad-fit-history-missing"},
        {fit_shuffle, "bad-fit-shuffle-integer"},
        {fit_bad_epochs, "bad-fit-bad-epochs-1e9"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++)
        edit_meta(base, k, edits[i].edit, edits[i].name);
    set_meta_text(base, k, "{\"epoch\":", "bad-fit-not-json");
    set_meta_text(base, k, "7", "bad-fit-number");
}

static void bad_weights(void)
{
    const char *base = "valid-weights-float32";
    doc d;
    doc_load(&d, path_in(corpus_dir, base));
    doc_remove(&d, "dense.kernel");
    doc_write(&d, regress_dir, "bad-weights-kernel-missing");
    doc_free(&d);

    doc_load(&d, path_in(corpus_dir, base));
    {
        mp_named_tensor *t = &d.t[doc_find(&d, "dense.kernel")];
        int64_t r = t->shape[0];
        t->shape[0] = t->shape[1];
        t->shape[1] = r;
    }
    doc_write(&d, regress_dir, "bad-weights-kernel-transposed");
    doc_free(&d);

    doc_load(&d, path_in(corpus_dir, base));
    {
        mp_named_tensor *t = &d.t[doc_find(&d, "dense.bias")];
        t->ndim = 2;
        t->shape[1] = 1;
    }
    doc_write(&d, regress_dir, "bad-weights-bias-2d");
    doc_free(&d);

    doc_load(&d, path_in(corpus_dir, base));
    doc_f32(&d, "dense_1.kernel")[2] = NAN;
    doc_write(&d, regress_dir, "bad-weights-nan");
    doc_free(&d);

    doc_load(&d, path_in(corpus_dir, base));
    doc_retype(&d, doc_find(&d, "dense.bias"), MP_F16);
    ((uint16_t *)d.owned[doc_find(&d, "dense.bias")])[0] = 0x7C00; /* +inf */
    doc_write(&d, regress_dir, "bad-weights-float16-inf");
    doc_free(&d);

    doc_load(&d, path_in(corpus_dir, base));
    doc_retype(&d, doc_find(&d, "dense.kernel"), MP_F8E4M3);
    ((uint8_t *)d.owned[doc_find(&d, "dense.kernel")])[7] = 0x7F; /* E4M3 NaN */
    doc_write(&d, regress_dir, "bad-weights-e4m3-nan");
    doc_free(&d);

    doc_load(&d, path_in(corpus_dir, base));
    doc_retype(&d, doc_find(&d, "dense_1.kernel"), MP_BF16);
    ((uint16_t *)d.owned[doc_find(&d, "dense_1.kernel")])[0] = 0x7FC1; /* bfloat16 NaN */
    doc_write(&d, regress_dir, "bad-weights-bfloat16-nan");
    doc_free(&d);

    /* the weights of another model */
    doc_load(&d, path_in(corpus_dir, base));
    doc d2;
    doc_load(&d2, path_in(corpus_dir, "valid-weights-mixed_bfloat16-residual"));
    doc_set_meta(&d, "mixprec.config", doc_meta(&d2, "mixprec.config"));
    doc_write(&d, regress_dir, "bad-weights-of-another-model");
    doc_free(&d2);
    doc_free(&d);
}

/* ----------------------------------------------------------------- main */

static void mkdir_p(const char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s", dir);
    for (char *c = p + 1; *c; c++)
        if (*c == '/') {
            *c = '\0';
            mkdir(p, 0777);
            *c = '/';
        }
    mkdir(p, 0777);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: make_corpus CORPUS_DIR REGRESS_DIR\n");
        return 2;
    }
    corpus_dir = argv[1];
    regress_dir = argv[2];
    mkdir_p(corpus_dir);
    mkdir_p(regress_dir);
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/mp_corpus_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 2;
    }
    mp_set_num_threads(1); /* the same bytes on any machine */
    write_seeds();
    bad_headers();
    bad_configs();
    bad_training();
    bad_fit();
    bad_weights();
    rmdir(tmp_dir);
    printf("make_corpus: %d valid-* seeds in %s, %d bad-* inputs in %s, %d wrong\n", n_valid,
           corpus_dir, n_bad, regress_dir, n_wrong);
    return n_wrong ? 1 : 0;
}
