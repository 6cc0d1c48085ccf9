/* test_gemm_rows.c - products whose C has one or two rows, which the driver
 * runs as one pass of each row of A over B's rows where they lie
 * (gemm_rows.c, on a kernel with kernel_row: a decoder's step, a batch of
 * one). Each element is the sum the register tiles give it, in the same
 * order, so the rows must equal, bit for bit, the same rows computed inside
 * a taller product (tiles, B packed): A float32 along rows (read in place),
 * bfloat16 or float16 (widened first) or transposed (gathered along its
 * stride); B float32, bfloat16, float16 or float8, rows padded; n with a
 * 64-column pass, 8-column vectors and single columns; C written directly or
 * through the epilogue (alpha, beta, bias, GELU, a bfloat16 or float16 C);
 * one thread and two, B big enough that two split its columns. On the path
 * that takes them the rows path must be the one run (else the equality
 * proves nothing). The results are within gamma_k sum |a b| of float64
 * (one float32 FMA chain of length k per element), and a non-finite value in C raises c_nonfinite,
 * which stays down otherwise. How far ahead the kernels ask for B's rows (mp_gemm_rows_ahead: a gcd
 * for the L1 sets the rows' lines fall into) is checked against counting those sets. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/gemm_internal.h"

typedef struct {
    int64_t m, n, k, ldb;
    bool ta;             /* A stored transposed: its rows strided */
    mp_dtype at, bt, ct; /* A, B, C types */
    bool plain;          /* alpha 1, beta 0, no bias, no activation: C written directly */
} rows_case;

enum { TALL = 40 }; /* five panels of rows on every kernel: the tiles */

/* Whether the driver takes a product of this case's operands by rows on
 * the active path (the operands as gemm_api.c describes them). */
static bool takes_rows(const rows_case *r, int64_t m, const void *a, int64_t lda, const void *b)
{
    const gemm_operand ao = {a, r->at, r->ta ? 1 : lda, r->ta ? lda : 1, NULL};
    const gemm_operand bo = {b, r->bt, 1, r->ldb, NULL};
    const gemm_epilogue e = {.alpha = 1.0f, .c_type = r->ct};
    return mp_gemm_rows_take(mp_gemm_impl_for(r->at, r->bt), m, r->n, r->k, &ao, &bo, &e);
}

static void *typed(const float *x, size_t n, mp_dtype t)
{
    void *p = malloc(n * mp_dtype_size(t));
    mp_convert(p, t, x, MP_F32, n);
    return p;
}

static void rows_equal_tiles(const rows_case *r, int threads, int *taken)
{
    const int64_t lda = r->ta ? TALL : r->k, na = TALL * r->k, nb = r->k * r->ldb;
    const size_t cs = mp_dtype_size(r->ct);
    float *af = malloc((size_t)na * 4), *bf = malloc((size_t)nb * 4);
    float *bias = malloc((size_t)r->n * 4), *c0 = malloc((size_t)(TALL * r->n) * 4);
    test_fill(af, (size_t)na, 31, -1, 1);
    test_fill(bf, (size_t)nb, 32, -1, 1);
    test_fill(bias, (size_t)r->n, 33, -1, 1);
    test_fill(c0, (size_t)(TALL * r->n), 34, -1, 1);
    void *a = typed(af, (size_t)na, r->at), *b = typed(bf, (size_t)nb, r->bt);
    void *tall = typed(c0, (size_t)(TALL * r->n), r->ct),
         *rows = typed(c0, (size_t)(r->m * r->n), r->ct);
    mp_gemm_args g = mp_gemm_args_default();
    g.trans_a = r->ta;
    g.n = r->n;
    g.k = r->k;
    g.a = a;
    g.a_type = r->at;
    g.lda = lda;
    g.b = b;
    g.b_type = r->bt;
    g.ldb = r->ldb;
    g.c_type = r->ct;
    g.ldc = r->n;
    if (!r->plain) {
        g.alpha = 0.75f;
        g.beta = -0.5f;
        g.bias = bias;
        g.activation = MP_ACT_GELU_TANH;
    }
    mp_set_num_threads(threads);
    assert_false(takes_rows(r, TALL, a, lda, b));
    /* every x86 path's kernels have a row kernel; B must be two of its
     * panels wide (48 columns a panel on AVX-512, 16 on AVX2, 128 on AMX) */
    const gemm_impl *im = mp_gemm_impl_for(r->at, r->bt);
    const bool rows_path = im->kernel_row && r->n >= 2 * im->nr;
    g.m = TALL;
    g.c = tall;
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
    assert_int_equal(takes_rows(r, r->m, a, lda, b), rows_path);
    *taken += rows_path;
    g.m = r->m;
    g.c = rows;
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
    if (memcmp(rows, tall, (size_t)(r->m * r->n) * cs)) {
        for (int64_t i = 0; i < r->m * r->n; i++) {
            float x, y;
            mp_convert(&x, MP_F32, (const char *)rows + i * (int64_t)cs, r->ct, 1);
            mp_convert(&y, MP_F32, (const char *)tall + i * (int64_t)cs, r->ct, 1);
            if (f32_bits(x) != f32_bits(y))
                fail_msg("%s %lldx%lldx%lld ldb %lld ta %d A %s B %s C %s plain %d t%d: C[%lld] "
                         "%.9g, inside the taller product %.9g",
                         mp_isa_name(mp_isa_active()), (long long)r->m, (long long)r->n,
                         (long long)r->k, (long long)r->ldb, r->ta, mp_dtype_name(r->at),
                         mp_dtype_name(r->bt), mp_dtype_name(r->ct), r->plain, threads,
                         (long long)i, (double)x, (double)y);
        }
    }
    free(af);
    free(bf);
    free(bias);
    free(c0);
    free(a);
    free(b);
    free(tall);
    free(rows);
}

static void test_rows_equal_tiles(void **state)
{
    (void)state;
    const rows_case cases[] = {
        /* m, n, k, ldb, ta, A, B, C, plain */
        {1, 1024, 256, 1024, false, MP_F32, MP_BF16, MP_F32, true},    /* a decoder's MLP */
        {1, 768, 256, 800, false, MP_F32, MP_BF16, MP_F32, false},     /* padded B rows */
        {2, 200, 33, 211, false, MP_F32, MP_F32, MP_F32, false},       /* 3 passes, 8s, ones */
        {1, 37, 1500, 37, false, MP_BF16, MP_BF16, MP_BF16, false},    /* vectors and ones */
        {1, 133, 1500, 133, false, MP_BF16, MP_BF16, MP_BF16, false},  /* the same, AVX-512 */
        {2, 200, 33, 211, false, MP_BF16, MP_BF16, MP_F32, false},     /* odd k: a zero pair */
        {1, 1000, 201, 1003, true, MP_F8E5M2, MP_BF16, MP_F32, true},  /* A strided, odd k */
        {2, 777, 64, 780, false, MP_BF16, MP_F8E5M2, MP_BF16, true},   /* bf16 A in place */
        {2, 100, 7, 100, true, MP_F32, MP_BF16, MP_F32, true},         /* A strided */
        {1, 130, 64, 130, false, MP_F16, MP_F32, MP_F32, false},       /* A widened */
        {2, 2048, 96, 2048, false, MP_BF16, MP_BF16, MP_BF16, false},  /* split in two */
        {1, 1000, 200, 1003, true, MP_BF16, MP_F32, MP_F32, true},     /* split, uneven */
        {1, 300, 40, 300, false, MP_F32, MP_F16, MP_F32, false},       /* B float16 */
        {2, 1024, 128, 1030, false, MP_BF16, MP_F16, MP_F16, true},    /* split, C float16 */
        {1, 300, 40, 300, false, MP_F8E4M3, MP_F8E4M3, MP_F32, false}, /* float8 */
        /* bf16 pairs over AMX's 128-column groups: whole, partial, k not
         * whole tiles of depth, padded rows */
        {1, 1024, 256, 1024, false, MP_BF16, MP_BF16, MP_F32, true},
        {2, 300, 70, 310, false, MP_BF16, MP_BF16, MP_BF16, false},
        {1, 257, 33, 260, true, MP_F8E5M2, MP_BF16, MP_F32, true},
        {2, 777, 200, 780, true, MP_F32, MP_F8E5M2, MP_BF16, true}, /* split, float8 */
    };
    mp_isa isas[MP_ISA_COUNT];
    const int ni = test_isas(isas);
    const mp_isa saved = mp_isa_active();
    for (int ii = 0; ii < ni; ii++) {
        assert_int_equal(mp_isa_set(isas[ii]), MP_OK);
        int taken = 0;
        for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++)
            for (int t = 1; t <= 2; t++) rows_equal_tiles(&cases[s], t, &taken);
        /* all but n = 37 on AVX-512, all but those under 2 x 128 columns
         * on AMX's bf16 and float8 pairs (and nothing on the scalar path) */
        if (isas[ii] != MP_ISA_SCALAR) assert_true(taken >= (isas[ii] == MP_ISA_AMX ? 26 : 30));
    }
    mp_isa_set(saved);
    mp_set_num_threads(0);
}

/* One row against float64 (test_gemm_worst), B bfloat16 and float32. */
static void test_rows_reference(void **state)
{
    (void)state;
    const int64_t n = 300, k = 1000;
    float *a = malloc((size_t)k * 4), *b = malloc((size_t)(k * n) * 4), *c = malloc((size_t)n * 4);
    test_fill(a, (size_t)k, 41, -1, 1);
    test_fill(b, (size_t)(k * n), 42, -1, 1);
    uint16_t *bh = typed(b, (size_t)(k * n), MP_BF16);
    mp_convert(b, MP_F32, bh, MP_BF16, (size_t)(k * n)); /* the values bfloat16 holds */
    const test_gemm_ref ref = {
        .a = a, .b = b, .m = 1, .n = n, .k = k, .bs_k = n, .bs_n = 1, .alpha = 1.0};
    for (int t = 1; t <= 2; t++) {
        mp_set_num_threads(t);
        mp_gemm(false, false, 1, n, k, 1.0f, a, MP_F32, k, bh, MP_BF16, n, 0.0f, c, MP_F32, n);
        assert_true(test_gemm_worst(&ref, c, MP_F32) <= 1.0);
        mp_gemm(false, false, 1, n, k, 1.0f, a, MP_F32, k, b, MP_F32, n, 0.0f, c, MP_F32, n);
        assert_true(test_gemm_worst(&ref, c, MP_F32) <= 1.0);
    }
    mp_set_num_threads(0);
    free(a);
    free(b);
    free(bh);
    free(c);
}

/* c_nonfinite: up for an infinity in one column of B (in a 64-column pass,
 * in the single columns), through C directly and through the epilogue;
 * down for finite data. */
static void test_rows_nonfinite(void **state)
{
    (void)state;
    const int64_t n = 203, k = 50;
    float a[50], *b = malloc((size_t)(k * n) * 4), *c = malloc((size_t)(2 * n) * 4);
    test_fill(a, (size_t)k, 51, -1, 1);
    const int64_t cols[] = {-1, 5, 200};
    for (size_t ci = 0; ci < sizeof cols / sizeof cols[0]; ci++)
        for (int plain = 0; plain <= 1; plain++)
            for (int t = 1; t <= 2; t++) {
                test_fill(b, (size_t)(k * n), 52, -1, 1);
                if (cols[ci] >= 0) b[7 * n + cols[ci]] = INFINITY;
                bool bad = false;
                mp_gemm_args g = mp_gemm_args_default();
                g.m = 1;
                g.n = n;
                g.k = k;
                g.a = a;
                g.lda = k;
                g.b = b;
                g.ldb = n;
                g.c = c;
                g.ldc = n;
                g.alpha = plain ? 1.0f : 0.5f;
                g.c_nonfinite = &bad;
                mp_set_num_threads(t);
                assert_int_equal(mp_gemm_ex(&g), MP_OK);
                assert_int_equal(bad, cols[ci] >= 0);
            }
    mp_set_num_threads(0);
    free(b);
    free(c);
}

/* mp_gemm_rows_ahead against the sets of a 64-set L1 (64-byte lines) that
 * rows sbb bytes apart fall into, counted over 4096 rows: a quarter of the
 * rows that fit (ways = L1d / 4 KiB, 8 where unknown), at most `most`. */
static void test_rows_ahead(void **state)
{
    (void)state;
    int64_t ways = (int64_t)(mp_cpu_cache_bytes(1) / 4096);
    ways = ways < 4 ? 8 : ways > 32 ? 32 : ways;
    const int64_t strides[] = {2,    40,   64,   128,  512,  1000,  1024,  1536,         2048,
                               3072, 4096, 4160, 6144, 8192, 12288, 24640, 4096 * 5 + 32};
    for (size_t i = 0; i < sizeof strides / sizeof *strides; i++)
        for (int most = 1; most <= 64; most *= 4) {
            bool seen[64] = {false};
            int64_t sets = 0;
            for (int64_t r = 0; r < 4096; r++) {
                const int64_t set = (r * strides[i] / 64) % 64;
                sets += !seen[set];
                seen[set] = true;
            }
            const int64_t fit = ways * sets, want = fit / 4 < most ? fit / 4 : most;
            assert_int_equal(mp_gemm_rows_ahead(strides[i], most), want);
        }
    /* the cases that set the rule, on an 8-way L1: rows 4 KiB apart, 2
     * ahead; fc3's weight gradient (rows 40 bytes apart), all 16 */
    if (ways == 8) assert_int_equal(mp_gemm_rows_ahead(4096, 16), 2);
    assert_int_equal(mp_gemm_rows_ahead(40, 16), 16);
}

/* Every fp8 byte through the rows path and the tiles: row 0 of B holds the
 * 256 bytes (twice, and 40 more: the 128-column groups and a short one),
 * row 1 ones, A's row (1, 0), so each element of C is its byte's value
 * plus zero, exactly (any NaN a NaN), as mp_e4m3_to_f32 / mp_e5m2_to_f32 give it. The
 * row kernels decode fp8 by a table made from the packer's decoder; this
 * holds both to the scalar one on all of their inputs. */
static void test_rows_float8_every_byte(void **state)
{
    (void)state;
    enum { N = 2 * 256 + 40, K = 2 };
    mp_isa isas[MP_ISA_COUNT];
    const int ni = test_isas(isas);
    const mp_isa saved = mp_isa_active();
    const uint16_t a[TALL * K] = {0x3F80}; /* row 0: (1, 0); the others zero */
    float *c = malloc((size_t)(TALL * N) * sizeof *c);
    uint8_t b[K * N];
    for (int ii = 0; ii < ni; ii++) {
        assert_int_equal(mp_isa_set(isas[ii]), MP_OK);
        for (int ti = 0; ti < 2; ti++) {
            const mp_dtype bt = ti ? MP_F8E5M2 : MP_F8E4M3;
            for (int j = 0; j < N; j++) {
                b[j] = (uint8_t)(j % 256);
                b[N + j] = bt == MP_F8E4M3 ? 0x38 : 0x3C; /* 1.0 */
            }
            const rows_case r = {1, N, K, N, false, MP_BF16, bt, MP_F32, true};
            assert_int_equal(takes_rows(&r, 1, a, K, b),
                             mp_gemm_impl_for(MP_BF16, bt)->kernel_row != NULL);
            for (int m = 1; m <= TALL; m += TALL - 1) {
                mp_gemm(false, false, m, N, K, 1.0f, a, MP_BF16, K, b, bt, N, 0.0f, c, MP_F32, N);
                for (int j = 0; j < N; j++) {
                    const uint8_t x = (uint8_t)(j % 256);
                    /* 1 x + 0 x 1: a negative zero's sum is +0 */
                    const float want =
                        (bt == MP_F8E4M3 ? mp_e4m3_to_f32(x) : mp_e5m2_to_f32(x)) + 0.0f;
                    if (isnan(want) ? !isnan(c[j]) : f32_bits(c[j]) != f32_bits(want))
                        fail_msg("%s %s byte 0x%02x, %d rows: %.9g, not %.9g",
                                 mp_isa_name(isas[ii]), mp_dtype_name(bt), x, m, (double)c[j],
                                 (double)want);
                }
            }
        }
    }
    mp_isa_set(saved);
    free(c);
}

/* The same bytes on A's side (its packers: rows along k, and A stored
 * transposed): A's column 0 holds them, column 1 ones, B's rows (1, 0)
 * across 40 columns. */
static void test_tiles_float8_a_every_byte(void **state)
{
    (void)state;
    enum { M = 2 * 256 + 40, K = 2, N = 40 };
    mp_isa isas[MP_ISA_COUNT];
    const int ni = test_isas(isas);
    const mp_isa saved = mp_isa_active();
    uint16_t b[K * N] = {0};
    for (int j = 0; j < N; j++) b[j] = 0x3F80; /* row 0 ones, row 1 zeros */
    float *c = malloc((size_t)(M * N) * sizeof *c);
    uint8_t a[M * K];
    for (int ii = 0; ii < ni; ii++) {
        assert_int_equal(mp_isa_set(isas[ii]), MP_OK);
        for (int ti = 0; ti < 4; ti++) {
            const mp_dtype at = ti & 1 ? MP_F8E5M2 : MP_F8E4M3;
            const bool ta = ti >= 2;
            for (int i = 0; i < M; i++) {
                const uint8_t one = at == MP_F8E4M3 ? 0x38 : 0x3C;
                a[ta ? i : i * K] = (uint8_t)(i % 256); /* A(i, 0) */
                a[ta ? M + i : i * K + 1] = one;        /* A(i, 1) */
            }
            mp_gemm(ta, false, M, N, K, 1.0f, a, at, ta ? M : K, b, MP_BF16, N, 0.0f, c, MP_F32, N);
            for (int i = 0; i < M; i++) {
                const uint8_t x = (uint8_t)(i % 256);
                const float want = (at == MP_F8E4M3 ? mp_e4m3_to_f32(x) : mp_e5m2_to_f32(x)) + 0.0f;
                for (int j = 0; j < N; j += 13)
                    if (isnan(want) ? !isnan(c[i * N + j])
                                    : f32_bits(c[i * N + j]) != f32_bits(want))
                        fail_msg("%s %s A%s byte 0x%02x, column %d: %.9g, not %.9g",
                                 mp_isa_name(isas[ii]), mp_dtype_name(at), ta ? "^T" : "", x, j,
                                 (double)c[i * N + j], (double)want);
            }
        }
    }
    mp_isa_set(saved);
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_equal_tiles),
        cmocka_unit_test(test_rows_reference),
        cmocka_unit_test(test_rows_nonfinite),
        cmocka_unit_test(test_rows_ahead),
        cmocka_unit_test(test_rows_float8_every_byte),
        cmocka_unit_test(test_tiles_float8_a_every_byte),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
