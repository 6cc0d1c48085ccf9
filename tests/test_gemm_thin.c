/* test_gemm_thin.c - products with few rows of C, where the float32 kernel
 * reads B where it lies instead of packing it (gemm.c's b_in_place: C of
 * at most two panels of rows, B laid out along n). Each element of C is the
 * same sum in the same order whatever the path, so the rows of such a
 * product must equal, bit for bit, the same rows computed inside a taller
 * product (B packed): full panels, a last partial panel, two depth blocks
 * (chained partial sums), the epilogue (alpha, beta, bias, relu), padded
 * rows, one thread and two, on every ISA path. The thin C computed as C^T
 * (fc3's weight gradient, x^T dz, 4096x10x1024) is checked against a
 * float64 reference with the accumulation bound. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static void rows_equal_taller(int64_t m, int64_t n, int64_t k, int64_t ldb, int threads)
{
    const int64_t tall = 40; /* five panels of rows: B packed */
    float *a = malloc((size_t)(tall * k) * 4), *b = malloc((size_t)(k * ldb) * 4);
    float *bias = malloc((size_t)n * 4), *c_tall = malloc((size_t)(tall * n) * 4);
    float *c = malloc((size_t)(m * n) * 4);
    test_fill(a, (size_t)(tall * k), 21, -1, 1);
    test_fill(b, (size_t)(k * ldb), 22, -1, 1);
    test_fill(bias, (size_t)n, 23, -1, 1);
    test_fill(c_tall, (size_t)(tall * n), 24, -1, 1);
    memcpy(c, c_tall, (size_t)(m * n) * 4);
    mp_gemm_args g = mp_gemm_args_default();
    g.n = n;
    g.k = k;
    g.alpha = 0.75f;
    g.beta = -0.5f;
    g.a = a;
    g.lda = k;
    g.b = b;
    g.ldb = ldb;
    g.ldc = n;
    g.bias = bias;
    g.activation = MP_ACT_RELU;
    mp_set_num_threads(threads);
    g.m = tall;
    g.c = c_tall;
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
    g.m = m;
    g.c = c;
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
    for (int64_t i = 0; i < m * n; i++)
        if (f32_bits(c[i]) != f32_bits(c_tall[i]))
            fail_msg("%s m=%lld n=%lld k=%lld ldb=%lld t%d: C[%lld] %.9g, taller product %.9g",
                     mp_isa_name(mp_isa_active()), (long long)m, (long long)n, (long long)k,
                     (long long)ldb, threads, (long long)i, (double)c[i], (double)c_tall[i]);
    free(a);
    free(b);
    free(bias);
    free(c_tall);
    free(c);
}

static void test_few_rows_equal_packed(void **state)
{
    (void)state;
    mp_isa isas[MP_ISA_COUNT];
    int ni = test_isas(isas);
    mp_isa saved = mp_isa_active();
    const int64_t shapes[][4] = {
        /* m, n, k, ldb */
        {1, 100, 33, 100},   /* a batch of one: two full panels and 4 columns */
        {9, 96, 1500, 96},   /* two depth blocks, full panels only */
        {16, 200, 70, 211},  /* two panels of rows, padded B rows */
        {10, 4096, 64, 4096} /* fc3's weight gradient's C^T, short */
    };
    for (int ii = 0; ii < ni; ii++) {
        assert_int_equal(mp_isa_set(isas[ii]), MP_OK);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int t = 1; t <= 2; t++)
                rows_equal_taller(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], t);
    }
    mp_isa_set(saved);
    mp_set_num_threads(0);
}

/* dW = x^T dz with 10 columns (computed as dz^T x, x read in place), every
 * element within gamma_k sum|x||dz| of the float64 dot product (Higham,
 * Thm 3.1: one float32 FMA chain of length k per element). */
static void test_thin_weight_gradient(void **state)
{
    (void)state;
    const int64_t in = 300, units = 10, rows = 1100; /* two depth blocks */
    float *x = malloc((size_t)(rows * in) * 4), *dz = malloc((size_t)(rows * units) * 4);
    float *dw = malloc((size_t)(in * units) * 4);
    test_fill(x, (size_t)(rows * in), 31, -1, 1);
    test_fill(dz, (size_t)(rows * units), 32, -1, 1);
    mp_isa isas[MP_ISA_COUNT];
    int ni = test_isas(isas);
    mp_isa saved = mp_isa_active();
    const double u = 0x1p-24, gamma = rows * u / (1 - rows * u);
    for (int ii = 0; ii < ni; ii++) {
        assert_int_equal(mp_isa_set(isas[ii]), MP_OK);
        mp_gemm(true, false, in, units, rows, 1.0f, x, MP_F32, in, dz, MP_F32, units, 0.0f, dw,
                MP_F32, units);
        for (int64_t i = 0; i < in; i++)
            for (int64_t j = 0; j < units; j++) {
                double dot = 0, s = 0;
                for (int64_t p = 0; p < rows; p++) {
                    double t = (double)x[p * in + i] * (double)dz[p * units + j];
                    dot += t;
                    s += fabs(t);
                }
                if (!(fabs(dw[i * units + j] - dot) <= gamma * s))
                    fail_msg("%s dW[%lld,%lld] = %.9g, want %.9g (tol %.3g)",
                             mp_isa_name(mp_isa_active()), (long long)i, (long long)j,
                             (double)dw[i * units + j], dot, gamma * s);
            }
    }
    mp_isa_set(saved);
    free(x);
    free(dz);
    free(dw);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_few_rows_equal_packed),
        cmocka_unit_test(test_thin_weight_gradient),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
