/* fp8_cast_avx512.c - the float8 recipe's scaled cast (mp_fp8_scaled_cast,
 * internal.h) in one pass on AVX-512: each 16 values are widened, their
 * |bits| maxed, scaled, encoded, given x's sign where asked, and decoded to
 * bfloat16 in registers, with the conversions' own vector rules
 * (convert_simd.h). nn/fp8.c's route one pass at a time (widen; amax and
 * scale; encode; carry the sign; decode; round to bfloat16) gives the same
 * bits (tests/test_fp8.c checks both against scalar references) and is what
 * other paths and input types take. Asked for the values alone (a kernel's
 * operand), it rounds to the format's grid in float32 without the codes
 * between (value16). */
#include "core/avx512_lanes.h"
#include "core/convert_simd.h"
#include "internal.h"

#if MP_X86
#include <immintrin.h>

/* Two registers of float32 values with nothing in their low halves as 32
 * bfloat16 values (lo's lanes, then hi's). */
MP_TARGET_AVX512 static inline __m512i top_halves(__m512i lo, __m512i hi)
{
    const __m512i odd =
        _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                         25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_permutex2var_epi16(lo, odd, hi);
}

/* The values codes stand for, in bfloat16: every float8 value is a
 * bfloat16 one, and its float32 bits have nothing in the low half to round
 * (a NaN's quiet bit is already set), so the top halves are the rounding. */
MP_TARGET_AVX512 static inline __m512i decoded_bf16(__m512i lo, __m512i hi, mp_dtype fp8)
{
    return top_halves(_mm512_castps_si512(mp_fp8_decode16(lo, fp8)),
                      _mm512_castps_si512(mp_fp8_decode16(hi, fp8)));
}

/* x > 0 kept in a zero code: 0x80 (-0) for a positive x cast to zero, 0x00
 * for any other zero; other codes unchanged. */
MP_TARGET_AVX512 static inline __m512i carry_sign(__m512i c, __m512 v)
{
    const __mmask16 pos = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ);
    const __mmask16 z = _mm512_cmpeq_epi32_mask(c, _mm512_setzero_si512());
    const __mmask16 nz = _mm512_cmpeq_epi32_mask(c, _mm512_set1_epi32(0x80));
    c = _mm512_mask_mov_epi32(c, pos & z, _mm512_set1_epi32(0x80));
    return _mm512_mask_mov_epi32(c, (__mmask16)~pos & nz, _mm512_setzero_si512());
}

/* 16 values from x + i (lanes outside k zero, their memory untouched) as
 * float32 bits */
MP_TARGET_AVX512 static inline __m512i load16(const void *x, size_t i, __mmask16 k, bool bf16_in)
{
    if (bf16_in)
        return _mm512_slli_epi32(_mm512_cvtepu16_epi32(mp_load16_u16((const uint16_t *)x + i, k)),
                                 16);
    return _mm512_castps_si512(mp_load16((const float *)x + i, k));
}

/* The codes of 16 values (float32 bits u); their |bits| maxed into *m. */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) __m512i
code16(__m512i u, __m512 s, __m512i *m, const mp_fp8_format *f, bool sign)
{
    *m = _mm512_max_epu32(*m, _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)));
    const __m512 v = _mm512_castsi512_ps(u);
    __m512i c = mp_fp8_encode16(_mm512_castps_si512(_mm512_mul_ps(v, s)), f, MP_OVERFLOW_SATURATE);
    return sign ? carry_sign(c, v) : c;
}

/* One instance per format, input type and sign rule, so that each folds
 * into constants (f points at a compile-time constant). 32 values a turn
 * with whole-register loads and stores, then a masked tail: with masked
 * loads and narrowing stores to memory on every turn, the seed MLP's fc2
 * kernel (16.8 M float32 values to bfloat16 values, no codes, 2 threads,
 * Zen 5) took 8.9 ms, against 2.5-2.9 ms so (and 5.5-6.4 one pass per
 * step); its input (4.2 M bfloat16 values to codes and values) 0.61-0.63
 * ms against 1.50-1.64 one pass per step. */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) uint32_t
cast_loop(uint8_t *codes, uint16_t *decoded, const void *x, size_t n, float scale,
          const mp_fp8_format *f, mp_dtype fp8, bool bf16_in, bool sign)
{
    const __m512 s = _mm512_set1_ps(scale);
    __m512i m = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512i lo = code16(load16(x, i, 0xFFFF, bf16_in), s, &m, f, sign);
        const __m512i hi = code16(load16(x, i + 16, 0xFFFF, bf16_in), s, &m, f, sign);
        if (codes) {
            _mm_storeu_si128((__m128i *)(codes + i), _mm512_cvtepi32_epi8(lo));
            _mm_storeu_si128((__m128i *)(codes + i + 16), _mm512_cvtepi32_epi8(hi));
        }
        if (decoded) _mm512_storeu_si512(decoded + i, decoded_bf16(lo, hi, fp8));
    }
    for (; i < n; i += 16) {
        const __mmask16 k = mp_lanes16((int64_t)(n - i));
        const __m512i c = code16(load16(x, i, k, bf16_in), s, &m, f, sign);
        if (codes) mp_store16_u8(codes + i, k, _mm512_cvtepi32_epi8(c));
        if (decoded)
            mp_store16_u16(decoded + i, k, _mm512_castsi512_si256(decoded_bf16(c, c, fp8)));
    }
    return (uint32_t)_mm512_reduce_max_epu32(m);
}

/* The cast's value alone (no codes, no sign rule): y = x * scale rounded to
 * the format's grid in float32, without the codes between. Normal results:
 * the float32 bits rounded to mbits (the encoder's integer rounding, a
 * carry moving into the exponent), kept in place; subnormal ones: the
 * encoder's float32 add of 2^(q+23), whose difference from that constant is
 * y rounded to a multiple of the step q; then the largest finite value for
 * anything beyond it, inf as the saturating cast takes it (inf for e5m2,
 * NaN for e4m3) and NaN as the decoder gives it (0x7FC00000), y's sign.
 * The same bits as encode + decode (tests/exhaustive.c checks all 2^32
 * float32 inputs); 2.4x faster: the seed MLP's fc2 kernel, 16.8 M values
 * in L1-sized pieces on one thread, Zen 5: 4.55 -> 1.93 ms. */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) __m512i
value16(__m512i u, __m512 s, __m512i *m, const mp_fp8_format *f)
{
    const int mbits = f->mbits, shift = 23 - mbits, emin = 1 - f->bias;
    const uint32_t min_normal_bits = (uint32_t)(emin + 127) << 23;
    const uint32_t magic_bits = (uint32_t)(emin - mbits + 23 + 127) << 23;
    /* the largest finite value's float32 bits: exponent and fraction moved */
    const uint32_t max_bits = ((f->max_enc >> mbits) + 127 - (uint32_t)f->bias) << 23 |
                              (f->max_enc & ((1u << mbits) - 1)) << shift;
    const uint32_t inf_bits = f->inf_enc == f->nan_enc ? 0x7FC00000u : 0x7F800000u;
    *m = _mm512_max_epu32(*m, _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)));
    const __m512i y = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(u), s));
    const __m512i a = _mm512_and_si512(y, _mm512_set1_epi32(0x7FFFFFFF));
    const __m512i lsb =
        _mm512_and_si512(_mm512_srli_epi32(a, (unsigned)shift), _mm512_set1_epi32(1));
    __m512i r = _mm512_and_si512(
        _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32((1 << (shift - 1)) - 1)), lsb),
        _mm512_set1_epi32((int)~((1u << shift) - 1)));
    const __m512 magic = _mm512_castsi512_ps(_mm512_set1_epi32((int)magic_bits));
    const __m512i sub =
        _mm512_castps_si512(_mm512_sub_ps(_mm512_add_ps(_mm512_castsi512_ps(a), magic), magic));
    r = _mm512_mask_mov_epi32(
        r, _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32((int)min_normal_bits)), sub);
    r = _mm512_min_epu32(r, _mm512_set1_epi32((int)max_bits));
    r = _mm512_mask_mov_epi32(r, _mm512_cmpeq_epi32_mask(a, _mm512_set1_epi32(0x7F800000)),
                              _mm512_set1_epi32((int)inf_bits));
    r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000)),
                              _mm512_set1_epi32(0x7FC00000));
    return _mm512_or_si512(r, _mm512_and_si512(y, _mm512_set1_epi32((int)0x80000000u)));
}

MP_TARGET_AVX512 static inline __attribute__((always_inline)) uint32_t
value_loop(uint16_t *decoded, const void *x, size_t n, float scale, const mp_fp8_format *f,
           bool bf16_in)
{
    const __m512 s = _mm512_set1_ps(scale);
    __m512i m = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512i lo = value16(load16(x, i, 0xFFFF, bf16_in), s, &m, f);
        const __m512i hi = value16(load16(x, i + 16, 0xFFFF, bf16_in), s, &m, f);
        _mm512_storeu_si512(decoded + i, top_halves(lo, hi));
    }
    for (; i < n; i += 16) {
        const __mmask16 k = mp_lanes16((int64_t)(n - i));
        const __m512i v = value16(load16(x, i, k, bf16_in), s, &m, f);
        mp_store16_u16(decoded + i, k, _mm512_castsi512_si256(top_halves(v, v)));
    }
    return (uint32_t)_mm512_reduce_max_epu32(m);
}

#define VALUES(FMT, DT, BF)                                                                        \
    MP_TARGET_AVX512 static uint32_t values_##DT##_##BF(uint16_t *d, const void *x, size_t n,      \
                                                        float s)                                   \
    {                                                                                              \
        const mp_fp8_format f = FMT;                                                               \
        return value_loop(d, x, n, s, &f, BF);                                                     \
    }
VALUES(mp_fp8_e4m3, MP_F8E4M3, false)
VALUES(mp_fp8_e4m3, MP_F8E4M3, true)
VALUES(mp_fp8_e5m2, MP_F8E5M2, false)
VALUES(mp_fp8_e5m2, MP_F8E5M2, true)
#undef VALUES

typedef uint32_t (*values_fn)(uint16_t *, const void *, size_t, float);

/* [format: e4m3, e5m2][input: float32, bfloat16] */
static const values_fn values[2][2] = {
    {values_MP_F8E4M3_false, values_MP_F8E4M3_true},
    {values_MP_F8E5M2_false, values_MP_F8E5M2_true},
};

#define CAST(FMT, DT, BF, SG)                                                                      \
    MP_TARGET_AVX512 static uint32_t cast_##DT##_##BF##_##SG(uint8_t *c, uint16_t *d,              \
                                                             const void *x, size_t n, float s)     \
    {                                                                                              \
        const mp_fp8_format f = FMT;                                                               \
        return cast_loop(c, d, x, n, s, &f, DT, BF, SG);                                           \
    }
CAST(mp_fp8_e4m3, MP_F8E4M3, false, false)
CAST(mp_fp8_e4m3, MP_F8E4M3, false, true)
CAST(mp_fp8_e4m3, MP_F8E4M3, true, false)
CAST(mp_fp8_e4m3, MP_F8E4M3, true, true)
CAST(mp_fp8_e5m2, MP_F8E5M2, false, false)
CAST(mp_fp8_e5m2, MP_F8E5M2, false, true)
CAST(mp_fp8_e5m2, MP_F8E5M2, true, false)
CAST(mp_fp8_e5m2, MP_F8E5M2, true, true)
#undef CAST

typedef uint32_t (*cast_fn)(uint8_t *, uint16_t *, const void *, size_t, float);

/* [format: e4m3, e5m2][input: float32, bfloat16][sign] */
static const cast_fn casts[2][2][2] = {
    {{cast_MP_F8E4M3_false_false, cast_MP_F8E4M3_false_true},
     {cast_MP_F8E4M3_true_false, cast_MP_F8E4M3_true_true}},
    {{cast_MP_F8E5M2_false_false, cast_MP_F8E5M2_false_true},
     {cast_MP_F8E5M2_true_false, cast_MP_F8E5M2_true_true}},
};
#endif /* MP_X86 */

bool mp_fp8_scaled_cast(uint8_t *codes, uint16_t *decoded, mp_dtype fp8, const void *x, mp_dtype t,
                        size_t n, float scale, bool sign, uint32_t *amax_bits)
{
#if MP_X86
    if (mp_isa_active() < MP_ISA_AVX512 || (t != MP_F32 && t != MP_BF16) ||
        (fp8 != MP_F8E4M3 && fp8 != MP_F8E5M2))
        return false;
    if (!codes && !sign && decoded)
        *amax_bits = values[fp8 == MP_F8E5M2][t == MP_BF16](decoded, x, n, scale);
    else
        *amax_bits = casts[fp8 == MP_F8E5M2][t == MP_BF16][sign](codes, decoded, x, n, scale);
    return true;
#else
    (void)codes, (void)decoded, (void)fp8, (void)x, (void)t, (void)n, (void)scale, (void)sign;
    (void)amax_bits;
    return false;
#endif
}
