/* test_mx_train.c - MX (microscaling) training arithmetic (mixprec/mx.h,
 * nn/mx_quant.c): the quantizer's operands bit for bit against
 * mp_mx_quantize_2d (tested bit-exactly in test_mx.c) along either axis, in
 * bfloat16 where exact and float32 where not; a Dense layer's forward and
 * backward against an independent float64 emulation, each pass quantized
 * along its own reduction axis (with a check that the data would catch an
 * operand reused from another pass); Conv2D on data MX keeps exactly. In a
 * model (policies, model files, resume, errors): test_mx_model.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "nn/model_internal.h"
#include "nn/quant.h"

static float bf16(float x) { return mp_bf16_to_f32(mp_f32_to_bf16(x)); }

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
                test_fill(x, R * C, 7 + (uint64_t)(f * 6 + axis * 3 + t), -3, 3);
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
    test_fill(w->master, (size_t)w->n, 21, -0.5, 0.5);
    for (int i = 0; i < 12; i++) w->master[i * 67 % w->n] *= 300.0f; /* outliers */
    test_fill(b->master, (size_t)b->n, 22, -1, 1);
    mp_model_mark_masters_changed(d.m);
    return d;
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
        test_fill(x, ROWS * K, 31 + c, -2, 2);
        test_fill(dy, ROWS * UNITS, 41 + c, -1e-3, 1e-3);
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
        test_gemm_ref fwd = {qx1, qw0, b->master, ROWS, UNITS, K, UNITS, 1, true, 0, 1.0};
        assert_true(test_gemm_worst(&fwd, y->data, MP_BF16) <= 1);
        test_gemm_ref fwd_bad = fwd;
        fwd_bad.b = qw1; /* W quantized along its columns */
        assert_true(test_gemm_worst(&fwd_bad, y->data, MP_BF16) > 10);
        /* dW[k, j] = sum_r x[r, k] dz[r, j]: x^T as the [K, ROWS] left operand */
        float *qx0t = test_transpose_copy(qx0, ROWS, K), *qx1t = test_transpose_copy(qx1, ROWS, K);
        test_gemm_ref gw = {qx0t, qg0, NULL, K, UNITS, ROWS, UNITS, 1, false, 0, 1.0};
        assert_true(test_gemm_worst(&gw, w->grad, MP_F32) <= 1);
        test_gemm_ref gw_bad = gw;
        gw_bad.a = qx1t; /* the forward's x operand reused */
        assert_true(test_gemm_worst(&gw_bad, w->grad, MP_F32) > 10);
        gw_bad = gw;
        gw_bad.b = qg1; /* dz quantized for the dx pass */
        assert_true(test_gemm_worst(&gw_bad, w->grad, MP_F32) > 10);
        /* db: the float32 column sums of dz (not quantized) */
        for (int j = 0; j < UNITS; j++) {
            double s = 0, mag = 0;
            for (int r = 0; r < ROWS; r++) {
                s += dz[r * UNITS + j];
                mag += fabs(dz[r * UNITS + j]);
            }
            assert_true(fabs(b->grad[j] - s) <= test_gamma(ROWS) * mag);
        }
        /* dx[r, k] = sum_j dz[r, j] W[k, j]: W read transposed */
        test_gemm_ref gx = {qg1, qw1, NULL, ROWS, K, UNITS, 1, UNITS, true, 0, 1.0};
        assert_true(test_gemm_worst(&gx, dx->data, dx->dtype) <= 1);
        test_gemm_ref gx_bad = gx;
        gx_bad.b = qw0; /* the forward's W operand reused */
        assert_true(test_gemm_worst(&gx_bad, dx->data, dx->dtype) > 10);
        gx_bad = gx;
        gx_bad.a = qg0; /* dz quantized for the dW pass */
        assert_true(test_gemm_worst(&gx_bad, dx->data, dx->dtype) > 10);
        free(qx1), free(qw0), free(qx0), free(qw1), free(qg0), free(qg1), free(qx0t), free(qx1t);
        mp_model_free(d.m);
    }
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
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantizer_operands),
        cmocka_unit_test(test_dense_emulation),
        cmocka_unit_test(test_conv2d_exact),
    };
    return cmocka_run_group_tests_name("mx_train", tests, NULL, NULL);
}
