/* attention_rows.h - the products of the attention kernel (attention.c,
 * its only includer): four query rows (or keys) at a time against a tile's
 * rows, ragged ranges, and the row statistics of the online softmax. All
 * static and forced inline, so they are compiled inside attention.c's
 * per-ISA clones; every sum runs in one fixed order of fused multiply-adds
 * (fmaf), so each clone and the AVX-512 forms give the same bits. */
#ifndef MP_ATTENTION_ROWS_H
#define MP_ATTENTION_ROWS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/internal.h"
#include "kernels/gemm_simd.h"

#define CH 16 /* lanes of the vectorizable blocks */

/* The loops with products live inside the clones: a copy left out of line
 * would be built for the default target, where fmaf is a library call. */
#if defined(__GNUC__)
#define INLINE static inline __attribute__((always_inline))
#else
#define INLINE static inline
#endif

static size_t pad16(size_t n) { return (n + CH - 1) & ~(size_t)(CH - 1); }

/* The portable form of gemv_t (below): y[0..n) = (add ? y : 0) + sum over
 * k < m, in order, of x[k * incx] * a[k * lda + 0..n), a block of CH sums
 * at a time. */
INLINE void gemv_t_loop(float *restrict y, const float *restrict x, int64_t incx,
                        const float *restrict a, int64_t lda, int64_t m, int64_t n, bool add)
{
    for (int64_t i0 = 0; i0 < n; i0 += CH) {
        float acc[CH];
        for (int i = 0; i < CH; i++) acc[i] = add ? y[i0 + i] : 0.0f;
        for (int64_t k = 0; k < m; k++) {
            const float xk = x[k * incx], *ar = a + k * lda + i0;
            for (int i = 0; i < CH; i++) acc[i] = fmaf(xk, ar[i], acc[i]);
        }
        for (int i = 0; i < CH; i++) y[i0 + i] = acc[i];
    }
}

#if MP_X86
#include <immintrin.h>

/* gemv_t4 for n = 16 nv (nv = 1..4) on AVX-512: the four rows' sums in
 * 4 nv registers, so each k loads nv vectors of a and 4 broadcasts for
 * 4 nv products (the generic loop reloads a for every 16 columns). The
 * same operations in the same order (one fused multiply-add per term), so
 * the same bits. */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) void
gemv_t4_avx512_nv(float *restrict y, int64_t ldy, const float *restrict x, int64_t incx,
                  int64_t ldx, const float *restrict a, int64_t lda, int64_t m, bool add, int nv)
{
    __m512 c[4][4]; /* every loop over it unrolled, so it stays in registers */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            c[j][v] = add ? _mm512_loadu_ps(y + j * ldy + 16 * v) : _mm512_setzero_ps();
    for (int64_t k = 0; k < m; k++) {
        const float *ar = a + k * lda, *xk = x + k * incx;
        __m512 av[4];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) av[v] = _mm512_loadu_ps(ar + 16 * v);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m512 xb = _mm512_set1_ps(xk[j * ldx]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) c[j][v] = _mm512_fmadd_ps(xb, av[v], c[j][v]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(y + j * ldy + 16 * v, c[j][v]);
}

MP_TARGET_AVX512 __attribute__((noinline)) static void
gemv_t4_avx512(float *restrict y, int64_t ldy, const float *restrict x, int64_t incx, int64_t ldx,
               const float *restrict a, int64_t lda, int64_t m, int64_t n, bool add)
{
    switch (n / 16) {
    case 1:
        gemv_t4_avx512_nv(y, ldy, x, incx, ldx, a, lda, m, add, 1);
        break;
    case 2:
        gemv_t4_avx512_nv(y, ldy, x, incx, ldx, a, lda, m, add, 2);
        break;
    case 3:
        gemv_t4_avx512_nv(y, ldy, x, incx, ldx, a, lda, m, add, 3);
        break;
    default:
        gemv_t4_avx512_nv(y, ldy, x, incx, ldx, a, lda, m, add, 4);
        break;
    }
}

/* The AVX2 forms, for n a multiple of 16. The portable loops below keep
 * their CH sums in arrays that GCC leaves in memory (a load, an FMA and a
 * store per term: on a Zen 3 the backward ran at 0.85-0.90x the plain
 * formula's GEMMs); here they stay in registers. gemv_t4: four rows of 16
 * columns are 8 sums, each k two loads of a and four broadcasts. gemv_t:
 * one row of 16 nv columns (nv = 1..4) is 2 nv independent sums, so the
 * FMAs of successive k overlap. The same operations in the same order, so
 * the same bits as the portable loops. */
MP_TARGET_AVX2 __attribute__((noinline)) static void
gemv_t4_avx2(float *restrict y, int64_t ldy, const float *restrict x, int64_t incx, int64_t ldx,
             const float *restrict a, int64_t lda, int64_t m, int64_t n, bool add)
{
    for (int64_t i0 = 0; i0 < n; i0 += 16) {
        __m256 c[4][2];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
#pragma GCC unroll 2
            for (int v = 0; v < 2; v++)
                c[j][v] = add ? _mm256_loadu_ps(y + j * ldy + i0 + 8 * v) : _mm256_setzero_ps();
        for (int64_t k = 0; k < m; k++) {
            const float *ar = a + k * lda + i0, *xk = x + k * incx;
            const __m256 a0 = _mm256_loadu_ps(ar), a1 = _mm256_loadu_ps(ar + 8);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m256 xb = _mm256_broadcast_ss(xk + j * ldx);
                c[j][0] = _mm256_fmadd_ps(xb, a0, c[j][0]);
                c[j][1] = _mm256_fmadd_ps(xb, a1, c[j][1]);
            }
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
#pragma GCC unroll 2
            for (int v = 0; v < 2; v++) _mm256_storeu_ps(y + j * ldy + i0 + 8 * v, c[j][v]);
    }
}

/* gemv_t's sums with a's rows ld bytes apart and of type t (float32, or
 * bfloat16 widened as loaded: a decoder's cache rows, read in place),
 * asked for 8 rows ahead where `ask`. */
MP_TARGET_AVX2 static inline __attribute__((always_inline)) void
gemv_rows_nv(float *restrict y, const float *restrict x, int64_t incx, const char *a, int64_t ld,
             mp_dtype t, int64_t m, bool add, bool ask, int nv)
{
    const int64_t es = mp_widen_size(t);
    __m256 c[8];
#pragma GCC unroll 8
    for (int v = 0; v < 2 * nv; v++) c[v] = add ? _mm256_loadu_ps(y + 8 * v) : _mm256_setzero_ps();
    for (int64_t k = 0; k < m; k++) {
        const __m256 xb = _mm256_broadcast_ss(x + k * incx);
        const char *ar = a + k * ld;
        if (ask) {
            _mm_prefetch(ar + 8 * ld, _MM_HINT_T0);
            _mm_prefetch(ar + 8 * ld + 16 * nv * es - 1, _MM_HINT_T0);
        }
#pragma GCC unroll 8
        for (int v = 0; v < 2 * nv; v++)
            c[v] = _mm256_fmadd_ps(xb, mp_widen8(ar + 8 * v * es, t), c[v]);
    }
#pragma GCC unroll 8
    for (int v = 0; v < 2 * nv; v++) _mm256_storeu_ps(y + 8 * v, c[v]);
}

MP_TARGET_AVX2 static inline __attribute__((always_inline)) void
gemv_rows(float *restrict y, const float *restrict x, int64_t incx, const char *a, int64_t ld,
          mp_dtype t, int64_t m, int64_t n, bool add, bool ask)
{
    const int64_t es = mp_widen_size(t);
    for (int64_t i0 = 0; i0 < n; i0 += 64) {
        const char *ai = a + i0 * es;
        switch ((n - i0) / 16) {
        case 1:
            gemv_rows_nv(y + i0, x, incx, ai, ld, t, m, add, ask, 1);
            break;
        case 2:
            gemv_rows_nv(y + i0, x, incx, ai, ld, t, m, add, ask, 2);
            break;
        case 3:
            gemv_rows_nv(y + i0, x, incx, ai, ld, t, m, add, ask, 3);
            break;
        default:
            gemv_rows_nv(y + i0, x, incx, ai, ld, t, m, add, ask, 4);
            break;
        }
    }
}

MP_TARGET_AVX2 __attribute__((noinline)) static void
gemv_t_avx2(float *restrict y, const float *restrict x, int64_t incx, const float *restrict a,
            int64_t lda, int64_t m, int64_t n, bool add)
{
    gemv_rows(y, x, incx, (const char *)a, lda * (int64_t)sizeof(float), MP_F32, m, n, add, false);
}
/* Columns [0, len) of 8 rows of blk (ldb floats apart; len rounded up to 8
 * read, zeros past len where the caller pads) into rows [0, len) of 8
 * columns of dst (ldd floats apart): 8 x 8 blocks transposed in registers
 * by the GEMM packers' mp_gemm_tr8. Data movement only: exact. */
MP_TARGET_AVX2 __attribute__((noinline)) static void transpose8_avx2(float *restrict dst,
                                                                     int64_t ldd,
                                                                     const float *restrict blk,
                                                                     int64_t ldb, int64_t len)
{
    for (int64_t k = 0; k < len; k += 8) {
        __m256 r[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) r[j] = _mm256_loadu_ps(blk + j * ldb + k);
        mp_gemm_tr8(r);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(dst + (k + c) * ldd, r[c]);
    }
}

/* A decoding query's products read straight from the caches (float32 or
 * bfloat16 rows ld bytes apart, widened as loaded, d a multiple of 16),
 * instead of a tile's keys transposed and its values copied into the
 * workspace first and read back by gemv_t: the same fused multiply-adds in
 * the same order, so gemv_t's bits.
 * Scores: s[c] for the nc keys at k, each the sum over j < d, in order, of
 * q[j] k[c][j] from zero; 8 keys at a time, 8 of their dims widened and
 * transposed in registers (mp_gemm_tr8), one FMA per dim into the 8 keys'
 * lanes; a last group's missing keys are zero rows. s is written up to nc
 * rounded up to 8. */
MP_TARGET_AVX2 static inline __attribute__((always_inline)) void
scores_rows_t(float *restrict s, const float *restrict q, const char *k, int64_t ld, mp_dtype t,
              int64_t d, int64_t nc)
{
    const int64_t es = mp_widen_size(t);
    for (int64_t c = 0; c < nc; c += 8) {
        const int64_t nk = nc - c < 8 ? nc - c : 8;
        const char *rows = k + c * ld;
        for (int64_t r = 8; r < 16 && c + r < nc; r++) /* the next group's rows */
            for (int64_t x = 0; x < d * es; x += 64) _mm_prefetch(rows + r * ld + x, _MM_HINT_T0);
        __m256 acc = _mm256_setzero_ps();
        for (int64_t j0 = 0; j0 < d; j0 += 8) {
            __m256 r[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                r[i] = i < nk ? mp_widen8(rows + i * ld + j0 * es, t) : _mm256_setzero_ps();
            mp_gemm_tr8(r);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                acc = _mm256_fmadd_ps(_mm256_broadcast_ss(q + j0 + i), r[i], acc);
        }
        _mm256_storeu_ps(s + c, acc);
    }
}

/* Both, on a float32 or bfloat16 cache (the type folded into each copy).
 * The decoder's (attention.c); unused by the backward's file. */
MP_TARGET_AVX2 __attribute__((noinline, unused)) static void
scores_rows_avx2(float *restrict s, const float *restrict q, const void *k, int64_t ld, mp_dtype t,
                 int64_t d, int64_t nc)
{
    if (t == MP_BF16)
        scores_rows_t(s, q, k, ld, MP_BF16, d, nc);
    else
        scores_rows_t(s, q, k, ld, MP_F32, d, nc);
}

/* Values: acc[0..d) += the sum over c < nc, in order, of s[c] v[c][0..d):
 * gemv_t's loop on the cache's rows. */
MP_TARGET_AVX2 __attribute__((noinline, unused)) static void
values_rows_avx2(float *restrict acc, const float *restrict s, const void *v, int64_t ld,
                 mp_dtype t, int64_t d, int64_t nc)
{
    if (t == MP_BF16)
        gemv_rows(acc, s, 1, v, ld, MP_BF16, nc, d, true, true);
    else
        gemv_rows(acc, s, 1, v, ld, MP_F32, nc, d, true, true);
}
#endif

/* Which explicit form of gemv_t and gemv_t4 this CPU runs, if any (set by
 * the entry points before their tasks start; MP_ISA_SCALAR: the portable
 * loops). */
static bool wide_gemv, avx2_gemv;

static void choose_gemv(void)
{
#if MP_X86
    wide_gemv = mp_isa_active() >= MP_ISA_AVX512;
    avx2_gemv = mp_isa_active() >= MP_ISA_AVX2;
#endif
}

/* y[0..n) = (add ? y : 0) + sum over k < m, in order, of x[k * incx] *
 * a[k * lda + 0..n): the AVX2 form where it runs, the same bits. */
INLINE void gemv_t(float *restrict y, const float *restrict x, int64_t incx,
                   const float *restrict a, int64_t lda, int64_t m, int64_t n, bool add)
{
#if MP_X86
    if (avx2_gemv && n % 16 == 0) {
        gemv_t_avx2(y, x, incx, a, lda, m, n, add);
        return;
    }
#endif
    gemv_t_loop(y, x, incx, a, lda, m, n, add);
}

/* Four gemv_t at once: y + j * ldy = (add ? .. : 0) + sum over k < m, in
 * order, of x[j * ldx + k * incx] * a[k * lda + 0..n) for j < 4. One load
 * of a serves four rows; each row's sums run in gemv_t's order, so the
 * results are its bits. */
INLINE void gemv_t4(float *restrict y, int64_t ldy, const float *restrict x, int64_t incx,
                    int64_t ldx, const float *restrict a, int64_t lda, int64_t m, int64_t n,
                    bool add)
{
#if MP_X86
    if (wide_gemv && n <= 64 && n % 16 == 0) {
        gemv_t4_avx512(y, ldy, x, incx, ldx, a, lda, m, n, add);
        return;
    }
    if (avx2_gemv && n % 16 == 0) {
        gemv_t4_avx2(y, ldy, x, incx, ldx, a, lda, m, n, add);
        return;
    }
#endif
    for (int64_t i0 = 0; i0 < n; i0 += CH) {
        float c0[CH], c1[CH], c2[CH], c3[CH];
        for (int i = 0; i < CH; i++) {
            c0[i] = add ? y[i0 + i] : 0.0f;
            c1[i] = add ? y[ldy + i0 + i] : 0.0f;
            c2[i] = add ? y[2 * ldy + i0 + i] : 0.0f;
            c3[i] = add ? y[3 * ldy + i0 + i] : 0.0f;
        }
        for (int64_t k = 0; k < m; k++) {
            const float *xk = x + k * incx, *ar = a + k * lda + i0;
            const float x0 = xk[0], x1 = xk[ldx], x2 = xk[2 * ldx], x3 = xk[3 * ldx];
            for (int i = 0; i < CH; i++) {
                c0[i] = fmaf(x0, ar[i], c0[i]);
                c1[i] = fmaf(x1, ar[i], c1[i]);
                c2[i] = fmaf(x2, ar[i], c2[i]);
                c3[i] = fmaf(x3, ar[i], c3[i]);
            }
        }
        for (int i = 0; i < CH; i++) {
            y[i0 + i] = c0[i];
            y[ldy + i0 + i] = c1[i];
            y[2 * ldy + i0 + i] = c2[i];
            y[3 * ldy + i0 + i] = c3[i];
        }
    }
}

/* gemv_t4 on four sums of different lengths m[j] from the same start:
 * the common part four rows at a time, then each row's rest on its own.
 * Every sum still runs in gemv_t's order, so the bits are those of one row
 * at a time, and no row reads a term past its own length (a masked key's
 * value, however large, never meets a zero weight). */
INLINE void gemv_t4_ragged(float *restrict y, int64_t ldy, const float *restrict x, int64_t incx,
                           int64_t ldx, const float *restrict a, int64_t lda, const int64_t m[4],
                           int64_t n, bool add)
{
    int64_t lo = m[0];
    for (int j = 1; j < 4; j++) lo = m[j] < lo ? m[j] : lo;
    gemv_t4(y, ldy, x, incx, ldx, a, lda, lo, n, add);
    for (int j = 0; j < 4; j++)
        if (m[j] > lo)
            gemv_t(y + j * ldy, x + j * ldx + lo * incx, incx, a + lo * lda, lda, m[j] - lo, n,
                   true);
}

/* The larger of m and the n scores (NaN scores never win), in CH lanes:
 * max is exact, so the lanes change nothing but the time. */
INLINE float row_max(const float *x, int64_t n, float m)
{
    float lane[CH];
    for (int i = 0; i < CH; i++) lane[i] = m;
    int64_t c = 0;
    for (; c + CH <= n; c += CH)
        for (int i = 0; i < CH; i++) lane[i] = x[c + i] > lane[i] ? x[c + i] : lane[i];
    for (int i = 0; c + i < n; i++) lane[i] = x[c + i] > lane[i] ? x[c + i] : lane[i];
    for (int i = 0; i < CH; i++) m = lane[i] > m ? lane[i] : m;
    return m;
}

/* The sum of n weights: element c into lane c % CH, the lanes added in
 * order at the end (a fixed order: the same bits every time). */
INLINE float row_total(const float *x, int64_t n)
{
    float lane[CH] = {0};
    int64_t c = 0;
    for (; c + CH <= n; c += CH)
        for (int i = 0; i < CH; i++) lane[i] += x[c + i];
    for (int i = 0; c + i < n; i++) lane[i] += x[c + i];
    float t = 0.0f;
    for (int i = 0; i < CH; i++) t += lane[i];
    return t;
}

/* x . y over n terms, term c fused into lane c % CH, the lanes added in
 * order at the end. */
INLINE float row_dot(const float *x, const float *y, int64_t n)
{
    float lane[CH] = {0};
    int64_t c = 0;
    for (; c + CH <= n; c += CH)
        for (int i = 0; i < CH; i++) lane[i] = fmaf(x[c + i], y[c + i], lane[i]);
    for (int i = 0; c + i < n; i++) lane[i] = fmaf(x[c + i], y[c + i], lane[i]);
    float t = 0.0f;
    for (int i = 0; i < CH; i++) t += lane[i];
    return t;
}

static inline void scal(float *y, float a, int64_t n)
{
    for (int64_t i0 = 0; i0 < n; i0 += CH)
        for (int i = 0; i < CH; i++) y[i0 + i] *= a;
}

#endif
