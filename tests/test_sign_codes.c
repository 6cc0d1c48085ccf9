/* test_sign_codes.c - float8 codes that carry x > 0 (nn/quant.h,
 * keeps_sign), from which a relu Dense whose output is dropped reads its
 * derivative instead of keeping a mask (layer.h). The codes against the
 * plain cast (the same values; only zeros may change sign, a positive x
 * never gives 0x00, a zero always does), x > 0 read back from them
 * (mp_op_code_mask_grad) against relu's derivative of x bit for bit, and
 * GEMMs whose operands differ only in the signs of zeros giving the same
 * bits on every ISA path, sums that are exactly zero included. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/ops.h"
#include "nn/quant.h"

/* codes and bfloat16 operand of x * scale through the per-tensor
 * quantizer with keeps_sign; E4M3 as an input, E5M2 as a HYBRID gradient */
static void signed_codes(mp_dtype fp8, const void *x, mp_dtype t, size_t n, float scale,
                         uint8_t *codes, uint16_t *op)
{
    mp_float8_params p = mp_float8_params_default();
    mp_float8_role role = fp8 == MP_F8E4M3 ? MP_FLOAT8_INPUT : MP_FLOAT8_GRAD_OUTPUT;
    mp_float8_meta q;
    assert_int_equal(mp_float8_meta_init(&q, "t", role, &p), MP_OK);
    assert_int_equal(q.dtype, fp8);
    q.scale = scale;
    q.keeps_sign = true;
    mp_quant_input in = {x, t, 1, (int64_t)n, 1};
    mp_quant_operand out;
    q.ops->quantize(&q, &in, MP_QUANT_INFER, codes, op, &out);
    assert_ptr_equal(out.data, op);
    assert_int_equal(out.dtype, MP_BF16);
    mp_float8_meta_release(&q);
}

static float pick(test_rng *r)
{
    static const float s[] = {0.0f,   -0.0f,  1e-40f,   -1e-40f,   0x1p-10f,  0x1.02p-10f,
                              1e-4f,  -1e-4f, INFINITY, -INFINITY, NAN,       -NAN,
                              448.0f, 1e30f,  -1e30f,   FLT_MIN,   0x1p-133f, 57344.0f};
    uint32_t u = test_rng_u32(r);
    if (u % 3 == 0) return s[(u >> 2) % (sizeof s / sizeof *s)];
    return (float)test_rng_uniform(r, -2, 2) * ldexpf(1.0f, -(int)((u >> 8) % 40));
}

static float decode(uint8_t c, mp_dtype fp8)
{
    float v;
    mp_convert(&v, MP_F32, &c, fp8, 1);
    return v;
}

static void test_codes_carry_sign(void **state)
{
    (void)state;
    /* more than 8 chunks of 4096 (fp8.c's parallel path), odd length */
    const size_t n = 9 * 4096 + 3;
    const mp_dtype fp8s[] = {MP_F8E4M3, MP_F8E5M2}, types[] = {MP_F32, MP_BF16};
    const float scales[] = {1.0f, 0x1p-20f, FLT_MIN, 3.5f, 1e30f};
    float *x = malloc(n * 4), *dy = malloc(n * 4), *xv = malloc(n * 4), *dyv = malloc(n * 4);
    uint8_t *codes = malloc(n), *plain = malloc(n);
    uint16_t *op = malloc(n * 2), *ref_op = malloc(n * 2);
    char *xt = malloc(n * 4), *dyt = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
    assert_true(x && dy && xv && dyv && codes && plain && op && ref_op && xt && dyt && a && b);
    test_rng r = {3};
    for (size_t i = 0; i < n; i++) x[i] = pick(&r), dy[i] = pick(&r);
    size_t carried = 0, cleared = 0, inf_ties = 0;
    for (int f = 0; f < 2; f++)
        for (int t = 0; t < 2; t++)
            for (size_t s = 0; s < sizeof scales / sizeof *scales; s++) {
                mp_dtype fp8 = fp8s[f], tt = types[t];
                size_t es = mp_dtype_size(tt);
                mp_convert(xt, tt, x, MP_F32, n);
                mp_convert(xv, MP_F32, xt, tt, n);
                mp_convert(dyt, tt, dy, MP_F32, n);
                mp_convert(dyv, MP_F32, dyt, tt, n);
                signed_codes(fp8, xt, tt, n, scales[s], codes, op);
                mp_float8_quantize_bf16(plain, ref_op, fp8, xt, tt, n, scales[s]);
                for (size_t i = 0; i < n; i++) {
                    float v = decode(codes[i], fp8), pv = decode(plain[i], fp8);
                    /* the same value; only a zero's sign may differ */
                    if (isnan(pv))
                        assert_int_equal(codes[i], plain[i]);
                    else if (pv != 0.0f)
                        assert_int_equal(codes[i], plain[i]);
                    else
                        assert_true(v == 0.0f);
                    if (xv[i] == 0.0f) assert_int_equal(codes[i], 0x00);
                    if (xv[i] > 0.0f) assert_int_not_equal(codes[i], 0x00);
                    carried += codes[i] == 0x80 && plain[i] == 0x00;
                    cleared += codes[i] == 0x00 && plain[i] == 0x80;
                    /* x > 0 read back; E4M3 has no infinity: x * scale = +inf
                     * (float32) casts to NaN */
                    bool pos = codes[i] == 0x80 || v > 0.0f;
                    bool inf = fp8 == MP_F8E4M3 && xv[i] * scales[s] == INFINITY;
                    if (pos != (xv[i] > 0.0f && !inf))
                        fail_msg("%s x %g scale %g code %02x", mp_dtype_name(fp8), (double)xv[i],
                                 (double)scales[s], codes[i]);
                }
                /* the operand is the codes' values */
                float *dec = (float *)a;
                mp_convert(dec, MP_F32, codes, fp8, n);
                mp_convert(b, MP_BF16, dec, MP_F32, n);
                assert_memory_equal(op, b, n * 2);
                /* the relu gradient from the codes against relu's of x */
                mp_op_code_mask_grad(codes, fp8, dyt, tt, a, tt, n);
                mp_op_activation_grad(MP_ACT_RELU, xt, tt, dyt, tt, b, tt, n);
                for (size_t i = 0; i < n; i++) {
                    bool inf = fp8 == MP_F8E4M3 && xv[i] * scales[s] == INFINITY;
                    if (!inf || isnan(dyv[i]) || dyv[i] == 0.0f) {
                        inf_ties += inf;
                        assert_memory_equal(a + i * es, b + i * es, es);
                    } else { /* reads as not > 0 where its consumers read NaN */
                        float g;
                        mp_convert(&g, MP_F32, a + i * es, tt, 1);
                        assert_int_equal(f32_bits(g), f32_bits(dyv[i] * 0.0f));
                    }
                }
            }
    /* the cases were there: positives the cast took to zero, zeros and
     * negatives it took to -0, +inf under E4M3 with a NaN or zero gradient */
    assert_true(carried > 1000 && cleared > 1000 && inf_ties > 10);
    free(x), free(dy), free(xv), free(dyv), free(codes), free(plain), free(op), free(ref_op);
    free(xt), free(dyt), free(a), free(b);
}

/* ------------------------------------ zeros' signs and GEMM results */

enum { N = 48, M = 40, W = 24 };

/* x [k, N] in bfloat16, column c by c % 6: all +0; all positive below the
 * cast (all 0x80); positive below the cast or +0; ordinary positives with
 * some below; 0.75 and below alternately (against dz's d, d, -d, -d: a sum
 * that cancels exactly around zero products); any sign, zeros included */
static void make_x(float *x, int64_t k, test_rng *r)
{
    for (int64_t i = 0; i < k; i++)
        for (int c = 0; c < N; c++) {
            float tiny = (float)test_rng_uniform(r, 1e-6, 4e-4), v;
            switch (c % 6) {
            case 0:
                v = 0.0f;
                break;
            case 1:
                v = tiny;
                break;
            case 2:
                v = test_rng_u32(r) % 2 ? tiny : 0.0f;
                break;
            case 3:
                v = test_rng_u32(r) % 3 ? (float)test_rng_uniform(r, 0.01, 3) : tiny;
                break;
            case 4:
                v = i % 2 ? tiny : 0.75f;
                break;
            default:
                v = test_rng_u32(r) % 4 ? (float)test_rng_uniform(r, -1, 1) * 1e-3f : -0.0f;
            }
            x[i * N + c] = v;
        }
}

/* dz [k, M], column j by j % 4: positive; negative; d, d, -d, -d; zeros of
 * either sign */
static void make_dz(float *dz, int64_t k, test_rng *r)
{
    for (int64_t i = 0; i < k; i++)
        for (int j = 0; j < M; j++) {
            float d = (float)test_rng_uniform(r, 0.1, 2);
            float v = j % 4 == 0   ? d
                      : j % 4 == 1 ? -d
                      : j % 4 == 2 ? (i / 2 % 2 ? -1.5f : 1.5f)
                                   : (i % 3 ? 0.0f : -0.0f);
            dz[i * M + j] = v;
        }
}

/* dW = alpha x^T dz (+ beta C) and y = alpha x w (+ beta C), float32 C
 * starting from c0 */
static void gemms(const uint16_t *x, const uint16_t *dz, const uint16_t *w, int64_t k, float alpha,
                  float beta, const float *c0, float *dw, float *y)
{
    memcpy(dw, c0, (size_t)N * M * sizeof(float));
    memcpy(y, c0, (size_t)k * W * sizeof(float));
    mp_gemm_args g = mp_gemm_args_default();
    g.trans_a = true, g.m = N, g.n = M, g.k = k, g.alpha = alpha, g.beta = beta;
    g.a = x, g.a_type = MP_BF16, g.lda = N;
    g.b = dz, g.b_type = MP_BF16, g.ldb = M;
    g.c = dw, g.c_type = MP_F32, g.ldc = M;
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
    g = mp_gemm_args_default();
    g.m = k, g.n = W, g.k = N, g.alpha = alpha, g.beta = beta;
    g.a = x, g.a_type = MP_BF16, g.lda = N;
    g.b = w, g.b_type = MP_BF16, g.ldb = W;
    g.c = y, g.c_type = MP_F32, g.ldc = W;
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
}

static void test_zero_signs_leave_gemm_bits(void **state)
{
    (void)state;
    const int64_t ks[] = {6, 1500}; /* one depth block, and several */
    const float alphas[] = {1.0f, 0.3f}, betas[] = {0.0f, 1.0f};
    mp_isa isas[MP_ISA_COUNT];
    int nisa = test_isas(isas);
    test_rng r = {9};
    for (int kk = 0; kk < 2; kk++) {
        int64_t k = ks[kk];
        size_t nx = (size_t)k * N, ny = (size_t)k * W;
        float *x = malloc(nx * 4), *dz = malloc((size_t)k * M * 4), *w = malloc(N * W * 4);
        float *c0 = malloc((ny > N * M ? ny : N * M) * 4), *out[4];
        uint8_t *codes = malloc(nx), *plain = malloc(nx);
        uint16_t *xs = malloc(nx * 2), *xp = malloc(nx * 2), *dzb = malloc((size_t)k * M * 2),
                 *wb = malloc(N * W * 2);
        for (int i = 0; i < 4; i++) out[i] = malloc((ny > N * M ? ny : N * M) * 4);
        make_x(x, k, &r);
        make_dz(dz, k, &r);
        for (int i = 0; i < N * W; i++) w[i] = (float)test_rng_uniform(&r, -1, 1);
        for (size_t i = 0; i < (ny > N * M ? ny : N * M); i++) /* beta C: zeros of both signs too */
            c0[i] = i % 3 == 0 ? 0.0f : i % 3 == 1 ? -0.0f : (float)test_rng_uniform(&r, -1, 1);
        mp_convert(dzb, MP_BF16, dz, MP_F32, (size_t)k * M);
        mp_convert(wb, MP_BF16, w, MP_F32, N * W);
        mp_convert(xp, MP_BF16, x, MP_F32, nx); /* x in bfloat16, then its operands */
        mp_convert(x, MP_F32, xp, MP_BF16, nx);
        signed_codes(MP_F8E4M3, x, MP_F32, nx, 1.0f, codes, xs);
        mp_float8_quantize_bf16(plain, xp, MP_F8E4M3, x, MP_F32, nx, 1.0f);
        size_t differ = 0;
        for (size_t i = 0; i < nx; i++) differ += xs[i] != xp[i];
        assert_true(differ > nx / 8); /* many zeros changed sign */
        for (int p = 0; p < nisa; p++) {
            assert_int_equal(mp_isa_set(isas[p]), MP_OK);
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 2; b++) {
                    gemms(xp, dzb, wb, k, alphas[a], betas[b], c0, out[0], out[1]);
                    gemms(xs, dzb, wb, k, alphas[a], betas[b], c0, out[2], out[3]);
                    assert_memory_equal(out[0], out[2], (size_t)N * M * 4);
                    assert_memory_equal(out[1], out[3], ny * 4);
                    /* sums exactly zero were there (columns of zeros; cancelling) */
                    size_t zeros = 0;
                    for (int i = 0; i < N * M; i++) zeros += out[0][i] == 0.0f;
                    if (b == 0) assert_true(zeros >= (size_t)N * M / 3);
                }
        }
        mp_isa_reset();
        free(x), free(dz), free(w), free(c0), free(codes), free(plain), free(xs), free(xp);
        free(dzb), free(wb);
        for (int i = 0; i < 4; i++) free(out[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codes_carry_sign),
        cmocka_unit_test(test_zero_signs_leave_gemm_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
