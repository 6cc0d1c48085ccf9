/* convert_simd.h - float32 -> bfloat16 rounding on the float32 bits, 8
 * (AVX2) or 16 (AVX-512) lanes at a time: the one definition the conversion
 * kernels (convert_avx2.c, convert_avx512.c) and the GEMM epilogues that
 * round their tiles in registers share. Round to nearest even; a NaN keeps
 * its sign and top payload bits and is made quiet, as dtype.c's scalar
 * definition (checked on all 2^32 inputs by tests/exhaustive.c). Each lane
 * holds its bfloat16 in the low 16 bits. */
#ifndef MP_CONVERT_SIMD_H
#define MP_CONVERT_SIMD_H

#include "core/internal.h"

#if MP_X86
#include <immintrin.h>

MP_TARGET_AVX2 static inline __m256i mp_bf16_round8(__m256i u)
{
    const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
    r = _mm256_srli_epi32(r, 16);
    const __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, q, nan);
}

/* The low 16 bits of each 32-bit lane, packed into 8 halves. */
MP_TARGET_AVX2 static inline __m128i mp_narrow16x8(__m256i v)
{
    const __m256i lo16 = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
    return _mm_packus_epi32(_mm256_castsi256_si128(lo16), _mm256_extracti128_si256(lo16, 1));
}

MP_TARGET_AVX512 static inline __m512i mp_bf16_round16(__m512i u)
{
    const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7F800000));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
    r = _mm512_srli_epi32(r, 16);
    const __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_mask_mov_epi32(r, nan, q);
}

#endif

#endif
