/* convert_avx2.c - AVX2 + F16C conversion kernels, eight elements at a time,
 * by the same routes as convert_avx512.c (integer rounding on the float32
 * bits for bfloat16 and float8, vcvtps2ph / vcvtph2ps for float16); the last
 * n % 8 elements go through the scalar kernels. Each reproduces the scalar
 * definition in dtype.c bit for bit (all 2^32 inputs in tests/exhaustive.c).
 * Compiled with target attributes, only called after runtime detection. */
#include "internal.h"
#include "core/convert_simd.h"

#if MP_X86
#include <immintrin.h>

#define SCALAR mp_convert_scalar_kernels

/* ------------------------------------------------------------ f32 -> bf16 */

MP_TARGET_AVX2 static void v_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i u = _mm256_loadu_si256((const __m256i *)(src + i));
        _mm_storeu_si128((__m128i *)(dst + i), mp_narrow16x8(mp_bf16_round8(u)));
    }
    if (i < n) SCALAR.f32_to_bf16(dst + i, src + i, n - i);
}

MP_TARGET_AVX2 static void v_bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(h, 16));
    }
    if (i < n) SCALAR.bf16_to_f32(dst + i, src + i, n - i);
}

/* ------------------------------------------------------------- f32 <-> f16 */

MP_TARGET_AVX2 static void v_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) SCALAR.f32_to_f16(dst + i, src + i, n - i);
}

MP_TARGET_AVX2 static void v_f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    if (i < n) SCALAR.f16_to_f32(dst + i, src + i, n - i);
}

/* ------------------------------------------------------------- f32 -> fp8 */

/* encode_fp8() of dtype.c by convert_avx512.c's route: integer rounding of
 * the float32 bits for results in the normal range, a float32 add of the
 * subnormal step's magic constant below it. a = |u| is below 2^31, so
 * signed compares order it as unsigned ones would. */
MP_TARGET_AVX2 static inline __attribute__((always_inline)) __m256i
fp8_encode(__m256i u, const mp_fp8_format *f, mp_overflow ov)
{
    const int mbits = f->mbits, shift = 23 - mbits, emin = 1 - f->bias;
    const uint32_t min_normal_bits = (uint32_t)(emin + 127) << 23;
    const uint32_t magic_bits = (uint32_t)(emin - mbits + 23 + 127) << 23;
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));

    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, shift), _mm256_set1_epi32(1));
    __m256i r =
        _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32((1 << (shift - 1)) - 1)), lsb);
    r = _mm256_sub_epi32(_mm256_srli_epi32(r, shift), _mm256_set1_epi32((127 - f->bias) << mbits));

    const __m256 magic = _mm256_castsi256_ps(_mm256_set1_epi32((int)magic_bits));
    const __m256i sub =
        _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), magic)),
                         _mm256_castps_si256(magic));
    const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)min_normal_bits), a);
    r = _mm256_blendv_epi8(r, sub, is_sub);

    /* Past max_enc: ovf_val, which is max_enc or the code after it in both
     * OCP formats and both modes (ovf_nonsat = max_enc + 1), so a min.
     * Infinities and NaNs, whose r is larger still, then hold ovf_val; only
     * the codes that differ from it are blended in (the format and mode
     * fold: e4m3 without saturation needs none, with it one). */
    const uint32_t ovf_val = ov == MP_OVERFLOW_SATURATE ? f->max_enc : f->ovf_nonsat;
    const uint32_t inf_val = ov == MP_OVERFLOW_SATURATE ? f->inf_enc : f->ovf_nonsat;
    r = _mm256_min_epi32(r, _mm256_set1_epi32((int)ovf_val));
    if (inf_val == f->nan_enc && inf_val != ovf_val) {
        const __m256i special = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F7FFFFF));
        r = _mm256_blendv_epi8(r, _mm256_set1_epi32((int)inf_val), special);
    } else {
        if (inf_val != ovf_val) {
            const __m256i inf = _mm256_cmpeq_epi32(a, _mm256_set1_epi32(0x7F800000));
            r = _mm256_blendv_epi8(r, _mm256_set1_epi32((int)inf_val), inf);
        }
        if (f->nan_enc != ovf_val) {
            const __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
            r = _mm256_blendv_epi8(r, _mm256_set1_epi32((int)f->nan_enc), nan);
        }
    }
    return _mm256_or_si256(r, sign);
}

/* The low byte of each lane, 8 bytes. */
MP_TARGET_AVX2 static inline uint64_t narrow8(__m256i v)
{
    const __m128i h = mp_narrow16x8(v);
    return (uint64_t)_mm_cvtsi128_si64(_mm_packus_epi16(h, h));
}

/* 32 values a round: the four vectors' codes narrowed by two saturating
 * packs (each lane's code is at most 0xFF) and one permute back into order,
 * one 32-byte store (narrowing each vector alone took three shuffles for
 * 8 bytes); then 8 at a time. */
MP_TARGET_AVX2 static inline __attribute__((always_inline)) void
fp8_encode_loop(uint8_t *dst, const float *src, size_t n, const mp_fp8_format f, mp_overflow ov)
{
    size_t i = 0;
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (; i + 32 <= n; i += 32) {
        __m256i c[4];
        for (int v = 0; v < 4; v++)
            c[v] = fp8_encode(_mm256_loadu_si256((const __m256i *)(src + i + 8 * v)), &f, ov);
        const __m256i b =
            _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_permutevar8x32_epi32(b, order));
    }
    for (; i < n; i += 8) {
        const uint64_t b =
            narrow8(fp8_encode(_mm256_loadu_si256((const __m256i *)(src + i)), &f, ov));
        __builtin_memcpy(dst + i, &b, 8);
    }
}

/* One instance per format and overflow mode, so that the format's
 * parameters fold into immediates. */
MP_TARGET_AVX2 static void v_f32_to_fp8(uint8_t *dst, const float *src, size_t n, mp_dtype t,
                                        mp_overflow ov)
{
    const mp_fp8_format e4m3 = mp_fp8_e4m3, e5m2 = mp_fp8_e5m2;
    const size_t whole = n & ~(size_t)7;
    if (t == MP_F8E4M3 && ov == MP_OVERFLOW_SATURATE)
        fp8_encode_loop(dst, src, whole, e4m3, MP_OVERFLOW_SATURATE);
    else if (t == MP_F8E4M3)
        fp8_encode_loop(dst, src, whole, e4m3, MP_OVERFLOW_NONSAT);
    else if (ov == MP_OVERFLOW_SATURATE)
        fp8_encode_loop(dst, src, whole, e5m2, MP_OVERFLOW_SATURATE);
    else
        fp8_encode_loop(dst, src, whole, e5m2, MP_OVERFLOW_NONSAT);
    if (whole < n) SCALAR.f32_to_fp8(dst + whole, src + whole, n - whole, t, ov);
}

/* ------------------------------------------------------------- fp8 -> f32 */

MP_TARGET_AVX2 static inline __attribute__((always_inline)) void
fp8_dec_loop(float *dst, const uint8_t *src, size_t n, mp_dtype t)
{
    for (size_t i = 0; i < n; i += 8) {
        const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(src + i)));
        _mm256_storeu_ps(dst + i, mp_fp8_decode8(b, t));
    }
}

MP_TARGET_AVX2 static void v_fp8_to_f32(float *dst, const uint8_t *src, size_t n, mp_dtype t)
{
    const size_t whole = n & ~(size_t)7;
    if (t == MP_F8E4M3)
        fp8_dec_loop(dst, src, whole, MP_F8E4M3);
    else
        fp8_dec_loop(dst, src, whole, MP_F8E5M2);
    if (whole < n) SCALAR.fp8_to_f32(dst + whole, src + whole, n - whole, t);
}

const mp_convert_kernels mp_convert_avx2_kernels = {
    v_f32_to_bf16, v_f32_to_f16, v_f32_to_fp8, v_bf16_to_f32, v_f16_to_f32, v_fp8_to_f32,
};

#endif /* MP_X86 */
