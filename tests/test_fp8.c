/* test_fp8.c - the per-tensor float8 recipe (mixprec/fp8.h): the scale
 * rule and scripted amax sequences against scales computed here for both
 * algorithms and margins (zero and non-finite amaxes included); the Dense
 * GEMMs in float8 against an independent float64 emulation (the library's
 * scalar fp8 casts, tested exhaustively elsewhere, then float64 sums) in
 * forward and backward; the quantizer hook with a per-pass quantizer. In a
 * model (policy, plan, steps, resume, errors): test_fp8_model.c. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "core/internal.h"
#include "nn/model_internal.h"
#include "nn/quant.h"

#define U32 0x1p-24 /* float32 unit roundoff */
#define UBF 0x1p-8  /* bfloat16 unit roundoff (7 fraction bits) */

static float bf16(float x) { return mp_bf16_to_f32(mp_f32_to_bf16(x)); }

static double fmax_of(mp_dtype t) { return t == MP_F8E4M3 ? 448.0 : 57344.0; }

/* The scale rule, computed in double (a float32 quotient computed in double
 * and rounded once is the correctly rounded float32 quotient). */
static float ref_scale(float amax, float prev, mp_dtype t, int margin)
{
    if (!(amax > 0) || !isfinite(amax)) return prev;
    double s = (double)(float)(fmax_of(t) / (double)amax) / ldexp(1.0, margin);
    if (s > FLT_MAX) return FLT_MAX;
    if (s < FLT_MIN) return FLT_MIN;
    return (float)s;
}

/* x quantized with scale s and decoded (the library's scalar casts) */
static double q8(float x, float s, mp_dtype t)
{
    float p = x * s;
    return t == MP_F8E4M3 ? mp_e4m3_to_f32(mp_f32_to_e4m3(p)) : mp_e5m2_to_f32(mp_f32_to_e5m2(p));
}

static float ref_amax(const float *x, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

/* gamma_k = k u / (1 - k u): the float32 summation bound over k terms */
static double gamma_k(int64_t k) { return (double)k * U32 / (1 - (double)k * U32); }

/* ------------------------------------------------------- scale rule */

static void test_scale_rule(void **state)
{
    (void)state;
    const float amaxes[] = {1.0f, 0.3f, 448.0f, 1e-3f, 3.7e4f, 1e-30f, 7.0f};
    for (int m = 0; m <= 3; m++)
        for (size_t i = 0; i < sizeof amaxes / sizeof *amaxes; i++)
            for (int f = 0; f < 2; f++) {
                mp_dtype t = f ? MP_F8E5M2 : MP_F8E4M3;
                float got = mp_float8_scale(amaxes[i], 2.5f, t, m);
                assert_int_equal(f32_bits(got), f32_bits(ref_scale(amaxes[i], 2.5f, t, m)));
            }
    /* 0 and non-finite keep the previous scale; extremes clamp */
    assert_true(mp_float8_scale(0.0f, 3.0f, MP_F8E4M3, 0) == 3.0f);
    assert_true(mp_float8_scale(NAN, 3.0f, MP_F8E4M3, 0) == 3.0f);
    assert_true(mp_float8_scale(INFINITY, 3.0f, MP_F8E4M3, 0) == 3.0f);
    assert_true(mp_float8_scale(1e-45f, 1.0f, MP_F8E4M3, 0) == FLT_MAX);
    assert_true(mp_float8_scale(FLT_MAX, 1.0f, MP_F8E4M3, 64) == FLT_MIN);
    /* amax and the cast against the scalar definitions */
    float x[5000];
    test_fill(x, 5000, 11, -3, 3);
    x[4321] = -7.25f;
    assert_true(mp_float8_amax(x, MP_F32, 5000) == 7.25f);
    uint8_t c[5000];
    assert_true(mp_float8_quantize(c, MP_F8E5M2, x, MP_F32, 5000, 1234.5f) == 7.25f);
    for (int i = 0; i < 5000; i++) assert_int_equal(c[i], mp_f32_to_e5m2(x[i] * 1234.5f));
    x[17] = NAN;
    assert_true(isnan(mp_float8_amax(x, MP_F32, 5000)));
    x[17] = -INFINITY;
    assert_true(mp_float8_amax(x, MP_F32, 5000) == INFINITY);
}

/* ---------------------------------------- the scaled cast, every path */

/* One value through the recipe's cast by the library's scalar casts: the
 * code of v * scale (saturating), the sign carried in a zero code where
 * asked, and the code's value in bfloat16. */
static void ref_cast(float v, float scale, mp_dtype fp8, bool sign, uint8_t *code, uint16_t *dec)
{
    float y = v * scale, d;
    mp_convert_isa(MP_ISA_SCALAR, code, fp8, &y, MP_F32, 1, MP_OVERFLOW_SATURATE);
    if (sign && v > 0.0f && *code == 0x00) *code = 0x80;
    if (sign && !(v > 0.0f) && *code == 0x80) *code = 0x00;
    mp_convert_isa(MP_ISA_SCALAR, &d, MP_F32, code, fp8, 1, MP_OVERFLOW_SATURATE);
    mp_convert_isa(MP_ISA_SCALAR, dec, MP_BF16, &d, MP_F32, 1, MP_OVERFLOW_SATURATE);
}

/* Inputs that reach every branch of the cast: random bit patterns (NaNs,
 * infinities, subnormals, huge and tiny values), values spread over the
 * formats' range at the scale, and fixed cases (zeros of both signs, ties
 * between neighbouring codes, the saturation edge, values that round to
 * zero). */
static void cast_inputs(float *x, size_t n, float scale, uint64_t seed)
{
    const float fixed[] = {0.0f,      -0.0f,    INFINITY,  -INFINITY,   NAN,
                           -NAN,      1.0625f,  -1.0625f,  1.1875f,     448.0f,
                           464.0f,    -480.0f,  57344.0f,  61440.0f,    0x1p-10f,
                           -0x1p-10f, 0x1p-20f, -0x1p-20f, FLT_MIN / 4, 1e-30f};
    test_rng r = {seed};
    for (size_t i = 0; i < n; i++) {
        if (i % 3 == 0)
            x[i] = bits_f32(test_rng_u32(&r));
        else if (i % 3 == 1)
            x[i] = (float)test_rng_uniform(&r, -600.0, 600.0) / scale;
        else
            x[i] = fixed[(i / 3) % (sizeof fixed / sizeof *fixed)] / (i % 2 ? scale : 1.0f);
    }
}

/* Element i of the input as the cast sees it: x, or its bfloat16 xb
 * widened. */
static float widened(const float *x, const uint16_t *xb, bool bf, size_t i)
{
    return bf ? bits_f32((uint32_t)xb[i] << 16) : x[i];
}

/* mp_fp8_scaled_cast (one pass, where the path has it) and the public
 * mp_float8_quantize_bf16 (one pass or one pass per step, by path) against
 * the scalar route: codes, bfloat16 values and amax bit for bit, float32
 * and bfloat16 inputs, both formats, the sign carried or not, either output
 * left out, lengths with tails and several parallel chunks. */
static void test_scaled_cast_every_path(void **state)
{
    (void)state;
    enum { N = 9 * 4096 + 37 };
    const size_t lens[] = {1, 15, 37, 4096 + 45, N};
    const float scales[] = {1.0f, 1234.5f, 0x1p-20f, 3e5f};
    float *x = malloc(N * sizeof *x);
    /* the outputs one element longer than any n: nothing is written past n */
    uint16_t *xb = malloc(N * sizeof *xb), *dec = malloc((N + 1) * 2), *rdec = malloc(N * 2);
    uint8_t *codes = malloc(N + 1), *rcodes = malloc(N);
    assert_non_null(x && xb && dec && rdec && codes && rcodes);
    mp_isa isas[MP_ISA_COUNT];
    const int nisa = test_isas(isas);
    int one_pass = 0;
    for (int fi = 0; fi < 2; fi++)
        for (int ti = 0; ti < 2; ti++)
            for (int si = 0; si < 4; si++)
                for (int sg = 0; sg < 2; sg++) {
                    const mp_dtype fp8 = fi ? MP_F8E5M2 : MP_F8E4M3, t = ti ? MP_BF16 : MP_F32;
                    const float scale = scales[si];
                    cast_inputs(x, N, scale, 100u + (uint64_t)(8 * fi + 4 * ti + si));
                    for (size_t i = 0; i < N; i++) xb[i] = (uint16_t)(f32_bits(x[i]) >> 16);
                    const void *in = ti ? (const void *)xb : x;
                    for (size_t i = 0; i < N; i++)
                        ref_cast(widened(x, xb, ti, i), scale, fp8, sg, &rcodes[i], &rdec[i]);
                    for (int p = 0; p < nisa; p++) {
                        assert_int_equal(mp_isa_set(isas[p]), MP_OK);
                        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
                            const size_t n = lens[li];
                            uint32_t amax = 0, want = 0;
                            for (size_t i = 0; i < n; i++) {
                                const uint32_t a = f32_bits(widened(x, xb, ti, i)) & 0x7FFFFFFFu;
                                want = a > want ? a : want;
                            }
                            memset(codes, 0x55, N + 1);
                            memset(dec, 0x55, 2 * (N + 1));
                            if (mp_fp8_scaled_cast(codes, dec, fp8, in, t, n, scale, sg, &amax)) {
                                one_pass++;
                                assert_int_equal(amax, want);
                                assert_memory_equal(codes, rcodes, n);
                                assert_memory_equal(dec, rdec, 2 * n);
                                assert_int_equal(codes[n], 0x55); /* nothing past n */
                                assert_int_equal(dec[n], 0x5555);
                                /* either output alone */
                                memset(codes, 0x55, N + 1);
                                assert_true(mp_fp8_scaled_cast(codes, NULL, fp8, in, t, n, scale,
                                                               sg, &amax));
                                assert_memory_equal(codes, rcodes, n);
                                memset(dec, 0x55, 2 * (N + 1));
                                assert_true(
                                    mp_fp8_scaled_cast(NULL, dec, fp8, in, t, n, scale, sg, &amax));
                                assert_memory_equal(dec, rdec, 2 * n);
                                assert_int_equal(amax, want);
                            }
                            if (sg) continue; /* the public cast carries no sign */
                            memset(codes, 0x55, N + 1);
                            memset(dec, 0x55, 2 * (N + 1));
                            float got = mp_float8_quantize_bf16(codes, dec, fp8, in, t, n, scale);
                            assert_int_equal(f32_bits(got), want);
                            assert_memory_equal(codes, rcodes, n);
                            assert_memory_equal(dec, rdec, 2 * n);
                        }
                    }
                    mp_isa_reset();
                }
    /* the one-pass kernel ran wherever the CPU has AVX-512 */
    if (mp_isa_supported(MP_ISA_AVX512)) assert_true(one_pass > 0);
    free(x);
    free(xb);
    free(dec);
    free(rdec);
    free(codes);
    free(rcodes);
}

/* A scripted amax sequence through one tensor's state: the scale after each
 * step against the rule applied to the window computed here. */
static void run_script(mp_float8_amax_algorithm algo, int margin, mp_float8_role role)
{
    const float seq[] = {2.0f, 0.5f, 0.0f, 8.0f, 0.25f, 0.25f, 1e-3f, 0.0f, 3.0f, 0.125f};
    const bool applied[] = {true, true, true, false, true, true, true, true, true, true};
    enum { L = 3, N = sizeof seq / sizeof *seq };
    mp_float8_params p = mp_float8_params_default();
    p.amax_history_len = L;
    p.algorithm = algo;
    p.margin = margin;
    mp_float8_meta q;
    assert_int_equal(mp_float8_meta_init(&q, "d", role, &p), MP_OK);
    mp_dtype t = mp_float8_dtype(&p, role);
    assert_int_equal(t, role == MP_FLOAT8_GRAD_OUTPUT ? MP_F8E5M2 : MP_F8E4M3);
    float window[N] = {0}, scale = 1.0f;
    int kept = 0;
    assert_true(q.scale == 1.0f);
    for (int i = 0; i < N; i++) {
        /* two passes of one step: the larger counts */
        mp_float8_meta_record(&q, seq[i] / 2);
        mp_float8_meta_record(&q, seq[i]);
        mp_float8_meta_commit(&q, applied[i]);
        if (applied[i]) {
            window[kept++] = seq[i];
            float a = window[kept - 1];
            if (algo == MP_FLOAT8_AMAX_MAX)
                for (int j = kept - L < 0 ? 0 : kept - L; j < kept; j++)
                    a = window[j] > a ? window[j] : a;
            scale = ref_scale(a, scale, t, margin);
        }
        assert_int_equal(f32_bits(q.scale), f32_bits(scale));
        assert_false(q.has_pending);
        for (int j = 0; j < L; j++) /* the history, newest first */
            assert_true(q.history[j] == (kept - 1 - j >= 0 ? window[kept - 1 - j] : 0.0f));
    }
    /* a non-finite amax is never pushed, even in an applied step */
    float before = q.scale, h0 = q.history[0];
    mp_float8_meta_record(&q, 5.0f);
    mp_float8_meta_record(&q, NAN);
    mp_float8_meta_record(&q, 7.0f);
    assert_true(isnan(q.pending));
    mp_float8_meta_commit(&q, true);
    assert_true(q.scale == before && q.history[0] == h0);
    mp_float8_meta_release(&q);
}

static void test_delayed_scaling_script(void **state)
{
    (void)state;
    for (int algo = 0; algo < 2; algo++)
        for (int margin = 0; margin <= 2; margin += 2)
            for (int role = 0; role < MP_FLOAT8_ROLES; role++)
                run_script((mp_float8_amax_algorithm)algo, margin, (mp_float8_role)role);
}

/* ------------------------------------------------- Dense emulation */

enum { ROWS = 24, K = 40, UNITS = 18 };

typedef struct {
    mp_model *m;
    mp_node pre, dense; /* pre: the Activation before the Dense, or -1 */
} dense_model;

/* Input -> [Activation(linear)] -> Dense(UNITS, act) forced into float8 */
static dense_model make_dense(bool through_activation, mp_activation act, const mp_float8_params *p)
{
    dense_model d;
    d.m = mp_model_new_with_policy(5, "mixed_float8");
    mp_node x = mp_input(d.m, 1, (int64_t[]){K}, NULL);
    d.pre = through_activation ? mp_activation_layer(d.m, x, MP_ACT_NONE, NULL) : -1;
    mp_layer_options o = {.float8_params = p, .float8 = 1};
    d.dense = mp_dense(d.m, through_activation ? d.pre : x, UNITS, act, &o);
    assert_int_equal(mp_model_build(d.m, d.dense, ROWS), MP_OK);
    assert_true(mp_model_layer_float8(d.m, (int)d.dense));
    assert_int_equal(mp_model_float8_num_tensors(d.m), 3);
    /* a kernel of mixed magnitudes and a non-zero bias */
    mp_model_param *w = mp_model_get_param(d.m, 0), *b = mp_model_get_param(d.m, 1);
    test_fill(w->master, (size_t)w->n, 21, -0.5, 0.5);
    for (int i = 0; i < 10; i++) w->master[i * 7] *= 100.0f;
    test_fill(b->master, (size_t)b->n, 22, -1, 1);
    mp_model_mark_masters_changed(d.m);
    return d;
}

static float tensor_scale(const mp_model *m, int i)
{
    mp_float8_tensor_info info;
    assert_int_equal(mp_model_float8_tensor(m, i, &info), MP_OK);
    return info.scale;
}

/* y (bf16, from the library) against the float64 emulation:
 *   y = act(alpha * sum_k qx qw + b), alpha = (1/sx)(1/sw) in float32.
 * Bound: the float32 sum over K exact products is within gamma_{K+2} of
 * sum |qx qw| (two more roundings: alpha and the bias), then one bfloat16
 * rounding of the float32 result: |y - ref| <= E + UBF (|ref| + E), E =
 * alpha gamma_{K+2} sum|qx qw| + 2 U32 |b|. */
static void check_forward(const dense_model *d, const float *x, float sx, float sw,
                          mp_activation act, const mp_tensor *y)
{
    const mp_model_param *w = mp_model_get_param(d->m, 0), *b = mp_model_get_param(d->m, 1);
    float alpha = (1.0f / sx) * (1.0f / sw);
    for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < UNITS; j++) {
            double acc = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double t = q8(bf16(x[r * K + k]), sx, MP_F8E4M3) *
                           q8(w->master[k * UNITS + j], sw, MP_F8E4M3);
                acc += t;
                mag += fabs(t);
            }
            double ref = (double)alpha * acc + b->master[j];
            if (act == MP_ACT_RELU && ref < 0) ref = 0;
            double e = alpha * gamma_k(K + 2) * mag + 2 * U32 * fabs(b->master[j]);
            float got = mp_bf16_to_f32(((const uint16_t *)y->data)[r * UNITS + j]);
            if (!(fabs(got - ref) <= e + UBF * (fabs(ref) + e)))
                fail_msg("y[%d][%d] = %.9g, emulation %.9g (bound %.3g; sx %g sw %g)", r, j, got,
                         ref, e + UBF * (fabs(ref) + e), sx, sw);
        }
}

static void test_dense_forward_emulation(void **state)
{
    (void)state;
    for (int variant = 0; variant < 4; variant++) {
        mp_float8_params p = mp_float8_params_default();
        p.scaling = variant & 1 ? MP_FLOAT8_DELAYED : MP_FLOAT8_CURRENT;
        mp_activation act = variant & 2 ? MP_ACT_RELU : MP_ACT_NONE;
        dense_model d = make_dense(variant & 2, act, &p);
        float x[ROWS * K], x2[ROWS * K];
        test_fill(x, ROWS * K, 31 + (uint64_t)variant, -2, 2);
        for (int i = 0; i < ROWS * K; i++) x2[i] = 4.0f * x[i]; /* beyond the delayed scale */
        mp_tensor tx;
        mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){ROWS, K}, x);
        const mp_tensor *y;
        const mp_model_param *w = mp_model_get_param(d.m, 0);
        float xb[ROWS * K];
        for (int i = 0; i < ROWS * K; i++) xb[i] = bf16(x[i]);
        float ax = ref_amax(xb, ROWS * K), aw = ref_amax(w->master, (size_t)w->n);
        if (p.scaling == MP_FLOAT8_CURRENT) {
            assert_int_equal(mp_model_forward(d.m, &tx, false, &y), MP_OK);
            float sx = ref_scale(ax, 1, MP_F8E4M3, 0), sw = ref_scale(aw, 1, MP_F8E4M3, 0);
            assert_int_equal(f32_bits(tensor_scale(d.m, 0)), f32_bits(sx));
            assert_int_equal(f32_bits(tensor_scale(d.m, 1)), f32_bits(sw));
            check_forward(&d, x, sx, sw, act, y);
        } else {
            /* step 1 quantizes with scale 1; its amaxes set the next scales */
            assert_int_equal(mp_model_forward(d.m, &tx, true, &y), MP_OK);
            check_forward(&d, x, 1.0f, 1.0f, act, y);
            assert_true(mp_model_float8_commit(d.m, true));
            float sx = ref_scale(ax, 1, MP_F8E4M3, 0), sw = ref_scale(aw, 1, MP_F8E4M3, 0);
            assert_int_equal(f32_bits(tensor_scale(d.m, 0)), f32_bits(sx));
            mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){ROWS, K}, x2); /* saturates */
            assert_int_equal(mp_model_forward(d.m, &tx, false, &y), MP_OK);
            check_forward(&d, x2, sx, sw, act, y);
            assert_false(mp_model_float8_commit(d.m, true)); /* inference records nothing */
        }
        mp_model_free(d.m);
    }
}

/* Backward against the emulation: dz = bf16(dy) (relu: where y > 0) in
 * E5M2 with sg from its amax (current scaling); dW = alpha_w sum_r qx qg
 * (float32: within alpha_w gamma_{ROWS+1} sum|.|), db = the float32 column
 * sum of dz, dX = alpha_x sum_j qg qw then one bfloat16 rounding. */
static void test_dense_backward_emulation(void **state)
{
    (void)state;
    for (int variant = 0; variant < 4; variant++) {
        mp_float8_params p = mp_float8_params_default();
        p.scaling = MP_FLOAT8_CURRENT;
        if (variant >= 2) p.format = MP_FLOAT8_E4M3;
        bool through = variant & 1; /* codes saved (data input) or quantized again */
        mp_activation act = MP_ACT_RELU;
        dense_model d = make_dense(through, act, &p);
        float x[ROWS * K], dy[ROWS * UNITS];
        test_fill(x, ROWS * K, 41 + (uint64_t)variant, -2, 2);
        test_fill(dy, ROWS * UNITS, 51 + (uint64_t)variant, -1e-3, 1e-3);
        mp_tensor tx, tdy;
        mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){ROWS, K}, x);
        mp_tensor_wrap(&tdy, MP_F32, 2, (int64_t[]){ROWS, UNITS}, dy);
        const mp_tensor *y;
        assert_int_equal(mp_model_forward(d.m, &tx, true, &y), MP_OK);
        float yv[ROWS * UNITS];
        mp_convert(yv, MP_F32, y->data, y->dtype, ROWS * UNITS);
        assert_int_equal(mp_model_backward(d.m, &tdy, false), MP_OK);
        const mp_model_param *w = mp_model_get_param(d.m, 0), *b = mp_model_get_param(d.m, 1);
        mp_dtype gt = mp_float8_dtype(&p, MP_FLOAT8_GRAD_OUTPUT);
        float dz[ROWS * UNITS], xb[ROWS * K];
        for (int i = 0; i < ROWS * UNITS; i++) dz[i] = yv[i] > 0 ? bf16(dy[i]) : 0.0f;
        for (int i = 0; i < ROWS * K; i++) xb[i] = bf16(x[i]);
        float sx = ref_scale(ref_amax(xb, ROWS * K), 1, MP_F8E4M3, 0);
        float sw = ref_scale(ref_amax(w->master, (size_t)w->n), 1, MP_F8E4M3, 0);
        float sg = ref_scale(ref_amax(dz, ROWS * UNITS), 1, gt, 0);
        assert_int_equal(f32_bits(tensor_scale(d.m, 2)), f32_bits(sg));
        float aw = (1.0f / sx) * (1.0f / sg), ax = (1.0f / sg) * (1.0f / sw);
        for (int k = 0; k < K; k++)
            for (int j = 0; j < UNITS; j++) {
                double acc = 0, mag = 0;
                for (int r = 0; r < ROWS; r++) {
                    double t = q8(xb[r * K + k], sx, MP_F8E4M3) * q8(dz[r * UNITS + j], sg, gt);
                    acc += t;
                    mag += fabs(t);
                }
                double ref = (double)aw * acc, e = aw * gamma_k(ROWS + 1) * mag;
                assert_true(fabs(w->grad[k * UNITS + j] - ref) <= e);
            }
        for (int j = 0; j < UNITS; j++) {
            double s = 0;
            for (int r = 0; r < ROWS; r++) s += dz[r * UNITS + j];
            assert_true(fabs(b->grad[j] - s) <= U32 * fabs(s));
        }
        const mp_tensor *dx = through ? mp_model_node_grad(d.m, d.pre) : NULL;
        for (int r = 0; dx && r < ROWS; r++)
            for (int k = 0; k < K; k++) {
                double acc = 0, mag = 0;
                for (int j = 0; j < UNITS; j++) {
                    double t =
                        q8(dz[r * UNITS + j], sg, gt) * q8(w->master[k * UNITS + j], sw, MP_F8E4M3);
                    acc += t;
                    mag += fabs(t);
                }
                double ref = (double)ax * acc, e = ax * gamma_k(UNITS + 1) * mag;
                float got = mp_bf16_to_f32(((const uint16_t *)dx->data)[r * K + k]);
                assert_true(fabs(got - ref) <= e + UBF * (fabs(ref) + e));
            }
        assert_true(!through || dx);
        mp_model_free(d.m);
    }
}

/* The quantizer hook: a quantizer whose operands differ per pass (as MX
 * blocks along the reduction do) gets every operand asked for per pass,
 * with the reduction axis; here it wraps the float8 one, so the results
 * must be the same bits. */
static int calls[3][2]; /* [mode][k_axis] */

static void counting_quantize(mp_float8_meta *q, const mp_quant_input *in, mp_quant_mode mode,
                              void *stored, void *operand, mp_quant_operand *out)
{
    calls[mode][in->k_axis]++;
    assert_null(stored); /* a per-pass operand is never kept */
    mp_quantizer_float8.quantize(q, in, mode, stored, operand, out);
}

static size_t per_pass_bytes(int64_t rows, int64_t cols) { return (size_t)(rows * cols) * 2; }

static const mp_quantizer per_pass = {"per-pass",        false, per_pass_bytes, per_pass_bytes,
                                      counting_quantize, NULL};

static void test_quantizer_hook(void **state)
{
    (void)state;
    mp_float8_params p = mp_float8_params_default();
    float x[ROWS * K], dy[ROWS * UNITS];
    test_fill(x, ROWS * K, 61, -2, 2);
    test_fill(dy, ROWS * UNITS, 62, -1, 1);
    mp_tensor tx, tdy;
    mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){ROWS, K}, x);
    mp_tensor_wrap(&tdy, MP_F32, 2, (int64_t[]){ROWS, UNITS}, dy);
    uint16_t y[2][ROWS * UNITS], dx[2][ROWS * K];
    float dw[2][K * UNITS];
    for (int v = 0; v < 2; v++) {
        dense_model d = make_dense(true, MP_ACT_NONE, &p);
        mp_model *m = d.m;
        if (v) {
            for (int i = 0; i < 3; i++) m->fp8[i].ops = &per_pass;
            assert_int_equal(mp_model_set_max_batch(m, ROWS), MP_OK); /* re-plan */
        }
        memset(calls, 0, sizeof calls);
        const mp_tensor *out;
        for (int s2 = 0; s2 < 2; s2++) { /* the second step quantizes with real scales */
            assert_int_equal(mp_model_forward(m, &tx, true, &out), MP_OK);
            assert_int_equal(mp_model_backward(m, &tdy, false), MP_OK);
            mp_model_float8_commit(m, true);
        }
        memcpy(y[v], out->data, sizeof y[v]);
        memcpy(dx[v], mp_model_node_grad(m, d.pre)->data, sizeof dx[v]);
        memcpy(dw[v], mp_model_get_param(m, 0)->grad, sizeof dw[v]);
        if (v) { /* per step: W, x (forward); dz twice, x and W again (backward) */
            assert_int_equal(calls[MP_QUANT_TRAIN][0], 2 * 2); /* W, dz for dW */
            assert_int_equal(calls[MP_QUANT_TRAIN][1], 2 * 1); /* x */
            assert_int_equal(calls[MP_QUANT_AGAIN][0], 2 * 1); /* x for dW */
            assert_int_equal(calls[MP_QUANT_AGAIN][1], 2 * 1); /* W for dX */
            assert_int_equal(calls[MP_QUANT_INFER][1], 2 * 1); /* dz for dX */
        }
        mp_model_free(m);
    }
    assert_memory_equal(y[0], y[1], sizeof y[0]);
    assert_memory_equal(dx[0], dx[1], sizeof dx[0]);
    assert_memory_equal(dw[0], dw[1], sizeof dw[0]);
}
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scale_rule),
        cmocka_unit_test(test_scaled_cast_every_path),
        cmocka_unit_test(test_delayed_scaling_script),
        cmocka_unit_test(test_dense_forward_emulation),
        cmocka_unit_test(test_dense_backward_emulation),
        cmocka_unit_test(test_quantizer_hook),
    };
    return cmocka_run_group_tests_name("fp8", tests, NULL, NULL);
}
