/* gemm_avx512bf16_load.h - what the vdpbf16ps path's packer
 * (gemm_avx512bf16.c) and row kernel (gemm_row_avx512bf16.c) share: bf16
 * and fp8 elements read as bf16 bits, exactly. */
#ifndef MP_GEMM_AVX512BF16_LOAD_H
#define MP_GEMM_AVX512BF16_LOAD_H

#include "core/avx512_lanes.h"
#include "kernels/gemm_avx512_common.h"

#if MP_X86
/* Up to 16 consecutive bf16/fp8 elements as bf16 bits; lanes past cnt are
 * zero and their memory is not touched. fp8 goes through f16 bit patterns:
 * E5M2 is the top byte of an f16, and E4M3's exponent and mantissa placed
 * in an f16 read 2^8 times too small (subnormals included), so one exact
 * multiply fixes the scale. Every fp8 value then fits bf16 exactly. */
MP_TARGET_AVX512BF16 static inline __m256i mp_gemm_bf16_load16(const char *p, mp_dtype t, int cnt)
{
    const __mmask16 m = mp_lanes16(cnt); /* whole vectors plainly (avx512_lanes.h) */
    if (t == MP_BF16) return mp_load16_u16((const uint16_t *)p, m);
    __m256i b = _mm256_cvtepu8_epi16(mp_load16_u8((const uint8_t *)p, m));
    __m512 f;
    if (t == MP_F8E5M2) {
        f = _mm512_cvtph_ps(_mm256_slli_epi16(b, 8));
    } else {
        __m256i mag = _mm256_and_si256(b, _mm256_set1_epi16(0x7F));
        f = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_slli_epi16(mag, 7)), _mm512_set1_ps(256.0f));
        __mmask16 nan = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7F));
        f = _mm512_mask_mov_ps(f, nan, _mm512_set1_ps(__builtin_nanf("")));
        __m512i sign = _mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_and_si256(b, _mm256_set1_epi16(0x80))), 24);
        f = _mm512_or_ps(f, _mm512_castsi512_ps(sign));
    }
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(f), 16));
}

#endif

#endif
