/* gemm_row_avx512bf16.c - the vdpbf16ps path's row kernel
 * (gemm_impl.kernel_row): one row of C from one row of A (bfloat16 pairs,
 * a zero past an odd depth) and B's rows where they lie (bfloat16, or
 * float8 decoded exactly as loaded), for the products with a C of one or
 * two rows (gemm_rows.c): a decoder's step through bfloat16 weights. Two of
 * B's rows interleave in registers (vpunpcklwd / vpunpckhwd) into the
 * pairs the packer writes, and each element's sum is the tiles' in
 * gemm_avx512bf16.c: one vdpbf16ps per pair of depths, in order, from zero,
 * so it has their bits (subnormals read as zero included). Compiled with
 * target attributes and only reached after runtime CPU detection. */
#include <string.h>

#include "kernels/gemm_avx512bf16_load.h"

#if MP_X86

/* 32 consecutive elements of B's row at p as bf16 bits; lanes past cnt are
 * zero and their memory is not touched. */
MP_TARGET_AVX512BF16 static inline __m512i load32(const char *p, mp_dtype t, int cnt,
                                                  const mp_gemm_fp8_lut *l)
{
    if (t == MP_BF16)
        return cnt >= 32 ? _mm512_loadu_si512(p)
                         : _mm512_maskz_loadu_epi16((__mmask32)((1ull << cnt) - 1), p);
    return mp_gemm_fp8_load32(p, cnt, l);
}

/* One pair of depths into nv blocks of 32 columns: rows r0 and r1 (r1 NULL:
 * the zero that pads an odd depth), the last block cnt columns wide. */
MP_TARGET_AVX512BF16 static inline __attribute__((always_inline)) void
pair_step(__m512bh av, const char *r0, const char *r1, mp_dtype t, const mp_gemm_fp8_lut *l, int es,
          __m512 *lo, __m512 *hi, int nv, int cnt)
{
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++) {
        const int n = v == nv - 1 ? cnt : 32;
        const __m512i x0 = load32(r0 + 32 * v * es, t, n, l);
        const __m512i x1 = r1 ? load32(r1 + 32 * v * es, t, n, l) : _mm512_setzero_si512();
        lo[v] = _mm512_dpbf16_ps(lo[v], av, (__m512bh)_mm512_unpacklo_epi16(x0, x1));
        hi[v] = _mm512_dpbf16_ps(hi[v], av, (__m512bh)_mm512_unpackhi_epi16(x0, x1));
    }
}

/* nv (1..4) blocks of 32 columns of one row of C, the last cnt wide: one
 * broadcast of A's pair per two rows of B, whose lines are asked for
 * `ahead` bytes ahead. */
MP_TARGET_AVX512BF16 static inline __attribute__((always_inline)) void
row_block(int64_t kc, const uint16_t *a, const char *b, int64_t sbb, int64_t ahead, mp_dtype t,
          const mp_gemm_fp8_lut *l, float *c, int nv, int cnt)
{
    const int es = t == MP_BF16 ? 2 : 1, bytes = 32 * nv * es;
    __m512 lo[4], hi[4];
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++) lo[v] = hi[v] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 1 < kc; k += 2, b += 2 * sbb) {
#pragma GCC unroll 4
        for (int o = 0; o < bytes; o += 64) {
            _mm_prefetch(b + ahead + o, _MM_HINT_T0);
            _mm_prefetch(b + sbb + ahead + o, _MM_HINT_T0);
        }
        _mm_prefetch(b + ahead + bytes - 1, _MM_HINT_T0); /* rows off a line's start */
        _mm_prefetch(b + sbb + ahead + bytes - 1, _MM_HINT_T0);
        uint32_t pair;
        memcpy(&pair, a + k, sizeof pair);
        pair_step((__m512bh)_mm512_set1_epi32((int)pair), b, b + sbb, t, l, es, lo, hi, nv, cnt);
    }
    if (k < kc) { /* the last of an odd depth, paired with zeros as packed */
        uint32_t pair;
        memcpy(&pair, a + k, sizeof pair);
        pair_step((__m512bh)_mm512_set1_epi32((int)pair), b, NULL, t, l, es, lo, hi, nv, cnt);
    }
    /* lo's lanes 4q..4q+3 hold columns 8q..8q+3, hi's columns 8q+4..8q+7 */
    const __m512i first = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i second =
        _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++) {
        const int n = v == nv - 1 ? cnt : 32;
        mp_store16(c + 32 * v, mp_lanes16(n), _mm512_permutex2var_ps(lo[v], first, hi[v]));
        if (n > 16)
            mp_store16(c + 32 * v + 16, mp_lanes16(n - 16),
                       _mm512_permutex2var_ps(lo[v], second, hi[v]));
    }
}

/* row_block's passes for B of type T over columns [j, n) from j: 128
 * columns at a time, then 32, then what is left. */
#define ROW_PASSES(T)                                                                              \
    do {                                                                                           \
        const int es = (T) == MP_BF16 ? 2 : 1;                                                     \
        for (; j + 128 <= n; j += 128)                                                             \
            row_block(kc, a, bp + j * es, sbb, ahead, T, &l, c + j, 4, 32);                        \
        for (; j + 32 <= n; j += 32)                                                               \
            row_block(kc, a, bp + j * es, sbb, ahead, T, &l, c + j, 1, 32);                        \
        if (j < n) row_block(kc, a, bp + j * es, sbb, ahead, T, &l, c + j, 1, (int)(n - j));       \
    } while (0)

/* One row of C (gemm_impl.kernel_row), A's row as bfloat16 pairs. */
MP_TARGET_AVX512BF16 void mp_gemm_row_avx512bf16(int64_t kc, const void *av, const void *b,
                                                 int64_t sb, mp_dtype bt, float *c, int64_t n)
{
    const uint16_t *a = av;
    const char *bp = b;
    const int64_t sbb = sb * (bt == MP_BF16 ? 2 : 1);
    const int64_t ahead = mp_gemm_rows_ahead(sbb, 16) * sbb; /* in bytes */
    int64_t j = 0;
    const mp_gemm_fp8_lut l = mp_gemm_fp8_lut_for(bt);
    if (bt == MP_BF16)
        ROW_PASSES(MP_BF16);
    else if (bt == MP_F8E4M3)
        ROW_PASSES(MP_F8E4M3);
    else
        ROW_PASSES(MP_F8E5M2);
}
#undef ROW_PASSES

#endif
