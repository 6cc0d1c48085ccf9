/* avx512_lanes.h - the rule of every AVX-512 loop over memory: whole
 * vectors load and store plainly, only a tail under a mask. On Zen 5 a
 * masked load or store of every vector, all lanes set, halves a kernel's
 * rate from memory (in L1 the two are the same): Adam over 20 M values
 * 14.3 -> 6.2 ms unmasked (optim/update_avx512.c), MX packing 4.3 -> 15.6
 * GB/s (core/mx_avx512.c). Each helper takes the lanes' mask and tests it,
 * so that one call serves a loop's whole vectors (a constant 0xFFFF, the
 * test folded away) and its tail alike. Not part of the API. */
#ifndef MP_AVX512_LANES_H
#define MP_AVX512_LANES_H

#include "core/internal.h"

#if MP_X86
#include <immintrin.h>

/* The first n lanes (all 16 from n = 16 on). */
static inline __mmask16 mp_lanes16(int64_t n)
{
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n > 0 ? n : 0)) - 1u);
}

/* Lanes k of 16 floats at p (the others zero, their memory untouched). */
MP_TARGET_AVX512 static inline __m512 mp_load16(const float *p, __mmask16 k)
{
    return k == 0xFFFF ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(k, p);
}
MP_TARGET_AVX512 static inline void mp_store16(float *p, __mmask16 k, __m512 v)
{
    if (k == 0xFFFF)
        _mm512_storeu_ps(p, v);
    else
        _mm512_mask_storeu_ps(p, k, v);
}

/* The same for 16 16-bit values (bfloat16, float16). */
MP_TARGET_AVX512 static inline __m256i mp_load16_u16(const uint16_t *p, __mmask16 k)
{
    return k == 0xFFFF ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(k, p);
}
MP_TARGET_AVX512 static inline void mp_store16_u16(uint16_t *p, __mmask16 k, __m256i v)
{
    if (k == 0xFFFF)
        _mm256_storeu_si256((__m256i *)p, v);
    else
        _mm256_mask_storeu_epi16(p, k, v);
}

/* And for 16 bytes (float8 and MX codes). */
MP_TARGET_AVX512 static inline __m128i mp_load16_u8(const uint8_t *p, __mmask16 k)
{
    return k == 0xFFFF ? _mm_loadu_si128((const __m128i *)p) : _mm_maskz_loadu_epi8(k, p);
}
MP_TARGET_AVX512 static inline void mp_store16_u8(uint8_t *p, __mmask16 k, __m128i v)
{
    if (k == 0xFFFF)
        _mm_storeu_si128((__m128i *)p, v);
    else
        _mm_mask_storeu_epi8(p, k, v);
}

#endif /* MP_X86 */
#endif
