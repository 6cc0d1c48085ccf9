/* test_mx_model.c - MX (microscaling) training in a model (mixprec/mx.h):
 * which layers the MX policies and the layer options quantize, the
 * per-layer "mx" / "mx_grad" fields of model files and their round trip, a
 * run that resumes from a checkpoint bit for bit, and one-line errors
 * naming the bad value (library, model file, CLI). The arithmetic is
 * tested in test_mx_train.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common.h"

/* ------------------------------------------------ policies and plan */

/* input, 4 Dense (the last to 3 units), softmax (float32) */
static mp_model *mlp(const char *policy, const mp_layer_options *o, int64_t batch)
{
    mp_model *m = mp_model_new_with_policy(9, policy);
    mp_node x = mp_input(m, 1, (int64_t[]){40}, NULL);
    for (int i = 0; i < 3; i++) x = mp_dense(m, x, 64, MP_ACT_RELU, o);
    x = mp_dense(m, x, 3, MP_ACT_NONE, o);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    assert_int_equal(mp_model_build(m, x, batch), MP_OK);
    return m;
}

static void test_which_layers(void **state)
{
    (void)state;
    const char *policies[] = {"mixed_mxfp8", "mixed_mxfp6", "mixed_mxfp4"};
    const mp_mx_format formats[] = {MP_MXFP8_E4M3, MP_MXFP6_E2M3, MP_MXFP4_E2M1};
    const char *labels[] = {"mx:e4m3+e5m2", "mx:e2m3+e5m2", "mx:e2m1+e5m2"};
    for (int p = 0; p < 3; p++) {
        mp_policy pol;
        assert_int_equal(mp_policy_from_name(policies[p], &pol), MP_OK);
        assert_true(pol.mx && !pol.float8 && pol.mx_format == formats[p]);
        assert_true(pol.compute == MP_BF16 && pol.variable == MP_F32);
        mp_model *m = mlp(policies[p], NULL, 4); /* the first and last Dense stay bf16 */
        bool want[] = {false, false, true, true, false, false};
        for (int i = 0; i < 6; i++) {
            mp_mx_params got;
            assert_int_equal(mp_model_layer_mx(m, i, &got), want[i]);
            assert_false(mp_model_layer_float8(m, i));
            mp_layer_info li;
            assert_int_equal(mp_model_layer_info(m, i, 4, &li), MP_OK);
            assert_int_equal(li.mx, want[i]);
            if (want[i]) assert_true(got.format == formats[p] && got.grad_format == MP_MXFP8_E5M2);
        }
        assert_int_equal(mp_model_float8_num_tensors(m), 0); /* nothing in checkpoints */
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        assert_int_equal(mp_model_summary(m, 4, f), MP_OK);
        fclose(f);
        assert_non_null(strstr(text, labels[p]));
        free(text);
        mp_model_free(m);
    }
    /* mixed_bfloat16 and mixed_float8 quantize nothing in MX */
    mp_model *m = mlp("mixed_bfloat16", NULL, 4);
    for (int i = 0; i < 6; i++) assert_false(mp_model_layer_mx(m, i, NULL));
    mp_model_free(m);
    m = mlp("mixed_float8", NULL, 4);
    for (int i = 0; i < 6; i++) assert_false(mp_model_layer_mx(m, i, NULL));
    assert_true(mp_model_layer_float8(m, 2));
    mp_model_free(m);
    /* layer options: on everywhere (edges too) with the layer's formats; a
     * layer's float8 wins over an MX policy, its mx over a float8 policy */
    mp_mx_params p6 = {MP_MXFP6_E3M2, MP_MXFP6_E2M3};
    m = mlp("mixed_bfloat16", &(mp_layer_options){.mx_params = &p6, .mx = 1}, 4);
    for (int i = 1; i <= 4; i++) {
        mp_mx_params got;
        assert_true(mp_model_layer_mx(m, i, &got));
        assert_true(got.format == MP_MXFP6_E3M2 && got.grad_format == MP_MXFP6_E2M3);
    }
    mp_model_free(m);
    m = mlp("mixed_mxfp4", &(mp_layer_options){.mx = 1}, 4); /* the policy's format */
    for (int i = 1; i <= 4; i++) {
        mp_mx_params got;
        assert_true(mp_model_layer_mx(m, i, &got) && got.format == MP_MXFP4_E2M1);
    }
    mp_model_free(m);
    m = mlp("mixed_mxfp8", &(mp_layer_options){.mx = -1}, 4);
    for (int i = 0; i < 6; i++) assert_false(mp_model_layer_mx(m, i, NULL));
    mp_model_free(m);
    m = mlp("mixed_mxfp8", &(mp_layer_options){.float8 = 1}, 4);
    for (int i = 1; i <= 4; i++) assert_true(mp_model_layer_float8(m, i));
    for (int i = 0; i < 6; i++) assert_false(mp_model_layer_mx(m, i, NULL));
    mp_model_free(m);
    m = mlp("mixed_float8", &(mp_layer_options){.mx = 1}, 4);
    for (int i = 1; i <= 4; i++) assert_true(mp_model_layer_mx(m, i, NULL));
    assert_int_equal(mp_model_float8_num_tensors(m), 0);
    mp_model_free(m);
    /* Conv2D: three convolutions, the middle one in MX */
    m = mp_model_new_with_policy(3, "mixed_mxfp6");
    mp_node x = mp_input(m, 3, (int64_t[]){8, 8, 3}, NULL);
    mp_conv2d_options co = mp_conv2d_options_default(8, 3, 3);
    co.padding = MP_PADDING_SAME;
    for (int i = 0; i < 3; i++) x = mp_conv2d(m, x, &co, NULL);
    assert_int_equal(mp_model_build(m, x, 2), MP_OK);
    for (int i = 0; i < 4; i++) assert_int_equal(mp_model_layer_mx(m, i, NULL), i == 2);
    float data[2 * 8 * 8 * 3], dy[2 * 8 * 8 * 8];
    test_fill(data, sizeof data / sizeof *data, 5, -1, 1);
    test_fill(dy, sizeof dy / sizeof *dy, 6, -1, 1);
    mp_tensor td, tdy;
    mp_tensor_wrap(&td, MP_F32, 4, (int64_t[]){2, 8, 8, 3}, data);
    mp_tensor_wrap(&tdy, MP_F32, 4, (int64_t[]){2, 8, 8, 8}, dy);
    assert_int_equal(mp_model_forward(m, &td, true, NULL), MP_OK);
    assert_int_equal(mp_model_backward(m, &tdy, false), MP_OK);
    const mp_model_param *k = mp_model_get_param(m, 2); /* the middle kernel */
    for (int64_t i = 0; i < k->n; i++) assert_true(isfinite(k->grad[i]));
    mp_model_free(m);
}

/* What an MX Dense keeps for backward is what mixed_bfloat16 keeps (its
 * bfloat16 input: each pass quantizes again); plan and arena agree. */
static void test_memory_plan(void **state)
{
    (void)state;
    size_t saved[2];
    for (int v = 0; v < 2; v++) {
        mp_model *m = mp_model_new_with_policy(3, "mixed_bfloat16");
        mp_node x = mp_input(m, 1, (int64_t[]){256}, NULL);
        mp_node a = mp_activation_layer(m, x, MP_ACT_NONE, NULL);
        mp_node y = mp_dense(m, a, 64, MP_ACT_NONE, &(mp_layer_options){.mx = v});
        assert_int_equal(mp_model_build(m, y, 128), MP_OK);
        mp_layer_info li;
        assert_int_equal(mp_model_layer_info(m, (int)y, 128, &li), MP_OK);
        assert_int_equal(li.mx, v);
        saved[v] = li.saved_bytes;
        mp_memory_plan plan;
        assert_int_equal(mp_model_memory_plan(m, 128, 0, &plan), MP_OK);
        static float data[128 * 256], dy[128 * 64];
        test_fill(data, 128 * 256, 3, -1, 1);
        test_fill(dy, 128 * 64, 4, -1, 1);
        mp_tensor tx, tdy;
        mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){128, 256}, data);
        mp_tensor_wrap(&tdy, MP_F32, 2, (int64_t[]){128, 64}, dy);
        assert_int_equal(mp_model_forward(m, &tx, true, NULL), MP_OK);
        assert_int_equal(mp_model_activation_bytes(m), plan.activations);
        assert_int_equal(mp_model_backward(m, &tdy, false), MP_OK); /* within the workspace */
        mp_model_free(m);
    }
    assert_int_equal(saved[0], saved[1]);
}

/* --------------------------------------------- per-layer JSON fields */

#define LAYER(name, in, units, extra)                                                              \
    "{\"class_name\": \"Dense\", \"name\": \"" name "\", \"inputs\": [\"" in                       \
    "\"], \"units\": " units extra "}"

static void check_layers(const mp_model *m, const mp_mx_params *want, const bool *on, int n)
{
    for (int i = 0; i < n; i++) {
        mp_mx_params got;
        assert_int_equal(mp_model_layer_mx(m, i + 1, &got), on[i]);
        if (on[i] && (got.format != want[i].format || got.grad_format != want[i].grad_format))
            fail_msg("layer %d: %s+%s, expected %s+%s", i + 1, mp_mx_format_name(got.format),
                     mp_mx_format_name(got.grad_format), mp_mx_format_name(want[i].format),
                     mp_mx_format_name(want[i].grad_format));
    }
}

/* "mx" names a format (any name mp_mx_format_from_name takes, as
 * `mixprec tune-precision` writes them) or is false; "mx_grad" names the
 * gradients' format. The model's configuration writes them back and builds
 * the same layers. */
static void test_json_fields(void **state)
{
    (void)state;
    /* seven Dense layers d0..d6 after the input, with these fields */
    static const char *const fields[] = {
        ", \"mx\": \"mxfp6_e2m3\"",
        ", \"mx\": \"mxfp4\", \"mx_grad\": \"mxfp8_e4m3\"",
        "",
        ", \"mx_grad\": \"mxfp6_e3m2\"",
        ", \"mx\": false",
        ", \"mx\": \"mxint8\"",
        "",
    };
    char json[2048];
    int n = snprintf(json, sizeof json,
                     "{\"format\": \"mixprec.model\", \"version\": 2, \"policy\": \"mixed_mxfp8\", "
                     "\"layers\": [{\"class_name\": \"InputLayer\", \"name\": \"d\", "
                     "\"inputs\": [], \"shape\": [40]}");
    for (int i = 0; i < 7; i++) { /* d0 reads the input "d", di reads d(i-1) */
        char in[8] = "d";
        if (i) snprintf(in, sizeof in, "d%d", i - 1);
        n += snprintf(json + n, sizeof json - (size_t)n,
                      ", {\"class_name\": \"Dense\", \"name\": \"d%d\", \"inputs\": [\"%s\"], "
                      "\"units\": %d%s}",
                      i, in, i == 6 ? 4 : 16, fields[i]);
    }
    snprintf(json + n, sizeof json - (size_t)n, "]}");
    const mp_mx_params want[] = {
        {MP_MXFP6_E2M3, MP_MXFP8_E5M2},
        {MP_MXFP4_E2M1, MP_MXFP8_E4M3},
        {MP_MXFP8_E4M3, MP_MXFP8_E5M2},
        {MP_MXFP8_E4M3, MP_MXFP6_E3M2},
        {0, 0},
        {MP_MXINT8, MP_MXFP8_E5M2},
        {0, 0},
    };
    /* d0: explicit on an edge; d2, d3: the policy's; d4: off; d6: the last, kept */
    const bool on[] = {true, true, true, true, false, true, false};
    mp_model *m;
    assert_int_equal(mp_model_from_config(json, 4, INT64_MAX, &m), MP_OK);
    check_layers(m, want, on, 7);
    char *cfg = mp_model_config_json(m);
    assert_non_null(cfg);
    assert_non_null(strstr(cfg, "\"mx\":\"mxfp6_e2m3\""));
    assert_non_null(strstr(cfg, "\"mx\":\"mxfp4_e2m1\""));
    assert_non_null(strstr(cfg, "\"mx_grad\":\"mxfp8_e4m3\""));
    assert_non_null(strstr(cfg, "\"mx_grad\":\"mxfp6_e3m2\""));
    assert_non_null(strstr(cfg, "\"mx\":false"));
    assert_non_null(strstr(cfg, "\"mx\":\"mxint8\""));
    mp_model *r;
    assert_int_equal(mp_model_from_config(cfg, 4, INT64_MAX, &r), MP_OK);
    check_layers(r, want, on, 7);
    char *cfg2 = mp_model_config_json(r);
    assert_string_equal(cfg, cfg2);
    free(cfg2);
    free(cfg);
    mp_model_free(r);
    mp_model_free(m);
    /* the C options write the same fields */
    mp_mx_params p = {MP_MXFP6_E3M2, MP_MXFP8_E5M2};
    m = mlp("mixed_bfloat16", &(mp_layer_options){.mx_params = &p, .mx = 1}, 4);
    cfg = mp_model_config_json(m);
    assert_non_null(strstr(cfg, "\"mx\":\"mxfp6_e3m2\""));
    assert_null(strstr(cfg, "mx_grad")); /* the default */
    assert_int_equal(mp_model_from_config(cfg, 4, INT64_MAX, &r), MP_OK);
    for (int i = 1; i <= 4; i++) {
        mp_mx_params got;
        assert_true(mp_model_layer_mx(r, i, &got) && got.format == MP_MXFP6_E3M2);
    }
    free(cfg);
    mp_model_free(r);
    mp_model_free(m);
}

/* ------------------------------------------------ resume bit for bit */

typedef struct {
    float x[8 * 40];
    int32_t y[8];
} batch;

static void make_batches(batch *b, int n)
{
    for (int i = 0; i < n; i++) test_batch(b[i].x, b[i].y, 8, 40, i);
}

static void step(mp_model *m, batch *b)
{
    assert_true(test_train_rows(m, b->x, b->y, 8, 40).applied);
}

/* MX is stateless: a checkpoint holds the weights, the optimizer and the
 * configuration (its "mx" fields), nothing more, and the run resumes bit
 * for bit, under an MX policy and with per-layer formats. */
static void test_resume_bit_exact(void **state)
{
    (void)state;
    enum { N = 5, M = 4 };
    batch b[N + M];
    make_batches(b, N + M);
    mp_mx_params p = {MP_MXFP6_E3M2, MP_MXFP4_E2M1};
    const mp_layer_options opts[2] = {{0}, {.mx_params = &p, .mx = 1}};
    const char *policies[2] = {"mixed_mxfp6", "mixed_bfloat16"};
    char dir[256], path[300];
    assert_int_equal(test_scratch_dir(dir, sizeof dir, "mp_mxtrain"), 0);
    snprintf(path, sizeof path, "%s/ck.safetensors", dir);
    for (int v = 0; v < 2; v++) {
        mp_model *straight = mlp(policies[v], &opts[v], 8), *first = mlp(policies[v], &opts[v], 8);
        assert_int_equal(mp_model_compile(straight, NULL), MP_OK);
        assert_int_equal(mp_model_compile(first, NULL), MP_OK);
        for (int i = 0; i < N + M; i++) step(straight, &b[i]);
        for (int i = 0; i < N; i++) step(first, &b[i]);
        assert_int_equal(mp_model_save_checkpoint(first, path, NULL), MP_OK);
        mp_model_free(first);
        mp_model *resumed;
        assert_int_equal(mp_model_from_checkpoint(path, 8, &resumed, NULL), MP_OK);
        for (int i = 0; i < 6; i++) {
            mp_mx_params a, c;
            bool on = mp_model_layer_mx(straight, i, &a);
            assert_int_equal(mp_model_layer_mx(resumed, i, &c), on);
            assert_true(!on || (a.format == c.format && a.grad_format == c.grad_format));
        }
        assert_true(mp_model_layer_mx(resumed, 2, NULL));
        for (int i = N; i < N + M; i++) step(resumed, &b[i]);
        assert_int_equal(mp_model_num_params(resumed), mp_model_num_params(straight));
        for (int i = 0; i < mp_model_num_params(straight); i++) {
            const mp_model_param *a = mp_model_get_param(straight, i),
                                 *c = mp_model_get_param(resumed, i);
            assert_memory_equal(a->master, c->master, (size_t)a->n * sizeof(float));
        }
        mp_model_free(resumed);
        mp_model_free(straight);
    }
    test_remove_tree(dir);
}

/* ----------------------------------------------------- bad input */

static void expect_layer_error(const mp_layer_options *o, bool dense, const char *needle)
{
    mp_model *m = mp_model_new_with_policy(1, "mixed_bfloat16");
    mp_node x = mp_input(m, 1, (int64_t[]){4}, NULL);
    mp_node y =
        dense ? mp_dense(m, x, 4, MP_ACT_NONE, o) : mp_activation_layer(m, x, MP_ACT_RELU, o);
    assert_true(y < 0);
    if (!strstr(mp_last_error(), needle)) fail_msg("'%s' lacks '%s'", mp_last_error(), needle);
    assert_null(strchr(mp_last_error(), '\n'));
    mp_model_free(m);
}

/* The CLI under test: $MP_CLI (tests/run.sh sets it), else build/mixprec.
 * Returns the exit status; its output (both streams) into out. */
static int run_cli(const char *args, char *out, size_t len)
{
    const char *cli = getenv("MP_CLI");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", cli ? cli : "build/mixprec", args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, len - 1, p);
    out[n] = 0;
    char rest[4096]; /* read to the end: the CLI must not die of a closed pipe */
    while (fread(rest, 1, sizeof rest, p) > 0) continue;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_bad_input(void **state)
{
    (void)state;
    mp_policy pol;
    assert_int_equal(mp_policy_from_name("mixed_mxfp5", &pol), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "'mixed_mxfp5'"));
    assert_non_null(strstr(mp_last_error(), "mixed_mxfp4"));
    mp_mx_params p = {(mp_mx_format)9, MP_MXFP8_E5M2};
    assert_int_equal(mp_mx_params_validate(&p), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "format 9"));
    assert_int_equal(mp_set_global_mx_params(&p), MP_ERR_INVALID);
    expect_layer_error(&(mp_layer_options){.mx_params = &p}, true, "format 9");
    p = (mp_mx_params){MP_MXFP8_E4M3, (mp_mx_format)-1};
    expect_layer_error(&(mp_layer_options){.mx_params = &p}, true, "gradient format -1");
    expect_layer_error(&(mp_layer_options){.mx = 2}, true, "mx = 2");
    expect_layer_error(&(mp_layer_options){.mx = 1}, false, "no MX GEMM");
    expect_layer_error(&(mp_layer_options){.mx = 1, .float8 = 1}, true, "float8 and mx");
    /* model files */
    const char *head = "{\"format\": \"mixprec.model\", \"version\": 2, \"layers\": ["
                       "{\"class_name\": \"InputLayer\", \"name\": \"x\", \"inputs\": [], "
                       "\"shape\": [8]}, ";
    const char *const cases[][2] = {
        {LAYER("d", "x", "4", ", \"mx\": \"mxfp5\"") "]}", "'mxfp5'"},
        {LAYER("d", "x", "4", ", \"mx\": \"MXFP8_E4M3\"") "]}", "'MXFP8_E4M3'"},
        {LAYER("d", "x", "4", ", \"mx\": true") "]}", "'mx' must be an MX format name"},
        {LAYER("d", "x", "4", ", \"mx\": 8") "]}", "'mx' must be an MX format name"},
        {LAYER("d", "x", "4", ", \"mx_grad\": \"e5m2\"") "]}", "'e5m2'"},
        {LAYER("d", "x", "4", ", \"mx_grad\": null") "]}", "'mx_grad' must be"},
        {LAYER("d", "x", "4", ", \"mx\": \"mxfp8_e4m3\", \"float8\": true") "]}", "float8 and mx"},
        {"{\"class_name\": \"Activation\", \"name\": \"a\", \"inputs\": [\"x\"], "
         "\"activation\": \"relu\", \"mx\": \"mxfp8_e4m3\"}]}",
         "unknown field 'mx'"},
        {"{\"class_name\": \"Flatten\", \"name\": \"a\", \"inputs\": [\"x\"], "
         "\"mx_grad\": \"mxfp8_e4m3\"}]}",
         "unknown field 'mx_grad'"},
    };
    test_configs_refused(head, cases, sizeof cases / sizeof *cases);
    /* the CLI: one line naming the value, exit 2, before any data loads */
    char out[4096], dir[256], args[600];
    assert_int_equal(run_cli("train --policy mixed_mxfp5", out, sizeof out), 2);
    assert_non_null(strstr(out, "--policy mixed_mxfp5"));
    assert_non_null(strstr(out, "mixed_mxfp8, mixed_mxfp6 or mixed_mxfp4"));
    assert_int_equal(strchr(out, '\n') - out + 1, (long)strlen(out));
    assert_int_equal(run_cli("train --mx-grad e5m2", out, sizeof out), 2);
    assert_non_null(strstr(out, "--mx-grad e5m2: unknown MX format 'e5m2'"));
    assert_int_equal(strchr(out, '\n') - out + 1, (long)strlen(out));
    assert_int_equal(test_scratch_dir(dir, sizeof dir, "mp_mxcli"), 0);
    snprintf(args, sizeof args, "%s/m.json", dir);
    FILE *f = fopen(args, "w");
    assert_non_null(f);
    fprintf(f, "%s%s", head, LAYER("d", "x", "4", ", \"mx\": \"mxfp7\"") "]}");
    fclose(f);
    snprintf(args, sizeof args, "train --model %s/m.json --data %s/none.csv", dir, dir);
    assert_int_equal(run_cli(args, out, sizeof out), 2);
    if (!strstr(out, "'mxfp7'")) fail_msg("'%s' lacks 'mxfp7'", out);
    assert_int_equal(strchr(out, '\n') - out + 1, (long)strlen(out));
    assert_int_equal(run_cli("train --help", out, sizeof out), 0);
    assert_non_null(strstr(out, "mixed_mxfp8, mixed_mxfp6, mixed_mxfp4"));
    test_remove_tree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_which_layers), cmocka_unit_test(test_memory_plan),
        cmocka_unit_test(test_json_fields),  cmocka_unit_test(test_resume_bit_exact),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests_name("mx_model", tests, NULL, NULL);
}
