/* gemm_simd.h - SIMD helpers of the GEMM packers on every x86 path. They are
 * compiled for AVX2, a subset of the AVX-512 paths' targets, so the AVX2
 * and AVX-512 files inline the same code. */
#ifndef MP_GEMM_SIMD_H
#define MP_GEMM_SIMD_H

#include "core/convert_simd.h"
#include "kernels/gemm_internal.h"

#if MP_X86
#include <immintrin.h>

/* Bytes of an element of the types mp_widen8 reads, inline (mp_dtype_size
 * is a call: in a partial load of each packed row it took 6% of a weight
 * gradient's time). */
static inline int64_t mp_widen_size(mp_dtype t)
{
    return t == MP_F32 ? 4 : t == MP_F8E4M3 || t == MP_F8E5M2 ? 1 : 2;
}

/* 8 consecutive elements of float32, float16, bfloat16 or float8 widened
 * to f32 (exactly). */
MP_TARGET_AVX2 static inline __m256 mp_widen8(const char *p, mp_dtype t)
{
    switch (t) {
    case MP_F32:
        return _mm256_loadu_ps((const float *)p);
    case MP_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    case MP_F8E4M3:
    case MP_F8E5M2:
        return mp_fp8_decode8(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)), t);
    default: /* MP_BF16 */
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    }
}

/* r[q] becomes column q of the 8x8 matrix whose rows were r[0..7]. */
MP_TARGET_AVX2 static inline void mp_gemm_tr8(__m256 r[8])
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

#endif

#endif
