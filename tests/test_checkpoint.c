/* test_checkpoint.c - training checkpoints: exact resume in every policy
 * (N steps straight = N/2 steps, checkpoint, a fresh process-like rebuild
 * from the file alone, N/2 more, compared bit for bit), dynamic loss
 * scaling and stochastic rounding across the boundary, periodic
 * checkpoints with keep_last, loading that is all or nothing, and refusals
 * of a resume on other data or another batch size. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "train/train_internal.h"

/* 3 classes in 10 dimensions: class c shifts feature c by 2 (sd 1), so
 * training keeps changing every weight for the whole run. */
static mp_dataset *data(int64_t n, uint64_t seed)
{
    float *x = malloc((size_t)n * 10 * sizeof *x);
    int32_t *y = malloc((size_t)n * sizeof *y);
    test_rng r = {seed};
    for (int64_t i = 0; i < n; i++) {
        y[i] = (int32_t)(test_rng_u32(&r) % 3);
        for (int j = 0; j < 10; j++)
            x[i * 10 + j] = (float)((j == y[i] ? 2.0 : 0.0) + test_rng_uniform(&r, -1.7, 1.7));
    }
    mp_dataset *ds;
    assert_int_equal(mp_dataset_from_arrays(x, y, n, 10, 3, &ds), MP_OK);
    free(x);
    free(y);
    return ds;
}

static const char *const policies[] = {"float32", "mixed_float16", "mixed_bfloat16", "float16",
                                       "bfloat16"};

/* An MLP with dropout (the dropout counter must survive the checkpoint),
 * layer normalization and a float32 softmax, built but not compiled. */
static mp_model *model_uncompiled(const char *policy)
{
    mp_set_global_policy(policy);
    mp_model *m = mp_model_new(11);
    mp_node x = mp_input(m, 1, (int64_t[]){10}, NULL);
    x = mp_dense(m, x, 24, MP_ACT_GELU, NULL);
    x = mp_dropout(m, x, 0.25f, NULL);
    x = mp_layer_norm(m, x, 1e-3f, NULL);
    x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    mp_set_global_policy("float32");
    assert_int_equal(mp_model_build(m, x, 16), MP_OK);
    return m;
}

/* The same, compiled: every piece of training state is in use. */
static mp_model *model(const char *policy, mp_optimizer_kind kind)
{
    mp_model *m = model_uncompiled(policy);
    mp_compile_options co = mp_compile_options_default();
    co.optimizer = mp_optimizer_config_default(kind);
    co.optimizer.learning_rate = kind == MP_OPTIMIZER_SGD ? 0.05f : 3e-3f;
    co.optimizer.momentum = kind == MP_OPTIMIZER_SGD ? 0.9f : 0.0f;
    co.optimizer.schedule.decay = MP_LR_COSINE; /* the schedule position matters */
    co.optimizer.schedule.decay_steps = 40;
    co.optimizer.schedule.final_lr = 1e-4f;
    co.optimizer.schedule.warmup_steps = 5;
    co.optimizer.rounding = MP_ROUND_STOCHASTIC; /* used by the pure policies */
    co.optimizer.seed = 99;
    co.loss_scaling = MP_LOSS_SCALING_DYNAMIC; /* in every policy, to test its state */
    /* starts too high for float16 (the first steps overflow and back off)
     * and grows every 4 good steps, so scale and counter both move */
    co.scaler = mp_loss_scaler_config_keras();
    co.scaler.initial_scale = 1e9f;
    co.scaler.growth_interval = 4;
    assert_int_equal(mp_model_compile(m, &co), MP_OK);
    return m;
}

static mp_fit_options fit_opts(int64_t max_steps, const char *dir)
{
    mp_fit_options fo = mp_fit_options_default();
    fo.batch_size = 16;
    fo.epochs = 4;
    fo.validation_split = 0.2;
    fo.seed = 5;
    fo.verbose = 0;
    fo.max_steps = max_steps;
    fo.checkpoint_dir = dir;
    return fo;
}

static char *tmpdir(void)
{
    char *d = malloc(64);
    assert_int_equal(test_scratch_dir(d, 64, "mp_ckpt"), 0);
    return d;
}

/* Every bit of the training state of two models. */
static void assert_same_state(mp_model *a, mp_model *b, const char *what)
{
    assert_int_equal(mp_model_num_params(a), mp_model_num_params(b));
    for (int i = 0; i < mp_model_num_params(a); i++) {
        mp_model_param *p = mp_model_get_param(a, i), *q = mp_model_get_param(b, i);
        size_t bytes = (size_t)p->n * (p->master ? 4 : mp_dtype_size(p->weight_dtype));
        if (memcmp(p->master ? (void *)p->master : p->weight,
                   q->master ? (void *)q->master : q->weight, bytes))
            fail_msg("%s: parameter %s differs", what, p->name);
    }
    mp_optimizer *oa = mp_model_optimizer(a), *ob = mp_model_optimizer(b);
    assert_int_equal(mp_optimizer_step_count(oa), mp_optimizer_step_count(ob));
    for (int i = 0; i < mp_model_num_params(a); i++)
        for (int k = 0; k < mp_optimizer_num_slots(oa); k++) {
            int64_t n;
            float *x = mp_optimizer_slot(oa, i, k, &n), *y = mp_optimizer_slot(ob, i, k, NULL);
            if (memcmp(x, y, (size_t)n * sizeof *x))
                fail_msg("%s: optimizer slot %s of parameter %d differs", what,
                         mp_optimizer_slot_name(oa, k), i);
        }
    mp_loss_scaler_state sa, sb;
    mp_loss_scaler_get_state(mp_model_loss_scaler(a), &sa);
    mp_loss_scaler_get_state(mp_model_loss_scaler(b), &sb);
    assert_true(f32_bits(sa.scale) == f32_bits(sb.scale));
    assert_int_equal(sa.counter, sb.counter);
    assert_int_equal(mp_model_steps_applied(a), mp_model_steps_applied(b));
    assert_int_equal(mp_model_steps_skipped(a), mp_model_steps_skipped(b));
    assert_int_equal(mp_model_forward_count(a), mp_model_forward_count(b));
}

/* One split run: N/2 steps with a final checkpoint, a new model built from
 * the file alone, resumed to N; compared with N steps straight. */
static void resume_case(const char *policy, mp_optimizer_kind kind, int64_t n_steps)
{
    mp_dataset *ds = data(400, 7); /* 320 training samples: 20 batches an epoch */
    mp_model *straight = model(policy, kind);
    mp_fit_options fo = fit_opts(n_steps, NULL);
    mp_history hs;
    assert_int_equal(mp_model_fit(straight, ds, &fo, &hs), MP_OK);

    char *dir = tmpdir();
    mp_model *first = model(policy, kind);
    fo = fit_opts(n_steps / 2, dir);
    assert_int_equal(mp_model_fit(first, ds, &fo, NULL), MP_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/ckpt-%08lld.safetensors", dir, (long long)(n_steps / 2));
    mp_model *resumed;
    mp_fit_state st;
    assert_int_equal(mp_model_from_checkpoint(path, 16, &resumed, &st), MP_OK);
    assert_int_equal(st.steps, n_steps / 2);
    assert_same_state(first, resumed, "after load");
    fo = fit_opts(n_steps, NULL);
    fo.resume = &st;
    mp_history hr;
    assert_int_equal(mp_model_fit(resumed, ds, &fo, &hr), MP_OK);
    char what[96];
    snprintf(what, sizeof what, "%s/%s, %lld steps", policy, mp_optimizer_kind_name(kind),
             (long long)n_steps);
    assert_same_state(straight, resumed, what);
    /* the history continues too: every completed epoch's figures agree */
    assert_int_equal(hs.count, hr.count);
    for (int e = 0; e < hs.count; e++) {
        assert_true(hs.epochs[e].loss == hr.epochs[e].loss);
        assert_true(hs.epochs[e].val_loss == hr.epochs[e].val_loss);
        assert_int_equal(hs.epochs[e].steps, hr.epochs[e].steps);
        assert_int_equal(hs.epochs[e].skipped, hr.epochs[e].skipped);
    }
    if (!strcmp(policy, "mixed_float16")) { /* the scaler did move across the boundary */
        assert_true(mp_model_steps_skipped(straight) > 0);
        mp_loss_scaler_state ls;
        mp_loss_scaler_get_state(mp_model_loss_scaler(straight), &ls);
        assert_true(ls.scale < 1e9f);
    }
    mp_history_free(&hs);
    mp_history_free(&hr);
    mp_fit_state_free(&st);
    mp_model_free(straight);
    mp_model_free(first);
    mp_model_free(resumed);
    mp_dataset_free(ds);
    test_remove_tree(dir);
    free(dir);
}

static void test_exact_resume_every_policy(void **state)
{
    (void)state;
    /* 50 steps: the split at 25 falls inside the second epoch */
    for (int p = 0; p < 5; p++) resume_case(policies[p], MP_OPTIMIZER_ADAM, 50);
}

static void test_exact_resume_optimizers_and_boundaries(void **state)
{
    (void)state;
    resume_case("mixed_bfloat16", MP_OPTIMIZER_SGD, 50);
    resume_case("mixed_float16", MP_OPTIMIZER_ADAMW, 50);
    resume_case("bfloat16", MP_OPTIMIZER_ADAMW, 42);
    /* a split exactly at an epoch's end (20 batches an epoch) */
    resume_case("mixed_float16", MP_OPTIMIZER_ADAM, 40);
}

/* --------------------------------------------------------- hostile files */

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, f);
    fclose(f);
    return b;
}

/* Copy checkpoint src to dst with tensor `name` changed by `edit` (element
 * index and value) or dropped (edit_index < 0), and metadata `key` replaced
 * by `value` (if key is not NULL). */
static void rewrite(const char *src, const char *dst, const char *name, int64_t edit_index,
                    float value, const char *key, const char *meta)
{
    mp_safetensors *f;
    assert_int_equal(mp_safetensors_read(src, &f), MP_OK);
    int n = mp_safetensors_count(f), k = 0;
    mp_named_tensor *t = calloc((size_t)n, sizeof *t);
    void *copy = NULL;
    for (int i = 0; i < n; i++) {
        const mp_named_tensor *x = mp_safetensors_tensor(f, i);
        if (name && !strcmp(x->name, name)) {
            if (edit_index < 0) continue;
            size_t bytes = mp_dtype_size(x->dtype);
            for (int d = 0; d < x->ndim; d++) bytes *= (size_t)x->shape[d];
            copy = malloc(bytes);
            memcpy(copy, x->data, bytes);
            ((float *)copy)[edit_index] = value;
            t[k] = *x;
            t[k++].data = copy;
            continue;
        }
        t[k++] = *x;
    }
    const char *keys[8], *vals[8];
    int nm = 0;
    const char *known[] = {"format",           "mixprec_version",
                           "mixprec.config",   "mixprec.global_policy",
                           "mixprec.training", "mixprec.fit"};
    for (int i = 0; i < 6; i++) {
        const char *v = mp_safetensors_metadata(f, known[i]);
        if (key && !strcmp(key, known[i])) v = meta;
        if (v) keys[nm] = known[i], vals[nm++] = v;
    }
    assert_int_equal(mp_safetensors_write(dst, t, k, keys, vals, nm), MP_OK);
    free(copy);
    free(t);
    mp_safetensors_free(f);
}

/* A model's complete state as bytes, to show a refused load changed nothing. */
static uint8_t *snapshot(mp_model *m, size_t *len)
{
    char *dir = tmpdir(), path[256];
    snprintf(path, sizeof path, "%s/s.safetensors", dir);
    assert_int_equal(mp_model_save_checkpoint(m, path, NULL), MP_OK);
    uint8_t *b = slurp(path, len);
    test_remove_tree(dir);
    free(dir);
    return b;
}

static void test_refused_loads_change_nothing(void **state)
{
    (void)state;
    char *dir = tmpdir(), good[256], bad[256];
    snprintf(good, sizeof good, "%s/good.safetensors", dir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    mp_model *src = model("mixed_float16", MP_OPTIMIZER_ADAM);
    mp_dataset *ds = data(64, 3);
    mp_fit_options fo = fit_opts(6, NULL);
    assert_int_equal(mp_model_fit(src, ds, &fo, NULL), MP_OK);
    assert_int_equal(mp_model_save_checkpoint(src, good, NULL), MP_OK);

    mp_model *m = model("mixed_float16", MP_OPTIMIZER_ADAM);
    size_t n0, n1;
    uint8_t *before = snapshot(m, &n0);
    struct {
        const char *tensor;
        int64_t index;
        float value;
        const char *key, *meta, *expect;
    } cases[] = {
        {"optimizer/dense.kernel/exp_avg", 5, NAN, NULL, NULL, "non-finite"},
        {"optimizer/dense_1.bias/exp_avg_sq", 1, -1.0f, NULL, NULL, "negative"},
        {"dense_1.kernel", 3, INFINITY, NULL, NULL, "non-finite"},
        {"optimizer/dense.bias/exp_avg", -1, 0, NULL, NULL, "optimizer/dense.bias/exp_avg"},
        {"layer_normalization.gamma", -1, 0, NULL, NULL, "layer_normalization.gamma"},
        {NULL, 0, 0, "mixprec.training", "{\"version\": 1}", "compile options"},
        {NULL, 0, 0, "mixprec.training", "not json", "not valid JSON"},
        {NULL, 0, 0, "mixprec.training", "{\"version\": 7}", "unsupported version"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        rewrite(good, bad, cases[c].tensor, cases[c].index, cases[c].value, cases[c].key,
                cases[c].meta);
        assert_int_not_equal(mp_model_load_checkpoint(m, bad, NULL), MP_OK);
        if (!strstr(mp_last_error(), cases[c].expect))
            fail_msg("case %zu: '%s' does not mention '%s'", c, mp_last_error(), cases[c].expect);
        uint8_t *after = snapshot(m, &n1);
        if (n0 != n1 || memcmp(before, after, n0)) fail_msg("case %zu changed the model", c);
        free(after);
    }
    /* a loss-scaler state inconsistent with its config */
    mp_safetensors *f;
    assert_int_equal(mp_safetensors_read(good, &f), MP_OK);
    char *tr = strdup(mp_safetensors_metadata(f, "mixprec.training"));
    mp_safetensors_free(f);
    char *counter = strstr(tr, "\"counter\":");
    assert_non_null(counter);
    char edited[4096]; /* the counter set to 99: the growth interval is 4 */
    size_t head = (size_t)(counter - tr) + 10, digits = strspn(counter + 10, "0123456789");
    snprintf(edited, sizeof edited, "%.*s99%s", (int)head, tr, counter + 10 + digits);
    rewrite(good, bad, NULL, 0, 0, "mixprec.training", edited);
    free(tr);
    assert_int_not_equal(mp_model_load_checkpoint(m, bad, NULL), MP_OK);
    if (!strstr(mp_last_error(), "loss-scaler")) fail_msg("%s", mp_last_error());

    /* a model built but not compiled takes the file's compile options, and
     * is left uncompiled when the file is refused */
    mp_model *u = model_uncompiled("mixed_float16");
    rewrite(good, bad, "optimizer/dense.kernel/exp_avg", 2, NAN, NULL, NULL);
    assert_int_not_equal(mp_model_load_checkpoint(u, bad, NULL), MP_OK);
    mp_compile_options none;
    assert_int_equal(mp_model_get_compile_options(u, &none), MP_ERR_INVALID);
    /* compile options without loss scaling next to a scaler state: refused,
     * not loaded with the state dropped */
    assert_int_equal(mp_safetensors_read(good, &f), MP_OK);
    const char *trs = mp_safetensors_metadata(f, "mixprec.training");
    const char *at = strstr(trs, "\"loss_scaling\":\"dynamic\"");
    assert_non_null(at);
    snprintf(edited, sizeof edited, "%.*s\"loss_scaling\":\"none\"%s", (int)(at - trs), trs,
             at + strlen("\"loss_scaling\":\"dynamic\""));
    mp_safetensors_free(f);
    rewrite(good, bad, NULL, 0, 0, "mixprec.training", edited);
    assert_int_not_equal(mp_model_load_checkpoint(u, bad, NULL), MP_OK);
    if (!strstr(mp_last_error(), "loss-scaler state")) fail_msg("%s", mp_last_error());
    assert_int_equal(mp_model_get_compile_options(u, &none), MP_ERR_INVALID);
    mp_model_free(u);

    /* another optimizer kind in a compiled model: refused, naming both */
    mp_model *sgd = model("mixed_float16", MP_OPTIMIZER_SGD);
    assert_int_equal(mp_model_load_checkpoint(sgd, good, NULL), MP_ERR_FORMAT);
    assert_non_null(strstr(mp_last_error(), "adam"));
    assert_non_null(strstr(mp_last_error(), "sgd"));
    /* the good file loads, and a model built but not compiled takes the
     * file's compile options */
    assert_int_equal(mp_model_load_checkpoint(m, good, NULL), MP_OK);
    assert_same_state(src, m, "loaded");
    mp_model *fresh;
    assert_int_equal(mp_model_from_checkpoint(good, 16, &fresh, NULL), MP_OK);
    mp_compile_options a, b;
    assert_int_equal(mp_model_get_compile_options(src, &a), MP_OK);
    assert_int_equal(mp_model_get_compile_options(fresh, &b), MP_OK);
    assert_true(a.optimizer.kind == b.optimizer.kind &&
                f32_bits(a.optimizer.learning_rate) == f32_bits(b.optimizer.learning_rate) &&
                a.optimizer.schedule.decay == b.optimizer.schedule.decay &&
                a.optimizer.schedule.decay_steps == b.optimizer.schedule.decay_steps &&
                a.optimizer.seed == b.optimizer.seed &&
                a.scaler.growth_interval == b.scaler.growth_interval &&
                f32_bits(a.scaler.initial_scale) == f32_bits(b.scaler.initial_scale));
    assert_same_state(src, fresh, "rebuilt");

    /* a resume on other data or with another batch size is refused */
    mp_fit_state st;
    char ck[256];
    fo = fit_opts(3, dir);
    assert_int_equal(mp_model_fit(src, ds, &fo, NULL), MP_OK);
    snprintf(ck, sizeof ck, "%s/ckpt-00000003.safetensors", dir);
    mp_model *r;
    assert_int_equal(mp_model_from_checkpoint(ck, 16, &r, &st), MP_OK);
    mp_dataset *other = data(64, 4);
    fo = fit_opts(6, NULL);
    fo.resume = &st;
    assert_int_equal(mp_model_fit(r, other, &fo, NULL), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "other training data"));
    fo.batch_size = 8;
    assert_int_equal(mp_model_fit(r, ds, &fo, NULL), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "batch size 16"));
    mp_fit_state_free(&st);
    mp_model_free(r);
    mp_dataset_free(other);

    free(before);
    mp_model_free(fresh);
    mp_model_free(sgd);
    mp_model_free(m);
    mp_model_free(src);
    mp_dataset_free(ds);
    test_remove_tree(dir);
    free(dir);
}

/* Periodic checkpoints: every N steps plus one at the end, only the newest
 * keep_last kept, and mp_checkpoint_latest finds the newest valid one. */
static void test_periodic_checkpoints(void **state)
{
    (void)state;
    char *dir = tmpdir(), path[512];
    mp_dataset *ds = data(200, 9); /* 160 training samples: 10 batches an epoch */
    mp_model *m = model("bfloat16", MP_OPTIMIZER_ADAM);
    mp_fit_options fo = fit_opts(0, dir);
    fo.epochs = 2;
    fo.checkpoint_every = 7;
    fo.keep_last = 2;
    assert_int_equal(mp_model_fit(m, ds, &fo, NULL), MP_OK);
    mp_checkpoint_entry *list;
    int n = mp_checkpoint_list(dir, &list);
    assert_int_equal(n, 2);
    assert_int_equal(list[0].steps, 14);
    assert_int_equal(list[1].steps, 20); /* the final one */
    free(list);
    assert_int_equal(mp_checkpoint_latest(dir, path, sizeof path), MP_OK);
    assert_non_null(strstr(path, "ckpt-00000020"));
    mp_fit_state st;
    mp_model *r;
    assert_int_equal(mp_model_from_checkpoint(path, 0, &r, &st), MP_OK);
    assert_int_equal(mp_model_max_batch(r), 16); /* max_batch 0: the fit's batch size */
    assert_int_equal(st.epoch, 2);
    assert_int_equal(st.history.count, 2);
    assert_int_equal(st.steps, 20);
    mp_fit_state_free(&st);
    mp_model_free(r);
    /* the newest file torn: the one before it is taken */
    snprintf(path, sizeof path, "%s/ckpt-00000020.safetensors", dir);
    FILE *f = fopen(path, "r+b");
    fseek(f, 0, SEEK_END);
    assert_int_equal(ftruncate(fileno(f), ftell(f) - 5), 0);
    fclose(f);
    assert_int_equal(mp_checkpoint_latest(dir, path, sizeof path), MP_OK);
    assert_non_null(strstr(path, "ckpt-00000014"));
    mp_model_free(m);
    mp_dataset_free(ds);
    test_remove_tree(dir);
    free(dir);
}

/* ------------------------------------------------------------ crash safety */

static bool same_file(const char *path, const uint8_t *want, size_t want_len)
{
    size_t n;
    uint8_t *b = slurp(path, &n);
    bool same = b && n == want_len && !memcmp(b, want, n);
    free(b);
    return same;
}

/* Files in dir other than the checkpoint itself (temporaries left behind). */
static int stray_files(const char *dir, const char *keep)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && strcmp(e->d_name, keep)) n++;
    if (d) closedir(d);
    return n;
}

/* A model with one kernel over 1 MiB, so its data goes out in several
 * pieces, trained `steps` steps on fixed data. */
static mp_model *crash_model(int steps)
{
    mp_model *m = mp_model_new(21);
    mp_node x = mp_input(m, 1, (int64_t[]){256}, NULL);
    x = mp_dense(m, x, 1200, MP_ACT_RELU, NULL);
    x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
    assert_int_equal(mp_model_build(m, x, 4), MP_OK);
    mp_compile_options co = mp_compile_options_default();
    co.from_logits = true;
    assert_int_equal(mp_model_compile(m, &co), MP_OK);
    float xs[4 * 256];
    int32_t ys[4] = {0, 1, 2, 1};
    for (int i = 0; i < 4 * 256; i++) xs[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    mp_tensor t;
    mp_tensor_wrap(&t, MP_F32, 2, (int64_t[]){4, 256}, xs);
    for (int s = 0; s < steps; s++)
        assert_int_equal(mp_model_train_step(m, &t, ys, NULL, NULL), MP_OK);
    return m;
}

typedef struct {
    int calls, at;    /* act at call number `at` */
    int err;          /* injected errno (0: kill the process instead) */
    bool short_write; /* before killing at a write: let half of it through first */
    bool armed;
} fault_plan;

static int fault_hook(mp_write_op op, size_t *len, void *user)
{
    fault_plan *p = user;
    int k = p->calls++;
    if (p->armed) raise(SIGKILL); /* the call after a short write */
    if (k != p->at) return 0;
    if (p->err) return p->err;
    if (op == MP_WRITE_OP_WRITE && p->short_write && len && *len > 1) {
        *len /= 2;
        p->armed = true;
        return 0;
    }
    raise(SIGKILL);
    return 0;
}

/* Every step of an atomic write fails in turn (EIO, then ENOSPC): each time
 * the save reports an error naming the file, the previous checkpoint stays
 * byte for byte, and no temporary is left behind. */
static void test_write_failures_keep_the_old_checkpoint(void **state)
{
    (void)state;
    char *dir = tmpdir(), path[256];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    mp_model *m1 = crash_model(1), *m2 = crash_model(2);
    assert_int_equal(mp_model_save_checkpoint(m1, path, NULL), MP_OK);
    size_t n1;
    uint8_t *v1 = slurp(path, &n1);
    int failures = 0;
    for (int e = 0; e < 2; e++)
        for (int at = 0;; at++) {
            fault_plan p = {0, at, e ? ENOSPC : EIO, false, false};
            mp_write_fault_hook = fault_hook;
            mp_write_fault_user = &p;
            mp_status s = mp_model_save_checkpoint(m2, path, NULL);
            mp_write_fault_hook = NULL;
            if (p.calls <= at) { /* the write never reached this step: done */
                assert_int_equal(s, MP_OK);
                assert_int_equal(mp_model_save_checkpoint(m1, path, NULL), MP_OK);
                break;
            }
            if (s == MP_OK) {
                /* only a failed directory fsync comes after the rename: the
                 * new file is in place and the save still counts */
                assert_false(same_file(path, v1, n1));
                assert_int_equal(mp_model_save_checkpoint(m1, path, NULL), MP_OK);
                continue;
            }
            failures++;
            assert_non_null(strstr(mp_last_error(), "ckpt.safetensors"));
            if (!same_file(path, v1, n1)) fail_msg("failure at step %d changed the file", at);
            assert_int_equal(stray_files(dir, "ckpt.safetensors"), 0);
        }
    assert_true(failures >= 10); /* create, several pieces, fsync, rename */
    free(v1);
    mp_model_free(m1);
    mp_model_free(m2);
    test_remove_tree(dir);
    free(dir);
}

/* The writer is killed (SIGKILL) at every step of the write, and in the
 * middle of every piece of data: afterwards the final name holds either the
 * complete old checkpoint or the complete new one, never a mix, and it
 * loads. A temporary may be left behind; pruning removes it. */
static void test_killed_writer_leaves_old_or_new(void **state)
{
    (void)state;
    char *dir = tmpdir(), path[256];
    snprintf(path, sizeof path, "%s/ckpt-00000001.safetensors", dir);
    mp_model *m1 = crash_model(1), *m2 = crash_model(2);
    assert_int_equal(mp_model_save_checkpoint(m1, path, NULL), MP_OK);
    size_t n1, n2;
    uint8_t *v1 = slurp(path, &n1);
    char other[256];
    snprintf(other, sizeof other, "%s/new.safetensors", dir);
    assert_int_equal(mp_model_save_checkpoint(m2, other, NULL), MP_OK);
    uint8_t *v2 = slurp(other, &n2);
    unlink(other);
    int kills = 0, olds = 0, news = 0;
    for (int at = 0;; at++) {
        bool done = false;
        for (int variant = 0; variant < 2; variant++) {
            fflush(NULL);
            pid_t pid = fork();
            assert_true(pid >= 0);
            if (pid == 0) {
                fault_plan p = {0, at, 0, variant == 1, false};
                mp_write_fault_hook = fault_hook;
                mp_write_fault_user = &p;
                _exit(mp_model_save_checkpoint(m2, path, NULL) == MP_OK ? 0 : 1);
            }
            int st;
            assert_int_equal(waitpid(pid, &st, 0), pid);
            if (WIFEXITED(st)) { /* it got through: the kill point was past the end */
                assert_int_equal(WEXITSTATUS(st), 0);
                assert_true(same_file(path, v2, n2));
                done = true;
                break;
            }
            assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
            kills++;
            bool old = same_file(path, v1, n1), new = same_file(path, v2, n2);
            if (!old && !new) fail_msg("killed at step %d: the checkpoint is neither version", at);
            olds += old;
            news += new;
            mp_model *back = crash_model(0);
            assert_int_equal(mp_model_load_checkpoint(back, path, NULL), MP_OK);
            mp_model_free(back);
            mp_checkpoint_prune(dir, 0);
            assert_int_equal(stray_files(dir, "ckpt-00000001.safetensors"), 0);
            /* back to the old version for the next kill */
            assert_int_equal(mp_model_save_checkpoint(m1, path, NULL), MP_OK);
        }
        if (done) break;
    }
    assert_true(kills >= 20);
    assert_true(olds > 0 && news > 0); /* killed both before and after the rename */
    free(v1);
    free(v2);
    mp_model_free(m1);
    mp_model_free(m2);
    test_remove_tree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_resume_every_policy),
        cmocka_unit_test(test_exact_resume_optimizers_and_boundaries),
        cmocka_unit_test(test_refused_loads_change_nothing),
        cmocka_unit_test(test_periodic_checkpoints),
        cmocka_unit_test(test_write_failures_keep_the_old_checkpoint),
        cmocka_unit_test(test_killed_writer_leaves_old_or_new),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
