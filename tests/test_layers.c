/* test_layers.c - the layer interface and what it carries: Keras's fans and
 * initializers (defaults by role, overrides per layer and in JSON), Reshape
 * and Flatten as views, Add over any number of inputs, errors that name the
 * layer and the field, the model's policy and explicit per-layer policies
 * through a saved configuration, and a version-1 checkpoint of the corpus
 * that reproduces and resumes bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "core/internal.h"
#include "nn/layer.h"

/* ------------------------------------------------------------ helpers */

static void fill(float *x, int64_t n, uint64_t seed)
{
    test_rng r = {seed};
    for (int64_t i = 0; i < n; i++) x[i] = (float)test_rng_uniform(&r, -1, 1);
}

static mp_model *from_json(const char *text, mp_status want)
{
    mp_model *m = NULL;
    mp_status s = mp_model_from_config(text, 4, INT64_MAX, &m);
    if (s != want) fail_msg("status %d, want %d: %s", (int)s, (int)want, mp_last_error());
    return m;
}

#define CONFIG_HEAD                                                                                \
    "{\"format\": \"mixprec.model\", \"version\": 2, \"seed\": \"0x7\", \"layers\": ["
#define INPUT8 "{\"class_name\": \"InputLayer\", \"name\": \"x\", \"inputs\": [], \"shape\": [8]}"

/* --------------------------------------------------------- initializers */

static void test_param_fans(void **state)
{
    (void)state;
    mp_model_param p = {.ndim = 4, .shape = {3, 3, 16, 32}};
    double fi, fo;
    mp_param_fans(&p, &fi, &fo); /* a conv kernel, as Keras computes it */
    assert_true(fi == 3 * 3 * 16 && fo == 3 * 3 * 32);
    p = (mp_model_param){.ndim = 2, .shape = {784, 4096}};
    mp_param_fans(&p, &fi, &fo);
    assert_true(fi == 784 && fo == 4096);
    p = (mp_model_param){.ndim = 1, .shape = {10}};
    mp_param_fans(&p, &fi, &fo);
    assert_true(fi == 10 && fo == 10);
    p = (mp_model_param){.ndim = 3, .shape = {5, 7, 11}};
    mp_param_fans(&p, &fi, &fo);
    assert_true(fi == 35 && fo == 55);
}

/* w is U(-limit, limit): every |w| <= limit, the largest within 1% of it
 * (n = 60000 draws miss the top 1% with probability 0.99^60000 < 1e-261),
 * and the mean within 5 standard errors (limit / sqrt(3 n)) of zero. */
static void assert_uniform(const float *w, int64_t n, double limit)
{
    double mx = 0, sum = 0;
    for (int64_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(w[i]));
        sum += w[i];
    }
    assert_true(mx <= limit && mx >= 0.99 * limit);
    assert_true(fabs(sum / (double)n) < 5 * limit / sqrt(3.0 * (double)n));
}

static void test_initializers(void **state)
{
    (void)state;
    mp_model *m = mp_model_new(3);
    mp_node x = mp_input(m, 1, (int64_t[]){300}, NULL);
    mp_node a = mp_dense(m, x, 200, MP_ACT_NONE, NULL); /* glorot_uniform, zeros */
    mp_layer_options he = {
        .initializers = {[MP_ROLE_KERNEL] = MP_INIT_HE_UNIFORM, [MP_ROLE_BIAS] = MP_INIT_ONES}};
    mp_node b = mp_dense(m, a, 200, MP_ACT_NONE, &he);
    mp_layer_options lecun = {.initializers = {[MP_ROLE_KERNEL] = MP_INIT_LECUN_UNIFORM}};
    b = mp_dense(m, b, 300, MP_ACT_NONE, &lecun);
    mp_layer_options bad = {.initializers = {[MP_ROLE_KERNEL] = (mp_initializer)99}};
    assert_int_equal(mp_model_build(m, b, 4), MP_OK);
    (void)bad;
    assert_uniform(mp_model_get_param(m, 0)->master, 300 * 200, sqrt(6.0 / 500));
    for (int i = 0; i < 200; i++) assert_true(mp_model_get_param(m, 1)->master[i] == 0.0f);
    assert_uniform(mp_model_get_param(m, 2)->master, 200 * 200, sqrt(6.0 / 200));
    for (int i = 0; i < 200; i++) assert_true(mp_model_get_param(m, 3)->master[i] == 1.0f);
    assert_uniform(mp_model_get_param(m, 4)->master, 200 * 300, sqrt(3.0 / 200));
    /* the overrides are part of the configuration and come back from it */
    char *json = mp_model_config_json(m);
    assert_non_null(strstr(json, "\"kernel_initializer\":\"he_uniform\""));
    assert_non_null(strstr(json, "\"bias_initializer\":\"ones\""));
    mp_model *r = from_json(json, MP_OK);
    for (int i = 0; i < mp_model_num_params(m); i++) {
        mp_model_param *p = mp_model_get_param(m, i), *q = mp_model_get_param(r, i);
        assert_string_equal(p->name, q->name);
        assert_memory_equal(p->master, q->master, (size_t)p->n * sizeof(float));
    }
    free(json);
    mp_model_free(r);
    mp_model_free(m);
    /* an unknown initializer: refused by the constructor and in JSON */
    m = mp_model_new(3);
    x = mp_input(m, 1, (int64_t[]){4}, NULL);
    assert_int_equal(mp_dense(m, x, 2, MP_ACT_NONE, &bad), -1);
    assert_non_null(strstr(mp_last_error(), "initializer"));
    mp_model_free(m);
    from_json(CONFIG_HEAD INPUT8 ", {\"class_name\": \"Dense\", \"name\": \"d\", \"inputs\": "
                                 "[\"x\"], \"units\": 2, \"kernel_initializer\": \"normal\"}]}",
              MP_ERR_FORMAT);
    assert_non_null(strstr(mp_last_error(), "layer 'd'"));
    assert_non_null(strstr(mp_last_error(), "kernel_initializer"));
}

/* ------------------------------------------------------- views and Add */

/* Reshape and Flatten move no data: a model with two reshapes between its
 * Dense layers computes the same bits as one without them, and the
 * reshape's output is the Dense output's storage. */
static void test_reshape_is_a_view(void **state)
{
    (void)state;
    mp_layer_options s1 = {.seed = 11}, s2 = {.seed = 12};
    mp_model *a = mp_model_new(1), *b = mp_model_new(1);
    mp_node xa = mp_input(a, 1, (int64_t[]){12}, NULL);
    mp_node da = mp_dense(a, xa, 12, MP_ACT_TANH, &s1);
    mp_node r1 = mp_reshape(a, da, 2, (int64_t[]){3, 4}, NULL);
    mp_node r2 = mp_reshape(a, r1, 2, (int64_t[]){-1, 6}, NULL);
    mp_node f = mp_flatten(a, r2, NULL);
    mp_node oa = mp_dense(a, f, 5, MP_ACT_NONE, &s2);
    mp_node xb = mp_input(b, 1, (int64_t[]){12}, NULL);
    mp_node ob = mp_dense(b, mp_dense(b, xb, 12, MP_ACT_TANH, &s1), 5, MP_ACT_NONE, &s2);
    assert_int_equal(mp_model_build(a, oa, 4), MP_OK);
    assert_int_equal(mp_model_build(b, ob, 4), MP_OK);
    mp_layer_info li;
    mp_model_layer_info(a, r2, 4, &li);
    assert_true(li.ndim == 2 && li.shape[0] == 2 && li.shape[1] == 6 && li.saved_bytes == 0);
    float x[48], dy[20];
    fill(x, 48, 5);
    fill(dy, 20, 6);
    mp_tensor tx, tdy;
    mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){4, 12}, x);
    mp_tensor_wrap(&tdy, MP_F32, 2, (int64_t[]){4, 5}, dy);
    const mp_tensor *ya, *yb;
    assert_int_equal(mp_model_forward(a, &tx, true, &ya), MP_OK);
    assert_int_equal(mp_model_forward(b, &tx, true, &yb), MP_OK);
    assert_ptr_equal(mp_model_node_output(a, r2)->data, mp_model_node_output(a, da)->data);
    assert_memory_equal(ya->data, yb->data, 20 * sizeof(float));
    assert_int_equal(mp_model_backward(a, &tdy, false), MP_OK);
    assert_int_equal(mp_model_backward(b, &tdy, false), MP_OK);
    for (int i = 0; i < 4; i++) {
        mp_model_param *p = mp_model_get_param(a, i), *q = mp_model_get_param(b, i);
        assert_memory_equal(p->grad, q->grad, (size_t)p->n * sizeof(float));
    }
    mp_model_free(a);
    mp_model_free(b);
    /* targets that do not fit */
    mp_model *m = mp_model_new(1);
    mp_node x0 = mp_input(m, 1, (int64_t[]){12}, NULL);
    assert_int_equal(mp_reshape(m, x0, 2, (int64_t[]){5, 5}, NULL), -1);
    assert_non_null(strstr(mp_last_error(), "reshape 'reshape'"));
    mp_model_free(m);
    m = mp_model_new(1);
    x0 = mp_input(m, 1, (int64_t[]){12}, NULL);
    assert_int_equal(mp_reshape(m, x0, 2, (int64_t[]){-1, -1}, NULL), -1);
    mp_model_free(m);
}

/* Add sums any number of inputs left to right in the compute dtype and gives
 * each the output's gradient. */
/* Add hands its gradient on without a copy (the inputs' gradients are views
 * of it, mp_model_share_grad); a second contribution to such an input sums
 * into a buffer of its own and leaves the shared one as it was: with d
 * feeding s = d + d and t = s + d, d's gradient is (dy + dy) + dy, and s's
 * and t's stay dy. */
static void test_add_shared_grad(void **state)
{
    (void)state;
    mp_model *m = mp_model_new(2);
    mp_node x = mp_input(m, 1, (int64_t[]){8}, NULL);
    mp_node d = mp_dense(m, x, 8, MP_ACT_NONE, NULL);
    mp_node s = mp_add(m, d, d, NULL);
    mp_node t = mp_add(m, s, d, NULL);
    assert_int_equal(mp_model_build(m, t, 2), MP_OK);
    float xv[16], dy[16], want[16];
    fill(xv, 16, 7);
    fill(dy, 16, 8);
    mp_tensor tx, tdy;
    mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){2, 8}, xv);
    mp_tensor_wrap(&tdy, MP_F32, 2, (int64_t[]){2, 8}, dy);
    const mp_tensor *y;
    for (int pass = 0; pass < 2; pass++) { /* a second step starts clean */
        assert_int_equal(mp_model_forward(m, &tx, true, &y), MP_OK);
        assert_int_equal(mp_model_backward(m, &tdy, false), MP_OK);
        for (int i = 0; i < 16; i++) want[i] = (dy[i] + dy[i]) + dy[i];
        assert_memory_equal(mp_model_node_grad(m, t)->data, dy, sizeof dy);
        assert_memory_equal(mp_model_node_grad(m, s)->data, dy, sizeof dy);
        assert_memory_equal(mp_model_node_grad(m, d)->data, want, sizeof want);
    }
    mp_model_free(m);
}

/* Add followed by a relu Activation, its only consumer: the relu is fused
 * (mp_layer.relu_fused). Against the same model with an identity between
 * them, which keeps them apart: the same output, weight gradients and
 * input gradient bit for bit under each policy; the fused Add reports no
 * output or gradient of its own. Inputs: two Dense layers off one identity
 * (whose gradient is the sum of both paths). */
static void test_add_relu_fusion(void **state)
{
    (void)state;
    const char *const policies[] = {"float32", "mixed_bfloat16", "mixed_float16"};
    float xv[32 * 12], dy[32 * 24];
    fill(xv, 32 * 12, 3);
    fill(dy, 32 * 24, 4);
    mp_tensor tx, tdy;
    mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){32, 12}, xv);
    mp_tensor_wrap(&tdy, MP_F32, 2, (int64_t[]){32, 24}, dy);
    for (int pi = 0; pi < 3; pi++) {
        void *out[2], *dx[2], *dw[2];
        size_t es = 0, nw = 0;
        for (int k = 0; k < 2; k++) {
            mp_model *m = mp_model_new_with_policy(9, policies[pi]);
            mp_node x = mp_input(m, 1, (int64_t[]){12}, NULL);
            mp_node pre = mp_activation_layer(m, x, MP_ACT_NONE, NULL);
            mp_node d1 = mp_dense(m, pre, 24, MP_ACT_NONE, &(mp_layer_options){.name = "d1"});
            mp_node d2 = mp_dense(m, pre, 24, MP_ACT_NONE, &(mp_layer_options){.name = "d2"});
            mp_node s = mp_add(m, d1, d2, NULL), y = s;
            if (k == 1) y = mp_activation_layer(m, y, MP_ACT_NONE, NULL);
            y = mp_activation_layer(m, y, MP_ACT_RELU, NULL);
            assert_int_equal(mp_model_build(m, y, 32), MP_OK);
            const mp_tensor *o;
            assert_int_equal(mp_model_forward(m, &tx, true, &o), MP_OK);
            es = mp_dtype_size(o->dtype);
            out[k] = malloc(32 * 24 * es);
            memcpy(out[k], o->data, 32 * 24 * es);
            assert_true((mp_model_node_output(m, s) == NULL) == (k == 0));
            assert_int_equal(mp_model_backward(m, &tdy, false), MP_OK);
            assert_true((mp_model_node_grad(m, s) == NULL) == (k == 0));
            dx[k] = malloc(32 * 12 * es);
            memcpy(dx[k], mp_model_node_grad(m, pre)->data, 32 * 12 * es);
            nw = 0;
            for (int i = 0; i < mp_model_num_params(m); i++) nw += mp_model_get_param(m, i)->n;
            dw[k] = malloc(nw * sizeof(float));
            for (int i = 0, at = 0; i < mp_model_num_params(m); i++) {
                const mp_model_param *p = mp_model_get_param(m, i);
                memcpy((float *)dw[k] + at, p->grad, p->n * sizeof(float));
                at += (int)p->n;
            }
            mp_model_free(m);
        }
        if (memcmp(out[0], out[1], 32 * 24 * es))
            fail_msg("%s: fused add + relu output differs", policies[pi]);
        if (memcmp(dx[0], dx[1], 32 * 12 * es))
            fail_msg("%s: fused add + relu input gradient differs", policies[pi]);
        if (memcmp(dw[0], dw[1], nw * sizeof(float)))
            fail_msg("%s: fused add + relu weight gradients differ", policies[pi]);
        for (int k = 0; k < 2; k++) free(out[k]), free(dx[k]), free(dw[k]);
    }
}

static void test_add_many(void **state)
{
    (void)state;
    mp_model *m = mp_model_new(2);
    mp_node x = mp_input(m, 1, (int64_t[]){8}, NULL);
    mp_node d[3];
    for (int i = 0; i < 3; i++) d[i] = mp_dense(m, x, 8, MP_ACT_NONE, NULL);
    mp_node s = mp_add_n(m, 3, d, NULL);
    assert_int_equal(mp_model_build(m, s, 2), MP_OK);
    float xv[16], dy[16];
    fill(xv, 16, 7);
    fill(dy, 16, 8);
    mp_tensor tx, tdy;
    mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){2, 8}, xv);
    mp_tensor_wrap(&tdy, MP_F32, 2, (int64_t[]){2, 8}, dy);
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(m, &tx, false, &y), MP_OK);
    const float *a = mp_model_node_output(m, d[0])->data, *b = mp_model_node_output(m, d[1])->data,
                *c = mp_model_node_output(m, d[2])->data, *out = y->data;
    for (int i = 0; i < 16; i++) assert_true(out[i] == (a[i] + b[i]) + c[i]);
    assert_int_equal(mp_model_backward(m, &tdy, false), MP_OK);
    for (int k = 0; k < 3; k++)
        assert_memory_equal(mp_model_node_grad(m, d[k])->data, dy, sizeof dy);
    mp_model_free(m);
    m = mp_model_new(2);
    x = mp_input(m, 1, (int64_t[]){8}, NULL);
    assert_int_equal(mp_add_n(m, 1, &x, NULL), -1);
    assert_non_null(strstr(mp_last_error(), "Add takes 2 or more inputs"));
    mp_model_free(m);
}

/* --------------------------------------------------------------- errors */

static void test_errors_name_layer_and_field(void **state)
{
    (void)state;
    static const struct {
        const char *json, *want[2];
    } cases[] = {
        {CONFIG_HEAD INPUT8
         ", {\"class_name\": \"Conv9D\", \"name\": \"c\", \"inputs\": [\"x\"]}]}",
         {"layer 'c'", "Conv9D"}},
        {CONFIG_HEAD INPUT8 ", {\"class_name\": \"Dense\", \"name\": \"d\", \"inputs\": [\"x\"], "
                            "\"units\": 2, \"unit\": 3}]}",
         {"layer 'd'", "unknown field 'unit'"}},
        {CONFIG_HEAD INPUT8 ", {\"class_name\": \"Dense\", \"name\": \"d\", \"inputs\": [\"x\"], "
                            "\"units\": 2.5}]}",
         {"layer 'd'", "'units'"}},
        {CONFIG_HEAD INPUT8 ", {\"class_name\": \"Dropout\", \"name\": \"p\", \"inputs\": [\"x\"], "
                            "\"rate\": 1}]}",
         {"layer 'p'", "'rate'"}},
        {CONFIG_HEAD INPUT8 ", {\"class_name\": \"Add\", \"name\": \"s\", \"inputs\": [\"x\"]}]}",
         {"Add takes 2 or more inputs", "got 1"}},
        {CONFIG_HEAD INPUT8 ", {\"class_name\": \"Dense\", \"name\": \"d\", \"inputs\": [\"x\"], "
                            "\"units\": 2, \"policy\": \"float64\"}]}",
         {"float64", "policy"}},
        {CONFIG_HEAD "{\"class_name\": \"InputLayer\", \"name\": \"x\", \"inputs\": [], \"shape\": "
                     "[8], \"dtype\": \"float16\"}]}",
         {"layer 'x'", "'dtype'"}},
        {CONFIG_HEAD INPUT8 "], \"output\": \"y\"}", {"output 'y'", "not a layer"}},
        {CONFIG_HEAD INPUT8 ", {\"class_name\": \"Reshape\", \"name\": \"r\", \"inputs\": [\"x\"], "
                            "\"target_shape\": [3, 3]}]}",
         {"reshape 'r'", "does not fit"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mp_model *m = NULL;
        mp_status s = mp_model_from_config(cases[i].json, 4, INT64_MAX, &m);
        assert_int_not_equal(s, MP_OK);
        assert_null(m);
        for (int k = 0; k < 2; k++)
            if (!strstr(mp_last_error(), cases[i].want[k]))
                fail_msg("case %zu: '%s' lacks '%s'", i, mp_last_error(), cases[i].want[k]);
    }
    /* int32 data only feeds layers that read integers */
    mp_model *m = mp_model_new(1);
    mp_node ids = mp_input_ex(m, 1, (int64_t[]){6}, MP_I32, NULL);
    assert_int_equal(mp_dense(m, ids, 4, MP_ACT_NONE, NULL), -1);
    assert_non_null(strstr(mp_last_error(), "int32"));
    mp_model_free(m);
    m = mp_model_new(1);
    assert_int_equal(mp_input_ex(m, 1, (int64_t[]){6}, MP_F16, NULL), -1);
    mp_model_free(m);
}

/* ------------------------------------------------------------- policies */

/* The model's policy and each layer's explicit one survive the saved
 * configuration, whatever the global policy is when it is written; another
 * policy replaces the model's and keeps the explicit ones. */
static void test_policy_through_config(void **state)
{
    (void)state;
    mp_set_global_policy("mixed_bfloat16");
    mp_model *m = mp_model_new(9);
    mp_node x = mp_input(m, 1, (int64_t[]){8}, NULL);
    x = mp_dense(m, x, 8, MP_ACT_RELU, NULL);
    mp_node logits = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
    mp_node p =
        mp_activation_layer(m, logits, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    assert_int_equal(mp_model_build(m, p, 4), MP_OK);
    mp_set_global_policy("float32"); /* what the CLI did before saving */
    char *json = mp_model_config_json(m);
    assert_non_null(strstr(json, "\"policy\":\"mixed_bfloat16\""));
    static const struct {
        const char *override, *dense, *softmax;
    } cases[] = {{NULL, "mixed_bfloat16", "float32"},
                 {"mixed_float16", "mixed_float16", "float32"},
                 {"float32", "float32", "float32"},
                 {"bfloat16", "bfloat16", "float32"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mp_model *r = NULL;
        assert_int_equal(mp_model_from_config_ex(json, cases[i].override, 4, INT64_MAX, &r), MP_OK);
        assert_string_equal(mp_model_policy(r).name, cases[i].dense);
        mp_layer_info li;
        mp_model_layer_info(r, 1, 1, &li);
        assert_string_equal(li.policy.name, cases[i].dense);
        assert_false(li.policy_explicit);
        mp_model_layer_info(r, 3, 1, &li);
        assert_string_equal(li.policy.name, cases[i].softmax);
        assert_true(li.policy_explicit);
        mp_model_free(r);
    }
    free(json);
    mp_model_free(m);
    /* a model with its own policy ignores the global one */
    mp_model *w = mp_model_new_with_policy(1, "mixed_float16");
    x = mp_input(w, 1, (int64_t[]){4}, NULL);
    x = mp_dense(w, x, 2, MP_ACT_NONE, NULL);
    mp_layer_info li;
    mp_model_layer_info(w, 1, 1, &li);
    assert_string_equal(li.policy.name, "mixed_float16");
    assert_false(li.policy_explicit);
    mp_model_free(w);
    assert_null(mp_model_new_with_policy(1, "float64"));
}

/* Dropout draws by global row: a data-parallel shard (rows 5..11 with
 * mp_model_set_row_offset) keeps exactly what the whole batch keeps in
 * those rows at the same forward count, and a shard without the offset
 * would draw other masks. */
static void test_dropout_shard_rows(void **state)
{
    (void)state;
    enum { B = 16, D = 24 };
    mp_model *m = mp_model_new(9);
    mp_node x = mp_input(m, 1, (int64_t[]){D}, NULL);
    mp_node y = mp_dropout(m, x, 0.5f, NULL);
    assert_int_equal(mp_model_build(m, y, B), MP_OK);
    float xv[B * D], whole[B * D];
    for (int i = 0; i < B * D; i++) xv[i] = 1.0f + (float)i;
    mp_tensor t;
    const mp_tensor *out;
    mp_tensor_wrap(&t, MP_F32, 2, (int64_t[]){B, D}, xv);
    mp_model_set_forward_count(m, 3);
    assert_int_equal(mp_model_forward(m, &t, true, &out), MP_OK);
    memcpy(whole, out->data, sizeof whole);
    int kept = 0;
    for (int i = 0; i < B * D; i++) kept += whole[i] != 0;
    assert_true(kept > B * D / 4 && kept < 3 * B * D / 4);
    mp_tensor_wrap(&t, MP_F32, 2, (int64_t[]){7, D}, xv + 5 * D);
    mp_model_set_forward_count(m, 3);
    mp_model_set_row_offset(m, 5);
    assert_int_equal(mp_model_forward(m, &t, true, &out), MP_OK);
    assert_memory_equal(out->data, whole + 5 * D, 7 * D * sizeof(float));
    mp_model_set_forward_count(m, 3);
    mp_model_set_row_offset(m, 0);
    assert_int_equal(mp_model_forward(m, &t, true, &out), MP_OK);
    assert_true(memcmp(out->data, whole + 5 * D, 7 * D * sizeof(float)) != 0);
    mp_model_free(m);
}

/* ------------------------------------------------------ version 1 files */

/* What fuzz/make_corpus.c did to write the version-1 seed
 * tests/fuzz/corpus/valid-v1-fit-mixed_bfloat16-residual-adamw: a residual
 * model under mixed_bfloat16, AdamW with cosine decay and stochastic
 * rounding, fit for 7 of 12 steps. */
static mp_model *corpus_model(void)
{
    mp_set_global_policy("mixed_bfloat16");
    mp_model *m = mp_model_new(1234);
    mp_node in = mp_input(m, 1, (int64_t[]){4}, NULL);
    mp_node x = mp_dense(m, in, 4, MP_ACT_GELU, NULL);
    x = mp_dropout(m, x, 0.25f, NULL);
    x = mp_add(m, in, x, NULL);
    x = mp_layer_norm(m, x, 1e-3f, NULL);
    x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    assert_int_equal(mp_model_build(m, x, 8), MP_OK);
    mp_set_global_policy("float32");
    mp_compile_options co = mp_compile_options_default();
    co.optimizer = mp_optimizer_config_default(MP_OPTIMIZER_ADAMW);
    co.optimizer.learning_rate = 3e-3f;
    co.optimizer.schedule.decay = MP_LR_COSINE;
    co.optimizer.schedule.decay_steps = 20;
    co.optimizer.schedule.final_lr = 1e-4f;
    co.optimizer.schedule.warmup_steps = 2;
    co.optimizer.rounding = MP_ROUND_STOCHASTIC;
    co.optimizer.seed = 77;
    co.optimizer.decay_all = true; /* files without decay_all decayed every parameter */
    co.loss_scaling = MP_LOSS_SCALING_NONE;
    co.scaler.growth_interval = 3;
    assert_int_equal(mp_model_compile(m, &co), MP_OK);
    return m;
}

static mp_dataset *corpus_data(void)
{
    int64_t n = 30;
    float x[120];
    int32_t y[30];
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
    assert_int_equal(mp_dataset_from_arrays(x, y, n, 4, 3, &ds), MP_OK);
    return ds;
}

static mp_fit_options corpus_fit(int64_t max_steps)
{
    mp_fit_options fo = mp_fit_options_default();
    fo.batch_size = 8;
    fo.epochs = 4;
    fo.max_steps = max_steps;
    fo.validation_split = 0.2;
    fo.seed = 5;
    fo.verbose = 0;
    fo.patience = 3;
    return fo;
}

/* Same masters, optimizer state and counters; and the same compute copies
 * when both models ran a forward pass since their masters last changed (a
 * loaded model refreshes its copies at its next forward). */
static void assert_same_training(mp_model *a, mp_model *b, bool copies)
{
    assert_int_equal(mp_model_num_params(a), mp_model_num_params(b));
    mp_optimizer *oa = mp_model_optimizer(a), *ob = mp_model_optimizer(b);
    for (int i = 0; i < mp_model_num_params(a); i++) {
        mp_model_param *p = mp_model_get_param(a, i), *q = mp_model_get_param(b, i);
        assert_string_equal(p->name, q->name);
        assert_memory_equal(p->master, q->master, (size_t)p->n * sizeof(float));
        if (copies)
            assert_memory_equal(p->weight, q->weight,
                                (size_t)p->n * mp_dtype_size(p->weight_dtype));
        for (int k = 0; k < mp_optimizer_num_slots(oa); k++)
            assert_memory_equal(mp_optimizer_slot(oa, i, k, NULL),
                                mp_optimizer_slot(ob, i, k, NULL), (size_t)p->n * sizeof(float));
    }
    assert_true(mp_optimizer_step_count(oa) == mp_optimizer_step_count(ob));
    assert_true(mp_model_forward_count(a) == mp_model_forward_count(b));
}

/* The version-1 file loads into the model this version builds, holding the
 * very bits this version computes for its first 7 steps; resumed from it,
 * the run ends where a straight 12-step run ends. */
static void test_v1_checkpoint_resumes_bit_exactly(void **state)
{
    (void)state;
    const char *path = "tests/fuzz/corpus/valid-v1-fit-mixed_bfloat16-residual-adamw";
    mp_safetensors *f;
    assert_int_equal(mp_safetensors_read(path, &f), MP_OK);
    assert_non_null(strstr(mp_safetensors_metadata(f, "mixprec.config"), "\"version\":1"));
    mp_safetensors_free(f);
    mp_dataset *ds = corpus_data();

    mp_model *seven = corpus_model();
    mp_fit_options fo = corpus_fit(7);
    assert_int_equal(mp_model_fit(seven, ds, &fo, NULL), MP_OK);
    mp_model *loaded = NULL;
    mp_fit_state st;
    assert_int_equal(mp_model_from_checkpoint(path, 8, &loaded, &st), MP_OK);
    assert_string_equal(mp_model_policy(loaded).name, "mixed_bfloat16");
    assert_same_training(seven, loaded, false);

    mp_model *straight = corpus_model();
    fo = corpus_fit(0);
    assert_int_equal(mp_model_fit(straight, ds, &fo, NULL), MP_OK);
    fo.resume = &st;
    assert_int_equal(mp_model_fit(loaded, ds, &fo, NULL), MP_OK);
    assert_true(mp_model_forward_count(straight) > mp_model_forward_count(seven));
    assert_same_training(straight, loaded, true);

    mp_fit_state_free(&st);
    mp_model_free(seven);
    mp_model_free(straight);
    mp_model_free(loaded);
    mp_dataset_free(ds);
}

/* ------------------------------------------------------ failing kernels */

/* A GEMM that cannot get its packing buffers inside backward reports
 * MP_ERR_NOMEM through mp_model_backward; once memory is back, the same
 * backward gives the gradients of an undisturbed run. */
static void test_gemm_failure_in_backward_is_reported(void **state)
{
    (void)state;
    mp_model *m = mp_model_new(4);
    mp_node x = mp_input(m, 1, (int64_t[]){512}, NULL);
    x = mp_dense(m, x, 512, MP_ACT_RELU, NULL);
    x = mp_dense(m, x, 512, MP_ACT_NONE, NULL);
    assert_int_equal(mp_model_build(m, x, 64), MP_OK);
    float *xv = malloc(64 * 512 * sizeof *xv), *dy = malloc(64 * 512 * sizeof *dy);
    fill(xv, 64 * 512, 1);
    fill(dy, 64 * 512, 2);
    mp_tensor tx, tdy;
    mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){64, 512}, xv);
    mp_tensor_wrap(&tdy, MP_F32, 2, (int64_t[]){64, 512}, dy);
    assert_int_equal(mp_model_forward(m, &tx, true, NULL), MP_OK);
    assert_int_equal(mp_model_backward(m, &tdy, false), MP_OK);
    int np = mp_model_num_params(m);
    float *ref[4];
    for (int i = 0; i < np; i++) {
        mp_model_param *p = mp_model_get_param(m, i);
        ref[i] = malloc((size_t)p->n * sizeof(float));
        memcpy(ref[i], p->grad, (size_t)p->n * sizeof(float));
    }
    /* packing a 64 x 512 float32 panel takes 128 KiB; the row-wise kernels
     * of backward need a few KiB */
    mp_scratch_fail_above = 64 << 10;
    mp_status s = mp_model_backward(m, &tdy, false);
    mp_scratch_fail_above = SIZE_MAX;
    assert_int_equal(s, MP_ERR_NOMEM);
    assert_non_null(strstr(mp_last_error(), "mp_gemm"));
    assert_int_equal(mp_model_backward(m, &tdy, false), MP_OK);
    for (int i = 0; i < np; i++) {
        mp_model_param *p = mp_model_get_param(m, i);
        assert_memory_equal(ref[i], p->grad, (size_t)p->n * sizeof(float));
        free(ref[i]);
    }
    /* a failed forward leaves nothing to run backward over */
    mp_scratch_fail_above = 64 << 10;
    s = mp_model_forward(m, &tx, true, NULL);
    mp_scratch_fail_above = SIZE_MAX;
    assert_int_equal(s, MP_ERR_NOMEM);
    assert_int_equal(mp_model_backward(m, &tdy, false), MP_ERR_INVALID);
    free(xv);
    free(dy);
    mp_model_free(m);
}

/* ---------------------------------------------------------- memory plan */

/* The plan is what a training step takes: activations exactly what the
 * arena hands out, workspace at least the backward's peak; the batch chosen
 * for a budget is the largest whose plan fits, also above the built batch
 * once the model is re-sized for it. */
static void test_memory_plan(void **state)
{
    (void)state;
    mp_set_global_policy("mixed_bfloat16");
    mp_model *m = mp_model_new(5);
    mp_node x = mp_input(m, 1, (int64_t[]){32}, NULL);
    x = mp_dense(m, x, 64, MP_ACT_GELU, NULL);
    x = mp_dropout(m, x, 0.5f, NULL);
    x = mp_layer_norm(m, x, 1e-3f, NULL);
    x = mp_dense(m, x, 10, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    assert_int_equal(mp_model_build(m, x, 1), MP_OK);
    mp_set_global_policy("float32");
    mp_memory_plan p1, p2;
    assert_int_equal(mp_model_memory_plan(m, 1, 2, &p1), MP_OK);
    assert_int_equal(mp_model_memory_plan(m, 2, 2, &p2), MP_OK);
    size_t fixed = p1.master_weights + p1.weights + p1.gradients + p1.optimizer_state;
    assert_true(p1.optimizer_state == 2 * p1.gradients);
    assert_true(p2.total > p1.total);
    size_t budget = fixed + 40 * (p2.total - p1.total);
    int64_t b = mp_model_batch_for_memory(m, budget, 2, 1 << 20);
    mp_memory_plan pb, pn;
    mp_model_memory_plan(m, b, 2, &pb);
    mp_model_memory_plan(m, b + 1, 2, &pn);
    assert_true(b > 1 && pb.total <= budget && pn.total > budget);
    assert_int_equal(mp_model_batch_for_memory(m, fixed, 2, 1 << 20), 0);
    assert_int_equal(mp_model_set_max_batch(m, b), MP_OK);
    assert_int_equal(mp_model_max_batch(m), b);
    float *xv = calloc((size_t)b * 32, sizeof *xv);
    int32_t *labels = calloc((size_t)b, sizeof *labels);
    mp_tensor tx;
    mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){b, 32}, xv);
    mp_loss_spec spec = {.kind = MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, .labels = labels};
    float loss;
    assert_int_equal(mp_model_forward(m, &tx, true, NULL), MP_OK);
    assert_int_equal(mp_model_activation_bytes(m), pb.activations);
    assert_int_equal(mp_model_loss_backward(m, &spec, 1.0f, false, &loss), MP_OK);
    assert_true(mp_model_workspace_bytes(m) <= pb.workspace);
    free(xv);
    free(labels);
    mp_model_free(m);
}

/* ------------------------------------------------------------ examples */

/* The model files under examples/ build: the seed MLP and ResNet-20 (74
 * layers; 272,186 trainable parameters and 1,568 moving statistics, as
 * Keras counts the same network on 28x28x1 inputs), and a forward pass of
 * ResNet-20 gives probabilities. */
static void test_example_models(void **state)
{
    (void)state;
    mp_model *m = NULL;
    assert_int_equal(mp_model_from_config_file("examples/mlp.json", NULL, 1, 1, &m), MP_OK);
    assert_string_equal(mp_model_policy(m).name, "mixed_bfloat16");
    assert_int_equal(mp_model_num_layers(m), 5);
    mp_model_free(m);
    assert_int_equal(mp_model_from_config_file("examples/resnet20.json", NULL, 1, 2, &m), MP_OK);
    assert_int_equal(mp_model_num_layers(m), 74);
    int64_t trainable = 0, state_n = 0;
    for (int i = 0; i < mp_model_num_params(m); i++) {
        mp_model_param *p = mp_model_get_param(m, i);
        *(p->trainable ? &trainable : &state_n) += p->n;
    }
    assert_true(trainable == 272186 && state_n == 1568);
    float x[2 * 784];
    fill(x, 2 * 784, 9);
    mp_tensor tx;
    mp_tensor_wrap(&tx, MP_F32, 4, (int64_t[]){2, 28, 28, 1}, x);
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(m, &tx, false, &y), MP_OK);
    for (int s = 0; s < 2; s++) {
        double sum = 0;
        for (int c = 0; c < 10; c++) {
            float p = ((const float *)y->data)[s * 10 + c];
            assert_true(p >= 0 && p <= 1);
            sum += p;
        }
        assert_true(fabs(sum - 1) < 10 * 0x1p-24); /* ten float32 roundings */
    }
    mp_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_param_fans),
        cmocka_unit_test(test_initializers),
        cmocka_unit_test(test_reshape_is_a_view),
        cmocka_unit_test(test_add_many),
        cmocka_unit_test(test_add_shared_grad),
        cmocka_unit_test(test_add_relu_fusion),
        cmocka_unit_test(test_errors_name_layer_and_field),
        cmocka_unit_test(test_policy_through_config),
        cmocka_unit_test(test_v1_checkpoint_resumes_bit_exactly),
        cmocka_unit_test(test_gemm_failure_in_backward_is_reported),
        cmocka_unit_test(test_memory_plan),
        cmocka_unit_test(test_dropout_shard_rows),
        cmocka_unit_test(test_example_models),
    };
    return cmocka_run_group_tests_name("layers", tests, NULL, NULL);
}
