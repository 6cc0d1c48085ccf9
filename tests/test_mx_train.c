/* test_mx_train.c - MX (microscaling) training (mixprec/mx.h, nn/mx_quant.c):
 * the quantizer's operands bit for bit against mp_mx_quantize_2d (tested
 * bit-exactly in test_mx.c) along either axis, in bfloat16 where exact and
 * float32 where not; a Dense layer's forward and backward against an
 * independent float64 emulation, each pass quantized along its own
 * reduction axis (with a check that the data would catch an operand reused
 * from another pass); which layers the MX policies quantize; the per-layer
 * "mx" / "mx_grad" fields of model files and their round trip; a run that
 * resumes from a checkpoint bit for bit; one-line errors naming the bad
 * value (library, model file, CLI). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common.h"
#include "nn/model_internal.h"
#include "nn/quant.h"

#define U32 0x1p-24 /* float32 unit roundoff */
#define UBF 0x1p-8  /* bfloat16 unit roundoff (7 fraction bits) */

static float bf16(float x) { return mp_bf16_to_f32(mp_f32_to_bf16(x)); }

static void fill(float *x, size_t n, uint64_t seed, double lo, double hi)
{
    test_rng r = {seed};
    for (size_t i = 0; i < n; i++) x[i] = (float)test_rng_uniform(&r, lo, hi);
}

/* gamma_k = k u / (1 - k u): the float32 summation bound over k terms */
static double gamma_k(int64_t k) { return (double)k * U32 / (1 - (double)k * U32); }

/* MX fake quantization of a rows x cols float32 matrix along axis, into
 * float32 (exact): the reference operand. */
static float *mxq(mp_mx_format f, const float *x, int64_t rows, int64_t cols, int axis)
{
    float *q = malloc((size_t)(rows * cols) * sizeof *q);
    assert_non_null(q);
    assert_int_equal(mp_mx_quantize_2d(f, MP_MX_BLOCK, rows, cols, axis, x, q, MP_F32), MP_OK);
    return q;
}

/* ---------------------------------------------------- the quantizer */

/* Shapes that cut tiles and blocks (the quantizer's tiles are 32 x 256),
 * float32 and bfloat16 inputs, both axes: the operand is the bits of
 * mp_mx_quantize_2d on the whole matrix, in bfloat16. An MXFP8 E4M3 block
 * whose scale is below 2^-124 is not exact in bfloat16: then the whole
 * operand comes in float32, again those bits. */
static void test_quantizer_operands(void **state)
{
    (void)state;
    enum { R = 70, C = 300 };
    static float x[R * C], ref[R * C], op[R * C];
    static uint16_t xb[R * C], refb[R * C];
    for (int f = 0; f < MP_MX_FORMAT_COUNT; f++)
        for (int axis = 0; axis < 2; axis++)
            for (int t = 0; t < 3; t++) { /* float32, bfloat16, float32 with tiny blocks */
                fill(x, R * C, 7 + (uint64_t)(f * 6 + axis * 3 + t), -3, 3);
                for (int i = 0; i < R * C; i += 97) x[i] *= 1000.0f; /* outliers */
                if (t == 2) { /* one block: amax 2^-121 (scale 2^-127) and a 2^-135 */
                    for (int i = 0; i < 32; i++)
                        x[(axis ? 1 : i) * C + (axis ? i : 1)] *= 0x1p-123f;
                    x[axis ? C + 3 : 3 * C + 1] = 0x1p-121f;
                    x[axis ? C + 7 : 7 * C + 1] = -0x1p-135f;
                }
                mp_float8_meta q = {.ops = &mp_quantizer_mx, .mx_format = (mp_mx_format)f};
                mp_quant_input in = {x, MP_F32, R, C, axis};
                if (t == 1) {
                    mp_convert(xb, MP_BF16, x, MP_F32, R * C);
                    mp_convert(x, MP_F32, xb, MP_BF16, R * C); /* the values it sees */
                    in.x = xb;
                    in.dtype = MP_BF16;
                }
                mp_quant_operand out;
                memset(op, 0xA5, sizeof op);
                assert_true(mp_quantizer_mx.operand_bytes(R, C) >= sizeof op);
                mp_quantizer_mx.quantize(&q, &in, MP_QUANT_TRAIN, NULL, op, &out);
                assert_ptr_equal(out.data, op);
                assert_true(out.inv_scale == 1.0f);
                /* 2^-135 is an MXFP8 element (2^-8 times the scale), below bfloat16's
                 * 2^-133; the other formats round it to 0 */
                bool tiny = t == 2 && (f == MP_MXFP8_E4M3 || f == MP_MXFP8_E5M2);
                assert_int_equal(out.dtype, tiny ? MP_F32 : MP_BF16);
                if (out.dtype == MP_F32) {
                    assert_int_equal(
                        mp_mx_quantize_2d((mp_mx_format)f, 32, R, C, axis, x, ref, MP_F32), MP_OK);
                    assert_memory_equal(op, ref, sizeof ref);
                } else {
                    assert_int_equal(
                        mp_mx_quantize_2d((mp_mx_format)f, 32, R, C, axis, x, refb, MP_BF16),
                        MP_OK);
                    assert_memory_equal(op, refb, sizeof refb);
                }
            }
}

/* ----------------------------------------------- Dense against float64 */

enum { ROWS = 45, K = 80, UNITS = 40 };

typedef struct {
    mp_model *m;
    mp_node pre, dense;
} dense_model;

/* InputLayer -> Activation(linear, bf16: the Dense's input is kept by its
 * producer and gets a gradient) -> Dense (MX on), under mixed_bfloat16. */
static dense_model make_dense(const mp_mx_params *p)
{
    dense_model d;
    d.m = mp_model_new_with_policy(5, "mixed_bfloat16");
    mp_node x = mp_input(d.m, 1, (int64_t[]){K}, NULL);
    d.pre = mp_activation_layer(d.m, x, MP_ACT_NONE, NULL);
    d.dense =
        mp_dense(d.m, d.pre, UNITS, MP_ACT_NONE, &(mp_layer_options){.mx_params = p, .mx = 1});
    assert_int_equal(mp_model_build(d.m, d.dense, ROWS), MP_OK);
    assert_true(mp_model_layer_mx(d.m, (int)d.dense, NULL));
    assert_int_equal(mp_model_float8_num_tensors(d.m), 0);
    mp_model_param *w = mp_model_get_param(d.m, 0), *b = mp_model_get_param(d.m, 1);
    fill(w->master, (size_t)w->n, 21, -0.5, 0.5);
    for (int i = 0; i < 12; i++) w->master[i * 67 % w->n] *= 300.0f; /* outliers */
    fill(b->master, (size_t)b->n, 22, -1, 1);
    mp_model_mark_masters_changed(d.m);
    return d;
}

/* The largest |got - ref| / bound over a GEMM result: <= 1 passes. ref =
 * sum_k a[i,k] b[k,j] in float64 over exactly representable products (MX
 * values have at most 8 significant bits: their products are exact in
 * float32), the library summing in float32 in any order: |err| <=
 * gamma_{k+1} (sum_k |a b| + |bias|) (k - 1 additions, the bias, and a
 * possible FMA's rounding counted once more), then, for a bfloat16 output,
 * one more rounding: E + UBF (|ref| + E). a is [m, k] (lda), b is [k, n]
 * read at b[kk * bs_k + j * bs_n]. */
typedef struct {
    const float *a, *b, *bias;
    int64_t m, n, k, bs_k, bs_n;
    bool bf16_out;
} gemm_ref;

static double worst_ratio(const gemm_ref *g, const void *got, mp_dtype got_type)
{
    double worst = 0;
    for (int64_t i = 0; i < g->m; i++)
        for (int64_t j = 0; j < g->n; j++) {
            double acc = 0, mag = 0;
            for (int64_t kk = 0; kk < g->k; kk++) {
                double t = (double)g->a[i * g->k + kk] * g->b[kk * g->bs_k + j * g->bs_n];
                acc += t;
                mag += fabs(t);
            }
            if (g->bias) {
                acc += g->bias[j];
                mag += fabs(g->bias[j]);
            }
            double e = gamma_k(g->k + 1) * mag;
            if (g->bf16_out) e += UBF * (fabs(acc) + e);
            float v = got_type == MP_BF16 ? mp_bf16_to_f32(((const uint16_t *)got)[i * g->n + j])
                                          : ((const float *)got)[i * g->n + j];
            double r = fabs(v - acc) / (e > 0 ? e : 1e-300);
            worst = r > worst ? r : worst;
        }
    return worst;
}

static float *transpose(const float *x, int64_t rows, int64_t cols)
{
    float *t = malloc((size_t)(rows * cols) * sizeof *t);
    assert_non_null(t);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) t[c * rows + r] = x[r * cols + c];
    return t;
}

/* Forward y = x W + b, backward dW = x^T dz, db = colsum(dz), dx = dz W^T,
 * for each forward format (gradients E5M2, and once E2M1), against the
 * emulation: x (bf16) along its features and W down its rows (forward); x
 * and dz down the samples (dW); dz along its units and W along its rows
 * (dx). For each operand the emulation built along the other axis (as if one
 * pass's operand were reused in another) is also checked to be far outside
 * the bound, so the test would catch that. */
static void test_dense_emulation(void **state)
{
    (void)state;
    const mp_mx_params cases[] = {
        {MP_MXFP8_E4M3, MP_MXFP8_E5M2}, {MP_MXFP6_E2M3, MP_MXFP8_E5M2},
        {MP_MXFP4_E2M1, MP_MXFP8_E5M2}, {MP_MXFP6_E3M2, MP_MXFP4_E2M1},
        {MP_MXINT8, MP_MXFP8_E4M3},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const mp_mx_params *p = &cases[c];
        dense_model d = make_dense(p);
        static float x[ROWS * K], dy[ROWS * UNITS], xb[ROWS * K], dz[ROWS * UNITS];
        fill(x, ROWS * K, 31 + c, -2, 2);
        fill(dy, ROWS * UNITS, 41 + c, -1e-3, 1e-3);
        for (int i = 0; i < ROWS * K; i += 53) x[i] *= 200.0f; /* outliers */
        for (int i = 0; i < ROWS * UNITS; i += 29) dy[i] *= 100.0f;
        for (int i = 0; i < ROWS * K; i++) xb[i] = bf16(x[i]);
        for (int i = 0; i < ROWS * UNITS; i++) dz[i] = bf16(dy[i]);
        mp_tensor tx, tdy;
        mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){ROWS, K}, x);
        mp_tensor_wrap(&tdy, MP_F32, 2, (int64_t[]){ROWS, UNITS}, dy);
        const mp_tensor *y;
        assert_int_equal(mp_model_forward(d.m, &tx, true, &y), MP_OK);
        assert_int_equal(y->dtype, MP_BF16);
        assert_int_equal(mp_model_backward(d.m, &tdy, false), MP_OK);
        const mp_model_param *w = mp_model_get_param(d.m, 0), *b = mp_model_get_param(d.m, 1);
        const mp_tensor *dx = mp_model_node_grad(d.m, d.pre);
        assert_non_null(dx);
        mp_mx_format f = p->format, gf = p->grad_format;
        /* forward: x along axis 1, W along axis 0 */
        float *qx1 = mxq(f, xb, ROWS, K, 1), *qw0 = mxq(f, w->master, K, UNITS, 0);
        float *qx0 = mxq(f, xb, ROWS, K, 0), *qw1 = mxq(f, w->master, K, UNITS, 1);
        float *qg0 = mxq(gf, dz, ROWS, UNITS, 0), *qg1 = mxq(gf, dz, ROWS, UNITS, 1);
        gemm_ref fwd = {qx1, qw0, b->master, ROWS, UNITS, K, UNITS, 1, true};
        assert_true(worst_ratio(&fwd, y->data, MP_BF16) <= 1);
        gemm_ref fwd_bad = fwd;
        fwd_bad.b = qw1; /* W quantized along its columns */
        assert_true(worst_ratio(&fwd_bad, y->data, MP_BF16) > 10);
        /* dW[k, j] = sum_r x[r, k] dz[r, j]: x^T as the [K, ROWS] left operand */
        float *qx0t = transpose(qx0, ROWS, K), *qx1t = transpose(qx1, ROWS, K);
        gemm_ref gw = {qx0t, qg0, NULL, K, UNITS, ROWS, UNITS, 1, false};
        assert_true(worst_ratio(&gw, w->grad, MP_F32) <= 1);
        gemm_ref gw_bad = gw;
        gw_bad.a = qx1t; /* the forward's x operand reused */
        assert_true(worst_ratio(&gw_bad, w->grad, MP_F32) > 10);
        gw_bad = gw;
        gw_bad.b = qg1; /* dz quantized for the dx pass */
        assert_true(worst_ratio(&gw_bad, w->grad, MP_F32) > 10);
        /* db: the float32 column sums of dz (not quantized) */
        for (int j = 0; j < UNITS; j++) {
            double s = 0, mag = 0;
            for (int r = 0; r < ROWS; r++) {
                s += dz[r * UNITS + j];
                mag += fabs(dz[r * UNITS + j]);
            }
            assert_true(fabs(b->grad[j] - s) <= gamma_k(ROWS) * mag);
        }
        /* dx[r, k] = sum_j dz[r, j] W[k, j]: W read transposed */
        gemm_ref gx = {qg1, qw1, NULL, ROWS, K, UNITS, 1, UNITS, true};
        assert_true(worst_ratio(&gx, dx->data, dx->dtype) <= 1);
        gemm_ref gx_bad = gx;
        gx_bad.b = qw0; /* the forward's W operand reused */
        assert_true(worst_ratio(&gx_bad, dx->data, dx->dtype) > 10);
        gx_bad = gx;
        gx_bad.a = qg0; /* dz quantized for the dW pass */
        assert_true(worst_ratio(&gx_bad, dx->data, dx->dtype) > 10);
        free(qx1), free(qw0), free(qx0), free(qw1), free(qg0), free(qg1), free(qx0t), free(qx1t);
        mp_model_free(d.m);
    }
}

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
    fill(data, sizeof data / sizeof *data, 5, -1, 1);
    fill(dy, sizeof dy / sizeof *dy, 6, -1, 1);
    mp_tensor td, tdy;
    mp_tensor_wrap(&td, MP_F32, 4, (int64_t[]){2, 8, 8, 3}, data);
    mp_tensor_wrap(&tdy, MP_F32, 4, (int64_t[]){2, 8, 8, 8}, dy);
    assert_int_equal(mp_model_forward(m, &td, true, NULL), MP_OK);
    assert_int_equal(mp_model_backward(m, &tdy, false), MP_OK);
    const mp_model_param *k = mp_model_get_param(m, 2); /* the middle kernel */
    for (int64_t i = 0; i < k->n; i++) assert_true(isfinite(k->grad[i]));
    mp_model_free(m);
}

/* Conv2D in MX against the bfloat16 convolution on data MXFP4 keeps
 * exactly along any axis (32 channels and filters: the blocks are those of
 * the implicit GEMMs): every pass must give mixed_bfloat16's bits. */
static void test_conv2d_exact(void **state)
{
    (void)state;
    enum { B = 2, H = 6, W = 5, C = 32, F = 32 };
    static float x[B * H * W * C], wk[3 * 3 * C * F], dy[B * H * W * F];
    test_rng r = {11};
    /* a grid that any block scale (2^(floor(log2 amax) - 2)) maps into E2M1's
     * {0, 0.5, 1, 1.5, 2, 3, 4, 6}: MXFP4 keeps it exactly */
    static const float grid[] = {0, 0.5f, 1, 1.5f, 2, 3, 4, -0.5f, -1, -1.5f, -2, -3, -4};
    for (size_t i = 0; i < sizeof x / sizeof *x; i++) x[i] = grid[test_rng_u32(&r) % 13];
    for (size_t i = 0; i < sizeof wk / sizeof *wk; i++) wk[i] = grid[test_rng_u32(&r) % 13] / 8;
    for (size_t i = 0; i < sizeof dy / sizeof *dy; i++) dy[i] = grid[test_rng_u32(&r) % 13] / 64;
    uint16_t y[2][B * H * W * F], dx[2][B * H * W * C];
    static float dw[2][3 * 3 * C * F];
    for (int v = 0; v < 2; v++) {
        mp_model *m = mp_model_new_with_policy(4, "mixed_bfloat16");
        mp_node in = mp_input(m, 3, (int64_t[]){H, W, C}, NULL);
        mp_node a = mp_activation_layer(m, in, MP_ACT_NONE, NULL);
        mp_conv2d_options co = mp_conv2d_options_default(F, 3, 3);
        co.padding = MP_PADDING_SAME;
        mp_mx_params p = {MP_MXFP4_E2M1, MP_MXFP4_E2M1};
        mp_node c = mp_conv2d(m, a, &co, &(mp_layer_options){.mx_params = &p, .mx = v});
        assert_int_equal(mp_model_build(m, c, B), MP_OK);
        assert_int_equal(mp_model_layer_mx(m, (int)c, NULL), v);
        memcpy(mp_model_get_param(m, 0)->master, wk, sizeof wk);
        mp_model_mark_masters_changed(m);
        mp_tensor tx, tdy;
        mp_tensor_wrap(&tx, MP_F32, 4, (int64_t[]){B, H, W, C}, x);
        mp_tensor_wrap(&tdy, MP_F32, 4, (int64_t[]){B, H, W, F}, dy);
        const mp_tensor *out;
        assert_int_equal(mp_model_forward(m, &tx, true, &out), MP_OK);
        memcpy(y[v], out->data, sizeof y[v]);
        assert_int_equal(mp_model_backward(m, &tdy, false), MP_OK);
        memcpy(dx[v], mp_model_node_grad(m, a)->data, sizeof dx[v]);
        memcpy(dw[v], mp_model_get_param(m, 0)->grad, sizeof dw[v]);
        mp_model_free(m);
    }
    assert_memory_equal(y[0], y[1], sizeof y[0]);
    assert_memory_equal(dw[0], dw[1], sizeof dw[0]);
    assert_memory_equal(dx[0], dx[1], sizeof dx[0]);
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
    const char *json =
        "{\"format\": \"mixprec.model\", \"version\": 2, \"policy\": \"mixed_mxfp8\", "
        "\"layers\": [{\"class_name\": \"InputLayer\", \"name\": \"x\", \"inputs\": [], "
        "\"shape\": [40]}, " LAYER("a", "x", "16", ", \"mx\": \"mxfp6_e2m3\"") ", " LAYER("b", "a", "16", ", \"mx\": \"mxfp4\", \"mx_grad\": \"mxfp8_e4m3\"") ", " LAYER(
            "c", "b", "16",
            "") ", " LAYER("d", "c", "16",
                           ", \"mx_grad\": \"mxfp6_e3m2\"") ", " LAYER("e", "d", "16",
                                                                       ", \"mx\": false") ","
                                                                                          " " LAYER("f",
                                                                                                    "e",
                                                                                                    "16",
                                                                                                    ", \"mx\": \"mxint8\"") ", " LAYER("g",
                                                                                                                                       "f",
                                                                                                                                       "4",
                                                                                                                                       "") "]}";
    const mp_mx_params want[] = {
        {MP_MXFP6_E2M3, MP_MXFP8_E5M2},
        {MP_MXFP4_E2M1, MP_MXFP8_E4M3},
        {MP_MXFP8_E4M3, MP_MXFP8_E5M2},
        {MP_MXFP8_E4M3, MP_MXFP6_E3M2},
        {0, 0},
        {MP_MXINT8, MP_MXFP8_E5M2},
        {0, 0},
    };
    /* a: explicit on an edge; c, d: the policy's; e: off; g: the last, kept */
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
    for (int i = 0; i < n; i++) {
        fill(b[i].x, 8 * 40, 100 + (uint64_t)i, -1, 1);
        for (int r = 0; r < 8; r++) b[i].y[r] = (r + i) % 3;
    }
}

static void step(mp_model *m, batch *b)
{
    mp_tensor tx;
    mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){8, 40}, b->x);
    mp_step_result r;
    assert_int_equal(mp_model_train_step(m, &tx, b->y, NULL, &r), MP_OK);
    assert_true(r.applied);
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
    const char *cases[][2] = {
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
        cmocka_unit_test(test_quantizer_operands), cmocka_unit_test(test_dense_emulation),
        cmocka_unit_test(test_which_layers),       cmocka_unit_test(test_conv2d_exact),
        cmocka_unit_test(test_json_fields),        cmocka_unit_test(test_resume_bit_exact),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests_name("mx_train", tests, NULL, NULL);
}
