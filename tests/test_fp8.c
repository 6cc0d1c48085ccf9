/* test_fp8.c - per-tensor float8 training (mixprec/fp8.h): the scale rule
 * and scripted amax sequences against scales computed here for both
 * algorithms and margins; the Dense GEMMs in float8 against an independent
 * float64 emulation (the library's scalar fp8 casts, tested exhaustively
 * elsewhere, then float64 sums) in forward and backward; which layers
 * mixed_float8 quantizes; non-finite and zero amaxes; bit-exact resume;
 * the memory plan; one-line errors that name the bad value. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
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

static void fill(float *x, size_t n, uint64_t seed, double lo, double hi)
{
    test_rng r = {seed};
    for (size_t i = 0; i < n; i++) x[i] = (float)test_rng_uniform(&r, lo, hi);
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
    fill(x, 5000, 11, -3, 3);
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
    fill(w->master, (size_t)w->n, 21, -0.5, 0.5);
    for (int i = 0; i < 10; i++) w->master[i * 7] *= 100.0f;
    fill(b->master, (size_t)b->n, 22, -1, 1);
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
        fill(x, ROWS * K, 31 + (uint64_t)variant, -2, 2);
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
        fill(x, ROWS * K, 41 + (uint64_t)variant, -2, 2);
        fill(dy, ROWS * UNITS, 51 + (uint64_t)variant, -1e-3, 1e-3);
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
    fill(x, ROWS * K, 61, -2, 2);
    fill(dy, ROWS * UNITS, 62, -1, 1);
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

/* ------------------------------------------------- training steps */

typedef struct {
    float x[8 * 12];
    int32_t y[8];
} batch;

static void make_batches(batch *b, int n)
{
    for (int i = 0; i < n; i++) {
        fill(b[i].x, 8 * 12, 100 + (uint64_t)i, -1, 1);
        for (int r = 0; r < 8; r++) b[i].y[r] = (r + i) % 3;
    }
}

static mp_step_result step(mp_model *m, batch *b)
{
    mp_tensor tx;
    mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){8, 12}, b->x);
    mp_step_result r;
    assert_int_equal(mp_model_train_step(m, &tx, b->y, NULL, &r), MP_OK);
    return r;
}

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
    const char *cases[][2] = {
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
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s%s", head, cases[i][0]);
        mp_model *r = NULL;
        assert_int_not_equal(mp_model_from_config(text, 4, INT64_MAX, &r), MP_OK);
        assert_null(r);
        if (!strstr(mp_last_error(), cases[i][1]))
            fail_msg("case %zu: '%s' lacks '%s'", i, mp_last_error(), cases[i][1]);
        assert_null(strchr(mp_last_error(), '\n'));
    }
    mp_policy pol;
    assert_int_equal(mp_policy_from_name("mixed_float8", &pol), MP_OK);
    assert_true(pol.float8 && pol.compute == MP_BF16 && pol.variable == MP_F32);
    assert_int_equal(mp_policy_from_name("mixed_float9", &pol), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "mixed_float9"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scale_rule),
        cmocka_unit_test(test_delayed_scaling_script),
        cmocka_unit_test(test_dense_forward_emulation),
        cmocka_unit_test(test_dense_backward_emulation),
        cmocka_unit_test(test_quantizer_hook),
        cmocka_unit_test(test_which_layers),
        cmocka_unit_test(test_memory_plan),
        cmocka_unit_test(test_nonfinite_amax),
        cmocka_unit_test(test_resume_bit_exact),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests_name("fp8", tests, NULL, NULL);
}
