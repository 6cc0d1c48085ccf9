/* test_fp8_model.c - float8 training in a model (mixprec/fp8.h): which
 * layers mixed_float8 quantizes (the first and last Dense stay higher,
 * per-layer settings in the model JSON), the memory plan of a float8 Dense,
 * non-finite amaxes never reaching a history, a float8 run that resumes
 * from a checkpoint bit for bit, kernels quantized by the optimizer's
 * update as the forward would quantize them, and one-line errors that name
 * the bad value. The recipe's arithmetic is tested in test_fp8.c. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "nn/quant.h"
#include "optim/optim_internal.h"

/* ------------------------------------------------ policy and plan */

static mp_model *mlp(const char *policy, const mp_float8_params *p, int64_t batch)
{
    mp_model *m = mp_model_new_with_policy(9, policy);
    mp_layer_options o = {.float8_params = p};
    mp_node x = mp_input(m, 1, (int64_t[]){12}, NULL);
    for (int i = 0; i < 3; i++) x = mp_dense(m, x, 16, MP_ACT_RELU, &o);
    x = mp_dense(m, x, 3, MP_ACT_NONE, &o);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    assert_int_equal(mp_model_build(m, x, batch), MP_OK);
    return m;
}

static void test_which_layers(void **state)
{
    (void)state;
    mp_model *m = mlp("mixed_float8", NULL, 4); /* layers: input, 4 dense, softmax */
    bool want[] = {false, false, true, true, false, false};
    for (int i = 0; i < 6; i++) assert_int_equal(mp_model_layer_float8(m, i), want[i]);
    assert_int_equal(mp_model_float8_num_tensors(m), 6);
    mp_float8_tensor_info info;
    assert_int_equal(mp_model_float8_tensor(m, 5, &info), MP_OK);
    assert_string_equal(info.name, "dense_2/grad_output");
    assert_int_equal(info.dtype, MP_F8E5M2);
    assert_int_equal(mp_model_float8_tensor(m, 6, &info), MP_ERR_INVALID);
    mp_model_free(m);
    mp_float8_params p = mp_float8_params_default();
    p.keep_first_last = false;
    m = mlp("mixed_float8", &p, 4);
    for (int i = 1; i <= 4; i++) assert_true(mp_model_layer_float8(m, i));
    /* the configuration carries the settings; the rebuilt model agrees */
    char *cfg = mp_model_config_json(m);
    assert_non_null(strstr(cfg, "\"keep_first_last\":false"));
    mp_model *r;
    assert_int_equal(mp_model_from_config(cfg, 4, INT64_MAX, &r), MP_OK);
    for (int i = 0; i < 6; i++)
        assert_int_equal(mp_model_layer_float8(r, i), mp_model_layer_float8(m, i));
    free(cfg);
    mp_model_free(r);
    mp_model_free(m);
    m = mlp("mixed_bfloat16", NULL, 4); /* no float8 at all */
    assert_int_equal(mp_model_float8_num_tensors(m), 0);
    mp_model_free(m);
    /* per layer in JSON: on under another policy, off under mixed_float8 */
    const char *json =
        "{\"format\": \"mixprec.model\", \"version\": 2, \"policy\": \"mixed_float8\", "
        "\"layers\": [{\"class_name\": \"InputLayer\", \"name\": \"x\", \"inputs\": [], "
        "\"shape\": [8]},"
        "{\"class_name\": \"Dense\", \"name\": \"a\", \"inputs\": [\"x\"], \"units\": 8, "
        "\"float8\": true, \"float8_params\": {\"format\": \"e4m3\", \"margin\": 1, "
        "\"amax_history_len\": 16, \"algorithm\": \"most_recent\"}},"
        "{\"class_name\": \"Dense\", \"name\": \"b\", \"inputs\": [\"a\"], \"units\": 8, "
        "\"float8\": false}]}";
    assert_int_equal(mp_model_from_config(json, 4, INT64_MAX, &m), MP_OK);
    assert_true(mp_model_layer_float8(m, 1) && !mp_model_layer_float8(m, 2));
    assert_int_equal(mp_model_float8_tensor(m, 2, &info), MP_OK);
    assert_int_equal(info.dtype, MP_F8E4M3); /* e4m3 everywhere */
    assert_int_equal(info.params.margin, 1);
    assert_int_equal(info.params.amax_history_len, 16);
    assert_int_equal(info.params.algorithm, MP_FLOAT8_AMAX_MOST_RECENT);
    mp_model_free(m);
}

/* What a float8 Dense keeps of a copied input: its codes, one byte an
 * element, against mixed_bfloat16's two; plan and arena agree. */
static void test_memory_plan(void **state)
{
    (void)state;
    size_t in_bytes[2];
    for (int f = 0; f < 2; f++) {
        mp_model *m = mp_model_new_with_policy(3, f ? "mixed_float8" : "mixed_bfloat16");
        mp_node x = mp_input(m, 1, (int64_t[]){256}, NULL);
        mp_node y = mp_dense(m, x, 64, MP_ACT_NONE, &(mp_layer_options){.float8 = f});
        assert_int_equal(mp_model_build(m, y, 128), MP_OK);
        mp_layer_info li;
        assert_int_equal(mp_model_layer_info(m, (int)y, 128, &li), MP_OK);
        assert_int_equal(li.float8, f);
        in_bytes[f] = li.saved_bytes - 128 * 64 * 2; /* less the bf16 output */
        mp_memory_plan plan;
        assert_int_equal(mp_model_memory_plan(m, 128, 0, &plan), MP_OK);
        float data[128 * 256] = {0};
        mp_tensor tx;
        mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){128, 256}, data);
        assert_int_equal(mp_model_forward(m, &tx, true, NULL), MP_OK);
        assert_int_equal(mp_model_activation_bytes(m), plan.activations);
        mp_model_free(m);
    }
    assert_int_equal(in_bytes[1], 128 * 256);
    assert_true((double)in_bytes[1] <= 0.55 * (double)in_bytes[0]);
}

/* Conv2D in float8 against the bfloat16 convolution: on data whose values
 * are fp8 codes over a power of two, with one code at the format's max,
 * the scales are those powers of two, quantization loses nothing and
 * scaling by a power of two commutes with every float32 rounding: output,
 * kernel, bias and input gradients must be the same bits. */
static float random_fp8(test_rng *r, mp_dtype t)
{
    for (;;) {
        uint8_t c = (uint8_t)test_rng_u32(r);
        if (t == MP_F8E4M3 && (c & 0x7F) != 0x7F) return mp_e4m3_to_f32(c);
        if (t == MP_F8E5M2 && (c & 0x7F) < 0x7C) return mp_e5m2_to_f32(c);
    }
}

static void test_conv2d_float8(void **state)
{
    (void)state;
    enum { B = 2, H = 7, W = 6, C = 3, F = 4 };
    mp_float8_params p = mp_float8_params_default();
    p.scaling = MP_FLOAT8_CURRENT;
    test_rng r = {77};
    float x[B * H * W * C], wk[3 * 3 * C * F], bias[F], dy[B * 4 * 3 * F];
    for (int i = 0; i < B * H * W * C; i++) x[i] = random_fp8(&r, MP_F8E4M3) / 128;
    for (int i = 0; i < 3 * 3 * C * F; i++) wk[i] = random_fp8(&r, MP_F8E4M3) / 512;
    for (int i = 0; i < (int)(sizeof dy / sizeof *dy); i++)
        dy[i] = random_fp8(&r, MP_F8E5M2) * 0x1p-20f;
    x[5] = 448.0f / 128, wk[7] = -448.0f / 512, dy[3] = 57344.0f * 0x1p-20f; /* the maxima */
    test_fill(bias, F, 78, -1, 1);
    uint16_t y[2][B * 4 * 3 * F], dx[2][B * H * W * C];
    float dw[2][3 * 3 * C * F], db[2][F];
    for (int v = 0; v < 2; v++) {
        mp_model *m = mp_model_new_with_policy(4, v ? "mixed_float8" : "mixed_bfloat16");
        mp_node in = mp_input(m, 3, (int64_t[]){H, W, C}, NULL);
        mp_node a = mp_activation_layer(m, in, MP_ACT_NONE, NULL);
        mp_conv2d_options co = mp_conv2d_options_default(F, 3, 3);
        co.strides[0] = co.strides[1] = 2;
        co.padding = MP_PADDING_SAME;
        mp_node c = mp_conv2d(m, a, &co, &(mp_layer_options){.float8_params = &p, .float8 = v});
        assert_int_equal(mp_model_build(m, c, B), MP_OK);
        assert_int_equal(mp_model_layer_float8(m, (int)c), v);
        memcpy(mp_model_get_param(m, 0)->master, wk, sizeof wk);
        memcpy(mp_model_get_param(m, 1)->master, bias, sizeof bias);
        mp_model_mark_masters_changed(m);
        mp_tensor tx, tdy;
        mp_tensor_wrap(&tx, MP_F32, 4, (int64_t[]){B, H, W, C}, x);
        mp_tensor_wrap(&tdy, MP_F32, 4, (int64_t[]){B, 4, 3, F}, dy);
        const mp_tensor *out;
        assert_int_equal(mp_model_forward(m, &tx, true, &out), MP_OK);
        assert_int_equal(mp_tensor_numel(out), B * 4 * 3 * F);
        memcpy(y[v], out->data, sizeof y[v]);
        assert_int_equal(mp_model_backward(m, &tdy, false), MP_OK);
        memcpy(dx[v], mp_model_node_grad(m, a)->data, sizeof dx[v]);
        memcpy(dw[v], mp_model_get_param(m, 0)->grad, sizeof dw[v]);
        memcpy(db[v], mp_model_get_param(m, 1)->grad, sizeof db[v]);
        if (v) { /* the scales were the powers of two */
            mp_float8_tensor_info info[3];
            for (int i = 0; i < 3; i++) mp_model_float8_tensor(m, i, &info[i]);
            assert_true(info[0].scale == 128 && info[1].scale == 512 && info[2].scale == 0x1p20f);
        }
        mp_model_free(m);
    }
    assert_memory_equal(y[0], y[1], sizeof y[0]);
    assert_memory_equal(dw[0], dw[1], sizeof dw[0]);
    assert_memory_equal(db[0], db[1], sizeof db[0]);
    assert_memory_equal(dx[0], dx[1], sizeof dx[0]);
}

/* ------------------------------------------------- training steps */

typedef struct {
    float x[8 * 12];
    int32_t y[8];
} batch;

static void make_batches(batch *b, int n)
{
    for (int i = 0; i < n; i++) test_batch(b[i].x, b[i].y, 8, 12, i);
}

static mp_step_result step(mp_model *m, batch *b) { return test_train_rows(m, b->x, b->y, 8, 12); }

/* the recipe's state of every tensor, to compare bit for bit */
static void snapshot(const mp_model *m, float *out, int len)
{
    for (int i = 0; i < mp_model_float8_num_tensors(m); i++) {
        mp_float8_tensor_info info;
        mp_model_float8_tensor(m, i, &info);
        out[i * (len + 1)] = info.scale;
        memcpy(out + i * (len + 1) + 1, info.history, (size_t)len * sizeof(float));
    }
}

static void test_nonfinite_amax(void **state)
{
    (void)state;
    enum { L = 4 };
    mp_float8_params p = mp_float8_params_default();
    p.amax_history_len = L;
    mp_model *m = mlp("mixed_float8", &p, 8);
    assert_int_equal(mp_model_compile(m, NULL), MP_OK);
    batch b[2];
    make_batches(b, 2);
    assert_true(step(m, &b[0]).applied);
    float before[6 * (L + 1)], after[6 * (L + 1)];
    snapshot(m, before, L);
    assert_true(before[0] != 1.0f && before[1] > 0); /* the input's scale and amax moved */
    /* an infinite input: NaN codes, a non-finite loss, a skipped step; the
     * step's amaxes are discarded */
    b[1].x[5] = INFINITY;
    assert_false(step(m, &b[1]).applied);
    snapshot(m, after, L);
    assert_memory_equal(before, after, sizeof before);
    /* a custom loop that commits an applied step with a NaN amax: discarded */
    mp_tensor tx;
    mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){8, 12}, b[1].x);
    b[1].x[5] = NAN;
    assert_int_equal(mp_model_forward(m, &tx, true, NULL), MP_OK);
    assert_false(mp_model_float8_commit(m, true));
    snapshot(m, after, L);
    assert_memory_equal(before, after, sizeof before);
    mp_model_free(m);
}

static void test_resume_bit_exact(void **state)
{
    (void)state;
    enum { N = 6, M = 5, L = 5 };
    mp_float8_params p = mp_float8_params_default();
    p.amax_history_len = L;
    p.margin = 1;
    batch b[N + M];
    make_batches(b, N + M);
    b[3].x[7] = INFINITY; /* one skipped step on the way */
    mp_model *straight = mlp("mixed_float8", &p, 8), *first = mlp("mixed_float8", &p, 8);
    assert_int_equal(mp_model_compile(straight, NULL), MP_OK);
    assert_int_equal(mp_model_compile(first, NULL), MP_OK);
    for (int i = 0; i < N + M; i++) step(straight, &b[i]);
    for (int i = 0; i < N; i++) step(first, &b[i]);
    assert_int_equal(mp_model_steps_skipped(straight), 1);
    char dir[256], path[300];
    assert_int_equal(test_scratch_dir(dir, sizeof dir, "mp_fp8"), 0);
    snprintf(path, sizeof path, "%s/ck.safetensors", dir);
    assert_int_equal(mp_model_save_checkpoint(first, path, NULL), MP_OK);
    mp_model_free(first);
    mp_model *resumed;
    assert_int_equal(mp_model_from_checkpoint(path, 8, &resumed, NULL), MP_OK);
    for (int i = N; i < N + M; i++) step(resumed, &b[i]);
    assert_int_equal(mp_model_num_params(resumed), mp_model_num_params(straight));
    for (int i = 0; i < mp_model_num_params(straight); i++) {
        const mp_model_param *a = mp_model_get_param(straight, i),
                             *c = mp_model_get_param(resumed, i);
        assert_memory_equal(a->master, c->master, (size_t)a->n * sizeof(float));
    }
    assert_int_equal(mp_model_float8_num_tensors(resumed), 6);
    float sa[6 * (L + 1)], sb[6 * (L + 1)];
    snapshot(straight, sa, L);
    snapshot(resumed, sb, L);
    assert_memory_equal(sa, sb, sizeof sa);
    /* a checkpoint without the float8 state is refused, naming it */
    mp_model *other = mlp("mixed_bfloat16", &p, 8);
    assert_int_equal(mp_model_compile(other, NULL), MP_OK);
    assert_int_equal(mp_model_save_checkpoint(other, path, NULL), MP_OK);
    assert_int_equal(mp_model_load_checkpoint(resumed, path, NULL), MP_ERR_FORMAT);
    assert_non_null(strstr(mp_last_error(), "float8/dense_1/input/amax_history"));
    mp_model_free(other);
    mp_model_free(resumed);
    mp_model_free(straight);
    test_remove_tree(dir);
}

/* The optimizer's update quantizes the float8 kernels (delayed scaling)
 * with the scale the commit then sets, and the next forward takes that
 * operand: the same bits as quantizing the master in the forward, which a
 * twin model does (its hooks removed). Through applied steps, a skipped
 * one (the operand stays), masters changed by hand (not taken), and an
 * update outside the step (a custom loop: stale, not taken). Width 256:
 * the update's chunks run on two threads. */
static mp_model *wide_mlp(const mp_float8_params *p)
{
    mp_model *m = mp_model_new_with_policy(9, "mixed_float8");
    mp_layer_options o = {.float8_params = p};
    mp_node x = mp_input(m, 1, (int64_t[]){12}, NULL);
    for (int i = 0; i < 3; i++) x = mp_dense(m, x, 256, MP_ACT_RELU, &o);
    x = mp_dense(m, x, 3, MP_ACT_NONE, &o);
    assert_int_equal(mp_model_build(m, x, 8), MP_OK);
    assert_int_equal(mp_model_compile(m, NULL), MP_OK);
    return m;
}

static uint64_t fresh_uses(mp_model *m, int *kernels)
{
    uint64_t n = 0;
    *kernels = 0;
    for (int i = 0; i < mp_model_num_params(m); i++) {
        mp_float8_meta *q = mp_float8_kernel_meta(m, mp_model_get_param(m, i)->master);
        if (q) n += q->fresh_uses, ++*kernels;
    }
    return n;
}

static void same_state(mp_model *a, mp_model *b, int len, int step_no)
{
    for (int i = 0; i < mp_model_num_params(a); i++) {
        const mp_model_param *pa = mp_model_get_param(a, i), *pb = mp_model_get_param(b, i);
        if (memcmp(pa->master, pb->master, (size_t)pa->n * sizeof(float)))
            fail_msg("after step %d: master of '%s' differs", step_no, pa->name);
    }
    float sa[6 * (8 + 1)], sb[6 * (8 + 1)];
    assert_true(len <= 8 && mp_model_float8_num_tensors(a) == 6);
    snapshot(a, sa, len);
    snapshot(b, sb, len);
    if (memcmp(sa, sb, (size_t)(6 * (len + 1)) * sizeof(float)))
        fail_msg("after step %d: float8 scales or histories differ", step_no);
}

static void test_update_quantizes_kernels(void **state)
{
    (void)state;
    enum { N = 10, L = 4 };
    mp_float8_params p = mp_float8_params_default();
    p.amax_history_len = L;
    p.margin = 1;
    batch b[N];
    make_batches(b, N);
    b[3].x[7] = INFINITY; /* skipped */
    mp_model *fused = wide_mlp(&p), *plain = wide_mlp(&p);
    mp_optimizer *po = mp_model_optimizer(plain);
    for (int i = 0; i < mp_optimizer_num_params(po); i++)
        assert_int_equal(mp_optimizer_set_update_hook(po, i, (mp_update_hook){0}), MP_OK);
    const int threads = mp_num_threads();
    mp_set_num_threads(2);
    for (int i = 0; i < N; i++) {
        mp_model *both[2] = {fused, plain};
        for (int v = 0; v < 2; v++) {
            mp_model *m = both[v];
            if (i == 5) { /* a master changed by hand: told */
                for (int j = 0; j < mp_model_num_params(m); j++) {
                    mp_model_param *q = mp_model_get_param(m, j);
                    if (mp_float8_kernel_meta(fused, mp_model_get_param(fused, j)->master))
                        q->master[17] += 0.25f;
                }
                mp_model_mark_masters_changed(m);
            }
            if (i == 7) /* a custom loop's update, outside the step: the last gradients again */
                assert_int_equal(mp_optimizer_step(mp_model_optimizer(m)), MP_OK);
            assert_int_equal(step(m, &b[i]).applied, i != 3);
        }
        same_state(fused, plain, L, i);
    }
    /* taken by the forwards of steps 1-4, 6 and 8-9 (not 0: nothing
     * updated yet; 5: masters changed; 7: stale), by both kernels */
    int kernels;
    assert_int_equal(fresh_uses(fused, &kernels), 2 * 7);
    assert_int_equal(kernels, 2);
    assert_int_equal(fresh_uses(plain, &kernels), 0);
    /* and an inference pass on the operand the last update left */
    mp_tensor tx;
    mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){8, 12}, b[0].x);
    const mp_tensor *ya, *yb;
    uint16_t out[8 * 3]; /* bfloat16, the policy's compute dtype */
    assert_int_equal(mp_model_forward(fused, &tx, false, &ya), MP_OK);
    assert_int_equal(mp_tensor_bytes(ya), sizeof out);
    memcpy(out, ya->data, sizeof out);
    assert_int_equal(mp_model_forward(plain, &tx, false, &yb), MP_OK);
    assert_memory_equal(out, yb->data, sizeof out);
    assert_int_equal(fresh_uses(fused, &kernels), 2 * 8);
    mp_model_free(fused);
    mp_model_free(plain);
    mp_set_num_threads(threads);
}

/* ----------------------------------------------------- bad input */

static void expect_set_error(const char *key, const char *value, const char *needle)
{
    mp_float8_params p = mp_float8_params_default();
    assert_int_equal(mp_float8_params_set(&p, key, value), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), needle));
    assert_null(strchr(mp_last_error(), '\n'));
}

static void test_bad_input(void **state)
{
    (void)state;
    expect_set_error("format", "e5m3", "'e5m3'");
    expect_set_error("scaling", "later", "'later'");
    expect_set_error("algorithm", "mean", "'mean'");
    expect_set_error("amax_history_len", "0", "amax_history_len '0'");
    expect_set_error("amax_history_len", "12x", "'12x'");
    expect_set_error("margin", "-1", "margin '-1'");
    expect_set_error("keep_first_last", "maybe", "'maybe'");
    expect_set_error("colour", "red", "'colour'");
    mp_float8_params p = mp_float8_params_default();
    assert_int_equal(mp_float8_params_set(&p, "amax_history_len", "16"), MP_OK);
    assert_int_equal(p.amax_history_len, 16);
    p.amax_history_len = 0;
    assert_int_equal(mp_float8_params_validate(&p), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "amax_history_len 0"));
    assert_int_equal(mp_set_global_float8_params(&p), MP_ERR_INVALID);
    p = mp_float8_params_default();
    p.margin = -2;
    assert_int_equal(mp_float8_params_validate(&p), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "margin -2"));
    p = mp_float8_params_default();
    p.format = (mp_float8_format)7;
    assert_int_equal(mp_float8_params_validate(&p), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "format 7"));
    /* in a model: a layer option, and the JSON fields */
    mp_model *m = mp_model_new(1);
    mp_node x = mp_input(m, 1, (int64_t[]){4}, NULL);
    assert_true(mp_dense(m, x, 4, MP_ACT_NONE, &(mp_layer_options){.float8_params = &p}) < 0);
    assert_non_null(strstr(mp_last_error(), "format 7"));
    mp_model_free(m);
    m = mp_model_new(1);
    x = mp_input(m, 1, (int64_t[]){4}, NULL);
    assert_true(mp_activation_layer(m, x, MP_ACT_RELU, &(mp_layer_options){.float8 = 1}) < 0);
    assert_non_null(strstr(mp_last_error(), "no float8 GEMM"));
    mp_model_free(m);
    const char *head = "{\"format\": \"mixprec.model\", \"version\": 2, \"layers\": ["
                       "{\"class_name\": \"InputLayer\", \"name\": \"x\", \"inputs\": [], "
                       "\"shape\": [8]}, ";
    const char *const cases[][2] = {
        {"{\"class_name\": \"Dense\", \"name\": \"d\", \"inputs\": [\"x\"], \"units\": 4, "
         "\"float8_params\": {\"format\": \"e3m4\"}}]}",
         "'e3m4'"},
        {"{\"class_name\": \"Dense\", \"name\": \"d\", \"inputs\": [\"x\"], \"units\": 4, "
         "\"float8_params\": {\"amax_history_len\": 0}}]}",
         "amax_history_len '0'"},
        {"{\"class_name\": \"Dense\", \"name\": \"d\", \"inputs\": [\"x\"], \"units\": 4, "
         "\"float8_params\": {\"algorithm\": \"avg\"}}]}",
         "'avg'"},
        {"{\"class_name\": \"Dense\", \"name\": \"d\", \"inputs\": [\"x\"], \"units\": 4, "
         "\"float8\": \"yes\"}]}",
         "'float8' must be true or false"},
        {"{\"class_name\": \"Activation\", \"name\": \"a\", \"inputs\": [\"x\"], "
         "\"activation\": \"relu\", \"float8\": true}]}",
         "unknown field 'float8'"},
    };
    test_configs_refused(head, cases, sizeof cases / sizeof *cases);
    mp_policy pol;
    assert_int_equal(mp_policy_from_name("mixed_float8", &pol), MP_OK);
    assert_true(pol.float8 && pol.compute == MP_BF16 && pol.variable == MP_F32);
    assert_int_equal(mp_policy_from_name("mixed_float9", &pol), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "mixed_float9"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_which_layers),     cmocka_unit_test(test_memory_plan),
        cmocka_unit_test(test_conv2d_float8),    cmocka_unit_test(test_nonfinite_amax),
        cmocka_unit_test(test_resume_bit_exact), cmocka_unit_test(test_update_quantizes_kernels),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests_name("fp8_model", tests, NULL, NULL);
}
