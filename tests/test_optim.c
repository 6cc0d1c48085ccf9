/* test_optim.c - optimizers, schedules, clipping and accumulation against an
 * independent float64 reference, the low-precision weight copy, and the
 * pure-bf16 demonstration (round-to-nearest vs stochastic vs masters). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* float32 unit roundoff: the relative error bound of one rounded op. */
static const double U = 0x1p-24;

enum { NP = 2, STEPS = 10 };
static const int64_t LEN[NP] = {37, 1000}; /* 1000 crosses the 512-float chunks */

typedef struct {
    mp_param p[NP];
    float *master[NP], *grad[NP];
    uint16_t *copy[NP];
    double *rw[NP], *rs0[NP], *rs1[NP]; /* reference weights and state */
} fixture;

static void fixture_init(fixture *f, mp_dtype copy_type, uint64_t seed)
{
    test_rng r = {seed};
    memset(f, 0, sizeof *f);
    for (int i = 0; i < NP; i++) {
        int64_t n = LEN[i];
        f->master[i] = malloc((size_t)n * sizeof(float));
        f->grad[i] = calloc((size_t)n, sizeof(float));
        f->copy[i] = calloc((size_t)n, 2);
        f->rw[i] = malloc((size_t)n * sizeof(double));
        f->rs0[i] = calloc((size_t)n, sizeof(double));
        f->rs1[i] = calloc((size_t)n, sizeof(double));
        for (int64_t j = 0; j < n; j++) {
            f->master[i][j] = (float)test_rng_uniform(&r, -1, 1);
            f->rw[i][j] = f->master[i][j];
        }
        f->p[i] = (mp_param){.name = i ? "dense.kernel" : "dense.bias",
                             .master = f->master[i],
                             .weight = copy_type == MP_F32 ? (void *)f->master[i] : f->copy[i],
                             .weight_dtype = copy_type,
                             .grad = f->grad[i],
                             .n = n};
        if (copy_type != MP_F32) mp_convert(f->copy[i], copy_type, f->master[i], MP_F32, (size_t)n);
    }
}

static void fixture_free(fixture *f)
{
    for (int i = 0; i < NP; i++) {
        free(f->master[i]);
        free(f->grad[i]);
        free(f->copy[i]);
        free(f->rw[i]);
        free(f->rs0[i]);
        free(f->rs1[i]);
    }
}

/* Gradients with |g| in [0.1, 1] and random sign, so that Adam's sqrt(v_hat)
 * stays >= 0.1 and its ratio m_hat / sqrt(v_hat) is well conditioned. */
static void random_grads(fixture *f, test_rng *r)
{
    for (int i = 0; i < NP; i++)
        for (int64_t j = 0; j < LEN[i]; j++) {
            double m = test_rng_uniform(r, 0.1, 1.0);
            f->grad[i][j] = (float)(test_rng_next(r) & 1 ? m : -m);
        }
}

/* ---- the float64 reference: written from the textbook formulas, not from
 * the library's code. */
static double ref_lr(const mp_lr_schedule *s, double base, int64_t t)
{
    if (t < s->warmup_steps) {
        double f0 = s->warmup_start_factor;
        return base * (f0 + (1 - f0) * (double)(t + 1) / (double)s->warmup_steps);
    }
    t -= s->warmup_steps;
    if (s->decay == MP_LR_STEP_DECAY)
        return base * pow(s->gamma, floor((double)t / (double)s->step_size));
    if (s->decay == MP_LR_COSINE) {
        double x = t > s->decay_steps ? 1.0 : (double)t / (double)s->decay_steps;
        return s->final_lr + (base - s->final_lr) * (1 + cos(acos(-1.0) * x)) / 2;
    }
    return base;
}

static void ref_step(fixture *f, const mp_optimizer_config *c, int64_t t /* 1-based */)
{
    double lr = ref_lr(&c->schedule, c->learning_rate, t - 1);
    double wd = c->weight_decay;
    for (int i = 0; i < NP; i++)
        for (int64_t j = 0; j < LEN[i]; j++) {
            double g = f->grad[i][j], w = f->rw[i][j];
            if (c->kind == MP_OPTIMIZER_SGD) {
                g += wd * w;
                if (c->momentum > 0) {
                    f->rs0[i][j] = c->momentum * f->rs0[i][j] + g;
                    g = c->nesterov ? g + c->momentum * f->rs0[i][j] : f->rs0[i][j];
                }
                w -= lr * g;
            } else {
                if (c->kind == MP_OPTIMIZER_ADAMW)
                    w *= 1 - lr * wd;
                else
                    g += wd * w;
                double b1 = c->beta1, b2 = c->beta2;
                f->rs0[i][j] = b1 * f->rs0[i][j] + (1 - b1) * g;
                f->rs1[i][j] = b2 * f->rs1[i][j] + (1 - b2) * g * g;
                double mh = f->rs0[i][j] / (1 - pow(b1, (double)t));
                double vh = f->rs1[i][j] / (1 - pow(b2, (double)t));
                w -= lr * mh / (sqrt(vh) + c->epsilon);
            }
            f->rw[i][j] = w;
        }
}

/* Run STEPS steps of the library and of the reference and compare masters and
 * moments. Error bound, per element after S steps (u = 2^-24):
 *  - SGD: each step rounds ~4 ops on values <= M (the largest |w|, |g_eff|,
 *    |buffer| seen); a momentum-buffer error decays by momentum <= 0.9 per
 *    step, so it stays <= 10 * 3uM and enters w scaled by lr (<= 0.1) and
 *    (1 + momentum): per step <= 2uM + 0.1 * 1.9 * 30uM < 8uM. We allow 16uM
 *    per step (factor 2 margin).
 *  - Adam/AdamW: with |g| in [0.1, 1], |m_hat / sqrt(v_hat)| <= 10 and the
 *    ratio's absolute error <= ~8u / 0.1 + 10 * 8u / 2 = 120u; the update adds
 *    lr * 120u and w's own rounding 2u|w|. We allow S * u * (4 M + 256 lr).
 * A wrong rule (no bias correction, epsilon on the uncorrected root, coupled
 * instead of decoupled decay) moves values by > 1e-4, far above these. */
static void compare_run(const mp_optimizer_config *c, const char *what)
{
    fixture f;
    fixture_init(&f, MP_BF16, 1234);
    mp_optimizer *o = mp_optimizer_new(c, f.p, NP);
    assert_non_null(o);
    test_rng r = {99};
    double maxmag = 1.0, maxlr = 0;
    for (int64_t t = 1; t <= STEPS; t++) {
        random_grads(&f, &r);
        maxlr = fmax(maxlr, ref_lr(&c->schedule, c->learning_rate, t - 1));
        assert_int_equal(mp_optimizer_step(o), MP_OK);
        ref_step(&f, c, t);
        for (int i = 0; i < NP; i++)
            for (int64_t j = 0; j < LEN[i]; j++) {
                maxmag = fmax(maxmag, fabs(f.rw[i][j]));
                maxmag = fmax(maxmag, fabs(f.rs0[i][j]));
            }
        double tol = c->kind == MP_OPTIMIZER_SGD ? (double)t * 16 * U * maxmag
                                                 : (double)t * U * (4 * maxmag + 256 * maxlr);
        double worst = 0;
        for (int i = 0; i < NP; i++)
            for (int64_t j = 0; j < LEN[i]; j++) {
                worst = fmax(worst, fabs(f.master[i][j] - f.rw[i][j]));
                for (int s = 0; s < mp_optimizer_num_slots(o); s++) {
                    const float *st = mp_optimizer_slot(o, i, s, NULL);
                    const double *rs = s ? f.rs1[i] : f.rs0[i];
                    /* moments are EMAs of values <= 1: a few roundings each step */
                    if (fabs(st[j] - rs[j]) > (double)t * 8 * U * fmax(1.0, fabs(rs[j])))
                        fail_msg("%s step %lld: slot %d of param %d[%lld] = %.9g, reference %.9g",
                                 what, (long long)t, s, i, (long long)j, (double)st[j], rs[j]);
                }
                /* the forward copy is the RNE conversion of the master */
                assert_int_equal(f.copy[i][j], mp_f32_to_bf16(f.master[i][j]));
            }
        if (worst > tol)
            fail_msg("%s step %lld: master error %.3g > tolerance %.3g", what, (long long)t, worst,
                     tol);
    }
    assert_int_equal(mp_optimizer_step_count(o), STEPS);
    mp_optimizer_free(o);
    fixture_free(&f);
}

static void test_sgd_matches_reference(void **state)
{
    (void)state;
    mp_optimizer_config c = mp_optimizer_config_default(MP_OPTIMIZER_SGD);
    c.learning_rate = 0.1f;
    compare_run(&c, "sgd");
    c.momentum = 0.9f;
    compare_run(&c, "sgd momentum");
    c.nesterov = true;
    compare_run(&c, "sgd nesterov");
    c.weight_decay = 0.05f;
    compare_run(&c, "sgd nesterov wd");
    c.nesterov = false;
    c.schedule.decay = MP_LR_STEP_DECAY;
    c.schedule.step_size = 3;
    c.schedule.gamma = 0.5f;
    compare_run(&c, "sgd momentum wd step-decay");
}

static void test_adam_matches_reference(void **state)
{
    (void)state;
    mp_optimizer_config c = mp_optimizer_config_default(MP_OPTIMIZER_ADAM);
    c.learning_rate = 0.01f;
    compare_run(&c, "adam");
    c.epsilon = 1e-3f; /* large enough that the epsilon form shows */
    compare_run(&c, "adam eps 1e-3");
    c.weight_decay = 0.1f;
    compare_run(&c, "adam L2");
    c.schedule = (mp_lr_schedule){.decay = MP_LR_COSINE,
                                  .warmup_steps = 3,
                                  .warmup_start_factor = 0.1f,
                                  .decay_steps = 5,
                                  .final_lr = 1e-4f};
    compare_run(&c, "adam L2 warmup+cosine");
}

static void test_adamw_matches_reference(void **state)
{
    (void)state;
    mp_optimizer_config c = mp_optimizer_config_default(MP_OPTIMIZER_ADAMW);
    assert_true(c.weight_decay == 0.01f);
    c.learning_rate = 0.01f;
    c.weight_decay = 0.1f;
    compare_run(&c, "adamw");
    c.epsilon = 1e-3f;
    compare_run(&c, "adamw eps 1e-3");
}

/* The reference comparison must be able to fail: feed the reference a
 * wrong rule (Keras' epsilon-hat form) and check that the library's result
 * is far outside the tolerance. */
static void test_reference_detects_wrong_epsilon_form(void **state)
{
    (void)state;
    float w = 0.5f, g = 0.3f;
    mp_param p = {.master = &w, .weight = &w, .weight_dtype = MP_F32, .grad = &g, .n = 1};
    mp_optimizer_config c = mp_optimizer_config_default(MP_OPTIMIZER_ADAM);
    c.learning_rate = 0.01f;
    c.epsilon = 1e-3f;
    mp_optimizer *o = mp_optimizer_new(&c, &p, 1);
    assert_non_null(o);
    assert_int_equal(mp_optimizer_step(o), MP_OK);
    double b2 = c.beta2;
    double pytorch = 0.5 - 0.01 * 0.3 / (0.3 + 1e-3);
    /* Keras folds the bias correction into the rate and adds epsilon to the
     * uncorrected root; at t = 1 that is epsilon / sqrt(1 - beta2) on |g|. */
    double keras = 0.5 - 0.01 * 0.3 / (0.3 + 1e-3 / sqrt(1 - b2));
    assert_true(fabs(w - pytorch) < 1e-7);
    assert_true(fabs(w - keras) > 1e-4);
    mp_optimizer_free(o);
}

static void test_f16_copy_and_frozen(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, MP_F16, 5);
    float frozen_w[4] = {1, 2, 3, 4}, frozen_before[4];
    memcpy(frozen_before, frozen_w, sizeof frozen_w);
    mp_param all[NP + 1];
    memcpy(all, f.p, sizeof f.p);
    all[NP] = (mp_param){.name = "frozen",
                         .master = frozen_w,
                         .weight = frozen_w,
                         .weight_dtype = MP_F32,
                         .grad = NULL,
                         .n = 4};
    mp_optimizer_config c = mp_optimizer_config_default(MP_OPTIMIZER_ADAMW);
    mp_optimizer *o = mp_optimizer_new(&c, all, NP + 1);
    assert_non_null(o);
    test_rng r = {3};
    for (int s = 0; s < 5; s++) {
        random_grads(&f, &r);
        assert_int_equal(mp_optimizer_step(o), MP_OK);
        for (int i = 0; i < NP; i++)
            for (int64_t j = 0; j < LEN[i]; j++)
                assert_int_equal(f.copy[i][j], mp_f32_to_f16(f.master[i][j]));
    }
    assert_memory_equal(frozen_w, frozen_before, sizeof frozen_w);
    /* refresh rewrites a stale copy */
    memset(f.copy[1], 0, (size_t)LEN[1] * 2);
    mp_optimizer_refresh_weights(o);
    for (int64_t j = 0; j < LEN[1]; j++)
        assert_int_equal(f.copy[1][j], mp_f32_to_f16(f.master[1][j]));
    mp_optimizer_free(o);
    fixture_free(&f);
}

/* ---- the demonstration of issue 5: 10,000 updates of 1e-4 to a weight of
 * 1.0 with SGD lr = 1, grad = -1e-4. */
enum { DEMO_STEPS = 10000, DEMO_N = 256 };

static void run_demo(mp_param *p, mp_rounding rounding, uint64_t seed)
{
    mp_optimizer_config c = mp_optimizer_config_default(MP_OPTIMIZER_SGD);
    c.learning_rate = 1.0f;
    c.rounding = rounding;
    c.seed = seed;
    mp_optimizer *o = mp_optimizer_new(&c, p, 1);
    assert_non_null(o);
    for (int64_t j = 0; j < p->n; j++) p->grad[j] = -1e-4f;
    for (int s = 0; s < DEMO_STEPS; s++) assert_int_equal(mp_optimizer_step(o), MP_OK);
    mp_optimizer_free(o);
}

static void test_pure_bf16_demo(void **state)
{
    (void)state;
    uint16_t w[DEMO_N];
    float g[DEMO_N];
    mp_param p = {
        .name = "w", .master = NULL, .weight = w, .weight_dtype = MP_BF16, .grad = g, .n = DEMO_N};

    /* Round to nearest: 1 + 1e-4 is within half a bf16 step (2^-8) of 1. */
    for (int j = 0; j < DEMO_N; j++) w[j] = mp_f32_to_bf16(1.0f);
    run_demo(&p, MP_ROUND_NEAREST, 0);
    for (int j = 0; j < DEMO_N; j++) assert_int_equal(w[j], mp_f32_to_bf16(1.0f));

    /* Stochastic: each element is a martingale with expected end 2.0. One
     * step's deviation is bounded by the grid step q <= 2^-6 (values stay
     * below 4) and has variance <= 1e-4 * q, so the total variance is
     * sigma^2 <= 1e4 * 1e-4 * 2^-6 = 0.0156 (sigma 0.125). Freedman's
     * inequality P(|dev| >= a) <= 2 exp(-a^2 / (2 (sigma^2 + q a / 3))):
     * per element a = 0.75 gives 1.1e-6 (x256 elements: 3e-4); for the mean
     * of the 256 independent elements a = 0.05 gives 2e-9. */
    for (int j = 0; j < DEMO_N; j++) w[j] = mp_f32_to_bf16(1.0f);
    run_demo(&p, MP_ROUND_STOCHASTIC, 2024);
    double mean = 0;
    for (int j = 0; j < DEMO_N; j++) {
        double v = mp_bf16_to_f32(w[j]);
        if (fabs(v - 2.0) >= 0.75) fail_msg("element %d ended at %g, not near 2", j, v);
        mean += v / DEMO_N;
    }
    if (fabs(mean - 2.0) >= 0.05)
        fail_msg("stochastic-rounding mean %g not within 0.05 of 2", mean);

    /* Reproducible for a seed, different for another. */
    uint16_t first[DEMO_N];
    memcpy(first, w, sizeof w);
    for (int j = 0; j < DEMO_N; j++) w[j] = mp_f32_to_bf16(1.0f);
    run_demo(&p, MP_ROUND_STOCHASTIC, 2024);
    assert_memory_equal(first, w, sizeof w);
    for (int j = 0; j < DEMO_N; j++) w[j] = mp_f32_to_bf16(1.0f);
    run_demo(&p, MP_ROUND_STOCHASTIC, 2025);
    assert_memory_not_equal(first, w, sizeof w);

    /* Masters: each f32 addition errs by <= 2^-24 (half an ulp in [1, 2]),
     * 1e4 of them <= 6e-4; 1e-4f itself is off by 1e-4 * 2^-24 (negligible).
     * Bound 1e-3. The bf16 copy is RNE(master) = 2.0 exactly. */
    float master[DEMO_N];
    for (int j = 0; j < DEMO_N; j++) {
        master[j] = 1.0f;
        w[j] = mp_f32_to_bf16(1.0f);
    }
    p.master = master;
    run_demo(&p, MP_ROUND_NEAREST, 0);
    for (int j = 0; j < DEMO_N; j++) {
        assert_true(fabs(master[j] - 2.0) < 1e-3);
        assert_int_equal(w[j], mp_f32_to_bf16(2.0f));
    }
}

static void test_pure_f32_and_f16_round_trip(void **state)
{
    (void)state;
    /* master == NULL with an f32 weight: the weight is the master. */
    float w32[3] = {1, 2, 3}, g[3] = {1, 1, 1};
    mp_param p = {.weight = w32, .weight_dtype = MP_F32, .grad = g, .n = 3};
    mp_optimizer_config c = mp_optimizer_config_default(MP_OPTIMIZER_SGD);
    c.learning_rate = 0.5f;
    mp_optimizer *o = mp_optimizer_new(&c, &p, 1);
    assert_non_null(o);
    assert_int_equal(mp_optimizer_step(o), MP_OK);
    assert_true(w32[0] == 0.5f && w32[1] == 1.5f && w32[2] == 2.5f);
    mp_optimizer_free(o);

    /* pure f16, round to nearest: the result is RNE of the f32 update. */
    uint16_t w16[3];
    float start[3] = {1.0f, -0.3f, 1000.0f};
    for (int j = 0; j < 3; j++) w16[j] = mp_f32_to_f16(start[j]);
    p = (mp_param){.weight = w16, .weight_dtype = MP_F16, .grad = g, .n = 3};
    c.learning_rate = 0.01f;
    o = mp_optimizer_new(&c, &p, 1);
    assert_non_null(o);
    assert_int_equal(mp_optimizer_step(o), MP_OK);
    for (int j = 0; j < 3; j++) {
        float expect = mp_f16_to_f32(mp_f32_to_f16(start[j])) - 0.01f * 1.0f;
        assert_int_equal(w16[j], mp_f32_to_f16(expect));
    }
    mp_optimizer_free(o);
}

/* ---- schedules */
static void test_schedules(void **state)
{
    (void)state;
    mp_lr_schedule s = mp_lr_schedule_default();
    assert_int_equal(mp_lr_schedule_validate(&s), MP_OK);
    for (int t = 0; t < 5; t++) assert_true(mp_lr_schedule_at(&s, 0.1f, t) == 0.1f);

    s.decay = MP_LR_STEP_DECAY;
    s.step_size = 3;
    s.gamma = 0.5f;
    const float step_expect[] = {1, 1, 1, 0.5f, 0.5f, 0.5f, 0.25f};
    for (int t = 0; t < 7; t++) assert_true(mp_lr_schedule_at(&s, 1.0f, t) == step_expect[t]);

    s = (mp_lr_schedule){.decay = MP_LR_COSINE, .decay_steps = 10, .final_lr = 0.1f};
    assert_true(mp_lr_schedule_at(&s, 1.0f, 0) == 1.0f);
    /* halfway: cos(pi/2) = 6e-17 in double, so (1 + 0.1) / 2 after float rounding */
    assert_true(mp_lr_schedule_at(&s, 1.0f, 5) == (float)(0.1 + 0.9 * 0.5));
    assert_true(mp_lr_schedule_at(&s, 1.0f, 10) == 0.1f);
    assert_true(mp_lr_schedule_at(&s, 1.0f, 1000) == 0.1f);
    for (int t = 1; t <= 10; t++)
        assert_true(mp_lr_schedule_at(&s, 1.0f, t) < mp_lr_schedule_at(&s, 1.0f, t - 1));

    /* warm-up 4 from 0, then cosine starting at the base rate */
    s.warmup_steps = 4;
    const float warm[] = {0.25f, 0.5f, 0.75f, 1.0f, 1.0f};
    for (int t = 0; t < 5; t++) assert_true(mp_lr_schedule_at(&s, 1.0f, t) == warm[t]);
    assert_true(mp_lr_schedule_at(&s, 1.0f, 14) == 0.1f);

    /* the optimizer follows its step count */
    float w = 0, g = -1;
    mp_param p = {.master = &w, .weight_dtype = MP_F32, .grad = &g, .n = 1};
    mp_optimizer_config c = mp_optimizer_config_default(MP_OPTIMIZER_SGD);
    c.learning_rate = 1.0f;
    c.schedule = s;
    mp_optimizer *o = mp_optimizer_new(&c, &p, 1);
    assert_non_null(o);
    for (int t = 0; t < 4; t++) {
        assert_true(mp_optimizer_learning_rate(o) == warm[t]);
        mp_optimizer_step(o);
    }
    assert_true(w == 0.25f + 0.5f + 0.75f + 1.0f);
    assert_int_equal(mp_optimizer_set_learning_rate(o, 2.0f), MP_OK);
    assert_true(mp_optimizer_learning_rate(o) == 2.0f);
    assert_int_equal(mp_optimizer_set_step_count(o, 14), MP_OK);
    assert_true(mp_optimizer_learning_rate(o) == 0.1f); /* final_lr is absolute */
    mp_optimizer_free(o);

    mp_lr_schedule bad = {.decay = MP_LR_STEP_DECAY, .step_size = 0, .gamma = 0.5f};
    assert_int_equal(mp_lr_schedule_validate(&bad), MP_ERR_INVALID);
    bad = (mp_lr_schedule){.decay = MP_LR_COSINE, .decay_steps = 0};
    assert_int_equal(mp_lr_schedule_validate(&bad), MP_ERR_INVALID);
    bad = (mp_lr_schedule){.decay = MP_LR_CONSTANT, .warmup_steps = 2, .warmup_start_factor = 2};
    assert_int_equal(mp_lr_schedule_validate(&bad), MP_ERR_INVALID);
    assert_true(strlen(mp_last_error()) > 0);
}

/* ---- clipping */
static void test_clipping(void **state)
{
    (void)state;
    float g1[2] = {3, 0}, g2[1] = {4};
    mp_param p[2] = {{.grad = g1, .n = 2, .master = g1}, {.grad = g2, .n = 1, .master = g2}};
    assert_true(mp_grad_global_norm(p, 2) == 5.0f);
    float norm = 0;
    assert_int_equal(mp_clip_grad_norm(p, 2, 10.0f, &norm), MP_OK);
    assert_true(norm == 5.0f && g1[0] == 3 && g2[0] == 4); /* within the bound: untouched */
    assert_int_equal(mp_clip_grad_norm(p, 2, 1.0f, &norm), MP_OK);
    /* factor (float)(1/5) then one rounding per element: within 2u of 0.6, 0.8 */
    assert_true(fabs(g1[0] - 0.6) <= 2 * U * 0.6 && fabs(g2[0] - 0.8) <= 2 * U * 0.8);
    assert_true(fabs(mp_grad_global_norm(p, 2) - 1.0) <= 4 * U);

    float v[5] = {-3, -0.5f, 0.25f, 7, NAN};
    mp_param pv = {.grad = v, .n = 5, .master = v};
    assert_int_equal(mp_clip_grad_value(&pv, 1, 1.0f), MP_OK);
    assert_true(v[0] == -1 && v[1] == -0.5f && v[2] == 0.25f && v[3] == 1);
    assert_true(isnan(v[4])); /* NaN is not hidden as a bound */
    assert_int_equal(mp_clip_grad_value(&pv, 1, 0.0f), MP_ERR_INVALID);
    assert_int_equal(mp_clip_grad_norm(&pv, 1, -1.0f, NULL), MP_ERR_INVALID);

    /* the optimizer's clip_norm equals clipping in place then stepping, bit for bit */
    fixture a, b;
    fixture_init(&a, MP_BF16, 8);
    fixture_init(&b, MP_BF16, 8);
    test_rng r1 = {4}, r2 = {4};
    mp_optimizer_config c = mp_optimizer_config_default(MP_OPTIMIZER_ADAM);
    mp_optimizer *oa = mp_optimizer_new(&c, a.p, NP);
    c.clip_norm = 2.0f;
    mp_optimizer *ob = mp_optimizer_new(&c, b.p, NP);
    for (int s = 0; s < 3; s++) {
        random_grads(&a, &r1);
        random_grads(&b, &r2);
        assert_int_equal(mp_clip_grad_norm(a.p, NP, 2.0f, NULL), MP_OK);
        mp_optimizer_step(oa);
        mp_optimizer_step(ob);
    }
    for (int i = 0; i < NP; i++)
        assert_memory_equal(a.master[i], b.master[i], (size_t)LEN[i] * sizeof(float));
    mp_optimizer_free(oa);
    mp_optimizer_free(ob);
    fixture_free(&a);
    fixture_free(&b);
}

/* ---- accumulation */
static void test_accumulation_equals_mean_step(void **state)
{
    (void)state;
    fixture a, b;
    fixture_init(&a, MP_BF16, 77);
    fixture_init(&b, MP_BF16, 77);
    mp_optimizer_config c = mp_optimizer_config_default(MP_OPTIMIZER_SGD);
    c.learning_rate = 0.1f;
    c.momentum = 0.9f;
    mp_optimizer *oa = mp_optimizer_new(&c, a.p, NP);
    mp_optimizer *ob = mp_optimizer_new(&c, b.p, NP);
    mp_grad_accumulator *acc = mp_grad_accumulator_new(a.p, NP, 4);
    assert_non_null(acc);
    test_rng r = {11};
    for (int w = 0; w < 3; w++) {
        double *mean[NP];
        for (int i = 0; i < NP; i++) mean[i] = calloc((size_t)LEN[i], sizeof(double));
        for (int k = 0; k < 4; k++) {
            assert_false(mp_grad_accumulator_ready(acc));
            random_grads(&a, &r);
            for (int i = 0; i < NP; i++)
                for (int64_t j = 0; j < LEN[i]; j++) mean[i][j] += a.grad[i][j] / 4.0;
            assert_int_equal(mp_grad_accumulator_add(acc, 1.0f), MP_OK);
        }
        assert_true(mp_grad_accumulator_ready(acc));
        assert_int_equal(mp_grad_accumulator_add(acc, 1.0f), MP_ERR_INVALID); /* full */
        assert_int_equal(mp_grad_accumulator_finish(acc), MP_OK);
        assert_int_equal(mp_grad_accumulator_count(acc), 0);
        /* the mean in f32: 3 additions and a division by 4 (exact), each
         * rounding <= u * 4 (|partial sums| <= 4), so |error| <= 3 * 4u / 4 = 3u */
        for (int i = 0; i < NP; i++)
            for (int64_t j = 0; j < LEN[i]; j++) {
                assert_true(fabs(a.grad[i][j] - mean[i][j]) <= 3 * U);
                b.grad[i][j] = (float)mean[i][j];
            }
        mp_optimizer_step(oa);
        mp_optimizer_step(ob);
        for (int i = 0; i < NP; i++) free(mean[i]);
    }
    /* gradients agree within 4u; through SGD momentum (lr 0.1, buffer sum
     * <= 10x) a gradient difference moves w by <= 3 * 0.1 * 10 * 4u = 12u,
     * plus the mean's own rounding in b (u). Allow 32u. */
    for (int i = 0; i < NP; i++)
        for (int64_t j = 0; j < LEN[i]; j++)
            assert_true(fabs(a.master[i][j] - b.master[i][j]) <= 32 * U);
    assert_int_equal(mp_grad_accumulator_finish(acc), MP_ERR_INVALID); /* empty window */
    assert_int_equal(mp_grad_accumulator_add(acc, 1024.0f), MP_OK);
    assert_int_equal(mp_grad_accumulator_add(acc, 512.0f), MP_ERR_INVALID); /* scale changed */
    assert_non_null(strstr(mp_last_error(), "loss scale changed"));
    mp_grad_accumulator_free(acc);
    mp_optimizer_free(oa);
    mp_optimizer_free(ob);
    fixture_free(&a);
    fixture_free(&b);
}

/* ---- state: accessors and an exact save/restore */
static void test_state_restore(void **state)
{
    (void)state;
    fixture a, b;
    fixture_init(&a, MP_BF16, 21);
    fixture_init(&b, MP_BF16, 22); /* different start: everything gets copied */
    mp_optimizer_config c = mp_optimizer_config_default(MP_OPTIMIZER_ADAMW);
    c.schedule = (mp_lr_schedule){.decay = MP_LR_COSINE, .decay_steps = 20};
    mp_optimizer *oa = mp_optimizer_new(&c, a.p, NP);
    mp_optimizer *ob = mp_optimizer_new(&c, b.p, NP);
    assert_int_equal(mp_optimizer_num_params(oa), NP);
    assert_int_equal(mp_optimizer_num_slots(oa), 2);
    assert_string_equal(mp_optimizer_slot_name(oa, 0), "exp_avg");
    assert_string_equal(mp_optimizer_slot_name(oa, 1), "exp_avg_sq");
    assert_null(mp_optimizer_slot_name(oa, 2));
    assert_string_equal(mp_optimizer_param(oa, 1)->name, "dense.kernel");
    assert_null(mp_optimizer_slot(oa, 2, 0, NULL));
    assert_null(mp_optimizer_slot(oa, 0, 2, NULL));
    test_rng r = {5};
    for (int s = 0; s < 3; s++) {
        random_grads(&a, &r);
        mp_optimizer_step(oa);
    }
    /* "checkpoint": masters, both slots, the step count */
    for (int i = 0; i < NP; i++) {
        memcpy(b.master[i], a.master[i], (size_t)LEN[i] * sizeof(float));
        for (int s = 0; s < 2; s++) {
            int64_t n = 0;
            float *src = mp_optimizer_slot(oa, i, s, &n);
            assert_int_equal(n, LEN[i]);
            memcpy(mp_optimizer_slot(ob, i, s, NULL), src, (size_t)n * sizeof(float));
        }
    }
    assert_int_equal(mp_optimizer_set_step_count(ob, mp_optimizer_step_count(oa)), MP_OK);
    mp_optimizer_refresh_weights(ob);
    for (int s = 0; s < 3; s++) {
        random_grads(&a, &r);
        for (int i = 0; i < NP; i++) memcpy(b.grad[i], a.grad[i], (size_t)LEN[i] * sizeof(float));
        mp_optimizer_step(oa);
        mp_optimizer_step(ob);
    }
    for (int i = 0; i < NP; i++) {
        assert_memory_equal(a.master[i], b.master[i], (size_t)LEN[i] * sizeof(float));
        assert_memory_equal(a.copy[i], b.copy[i], (size_t)LEN[i] * 2);
    }
    assert_int_equal(mp_optimizer_set_step_count(ob, -1), MP_ERR_INVALID);
    mp_optimizer_free(oa);
    mp_optimizer_free(ob);
    fixture_free(&a);
    fixture_free(&b);

    /* SGD slots */
    float w = 1, g = 1;
    mp_param p = {.master = &w, .weight_dtype = MP_F32, .grad = &g, .n = 1};
    mp_optimizer_config sc = mp_optimizer_config_default(MP_OPTIMIZER_SGD);
    mp_optimizer *o = mp_optimizer_new(&sc, &p, 1);
    assert_int_equal(mp_optimizer_num_slots(o), 0);
    mp_optimizer_free(o);
    sc.momentum = 0.5f;
    o = mp_optimizer_new(&sc, &p, 1);
    assert_int_equal(mp_optimizer_num_slots(o), 1);
    assert_string_equal(mp_optimizer_slot_name(o, 0), "momentum_buffer");
    mp_optimizer_free(o);
}

/* The AVX-512 kernels and the threaded chunk loop give the scalar
 * single-thread bits: every rule (clip by value incl. NaN, L2, decoupled
 * decay, nesterov), tails that are not a multiple of 16, a tensor large
 * enough to be split across threads, pure bf16 with stochastic rounding. */
enum { BIG = 70001, SMALL = 45 };
typedef struct {
    float m[BIG], g[BIG];
    uint16_t c[BIG], lp[SMALL];
    float gs[SMALL];
} paths_data;

static void run_paths(paths_data *d, const mp_optimizer_config *c)
{
    test_rng r = {17};
    for (int j = 0; j < BIG; j++) d->m[j] = (float)test_rng_uniform(&r, -2, 2);
    for (int j = 0; j < SMALL; j++) d->lp[j] = mp_f32_to_bf16((float)test_rng_uniform(&r, -2, 2));
    mp_convert(d->c, MP_BF16, d->m, MP_F32, BIG);
    mp_param p[2] = {{"big", d->m, d->c, MP_BF16, d->g, BIG, false},
                     {"lp", NULL, d->lp, MP_BF16, d->gs, SMALL, false}};
    mp_optimizer *o = mp_optimizer_new(c, p, 2);
    assert_non_null(o);
    for (int s = 0; s < 3; s++) {
        for (int j = 0; j < BIG; j++) d->g[j] = (float)test_rng_uniform(&r, -3, 3);
        for (int j = 0; j < SMALL; j++) d->gs[j] = (float)test_rng_uniform(&r, -3, 3);
        d->g[12345] = s == 1 ? NAN : d->g[12345]; /* NaN passes through clipping */
        assert_int_equal(mp_optimizer_step(o), MP_OK);
    }
    mp_optimizer_free(o);
}

static void test_paths_bit_identical(void **state)
{
    (void)state;
    mp_optimizer_config cs[4];
    cs[0] = mp_optimizer_config_default(MP_OPTIMIZER_SGD);
    cs[0].momentum = 0.9f;
    cs[0].nesterov = true;
    cs[0].weight_decay = 0.01f;
    cs[0].clip_value = 1.0f;
    cs[1] = mp_optimizer_config_default(MP_OPTIMIZER_ADAM);
    cs[1].weight_decay = 0.1f;
    cs[1].clip_value = 2.0f;
    cs[2] = mp_optimizer_config_default(MP_OPTIMIZER_ADAMW);
    cs[2].clip_norm = 10.0f;
    cs[3] = mp_optimizer_config_default(MP_OPTIMIZER_SGD);
    for (int i = 0; i < 4; i++) {
        cs[i].rounding = MP_ROUND_STOCHASTIC;
        cs[i].seed = 99;
    }
    paths_data *ref = calloc(1, sizeof *ref), *d = calloc(1, sizeof *d);
    mp_isa isas[MP_ISA_COUNT];
    int nisa = test_isas(isas);
    mp_isa saved = mp_isa_active();
    int saved_threads = mp_num_threads();
    for (int i = 0; i < 4; i++) {
        mp_isa_set(MP_ISA_SCALAR);
        mp_set_num_threads(1);
        run_paths(ref, &cs[i]);
        for (int a = 0; a < nisa; a++)
            for (int nt = 1; nt <= 3; nt += 2) {
                mp_isa_set(isas[a]);
                mp_set_num_threads(nt);
                run_paths(d, &cs[i]);
                for (int j = 0; j < BIG; j++)
                    if (f32_bits(ref->m[j]) != f32_bits(d->m[j]) || ref->c[j] != d->c[j])
                        fail_msg("config %d: %s with %d threads: master[%d] %a (%08x), scalar "
                                 "%a (%08x)",
                                 i, mp_isa_name(isas[a]), nt, j, (double)d->m[j], f32_bits(d->m[j]),
                                 (double)ref->m[j], f32_bits(ref->m[j]));
                assert_memory_equal(ref->lp, d->lp, sizeof d->lp);
            }
    }
    mp_isa_set(saved);
    mp_set_num_threads(saved_threads);
    free(ref);
    free(d);
}

static void test_invalid_configs(void **state)
{
    (void)state;
    float w = 1, g = 1;
    mp_param p = {.master = &w, .weight_dtype = MP_F32, .grad = &g, .n = 1};
    mp_optimizer_config c = mp_optimizer_config_default(MP_OPTIMIZER_SGD);
    c.nesterov = true;
    mp_clear_error();
    assert_null(mp_optimizer_new(&c, &p, 1));
    assert_non_null(strstr(mp_last_error(), "nesterov"));
    c = mp_optimizer_config_default(MP_OPTIMIZER_ADAM);
    c.beta2 = 1.0f;
    assert_null(mp_optimizer_new(&c, &p, 1));
    c = mp_optimizer_config_default(MP_OPTIMIZER_ADAM);
    c.epsilon = 0;
    assert_null(mp_optimizer_new(&c, &p, 1));
    c = mp_optimizer_config_default(MP_OPTIMIZER_ADAM);
    c.learning_rate = NAN;
    assert_null(mp_optimizer_new(&c, &p, 1));
    c = mp_optimizer_config_default(MP_OPTIMIZER_ADAM);
    c.clip_norm = 1;
    c.clip_value = 1;
    assert_null(mp_optimizer_new(&c, &p, 1));
    c = mp_optimizer_config_default(MP_OPTIMIZER_ADAM);
    assert_null(mp_optimizer_new(NULL, &p, 1));
    assert_null(mp_optimizer_new(&c, NULL, 1));
    mp_param bad = {.name = "x", .weight_dtype = MP_F32, .grad = &g, .n = 1}; /* no storage */
    assert_null(mp_optimizer_new(&c, &bad, 1));
    assert_non_null(strstr(mp_last_error(), "'x'"));
    bad = (mp_param){.master = &w, .weight = &w, .weight_dtype = MP_BF16, .grad = &g, .n = 1};
    assert_null(mp_optimizer_new(&c, &bad, 1));
    assert_null(mp_grad_accumulator_new(&p, 1, 0));
    mp_optimizer *o = mp_optimizer_new(&c, NULL, 0); /* no parameters is fine */
    assert_non_null(o);
    assert_int_equal(mp_optimizer_step(o), MP_OK);
    mp_optimizer_free(o);
    assert_int_equal(mp_optimizer_step(NULL), MP_ERR_INVALID);
}

/* AdamW's decoupled decay skips decay_exempt parameters (biases, norms,
 * embeddings) unless decay_all: with zero gradients Adam's update is 0 / (0
 * + eps) = 0, so a step changes a weight only by the decay factor
 * 1 - lr * weight_decay (one float32 multiplication, exact to compare). */
static void test_adamw_decay_exemption(void **state)
{
    (void)state;
    for (int all = 0; all < 2; all++)
        for (int isa = 0; isa < 2; isa++) {
            if (isa && !mp_isa_supported(MP_ISA_AVX512)) continue;
            assert_int_equal(mp_isa_set(isa ? MP_ISA_AVX512 : MP_ISA_SCALAR), MP_OK);
            float wk[40], wb[40], gk[40] = {0}, gb[40] = {0};
            for (int i = 0; i < 40; i++) wk[i] = wb[i] = 0.5f + (float)i;
            mp_param ps[2] = {{"kernel", wk, NULL, MP_F32, gk, 40, false},
                              {"bias", wb, NULL, MP_F32, gb, 40, true}};
            mp_optimizer_config c = mp_optimizer_config_default(MP_OPTIMIZER_ADAMW);
            c.learning_rate = 0.1f;
            c.weight_decay = 0.25f;
            c.decay_all = all;
            mp_optimizer *o = mp_optimizer_new(&c, ps, 2);
            assert_non_null(o);
            assert_int_equal(mp_optimizer_step(o), MP_OK);
            float factor = 1.0f - 0.1f * 0.25f;
            for (int i = 0; i < 40; i++) {
                float w0 = 0.5f + (float)i;
                assert_true(wk[i] == w0 * factor);
                assert_true(wb[i] == (all ? w0 * factor : w0));
            }
            mp_optimizer_free(o);
        }
    mp_isa_set(mp_isa_best());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_matches_reference),
        cmocka_unit_test(test_adam_matches_reference),
        cmocka_unit_test(test_adamw_matches_reference),
        cmocka_unit_test(test_adamw_decay_exemption),
        cmocka_unit_test(test_reference_detects_wrong_epsilon_form),
        cmocka_unit_test(test_f16_copy_and_frozen),
        cmocka_unit_test(test_pure_bf16_demo),
        cmocka_unit_test(test_pure_f32_and_f16_round_trip),
        cmocka_unit_test(test_schedules),
        cmocka_unit_test(test_clipping),
        cmocka_unit_test(test_accumulation_equals_mean_step),
        cmocka_unit_test(test_state_restore),
        cmocka_unit_test(test_paths_bit_identical),
        cmocka_unit_test(test_invalid_configs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
