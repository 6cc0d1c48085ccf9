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

/* The bf16 bits of the 128 magnitudes (bytes 0x00-0x7F) of fp8 type t, 32
 * to a vector, for mp_gemm_fp8_load32 (zeros for a bf16 t, which needs none): made by
 * mp_gemm_bf16_load16 itself, so a lookup gives its bits. About a hundred instructions: once a
 * kernel call or a block, not once an element. */
typedef struct {
    __m512i q[4];
} mp_gemm_fp8_lut;

MP_TARGET_AVX512BF16 static inline mp_gemm_fp8_lut mp_gemm_fp8_lut_for(mp_dtype t)
{
    if (t == MP_BF16) return (mp_gemm_fp8_lut){0}; /* none: bf16 is loaded as it is */
    _Alignas(64) uint8_t bytes[128];
    for (int i = 0; i < 128; i++) bytes[i] = (uint8_t)i;
    mp_gemm_fp8_lut l;
    for (int q = 0; q < 4; q++)
        l.q[q] = _mm512_inserti64x4(
            _mm512_castsi256_si512(mp_gemm_bf16_load16((const char *)bytes + 32 * q, t, 16)),
            mp_gemm_bf16_load16((const char *)bytes + 32 * q + 16, t, 16), 1);
    return l;
}

/* Up to 32 consecutive fp8 elements as bf16 bits through the table l (of
 * their type): the magnitude's low six bits index a pair of its vectors
 * (vpermt2w), the seventh picks the pair, and the sign bit goes on top
 * (every fp8 type's bf16 value is its magnitude's with the sign set, NaN
 * included). Lanes past cnt are zero and their memory is not touched.
 * Against two mp_gemm_bf16_load16 calls: an Intel Xeon (family 6 model
 * 167) ran gemm_rows' fp8 products in less than half the time. */
MP_TARGET_AVX512BF16 static inline __m512i mp_gemm_fp8_load32(const char *p, int cnt,
                                                              const mp_gemm_fp8_lut *l)
{
    const __mmask32 m = cnt >= 32 ? ~(__mmask32)0 : cnt <= 0 ? 0 : (__mmask32)((1u << cnt) - 1);
    const __m512i w = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, p));
    const __m512i lo = _mm512_permutex2var_epi16(l->q[0], w, l->q[1]);
    const __m512i hi = _mm512_permutex2var_epi16(l->q[2], w, l->q[3]);
    const __m512i v =
        _mm512_mask_mov_epi16(lo, _mm512_test_epi16_mask(w, _mm512_set1_epi16(0x40)), hi);
    return _mm512_or_si512(v, _mm512_slli_epi16(_mm512_and_si512(w, _mm512_set1_epi16(0x80)), 8));
}

#endif

#endif
