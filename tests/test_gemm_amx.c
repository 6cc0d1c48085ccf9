/* test_gemm_amx.c - the AMX tile path (gemm_amx.c). Its packers, which use
 * AVX-512 only and run wherever AVX512_BF16 does, against element-by-element
 * references, byte for byte: A row by row along k (laid along its rows, or
 * transposed through the pairs and a 16 x 16 word transpose, or strided),
 * B in bf16 pairs, both padded with zeros to whole tiles of depth (32) and
 * whole panels of rows. Where the OS grants the tiles: products over
 * several depth blocks (each padded, the last short) within gamma_{k+3}
 * sum |a b| of float64 (the tiles' sums are float32 sums of exact products
 * in an order of their own), the same bits on one thread and two, and with
 * A packed from its rows or its transpose, or read in place (a thin C). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/gemm_internal.h"

#if MP_X86

enum { DEPTH = 32, SUB = 32 }; /* a tile's depth, a B sub-panel's width */

static int64_t pad32(int64_t d) { return (d + DEPTH - 1) / DEPTH * DEPTH; }

/* An operand of type t, rows x cols values in [-1, 1), strides sw, sd. */
static void *operand(mp_dtype t, int64_t elems, uint64_t seed)
{
    float *f = malloc((size_t)elems * 4);
    void *x = malloc((size_t)elems * 2);
    test_fill(f, (size_t)elems, seed, -1, 1);
    mp_convert(x, t, f, MP_F32, (size_t)elems);
    free(f);
    return x;
}

/* A's panels (W = MR rows): element (w, d) of panel p at p * W * kpad + (w
 * % W) * kpad + d. */
static void check_pack_a(mp_dtype t, int64_t nw, int64_t nd, int64_t sw, int64_t sd, int64_t d0)
{
    const int64_t W = mp_gemm_amx_impl.mr;
    const int64_t span = (nw - 1) * sw + (d0 + nd - 1) * sd + 1, kpad = pad32(nd);
    const int64_t np = (nw + W - 1) / W, words = np * W * kpad;
    void *x = operand(t, span, (uint64_t)(nw * 7 + nd));
    const gemm_operand op = {x, t, sw, sd, NULL};
    uint16_t *got = malloc((size_t)words * 2), *want = malloc((size_t)words * 2);
    memset(got, 0xA5, (size_t)words * 2); /* padding must be written */
    for (int64_t r = 0; r < np * W; r++)
        for (int64_t d = 0; d < kpad; d++)
            want[r * kpad + d] =
                r < nw && d < nd ? mp_gemm_load_bf16(x, t, r * sw + (d0 + d) * sd) : 0;
    mp_gemm_amx_impl.pack_a(&op, 0, nw, d0, nd, (int)W, got);
    for (int64_t i = 0; i < words; i++)
        if (got[i] != want[i])
            fail_msg("A %s %lldx%lld sw %lld sd %lld: word %lld (row %lld, depth %lld) %04x, "
                     "want %04x",
                     mp_dtype_name(t), (long long)nw, (long long)nd, (long long)sw, (long long)sd,
                     (long long)i, (long long)(i / kpad), (long long)(i % kpad), got[i], want[i]);
    free(x);
    free(got);
    free(want);
}

/* B's panels (W = NR columns), each of sub-panels of SUB columns one after
 * the other: pair p of column w at (w / SUB * kpad / 2 + p) * 2 SUB + 2 (w %
 * SUB). */
static void check_pack_b(mp_dtype t, int64_t nw, int64_t nd, int64_t sw, int64_t sd)
{
    const int64_t W = mp_gemm_amx_impl.nr;
    const int64_t span = (nw - 1) * sw + (nd - 1) * sd + 1, kpad = pad32(nd);
    const int64_t np = (nw + W - 1) / W, words = np * W * kpad;
    void *x = operand(t, span, (uint64_t)(nw * 5 + nd));
    const gemm_operand op = {x, t, sw, sd, NULL};
    uint16_t *got = malloc((size_t)words * 2), *want = malloc((size_t)words * 2);
    memset(got, 0xA5, (size_t)words * 2);
    for (int64_t w = 0; w < np * W; w++)
        for (int64_t d = 0; d < kpad; d++)
            want[(w / SUB * kpad / 2 + d / 2) * 2 * SUB + 2 * (w % SUB) + (d & 1)] =
                w < nw && d < nd ? mp_gemm_load_bf16(x, t, w * sw + d * sd) : 0;
    mp_gemm_amx_impl.pack(&op, 0, nw, 0, nd, (int)W, got);
    for (int64_t i = 0; i < words; i++)
        if (got[i] != want[i])
            fail_msg("B %s %lldx%lld sw %lld sd %lld: word %lld %04x, want %04x", mp_dtype_name(t),
                     (long long)nw, (long long)nd, (long long)sw, (long long)sd, (long long)i,
                     got[i], want[i]);
    free(x);
    free(got);
    free(want);
}

static void test_amx_packers(void **state)
{
    (void)state;
    if (!mp_isa_supported(MP_ISA_AVX512BF16)) skip();
    const mp_dtype types[3] = {MP_BF16, MP_F8E4M3, MP_F8E5M2};
    for (int ti = 0; ti < 3; ti++) {
        const mp_dtype t = types[ti];
        /* along rows (a tile's rows), a partial panel and depth */
        check_pack_a(t, 45, 70, 81, 1, 0);
        check_pack_a(t, 32, 64, 64, 1, 3);
        /* transposed (x^T of a weight gradient), one depth tile and several */
        check_pack_a(t, 45, 70, 1, 50, 0);
        check_pack_a(t, 64, 31, 1, 64, 2);
        check_pack_a(t, 7, 100, 1, 9, 0);
        /* neither stride 1 */
        check_pack_a(t, 33, 40, 3, 120, 0);
        /* B along n (a weight), transposed (B^T), strided; partial panels */
        check_pack_b(t, 45, 70, 1, 50);
        check_pack_b(t, 300, 33, 1, 300);
        check_pack_b(t, 140, 70, 75, 1);
        check_pack_b(t, 17, 9, 3, 60);
    }
}

/* C = A B (bf16, m x n x k, A transposed when ta) with `threads` threads on
 * the tiles. */
static float *product(const uint16_t *a, const uint16_t *b, int64_t m, int64_t n, int64_t k,
                      bool ta, int threads)
{
    float *c = malloc((size_t)(m * n) * 4);
    mp_gemm_args g = mp_gemm_args_default();
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = a;
    g.a_type = MP_BF16;
    g.trans_a = ta;
    g.lda = ta ? m : k;
    g.b = b;
    g.b_type = MP_BF16;
    g.ldb = n;
    g.c = c;
    g.ldc = n;
    mp_set_num_threads(threads);
    assert_int_equal(mp_gemm_ex_on(&mp_gemm_amx_impl, &g), MP_OK);
    mp_set_num_threads(0);
    return c;
}

static void deep_case(int64_t m, int64_t n, int64_t k)
{
    uint16_t *a = operand(MP_BF16, m * k, 11), *b = operand(MP_BF16, k * n, 12);
    float *fa = malloc((size_t)(m * k) * 4), *fb = malloc((size_t)(k * n) * 4);
    mp_convert(fa, MP_F32, a, MP_BF16, (size_t)(m * k));
    mp_convert(fb, MP_F32, b, MP_BF16, (size_t)(k * n));
    float *c1 = product(a, b, m, n, k, false, 1), *c2 = product(a, b, m, n, k, false, 2);
    /* the bf16 products are exact in float32 and double; the tiles add them
     * in float32, at most k roundings per element whatever their order (the
     * padding's zeros add exactly, the chained partial sums are stored as
     * they are): gamma_{k+1} */
    test_gemm_ref ref = {fa, fb, NULL, m, n, k, n, 1, false, 0, 1.0};
    assert_true(test_gemm_worst(&ref, c1, MP_F32) <= 1.0);
    assert_memory_equal(c1, c2, (size_t)(m * n) * 4);
    /* A transposed: packed row by row from its columns, the same panels */
    uint16_t *at = malloc((size_t)(m * k) * 2);
    for (int64_t i = 0; i < m; i++)
        for (int64_t p = 0; p < k; p++) at[p * m + i] = a[i * k + p];
    float *ct = product(at, b, m, n, k, true, 2);
    assert_memory_equal(c1, ct, (size_t)(m * n) * 4);
    free(a);
    free(b);
    free(fa);
    free(fb);
    free(c1);
    free(c2);
    free(at);
    free(ct);
}

static void test_amx_deep_products(void **state)
{
    (void)state;
    if (!mp_isa_supported(MP_ISA_AMX)) skip();
    deep_case(70, 300, 8500); /* three depth blocks, the last padded */
    deep_case(96, 130, 300);  /* one block, depth chunks, a 2-column last panel */
    deep_case(33, 17, 45);    /* one short block, partial panels both ways */
    deep_case(100, 40, 1024); /* one B panel, k whole tiles: A read in place */
}

#else

static void test_amx_packers(void **state)
{
    (void)state;
    skip();
}

static void test_amx_deep_products(void **state)
{
    (void)state;
    skip();
}

#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_amx_packers),
        cmocka_unit_test(test_amx_deep_products),
    };
    return cmocka_run_group_tests_name("gemm_amx", tests, NULL, NULL);
}
