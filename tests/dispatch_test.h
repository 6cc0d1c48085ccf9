/* dispatch_test.h - what test_dispatch.c and test_dispatch_cache.c share:
 * the candidates (this CPU's own first two where it has two or more kernels
 * for bf16 operands, else the portable and AVX2 kernels substituted), a scratch
 * directory, a fresh choice with injected rates, and which kernel mp_gemm
 * runs. Included once per test program. */
#ifndef MP_DISPATCH_TEST_H
#define MP_DISPATCH_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "kernels/gemm_internal.h"

static char dir[64];
static const gemm_impl *cands[MP_DISPATCH_MAX_KERNELS];
static int ncands;
static bool own_cands; /* the CPU's own (AVX-512) candidates, not substitutes */
static const gemm_impl *all[MP_DISPATCH_MAX_KERNELS]; /* all of this CPU's */
static int n_all;

static inline int setup(void **state)
{
    (void)state;
    /* The process starts on the library's own choice, whatever the caller's
     * environment said. */
    unsetenv("MP_ISA");
    mp_isa_reset();
    ncands = mp_gemm_dispatch_candidates(cands, MP_DISPATCH_MAX_KERNELS);
    own_cands = ncands >= 2;
    /* A CPU with three (AMX tiles besides vdpbf16ps and FMA) keeps them for
     * the tests that time them all (test_three_candidates); the choice's
     * logic and its cache are checked on the first two, whose injected
     * rates these tests spell out. */
    n_all = ncands;
    for (int i = 0; i < ncands; i++) all[i] = cands[i];
    if (ncands > 2) {
        mp_gemm_dispatch_test_candidates(cands, 2);
        ncands = 2;
    }
#if MP_X86
    /* A CPU with one kernel for bf16 operands (no AVX512_BF16) checks the
     * choice's logic on two it has: the portable kernel and AVX2's. */
    if (ncands < 2 && mp_isa_supported(MP_ISA_AVX2)) {
        const gemm_impl *two[2] = {&mp_gemm_scalar_impl, &mp_gemm_avx2_impl};
        mp_gemm_dispatch_test_candidates(two, 2);
        ncands = mp_gemm_dispatch_candidates(cands, MP_DISPATCH_MAX_KERNELS);
    }
#endif
    return test_scratch_dir(dir, sizeof dir, "mp_dispatch");
}

static inline int teardown(void **state)
{
    (void)state;
    mp_gemm_dispatch_test_candidates(NULL, 0);
    return test_remove_tree(dir);
}

/* A fresh choice on the next use, with the cache in `cache` ("0": off) and
 * the given rates for `rounds` rounds of timing (NULL: timed). */
static inline void fresh_rounds(const char *cache, const double *rates, int rounds)
{
    setenv("MP_DISPATCH_CACHE", cache, 1);
    mp_gemm_dispatch_test_rates(rates, rounds);
    mp_gemm_dispatch_reset();
}

/* The same, every round with the same rates. */
static inline void fresh(const char *cache, const double *rates) { fresh_rounds(cache, rates, 1); }

static inline mp_gemm_dispatch_info query(void)
{
    mp_gemm_dispatch_info in;
    assert_int_equal(mp_gemm_dispatch_query(MP_BF16, MP_BF16, &in), MP_OK);
    return in;
}

/* C = A B, k deep, for one row of A holding a bf16 subnormal: vdpbf16ps
 * and the AMX tiles read it as zero, the FMA route keeps it. The bits tell
 * which kind of kernel ran. */
static inline uint32_t signature_at(const gemm_impl *im, int64_t k)
{
    uint16_t a[64] = {0x0040 /* 2^-127 */, 0x3F80 /* 1 */}, b[64] = {0x3F80};
    assert_true(k >= 2 && k <= 64);
    float c = -1.0f;
    mp_gemm_args g = mp_gemm_args_default();
    g.m = g.n = 1;
    g.k = k;
    g.a = a;
    g.b = b;
    g.c = &c;
    g.a_type = g.b_type = MP_BF16;
    g.lda = k;
    g.ldb = g.ldc = 1;
    assert_int_equal(im ? mp_gemm_ex_on(im, &g) : mp_gemm_ex(&g), MP_OK);
    return f32_bits(c);
}

/* The same, deeper than any kernel leaves to another (gemm_impl.shallow_k). */
static inline uint32_t signature(const gemm_impl *im) { return signature_at(im, 64); }

/* mp_gemm on bf16 inputs runs kernel im. */
static inline void assert_runs(const gemm_impl *im)
{
    assert_ptr_equal(mp_gemm_impl_for(MP_BF16, MP_BF16), im);
    bool tell = true;
    for (int i = 0; i < ncands; i++)
        for (int j = 0; j < i; j++) tell = tell && signature(cands[i]) != signature(cands[j]);
    if (tell) assert_int_equal(signature(NULL), signature(im));
}

static inline char *slurp(const char *path, size_t *n)
{
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 16);
    *n = fread(buf, 1, (1 << 16) - 1, f);
    fclose(f);
    return buf;
}

static inline double gamma_n(double n)
{
    const double u = 0x1p-24;
    return n * u / (1.0 - n * u);
}

/* C = op(A) op(B) on kernel im (NULL: the driver's choice) against a float64
 * reference on the same rounded inputs: within gamma_{k+3} sum |a||b| plus
 * the final rounding, the bound test_gemm.c derives. */
static inline void check_bound(const gemm_impl *im, mp_dtype at, mp_dtype bt, bool ta, bool tb,
                               int64_t m, int64_t n, int64_t k, uint64_t seed)
{
    test_rng r = {seed};
    const int64_t na = m * k, nb = k * n;
    float *fa = malloc((size_t)na * 4), *fb = malloc((size_t)nb * 4),
          *c = malloc((size_t)(m * n) * 4);
    void *a = malloc((size_t)na * 2), *b = malloc((size_t)nb * 2);
    for (int64_t i = 0; i < na; i++) fa[i] = (float)test_rng_uniform(&r, -1, 1);
    for (int64_t i = 0; i < nb; i++) fb[i] = (float)test_rng_uniform(&r, -1, 1);
    mp_convert(a, at, fa, MP_F32, (size_t)na);
    mp_convert(b, bt, fb, MP_F32, (size_t)nb);
    mp_convert(fa, MP_F32, a, at, (size_t)na);
    mp_convert(fb, MP_F32, b, bt, (size_t)nb);
    mp_gemm_args g = mp_gemm_args_default();
    g.trans_a = ta;
    g.trans_b = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = a;
    g.a_type = at;
    g.lda = ta ? m : k;
    g.b = b;
    g.b_type = bt;
    g.ldb = tb ? k : n;
    g.c = c;
    g.ldc = n;
    assert_int_equal(im ? mp_gemm_ex_on(im, &g) : mp_gemm_ex(&g), MP_OK);
    int bad = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double dot = 0, s = 0;
            for (int64_t p = 0; p < k; p++) {
                double x = ta ? fa[p * m + i] : fa[i * k + p];
                double y = tb ? fb[j * k + p] : fb[p * n + j];
                dot += x * y;
                s += fabs(x * y);
            }
            double tol = gamma_n((double)k + 3.0) * s;
            tol += 0x1p-24 * (fabs(dot) + tol) * 1.0001;
            if (!(fabs((double)c[i * n + j] - dot) <= tol) && bad++ < 5)
                print_error("  C[%lld,%lld] = %.9g, want %.9g (tol %.3g)\n", (long long)i,
                            (long long)j, (double)c[i * n + j], dot, tol);
        }
    free(fa);
    free(fb);
    free(c);
    free(a);
    free(b);
    if (bad) fail_msg("%d elements outside the bound", bad);
}

#endif
