/* convert_simd.h - the conversions' rounding rules on vector registers, the
 * one definition each that several kernels share:
 *   - float32 -> bfloat16 on the float32 bits, 8 (AVX2) or 16 (AVX-512)
 *     lanes at a time: the conversion kernels (convert_avx2.c,
 *     convert_avx512.c) and the GEMM epilogues that round their tiles in
 *     registers. Round to nearest even; a NaN keeps its sign and top payload
 *     bits and is made quiet, as dtype.c's scalar definition (checked on all
 *     2^32 inputs by tests/exhaustive.c). Each lane holds its bfloat16 in the
 *     low 16 bits.
 *   - float32 <-> float8 (E4M3, E5M2), 16 lanes (AVX-512): convert_avx512.c
 *     and the float8 recipe's one-pass scaled cast (fp8_cast_avx512.c);
 *     float8 -> float32, 8 lanes (AVX2): convert_avx2.c and the AVX2 GEMM
 *     packers. */
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

/* float8 -> float32, 8 lanes (AVX2), each lane's code in its low byte:
 * the 7 magnitude bits at the top of a float32's exponent/fraction, scaled
 * by 2^(127 - bias): exact for normals and subnormals alike. The
 * conversion kernel (convert_avx2.c) and the GEMM packers (gemm_simd.h). */
MP_TARGET_AVX2 static inline __m256 mp_fp8_decode8(__m256i b, mp_dtype t)
{
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
    const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7F));
    __m256i r;
    if (t == MP_F8E4M3) {
        r = _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 20)),
                                              _mm256_set1_ps(0x1p120f)));
        const __m256i nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F));
        r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC00000), nan);
    } else {
        r = _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 21)),
                                              _mm256_set1_ps(0x1p112f)));
        const __m256i special = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7B));
        const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7C));
        const __m256i s =
            _mm256_or_si256(_mm256_set1_epi32(0x7F800000),
                            _mm256_slli_epi32(_mm256_and_si256(mag, _mm256_set1_epi32(3)), 21));
        r = _mm256_blendv_epi8(r, s, special);
        r = _mm256_or_si256(r, _mm256_and_si256(nan, _mm256_set1_epi32(0x400000)));
    }
    return _mm256_castsi256_ps(_mm256_or_si256(r, sign));
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

/* Same bits as encode_fp8() in dtype.c, by a cheaper route. Results in the
 * normal range: the bf16-style integer rounding (add half-ulp-minus-one plus
 * the kept LSB, shift) on the float32 bits, then rebias; a carry moves into
 * the exponent as it should. Results in the subnormal range: a float32 add of
 * 2^(q+23), where q is the subnormal step's exponent, which makes the FPU
 * round |x| to a multiple of the step (ties to even) in its low bits. */
MP_TARGET_AVX512 static inline __m512i mp_fp8_encode16(__m512i u, const mp_fp8_format *f,
                                                       mp_overflow ov)
{
    /* f points at a compile-time constant (see v_f32_to_fp8 in convert_avx512.c), so all of the
     * following folds into immediates. */
    const int mbits = f->mbits, shift = 23 - mbits, emin = 1 - f->bias;
    const uint32_t min_normal_bits = (uint32_t)(emin + 127) << 23;
    const uint32_t magic_bits = (uint32_t)(emin - mbits + 23 + 127) << 23;
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
    __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));

    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, (unsigned)shift), _mm512_set1_epi32(1));
    __m512i r =
        _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32((1 << (shift - 1)) - 1)), lsb);
    r = _mm512_sub_epi32(_mm512_srli_epi32(r, (unsigned)shift),
                         _mm512_set1_epi32((127 - f->bias) << mbits));

    __m512 magic = _mm512_castsi512_ps(_mm512_set1_epi32((int)magic_bits));
    __m512i sub =
        _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), magic)),
                         _mm512_castps_si512(magic));
    __mmask16 is_sub = _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32((int)min_normal_bits));
    r = _mm512_mask_mov_epi32(r, is_sub, sub);

    uint32_t ovf_val = ov == MP_OVERFLOW_SATURATE ? f->max_enc : f->ovf_nonsat;
    uint32_t inf_val = ov == MP_OVERFLOW_SATURATE ? f->inf_enc : f->ovf_nonsat;
    __mmask16 ovf = _mm512_cmpgt_epi32_mask(r, _mm512_set1_epi32((int)f->max_enc));
    r = _mm512_mask_mov_epi32(r, ovf, _mm512_set1_epi32((int)ovf_val));
    __mmask16 inf = _mm512_cmpeq_epi32_mask(a, _mm512_set1_epi32(0x7F800000));
    r = _mm512_mask_mov_epi32(r, inf, _mm512_set1_epi32((int)inf_val));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32((int)f->nan_enc));
    return _mm512_or_si512(r, sign);
}

/* Placing the 7 magnitude bits at the top of a float32's exponent/fraction
 * and scaling by 2^(127 - bias) is exact for normals and subnormals alike. */
MP_TARGET_AVX512 static inline __m512 mp_fp8_decode16(__m512i b, mp_dtype t)
{
    __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24);
    __m512i mag = _mm512_and_si512(b, _mm512_set1_epi32(0x7F));
    __m512i r;
    if (t == MP_F8E4M3) {
        __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(mag, 20)),
                                 _mm512_set1_ps(0x1p120f));
        r = _mm512_castps_si512(v);
        __mmask16 nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F));
        r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC00000));
    } else {
        __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(mag, 21)),
                                 _mm512_set1_ps(0x1p112f));
        r = _mm512_castps_si512(v);
        __mmask16 special = _mm512_cmpge_epu32_mask(mag, _mm512_set1_epi32(0x7C));
        __mmask16 nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7C));
        __m512i s =
            _mm512_or_si512(_mm512_set1_epi32(0x7F800000),
                            _mm512_slli_epi32(_mm512_and_si512(mag, _mm512_set1_epi32(3)), 21));
        r = _mm512_mask_mov_epi32(r, special, s);
        r = _mm512_mask_or_epi32(r, nan, r, _mm512_set1_epi32(0x400000));
    }
    return _mm512_castsi512_ps(_mm512_or_si512(r, sign));
}

#endif

#endif
