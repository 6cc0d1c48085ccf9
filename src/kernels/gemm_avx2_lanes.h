/* gemm_avx2_lanes.h - the AVX2 GEMM path's partial loads and stores
 * (gemm_pack_avx2.c, gemm_epilogue_avx2.c): lanes for masks, a short run
 * of any float type widened to 8 float32 lanes without touching memory
 * outside it, and the first n lanes stored without a masked store. Static
 * and compiled with target attributes, reached only after runtime CPU
 * detection. Not part of the API. */
#ifndef MP_GEMM_AVX2_LANES_H
#define MP_GEMM_AVX2_LANES_H

#include <string.h>

#include "kernels/gemm_simd.h"

#if MP_X86

/* Lanes [0, n) set, for maskload / maskstore. */
MP_TARGET_AVX2 static inline __m256i lanes(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* cnt (1..8) consecutive elements from p widened to f32, lanes past cnt
 * zero. Memory outside [p - before, p + after) elements is not touched
 * (after >= cnt); within it a short read is one whole 8-element load, from
 * p itself or ending at p + cnt and shifted down, and only where neither
 * fits (an operand narrower than 8) a copy through a buffer. */
MP_TARGET_AVX2 static inline __m256 load8(const char *p, mp_dtype t, int cnt, int64_t before,
                                          int64_t after)
{
    if (cnt == 8) return mp_widen8(p, t);
    const int64_t es = mp_widen_size(t);
    const __m256 keep = _mm256_castsi256_ps(lanes(cnt));
    if (after >= 8) return _mm256_and_ps(mp_widen8(p, t), keep);
    if (before >= 8 - cnt) {
        const __m256i idx =
            _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 - cnt));
        const __m256 v = mp_widen8(p - (8 - cnt) * es, t);
        return _mm256_and_ps(_mm256_permutevar8x32_ps(v, idx), keep);
    }
    _Alignas(32) char tmp[32];
    memset(tmp, 0, sizeof tmp);
    memcpy(tmp, p, (size_t)(cnt * es));
    return mp_widen8(tmp, t);
}

/* The first n (1..8) lanes of v to o, without a masked store (vmaskmovps
 * to memory is slow on AMD cores: it took 40% of a bf16 packing run). */
MP_TARGET_AVX2 static inline void store_n(float *o, __m256 v, int n)
{
    if (n == 8) {
        _mm256_storeu_ps(o, v);
        return;
    }
    _Alignas(32) float lane[8];
    _mm256_store_ps(lane, v);
    memcpy(o, lane, (size_t)n * sizeof *o);
}

#endif
#endif
