/* test_gemm_stream.c - the float32 kernels' two ways (gemm_ways.h), which
 * one process times and picks: as loaded, A read in place where it can
 * be; and A packed, the AVX-512 kernel then also asking for its panels'
 * rows ahead (streaming). Each element of C is the same float32 FMA chain
 * over k in the same order either way, so the two must agree bit for bit,
 * on the AVX-512 and the AVX2 kernel where the CPU runs them: A along rows
 * and along columns (read in place as loaded), B along either axis, two
 * depth blocks (partial sums chained in C), partial panels, the epilogue
 * (alpha, beta, bias, relu), a B too narrow for the second way to pack A,
 * one thread and two. Both are also held to the float64 product within
 * gamma_k sum|a||b| (Higham, Thm 3.1: one chain of length k, then alpha,
 * beta and the bias each rounded once: 3 more units of roundoff on the
 * result). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/gemm_internal.h"

#if MP_X86
typedef struct {
    int64_t m, n, k;
    bool ta, tb;
} shape;

/* A kernel with two ways, the path that runs it and its test hook. */
typedef struct {
    mp_isa isa;
    const gemm_impl *im;
    void (*force)(int on);
} two_ways;

static const two_ways kernels[] = {
    {MP_ISA_AVX512, &mp_gemm_avx512_impl, mp_gemm_avx512_stream_force},
    {MP_ISA_AVX2, &mp_gemm_avx2_impl, mp_gemm_avx2_pack_force},
};

/* C = relu(0.75 op(A) op(B) - 0.5 C + bias) with way 1 forced `on`. */
static float *product(const two_ways *w, const shape *s, const float *a, const float *b,
                      const float *c0, const float *bias, int on, int threads)
{
    float *c = malloc((size_t)(s->m * s->n) * 4);
    memcpy(c, c0, (size_t)(s->m * s->n) * 4);
    w->force(on);
    assert_int_equal(w->im->streams(), on);
    mp_set_num_threads(threads);
    mp_gemm_args g = mp_gemm_args_default();
    g.trans_a = s->ta;
    g.trans_b = s->tb;
    g.m = s->m;
    g.n = s->n;
    g.k = s->k;
    g.alpha = 0.75f;
    g.beta = -0.5f;
    g.a = a;
    g.lda = s->ta ? s->m : s->k;
    g.b = b;
    g.ldb = s->tb ? s->k : s->n;
    g.c = c;
    g.ldc = s->n;
    g.bias = bias;
    g.activation = MP_ACT_RELU;
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
    return c;
}

static void check_reference(const shape *s, const float *a, const float *b, const float *c0,
                            const float *bias, const float *c, int on)
{
    const double u = 0x1p-24, gamma = (double)(s->k + 3) * u / (1 - (double)(s->k + 3) * u);
    for (int64_t i = 0; i < s->m; i++)
        for (int64_t j = 0; j < s->n; j++) {
            double dot = 0, mag = 0;
            for (int64_t p = 0; p < s->k; p++) {
                const double x = s->ta ? a[p * s->m + i] : a[i * s->k + p];
                const double y = s->tb ? b[j * s->k + p] : b[p * s->n + j];
                dot += x * y;
                mag += fabs(x * y);
            }
            const double pre = 0.75 * dot - 0.5 * (double)c0[i * s->n + j] + (double)bias[j];
            const double want = pre > 0 ? pre : 0;
            const double tol =
                gamma * (0.75 * mag + 0.5 * fabs((double)c0[i * s->n + j]) + fabs((double)bias[j]));
            if (!(fabs((double)c[i * s->n + j] - want) <= tol))
                fail_msg("%s way %d %lldx%lldx%lld ta%d tb%d: C[%lld,%lld] = %.9g, want %.9g "
                         "(tol %.3g)",
                         mp_isa_name(mp_isa_active()), on, (long long)s->m, (long long)s->n,
                         (long long)s->k, s->ta, s->tb, (long long)i, (long long)j,
                         (double)c[i * s->n + j], want, tol);
        }
}

static void same_bits(const two_ways *w)
{
    mp_isa saved = mp_isa_active();
    assert_int_equal(mp_isa_set(w->isa), MP_OK);
    const shape shapes[] = {
        {72, 200, 300, false, false}, /* A along rows: read in place as loaded */
        {45, 150, 1500, false, true}, /* two depth blocks, partial panels, B^T */
        {64, 120, 200, true, false},  /* A^T: its columns read in place as loaded */
        {40, 90, 700, false, false},  /* B at most two panels wide (AVX-512): A in place */
        {200, 260, 50, true, true},
    };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *s = &shapes[si];
        float *a = malloc((size_t)(s->m * s->k) * 4), *b = malloc((size_t)(s->k * s->n) * 4);
        float *c0 = malloc((size_t)(s->m * s->n) * 4), *bias = malloc((size_t)s->n * 4);
        test_fill(a, (size_t)(s->m * s->k), 41 + si, -1, 1);
        test_fill(b, (size_t)(s->k * s->n), 51 + si, -1, 1);
        test_fill(c0, (size_t)(s->m * s->n), 61 + si, -1, 1);
        test_fill(bias, (size_t)s->n, 71 + si, -1, 1);
        for (int threads = 1; threads <= 2; threads++) {
            float *off = product(w, s, a, b, c0, bias, 0, threads);
            float *on = product(w, s, a, b, c0, bias, 1, threads);
            for (int64_t i = 0; i < s->m * s->n; i++)
                if (f32_bits(off[i]) != f32_bits(on[i]))
                    fail_msg("%s %lldx%lldx%lld ta%d tb%d t%d: C[%lld] way 0 %.9g, way 1 %.9g",
                             mp_isa_name(w->isa), (long long)s->m, (long long)s->n, (long long)s->k,
                             s->ta, s->tb, threads, (long long)i, (double)off[i], (double)on[i]);
            if (threads == 1) {
                check_reference(s, a, b, c0, bias, off, 0);
                check_reference(s, a, b, c0, bias, on, 1);
            }
            free(off);
            free(on);
        }
        free(a);
        free(b);
        free(c0);
        free(bias);
    }
    w->force(-1);
    mp_set_num_threads(0);
    mp_isa_set(saved);
}

static void test_stream_same_bits(void **state)
{
    (void)state;
    int ran = 0;
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        if (mp_isa_supported(kernels[i].isa)) {
            same_bits(&kernels[i]);
            ran++;
        }
    if (!ran) skip(); /* neither kernel on this CPU */
}
#else
static void test_stream_same_bits(void **state)
{
    (void)state;
    skip(); /* no x86 kernels */
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_same_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
