/* test_profile.c - the per-phase clock (src/core/profile.h) that
 * bench_step reads: off it records nothing; on, a training step's forward,
 * backward, optimizer and gradient-check regions and the GEMMs inside them
 * are all seen, the leaves fit inside their regions, and training with it
 * on gives bit for bit the weights of training with it off. */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "core/profile.h"

enum { ROWS = 64, WIDTH = 24, STEPS = 3 };

static mp_model *model(const char *policy)
{
    mp_set_global_policy(policy);
    mp_model *m = mp_model_new(7);
    mp_node x = mp_input(m, 1, (int64_t[]){WIDTH}, NULL);
    x = mp_dense(m, x, 48, MP_ACT_RELU, NULL);
    x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    mp_set_global_policy("float32");
    assert_int_equal(mp_model_build(m, x, ROWS), MP_OK);
    assert_int_equal(mp_model_compile(m, NULL), MP_OK);
    return m;
}

static void train(mp_model *m)
{
    float x[ROWS * WIDTH];
    int32_t y[ROWS];
    for (int i = 0; i < STEPS; i++) {
        test_batch(x, y, ROWS, WIDTH, i);
        test_train_rows(m, x, y, ROWS, WIDTH);
    }
}

static void assert_all_zero(const mp_prof_times *t)
{
    for (int r = 0; r < MP_PROF_REGIONS; r++) {
        assert_true(t->region[r] == 0.0);
        for (int l = 0; l < MP_PROF_LEAVES; l++) assert_true(t->leaf[r][l] == 0.0);
    }
}

static void off_records_nothing(void **state)
{
    (void)state;
    mp_prof_enable(false);
    mp_model *m = model("mixed_bfloat16");
    train(m);
    mp_prof_times t;
    mp_prof_get(&t);
    assert_all_zero(&t);
    mp_model_free(m);
}

/* Each policy's step passes through every region: mixed_bfloat16 checks its
 * gradients without a loss scale, mixed_float16 unscales them. */
static void on_sees_every_phase(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_bfloat16", "mixed_float16"};
    for (int p = 0; p < 3; p++) {
        mp_model *m = model(policies[p]);
        mp_prof_enable(true);
        train(m);
        mp_prof_times t;
        mp_prof_get(&t);
        mp_prof_enable(false);
        assert_true(t.region[MP_PROF_NONE] == 0.0);
        for (int r = MP_PROF_FORWARD; r < MP_PROF_REGIONS; r++) {
            assert_true(t.region[r] > 0.0);
            double leaves = 0;
            for (int l = 0; l < MP_PROF_LEAVES; l++) leaves += t.leaf[r][l];
            assert_true(leaves <= t.region[r]);
        }
        assert_true(t.leaf[MP_PROF_FORWARD][MP_PROF_GEMM] > 0.0);
        assert_true(t.leaf[MP_PROF_BACKWARD][MP_PROF_GEMM] > 0.0);
        /* enabling again starts from zero */
        mp_prof_enable(true);
        mp_prof_get(&t);
        mp_prof_enable(false);
        assert_all_zero(&t);
        mp_model_free(m);
    }
}

static void same_weights_on_and_off(void **state)
{
    (void)state;
    mp_model *a = model("mixed_bfloat16"), *b = model("mixed_bfloat16");
    train(a);
    mp_prof_enable(true);
    train(b);
    mp_prof_enable(false);
    assert_int_equal(mp_model_num_params(a), mp_model_num_params(b));
    for (int i = 0; i < mp_model_num_params(a); i++) {
        const mp_model_param *pa = mp_model_get_param(a, i), *pb = mp_model_get_param(b, i);
        assert_int_equal(pa->n, pb->n);
        assert_memory_equal(pa->master, pb->master, (size_t)pa->n * sizeof(float));
        assert_memory_equal(pa->weight, pb->weight,
                            (size_t)pa->n * mp_dtype_size(pa->weight_dtype));
    }
    mp_model_free(a);
    mp_model_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(off_records_nothing),
        cmocka_unit_test(on_sees_every_phase),
        cmocka_unit_test(same_weights_on_and_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
