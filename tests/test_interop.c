/* test_interop.c - safetensors files exchanged with an independent reader and
 * writer (tests/interop/st_numpy.py: json, struct and numpy under Debian's
 * /usr/bin/python3, no mixprec code): tensors of all five dtypes written here
 * and checked there, a trained model's checkpoint and predictions checked
 * there by a float64 forward pass, and a file written there loaded here bit
 * for bit and as model weights. Without /usr/bin/python3 and numpy the tests
 * FAIL (apt-get install python3-numpy), never skip.
 *
 * Agreed formula, version 1 (the same text heads st_numpy.py); element i
 * counts row-major:
 *   f32          F32 [4, 6]  (i - 7) * 0.375
 *   f32_special  F32 [9]     -0, 2^-149, -2^-149, 2^-126, FLT_MAX, -FLT_MAX, +inf, -inf, NaN
 *   f16, bf16, e4m3, e5m2    (F16, BF16, F8_E4M3, F8_E5M2), 1-D: (i - 7) * 0.25 for
 *                i < 16, then -0, s, -s, 3s, n, -1.5n, M, -M, +inf, -inf (only
 *                formats with inf), NaN; s = smallest subnormal, n = smallest
 *                normal, M = largest finite: F16 2^-24 2^-14 65504; BF16 2^-133
 *                2^-126 (2 - 2^-7) 2^127; E4M3 2^-9 2^-6 448; E5M2 2^-16 2^-14 57344.
 *                All exactly representable.
 *   h(i) = (i * 2654435761) mod 2^32
 *   rne_src      F32 [4096]  bits (h & 0xFFFF0000) | (h & 0xFFFF, 0x8000, 0x7FFF, 0x8001)[i % 4]
 *   rne_bf16     BF16 [4096] rne_src rounded to nearest even (NaN stays NaN, same sign)
 *   rne_f16_src  F32 [4096]  sign: bit 31 of h; biased exponent 103 + (h >> 24) % 41
 *                (2^-24 .. 2^16: float16 subnormals to overflow); fraction
 *                (h & 0x7FE000) | (h & 0x1FFF, 0x1000, 0x0FFF, 0x1001)[i % 4]
 *   rne_f16      F16 [4096]  rne_f16_src rounded to nearest even (overflow: inf)
 *   C -> Python only (mixprec's decoders against the script's):
 *   e4m3_codes, e5m2_codes  [256] code i; f16_codes, bf16_codes [65536] code i;
 *   <x>_decoded  F32, the codes decoded by mixprec (NaN compared as NaN with its sign)
 *   metadata     interop.formula = "1", interop.text = "gr\u00fc\u00dfe \"quoted\" \\ back"
 *   Python -> C only: dense.kernel F32 [4, 3] (3r + c - 5) * 0.125,
 *                dense.bias F32 [3] (c - 1) * 0.5 (a Dense 4 -> 3 named "dense")
 * The checkpoint test trains exactly TRAIN_STEPS Adam steps (the script checks
 * the step counts in mixprec.training). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

#ifndef PYTHON
#define PYTHON "/usr/bin/python3" /* Debian's, with python3-numpy */
#endif
#define SCRIPT "tests/interop/st_numpy.py"
#define TRAIN_STEPS 6
#define TEXT                                                                                       \
    "gr\xc3\xbc\xc3\x9f"                                                                           \
    "e \"quoted\" \\ back" /* UTF-8 of the agreed text */

static char dir[64];

static int setup(void **state)
{
    (void)state;
    return test_scratch_dir(dir, sizeof dir, "mp_interop");
}

static int teardown(void **state)
{
    (void)state;
    return test_remove_tree(dir);
}

static const char *path_of(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s", dir, name);
    return buf;
}

/* The interpreter, numpy and the script must be there: a missing one is a
 * failure (CI installs python3-numpy), with the line that installs it. */
static void require_python(void)
{
    static int state = -1; /* 0 ready, 1 no interpreter, 2 no numpy */
    if (state < 0) {
        state = 0;
        if (access(PYTHON, X_OK) != 0)
            state = 1;
        else if (system(PYTHON " -I -c 'import numpy' >/dev/null 2>&1") != 0)
            state = 2;
    }
    if (state)
        fail_msg("%s %s: the interop tests need Debian's python3 with numpy; install it "
                 "with `apt-get install python3-numpy` (as root)",
                 PYTHON, state == 1 ? "is missing" : "cannot import numpy");
    if (access(SCRIPT, R_OK) != 0)
        fail_msg("%s not found: run the test from the repository root", SCRIPT);
}

/* Runs the script (its output goes to ours) and returns its exit status. */
static int run_script(const char *args)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, PYTHON " -I " SCRIPT " %s", args);
    fflush(stdout);
    fflush(stderr);
    int rc = system(cmd);
    if (rc == -1) fail_msg("system(\"%s\") could not run", cmd);
    if (!WIFEXITED(rc)) fail_msg("'%s' did not exit normally (status %d)", cmd, rc);
    return WEXITSTATUS(rc);
}

/* ------------------------------------------------------------ the formula */

static uint32_t h(uint32_t i) { return i * 2654435761u; }

static float rne_src(uint32_t i)
{
    uint32_t x = h(i), low[4] = {x & 0xFFFF, 0x8000, 0x7FFF, 0x8001};
    return bits_f32((x & 0xFFFF0000u) | low[i % 4]);
}

static float rne_f16_src(uint32_t i)
{
    uint32_t x = h(i), low[4] = {x & 0x1FFF, 0x1000, 0x0FFF, 0x1001};
    return bits_f32((x & 0x80000000u) | ((103 + (x >> 24) % 41) << 23) | (x & 0x7FE000u) |
                    low[i % 4]);
}

/* The narrow formats' values (at most 27); returns the count. */
static int narrow_values(mp_dtype t, float *v)
{
    static const struct {
        float s, n, max;
        bool inf;
    } fmt[MP_DTYPE_COUNT] = {
        [MP_F16] = {0x1p-24f, 0x1p-14f, 65504.0f, true},
        [MP_BF16] = {0x1p-133f, 0x1p-126f, 0x1.FEp127f, true},
        [MP_F8E4M3] = {0x1p-9f, 0x1p-6f, 448.0f, false},
        [MP_F8E5M2] = {0x1p-16f, 0x1p-14f, 57344.0f, true},
    };
    /* the constants agree with mixprec's own facts of the format */
    mp_dtype_info info;
    mp_dtype_get_info(t, &info);
    assert_true(info.min_subnormal == fmt[t].s && info.min_normal == fmt[t].n &&
                info.max == fmt[t].max && info.has_inf == fmt[t].inf);
    int n = 0;
    for (int i = 0; i < 16; i++) v[n++] = (float)(i - 7) * 0.25f;
    float s = fmt[t].s, nn = fmt[t].n, mx = fmt[t].max;
    float special[8] = {-0.0f, s, -s, 3 * s, nn, -1.5f * nn, mx, -mx};
    for (int i = 0; i < 8; i++) v[n++] = special[i];
    if (fmt[t].inf) v[n++] = INFINITY, v[n++] = -INFINITY;
    v[n++] = NAN;
    return n;
}

/* ----------------------------------------------------- C -> Python: formula */

static void test_formula_to_python(void **state)
{
    (void)state;
    require_python();
    float f32[24], special[9] = {-0.0f,    0x1p-149f, -0x1p-149f, 0x1p-126f, FLT_MAX,
                                 -FLT_MAX, INFINITY,  -INFINITY,  NAN};
    for (int i = 0; i < 24; i++) f32[i] = (float)(i - 7) * 0.375f;
    /* the narrow formats from exactly representable float32 values */
    static const mp_dtype narrow[4] = {MP_F16, MP_BF16, MP_F8E4M3, MP_F8E5M2};
    static const char *const narrow_name[4] = {"f16", "bf16", "e4m3", "e5m2"};
    float nv[4][32];
    uint8_t nbuf[4][32 * 2];
    int nn[4];
    for (int k = 0; k < 4; k++) {
        nn[k] = narrow_values(narrow[k], nv[k]);
        mp_convert(nbuf[k], narrow[k], nv[k], MP_F32, (size_t)nn[k]);
    }
    /* rounding */
    static float rsrc[4096], rf16src[4096];
    static uint16_t rbf16[4096], rf16[4096];
    for (uint32_t i = 0; i < 4096; i++) rsrc[i] = rne_src(i), rf16src[i] = rne_f16_src(i);
    mp_convert(rbf16, MP_BF16, rsrc, MP_F32, 4096);
    mp_convert(rf16, MP_F16, rf16src, MP_F32, 4096);
    /* every code of every narrow format, and mixprec's decoding of it */
    static uint8_t c8[2][256];
    static uint16_t c16[2][65536];
    static float d8[2][256], d16[2][65536];
    for (int i = 0; i < 65536; i++) c16[0][i] = c16[1][i] = (uint16_t)i;
    for (int i = 0; i < 256; i++) c8[0][i] = c8[1][i] = (uint8_t)i;
    mp_convert(d8[0], MP_F32, c8[0], MP_F8E4M3, 256);
    mp_convert(d8[1], MP_F32, c8[1], MP_F8E5M2, 256);
    mp_convert(d16[0], MP_F32, c16[0], MP_F16, 65536);
    mp_convert(d16[1], MP_F32, c16[1], MP_BF16, 65536);

    mp_named_tensor t[20] = {
        {"f32", MP_F32, 2, {4, 6}, f32},
        {"f32_special", MP_F32, 1, {9}, special},
        {"rne_src", MP_F32, 1, {4096}, rsrc},
        {"rne_bf16", MP_BF16, 1, {4096}, rbf16},
        {"rne_f16_src", MP_F32, 1, {4096}, rf16src},
        {"rne_f16", MP_F16, 1, {4096}, rf16},
        {"e4m3_codes", MP_F8E4M3, 1, {256}, c8[0]},
        {"e4m3_decoded", MP_F32, 1, {256}, d8[0]},
        {"e5m2_codes", MP_F8E5M2, 1, {256}, c8[1]},
        {"e5m2_decoded", MP_F32, 1, {256}, d8[1]},
        {"f16_codes", MP_F16, 1, {65536}, c16[0]},
        {"f16_decoded", MP_F32, 1, {65536}, d16[0]},
        {"bf16_codes", MP_BF16, 1, {65536}, c16[1]},
        {"bf16_decoded", MP_F32, 1, {65536}, d16[1]},
    };
    int n = 14;
    for (int k = 0; k < 4; k++)
        t[n++] = (mp_named_tensor){narrow_name[k], narrow[k], 1, {nn[k]}, nbuf[k]};
    const char *keys[] = {"interop.formula", "interop.text"}, *vals[] = {"1", TEXT};
    char p[128], args[160];
    path_of("formula.safetensors", p, sizeof p);
    assert_int_equal(mp_safetensors_write(p, t, n, keys, vals, 2), MP_OK);
    snprintf(args, sizeof args, "check %s", p);
    int rc = run_script(args);
    if (rc) fail_msg("st_numpy.py check %s: exit status %d (see its message above)", p, rc);
}

/* --------------------------------------------- C -> Python: a trained model */

static mp_model *small_model(uint64_t seed, int64_t batch)
{
    mp_set_global_policy("float32");
    mp_model *m = mp_model_new(seed);
    mp_node x = mp_input(m, 1, (int64_t[]){4}, NULL);
    x = mp_dense(m, x, 5, MP_ACT_RELU, NULL);
    x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    assert_int_equal(mp_model_build(m, x, batch), MP_OK);
    return m;
}

static void test_checkpoint_to_python(void **state)
{
    (void)state;
    require_python();
    mp_model *m = small_model(5, 16);
    mp_compile_options co = mp_compile_options_default(); /* Adam, sparse CCE */
    co.optimizer.learning_rate = 0.05f; /* large steps: weights far from their init */
    assert_int_equal(mp_model_compile(m, &co), MP_OK);
    /* 32 samples of 3 classes: class c shifts feature c by 1.5 */
    float x[32 * 4];
    int32_t y[32];
    test_rng r = {17};
    for (int i = 0; i < 32; i++) {
        y[i] = i % 3;
        for (int k = 0; k < 4; k++)
            x[i * 4 + k] = (float)((k == y[i] ? 1.5 : 0.0) + test_rng_uniform(&r, -1, 1));
    }
    for (int s = 0; s < TRAIN_STEPS; s++) {
        mp_tensor xt;
        int off = (s % 2) * 16;
        assert_int_equal(mp_tensor_wrap(&xt, MP_F32, 2, (int64_t[]){16, 4}, x + off * 4), MP_OK);
        mp_step_result res;
        assert_int_equal(mp_model_train_step(m, &xt, y + off, NULL, &res), MP_OK);
        assert_true(res.applied && isfinite(res.loss));
    }
    char ckpt[128], pred[128], args[300];
    path_of("model.safetensors", ckpt, sizeof ckpt);
    path_of("predictions.safetensors", pred, sizeof pred);
    assert_int_equal(mp_model_save_checkpoint(m, ckpt, NULL), MP_OK);
    /* predictions on other inputs, some far out (large logits) */
    enum { N = 20 };
    float in[N * 4], out[N * 3];
    for (int i = 0; i < N * 4; i++)
        in[i] = (float)test_rng_uniform(&r, i < 40 ? -2 : -8, i < 40 ? 2 : 8);
    assert_int_equal(mp_model_predict(m, in, N, 16, out), MP_OK);
    mp_named_tensor t[2] = {{"inputs", MP_F32, 2, {N, 4}, in},
                            {"predictions", MP_F32, 2, {N, 3}, out}};
    assert_int_equal(mp_safetensors_write(pred, t, 2, NULL, NULL, 0), MP_OK);
    snprintf(args, sizeof args, "check %s %s", ckpt, pred);
    int rc = run_script(args);
    if (rc) fail_msg("st_numpy.py check %s %s: exit status %d (see above)", ckpt, pred, rc);
    /* the file alone rebuilds the model, which predicts the same bits */
    mp_model *back;
    mp_fit_state fit;
    assert_int_equal(mp_model_from_checkpoint(ckpt, 16, &back, &fit), MP_OK);
    float out2[N * 3];
    assert_int_equal(mp_model_predict(back, in, N, 16, out2), MP_OK);
    assert_memory_equal(out, out2, sizeof out);
    mp_fit_state_free(&fit);
    mp_model_free(back);
    mp_model_free(m);
}

/* ----------------------------------------------------------- Python -> C */

/* The tensor `name` with this dtype and shape (n1 == 0: 1-D), copied out
 * (the file's data need not be aligned). */
static void get_tensor(const mp_safetensors *f, const char *name, mp_dtype dt, int64_t n0,
                       int64_t n1, void *dst)
{
    const mp_named_tensor *t = mp_safetensors_find(f, name);
    if (!t) fail_msg("the Python file has no tensor '%s'", name);
    int nd = n1 ? 2 : 1;
    if (t->dtype != dt || t->ndim != nd || t->shape[0] != n0 || (nd == 2 && t->shape[1] != n1))
        fail_msg("'%s': %s with %d dims [%lld, ...], expected %s [%lld, %lld]", name,
                 mp_dtype_name(t->dtype), t->ndim, (long long)t->shape[0], mp_dtype_name(dt),
                 (long long)n0, (long long)n1);
    memcpy(dst, t->data, (size_t)(n0 * (n1 ? n1 : 1)) * mp_dtype_size(dt));
}

/* 16-bit codes: equal bits, except that where the expected value is a NaN
 * the file's must be a NaN of the same sign. */
static void same_codes16(const char *name, mp_dtype dt, const uint16_t *got, const uint16_t *want,
                         int n)
{
    for (int i = 0; i < n; i++) {
        float g, w;
        mp_convert(&g, MP_F32, &got[i], dt, 1);
        mp_convert(&w, MP_F32, &want[i], dt, 1);
        bool ok = isnan(w) ? isnan(g) && signbit(g) == signbit(w) : got[i] == want[i];
        if (!ok) fail_msg("%s[%d]: 0x%04x, expected 0x%04x", name, i, got[i], want[i]);
    }
}

static void same_f32(const char *name, const float *got, const float *want, int n)
{
    for (int i = 0; i < n; i++) {
        bool ok = isnan(want[i]) ? isnan(got[i]) : f32_bits(got[i]) == f32_bits(want[i]);
        if (!ok)
            fail_msg("%s[%d]: %a (0x%08x), expected %a (0x%08x)", name, i, (double)got[i],
                     f32_bits(got[i]), (double)want[i], f32_bits(want[i]));
    }
}

static void test_python_to_c(void **state)
{
    (void)state;
    require_python();
    char p[128], args[160];
    path_of("from_python.safetensors", p, sizeof p);
    snprintf(args, sizeof args, "write %s", p);
    int rc = run_script(args);
    if (rc) fail_msg("st_numpy.py write %s: exit status %d (see above)", p, rc);
    mp_safetensors *f;
    if (mp_safetensors_read(p, &f)) fail_msg("reading the Python file: %s", mp_last_error());
    assert_int_equal(mp_safetensors_count(f), 8);
    assert_string_equal(mp_safetensors_metadata(f, "format"), "pt");
    assert_string_equal(mp_safetensors_metadata(f, "interop.formula"), "1");
    assert_string_equal(mp_safetensors_metadata(f, "interop.text"), TEXT);

    float got[4096], want[4096];
    get_tensor(f, "f32", MP_F32, 4, 6, got);
    for (int i = 0; i < 24; i++) want[i] = (float)(i - 7) * 0.375f;
    same_f32("f32", got, want, 24);
    float special[9] = {-0.0f,    0x1p-149f, -0x1p-149f, 0x1p-126f, FLT_MAX,
                        -FLT_MAX, INFINITY,  -INFINITY,  NAN};
    get_tensor(f, "f32_special", MP_F32, 9, 0, got);
    same_f32("f32_special", got, special, 9);

    /* float16 and bfloat16: the formula's values encoded by mixprec */
    uint16_t g16[4096], w16[4096];
    const mp_dtype dts[2] = {MP_F16, MP_BF16};
    const char *const names[2] = {"f16", "bf16"};
    for (int k = 0; k < 2; k++) {
        int n = narrow_values(dts[k], want);
        get_tensor(f, names[k], dts[k], n, 0, g16);
        mp_convert(w16, dts[k], want, MP_F32, (size_t)n);
        same_codes16(names[k], dts[k], g16, w16, n);
    }
    /* numpy's round-to-nearest-even against mixprec's */
    for (uint32_t i = 0; i < 4096; i++) want[i] = rne_src(i);
    get_tensor(f, "rne_bf16", MP_BF16, 4096, 0, g16);
    mp_convert(w16, MP_BF16, want, MP_F32, 4096);
    same_codes16("rne_bf16", MP_BF16, g16, w16, 4096);
    for (uint32_t i = 0; i < 4096; i++) want[i] = rne_f16_src(i);
    get_tensor(f, "rne_f16", MP_F16, 4096, 0, g16);
    mp_convert(w16, MP_F16, want, MP_F32, 4096);
    same_codes16("rne_f16", MP_F16, g16, w16, 4096);

    /* the weights of a Dense 4 -> 3 named "dense" */
    float kernel[12], bias[3];
    get_tensor(f, "dense.kernel", MP_F32, 4, 3, got);
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 3; c++) kernel[r * 3 + c] = (float)(3 * r + c - 5) * 0.125f;
    same_f32("dense.kernel", got, kernel, 12);
    get_tensor(f, "dense.bias", MP_F32, 3, 0, got);
    for (int c = 0; c < 3; c++) bias[c] = (float)(c - 1) * 0.5f;
    same_f32("dense.bias", got, bias, 3);
    mp_safetensors_free(f);

    /* ... loaded into a matching model, which then predicts exactly: inputs
     * are multiples of 1/4 in [-1, 1], weights multiples of 1/8 below 1, so
     * every product, partial sum and result is a multiple of 2^-5 below 2^4,
     * exact in float32 whatever the summation order */
    mp_set_global_policy("float32");
    mp_model *m = mp_model_new(1);
    mp_node x = mp_input(m, 1, (int64_t[]){4}, NULL);
    x = mp_dense(m, x, 3, MP_ACT_NONE, &(mp_layer_options){.name = "dense"});
    assert_int_equal(mp_model_build(m, x, 8), MP_OK);
    if (mp_model_load_weights(m, p)) fail_msg("loading the Python weights: %s", mp_last_error());
    same_f32("loaded kernel", mp_model_get_param(m, 0)->master, kernel, 12);
    same_f32("loaded bias", mp_model_get_param(m, 1)->master, bias, 3);
    float in[8 * 4], out[8 * 3];
    for (int i = 0; i < 8 * 4; i++) in[i] = (float)(i % 9 - 4) * 0.25f;
    assert_int_equal(mp_model_predict(m, in, 8, 8, out), MP_OK);
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 3; c++) {
            double z = bias[c];
            for (int k = 0; k < 4; k++) z += (double)in[r * 4 + k] * kernel[k * 3 + c];
            if ((double)out[r * 3 + c] != z)
                fail_msg("prediction [%d][%d]: %.9g, float64 %.17g", r, c, (double)out[r * 3 + c],
                         z);
        }
    mp_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formula_to_python),
        cmocka_unit_test(test_checkpoint_to_python),
        cmocka_unit_test(test_python_to_c),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
