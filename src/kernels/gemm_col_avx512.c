/* gemm_col_avx512.c - the AVX-512 float32 path's column kernel
 * (gemm_impl.kernel_cols): 16 rows of a C of few columns (a classifier's
 * ten logits for a batch: fc3's forward, 1024x10x4096) from A's rows where
 * they lie, for gemm_cols.c. The 8x48 tiles spend a broadcast of A and an
 * FMA on each of A's elements, 10 of the vector's 16 lanes useful; here
 * each 16 x 16 block of A (16 rows, 16 depths) is transposed in registers,
 * so that one vector holds the 16 rows' elements at one depth, and meets
 * B's element of each column broadcast: one FMA per column and depth for
 * 16 rows, one accumulator per column. Each element's sum runs over k in
 * order from zero with one FMA per product, as in the tiles: the same
 * bits. Compiled with target attributes and only reached after runtime CPU
 * detection. */
#include "kernels/gemm_avx512_common.h"

#if MP_X86

/* 16 elements of A's row at p, of a type mp_gemm_widens, widened exactly
 * (the first `cnt`, zeros past them). */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) __m512 row16(const char *p,
                                                                           mp_dtype t, int cnt)
{
    const __mmask16 m = (__mmask16)((1u << cnt) - 1);
    switch (t) {
    case MP_F32:
        return _mm512_maskz_loadu_ps(m, p);
    case MP_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
    case MP_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
    default: { /* float8: through the AVX2 decode (a last part copied: no read past the row) */
        if (cnt == 16)
            return _mm512_insertf32x8(_mm512_castps256_ps512(mp_widen8(p, t)), mp_widen8(p + 8, t),
                                      1);
        _Alignas(16) uint8_t x[32] = {0}; /* GCC's bounds check counts mp_widen8's 8 bytes as 16 */
        for (int i = 0; i < cnt; i++) x[i] = (uint8_t)p[i];
        return _mm512_insertf32x8(_mm512_castps256_ps512(mp_widen8((const char *)x, t)),
                                  mp_widen8((const char *)x + 8, t), 1);
    }
    }
}

/* The 16 rows' elements at depths d .. d + cnt - 1 (zeros past them and
 * past `rows`), transposed: r[x] holds depth d + x of each row. */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) void
block(const char *a, int64_t ld, int64_t d, mp_dtype at, int rows, int cnt, __m512i r[16])
{
    const int64_t es = (int64_t)mp_dtype_size(at);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        r[i] = i < rows ? _mm512_castps_si512(row16(a + i * ld + d * es, at, cnt))
                        : _mm512_setzero_si512();
    mp_transpose16x16_epi32(r);
}

/* t[i * ldt + j] (i < rows, j < N) = sum over d < kc of A(i, d) B(d, j):
 * A's row i at a + i * lda elements of type at, B packed as kc rows of
 * MP_GEMM_COLS_LDB floats. Rows past `rows` read as zeros and are not stored. */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) void
cols_core(int64_t kc, const char *a, int64_t lda, mp_dtype at, int rows, const float *b, float *t,
          int64_t ldt, const int N)
{
    const int64_t ld = lda * (int64_t)mp_dtype_size(at);
    __m512 acc[MP_GEMM_COLS_MAX];
#pragma GCC unroll 12
    for (int j = 0; j < N; j++) acc[j] = _mm512_setzero_ps();
    __m512i r[16];
    int64_t d = 0;
    for (; d + 16 <= kc; d += 16) {
        block(a, ld, d, at, rows, 16, r);
        const float *bd = b + d * MP_GEMM_COLS_LDB;
#pragma GCC unroll 16
        for (int x = 0; x < 16; x++)
#pragma GCC unroll 12
            for (int j = 0; j < N; j++)
                acc[j] = _mm512_fmadd_ps(_mm512_castsi512_ps(r[x]),
                                         _mm512_set1_ps(bd[x * MP_GEMM_COLS_LDB + j]), acc[j]);
    }
    if (d < kc) { /* the last depths: no FMA past kc (0 x inf would be NaN, -0 + 0 is +0) */
        const int cnt = (int)(kc - d);
        block(a, ld, d, at, rows, cnt, r);
        const float *bd = b + d * MP_GEMM_COLS_LDB;
        for (int x = 0; x < cnt; x++)
#pragma GCC unroll 12
            for (int j = 0; j < N; j++)
                acc[j] = _mm512_fmadd_ps(_mm512_castsi512_ps(r[x]),
                                         _mm512_set1_ps(bd[x * MP_GEMM_COLS_LDB + j]), acc[j]);
    }
    _Alignas(64) float o[MP_GEMM_COLS_MAX][16];
#pragma GCC unroll 12
    for (int j = 0; j < N; j++) _mm512_store_ps(o[j], acc[j]);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < N; j++) t[i * ldt + j] = o[j][i];
}

/* On N columns, a constant in each call: a full block of 16 float32 rows
 * (the type and the row test folded away), else any type and rows. */
#define COLS_N(N)                                                                                  \
    if (rows == 16 && at == MP_F32)                                                                \
        cols_core(kc, a, lda, MP_F32, 16, b, t, ldt, N);                                           \
    else                                                                                           \
        cols_core(kc, a, lda, at, rows, b, t, ldt, N);                                             \
    return

MP_TARGET_AVX512 void mp_gemm_col_avx512(int64_t kc, const void *av, int64_t lda, mp_dtype at,
                                         int rows, const float *b, int n, float *t, int64_t ldt)
{
    const char *a = av;
    switch (n) {
    case 1:
        COLS_N(1);
    case 2:
        COLS_N(2);
    case 3:
        COLS_N(3);
    case 4:
        COLS_N(4);
    case 5:
        COLS_N(5);
    case 6:
        COLS_N(6);
    case 7:
        COLS_N(7);
    case 8:
        COLS_N(8);
    case 9:
        COLS_N(9);
    case 10:
        COLS_N(10);
    case 11:
        COLS_N(11);
    default:
        COLS_N(12);
    }
}
#undef COLS_N

#endif
