/* test_loss_scaler.c - the loss scaler's exact scale trajectories for
 * scripted overflow patterns, skipped steps that leave no trace, unscaling,
 * clipping after unscaling, accumulation windows and custom-loop misuse. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static mp_loss_scaler *make(mp_loss_scaler_config c)
{
    mp_loss_scaler *s = mp_loss_scaler_new(&c);
    assert_non_null(s);
    return s;
}

static int64_t counter(const mp_loss_scaler *s)
{
    mp_loss_scaler_state st;
    mp_loss_scaler_get_state(s, &st);
    return st.counter;
}

static void test_presets_and_default(void **state)
{
    (void)state;
    mp_loss_scaler_config k = mp_loss_scaler_config_keras(), t = mp_loss_scaler_config_torch();
    assert_true(k.initial_scale == 32768.0f && k.growth_factor == 2.0f &&
                k.backoff_factor == 0.5f && k.growth_interval == 2000 && k.min_scale == 0 &&
                k.max_scale == 0 && k.mode == MP_LOSS_SCALE_DYNAMIC);
    assert_true(t.initial_scale == 65536.0f && t.growth_factor == 2.0f &&
                t.backoff_factor == 0.5f && t.growth_interval == 2000);
    mp_loss_scaler *s = mp_loss_scaler_new(NULL); /* NULL = keras */
    assert_non_null(s);
    assert_true(mp_loss_scaler_scale(s) == 32768.0f);
    mp_loss_scaler_config got;
    mp_loss_scaler_get_config(s, &got);
    assert_true(got.initial_scale == k.initial_scale && got.growth_factor == k.growth_factor &&
                got.backoff_factor == k.backoff_factor &&
                got.growth_interval == k.growth_interval && got.min_scale == k.min_scale &&
                got.max_scale == k.max_scale && got.mode == k.mode);
    assert_true(mp_loss_scaler_get_scaled_loss(s, 0.75f) == 0.75f * 32768.0f);
    mp_loss_scaler_free(s);
    assert_true(mp_loss_scaling_default_for(MP_F16));
    assert_false(mp_loss_scaling_default_for(MP_BF16));
    assert_false(mp_loss_scaling_default_for(MP_F32));
    assert_false(mp_loss_scaling_default_for(MP_F8E4M3));
}

static void test_overflow_at_counter_1999(void **state)
{
    (void)state;
    mp_loss_scaler *s = make(mp_loss_scaler_config_keras());
    for (int i = 0; i < 1999; i++) mp_loss_scaler_update(s, false);
    assert_int_equal(counter(s), 1999);
    assert_true(mp_loss_scaler_scale(s) == 32768.0f); /* one short of growing */
    mp_loss_scaler_update(s, true);
    assert_true(mp_loss_scaler_scale(s) == 16384.0f);
    assert_int_equal(counter(s), 0);
    for (int i = 0; i < 1999; i++) mp_loss_scaler_update(s, false);
    assert_true(mp_loss_scaler_scale(s) == 16384.0f);
    mp_loss_scaler_update(s, false); /* the 2000th finite step in a row */
    assert_true(mp_loss_scaler_scale(s) == 32768.0f);
    assert_int_equal(counter(s), 0);
    for (int i = 0; i < 2000; i++) mp_loss_scaler_update(s, false);
    assert_true(mp_loss_scaler_scale(s) == 65536.0f);
    mp_loss_scaler_free(s);
}

static void test_growth_past_float_max_is_skipped(void **state)
{
    (void)state;
    mp_loss_scaler_config c = mp_loss_scaler_config_torch();
    c.initial_scale = 0x1p127f;
    c.growth_interval = 1;
    mp_loss_scaler *s = make(c);
    for (int i = 0; i < 3; i++) {
        mp_loss_scaler_update(s, false); /* 2^128 is inf: keep 2^127 */
        assert_true(mp_loss_scaler_scale(s) == 0x1p127f);
        assert_int_equal(counter(s), 0);
    }
    mp_loss_scaler_free(s);
    c.initial_scale = 0x1p126f;
    c.growth_factor = 3.0f;
    s = make(c);
    mp_loss_scaler_update(s, false); /* 1.5 * 2^127 is finite */
    assert_true(mp_loss_scaler_scale(s) == 0x1.8p127f);
    mp_loss_scaler_update(s, false); /* 4.5 * 2^127 is not */
    assert_true(mp_loss_scaler_scale(s) == 0x1.8p127f);
    assert_true(isfinite(mp_loss_scaler_scale(s)));
    mp_loss_scaler_free(s);
}

static void test_repeated_backoff_towards_zero(void **state)
{
    (void)state;
    /* No lower bound (both presets): each overflow halves the scale exactly,
     * through the subnormals, until 2^-150 rounds (to even) to 0. */
    mp_loss_scaler *s = make(mp_loss_scaler_config_keras());
    for (int k = 1; k <= 164; k++) {
        mp_loss_scaler_update(s, true);
        assert_true(mp_loss_scaler_scale(s) == ldexpf(1.0f, 15 - k));
    }
    assert_true(mp_loss_scaler_scale(s) == 0x1p-149f);
    /* Long before that the reciprocal overflows float32 (below 2^-128):
     * unscaling then reports found_inf instead of producing inf gradients. */
    float g[2] = {1e-30f, 0};
    mp_param p = {.master = g, .grad = g, .n = 2};
    bool found = false;
    mp_grads_unscale(&p, 1, 0x1p-129f, &found);
    assert_true(found);
    assert_true(g[0] == 1e-30f); /* left alone */
    found = false;
    mp_grads_unscale(&p, 1, 0x1p-120f, &found); /* 2^120 is fine */
    assert_false(found);
    assert_true(g[0] == 1e-30f * 0x1p120f);
    mp_loss_scaler_update(s, true);
    assert_true(mp_loss_scaler_scale(s) == 0.0f);
    mp_loss_scaler_free(s);
}

static void test_min_max_clamps(void **state)
{
    (void)state;
    mp_loss_scaler_config c = mp_loss_scaler_config_keras();
    c.initial_scale = 8;
    c.min_scale = 1;
    mp_loss_scaler *s = make(c);
    const float down[] = {4, 2, 1, 1, 1};
    for (int i = 0; i < 5; i++) {
        mp_loss_scaler_update(s, true);
        assert_true(mp_loss_scaler_scale(s) == down[i]);
    }
    mp_loss_scaler_free(s);
    c.min_scale = 3; /* not a power of two: clamped, not skipped */
    s = make(c);
    mp_loss_scaler_update(s, true);
    assert_true(mp_loss_scaler_scale(s) == 4);
    mp_loss_scaler_update(s, true);
    assert_true(mp_loss_scaler_scale(s) == 3);
    mp_loss_scaler_update(s, true);
    assert_true(mp_loss_scaler_scale(s) == 3);
    mp_loss_scaler_free(s);

    c = mp_loss_scaler_config_keras();
    c.initial_scale = 32;
    c.growth_interval = 3;
    c.max_scale = 128;
    s = make(c);
    const float up[] = {32, 32, 64, 64, 64, 128, 128, 128, 128 /* 256 > max: kept */};
    for (int i = 0; i < 9; i++) {
        mp_loss_scaler_update(s, false);
        assert_true(mp_loss_scaler_scale(s) == up[i]);
    }
    assert_int_equal(counter(s), 0); /* reset even when growth was refused */
    mp_loss_scaler_free(s);
    c.max_scale = 100;
    s = make(c);
    for (int i = 0; i < 9; i++) mp_loss_scaler_update(s, false);
    assert_true(mp_loss_scaler_scale(s) == 64); /* 128 > 100 */
    mp_loss_scaler_free(s);
}

static void test_static_mode(void **state)
{
    (void)state;
    mp_loss_scaler *s = make(mp_loss_scaler_config_static(128.0f));
    for (int i = 0; i < 5000; i++) mp_loss_scaler_update(s, i % 7 == 0);
    assert_true(mp_loss_scaler_scale(s) == 128.0f);
    assert_int_equal(counter(s), 0);
    mp_loss_scaler_free(s);
}

static void test_invalid_configs_and_state(void **state)
{
    (void)state;
    mp_loss_scaler_config bad[8];
    for (int i = 0; i < 8; i++) bad[i] = mp_loss_scaler_config_keras();
    bad[0].growth_factor = 1.0f;
    bad[1].backoff_factor = 1.0f;
    bad[2].growth_interval = 0;
    bad[3].initial_scale = 0;
    bad[4].initial_scale = INFINITY;
    bad[5].initial_scale = NAN;
    bad[6].min_scale = 65536.0f; /* > initial */
    bad[7].max_scale = 1024.0f;  /* < initial */
    for (int i = 0; i < 8; i++) {
        mp_clear_error();
        assert_null(mp_loss_scaler_new(&bad[i]));
        assert_true(strlen(mp_last_error()) > 0);
    }
    mp_loss_scaler_config st = mp_loss_scaler_config_static(0);
    assert_null(mp_loss_scaler_new(&st));

    /* save and restore: both follow the same trajectory afterwards */
    mp_loss_scaler *a = mp_loss_scaler_new(NULL), *b = mp_loss_scaler_new(NULL);
    for (int i = 0; i < 2500; i++) mp_loss_scaler_update(a, i == 100);
    mp_loss_scaler_state sa;
    mp_loss_scaler_get_state(a, &sa);
    /* 100 clean, backoff to 2^14, 2399 clean: growth after 2000, then 399 */
    assert_true(sa.scale == 32768.0f && sa.counter == 399);
    assert_int_equal(mp_loss_scaler_set_state(b, &sa), MP_OK);
    for (int i = 0; i < 3000; i++) {
        mp_loss_scaler_update(a, i == 2000);
        mp_loss_scaler_update(b, i == 2000);
        assert_true(mp_loss_scaler_scale(a) == mp_loss_scaler_scale(b));
    }
    mp_loss_scaler_state badst = {.scale = 1, .counter = 2000};
    assert_int_equal(mp_loss_scaler_set_state(b, &badst), MP_ERR_INVALID);
    badst = (mp_loss_scaler_state){.scale = NAN, .counter = 0};
    assert_int_equal(mp_loss_scaler_set_state(b, &badst), MP_ERR_INVALID);
    mp_loss_scaler_free(a);
    mp_loss_scaler_free(b);
}

static void test_unscale(void **state)
{
    (void)state;
    float g[6] = {3.0f, -6.0f, 1e-3f, FLT_MAX, 0.0f, -0.0f};
    float orig[6];
    memcpy(orig, g, sizeof g);
    mp_param p = {.master = g, .grad = g, .n = 6};
    bool found = false;
    mp_grads_unscale(&p, 1, 3.0f, &found);
    assert_false(found);
    const float inv = (float)(1.0 / 3.0); /* the double reciprocal, rounded once */
    for (int i = 0; i < 6; i++) assert_true(f32_bits(g[i]) == f32_bits(orig[i] * inv));

    const float bads[3] = {INFINITY, -INFINITY, NAN};
    for (int k = 0; k < 3; k++) {
        float h[1000];
        for (int i = 0; i < 1000; i++) h[i] = (float)i;
        h[731] = bads[k];
        mp_param q = {.master = h, .grad = h, .n = 1000};
        found = false;
        mp_grads_unscale(&q, 1, 1024.0f, &found);
        assert_true(found);
    }
    /* found_inf accumulates (|=), it is never cleared by a clean tensor */
    float clean = 1.0f;
    mp_param q = {.master = &clean, .grad = &clean, .n = 1};
    mp_grads_unscale(&q, 1, 2.0f, &found);
    assert_true(found);
}

/* ---- the custom loop */
enum { N0 = 300, N1 = 700 };
typedef struct {
    float m0[N0], m1[N1], g0[N0], g1[N1];
    uint16_t c0[N0], c1[N1];
    mp_param p[2];
} model;

static void model_init(model *m, uint64_t seed)
{
    test_rng r = {seed};
    for (int i = 0; i < N0; i++) m->m0[i] = (float)test_rng_uniform(&r, -1, 1);
    for (int i = 0; i < N1; i++) m->m1[i] = (float)test_rng_uniform(&r, -1, 1);
    mp_convert(m->c0, MP_F16, m->m0, MP_F32, N0);
    mp_convert(m->c1, MP_F16, m->m1, MP_F32, N1);
    m->p[0] = (mp_param){"b", m->m0, m->c0, MP_F16, m->g0, N0, false};
    m->p[1] = (mp_param){"k", m->m1, m->c1, MP_F16, m->g1, N1, false};
}

/* Gradients as a backward pass of the scaled loss would leave them. */
static void scaled_grads(model *m, test_rng *r, float scale)
{
    for (int i = 0; i < N0; i++) m->g0[i] = (float)test_rng_uniform(r, -1, 1) * scale;
    for (int i = 0; i < N1; i++) m->g1[i] = (float)test_rng_uniform(r, -1, 1) * scale;
}

static void test_skipped_step_leaves_no_trace(void **state)
{
    (void)state;
    const mp_optimizer_kind kinds[3] = {MP_OPTIMIZER_SGD, MP_OPTIMIZER_ADAM, MP_OPTIMIZER_ADAMW};
    for (int k = 0; k < 3; k++) {
        model *m = malloc(sizeof *m);
        model_init(m, 40 + (uint64_t)k);
        mp_optimizer_config c = mp_optimizer_config_default(kinds[k]);
        c.momentum = kinds[k] == MP_OPTIMIZER_SGD ? 0.9f : 0.0f;
        c.schedule = (mp_lr_schedule){.decay = MP_LR_COSINE, .warmup_steps = 5, .decay_steps = 50};
        mp_optimizer *o = mp_optimizer_new(&c, m->p, 2);
        mp_loss_scaler_config sc = mp_loss_scaler_config_torch();
        sc.growth_interval = 3;
        mp_loss_scaler *s = make(sc);
        assert_non_null(o);
        test_rng r = {1};
        bool found, applied;
        for (int i = 0; i < 4; i++) { /* moments become non-zero */
            scaled_grads(m, &r, mp_loss_scaler_scale(s));
            assert_int_equal(mp_loss_scaler_get_unscaled_gradients(s, o, &found), MP_OK);
            assert_false(found);
            assert_int_equal(mp_loss_scaler_apply_gradients(s, o, &applied), MP_OK);
            assert_true(applied);
        }
        assert_true(mp_loss_scaler_scale(s) == 131072.0f); /* grew once after 3 */
        model *before = malloc(sizeof *before);
        memcpy(before, m, sizeof *m);
        int nslots = mp_optimizer_num_slots(o);
        float *slots_before[2][2];
        for (int i = 0; i < 2; i++)
            for (int sl = 0; sl < nslots; sl++) {
                int64_t n;
                float *st = mp_optimizer_slot(o, i, sl, &n);
                slots_before[i][sl] = malloc((size_t)n * sizeof(float));
                memcpy(slots_before[i][sl], st, (size_t)n * sizeof(float));
            }
        int64_t steps = mp_optimizer_step_count(o);
        float lr = mp_optimizer_learning_rate(o);

        scaled_grads(m, &r, mp_loss_scaler_scale(s));
        m->g1[N1 - 1] = INFINITY; /* one overflow in the last element */
        assert_int_equal(mp_loss_scaler_get_unscaled_gradients(s, o, &found), MP_OK);
        assert_true(found && mp_loss_scaler_found_inf(s));
        assert_int_equal(mp_loss_scaler_apply_gradients(s, o, &applied), MP_OK);
        assert_false(applied);

        assert_memory_equal(m->m0, before->m0, sizeof m->m0);
        assert_memory_equal(m->m1, before->m1, sizeof m->m1);
        assert_memory_equal(m->c0, before->c0, sizeof m->c0);
        assert_memory_equal(m->c1, before->c1, sizeof m->c1);
        for (int i = 0; i < 2; i++)
            for (int sl = 0; sl < nslots; sl++) {
                int64_t n;
                float *st = mp_optimizer_slot(o, i, sl, &n);
                assert_memory_equal(st, slots_before[i][sl], (size_t)n * sizeof(float));
                free(slots_before[i][sl]);
            }
        assert_int_equal(mp_optimizer_step_count(o), steps);
        float lr_after = mp_optimizer_learning_rate(o);
        assert_memory_equal(&lr_after, &lr, sizeof lr);
        assert_true(mp_loss_scaler_scale(s) == 65536.0f);
        assert_int_equal(counter(s), 0);

        /* the next clean step is applied again */
        scaled_grads(m, &r, mp_loss_scaler_scale(s));
        mp_loss_scaler_get_unscaled_gradients(s, o, &found);
        assert_int_equal(mp_loss_scaler_apply_gradients(s, o, &applied), MP_OK);
        assert_true(applied && mp_optimizer_step_count(o) == steps + 1);
        assert_memory_not_equal(m->m1, before->m1, sizeof m->m1);
        free(before);
        free(m);
        mp_optimizer_free(o);
        mp_loss_scaler_free(s);
    }
}

/* The unscaled gradients have global norm ~0.5 * sqrt(N) / sqrt(3) ~ 9; the
 * scaled ones ~9 * 2^16. Clipping at 4 must act on the unscaled value:
 * the update is then lr * g * 4/norm. Clipping the scaled gradients instead
 * would shrink them by a further 2^16 and the step would be ~2^16 times too
 * small, which the comparison below (relative 1e-5) catches. */
static void test_clipping_after_unscaling(void **state)
{
    (void)state;
    for (int variant = 0; variant < 2; variant++) {
        model *m = malloc(sizeof *m), *ref = malloc(sizeof *ref);
        model_init(m, 7);
        model_init(ref, 7);
        mp_optimizer_config c = mp_optimizer_config_default(MP_OPTIMIZER_SGD);
        c.learning_rate = 0.1f;
        if (variant == 1) c.clip_norm = 4.0f; /* inside the optimizer */
        mp_optimizer *o = mp_optimizer_new(&c, m->p, 2);
        mp_loss_scaler *s = mp_loss_scaler_new(NULL);
        test_rng r = {3}, r2 = {3};
        scaled_grads(m, &r, mp_loss_scaler_scale(s));
        scaled_grads(ref, &r2, 1.0f);
        double sum = 0;
        for (int i = 0; i < N0; i++) sum += (double)ref->g0[i] * ref->g0[i];
        for (int i = 0; i < N1; i++) sum += (double)ref->g1[i] * ref->g1[i];
        double norm = sqrt(sum);
        assert_true(norm > 4.0); /* clipping must actually happen */
        bool found, applied;
        assert_int_equal(mp_loss_scaler_get_unscaled_gradients(s, o, &found), MP_OK);
        if (variant == 0) {
            float got = 0;
            assert_int_equal(mp_clip_grad_norm(m->p, 2, 4.0f, &got), MP_OK);
            /* unscaling by a power of two is exact, the norm is summed in double */
            assert_true(fabs(got - norm) <= 1e-6 * norm);
        }
        assert_int_equal(mp_loss_scaler_apply_gradients(s, o, &applied), MP_OK);
        assert_true(applied);
        for (int i = 0; i < N1; i++) {
            double expect = (double)ref->m1[i] - 0.1 * ref->g1[i] * 4.0 / norm;
            double step = 0.1 * fabs(ref->g1[i]) * 4.0 / norm;
            /* a few roundings of values <= 1: 1e-6 absolute is ~16u */
            if (fabs(m->m1[i] - expect) > 1e-6)
                fail_msg("variant %d element %d: %.9g, expected %.9g (step %.3g)", variant, i,
                         (double)m->m1[i], expect, step);
        }
        free(m);
        free(ref);
        mp_optimizer_free(o);
        mp_loss_scaler_free(s);
    }
}

/* Accumulation with loss scaling: 4 micro-batches under one scale, one
 * unscale, one step, one scaler update per window. Scaling by 2^15 and
 * unscaling by 2^-15 are exact, so the result equals accumulating the
 * unscaled gradients bit for bit. An overflow in one micro-batch skips the
 * whole window. */
static void test_accumulation_window_with_scaler(void **state)
{
    (void)state;
    model *m = malloc(sizeof *m), *ref = malloc(sizeof *ref);
    model_init(m, 9);
    model_init(ref, 9);
    mp_optimizer_config c = mp_optimizer_config_default(MP_OPTIMIZER_ADAM);
    mp_optimizer *o = mp_optimizer_new(&c, m->p, 2), *oref = mp_optimizer_new(&c, ref->p, 2);
    mp_loss_scaler_config sc = mp_loss_scaler_config_keras();
    sc.growth_interval = 2;
    mp_loss_scaler *s = make(sc);
    mp_grad_accumulator *acc = mp_grad_accumulator_new(m->p, 2, 4);
    mp_grad_accumulator *accref = mp_grad_accumulator_new(ref->p, 2, 4);
    test_rng r = {5}, r2 = {5};
    bool found, applied;
    for (int w = 0; w < 4; w++) {
        float scale = mp_loss_scaler_scale(s);
        for (int k = 0; k < 4; k++) {
            scaled_grads(m, &r, scale);
            scaled_grads(ref, &r2, 1.0f);
            if (w == 2 && k == 1) m->g0[5] = INFINITY;
            assert_int_equal(mp_grad_accumulator_add(acc, mp_loss_scaler_scale(s)), MP_OK);
            assert_int_equal(mp_grad_accumulator_add(accref, 1.0f), MP_OK);
        }
        assert_int_equal(mp_grad_accumulator_finish(acc), MP_OK);
        assert_int_equal(mp_grad_accumulator_finish(accref), MP_OK);
        assert_int_equal(mp_loss_scaler_get_unscaled_gradients(s, o, &found), MP_OK);
        assert_int_equal(mp_loss_scaler_apply_gradients(s, o, &applied), MP_OK);
        assert_true(applied == (w != 2));
        if (w != 2) {
            mp_optimizer_step(oref);
            assert_memory_equal(m->m0, ref->m0, sizeof m->m0);
            assert_memory_equal(m->m1, ref->m1, sizeof m->m1);
        }
    }
    /* windows: ok (counter 1), ok (grow to 2^16), inf (back to 2^15), ok */
    assert_true(mp_loss_scaler_scale(s) == 32768.0f);
    assert_int_equal(counter(s), 1);
    assert_int_equal(mp_optimizer_step_count(o), 3);
    mp_grad_accumulator_free(acc);
    mp_grad_accumulator_free(accref);
    mp_optimizer_free(o);
    mp_optimizer_free(oref);
    mp_loss_scaler_free(s);
    free(m);
    free(ref);
}

static void test_misuse(void **state)
{
    (void)state;
    model *m = malloc(sizeof *m);
    model_init(m, 1);
    mp_optimizer_config c = mp_optimizer_config_default(MP_OPTIMIZER_SGD);
    mp_optimizer *o = mp_optimizer_new(&c, m->p, 2), *other = mp_optimizer_new(&c, m->p, 1);
    mp_loss_scaler *s = mp_loss_scaler_new(NULL);
    test_rng r = {2};
    bool found, applied = true;

    /* apply before any unscale */
    mp_clear_error();
    assert_int_equal(mp_loss_scaler_apply_gradients(s, o, &applied), MP_ERR_INVALID);
    assert_false(applied);
    assert_non_null(strstr(mp_last_error(), "before get_unscaled_gradients"));
    assert_int_equal(mp_optimizer_step_count(o), 0);

    /* unscale twice: the second call must not divide again */
    scaled_grads(m, &r, mp_loss_scaler_scale(s));
    assert_int_equal(mp_loss_scaler_get_unscaled_gradients(s, o, &found), MP_OK);
    float snapshot[N1];
    memcpy(snapshot, m->g1, sizeof snapshot);
    assert_int_equal(mp_loss_scaler_get_unscaled_gradients(s, o, &found), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "twice"));
    assert_memory_equal(snapshot, m->g1, sizeof snapshot);

    /* a different optimizer than the one unscaled */
    assert_int_equal(mp_loss_scaler_apply_gradients(s, other, &applied), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "different optimizer"));

    assert_int_equal(mp_loss_scaler_apply_gradients(s, o, &applied), MP_OK);
    assert_true(applied);
    assert_int_equal(mp_optimizer_step_count(o), 1);

    /* apply twice */
    assert_int_equal(mp_loss_scaler_apply_gradients(s, o, &applied), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "twice"));
    assert_int_equal(mp_optimizer_step_count(o), 1);
    mp_loss_scaler_state st;
    mp_loss_scaler_get_state(s, &st);
    assert_int_equal(st.counter, 1); /* the refused call did not update the scaler */

    /* the normal sequence still works after the errors */
    scaled_grads(m, &r, mp_loss_scaler_scale(s));
    assert_int_equal(mp_loss_scaler_get_unscaled_gradients(s, o, &found), MP_OK);
    assert_int_equal(mp_loss_scaler_apply_gradients(s, o, &applied), MP_OK);
    assert_int_equal(mp_optimizer_step_count(o), 2);

    assert_int_equal(mp_loss_scaler_get_unscaled_gradients(NULL, o, &found), MP_ERR_INVALID);
    assert_int_equal(mp_loss_scaler_apply_gradients(s, NULL, &applied), MP_ERR_INVALID);
    mp_loss_scaler_update(NULL, true); /* harmless */
    mp_loss_scaler_free(NULL);

    /* static mode skips a non-finite step too */
    mp_loss_scaler *st_s = make(mp_loss_scaler_config_static(8.0f));
    scaled_grads(m, &r, 8.0f);
    m->g0[0] = NAN;
    float before[N1];
    memcpy(before, m->m1, sizeof before);
    assert_int_equal(mp_loss_scaler_get_unscaled_gradients(st_s, o, &found), MP_OK);
    assert_true(found);
    assert_int_equal(mp_loss_scaler_apply_gradients(st_s, o, &applied), MP_OK);
    assert_false(applied);
    assert_memory_equal(before, m->m1, sizeof before);
    assert_true(mp_loss_scaler_scale(st_s) == 8.0f);
    mp_loss_scaler_free(st_s);

    mp_optimizer_free(o);
    mp_optimizer_free(other);
    mp_loss_scaler_free(s);
    free(m);
}

/* mp_grads_all_finite: every position of a gradient long enough to be
 * scanned in parallel chunks, inf and NaN, a frozen parameter skipped, and
 * the gradients left as they were. */
static void test_all_finite(void **state)
{
    (void)state;
    const int64_t n = 100003; /* several scan chunks and a partial one */
    float *g = malloc((size_t)n * sizeof *g), *h = malloc(8 * sizeof *h);
    for (int64_t j = 0; j < n; j++) g[j] = (float)(j % 7) - 3.0f;
    for (int j = 0; j < 8; j++) h[j] = 1e38f;
    mp_param p[3] = {{"a", NULL, NULL, MP_F32, g, n, false},
                     {"frozen", NULL, NULL, MP_F32, NULL, 5, false},
                     {"b", NULL, NULL, MP_F32, h, 8, false}};
    assert_true(mp_grads_all_finite(p, 3));
    const int64_t at[] = {0, 1, 16383, 16384, 50000, n - 1};
    for (size_t k = 0; k < sizeof at / sizeof *at; k++) {
        float keep = g[at[k]];
        g[at[k]] = k % 2 ? NAN : -INFINITY;
        assert_false(mp_grads_all_finite(p, 3));
        g[at[k]] = keep;
    }
    h[7] = INFINITY;
    assert_false(mp_grads_all_finite(p, 3));
    assert_true(mp_grads_all_finite(p, 2));
    assert_true(g[5] == 2.0f && g[n - 1] == (float)((n - 1) % 7) - 3.0f);
    free(g);
    free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets_and_default),
        cmocka_unit_test(test_overflow_at_counter_1999),
        cmocka_unit_test(test_growth_past_float_max_is_skipped),
        cmocka_unit_test(test_repeated_backoff_towards_zero),
        cmocka_unit_test(test_min_max_clamps),
        cmocka_unit_test(test_static_mode),
        cmocka_unit_test(test_invalid_configs_and_state),
        cmocka_unit_test(test_unscale),
        cmocka_unit_test(test_all_finite),
        cmocka_unit_test(test_skipped_step_leaves_no_trace),
        cmocka_unit_test(test_clipping_after_unscaling),
        cmocka_unit_test(test_accumulation_window_with_scaler),
        cmocka_unit_test(test_misuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
