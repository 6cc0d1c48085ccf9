/* test_train.c - training steps on real models: float16 gradients that
 * underflow without loss scaling and are recovered with it, gradient
 * accumulation against one large batch, skipped steps on NaN data, and a
 * visibly dynamic loss scale. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static mp_model *small_model(const char *policy, uint64_t seed, int64_t max_batch)
{
    mp_set_global_policy(policy);
    mp_model *m = mp_model_new(seed);
    mp_node x = mp_input(m, 1, (int64_t[]){16}, NULL);
    x = mp_dense(m, x, 32, MP_ACT_TANH, NULL);
    x = mp_dense(m, x, 1, MP_ACT_NONE, NULL);
    mp_set_global_policy("float32");
    assert_int_equal(mp_model_build(m, x, max_batch), MP_OK);
    return m;
}

static void fill(mp_tensor *t, test_rng *r, double lo, double hi)
{
    float *v = t->data;
    for (int64_t i = 0; i < mp_tensor_numel(t); i++) v[i] = (float)test_rng_uniform(r, lo, hi);
}

/* A loss of tiny magnitude, L = 2^-22 * MSE (think of a heavily weighted-down
 * auxiliary loss), on a mixed_float16 model: dL/dy = 2^-22 * 2 (y - t) / N is
 * below 1.5e-8 here (|y - t| < 2, N = 64), under half of float16's smallest
 * subnormal 2^-24, so the float16 output gradient, and every parameter
 * gradient behind it, is exactly zero without loss scaling. With the keras
 * scale 2^15 the output gradient is ~1e-4 (normal in float16) and the
 * unscaled float32 parameter gradients match a float32 model's elementwise
 * within a bound for sums: every gradient element here is a batch sum
 * sum_i a_i dy_i with |a_i| <= max(1, max|W2|) (tanh outputs, inputs in
 * [-1, 1], the last kernel). Each term carries about 8 roundings to float16
 * (dy, W2, the activation and its derivative, x, products), and dy itself
 * moves with the float16 forward error of y (~3 u |y|), so
 *   |g16 - g32| <= u * (2 2^-22 / N) * (8 sum|y - t| + 3 sum|y|) * max(1, max|W2|)
 * with u = 2^-11. (A relative norm bound would not hold: biases are sums
 * with cancellation.) */
static void test_float16_underflow_and_loss_scaling(void **state)
{
    (void)state;
    enum { B = 64 };
    const float tiny = 0x1p-22f;
    test_rng r = {17};
    mp_tensor x, t;
    mp_tensor_init(&x, MP_F32, 2, (int64_t[]){B, 16}, MP_MEM_OTHER);
    mp_tensor_init(&t, MP_F32, 2, (int64_t[]){B, 1}, MP_MEM_OTHER);
    fill(&x, &r, -1, 1);
    fill(&t, &r, -1, 1);
    mp_loss_spec spec = {.kind = MP_LOSS_MEAN_SQUARED_ERROR, .target = &t};
    mp_model *ref = small_model("float32", 3, B), *lp = small_model("mixed_float16", 3, B);
    const mp_tensor *y;
    float loss;

    /* without scaling: every gradient underflowed */
    assert_int_equal(mp_model_forward(lp, &x, true, &y), MP_OK);
    assert_int_equal(mp_model_loss_backward(lp, &spec, tiny, false, &loss), MP_OK);
    for (int i = 0; i < mp_model_num_params(lp); i++) {
        const mp_model_param *p = mp_model_get_param(lp, i);
        for (int64_t j = 0; j < p->n; j++) assert_true(p->grad[j] == 0.0f);
    }
    /* with the dynamic scaler's scale they come back */
    mp_compile_options co = mp_compile_options_default();
    co.optimizer = mp_optimizer_config_default(MP_OPTIMIZER_SGD);
    co.loss = MP_LOSS_MEAN_SQUARED_ERROR;
    assert_int_equal(mp_model_compile(lp, &co), MP_OK);
    assert_non_null(mp_model_loss_scaler(lp)); /* on by default for float16 */
    float scale = mp_loss_scaler_scale(mp_model_loss_scaler(lp));
    assert_true(scale == 32768.0f);
    assert_int_equal(mp_model_forward(lp, &x, true, &y), MP_OK);
    assert_int_equal(mp_model_loss_backward(lp, &spec, tiny * scale, false, &loss), MP_OK);
    int np = mp_model_num_params(lp);
    mp_param *params = calloc((size_t)np, sizeof *params);
    mp_model_optim_params(lp, params, np);
    bool found_inf = false;
    mp_grads_unscale(params, np, scale, &found_inf);
    assert_false(found_inf);
    /* the float32 model's gradients of the same tiny loss */
    assert_int_equal(mp_model_forward(ref, &x, true, &y), MP_OK);
    assert_int_equal(mp_model_loss_backward(ref, &spec, tiny, false, &loss), MP_OK);
    double s1 = 0, s2 = 0, w2 = 1;
    for (int i = 0; i < B; i++) {
        double yi = ((const float *)y->data)[i], ti = ((const float *)t.data)[i];
        s1 += fabs(yi - ti);
        s2 += fabs(yi);
    }
    const mp_model_param *k2 = mp_model_get_param(ref, 2);
    for (int64_t j = 0; j < k2->n; j++) w2 = fmax(w2, fabs(k2->master[j]));
    double bound = 0x1p-11 * (2.0 * tiny / B) * (8 * s1 + 3 * s2) * w2, worst = 0;
    for (int i = 0; i < np; i++) {
        const mp_model_param *a = mp_model_get_param(ref, i), *b = mp_model_get_param(lp, i);
        double norm = 0;
        for (int64_t j = 0; j < a->n; j++) {
            double e = fabs((double)a->grad[j] - b->grad[j]);
            worst = fmax(worst, e);
            norm += (double)a->grad[j] * a->grad[j];
            if (e > bound)
                fail_msg("%s[%lld]: error %.3g > bound %.3g", a->name, (long long)j, e, bound);
        }
        assert_true(norm > 0);
    }
    assert_true(worst > 0); /* the comparison is not vacuous: float16 differs */
    /* and a whole training step through mp_model_train_step applies */
    mp_step_result res;
    assert_int_equal(mp_model_train_step(lp, &x, NULL, &t, &res), MP_OK);
    assert_true(res.applied);
    assert_true(res.loss_scale == 32768.0f);
    free(params);
    mp_tensor_release(&x);
    mp_tensor_release(&t);
    mp_model_free(ref);
    mp_model_free(lp);
}

/* Four micro-batches of 16 through the accumulator equal one batch of 64:
 * the mean of 4 per-micro-batch means is the mean over 64 samples; only the
 * summation order differs (k = 64 terms, relative error ~ k u = 4e-6 per
 * element in the worst case); accept 1e-5 relative in norm. */
static void test_accumulation_equals_big_batch(void **state)
{
    (void)state;
    test_rng r = {5};
    mp_tensor x, t;
    mp_tensor_init(&x, MP_F32, 2, (int64_t[]){64, 16}, MP_MEM_OTHER);
    mp_tensor_init(&t, MP_F32, 2, (int64_t[]){64, 1}, MP_MEM_OTHER);
    fill(&x, &r, -1, 1);
    fill(&t, &r, -1, 1);
    mp_loss_spec spec = {.kind = MP_LOSS_MEAN_SQUARED_ERROR, .target = &t};
    mp_model *big = small_model("float32", 9, 64), *mic = small_model("float32", 9, 16);
    const mp_tensor *y;
    float loss;
    assert_int_equal(mp_model_forward(big, &x, true, &y), MP_OK);
    assert_int_equal(mp_model_loss_backward(big, &spec, 1.0f, false, &loss), MP_OK);

    int np = mp_model_num_params(mic);
    mp_param *params = calloc((size_t)np, sizeof *params);
    mp_model_optim_params(mic, params, np);
    mp_grad_accumulator *acc = mp_grad_accumulator_new(params, np, 4);
    assert_non_null(acc);
    for (int k = 0; k < 4; k++) {
        mp_tensor xs, ts;
        mp_tensor_wrap(&xs, MP_F32, 2, (int64_t[]){16, 16}, (float *)x.data + k * 256);
        mp_tensor_wrap(&ts, MP_F32, 2, (int64_t[]){16, 1}, (float *)t.data + k * 16);
        mp_loss_spec s2 = {.kind = MP_LOSS_MEAN_SQUARED_ERROR, .target = &ts};
        assert_int_equal(mp_model_forward(mic, &xs, true, &y), MP_OK);
        assert_int_equal(mp_model_loss_backward(mic, &s2, 1.0f, false, &loss), MP_OK);
        assert_int_equal(mp_grad_accumulator_add(acc, 1.0f), MP_OK);
    }
    assert_true(mp_grad_accumulator_ready(acc));
    assert_int_equal(mp_grad_accumulator_finish(acc), MP_OK);
    for (int i = 0; i < np; i++) {
        const mp_model_param *a = mp_model_get_param(big, i), *b = mp_model_get_param(mic, i);
        double num = 0, den = 0;
        for (int64_t j = 0; j < a->n; j++) {
            num += ((double)a->grad[j] - b->grad[j]) * ((double)a->grad[j] - b->grad[j]);
            den += (double)a->grad[j] * a->grad[j];
        }
        if (sqrt(num / den) > 1e-5) fail_msg("%s: relative error %.3g", a->name, sqrt(num / den));
    }
    mp_grad_accumulator_free(acc);
    free(params);
    mp_tensor_release(&x);
    mp_tensor_release(&t);
    mp_model_free(big);
    mp_model_free(mic);
}

/* A NaN in the data makes the gradients NaN: the step is skipped and leaves
 * every byte of masters, copies and optimizer state as it was, with and
 * without loss scaling. */
static void test_nan_batch_is_skipped(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
    for (int pi = 0; pi < 3; pi++) {
        mp_model *m = small_model(policies[pi], 4, 8);
        mp_compile_options co = mp_compile_options_default();
        co.loss = MP_LOSS_MEAN_SQUARED_ERROR;
        assert_int_equal(mp_model_compile(m, &co), MP_OK);
        test_rng r = {1};
        mp_tensor x, t;
        mp_tensor_init(&x, MP_F32, 2, (int64_t[]){8, 16}, MP_MEM_OTHER);
        mp_tensor_init(&t, MP_F32, 2, (int64_t[]){8, 1}, MP_MEM_OTHER);
        fill(&x, &r, -1, 1);
        fill(&t, &r, -1, 1);
        mp_step_result res;
        assert_int_equal(mp_model_train_step(m, &x, NULL, &t, &res), MP_OK); /* moments non-zero */
        assert_true(res.applied);
        int np = mp_model_num_params(m);
        float **saved = calloc((size_t)np * 3, sizeof *saved);
        void **copies = calloc((size_t)np, sizeof *copies); /* the compute copies */
        mp_optimizer *opt = mp_model_optimizer(m);
        for (int i = 0; i < np; i++) {
            mp_model_param *p = mp_model_get_param(m, i);
            saved[3 * i] = malloc((size_t)p->n * 4);
            memcpy(saved[3 * i], p->master, (size_t)p->n * 4);
            size_t wb = (size_t)p->n * mp_dtype_size(p->weight_dtype);
            copies[i] = malloc(wb);
            memcpy(copies[i], p->weight, wb);
            for (int s = 0; s < 2; s++) {
                saved[3 * i + 1 + s] = malloc((size_t)p->n * 4);
                memcpy(saved[3 * i + 1 + s], mp_optimizer_slot(opt, i, s, NULL), (size_t)p->n * 4);
            }
        }
        ((float *)x.data)[5] = NAN;
        assert_int_equal(mp_model_train_step(m, &x, NULL, &t, &res), MP_OK);
        assert_false(res.applied);
        assert_true(isnan(res.loss));
        assert_int_equal(mp_model_steps_skipped(m), 1);
        assert_int_equal(mp_optimizer_step_count(opt), 1);
        for (int i = 0; i < np; i++) {
            mp_model_param *p = mp_model_get_param(m, i);
            assert_memory_equal(saved[3 * i], p->master, (size_t)p->n * 4);
            assert_memory_equal(copies[i], p->weight,
                                (size_t)p->n * mp_dtype_size(p->weight_dtype));
            free(copies[i]);
            for (int s = 0; s < 2; s++)
                assert_memory_equal(saved[3 * i + 1 + s], mp_optimizer_slot(opt, i, s, NULL),
                                    (size_t)p->n * 4);
            free(saved[3 * i]), free(saved[3 * i + 1]), free(saved[3 * i + 2]);
        }
        free(saved);
        free(copies);
        if (pi == 1)
            assert_true(mp_loss_scaler_scale(mp_model_loss_scaler(m)) == 16384.0f); /* backed off */
        mp_tensor_release(&x);
        mp_tensor_release(&t);
        mp_model_free(m);
    }
}

/* A weight gradient that overflows from finite data, with a finite loss and
 * every other gradient finite, skips the step (no loss scaler: float32 and
 * mixed_bfloat16). The Dense GEMM that writes it reports it (the step does
 * not read that gradient again, mp_gemm_args.c_nonfinite), so this fails
 * if the report were lost. Input column 0 is 1e25 and the first kernel's
 * row 0 is zero, so the forward never sees it; the second kernel is 1e15,
 * so the loss is about 1e32 and the hidden layer's gradient about 1e31:
 * dW1's row 0, 1e25 * 1e31 summed over the batch, overflows, and nothing
 * else does (dW1's other rows and db1 are below 1e33). */
static void test_overflowing_weight_gradient_is_skipped(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_bfloat16"};
    for (int pi = 0; pi < 2; pi++) {
        mp_set_global_policy(policies[pi]);
        mp_model *m = mp_model_new(5);
        mp_node x = mp_input(m, 1, (int64_t[]){16}, NULL);
        x = mp_dense(m, x, 32, MP_ACT_NONE, NULL);
        x = mp_dense(m, x, 1, MP_ACT_NONE, NULL);
        mp_set_global_policy("float32");
        assert_int_equal(mp_model_build(m, x, 8), MP_OK);
        mp_compile_options co = mp_compile_options_default();
        co.loss = MP_LOSS_MEAN_SQUARED_ERROR;
        assert_int_equal(mp_model_compile(m, &co), MP_OK);
        assert_null(mp_model_loss_scaler(m));
        mp_model_param *w1 = mp_model_get_param(m, 0), *w2 = mp_model_get_param(m, 2);
        assert_int_equal(w1->n, 16 * 32);
        for (int j = 0; j < 32; j++) w1->master[j] = 0.0f; /* row 0 */
        for (int64_t j = 0; j < w2->n; j++) w2->master[j] = 1e15f;
        mp_model_mark_masters_changed(m);
        test_rng r = {2};
        mp_tensor xt, t;
        mp_tensor_init(&xt, MP_F32, 2, (int64_t[]){8, 16}, MP_MEM_OTHER);
        mp_tensor_init(&t, MP_F32, 2, (int64_t[]){8, 1}, MP_MEM_OTHER);
        fill(&xt, &r, -1, 1);
        fill(&t, &r, -1, 1);
        for (int b = 0; b < 8; b++) ((float *)xt.data)[b * 16] = 1e25f;
        int np = mp_model_num_params(m);
        float **saved = calloc((size_t)np, sizeof *saved);
        for (int i = 0; i < np; i++) {
            mp_model_param *p = mp_model_get_param(m, i);
            saved[i] = malloc((size_t)p->n * 4);
            memcpy(saved[i], p->master, (size_t)p->n * 4);
        }
        mp_step_result res;
        assert_int_equal(mp_model_train_step(m, &xt, NULL, &t, &res), MP_OK);
        assert_true(isfinite(res.loss));
        assert_false(res.applied);
        assert_int_equal(mp_model_steps_skipped(m), 1);
        /* the overflow is where it was meant to be, and only there */
        for (int i = 0; i < np; i++) {
            mp_model_param *p = mp_model_get_param(m, i);
            for (int64_t j = 0; j < p->n; j++)
                assert_int_equal(!isfinite(p->grad[j]), i == 0 && j < 32);
            assert_memory_equal(saved[i], p->master, (size_t)p->n * 4);
            free(saved[i]);
        }
        free(saved);
        mp_tensor_release(&xt);
        mp_tensor_release(&t);
        mp_model_free(m);
    }
}

/* Training steps reduce the loss of a learnable problem in every policy. */
static void test_train_steps_learn(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_float16", "mixed_bfloat16", "float16", "bfloat16"};
    for (int pi = 0; pi < 5; pi++) {
        mp_model *m = small_model(policies[pi], 2, 32);
        mp_compile_options co = mp_compile_options_default();
        co.loss = MP_LOSS_MEAN_SQUARED_ERROR;
        co.optimizer.learning_rate = 0.01f;
        if (pi >= 3) co.optimizer.rounding = MP_ROUND_STOCHASTIC;
        assert_int_equal(mp_model_compile(m, &co), MP_OK);
        test_rng r = {8};
        mp_tensor x, t;
        mp_tensor_init(&x, MP_F32, 2, (int64_t[]){32, 16}, MP_MEM_OTHER);
        mp_tensor_init(&t, MP_F32, 2, (int64_t[]){32, 1}, MP_MEM_OTHER);
        fill(&x, &r, -1, 1);
        for (int i = 0; i < 32; i++) { /* t = sum of the first 4 features */
            float s = 0;
            for (int j = 0; j < 4; j++) s += ((float *)x.data)[i * 16 + j];
            ((float *)t.data)[i] = s;
        }
        mp_step_result first, last;
        assert_int_equal(mp_model_train_step(m, &x, NULL, &t, &first), MP_OK);
        for (int s = 0; s < 200; s++)
            assert_int_equal(mp_model_train_step(m, &x, NULL, &t, &last), MP_OK);
        if (!(last.loss < 0.1f * first.loss))
            fail_msg("%s: loss %.4f -> %.4f", policies[pi], (double)first.loss, (double)last.loss);
        mp_tensor_release(&x);
        mp_tensor_release(&t);
        mp_model_free(m);
    }
}

static void test_compile_errors(void **state)
{
    (void)state;
    mp_model *m = mp_model_new(1);
    mp_node x = mp_dense(m, mp_input(m, 1, (int64_t[]){4}, NULL), 2, MP_ACT_NONE, NULL);
    assert_int_equal(mp_model_compile(m, NULL), MP_ERR_INVALID); /* not built */
    assert_int_equal(mp_model_build(m, x, 4), MP_OK);
    mp_compile_options co = mp_compile_options_default();
    co.optimizer.learning_rate = -1.0f;
    assert_int_equal(mp_model_compile(m, &co), MP_ERR_INVALID);
    assert_true(strlen(mp_last_error()) > 0);
    mp_tensor in;
    mp_tensor_init(&in, MP_F32, 2, (int64_t[]){4, 4}, MP_MEM_OTHER);
    int32_t labels[4] = {0, 1, 0, 1};
    assert_int_equal(mp_model_train_step(m, &in, labels, NULL, NULL), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "compile"));
    assert_int_equal(mp_model_compile(m, NULL), MP_OK);
    assert_null(mp_model_loss_scaler(m)); /* float32: no scaling by default */
    mp_step_result r;
    assert_int_equal(mp_model_train_step(m, &in, labels, NULL, &r), MP_OK);
    labels[2] = 7;
    assert_int_equal(mp_model_train_step(m, &in, labels, NULL, &r), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "label 7"));
    mp_tensor_release(&in);
    mp_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float16_underflow_and_loss_scaling),
        cmocka_unit_test(test_accumulation_equals_big_batch),
        cmocka_unit_test(test_nan_batch_is_skipped),
        cmocka_unit_test(test_train_steps_learn),
        cmocka_unit_test(test_overflowing_weight_gradient_is_skipped),
        cmocka_unit_test(test_compile_errors),
    };
    return cmocka_run_group_tests_name("train", tests, NULL, NULL);
}
