/* convert_avx512.c - AVX-512 conversion kernels. Each reproduces the scalar
 * definition in dtype.c bit for bit (checked on all 2^32 inputs by
 * tests/exhaustive.c); they are compiled with per-function target attributes
 * and only called after runtime CPU detection. */
#include "internal.h"

#if MP_X86
#include <immintrin.h>

static inline __mmask16 tail_mask(size_t r) { return (__mmask16)((1u << r) - 1u); }

/* ------------------------------------------------------------ f32 -> bf16 */

MP_TARGET_AVX512 static inline __m512i bf16_round_int(__m512i u)
{
    const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7F800000));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
    r = _mm512_srli_epi32(r, 16);
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_mask_mov_epi32(r, nan, q);
}

MP_TARGET_AVX512 static void v_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512(src + i);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(bf16_round_int(u)));
    }
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        __m512i u = _mm512_maskz_loadu_epi32(k, src + i);
        _mm512_mask_cvtepi32_storeu_epi16(dst + i, k, bf16_round_int(u));
    }
}

/* vcvtneps2bf16 rounds to nearest even and quiets NaNs exactly as the scalar
 * definition, but reads subnormal inputs as zero: vectors holding one take the
 * integer path. */
MP_TARGET_AVX512BF16 static void v_f32_to_bf16_native(uint16_t *dst, const float *src, size_t n)
{
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF), one = _mm512_set1_epi32(1);
    const __m512i submax = _mm512_set1_epi32(0x7FFFFF - 1);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512(src + i);
        __m512i am1 = _mm512_sub_epi32(_mm512_and_si512(u, absmask), one);
        __m256i out;
        if (_mm512_cmple_epu32_mask(am1, submax))
            out = _mm512_cvtepi32_epi16(bf16_round_int(u));
        else
            out = (__m256i)_mm512_cvtneps_pbh(_mm512_castsi512_ps(u));
        _mm256_storeu_si256((__m256i *)(dst + i), out);
    }
    if (i < n) v_f32_to_bf16(dst + i, src + i, n - i);
}

/* ------------------------------------------------------------- f32 <-> f16 */

MP_TARGET_AVX512 static void v_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(src + i);
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        __m512 x = _mm512_maskz_loadu_ps(k, src + i);
        _mm256_mask_storeu_epi16(dst + i, k,
                                 _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
}

MP_TARGET_AVX512 static void v_f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, src + i)));
    }
}

MP_TARGET_AVX512 static void v_bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm512_storeu_si512(dst + i, _mm512_slli_epi32(h, 16));
    }
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, src + i));
        _mm512_mask_storeu_epi32(dst + i, k, _mm512_slli_epi32(h, 16));
    }
}

/* ------------------------------------------------------------- f32 -> fp8 */

/* The vector form of encode_magnitude() + encode_fp8() in dtype.c. */
MP_TARGET_AVX512 static inline __m512i fp8_encode(__m512i u, const mp_fp8_format *f,
                                                  mp_overflow ov)
{
    const int mbits = f->mbits, emin = 1 - f->bias;
    const __m512i one = _mm512_set1_epi32(1);
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
    __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
    __m512i ef = _mm512_srli_epi32(a, 23);
    __m512i m = _mm512_and_si512(a, _mm512_set1_epi32(0x7FFFFF));
    m = _mm512_mask_or_epi32(m, _mm512_test_epi32_mask(ef, ef), m, _mm512_set1_epi32(0x800000));
    __m512i e = _mm512_sub_epi32(_mm512_max_epi32(ef, one), _mm512_set1_epi32(127));
    __m512i extra = _mm512_max_epi32(_mm512_sub_epi32(_mm512_set1_epi32(emin), e),
                                     _mm512_setzero_si512());
    __m512i shift = _mm512_min_epu32(_mm512_add_epi32(extra, _mm512_set1_epi32(23 - mbits)),
                                     _mm512_set1_epi32(31));
    __m512i q = _mm512_srlv_epi32(m, shift);
    __m512i unit = _mm512_sllv_epi32(one, shift);
    __m512i rem = _mm512_and_si512(m, _mm512_sub_epi32(unit, one));
    __m512i half = _mm512_srli_epi32(unit, 1);
    __mmask16 up = _mm512_cmpgt_epu32_mask(rem, half) |
                   (_mm512_cmpeq_epi32_mask(rem, half) & _mm512_test_epi32_mask(q, one));
    q = _mm512_mask_add_epi32(q, up, q, one);
    __mmask16 normal = _mm512_cmpge_epi32_mask(e, _mm512_set1_epi32(emin));
    __m512i ebase = _mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(f->bias - 1)),
                                      (unsigned)mbits);
    __m512i r = _mm512_mask_add_epi32(q, normal, q, ebase);
    __mmask16 ovf = _mm512_cmpgt_epu32_mask(r, _mm512_set1_epi32((int)f->max_enc));
    uint32_t ovf_val = ov == MP_OVERFLOW_SATURATE ? f->max_enc : f->ovf_nonsat;
    uint32_t inf_val = ov == MP_OVERFLOW_SATURATE ? f->inf_enc : f->ovf_nonsat;
    r = _mm512_mask_mov_epi32(r, ovf, _mm512_set1_epi32((int)ovf_val));
    __mmask16 inf = _mm512_cmpeq_epi32_mask(a, _mm512_set1_epi32(0x7F800000));
    r = _mm512_mask_mov_epi32(r, inf, _mm512_set1_epi32((int)inf_val));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32((int)f->nan_enc));
    return _mm512_or_si512(r, sign);
}

MP_TARGET_AVX512 static void v_f32_to_fp8(uint8_t *dst, const float *src, size_t n, mp_dtype t,
                                          mp_overflow ov)
{
    const mp_fp8_format *f = mp_fp8_format_of(t);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512(src + i);
        _mm_storeu_si128((__m128i *)(dst + i), _mm512_cvtepi32_epi8(fp8_encode(u, f, ov)));
    }
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        __m512i u = _mm512_maskz_loadu_epi32(k, src + i);
        _mm512_mask_cvtepi32_storeu_epi8(dst + i, k, fp8_encode(u, f, ov));
    }
}

/* ------------------------------------------------------------- fp8 -> f32 */

/* Placing the 7 magnitude bits at the top of a float32's exponent/fraction
 * and scaling by 2^(127 - bias) is exact for normals and subnormals alike. */
MP_TARGET_AVX512 static inline __m512 fp8_decode(__m512i b, mp_dtype t)
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
        __m512i s = _mm512_or_si512(_mm512_set1_epi32(0x7F800000),
                                    _mm512_slli_epi32(_mm512_and_si512(mag, _mm512_set1_epi32(3)), 21));
        r = _mm512_mask_mov_epi32(r, special, s);
        r = _mm512_mask_or_epi32(r, nan, r, _mm512_set1_epi32(0x400000));
    }
    return _mm512_castsi512_ps(_mm512_or_si512(r, sign));
}

MP_TARGET_AVX512 static void v_fp8_to_f32(float *dst, const uint8_t *src, size_t n, mp_dtype t)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm512_storeu_ps(dst + i, fp8_decode(b, t));
    }
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, src + i));
        _mm512_mask_storeu_ps(dst + i, k, fp8_decode(b, t));
    }
}

const mp_convert_kernels mp_convert_avx512_kernels = {
    v_f32_to_bf16, v_f32_to_f16, v_f32_to_fp8, v_bf16_to_f32, v_f16_to_f32, v_fp8_to_f32,
};

const mp_convert_kernels mp_convert_avx512bf16_kernels = {
    v_f32_to_bf16_native, v_f32_to_f16, v_f32_to_fp8, v_bf16_to_f32, v_f16_to_f32, v_fp8_to_f32,
};

#endif /* MP_X86 */
