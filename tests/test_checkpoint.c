/* test_checkpoint.c - training checkpoints: exact resume in every policy
 * (N steps straight = N/2 steps, checkpoint, a fresh process-like rebuild
 * from the file alone, N/2 more, compared bit for bit), dynamic loss
 * scaling and stochastic rounding across the boundary, periodic
 * checkpoints with keep_last, loading that is all or nothing, and refusals
 * of a resume on other data or another batch size. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
 * layer normalization and a float32 softmax. */
static mp_model *model(const char *policy, mp_optimizer_kind kind)
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
    char *d = strdup("/tmp/mp_ckpt_XXXXXX");
    assert_non_null(mkdtemp(d));
    return d;
}

static void rmdir_all(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    if (d) closedir(d);
    rmdir(dir);
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
    rmdir_all(dir);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_resume_every_policy),
        cmocka_unit_test(test_exact_resume_optimizers_and_boundaries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
