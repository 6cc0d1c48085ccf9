/* test_gemm.c - mp_gemm / mp_gemm_ex against a float64 reference computed
 * from the same rounded inputs, on every ISA path and every type
 * combination; strides, transposes, alpha/beta, epilogues, determinism and
 * argument checks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "common.h"
#include "core/internal.h"

static const mp_dtype in_types[] = {MP_F32, MP_BF16, MP_F16, MP_F8E4M3, MP_F8E5M2};
static const int64_t sizes[] = {0, 1, 2, 3, 15, 16, 17, 31, 33, 64, 100, 257};
#define NSIZES ((int)(sizeof sizes / sizeof sizes[0]))

typedef struct {
    bool ta, tb;
    int64_t m, n, k;
    mp_dtype at, bt, ct;
    float alpha, beta;
    int pad; /* extra elements per row of A, B and C */
    bool bias;
    mp_activation act;
    bool nan_c; /* C holds NaN on entry (only meaningful with beta == 0) */
} gemm_case;

/* A stored matrix of `rows` x `width` (leading dimension ld) in dtype t, and
 * the exact values it holds as doubles. */
typedef struct {
    void *data;
    double *val;
    int64_t rows, width, ld;
} mat;

static void mat_random(mat *x, test_rng *r, mp_dtype t, int64_t rows, int64_t width, int pad)
{
    x->rows = rows;
    x->width = width;
    x->ld = width + pad > 0 ? width + pad : 1;
    size_t n = (size_t)(rows * x->ld);
    size_t es = mp_dtype_size(t);
    float *f = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = (float)test_rng_uniform(r, -1.0, 1.0);
    x->data = malloc((n ? n : 1) * es);
    mp_convert(x->data, t, f, MP_F32, n);
    mp_convert(f, MP_F32, x->data, t, n);
    x->val = malloc((n ? n : 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) x->val[i] = f[i];
    free(f);
}

static void mat_free(mat *x)
{
    free(x->data);
    free(x->val);
}

static double gamma_n(double n)
{
    const double u = 0x1p-24;
    return n * u / (1.0 - n * u);
}

static double act_ref(mp_activation a, double x)
{
    switch (a) {
    case MP_ACT_RELU:
        return x > 0 ? x : 0;
    case MP_ACT_GELU:
        return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case MP_ACT_GELU_TANH:
        return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    default:
        return x;
    }
}

static double unit_roundoff(mp_dtype t)
{
    return t == MP_BF16 ? 0x1p-8 : t == MP_F16 ? 0x1p-11 : 0x1p-24;
}

static void run_case(const gemm_case *gc, test_rng *r)
{
    mat A, B, C;
    mat_random(&A, r, gc->at, gc->ta ? gc->k : gc->m, gc->ta ? gc->m : gc->k, gc->pad);
    mat_random(&B, r, gc->bt, gc->tb ? gc->n : gc->k, gc->tb ? gc->k : gc->n, gc->pad);
    mat_random(&C, r, gc->ct, gc->m, gc->n, gc->pad);
    const size_t ces = mp_dtype_size(gc->ct);
    if (gc->nan_c) {
        for (int64_t i = 0; i < C.rows * C.ld; i++) {
            float q = NAN;
            mp_convert((char *)C.data + (size_t)i * ces, gc->ct, &q, MP_F32, 1);
        }
    }
    /* Padding columns of C must come back untouched. */
    for (int64_t i = 0; i < C.rows; i++)
        memset((char *)C.data + (size_t)(i * C.ld + gc->n) * ces, 0x5A,
               (size_t)(C.ld - gc->n) * ces);
    float *bias = NULL;
    if (gc->bias) {
        bias = malloc((size_t)(gc->n + 1) * sizeof(float));
        for (int64_t j = 0; j < gc->n; j++) bias[j] = (float)test_rng_uniform(r, -1.0, 1.0);
    }

    mp_gemm_args g = mp_gemm_args_default();
    g.trans_a = gc->ta;
    g.trans_b = gc->tb;
    g.m = gc->m;
    g.n = gc->n;
    g.k = gc->k;
    g.alpha = gc->alpha;
    g.beta = gc->beta;
    g.a = A.data;
    g.a_type = gc->at;
    g.lda = A.ld;
    g.b = B.data;
    g.b_type = gc->bt;
    g.ldb = B.ld;
    g.c = C.data;
    g.c_type = gc->ct;
    g.ldc = C.ld;
    g.bias = bias;
    g.activation = gc->act;
    mp_status st = mp_gemm_ex(&g);
    if (st != MP_OK) fail_msg("mp_gemm_ex failed: %s", mp_last_error());

    int bad = 0;
    for (int64_t i = 0; i < gc->m && bad < 5; i++) {
        for (int64_t j = 0; j < gc->n && bad < 5; j++) {
            double dot = 0, S = 0;
            for (int64_t p = 0; p < gc->k; p++) {
                double a = gc->ta ? A.val[p * A.ld + i] : A.val[i * A.ld + p];
                double b = gc->tb ? B.val[j * B.ld + p] : B.val[p * B.ld + j];
                dot += a * b;
                S += fabs(a * b);
            }
            double cin = gc->beta != 0.0f ? C.val[i * C.ld + j] : 0.0;
            double bj = bias ? bias[j] : 0.0;
            double pre = (double)gc->alpha * dot + (double)gc->beta * cin + bj;
            double want = act_ref(gc->act, pre);
            /* Tolerance. Each f32 accumulation chain of length k (sequential
             * FMA, mul+add, or vdpbf16ps's two chained roundings per pair) is
             * within gamma_k * sum|a||b| of the exact dot product of the
             * rounded inputs (Higham, Thm 3.1). The epilogue adds at most three
             * more f32 roundings (alpha*acc, beta*c, the two additions share
             * the bound as terms of a sum): gamma_{k+3} over the magnitudes
             * |alpha| S + |beta c| + |bias|. relu is 1-Lipschitz; gelu's slope
             * is below 1.13 and its f32 evaluation (erff/tanhf plus three
             * operations) adds a few ulp. Finally one RNE rounding to C's dtype
             * adds u_c * |result| (plus half the smallest f16 subnormal). */
            double tol = gamma_n((double)gc->k + 3.0) *
                         (fabs((double)gc->alpha) * S + fabs((double)gc->beta * cin) + fabs(bj));
            if (gc->act == MP_ACT_GELU || gc->act == MP_ACT_GELU_TANH)
                tol = 1.2 * tol + 8 * 0x1p-24 * fabs(want) + 0x1p-126;
            tol += unit_roundoff(gc->ct) * (fabs(want) + tol) * 1.0001;
            if (gc->ct == MP_F16) tol += 0x1p-25;
            float got;
            mp_convert(&got, MP_F32, (char *)C.data + (size_t)(i * C.ld + j) * ces, gc->ct, 1);
            if (!(fabs((double)got - want) <= tol)) {
                print_error("  C[%lld,%lld] = %.9g, want %.9g (tol %.3g) isa=%s ta=%d tb=%d "
                            "m=%lld n=%lld k=%lld a=%s b=%s c=%s alpha=%g beta=%g act=%d\n",
                            (long long)i, (long long)j, (double)got, want, tol,
                            mp_isa_name(mp_isa_active()), gc->ta, gc->tb, (long long)gc->m,
                            (long long)gc->n, (long long)gc->k, mp_dtype_name(gc->at),
                            mp_dtype_name(gc->bt), mp_dtype_name(gc->ct), (double)gc->alpha,
                            (double)gc->beta, (int)gc->act);
                bad++;
            }
        }
    }
    for (int64_t i = 0; i < C.rows && !bad; i++)
        for (int64_t b = gc->n * (int64_t)ces; b < C.ld * (int64_t)ces; b++)
            if (((unsigned char *)C.data)[i * C.ld * (int64_t)ces + b] != 0x5A) {
                print_error("  padding of C row %lld overwritten\n", (long long)i);
                bad++;
                break;
            }
    free(bias);
    mat_free(&A);
    mat_free(&B);
    mat_free(&C);
    if (bad) fail();
}

static void for_each_isa(void (*fn)(test_rng *), uint64_t seed)
{
    mp_isa isas[MP_ISA_COUNT];
    int n = test_isas(isas);
    mp_isa saved = mp_isa_active();
    for (int i = 0; i < n; i++) {
        assert_int_equal(mp_isa_set(isas[i]), MP_OK);
        test_rng r = {seed + (uint64_t)i};
        fn(&r);
    }
    mp_isa_set(saved);
}

/* Every input type pair, every transpose combination, a rotating selection of
 * sizes from the list (so each size meets each role), on every ISA path. */
static void types_body(test_rng *r)
{
    int t = 0;
    for (int ai = 0; ai < 5; ai++)
        for (int bi = 0; bi < 5; bi++)
            for (int tr = 0; tr < 4; tr++)
                for (int s = 0; s < 3; s++, t++) {
                    gemm_case gc = {.ta = tr & 1,
                                    .tb = tr >> 1,
                                    .at = in_types[ai],
                                    .bt = in_types[bi],
                                    .ct = MP_F32,
                                    .alpha = 1.0f,
                                    .beta = 0.0f};
                    gc.m = sizes[(t * 5 + 1) % NSIZES];
                    gc.n = sizes[(t * 7 + 4) % NSIZES];
                    gc.k = sizes[(t * 11 + 9) % NSIZES];
                    gc.pad = t % 3 == 0 ? 0 : 3;
                    run_case(&gc, r);
                }
}
static void test_type_combinations(void **state)
{
    (void)state;
    for_each_isa(types_body, 1);
}

/* The full cross of the size list on the main formats. */
static void cross_body(test_rng *r)
{
    const mp_dtype pairs[3][2] = {{MP_F32, MP_F32}, {MP_BF16, MP_BF16}, {MP_F8E4M3, MP_F8E5M2}};
    int t = 0;
    static const int64_t ks[] = {0, 1, 2, 3, 16, 17, 33, 100};
    for (int p = 0; p < 3; p++)
        for (int mi = 0; mi < NSIZES; mi++)
            for (int ni = 0; ni < NSIZES; ni++)
                for (int ki = 0; ki < 8; ki++, t++) {
                    gemm_case gc = {.ta = t & 1,
                                    .tb = (t >> 1) & 1,
                                    .m = sizes[mi],
                                    .n = sizes[ni],
                                    .k = ks[ki],
                                    .at = pairs[p][0],
                                    .bt = pairs[p][1],
                                    .ct = MP_F32,
                                    .alpha = 1.0f,
                                    .beta = 0.0f,
                                    .pad = t % 2};
                    if (gc.m * gc.n * gc.k > 100000) continue;
                    run_case(&gc, r);
                }
}
static void test_size_cross(void **state)
{
    (void)state;
    for_each_isa(cross_body, 2);
}

/* L2 in whole MiB, at least 1: the packed A block's cap grows with it. */
static int64_t l2_mib(void)
{
    const int64_t mib = (int64_t)(mp_cpu_cache_bytes(2) >> 20);
    return mib > 1 ? mib : 1;
}

/* m x n products with A transposed (so packed), C = A B in float32:
 * float32 inputs at depth kf, then bf16 at depth kb (the A block cap's
 * cases, below). */
static void packed_a_cases(test_rng *r, int64_t m, int64_t n, int64_t kf, int64_t kb)
{
    if (mp_isa_active() == MP_ISA_SCALAR) return;
    for (int p = 0; p < 2; p++) {
        const mp_dtype t = p ? MP_BF16 : MP_F32;
        gemm_case gc = {.ta = true,
                        .m = m,
                        .n = n,
                        .k = p ? kb : kf,
                        .at = t,
                        .bt = t,
                        .ct = MP_F32,
                        .alpha = 1.0f,
                        .beta = 0.0f,
                        .pad = 1};
        run_case(&gc, r);
    }
}

/* Large shapes cross every cache block boundary and use the threads. */
static void large_body(test_rng *r)
{
    const mp_dtype pairs[4][2] = {
        {MP_F32, MP_F32}, {MP_BF16, MP_BF16}, {MP_F8E4M3, MP_F16}, {MP_F8E5M2, MP_BF16}};
    for (int p = 0; p < 4; p++) {
        int tr = p;
        gemm_case gc = {.ta = tr & 1,
                        .tb = tr >> 1,
                        .m = 300,
                        .n = 520,
                        .k = 1100, /* two depth blocks under the FMA kernels' kc = 1024 */
                        .at = pairs[p][0],
                        .bt = pairs[p][1],
                        .ct = MP_F32,
                        .alpha = 0.5f,
                        .beta = -1.25f,
                        .pad = 5};
        if (mp_isa_active() == MP_ISA_SCALAR) gc.k = 300;
        run_case(&gc, r);
    }
    /* Two depth blocks under the vdpbf16ps kernel's depth of 4096 (three
     * under its kc_l1 of 2048, where n = 200 crosses the column block that
     * then keeps B in half of L2), A read in place (k even, along rows) and
     * packed (transposed). */
    for (int tr = 0; tr < 2; tr++) {
        gemm_case deep = {.ta = tr,
                          .tb = tr,
                          .m = 40,
                          .n = 200,
                          .k = 4500,
                          .at = MP_BF16,
                          .bt = tr ? MP_F8E4M3 : MP_BF16,
                          .ct = MP_F32,
                          .alpha = 1.0f,
                          .beta = 0.5f,
                          .pad = 2};
        if (mp_isa_active() != MP_ISA_SCALAR) run_case(&deep, r);
    }
    /* A thin C is computed as C^T; with several depth blocks and a full
     * epilogue written through the transposed path. */
    gemm_case thin = {.m = 700,
                      .n = 10,
                      .k = 1100,
                      .at = MP_BF16,
                      .bt = MP_BF16,
                      .ct = MP_BF16,
                      .alpha = 0.5f,
                      .beta = 0.5f,
                      .pad = 3,
                      .bias = true,
                      .act = MP_ACT_GELU,
                      .ta = true};
    if (mp_isa_active() != MP_ISA_SCALAR) {
        run_case(&thin, r);
        thin.at = thin.bt = MP_F32;
        thin.ct = MP_F32;
        thin.ta = false;
        thin.tb = true;
        run_case(&thin, r);
    }
    gemm_case gc = {.m = 1030,
                    .n = 100,
                    .k = 1100,
                    .at = MP_BF16,
                    .bt = MP_F8E4M3,
                    .ct = MP_BF16,
                    .alpha = 1.0f,
                    .beta = 0.0f,
                    .tb = true};
    if (mp_isa_active() != MP_ISA_SCALAR) run_case(&gc, r);
    /* A packed (transposed) in one depth block of 1000, with nothing to
     * apply (tiles accumulate in C): where the kernel takes its L1 blocks,
     * the packed A block is capped at twice L2 (mp_gemm_row_block), so
     * the 1100 rows a MiB of L2 run as several row blocks, each packing B
     * again */
    packed_a_cases(r, 1100 * l2_mib(), 100, 1000, 1000);
}
static void test_large(void **state)
{
    (void)state;
    for_each_isa(large_body, 3);
}

/* Two threads that split only n share the packing of A (gemm.c's
 * gemm_share): with A packed (transposed, its depth stride over 256) and
 * taller than the packed A block's cap where the kernel takes its L1 blocks
 * (twice L2; with 1 MiB: 524 rows of float32 at depth 1000, 512 of bf16 at
 * depth 2048), the threads pack and share several row blocks in turn. Each
 * packs its own B range once for all of them (mp_gemm_b_once): 144 columns
 * a thread, two B blocks of the 96 columns the L1 blocks take (1 MiB of
 * L2), the second thread's range starting past 0. 600 x 288 splits n (75 x
 * 3 tiles a thread against 38 x 6 splitting m); with more L2, an odd number
 * of row tiles, 75 a MiB, keeps that split (149 x 3 against 75 x 6). */
static void shared_a_body(test_rng *r)
{
    const int64_t tiles = 75 * l2_mib();
    packed_a_cases(r, 8 * (tiles - 1 + tiles % 2), 288, 1000, 2048);
}
static void test_shared_a_blocks(void **state)
{
    (void)state;
    for_each_isa(shared_a_body, 2);
}

/* alpha/beta, beta == 0 over NaN, output dtypes, bias and activations. */
static void epilogue_body(test_rng *r)
{
    const mp_dtype cts[3] = {MP_F32, MP_BF16, MP_F16};
    const mp_dtype ins[3][2] = {{MP_F32, MP_F32}, {MP_BF16, MP_BF16}, {MP_F16, MP_F8E5M2}};
    int t = 0;
    for (int ci = 0; ci < 3; ci++)
        for (int ii = 0; ii < 3; ii++)
            for (int act = 0; act < 4; act++)
                for (int v = 0; v < 3; v++, t++) {
                    gemm_case gc = {.ta = t & 1,
                                    .tb = (t >> 1) & 1,
                                    .m = sizes[3 + t % 9],
                                    .n = sizes[2 + (t * 5) % 10],
                                    .k = sizes[(t * 3) % NSIZES],
                                    .at = ins[ii][0],
                                    .bt = ins[ii][1],
                                    .ct = cts[ci],
                                    .pad = 2,
                                    .act = (mp_activation)act,
                                    .bias = v != 1};
                    if (v == 0) {
                        gc.alpha = 1.0f;
                        gc.beta = 0.0f;
                        gc.nan_c = true;
                    } else if (v == 1) {
                        gc.alpha = -1.5f;
                        gc.beta = 0.75f;
                    } else {
                        gc.alpha = 2.0f;
                        gc.beta = 1.0f;
                    }
                    run_case(&gc, r);
                }
    /* alpha 1 or not (a float8 GEMM's inverse scales), beta 0, at most bias
     * and relu, whole 16-lane rows in the tiles (n = 96 and the first two
     * tiles of n = 100): the vector epilogues' loop for the commonest tiles
     * (gemm_epilogue_avx512.c's plain_rows), against the same float64
     * reference */
    for (int ci = 0; ci < 3; ci++)
        for (int ii = 0; ii < 2; ii++)
            for (int act = 0; act < 2; act++)
                for (int v = 0; v < 4; v++) {
                    gemm_case p = {.m = 33,
                                   .n = v & 1 ? 100 : 96,
                                   .k = 64,
                                   .at = ins[ii][0],
                                   .bt = ins[ii][1],
                                   .ct = cts[ci],
                                   .alpha = v & 2 ? 0.375f : 1.0f,
                                   .pad = 2,
                                   .act = (mp_activation)act,
                                   .bias = !(v & 1) || act == 1};
                    run_case(&p, r);
                }
    /* k == 0: C = beta * C (+ epilogue). */
    gemm_case z = {.m = 17,
                   .n = 33,
                   .k = 0,
                   .at = MP_F32,
                   .bt = MP_BF16,
                   .ct = MP_F32,
                   .alpha = 1.0f,
                   .beta = 0.5f,
                   .pad = 1,
                   .bias = true,
                   .act = MP_ACT_RELU};
    run_case(&z, r);
}
static void test_epilogue(void **state)
{
    (void)state;
    for_each_isa(epilogue_body, 4);
}

/* alpha == 0 reads neither A nor B, as BLAS: NaN there does not reach C. */
/* A 16-bit C is the float32 C rounded once: mp_gemm_ex into bfloat16 or
 * float16 gives, bit for bit, mp_convert of the same call into float32
 * (the epilogues that round in registers against the conversion kernels):
 * partial tiles, bias, relu and gelu, values past float16's range, NaN. */
static void rounded_once_body(test_rng *r)
{
    /* the last two: a thin C computed as C^T (A laid out k x m, too far
     * apart to be read in place), whose epilogue writes the tile transposed */
    const int64_t dims[6][3] = {{1, 1, 5},      {7, 19, 33},  {33, 45, 64},
                                {64, 100, 257}, {300, 5, 40}, {301, 13, 70}};
    const mp_dtype cts[2] = {MP_BF16, MP_F16};
    const mp_activation acts[3] = {MP_ACT_NONE, MP_ACT_RELU, MP_ACT_GELU};
    for (int d = 0; d < 6; d++) {
        const int64_t m = dims[d][0], n = dims[d][1], k = dims[d][2];
        const bool ta = d >= 4;
        float *a = malloc((size_t)(m * k) * sizeof *a), *b = malloc((size_t)(k * n) * sizeof *b);
        float *bias = malloc((size_t)n * sizeof *bias), *c32 = malloc((size_t)(m * n) * 4);
        uint16_t *c16 = malloc((size_t)(m * n) * 2), *want = malloc((size_t)(m * n) * 2);
        assert_non_null(a && b && bias && c32 && c16 && want);
        /* products up to about 2^10 * k: float16 overflows on the larger shapes */
        for (int64_t i = 0; i < m * k; i++) a[i] = (float)test_rng_uniform(r, -32.0, 32.0);
        for (int64_t i = 0; i < k * n; i++) b[i] = (float)test_rng_uniform(r, -32.0, 32.0);
        for (int64_t j = 0; j < n; j++) bias[j] = (float)test_rng_uniform(r, -100.0, 100.0);
        if (m * k > 3) a[m * k / 2] = NAN;
        /* a NaN whose low payload bits would carry into the sign if it
         * were rounded as a number (0x7FFFFFFF + 0x7FFF): bf16 must quiet
         * it to 0x7FFF */
        const uint32_t payload = 0x7FFFFFFFu;
        if (m * k > 7) memcpy(&a[m * k / 5], &payload, sizeof payload);
        for (int ci = 0; ci < 2; ci++)
            for (int ai = 0; ai < 3; ai++) {
                mp_gemm_args g = {.trans_a = ta,
                                  .m = m,
                                  .n = n,
                                  .k = k,
                                  .alpha = 1.0f,
                                  .a = a,
                                  .a_type = MP_F32,
                                  .lda = ta ? m : k,
                                  .b = b,
                                  .b_type = MP_F32,
                                  .ldb = n,
                                  .c = c32,
                                  .c_type = MP_F32,
                                  .ldc = n,
                                  .bias = (ai & 1) ? bias : NULL,
                                  .activation = acts[ai]};
                assert_int_equal(mp_gemm_ex(&g), MP_OK);
                mp_convert(want, cts[ci], c32, MP_F32, (size_t)(m * n));
                g.c = c16;
                g.c_type = cts[ci];
                assert_int_equal(mp_gemm_ex(&g), MP_OK);
                for (int64_t i = 0; i < m * n; i++)
                    if (c16[i] != want[i])
                        fail_msg("%s %s %lldx%lldx%lld on %s: element %lld is 0x%04x, the "
                                 "rounded float32 result 0x%04x",
                                 mp_dtype_name(cts[ci]),
                                 ai == 0   ? "linear"
                                 : ai == 1 ? "relu"
                                           : "gelu",
                                 (long long)m, (long long)n, (long long)k,
                                 mp_isa_name(mp_isa_active()), (long long)i, c16[i], want[i]);
            }
        free(a);
        free(b);
        free(bias);
        free(c32);
        free(c16);
        free(want);
    }
}

static void test_rounded_once(void **state)
{
    (void)state;
    for_each_isa(rounded_once_body, 11);
}

static void test_alpha_zero(void **state)
{
    (void)state;
    float a[6] = {NAN, NAN, NAN, NAN, NAN, NAN}, b[6] = {1, 2, 3, 4, 5, 6};
    float c[4] = {1, 2, 3, 4};
    mp_gemm(false, false, 2, 2, 3, 0.0f, a, MP_F32, 3, b, MP_F32, 2, 2.0f, c, MP_F32, 2);
    assert_true(c[0] == 2 && c[1] == 4 && c[2] == 6 && c[3] == 8);
    /* And NaN in the inputs does propagate otherwise. */
    mp_gemm(false, false, 2, 2, 3, 1.0f, a, MP_F32, 3, b, MP_F32, 2, 0.0f, c, MP_F32, 2);
    assert_true(isnan(c[0]) && isnan(c[3]));
}

static void det_run(int threads, mp_dtype t, void *a, void *b, float *c, int64_t m, int64_t n,
                    int64_t k)
{
    mp_set_num_threads(threads);
    mp_gemm(false, true, m, n, k, 1.0f, a, t, k, b, t, k, 0.0f, c, MP_F32, n);
}

/* Same bits on every run and for every thread count (no K split), on a
 * C split by rows and on one split by columns (where the threads share the
 * packing of A), and from inside a caller's parallel region (a team of one
 * running every thread's part). */
static void test_determinism(void **state)
{
    (void)state;
    const int64_t shapes[2][3] = {{333, 290, 1500}, {100, 1400, 700}};
    test_rng r = {77};
    mp_isa isas[MP_ISA_COUNT];
    int ni = test_isas(isas);
    mp_isa saved = mp_isa_active();
    int saved_threads = mp_num_threads();
    const size_t most = 850 * 1500;
    float *f = malloc(most * sizeof(float));
    for (size_t i = 0; i < most; i++) f[i] = (float)test_rng_uniform(&r, -1, 1);
    void *h = malloc(most * 4);
    float *c1 = malloc(333 * 700 * sizeof(float));
    float *c2 = malloc(333 * 700 * sizeof(float));
    const mp_dtype ts[2] = {MP_F32, MP_BF16};
    for (int ii = 0; ii < ni; ii++) {
        mp_isa_set(isas[ii]);
        for (int si = 0; si < 2; si++) {
            const int64_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
            for (int ti = 0; ti < 2; ti++) {
                mp_convert(h, ts[ti], f, MP_F32, (size_t)((m + n) * k));
                void *b = (char *)h + (size_t)(m * k) * mp_dtype_size(ts[ti]);
                det_run(2, ts[ti], h, b, c1, m, n, k);
                for (int rep = 0; rep < 4; rep++) {
                    det_run(rep == 1 ? 1 : rep == 3 ? 3 : 2, ts[ti], h, b, c2, m, n, k);
                    assert_memory_equal(c1, c2, (size_t)(m * n) * sizeof(float));
                }
                memset(c2, 0, (size_t)(m * n) * sizeof(float));
#pragma omp parallel num_threads(2)
                {
#ifdef _OPENMP
                    if (omp_get_thread_num() == 0)
#endif
                        det_run(2, ts[ti], h, b, c2, m, n, k);
                }
                assert_memory_equal(c1, c2, (size_t)(m * n) * sizeof(float));
            }
        }
    }
    mp_set_num_threads(saved_threads);
    mp_isa_set(saved);
    free(f);
    free(h);
    free(c1);
    free(c2);
}

/* c_nonfinite, one case: C = alpha A B + beta C (A m x k, B k x n, both
 * float32 or bfloat16, transposed as asked) with finite inputs of about
 * 1, except that `bad` puts huge values (1e30, finite: only their product
 * overflows, to inf in C(bi, bj) alone) or a NaN (NaN in row bi and column
 * bj of C) at A(bi, 0) and B(0, bj). bad: 0 none, 1 overflow, 2 NaN.
 * Returns the report, after checking that C holds non-finite values where
 * expected and nowhere else. */
static bool nonfinite_case(int64_t m, int64_t n, int64_t k, bool ta, bool tb, mp_dtype t,
                           float alpha, bool gelu, int bad, int64_t bi, int64_t bj, test_rng *r)
{
    const size_t es = mp_dtype_size(t);
    float *af = malloc((size_t)(m * k) * sizeof *af), *bf = malloc((size_t)(k * n) * sizeof *bf);
    void *a = malloc((size_t)(m * k) * es), *b = malloc((size_t)(k * n) * es);
    float *c = malloc((size_t)(m * n) * sizeof *c), *bias = calloc((size_t)n, sizeof *bias);
    assert_non_null(af && bf && a && b && c && bias);
    for (int64_t i = 0; i < m * k; i++) af[i] = (float)test_rng_uniform(r, 0.5, 1.0);
    for (int64_t i = 0; i < k * n; i++) bf[i] = (float)test_rng_uniform(r, 0.5, 1.0);
    const int64_t lda = ta ? m : k, ldb = tb ? k : n;
    if (bad) {
        const float v = bad == 1 ? 1e30f : NAN;
        af[ta ? bi : bi * lda] = v; /* A(bi, 0) */
        bf[tb ? bj * ldb : bj] = v; /* B(0, bj) */
    }
    mp_convert(a, t, af, MP_F32, (size_t)(m * k));
    mp_convert(b, t, bf, MP_F32, (size_t)(k * n));
    for (int64_t i = 0; i < m * n; i++) c[i] = 1.0f;
    bool flag = false;
    mp_gemm_args g = mp_gemm_args_default();
    g.trans_a = ta, g.trans_b = tb;
    g.m = m, g.n = n, g.k = k;
    g.alpha = alpha;
    g.a = a, g.a_type = t, g.lda = lda;
    g.b = b, g.b_type = t, g.ldb = ldb;
    g.c = c, g.ldc = n;
    g.c_nonfinite = &flag;
    if (gelu) { /* the epilogue's row path: an activation on the way to a float32 C */
        g.bias = bias;
        g.activation = MP_ACT_GELU_TANH;
    }
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            assert_int_equal(!isfinite(c[i * n + j]),
                             bad == 1 ? i == bi && j == bj : bad == 2 && (i == bi || j == bj));
    free(af), free(bf), free(a), free(b), free(c), free(bias);
    return flag;
}

/* c_nonfinite: reported exactly when C holds a NaN or an infinity, from a
 * NaN input or from finite inputs whose sum overflows, wherever it lies
 * (the first tile, the last and partial ones, the middle), through every
 * way the driver writes C: straight from the kernel (alpha 1), through
 * the epilogue (alpha 2), depth blocks chained through partial sums (k
 * beyond the depth block), a thin C computed transposed, bfloat16 inputs;
 * on every ISA path. A report already true stays true; a C of another
 * type is refused. */
static void nonfinite_body(test_rng *r)
{
    const struct {
        int64_t m, n, k;
        bool ta, tb;
    } shapes[] = {{37, 53, 29, false, false},
                  {64, 96, 16, true, false},
                  {19, 130, 5000, false, true},
                  {300, 10, 40, false, false},
                  {300, 10, 40, true, false}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int ti = 0; ti < 2; ti++)
            for (int al = 0; al < 3; al++) { /* alpha 1, alpha 2, a bias and GELU */
                const int64_t m = shapes[s].m, n = shapes[s].n, k = shapes[s].k;
                const mp_dtype t = ti ? MP_BF16 : MP_F32;
                const float alpha = al == 1 ? 2.0f : 1.0f;
                const bool ta = shapes[s].ta, tb = shapes[s].tb, gelu = al == 2;
                assert_false(nonfinite_case(m, n, k, ta, tb, t, alpha, gelu, 0, 0, 0, r));
                const int64_t at[3][2] = {{0, 0}, {m - 1, n - 1}, {m / 2, n / 3}};
                for (int p = 0; p < 3; p++)
                    for (int bad = 1; bad <= 2; bad++)
                        assert_true(nonfinite_case(m, n, k, ta, tb, t, alpha, gelu, bad, at[p][0],
                                                   at[p][1], r));
            }
}

static void expect_invalid(const mp_gemm_args *g, const char *what);

static void test_c_nonfinite(void **state)
{
    (void)state;
    for_each_isa(nonfinite_body, 71);
    /* left true; refused for a bfloat16 C; alpha 0 still reports beta C */
    float a[4] = {1, 1, 1, 1}, b[4] = {1, 1, 1, 1}, c[4] = {1, 1, 1, 1};
    bool flag = true;
    mp_gemm_args g = mp_gemm_args_default();
    g.m = g.n = g.k = 2;
    g.a = a, g.b = b, g.c = c;
    g.lda = g.ldb = g.ldc = 2;
    g.c_nonfinite = &flag;
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
    assert_true(flag);
    flag = false;
    g.alpha = 0.0f;
    g.beta = 1.0f;
    c[3] = INFINITY;
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
    assert_true(flag);
    g.c_type = MP_BF16;
    expect_invalid(&g, "c_nonfinite");
}

static void expect_invalid(const mp_gemm_args *g, const char *what)
{
    mp_clear_error();
    assert_int_equal(mp_gemm_ex(g), MP_ERR_INVALID);
    const char *msg = mp_last_error();
    if (!strstr(msg, what)) fail_msg("message '%s' does not mention '%s'", msg, what);
}

static void test_invalid_args(void **state)
{
    (void)state;
    float a[64] = {0}, b[64] = {0}, c[64];
    for (int i = 0; i < 64; i++) c[i] = 42.0f;
    mp_gemm_args g = mp_gemm_args_default();
    g.m = 4;
    g.n = 4;
    g.k = 4;
    g.a = a;
    g.b = b;
    g.c = c;
    g.lda = g.ldb = g.ldc = 4;
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
    for (int i = 0; i < 64; i++) c[i] = 42.0f;

    mp_gemm_args x = g;
    x.m = -1;
    expect_invalid(&x, "negative");
    x = g;
    x.lda = 3;
    expect_invalid(&x, "lda");
    x = g;
    x.trans_b = true;
    x.n = 8;
    x.ldc = 8;
    x.ldb = 3;
    expect_invalid(&x, "ldb");
    x = g;
    x.ldc = 2;
    expect_invalid(&x, "ldc");
    x = g;
    x.c_type = MP_F8E4M3;
    expect_invalid(&x, "output dtype");
    x = g;
    x.a_type = (mp_dtype)9;
    expect_invalid(&x, "dtype");
    x = g;
    x.a = NULL;
    expect_invalid(&x, "a is NULL");
    x = g;
    x.activation = (mp_activation)17;
    expect_invalid(&x, "activation");
    assert_int_equal(mp_gemm_ex(NULL), MP_ERR_INVALID);
    /* mp_gemm reports through mp_last_error and leaves C alone. */
    mp_clear_error();
    mp_gemm(false, false, 4, 4, 4, 1.0f, a, MP_F32, 2, b, MP_F32, 4, 0.0f, c, MP_F32, 4);
    assert_true(strlen(mp_last_error()) > 0);
    for (int i = 0; i < 64; i++) assert_true(c[i] == 42.0f);
    /* Empty problems are valid, including ld = 1 for zero-width rows. */
    x = g;
    x.k = 0;
    x.lda = 1;
    x.ldb = 4;
    assert_int_equal(mp_gemm_ex(&x), MP_OK);
    x = g;
    x.m = 0;
    x.a = NULL;
    x.c = NULL;
    assert_int_equal(mp_gemm_ex(&x), MP_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invalid_args),
        cmocka_unit_test(test_alpha_zero),
        cmocka_unit_test(test_type_combinations),
        cmocka_unit_test(test_size_cross),
        cmocka_unit_test(test_epilogue),
        cmocka_unit_test(test_rounded_once),
        cmocka_unit_test(test_large),
        cmocka_unit_test(test_shared_a_blocks),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_c_nonfinite),
    };
    return cmocka_run_group_tests_name("gemm", tests, NULL, NULL);
}
