/* test_attention_quant.c - MultiHeadAttention's four projection GEMMs in
 * float8 (per tensor, current and delayed scaling, HYBRID and E4M3) and MX
 * (nn/quant.h; the softmax stays float32): forward and backward against a
 * float64 reference that quantizes each operand with the test's own code
 * (the scale rule, the float32 product x * scale and a round-to-nearest-
 * even to the fp8 grid written here; MX blocks by mp_mx_quantize_2d,
 * tested bit-exactly in test_mx.c); each projection's tensors recorded
 * under its own name; the precision plan listing the projections; a
 * float8 attention model resuming from a checkpoint bit for bit.
 *
 * The reference case is one position (T = 1): attention then returns V
 * exactly (one key: the softmax weight is exp(0) = 1) and its gradient
 * hands dV = dA on and dQ = dK = 0 (dS = P (dO.V - dO.O) with O = V), so
 * every tensor the projections quantize is known to the test. The data
 * are small integers over powers of two (|n| <= 7: three significant
 * bits, which E4M3, E5M2, MXFP8 and MXFP6 E2M3 hold) with amaxes at
 * 7 2^-k, so the per-tensor scales fp8_max / amax are powers of two and
 * x, W and dY quantize without loss; the float32 sums of V and dA are then
 * exact (integers far below 2^24 over a power of two) and their bfloat16
 * roundings are the test's. The attention output and dV quantize with
 * loss, at scales that are not powers of two: those GEMMs are checked
 * against the float64 sums within gamma_{k+1+3} (three more roundings of
 * the factor 1/s_a * 1/s_b; tests/common.h) and one bfloat16 rounding. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum { B = 6, E = 8, H = 2, D = 4, HD = H * D };

/* ------------------------------------------------- the test's quantizer */

/* x rounded to nearest even on the grid of a float format with `mbits`
 * fraction bits and smallest normal exponent emin, saturating at max. */
static double grid_round(double x, int mbits, int emin, double max)
{
    if (x == 0 || isnan(x)) return x;
    int e;
    frexp(fabs(x), &e);
    e = e - 1 < emin ? emin : e - 1; /* |x| in [2^e, 2^(e+1)) or subnormal */
    double q = ldexp(nearbyint(ldexp(x, mbits - e)), e - mbits);
    return fabs(q) > max ? copysign(max, x) : q;
}

static float bf16r(double x) { return (float)grid_round(x, 7, -126, 0x1.fep127); }

typedef struct {
    const char *label;
    bool mx;
    mp_float8_params fp8;
    mp_mx_params mxp;
} qcase;

/* An operand as the reference reads it: values (fp8 codes, or MX values)
 * and the factor the GEMM result takes (1 / scale, or 1). */
typedef struct {
    float *v;
    double inv;
} ref_operand;

/* x [rows, cols] quantized for a GEMM reducing along `axis`: per tensor,
 * scale = fp8_max / amax in float32 (1 for delayed scaling's first step,
 * whose history is empty), codes = round(x * scale in float32). */
static ref_operand ref_q(const qcase *c, bool grad, const float *x, int64_t rows, int64_t cols,
                         int axis)
{
    size_t n = (size_t)(rows * cols);
    ref_operand o = {malloc(n * sizeof(float)), 1.0};
    assert_non_null(o.v);
    if (c->mx) {
        mp_mx_format f = grad ? c->mxp.grad_format : c->mxp.format;
        assert_int_equal(mp_mx_quantize_2d(f, MP_MX_BLOCK, rows, cols, axis, x, o.v, MP_F32),
                         MP_OK);
        return o;
    }
    bool e5m2 = grad && c->fp8.format == MP_FLOAT8_HYBRID;
    float max = e5m2 ? 57344.0f : 448.0f, amax = 0.0f, scale = 1.0f;
    for (size_t i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    if (c->fp8.scaling == MP_FLOAT8_CURRENT && amax > 0) scale = max / amax;
    for (size_t i = 0; i < n; i++)
        o.v[i] = (float)grid_round(x[i] * scale, e5m2 ? 2 : 3, e5m2 ? -14 : -6, max);
    o.inv = 1.0 / scale;
    return o;
}

/* got against a * b (a [m, k], b read at b[kk * bs_k + j * bs_n]) times
 * the operands' factors, plus bias */
static void check_gemm(const char *what, const ref_operand *a, const ref_operand *b,
                       const float *bias, int64_t m, int64_t n, int64_t k, int64_t bs_k,
                       int64_t bs_n, const void *got, mp_dtype gt)
{
    test_gemm_ref g = {a->v, b->v, bias, m, n, k, bs_k, bs_n, gt == MP_BF16, 3, a->inv * b->inv};
    double worst = test_gemm_worst(&g, got, gt);
    if (!(worst <= 1)) fail_msg("%s: error %.3g times the bound", what, worst);
}

/* A projection's parameter gradients from its input x [B, in] and output
 * gradient dz [B, out]: dW = q(x)^T q(dz), both down the samples; db = the
 * column sums of dz (float32, unquantized; gamma_B). */
static void check_param_grads(const qcase *c, const char *what, const float *x, int64_t in,
                              const float *dz, int64_t out, const mp_model_param *w,
                              const mp_model_param *b)
{
    ref_operand qx = ref_q(c, false, x, B, in, 0), qz = ref_q(c, true, dz, B, out, 0);
    ref_operand qxt = {test_transpose_copy(qx.v, B, in), qx.inv};
    check_gemm(what, &qxt, &qz, NULL, in, out, B, out, 1, w->grad, MP_F32);
    for (int64_t j = 0; j < out; j++) {
        double s = 0, mag = 0;
        for (int r = 0; r < B; r++) s += dz[r * out + j], mag += fabs(dz[r * out + j]);
        if (!(fabs(b->grad[j] - s) <= test_gamma(B) * mag)) fail_msg("%s: bias gradient", what);
    }
    free(qx.v), free(qz.v), free(qxt.v);
}

/* ------------------------------------------ one position, against float64 */

/* n 2^shift, |n| <= 7 uniform, one element at +-7 2^shift and, with an
 * outlier, one at +-7 2^(shift + 6) (the amax): quantized per tensor the
 * rest stays exact; in MX blocks, the outlier's block loses its small
 * values (below the element format's range), so the blocks' direction
 * shows. */
static void small_ints(float *x, size_t n, uint64_t seed, int shift, bool outlier)
{
    test_rng r = {seed};
    for (size_t i = 0; i < n; i++) x[i] = ldexpf((float)((int)(test_rng_u32(&r) % 15) - 7), shift);
    x[seed % n] = ldexpf(seed % 2 ? -7.0f : 7.0f, shift);
    if (outlier) x[(seed * 7 + 3) % n] = ldexpf(seed % 3 ? 7.0f : -7.0f, shift + 6);
}

/* Input [1, E] -> Activation (linear, bfloat16: the attention's input is
 * kept by its producer and takes a gradient) -> MultiHeadAttention(H, D)
 * quantized as c says, under mixed_bfloat16. */
static mp_model *one_position(const qcase *c, mp_node *pre, mp_node *att)
{
    mp_model *m = mp_model_new_with_policy(3, "mixed_bfloat16");
    mp_node x = mp_input(m, 2, (int64_t[]){1, E}, NULL);
    *pre = mp_activation_layer(m, x, MP_ACT_NONE, NULL);
    mp_layer_options o = {.name = "att"};
    if (c->mx) {
        o.mx = 1;
        o.mx_params = &c->mxp;
    } else {
        o.float8 = 1;
        o.float8_params = &c->fp8;
    }
    mp_multi_head_attention_options a = mp_multi_head_attention_options_default(H, D);
    *att = mp_multi_head_attention(m, *pre, &a, &o);
    assert_int_equal(mp_model_build(m, *att, B), MP_OK);
    assert_true(c->mx ? mp_model_layer_mx(m, (int)*att, NULL)
                      : mp_model_layer_float8(m, (int)*att));
    /* query, key, value, output: kernel then bias */
    for (int i = 0; i < 8; i++) {
        mp_model_param *p = mp_model_get_param(m, i);
        small_ints(p->master, (size_t)p->n, 50 + (uint64_t)i, i % 2 ? -6 : -9, i == 4 || i == 6);
    }
    mp_model_mark_masters_changed(m);
    return m;
}

static void expect_amax(const mp_model *m, const char *name, float want)
{
    for (int i = 0; i < mp_model_float8_num_tensors(m); i++) {
        mp_float8_tensor_info t;
        assert_int_equal(mp_model_float8_tensor(m, i, &t), MP_OK);
        if (strcmp(t.name, name)) continue;
        assert_true(t.has_pending);
        if (t.pending_amax != want)
            fail_msg("%s: amax %g, expected %g", name, (double)t.pending_amax, (double)want);
        return;
    }
    fail_msg("no float8 tensor '%s'", name);
}

static float amax_of(const float *x, size_t n)
{
    float a = 0;
    for (size_t i = 0; i < n; i++) a = fabsf(x[i]) > a ? fabsf(x[i]) : a;
    return a;
}

static void run_case(const qcase *c)
{
    mp_node pre, att;
    mp_model *m = one_position(c, &pre, &att);
    float x[B * E], dy[B * E];
    small_ints(x, B * E, 7, -9, true);
    small_ints(dy, B * E, 8, -10, false);
    mp_tensor tx, tdy;
    mp_tensor_wrap(&tx, MP_F32, 3, (int64_t[]){B, 1, E}, x);
    mp_tensor_wrap(&tdy, MP_F32, 3, (int64_t[]){B, 1, E}, dy);
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(m, &tx, true, &y), MP_OK);
    assert_int_equal(y->dtype, MP_BF16);
    assert_int_equal(mp_model_backward(m, &tdy, false), MP_OK);
    const mp_model_param *wv = mp_model_get_param(m, 4), *bv = mp_model_get_param(m, 5),
                         *wo = mp_model_get_param(m, 6), *bo = mp_model_get_param(m, 7);
    /* V = q(x) q(Wv) + bv, exact before its bfloat16 rounding (a power of
     * two times short integers); attention returns it */
    float v[B * HD], da[B * HD];
    ref_operand qx1 = ref_q(c, false, x, B, E, 1), qwv0 = ref_q(c, false, wv->master, E, HD, 0);
    for (int r = 0; r < B; r++)
        for (int j = 0; j < HD; j++) {
            double s = 0;
            for (int k = 0; k < E; k++) s += (double)qx1.v[r * E + k] * qwv0.v[k * HD + j];
            v[r * HD + j] = bf16r(s * qx1.inv * qwv0.inv + bv->master[j]);
        }
    /* forward output: y = q(V) q(Wo) + bo */
    ref_operand qa = ref_q(c, false, v, B, HD, 1), qwo = ref_q(c, false, wo->master, HD, E, 0);
    char what[96];
    snprintf(what, sizeof what, "%s: output", c->label);
    check_gemm(what, &qa, &qwo, bo->master, B, E, HD, E, 1, y->data, MP_BF16);
    snprintf(what, sizeof what, "%s: output projection", c->label);
    check_param_grads(c, what, v, HD, dy, E, wo, bo);
    /* dA = q(dY) q(Wo)^T (along the units), exact before its rounding;
     * dV = dA */
    ref_operand qg1 = ref_q(c, true, dy, B, E, 1), qwo1 = ref_q(c, false, wo->master, HD, E, 1);
    for (int r = 0; r < B; r++)
        for (int k = 0; k < HD; k++) {
            double s = 0;
            for (int j = 0; j < E; j++) s += (double)qg1.v[r * E + j] * qwo1.v[k * E + j];
            da[r * HD + k] = bf16r(s * qg1.inv * qwo1.inv);
        }
    snprintf(what, sizeof what, "%s: value projection", c->label);
    check_param_grads(c, what, x, E, da, HD, wv, bv);
    /* dx = q(dV) q(Wv)^T (along the projection's columns), in bfloat16 */
    ref_operand qd1 = ref_q(c, true, da, B, HD, 1), qwv1 = ref_q(c, false, wv->master, E, HD, 1);
    const mp_tensor *dx = mp_model_node_grad(m, pre);
    assert_non_null(dx);
    snprintf(what, sizeof what, "%s: input gradient", c->label);
    check_gemm(what, &qd1, &qwv1, NULL, B, E, HD, 1, HD, dx->data, dx->dtype);
    /* query and key: no gradient reaches them (dS = 0) */
    for (int i = 0; i < 4; i++) {
        const mp_model_param *p = mp_model_get_param(m, i);
        for (int64_t j = 0; j < p->n; j++) assert_true(p->grad[j] == 0.0f);
    }
    if (!c->mx) { /* each projection's tensors under their names */
        float aw[4];
        for (int p = 0; p < 4; p++)
            aw[p] = amax_of(mp_model_get_param(m, 2 * p)->master, (size_t)(E * HD));
        static const char *const proj[] = {"query", "key", "value", "attention_output"};
        char name[64];
        for (int p = 0; p < 4; p++) {
            snprintf(name, sizeof name, "att/%s/input", proj[p]);
            expect_amax(m, name, p < 3 ? amax_of(x, B * E) : amax_of(v, B * HD));
            snprintf(name, sizeof name, "att/%s/kernel", proj[p]);
            expect_amax(m, name, aw[p]);
            snprintf(name, sizeof name, "att/%s/grad_output", proj[p]);
            expect_amax(m, name, p < 2 ? 0.0f : p == 2 ? amax_of(da, B * HD) : amax_of(dy, B * E));
        }
        assert_int_equal(mp_model_float8_num_tensors(m), 12);
    }
    free(qa.v), free(qwo.v), free(qd1.v), free(qwv1.v), free(qx1.v), free(qwv0.v), free(qg1.v);
    free(qwo1.v);
    mp_model_free(m);
}

static void test_against_reference(void **state)
{
    (void)state;
    qcase cases[6];
    memset(cases, 0, sizeof cases);
    for (int i = 0; i < 3; i++) {
        cases[i].fp8 = mp_float8_params_default();
        cases[i].fp8.scaling = i == 2 ? MP_FLOAT8_DELAYED : MP_FLOAT8_CURRENT;
    }
    cases[0].label = "float8 hybrid current";
    cases[1].label = "float8 e4m3 current";
    cases[1].fp8.format = MP_FLOAT8_E4M3;
    cases[2].label = "float8 hybrid delayed (first step: scale 1)";
    cases[3] = (qcase){"mxfp8", true, {0}, {MP_MXFP8_E4M3, MP_MXFP8_E5M2}};
    cases[4] = (qcase){"mxfp6 e2m3", true, {0}, {MP_MXFP6_E2M3, MP_MXFP8_E5M2}};
    cases[5] = (qcase){"mxfp8, gradients mxfp6 e2m3", true, {0}, {MP_MXFP8_E4M3, MP_MXFP6_E2M3}};
    for (int i = 0; i < 6; i++) run_case(&cases[i]);
}

/* ---------------------------------------------- in a model: plan, resume */

enum { SEQ = 6, VOCAB = 11, WIDTH = 16, TB = 8 };

/* Input(int32) -> Embedding -> LayerNormalization -> MultiHeadAttention
 * (float8 on) -> Add -> Flatten -> Dense(3) -> softmax, under
 * mixed_float8 with an amax history of 4 (the Dense, first and last,
 * stays bfloat16). */
static mp_model *token_model(bool compile)
{
    mp_float8_params p = mp_float8_params_default();
    p.amax_history_len = 4;
    mp_model *m = mp_model_new_with_policy(17, "mixed_float8");
    mp_node t = mp_input_ex(m, 1, (int64_t[]){SEQ}, MP_I32, NULL);
    mp_node e = mp_embedding(m, t, VOCAB, WIDTH, NULL);
    mp_node n = mp_layer_norm(m, e, 1e-5f, NULL);
    mp_multi_head_attention_options a = mp_multi_head_attention_options_default(2, 8);
    mp_node x = mp_multi_head_attention(
        m, n, &a, &(mp_layer_options){.name = "att", .float8 = 1, .float8_params = &p});
    x = mp_add(m, e, x, NULL);
    x = mp_flatten(m, x, NULL);
    x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    assert_int_equal(mp_model_build(m, x, TB), MP_OK);
    if (compile) assert_int_equal(mp_model_compile(m, NULL), MP_OK);
    return m;
}

static void train(mp_model *m, int from, int to)
{
    int32_t ids[TB * SEQ], labels[TB];
    mp_tensor x;
    mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){TB, SEQ}, ids);
    for (int s = from; s < to; s++) {
        test_rng r = {900 + (uint64_t)s};
        for (int i = 0; i < TB * SEQ; i++) ids[i] = (int32_t)(test_rng_u32(&r) % VOCAB);
        for (int i = 0; i < TB; i++) labels[i] = ids[i * SEQ + SEQ - 1] % 3;
        mp_step_result res;
        assert_int_equal(mp_model_train_step(m, &x, labels, NULL, &res), MP_OK);
        assert_true(res.applied && isfinite(res.loss));
    }
}

/* The plan shows the attention in float8 with its projections named; the
 * LayerNormalization before it keeps its output (the attention reads it
 * again in backward: it keeps no codes of its own). */
static void test_plan(void **state)
{
    (void)state;
    mp_model *m = token_model(false);
    assert_true(mp_model_layer_float8(m, 3));
    assert_false(mp_model_layer_float8(m, 6)); /* the Dense: first and last */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(mp_model_summary(m, TB, f), MP_OK);
    fclose(f);
    const char *row = strstr(buf, "att (MultiHeadAttention)");
    assert_non_null(row);
    const char *eol = strchr(row, '\n');
    assert_non_null(strstr(row, "e4m3+e5m2"));
    assert_true(strstr(row, "e4m3+e5m2") < eol);
    assert_non_null(strstr(eol, "query, key, value, attention_output"));
    free(buf);
    static const char *const want[] = {"att/query/input", "att/key/kernel",
                                       "att/attention_output/grad_output"};
    for (int w = 0; w < 3; w++) {
        bool found = false;
        for (int i = 0; i < mp_model_float8_num_tensors(m); i++) {
            mp_float8_tensor_info t;
            mp_model_float8_tensor(m, i, &t);
            found |= !strcmp(t.name, want[w]);
        }
        assert_true(found);
    }
    mp_layer_info li;
    assert_int_equal(mp_model_layer_info(m, 2, TB, &li), MP_OK);
    assert_true(li.saved_bytes >= (size_t)(TB * SEQ * WIDTH * 2)); /* its bfloat16 output */
    mp_model_free(m);
}

/* 6 steps straight = 3 steps, checkpoint, rebuild from the file, 3 more:
 * parameters and every projection's amax history and scale, bit for bit. */
static void test_resume_bit_exact(void **state)
{
    (void)state;
    char dir[64], path[128];
    assert_int_equal(test_scratch_dir(dir, sizeof dir, "mp_attq"), 0);
    snprintf(path, sizeof path, "%s/ck.safetensors", dir);
    mp_model *straight = token_model(true), *first = token_model(true), *resumed;
    train(straight, 0, 6);
    train(first, 0, 3);
    assert_int_equal(mp_model_save_checkpoint(first, path, NULL), MP_OK);
    assert_int_equal(mp_model_from_checkpoint(path, TB, &resumed, NULL), MP_OK);
    train(resumed, 3, 6);
    assert_int_equal(mp_model_num_params(resumed), mp_model_num_params(straight));
    for (int i = 0; i < mp_model_num_params(straight); i++) {
        const mp_model_param *a = mp_model_get_param(straight, i),
                             *b = mp_model_get_param(resumed, i);
        assert_memory_equal(a->master, b->master, (size_t)a->n * sizeof(float));
    }
    assert_int_equal(mp_model_float8_num_tensors(resumed), 12);
    for (int i = 0; i < 12; i++) {
        mp_float8_tensor_info a, b;
        mp_model_float8_tensor(straight, i, &a);
        mp_model_float8_tensor(resumed, i, &b);
        assert_string_equal(a.name, b.name);
        assert_memory_equal(&a.scale, &b.scale, sizeof a.scale);
        assert_memory_equal(a.history, b.history, 4 * sizeof(float));
        if (!strcmp(a.name, "att/value/kernel")) assert_true(a.history[3] > 0); /* 4 steps in */
    }
    mp_model_free(straight), mp_model_free(first), mp_model_free(resumed);
    test_remove_tree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_reference),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_resume_bit_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
