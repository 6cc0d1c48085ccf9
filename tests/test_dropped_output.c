/* test_dropped_output.c - outputs no backward reads in full (nn/layer.h,
 * mp_output_use): a relu Dense whose consumers are float8 layers keeps
 * neither y nor, when its first consumer's codes carry y > 0 (nn/quant.h,
 * keeps_sign), a mask, its y living only through the forward; else a bit
 * mask of y > 0. The mask's relu gradient against the relu derivative of
 * the elementwise op, bit for bit on every kind of value (negative zero
 * and NaN included); float8 MLPs (a chain; a relu Dense read by two float8
 * layers; one whose float32 relu Dense feeds a bfloat16 consumer, so keeps
 * its mask; one read by a Conv2D) whose relu Dense layers drop their outputs train to the same
 * bits as the same MLPs with each relu a separate Activation layer (whose
 * output is kept, and which the float8 layers quantize again in backward,
 * with the plain cast), positive outputs that the cast takes to zero
 * included, while keeping less: the plan says how much and the arena
 * agrees. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/ops.h"

/* ------------------------------------------------------- the mask ops */

static float special(test_rng *r)
{
    static const float s[] = {0.0f, -0.0f, 1e-40f, -1e-40f, INFINITY, -INFINITY, NAN, -NAN};
    uint32_t u = test_rng_u32(r);
    return u % 4 == 0 ? s[(u >> 2) % 8] : (float)test_rng_uniform(r, -2, 2);
}

static void test_mask_grad_is_relu_grad(void **state)
{
    (void)state;
    /* more than 8 chunks of 2048 (the parallel path) and not a multiple of 8 */
    const size_t n = 8 * 2048 * 3 + 5;
    const mp_dtype types[] = {MP_F32, MP_BF16};
    float *y = malloc(n * sizeof *y), *dy = malloc(n * sizeof *dy);
    uint8_t *mask = malloc((n + 7) / 8);
    char *yt = malloc(n * 4), *dyt = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
    assert_true(y && dy && mask && yt && dyt && a && b);
    test_rng r = {7};
    for (size_t i = 0; i < n; i++) {
        y[i] = special(&r);
        dy[i] = special(&r);
    }
    for (int t = 0; t < 2; t++) {
        size_t es = mp_dtype_size(types[t]);
        mp_convert(yt, types[t], y, MP_F32, n);
        mp_convert(dyt, types[t], dy, MP_F32, n);
        memset(mask, 0xA5, (n + 7) / 8);
        mp_op_positive_mask(yt, types[t], mask, n);
        for (size_t i = 0; i < n; i++) { /* the mask against the test's own y > 0 */
            float v;
            mp_convert(&v, MP_F32, yt + i * es, types[t], 1);
            assert_int_equal((mask[i / 8] >> (i % 8)) & 1, v > 0.0f);
        }
        mp_op_mask_grad(mask, dyt, types[t], a, types[t], n);
        mp_op_activation_grad(MP_ACT_RELU, yt, types[t], dyt, types[t], b, types[t], n);
        assert_memory_equal(a, b, n * es);
    }
    free(y), free(dy), free(mask), free(yt), free(dyt), free(a), free(b);
}

/* ------------------------------------------- a float8 MLP, two ways */

enum { B = 8, IN = 24, H = 32, OUT = 3, STEPS = 4 };

typedef enum {
    CHAIN,     /* input, 2 hidden relu layers, a linear one */
    BRANCH,    /* the first hidden also read by a linear float8 Dense added to the second */
    F32_FIRST, /* the first hidden Dense float32, its consumer bfloat16 */
    CONV,      /* on (2, 4, 3): the first hidden read by a Conv2D (2x2, valid), flattened */
} mlp_kind;

/* hidden elements of the first relu's output per sample */
static int64_t hidden_n(mlp_kind kind) { return kind == CONV ? 2 * 4 * H : H; }

/* A softmax (float32) over the MLP; every Dense in float8 (HYBRID,
 * delayed). fused: relu inside the Dense (which then drops its output);
 * else Dense then a separate relu Activation. Seeds per layer, so that
 * both draw the same weights. */
static mp_model *mlp(bool fused, mlp_kind kind)
{
    mp_model *m = mp_model_new_with_policy(5, "mixed_bfloat16");
    mp_node x = kind == CONV ? mp_input(m, 3, (int64_t[]){2, 4, 3}, NULL)
                             : mp_input(m, 1, (int64_t[]){IN}, NULL),
            h1 = -1;
    for (int i = 0; i < 3; i++) {
        bool hidden = i < 2;
        const char *policy = i == 0 && kind == F32_FIRST ? "float32" : NULL;
        mp_layer_options o = {.float8 = 1, .seed = 100 + (uint64_t)i, .policy = policy};
        if (i == 1 && kind == CONV) {
            mp_conv2d_options co = mp_conv2d_options_default(8, 2, 2);
            x = mp_flatten(m, mp_conv2d(m, x, &co, &o), NULL);
            continue;
        }
        x = mp_dense(m, x, hidden ? H : OUT, hidden && fused ? MP_ACT_RELU : MP_ACT_NONE, &o);
        if (hidden && !fused)
            x = mp_activation_layer(m, x, MP_ACT_RELU, &(mp_layer_options){.policy = policy});
        if (i == 0) h1 = x;
        if (i == 1 && kind == BRANCH) {
            mp_layer_options side = {.float8 = 1, .seed = 200};
            x = mp_add(m, x, mp_dense(m, h1, H, MP_ACT_NONE, &side), NULL);
        }
    }
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    assert_int_equal(mp_model_build(m, x, B), MP_OK);
    assert_int_equal(mp_model_compile(m, NULL), MP_OK);
    return m;
}

static void check_plan_and_arena(mp_model *m, const mp_tensor *tx)
{
    mp_memory_plan plan;
    assert_int_equal(mp_model_memory_plan(m, B, 0, &plan), MP_OK);
    assert_int_equal(mp_model_forward(m, tx, true, NULL), MP_OK);
    assert_int_equal(mp_model_activation_bytes(m), plan.activations);
}

/* Elements of the first hidden relu's output (the separate model's
 * Activation, node 2, kept) > 0 that E4M3 at scale 1 (the first step's)
 * takes to zero. */
static int positive_underflows(const mp_model *m, mlp_kind kind)
{
    const mp_tensor *y = mp_model_node_output(m, 2);
    size_t n = (size_t)mp_tensor_numel(y);
    float v[B * 8 * H];
    uint8_t c[B * 8 * H];
    assert_true(n == (size_t)(B * hidden_n(kind)));
    mp_convert(v, MP_F32, y->data, y->dtype, n);
    mp_float8_quantize(c, MP_F8E4M3, v, MP_F32, n, 1.0f);
    int k = 0;
    for (size_t i = 0; i < n; i++) k += v[i] > 0.0f && c[i] == 0x00;
    return k;
}

static void same_training_less_kept(mlp_kind kind)
{
    mp_model *m[2] = {mlp(true, kind), mlp(false, kind)};
    float x[STEPS][B * IN];
    int32_t y[STEPS][B];
    test_rng r = {11};
    /* odd rows tiny: relu outputs > 0 that the first step's cast (scale 1)
     * takes to zero, which the fused model's codes keep as 0x80 */
    for (int s = 0; s < STEPS; s++)
        for (int i = 0; i < B * IN; i++)
            x[s][i] = (float)test_rng_uniform(&r, -1, 1) * (i / IN % 2 ? 0x1p-9f : 1.0f);
    for (int s = 0; s < STEPS; s++)
        for (int i = 0; i < B; i++) y[s][i] = (i + s) % OUT;
    mp_tensor tx[STEPS];
    for (int s = 0; s < STEPS; s++)
        if (kind == CONV)
            mp_tensor_wrap(&tx[s], MP_F32, 4, (int64_t[]){B, 2, 4, 3}, x[s]);
        else
            mp_tensor_wrap(&tx[s], MP_F32, 2, (int64_t[]){B, IN}, x[s]);

    /* what the fused model keeps: per hidden Dense nothing for its bf16
     * output (its consumer keeps H fp8 codes a sample for the input it
     * would read, which carry y > 0), or, when its consumer computes in
     * another dtype, a mask (H bits a sample, one arena granule of 64
     * bytes at B = 8) */
    mp_layer_info fused, sep, relu, next;
    assert_int_equal(mp_model_layer_info(m[0], 1, B, &fused), MP_OK);
    assert_int_equal(mp_model_layer_info(m[1], 1, B, &sep), MP_OK);
    assert_int_equal(mp_model_layer_info(m[1], 2, B, &relu), MP_OK);
    assert_int_equal(mp_model_layer_info(m[0], 2, B, &next), MP_OK);
    size_t es = kind == F32_FIRST ? 4 : 2, hn = (size_t)hidden_n(kind);
    assert_true(fused.float8 && sep.float8);
    assert_int_equal(fused.saved_bytes,
                     B * IN /* the input's codes */ + (kind == F32_FIRST ? 64 /* the mask */ : 0));
    assert_int_equal(sep.saved_bytes, B * IN + B * hn * es /* its output */);
    assert_int_equal(relu.saved_bytes, B * hn * es);
    if (kind == CHAIN) assert_int_equal(next.saved_bytes, B * H /* codes */);
    for (int k = 0; k < 2; k++) check_plan_and_arena(m[k], &tx[0]);
    assert_true(mp_model_activation_bytes(m[0]) < mp_model_activation_bytes(m[1]));

    /* the dropped output is there through the forward, not after backward */
    assert_non_null(mp_model_node_output(m[0], 1));
    for (int s = 0; s < STEPS; s++) {
        mp_step_result res[2];
        for (int k = 0; k < 2; k++) {
            assert_int_equal(mp_model_train_step(m[k], &tx[s], y[s], NULL, &res[k]), MP_OK);
            assert_true(res[k].applied);
        }
        assert_memory_equal(&res[0].loss, &res[1].loss, sizeof res[0].loss);
        if (s == 0 && kind != F32_FIRST) assert_true(positive_underflows(m[1], kind) > 20);
    }
    assert_null(mp_model_node_output(m[0], 1));
    assert_non_null(mp_model_node_output(m[1], 2));

    /* the same parameters (in the same order: Activation has none) and the
     * same recipe state, bit for bit */
    assert_int_equal(mp_model_num_params(m[0]), mp_model_num_params(m[1]));
    for (int i = 0; i < mp_model_num_params(m[0]); i++) {
        const mp_model_param *a = mp_model_get_param(m[0], i), *b = mp_model_get_param(m[1], i);
        assert_int_equal(a->n, b->n);
        assert_memory_equal(a->master, b->master, (size_t)a->n * sizeof(float));
    }
    assert_int_equal(mp_model_float8_num_tensors(m[0]), mp_model_float8_num_tensors(m[1]));
    for (int i = 0; i < mp_model_float8_num_tensors(m[0]); i++) {
        mp_float8_tensor_info a, b;
        assert_int_equal(mp_model_float8_tensor(m[0], i, &a), MP_OK);
        assert_int_equal(mp_model_float8_tensor(m[1], i, &b), MP_OK);
        assert_memory_equal(&a.scale, &b.scale, sizeof a.scale);
        assert_memory_equal(a.history, b.history,
                            (size_t)a.params.amax_history_len * sizeof(float));
    }
    mp_model_free(m[0]);
    mp_model_free(m[1]);
}

static const mlp_kind kinds[] = {CHAIN, BRANCH, F32_FIRST, CONV};

/* state: the mlp_kind */
static void test_same_training(void **state) { same_training_less_kept(*(const mlp_kind *)*state); }

/* A consumer that reads the output itself (a bfloat16 Dense, not float8)
 * keeps it: nothing is dropped, and the relu Dense keeps its output. */
static void test_kept_when_read(void **state)
{
    (void)state;
    mp_model *m = mp_model_new_with_policy(5, "mixed_bfloat16");
    mp_node x = mp_input(m, 1, (int64_t[]){IN}, NULL);
    mp_node h = mp_dense(m, x, H, MP_ACT_RELU, NULL);
    mp_node a = mp_dense(m, h, H, MP_ACT_NONE, &(mp_layer_options){.float8 = 1});
    mp_node b = mp_dense(m, h, H, MP_ACT_NONE, &(mp_layer_options){.float8 = -1});
    mp_node y = mp_add(m, a, b, NULL);
    assert_int_equal(mp_model_build(m, y, B), MP_OK);
    mp_layer_info li;
    assert_int_equal(mp_model_layer_info(m, (int)h, B, &li), MP_OK);
    assert_int_equal(li.saved_bytes, B * IN * 2 /* bf16 input copy */ + B * H * 2);
    assert_int_equal(mp_model_layer_info(m, (int)a, B, &li), MP_OK);
    assert_int_equal(li.saved_bytes, B * H * 2 /* its output only: it reads h again */);
    float data[B * IN] = {0};
    mp_tensor tx;
    mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){B, IN}, data);
    check_plan_and_arena(m, &tx);
    mp_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mask_grad_is_relu_grad),
        {"test_same_training_less_kept", test_same_training, NULL, NULL, (void *)&kinds[0]},
        {"test_same_training_two_consumers", test_same_training, NULL, NULL, (void *)&kinds[1]},
        {"test_same_training_mask_across_dtypes", test_same_training, NULL, NULL,
         (void *)&kinds[2]},
        {"test_same_training_conv_consumer", test_same_training, NULL, NULL, (void *)&kinds[3]},
        cmocka_unit_test(test_kept_when_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
