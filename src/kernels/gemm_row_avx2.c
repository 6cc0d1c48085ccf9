/* gemm_row_avx2.c - the AVX2 path's row kernel (gemm_impl.kernel_row):
 * one row of C from one row of A and B's rows where they lie, for the
 * products with a C of one or two rows (gemm_rows.c). Each element's sum
 * runs over k in order with one FMA per product, as in the 6x16 tiles
 * (gemm_avx2.c), so it has their bits. Compiled with target attributes and
 * only reached after runtime CPU detection. */
#include <math.h>

#include "kernels/gemm_simd.h"

#if MP_X86

/* nv vectors of one row of C (gemm_impl.kernel_row): one broadcast of a[k]
 * per nv loads of B's row k, whose lines are asked for `ahead` rows ahead. */
MP_TARGET_AVX2 static inline __attribute__((always_inline)) void
row_block(int64_t kc, const float *a, const char *b, int64_t sbb, int64_t ahead, mp_dtype t,
          float *c, int nv)
{
    __m256 acc[8];
#pragma GCC unroll 8
    for (int v = 0; v < nv; v++) acc[v] = _mm256_setzero_ps();
    const int es = (int)mp_widen_size(t), bytes = 8 * nv * es;
    for (int64_t k = 0; k < kc; k++, b += sbb) {
#pragma GCC unroll 4
        for (int o = 0; o < bytes; o += 64) _mm_prefetch(b + ahead + o, _MM_HINT_T0);
        _mm_prefetch(b + ahead + bytes - 1, _MM_HINT_T0);
        const __m256 av = _mm256_broadcast_ss(a + k);
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++)
            acc[v] = _mm256_fmadd_ps(av, mp_widen8(b + 8 * v * es, t), acc[v]);
    }
#pragma GCC unroll 8
    for (int v = 0; v < nv; v++) _mm256_storeu_ps(c + 8 * v, acc[v]);
}

/* row_block's passes for B of type T over columns [j, n) from j, nv
 * vectors at a time. */
#define ROW_PASSES(T, nv)                                                                          \
    for (; j + 8 * (nv) <= n; j += 8 * (nv))                                                       \
        row_block(kc, a, bp + j * es, sb * es, ahead, T, c + j, nv);

/* One row of C: 64 columns per pass over B's rows (8 sums in flight for
 * two FMA pipes of latency 4), then 8, then one at a time. Against the
 * 6x16 tiles (A's row packed into a panel of zeros, B read in place), AMD
 * EPYC (Zen 3, family 25 model 1), one thread, B bfloat16, medians of 31
 * calls alternating in one process, GFLOP/s: 1x1024x256 9.3 -> 28.4,
 * 1x256x256 7.7 -> 26.2, 1x1024x1024 9.9 -> 27.5, 2x1024x256 19.3 -> 29.5,
 * 3x1024x256 29.0 -> 29.5, 4x1024x256 39.4 -> 30.0: rows each pass over B
 * up to MP_GEMM_ROW_MAX_AVX2. */
MP_TARGET_AVX2 void mp_gemm_row_avx2(int64_t kc, const void *av, const void *b, int64_t sb,
                                     mp_dtype bt, float *c, int64_t n)
{
    const float *a = av;
    const int64_t es = mp_widen_size(bt);
    const char *bp = b;
    const int64_t ahead = mp_gemm_rows_ahead(sb * es, 16) * sb * es; /* in bytes */
    int64_t j = 0;
    if (bt == MP_F32) {
        ROW_PASSES(MP_F32, 8)
        ROW_PASSES(MP_F32, 1)
    } else if (bt == MP_F16) {
        ROW_PASSES(MP_F16, 8)
        ROW_PASSES(MP_F16, 1)
    } else if (bt == MP_F8E4M3) {
        ROW_PASSES(MP_F8E4M3, 8)
        ROW_PASSES(MP_F8E4M3, 1)
    } else if (bt == MP_F8E5M2) {
        ROW_PASSES(MP_F8E5M2, 8)
        ROW_PASSES(MP_F8E5M2, 1)
    } else {
        ROW_PASSES(MP_BF16, 8)
        ROW_PASSES(MP_BF16, 1)
    }
    for (; j < n; j++) {
        float s = 0.0f;
        for (int64_t k = 0; k < kc; k++) s = fmaf(a[k], mp_gemm_load_f32(b, bt, k * sb + j), s);
        c[j] = s;
    }
}
#undef ROW_PASSES

#endif
