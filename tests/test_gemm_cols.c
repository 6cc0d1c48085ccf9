/* test_gemm_cols.c - products with few columns of C and many rows (a
 * classifier's logits for a batch), which the AVX-512 float32 path runs on
 * its column kernel (gemm_cols.c, gemm_col_avx512.c: A's 16 x 16 blocks
 * transposed in registers). Each element of C is the same sum in the same
 * order whatever the path, so the columns of such a product must equal,
 * bit for bit, the same columns computed inside a wider product (the
 * register tiles): a last partial block of rows, depths not a multiple of
 * 16 and past a depth block, A in float32, bfloat16, float16 and float8
 * (widened as loaded), B along n and along k, the epilogue (alpha, beta, bias,
 * relu) and none, one thread and two, on every ISA path. Against a float64
 * reference with the accumulation bound, and C's non-finite flag. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* C (m x n) and the first n columns of the m x 64 product with the same A
 * and a B whose first n columns are the thin one's: the same bits. */
static void cols_equal_wider(int64_t m, int64_t n, int64_t k, mp_dtype at, bool tb, bool epilogue,
                             int threads)
{
    enum { WIDE = 64 };
    float *a = malloc((size_t)(m * k) * 4), *bw = malloc((size_t)(k * WIDE) * 4);
    float *b = malloc((size_t)(k * n) * 4), *bias = malloc(WIDE * 4);
    float *cw = malloc((size_t)(m * WIDE) * 4), *c = malloc((size_t)(m * n) * 4);
    void *a_t = malloc((size_t)(m * k) * 4);
    test_fill(a, (size_t)(m * k), 31, -1, 1);
    test_fill(bw, (size_t)(k * WIDE), 32, -1, 1);
    test_fill(bias, WIDE, 33, -1, 1);
    test_fill(cw, (size_t)(m * WIDE), 34, -1, 1);
    mp_convert(a_t, at, a, MP_F32, (size_t)(m * k));
    /* B stored k x n (along n) or n x k (along k: op(B) = B^T) */
    for (int64_t d = 0; d < k; d++)
        for (int64_t j = 0; j < n; j++) b[tb ? j * k + d : d * n + j] = bw[d * WIDE + j];
    float *bwt = malloc((size_t)(k * WIDE) * 4);
    for (int64_t d = 0; d < k; d++)
        for (int64_t j = 0; j < WIDE; j++) bwt[j * k + d] = bw[d * WIDE + j];
    for (int64_t i = 0; i < m; i++) memcpy(c + i * n, cw + i * WIDE, (size_t)n * 4);
    mp_set_num_threads(threads);
    mp_gemm_args g = mp_gemm_args_default();
    g.trans_b = tb;
    g.m = m;
    g.k = k;
    g.a = a_t;
    g.a_type = at;
    g.lda = k;
    if (epilogue) {
        g.alpha = 0.75f;
        g.beta = -0.5f;
        g.bias = bias;
        g.activation = MP_ACT_RELU;
    }
    g.n = WIDE;
    g.b = tb ? bwt : bw;
    g.ldb = tb ? k : WIDE;
    g.c = cw;
    g.ldc = WIDE;
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
    g.n = n;
    g.b = b;
    g.ldb = tb ? k : n;
    g.c = c;
    g.ldc = n;
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            if (f32_bits(c[i * n + j]) != f32_bits(cw[i * WIDE + j]))
                fail_msg("%s %s m=%lld n=%lld k=%lld tb=%d epilogue=%d t%d: C(%lld,%lld) %.9g, "
                         "inside a wider product %.9g",
                         mp_isa_name(mp_isa_active()), mp_dtype_name(at), (long long)m,
                         (long long)n, (long long)k, tb, epilogue, threads, (long long)i,
                         (long long)j, (double)c[i * n + j], (double)cw[i * WIDE + j]);
    free(a);
    free(a_t);
    free(b);
    free(bw);
    free(bwt);
    free(bias);
    free(c);
    free(cw);
}

static void test_cols_equal_wider(void **state)
{
    (void)state;
    const int64_t shapes[][3] = {
        /* m, n, k: a whole block, partial blocks of rows, depths with a
         * tail, past the tiles' depth block (1024), one column, the most,
         * and one too shallow for the column kernel */
        {16, 10, 128}, {37, 10, 100}, {300, 10, 1100}, {33, 1, 257},
        {17, 7, 96},   {64, 12, 200}, {50, 11, 99},    {40, 10, 64},
    };
    const mp_dtype types[4] = {MP_F32, MP_BF16, MP_F16, MP_F8E4M3};
    mp_isa isas[MP_ISA_COUNT];
    const int ni = test_isas(isas);
    const mp_isa saved = mp_isa_active();
    for (int ii = 0; ii < ni; ii++) {
        assert_int_equal(mp_isa_set(isas[ii]), MP_OK);
        for (int t = 1; t <= 2; t++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (int ty = 0; ty < 4; ty++)
                    for (int tb = 0; tb <= 1; tb++)
                        cols_equal_wider(shapes[s][0], shapes[s][1], shapes[s][2], types[ty], tb,
                                         (s + (size_t)ty + (size_t)tb) % 2 == 0, t);
    }
    mp_isa_set(saved);
    mp_set_num_threads(0);
}

/* fc3's forward at a smaller batch against float64: each element within
 * gamma_k sum |a| |b| (k FMAs, each one rounding), u = 2^-24. */
static void test_cols_reference(void **state)
{
    (void)state;
    const int64_t m = 200, n = 10, k = 3000;
    float *a = malloc((size_t)(m * k) * 4), *b = malloc((size_t)(k * n) * 4);
    float *c = malloc((size_t)(m * n) * 4);
    test_fill(a, (size_t)(m * k), 41, -1, 1);
    test_fill(b, (size_t)(k * n), 42, -1, 1);
    mp_gemm(false, false, m, n, k, 1.0f, a, MP_F32, k, b, MP_F32, n, 0.0f, c, MP_F32, n);
    const double u = 0x1p-24, gamma = (double)k * u / (1.0 - (double)k * u);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (int64_t d = 0; d < k; d++) {
                ref += (double)a[i * k + d] * (double)b[d * n + j];
                mag += fabs((double)a[i * k + d] * (double)b[d * n + j]);
            }
            if (fabs((double)c[i * n + j] - ref) > gamma * mag)
                fail_msg("C(%lld,%lld) %.9g, float64 %.17g, bound %.3g", (long long)i, (long long)j,
                         (double)c[i * n + j], ref, gamma * mag);
        }
    free(a);
    free(b);
    free(c);
}

/* A sum that overflows raises mp_gemm_args.c_nonfinite; none, it stays
 * clear. */
static void test_cols_nonfinite(void **state)
{
    (void)state;
    const int64_t m = 40, n = 10, k = 96;
    float *a = malloc((size_t)(m * k) * 4), *b = malloc((size_t)(k * n) * 4);
    float *c = malloc((size_t)(m * n) * 4);
    test_fill(a, (size_t)(m * k), 51, -1, 1);
    test_fill(b, (size_t)(k * n), 52, -1, 1);
    for (int t = 1; t <= 2; t++) {
        mp_set_num_threads(t);
        bool bad = false; /* set when C is not finite, else left as it was */
        mp_gemm_args g = mp_gemm_args_default();
        g.m = m;
        g.n = n;
        g.k = k;
        g.a = a;
        g.lda = k;
        g.b = b;
        g.ldb = n;
        g.c = c;
        g.ldc = n;
        g.c_nonfinite = &bad;
        assert_int_equal(mp_gemm_ex(&g), MP_OK);
        assert_false(bad);
        for (int64_t d = 0; d < k; d++) a[37 * k + d] = 3e38f; /* the last, partial block */
        for (int64_t d = 0; d < k; d++) b[d * n + 4] = 1.0f;
        assert_int_equal(mp_gemm_ex(&g), MP_OK);
        assert_true(bad);
        assert_true(isinf(c[37 * n + 4]));
        test_fill(a, (size_t)(m * k), 51, -1, 1);
    }
    mp_set_num_threads(0);
    free(a);
    free(b);
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cols_equal_wider),
        cmocka_unit_test(test_cols_reference),
        cmocka_unit_test(test_cols_nonfinite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
