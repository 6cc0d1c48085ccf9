/* gemm_row_avx512.c - the AVX-512 float32 path's row kernel
 * (gemm_impl.kernel_row): one row of C from one row of A and B's rows where
 * they lie, for the products with a C of one or two rows (gemm_rows.c): a
 * decoder's step through float32 or float16 weights. gemm_row_avx2.c's
 * loop on 512-bit vectors: each element's sum runs over k in order with one
 * FMA per product, as in the 8x48 tiles (gemm_avx512.c) and the AVX2 row
 * kernel, so it has their bits. Compiled with target attributes and only
 * reached after runtime CPU detection. */
#include <math.h>

#include "kernels/gemm_simd.h"

#if MP_X86

/* 16 consecutive elements of a type mp_gemm_widens, widened to f32 exactly */
MP_TARGET_AVX512 static inline __m512 widen16(const char *p, mp_dtype t)
{
    switch (t) {
    case MP_F32:
        return _mm512_loadu_ps((const float *)p);
    case MP_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    case MP_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
    default: /* float8: two halves through the AVX2 decode */
        return _mm512_insertf32x8(_mm512_castps256_ps512(mp_widen8(p, t)), mp_widen8(p + 8, t), 1);
    }
}

/* nv vectors of one row of C: one broadcast of a[k] per nv loads of B's row
 * k, whose lines are asked for `ahead` bytes ahead. */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) void
row_block(int64_t kc, const float *a, const char *b, int64_t sbb, int64_t ahead, mp_dtype t,
          float *c, int nv)
{
    __m512 acc[8];
#pragma GCC unroll 8
    for (int v = 0; v < nv; v++) acc[v] = _mm512_setzero_ps();
    const int es = (int)mp_widen_size(t), bytes = 16 * nv * es;
    for (int64_t k = 0; k < kc; k++, b += sbb) {
#pragma GCC unroll 8
        for (int o = 0; o < bytes; o += 64) _mm_prefetch(b + ahead + o, _MM_HINT_T0);
        _mm_prefetch(b + ahead + bytes - 1, _MM_HINT_T0); /* rows off a line's start */
        const __m512 av = _mm512_set1_ps(a[k]);
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++)
            acc[v] = _mm512_fmadd_ps(av, widen16(b + 16 * v * es, t), acc[v]);
    }
#pragma GCC unroll 8
    for (int v = 0; v < nv; v++) _mm512_storeu_ps(c + 16 * v, acc[v]);
}

/* row_block's passes for B of type T over columns [j, n) from j: 128
 * columns at a time, then 16 (8 sums in flight for two FMA pipes of
 * latency 4). */
#define ROW_PASSES(T)                                                                              \
    do {                                                                                           \
        const int64_t es = mp_widen_size(T);                                                       \
        for (; j + 128 <= n; j += 128) row_block(kc, a, bp + j * es, sbb, ahead, T, c + j, 8);     \
        for (; j + 16 <= n; j += 16) row_block(kc, a, bp + j * es, sbb, ahead, T, c + j, 1);       \
    } while (0)

/* One row of C (gemm_impl.kernel_row), A's row in float32. */
MP_TARGET_AVX512 void mp_gemm_row_avx512(int64_t kc, const void *av, const void *b, int64_t sb,
                                         mp_dtype bt, float *c, int64_t n)
{
    const float *a = av;
    const char *bp = b;
    const int64_t sbb = sb * mp_widen_size(bt);
    const int64_t ahead = mp_gemm_rows_ahead(sbb, 16) * sbb; /* in bytes */
    int64_t j = 0;
    if (bt == MP_F32)
        ROW_PASSES(MP_F32);
    else if (bt == MP_F16)
        ROW_PASSES(MP_F16);
    else if (bt == MP_BF16)
        ROW_PASSES(MP_BF16);
    else if (bt == MP_F8E4M3)
        ROW_PASSES(MP_F8E4M3);
    else
        ROW_PASSES(MP_F8E5M2);
    for (; j < n; j++) { /* the last few columns, one at a time */
        float s = 0.0f;
        for (int64_t k = 0; k < kc; k++) s = fmaf(a[k], mp_gemm_load_f32(b, bt, k * sb + j), s);
        c[j] = s;
    }
}
#undef ROW_PASSES

#endif
