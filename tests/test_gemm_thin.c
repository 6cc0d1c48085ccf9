/* test_gemm_thin.c - products with few rows of C, where the float32 kernel
 * reads B where it lies instead of packing it (gemm.c's b_in_place: C of
 * at most two panels of rows, B laid out along n). Each element of C is the
 * same sum in the same order whatever the path, so the rows of such a
 * product must equal, bit for bit, the same rows computed inside a taller
 * product (B packed): full panels, a last partial panel, two depth blocks
 * (chained partial sums), the epilogue (alpha, beta, bias, relu), padded
 * rows, one thread and two, on every ISA path. The thin C computed as C^T
 * (fc3's weight gradient, x^T dz, 4096x10x1024) is checked against a
 * float64 reference with the accumulation bound. The blocks the thin
 * shapes get (gemm_blocks.c): one depth block for a single B panel with A
 * in place, its columns the same bits as inside a wider product that runs
 * several; a wide B block for a short depth; the depth block for a B read
 * in place. A bfloat16 A or B read in place by a float32 kernel equals
 * its float32 copy bit for bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/gemm_internal.h"

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

/* The blocking rules for thin shapes, on every kernel this CPU runs. */
static void test_thin_blocks(void **state)
{
    (void)state;
    const gemm_impl *ims[5] = {&mp_gemm_scalar_impl};
    int n_im = 1;
#if MP_X86
    if (mp_isa_supported(MP_ISA_AVX2)) ims[n_im++] = &mp_gemm_avx2_impl;
    if (mp_isa_supported(MP_ISA_AVX512)) ims[n_im++] = &mp_gemm_avx512_impl;
    if (mp_isa_supported(MP_ISA_AVX512BF16)) ims[n_im++] = &mp_gemm_avx512bf16_impl;
    if (mp_isa_supported(MP_ISA_AMX)) ims[n_im++] = &mp_gemm_amx_impl;
#endif
    const int64_t l2 = (int64_t)mp_cpu_cache_bytes(2);
    for (int i = 0; i < n_im; i++) {
        const gemm_impl *im = ims[i];
        const int64_t esz = mp_gemm_fmt_bytes(im->fmt);
        int64_t kcb, nc, kcb_wide, nc_wide;
        /* deeper than the impl's depth block (AMX's is 4096) */
        const int64_t deep = 2 * im->kc;
        mp_gemm_blocks(im, deep, 4096, true, false, &kcb_wide, &nc_wide);
        assert_true(kcb_wide < deep); /* a deep product runs several blocks */
        /* one B panel, A in place: the whole depth where its panel fits half of L2 */
        mp_gemm_blocks(im, deep, im->nr, true, false, &kcb, &nc);
        const bool fits = deep * im->nr * esz <= l2 / 2;
        assert_int_equal(kcb, fits ? deep : kcb_wide);
        /* A packed, or two panels: the blocks of a wide product */
        mp_gemm_blocks(im, deep, im->nr, false, false, &kcb, &nc);
        assert_int_equal(kcb, kcb_wide);
        mp_gemm_blocks(im, deep, im->nr + 1, true, false, &kcb, &nc);
        assert_int_equal(kcb, kcb_wide);
        /* B read in place: the depth in equal blocks of at most kc_b where
         * the impl has one (the last block the shortest), else as with B
         * packed */
        mp_gemm_blocks(im, deep, 4096, false, true, &kcb, &nc);
        if (im->kc_b > 0)
            assert_int_equal(kcb, cdiv(deep, cdiv(deep, min64(im->kc_b, kcb_wide))));
        else
            assert_int_equal(kcb, kcb_wide);
        /* a short depth: the B block a quarter of L2, whole panels */
        mp_gemm_blocks(im, 10, 4096, false, false, &kcb, &nc);
        assert_int_equal(kcb, 10);
        const int64_t kpad = mp_gemm_kpad(im->fmt, 10);
        assert_true(nc % im->nr == 0 && nc >= im->nc);
        assert_int_equal(nc, max64(im->nc, l2 / 4 / (kpad * esz) / im->nr * im->nr));
    }
}

/* C = A B, B a single panel of columns (n <= NR) and A float32 read in
 * place, runs its whole depth in one block; a product with more columns
 * runs blocks of it. Each element is the same chain of FMAs either way:
 * the thin product's columns equal the wider one's, bit for bit, and lie
 * within test_gemm_worst's bound of float64 (gamma_{k+1} sum|a b|). fc3's forward shape,
 * shortened (x 200 x 2500, W 2500 x 10), one thread and two, every path. */
static void test_thin_one_depth_block(void **state)
{
    (void)state;
    const int64_t m = 200, k = 2500, n = 10, wide = 100;
    float *a = malloc((size_t)(m * k) * 4), *b = malloc((size_t)(k * wide) * 4);
    float *bn = malloc((size_t)(k * n) * 4), *c = malloc((size_t)(m * n) * 4);
    float *cw = malloc((size_t)(m * wide) * 4);
    test_fill(a, (size_t)(m * k), 41, -1, 1);
    test_fill(b, (size_t)(k * wide), 42, -1, 1);
    for (int64_t p = 0; p < k; p++) memcpy(bn + p * n, b + p * wide, (size_t)n * 4);
    mp_isa isas[MP_ISA_COUNT];
    const int ni = test_isas(isas);
    const mp_isa saved = mp_isa_active();
    for (int ii = 0; ii < ni; ii++) {
        assert_int_equal(mp_isa_set(isas[ii]), MP_OK);
        for (int t = 1; t <= 2; t++) {
            mp_set_num_threads(t);
            mp_gemm(false, false, m, n, k, 1.0f, a, MP_F32, k, bn, MP_F32, n, 0.0f, c, MP_F32, n);
            mp_gemm(false, false, m, wide, k, 1.0f, a, MP_F32, k, b, MP_F32, wide, 0.0f, cw, MP_F32,
                    wide);
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    const float got = c[i * n + j];
                    if (f32_bits(got) != f32_bits(cw[i * wide + j]))
                        fail_msg("%s t%d C[%lld,%lld] %.9g, in the wider product %.9g",
                                 mp_isa_name(mp_isa_active()), t, (long long)i, (long long)j,
                                 (double)got, (double)cw[i * wide + j]);
                }
            const test_gemm_ref ref = {
                .a = a, .b = bn, .m = m, .n = n, .k = k, .bs_k = n, .bs_n = 1, .alpha = 1};
            const double worst = test_gemm_worst(&ref, c, MP_F32);
            if (!(worst <= 1))
                fail_msg("%s t%d: error %.3g of the bound", mp_isa_name(mp_isa_active()), t, worst);
        }
    }
    mp_isa_set(saved);
    mp_set_num_threads(0);
    free(a);
    free(b);
    free(bn);
    free(c);
    free(cw);
}

/* A single B panel that two threads, splitting C's rows, share: they pack
 * halves of its depth (gemm.c's pack_share), cut where bfloat16's pairs
 * stay whole (k = 1030: half is 515, odd). Two threads' C equals one
 * thread's bit for bit (the same panel, packed whole), within
 * test_gemm_worst's bound of float64, in float32 and bfloat16 on every
 * path. */
static void test_thin_shared_panel(void **state)
{
    (void)state;
    const int64_t m = 512, n = 10, k = 1030;
    float *a = malloc((size_t)(m * k) * 4), *b = malloc((size_t)(k * n) * 4);
    float *c1 = malloc((size_t)(m * n) * 4), *c2 = malloc((size_t)(m * n) * 4);
    uint16_t *ah = malloc((size_t)(m * k) * 2), *bh = malloc((size_t)(k * n) * 2);
    test_fill(a, (size_t)(m * k), 61, -1, 1);
    test_fill(b, (size_t)(k * n), 62, -1, 1);
    mp_convert(ah, MP_BF16, a, MP_F32, (size_t)(m * k));
    mp_convert(a, MP_F32, ah, MP_BF16, (size_t)(m * k)); /* the values bfloat16 holds */
    mp_convert(bh, MP_BF16, b, MP_F32, (size_t)(k * n));
    mp_convert(b, MP_F32, bh, MP_BF16, (size_t)(k * n));
    mp_isa isas[MP_ISA_COUNT];
    const int ni = test_isas(isas);
    const mp_isa saved = mp_isa_active();
    for (int ii = 0; ii < ni; ii++) {
        assert_int_equal(mp_isa_set(isas[ii]), MP_OK);
        for (int bf16 = 0; bf16 <= 1; bf16++) {
            const void *ap = bf16 ? (const void *)ah : a, *bp = bf16 ? (const void *)bh : b;
            const mp_dtype t = bf16 ? MP_BF16 : MP_F32;
            for (int th = 1; th <= 2; th++) {
                mp_set_num_threads(th);
                mp_gemm(false, false, m, n, k, 1.0f, ap, t, k, bp, t, n, 0.0f, th == 1 ? c1 : c2,
                        MP_F32, n);
            }
            for (int64_t i = 0; i < m * n; i++)
                if (f32_bits(c1[i]) != f32_bits(c2[i]))
                    fail_msg("%s %s: C[%lld] %.9g on two threads, %.9g on one",
                             mp_isa_name(mp_isa_active()), mp_dtype_name(t), (long long)i,
                             (double)c2[i], (double)c1[i]);
            const test_gemm_ref ref = {
                .a = a, .b = b, .m = m, .n = n, .k = k, .bs_k = n, .bs_n = 1, .alpha = 1};
            const double worst = test_gemm_worst(&ref, c2, MP_F32);
            if (!(worst <= 1))
                fail_msg("%s %s: error %.3g of the bound", mp_isa_name(mp_isa_active()),
                         mp_dtype_name(t), worst);
        }
    }
    mp_isa_set(saved);
    mp_set_num_threads(0);
    free(a);
    free(b);
    free(c1);
    free(c2);
    free(ah);
    free(bh);
}

/* A short depth (fc3's input gradient, dz W^T: 10 deep) runs a B block a
 * quarter of L2 wide: every element within test_gemm_worst's bound of float64,
 * B laid out both ways (W^T read from W, and a plain B), two threads. */
static void test_short_depth(void **state)
{
    (void)state;
    const int64_t m = 90, n = 3000, k = 10;
    float *a = malloc((size_t)(m * k) * 4), *b = malloc((size_t)(k * n) * 4);
    float *c = malloc((size_t)(m * n) * 4);
    test_fill(a, (size_t)(m * k), 51, -1, 1);
    test_fill(b, (size_t)(k * n), 52, -1, 1);
    mp_isa isas[MP_ISA_COUNT];
    const int ni = test_isas(isas);
    const mp_isa saved = mp_isa_active();
    mp_set_num_threads(2);
    for (int ii = 0; ii < ni; ii++) {
        assert_int_equal(mp_isa_set(isas[ii]), MP_OK);
        for (int tb = 0; tb <= 1; tb++) {
            /* tb: b holds B^T (n x k), as dX = dz W^T reads W */
            mp_gemm(false, tb, m, n, k, 1.0f, a, MP_F32, k, b, MP_F32, tb ? k : n, 0.0f, c, MP_F32,
                    n);
            const test_gemm_ref ref = {.a = a,
                                       .b = b,
                                       .m = m,
                                       .n = n,
                                       .k = k,
                                       .bs_k = tb ? 1 : n,
                                       .bs_n = tb ? k : 1,
                                       .alpha = 1};
            const double worst = test_gemm_worst(&ref, c, MP_F32);
            if (!(worst <= 1))
                fail_msg("%s tb=%d: error %.3g of the bound", mp_isa_name(mp_isa_active()), tb,
                         worst);
        }
    }
    mp_isa_set(saved);
    mp_set_num_threads(0);
    free(a);
    free(b);
    free(c);
}

/* The product with the bfloat16 operands (a_bf16, b_bf16) given as
 * bfloat16 must equal, bit for bit, the same product on their float32
 * copies: the kernels widen exactly and keep each element's FMA chain.
 * Where both are bfloat16 on a path that runs that pair on vdpbf16ps
 * (gemm_avx512bf16.c: a sum per pair of depths, subnormals read as zero)
 * the bits are that instruction's, not an FMA chain's: not this test's. */
static void bf16_equals_f32_copy(int64_t m, int64_t n, int64_t k, int64_t ldb, bool ta, bool a_bf16,
                                 bool b_bf16, int threads)
{
    if (a_bf16 && b_bf16 && mp_gemm_impl_for(MP_BF16, MP_BF16)->fmt != GEMM_FMT_F32) return;
    const int64_t lda = ta ? m : k, na = m * k, nb = k * ldb;
    float *af = malloc((size_t)na * 4), *bf = malloc((size_t)nb * 4);
    uint16_t *ah = malloc((size_t)na * 2), *bh = malloc((size_t)nb * 2); /* no slack past them */
    float *bias = malloc((size_t)n * 4), *c0 = malloc((size_t)(m * n) * 4);
    float *want = malloc((size_t)(m * n) * 4), *got = malloc((size_t)(m * n) * 4);
    test_fill(af, (size_t)na, 71, -1, 1);
    test_fill(bf, (size_t)nb, 72, -1, 1);
    test_fill(bias, (size_t)n, 73, -1, 1);
    test_fill(c0, (size_t)(m * n), 74, -1, 1);
    mp_convert(ah, MP_BF16, af, MP_F32, (size_t)na);
    mp_convert(af, MP_F32, ah, MP_BF16, (size_t)na); /* the values bfloat16 holds */
    mp_convert(bh, MP_BF16, bf, MP_F32, (size_t)nb);
    mp_convert(bf, MP_F32, bh, MP_BF16, (size_t)nb);
    mp_set_num_threads(threads);
    mp_gemm_args g = mp_gemm_args_default();
    g.trans_a = ta;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = 0.75f;
    g.beta = -0.5f;
    g.lda = lda;
    g.ldb = ldb;
    g.ldc = n;
    g.bias = bias;
    g.activation = MP_ACT_RELU;
    g.a = af;
    g.b = bf;
    g.c = memcpy(want, c0, (size_t)(m * n) * 4);
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
    if (a_bf16) {
        g.a = ah;
        g.a_type = MP_BF16;
    }
    if (b_bf16) {
        g.b = bh;
        g.b_type = MP_BF16;
    }
    g.c = memcpy(got, c0, (size_t)(m * n) * 4);
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
    for (int64_t i = 0; i < m * n; i++)
        if (f32_bits(got[i]) != f32_bits(want[i]))
            fail_msg("%s %lldx%lldx%lld ldb %lld ta %d, bf16 A %d B %d, t%d: C[%lld] %.9g, from "
                     "the float32 copies %.9g",
                     mp_isa_name(mp_isa_active()), (long long)m, (long long)n, (long long)k,
                     (long long)ldb, ta, a_bf16, b_bf16, threads, (long long)i, (double)got[i],
                     (double)want[i]);
    free(af);
    free(bf);
    free(ah);
    free(bh);
    free(bias);
    free(c0);
    free(want);
    free(got);
}

/* A bfloat16 A read in place by a float32-format kernel (gemm.c's
 * a_in_place: kernel_a_bf16, B at most two panels wide) is widened exactly
 * in the kernel, so the product equals, bit for bit, the same product on A
 * widened to float32 beforehand (bf16_equals_f32_copy): one and two B
 * panels, a third (A packed), an odd depth, depth blocks of odd length and
 * offset, several depth blocks (n past one panel), the epilogue, rows past
 * the last full panel, a C of two panels of rows (B read in place for the
 * float32 A), one thread and two. A ends where its allocation does, so a
 * read past it fails under ASan. A bfloat16 C from it is within the
 * float64 bound (test_gemm_worst). */
static void test_bf16_a_in_place(void **state)
{
    (void)state;
    const int64_t shapes[][3] = {
        /* m, n, k */
        {702, 10, 1100}, /* fc3 forward's shape, smaller: one B panel, full panels of rows */
        {700, 32, 1100}, /* two panels, two depth blocks */
        {700, 33, 1100}, /* three: A packed */
        {700, 10, 1101}, /* odd depth */
        {700, 20, 514},  /* two depth blocks of 257 */
        {13, 32, 1},     /* one deep */
        {702, 4, 300},   /* C thin enough for the C^T swap, which A in place keeps out of */
        {9, 20, 600},    /* two panels of rows */
    };
    mp_isa isas[MP_ISA_COUNT];
    const int ni = test_isas(isas);
    const mp_isa saved = mp_isa_active();
    for (int ii = 0; ii < ni; ii++) {
        assert_int_equal(mp_isa_set(isas[ii]), MP_OK);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            for (int t = 1; t <= 2; t++) bf16_equals_f32_copy(m, n, k, n, false, true, false, t);
            float *af = malloc((size_t)(m * k) * 4), *b = malloc((size_t)(k * n) * 4);
            float *bias = malloc((size_t)n * 4);
            uint16_t *a = malloc((size_t)(m * k) * 2), *c = malloc((size_t)(m * n) * 2);
            test_fill(af, (size_t)(m * k), 61, -1, 1);
            mp_convert(a, MP_BF16, af, MP_F32, (size_t)(m * k));
            mp_convert(af, MP_F32, a, MP_BF16, (size_t)(m * k)); /* A's values exactly */
            test_fill(b, (size_t)(k * n), 62, -1, 1);
            test_fill(bias, (size_t)n, 63, -1, 1);
            mp_gemm_args g = mp_gemm_args_default();
            g.m = m;
            g.n = n;
            g.k = k;
            g.alpha = 0.75f;
            g.a = a;
            g.a_type = MP_BF16;
            g.lda = k;
            g.b = b;
            g.ldb = n;
            g.c = c;
            g.c_type = MP_BF16;
            g.ldc = n;
            g.bias = bias;
            assert_int_equal(mp_gemm_ex(&g), MP_OK);
            const test_gemm_ref ref = {.a = af,
                                       .b = b,
                                       .bias = bias,
                                       .m = m,
                                       .n = n,
                                       .k = k,
                                       .bs_k = n,
                                       .bs_n = 1,
                                       .bf16_out = true,
                                       .alpha = 0.75};
            const double worst = test_gemm_worst(&ref, c, MP_BF16);
            if (!(worst <= 1))
                fail_msg("%s %lldx%lldx%lld: bfloat16 C, error %.3g of the bound",
                         mp_isa_name(mp_isa_active()), (long long)m, (long long)n, (long long)k,
                         worst);
            free(af);
            free(b);
            free(bias);
            free(a);
            free(c);
        }
    }
    mp_isa_set(saved);
    mp_set_num_threads(0);
}

/* A bfloat16 B read in place (gemm.c's b_in_place: kernel_ab_bf16, a C of
 * at most two panels of rows, B laid out along n) equals its float32 copy
 * bit for bit: a batch of one (two full panels and a packed remainder),
 * several depth blocks, padded B rows, a row stride equal to the panel
 * width, rows of A past the first panel, a bfloat16 A beside it, and the
 * thin weight gradient computed as C^T (x, the B of dz^T x, bfloat16). B
 * ends where its allocation does, so a read past it fails under ASan. */
static void test_bf16_b_in_place(void **state)
{
    (void)state;
    const int64_t shapes[][4] = {
        /* m, n, k, ldb */
        {1, 100, 33, 100}, {9, 96, 1500, 96}, {12, 200, 70, 211}, {1, 16, 40, 16}, {7, 48, 5, 48},
    };
    mp_isa isas[MP_ISA_COUNT];
    const int ni = test_isas(isas);
    const mp_isa saved = mp_isa_active();
    for (int ii = 0; ii < ni; ii++) {
        assert_int_equal(mp_isa_set(isas[ii]), MP_OK);
        for (int t = 1; t <= 2; t++) {
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (int a_bf16 = 0; a_bf16 <= 1; a_bf16++)
                    bf16_equals_f32_copy(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3],
                                         false, a_bf16, true, t);
            /* dW = x^T dz, 300x10x1100: x bfloat16, dz either */
            bf16_equals_f32_copy(300, 10, 1100, 10, true, true, false, t);
            bf16_equals_f32_copy(300, 10, 1100, 10, true, true, true, t);
        }
    }
    mp_isa_set(saved);
    mp_set_num_threads(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_few_rows_equal_packed), cmocka_unit_test(test_thin_weight_gradient),
        cmocka_unit_test(test_thin_blocks),           cmocka_unit_test(test_thin_one_depth_block),
        cmocka_unit_test(test_thin_shared_panel),     cmocka_unit_test(test_short_depth),
        cmocka_unit_test(test_bf16_a_in_place),       cmocka_unit_test(test_bf16_b_in_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
