/* mx_avx512.c - AVX-512 kernels for the MX block formats. Each gives the
 * bits of the scalar definition in mx.c on every input (tests/test_mx.c
 * checks them against each other and against an independent reference);
 * compiled with per-function target attributes and only called after
 * runtime CPU detection, as convert_avx512.c.
 *
 * The route differs from the scalar one where that is cheaper and provably
 * the same: the block scale is the amax's biased exponent minus emax
 * (mp_mx_scale_fast), and x / 2^shared_exp is a float32 multiply by the
 * reciprocal power of two, exact whenever the quotient is a float32 normal;
 * when it is not (below 2^-126) it is far below half the smallest element
 * subnormal (2^-17 at the least, E5M2), so both routes give zero. The
 * rounding onto the element grid is the fp8 one of convert_avx512.c: integer
 * round-to-nearest-even on the float32 bits for element normals, a float32
 * add of a magic power of two for element subnormals. */
#include "core/avx512_lanes.h"
#include "core/convert_simd.h"
#include "mx_internal.h"

#if MP_X86
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

/* Every format as a constant, so the worker inlined into each case of the
 * switch folds its parameters into immediates. */
#define FOR_EACH_FORMAT(f, CALL)                                                                   \
    do {                                                                                           \
        switch (f) {                                                                               \
        case MP_MXFP8_E4M3:                                                                        \
            CALL(MP_MXFP8_E4M3);                                                                   \
            break;                                                                                 \
        case MP_MXFP8_E5M2:                                                                        \
            CALL(MP_MXFP8_E5M2);                                                                   \
            break;                                                                                 \
        case MP_MXFP6_E2M3:                                                                        \
            CALL(MP_MXFP6_E2M3);                                                                   \
            break;                                                                                 \
        case MP_MXFP6_E3M2:                                                                        \
            CALL(MP_MXFP6_E3M2);                                                                   \
            break;                                                                                 \
        case MP_MXFP4_E2M1:                                                                        \
            CALL(MP_MXFP4_E2M1);                                                                   \
            break;                                                                                 \
        case MP_MXINT8:                                                                            \
            CALL(MP_MXINT8);                                                                       \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

/* 16 float32 values as their bits (lanes k, avx512_lanes.h). */
MP_TARGET_AVX512 INLINE __m512i load16(const float *p, __mmask16 k)
{
    return _mm512_castps_si512(mp_load16(p, k));
}

MP_TARGET_AVX512 INLINE __m512i abs_bits(__m512i x)
{
    return _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF));
}

/* Magnitude code of |x| (bits a) in a block whose reciprocal scale is recip:
 * rounded to nearest even onto the element grid, clamped to max. */
MP_TARGET_AVX512 INLINE __m512i encode_mag(__m512i a, __m512 recip, mp_mx_format f)
{
    const mp_mx_elem e = mp_mx_elems[f];
    const int shift = 23 - e.mbits, emin = 1 - e.bias;
    const uint32_t min_normal = (uint32_t)(emin + 127) << 23;
    const uint32_t magic = (uint32_t)(emin - e.mbits + 23 + 127) << 23;
    __m512i y = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(a), recip));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(y, (unsigned)shift), _mm512_set1_epi32(1));
    __m512i r =
        _mm512_add_epi32(_mm512_add_epi32(y, _mm512_set1_epi32((1 << (shift - 1)) - 1)), lsb);
    r = _mm512_sub_epi32(_mm512_srli_epi32(r, (unsigned)shift),
                         _mm512_set1_epi32((127 - e.bias) << e.mbits));
    __m512 mg = _mm512_castsi512_ps(_mm512_set1_epi32((int)magic));
    __m512i sub = _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(y), mg)),
                                   _mm512_castps_si512(mg));
    __mmask16 is_sub = _mm512_cmplt_epu32_mask(y, _mm512_set1_epi32((int)min_normal));
    r = _mm512_mask_mov_epi32(r, is_sub, sub);
    return _mm512_min_epi32(r, _mm512_set1_epi32((int)e.max_mag));
}

/* The code of an element from its magnitude code and its input x. */
MP_TARGET_AVX512 INLINE __m512i with_sign(__m512i r, __m512i x, mp_mx_format f)
{
    __mmask16 neg = _mm512_movepi32_mask(x);
    if (f == MP_MXINT8) return _mm512_mask_sub_epi32(r, neg, _mm512_setzero_si512(), r);
    return _mm512_mask_or_epi32(r, neg, r, _mm512_set1_epi32((int)mp_mx_elems[f].sign_bit));
}

/* The float32 value of a magnitude code (exact): the code's bits placed at
 * the top of a float32's exponent and fraction, times 2^(127 - bias). */
MP_TARGET_AVX512 INLINE __m512 mag_value(__m512i mag, mp_mx_format f)
{
    const mp_mx_elem e = mp_mx_elems[f];
    __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(mag, (unsigned)(23 - e.mbits)));
    return _mm512_mul_ps(v, _mm512_castsi512_ps(_mm512_set1_epi32((254 - e.bias) << 23)));
}

/* The signed float32 value of element codes (one per 32-bit lane), as
 * mp_mx_element_to_f32: inf and NaN codes of E4M3 and E5M2 included (by
 * convert_simd.h's float8 decode). */
MP_TARGET_AVX512 INLINE __m512i element_bits(__m512i code, mp_mx_format f)
{
    const mp_mx_elem e = mp_mx_elems[f];
    if (e.fp8 == MP_F8E4M3 || e.fp8 == MP_F8E5M2) /* the float8 decode itself */
        return _mm512_castps_si512(mp_fp8_decode16(code, e.fp8));
    __m512i mag;
    __mmask16 neg;
    if (f == MP_MXINT8) {
        __m512i s = _mm512_srai_epi32(_mm512_slli_epi32(code, 24), 24);
        neg = _mm512_movepi32_mask(s);
        mag = _mm512_abs_epi32(s);
    } else {
        neg = _mm512_test_epi32_mask(code, _mm512_set1_epi32((int)e.sign_bit));
        mag = _mm512_and_si512(code, _mm512_set1_epi32((int)(e.sign_bit - 1)));
    }
    __m512i v = _mm512_castps_si512(mag_value(mag, f));
    return _mm512_mask_or_epi32(v, neg, v, _mm512_set1_epi32((int)0x80000000u));
}

/* f32 bits -> bf16 as mp_f32_to_bf16 (nearest even, NaN quieted). */
MP_TARGET_AVX512 INLINE __m256i to_bf16(__m512i u)
{
    __mmask16 nan = _mm512_cmpgt_epu32_mask(abs_bits(u), _mm512_set1_epi32(0x7F800000));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, q));
}

/* Store 16 values (float32 bits) at element i of dst, lanes k only. */
MP_TARGET_AVX512 INLINE void put(void *dst, size_t i, mp_dtype t, __m512i v, __mmask16 k)
{
    if (t == MP_BF16)
        mp_store16_u16((uint16_t *)dst + i, k, to_bf16(v));
    else
        mp_store16((float *)dst + i, k, _mm512_castsi512_ps(v));
}

/* The scale (2^(c-127), or NaN for code 255) and its reciprocal as vectors. */
MP_TARGET_AVX512 INLINE __m512i scale_vec(uint32_t c)
{
    return _mm512_set1_epi32((int)(c == MP_E8M0_NAN ? 0x7FC00000u : mp_e8m0_bits(c)));
}

/* --------------------------------------------------------------- pack */

MP_TARGET_AVX512 INLINE void pack_loop(const float *src, size_t n, uint8_t *codes, uint8_t *scales,
                                       mp_mx_format f)
{
    const int emax = mp_mx_elems[f].emax;
    for (size_t b = 0, i0 = 0; i0 < n; b++, i0 += MP_MX_BLOCK) {
        size_t len = n - i0 < MP_MX_BLOCK ? n - i0 : MP_MX_BLOCK;
        __mmask16 k0 = mp_lanes16(len), k1 = mp_lanes16(len > 16 ? len - 16 : 0);
        __m512i x0 = load16(src + i0, k0);
        __m512i x1 = load16(src + i0 + 16, k1);
        __m512i a0 = abs_bits(x0), a1 = abs_bits(x1);
        uint32_t c = mp_mx_scale_fast(_mm512_reduce_max_epu32(_mm512_max_epu32(a0, a1)), emax);
        scales[b] = (uint8_t)c;
        __m512i c0 = _mm512_setzero_si512(), c1 = c0;
        if (c != MP_E8M0_NAN) {
            __m512 recip = _mm512_castsi512_ps(_mm512_set1_epi32((int)mp_e8m0_recip_bits(c)));
            c0 = with_sign(encode_mag(a0, recip, f), x0, f);
            c1 = with_sign(encode_mag(a1, recip, f), x1, f);
        }
        if (f == MP_MXFP4_E2M1) {
            /* pairs of 32-bit lanes -> one byte: even element low, odd high */
            __m512i p0 = _mm512_or_si512(c0, _mm512_srli_epi64(c0, 28));
            __m512i p1 = _mm512_or_si512(c1, _mm512_srli_epi64(c1, 28));
            __m128i bytes = _mm_unpacklo_epi64(_mm512_cvtepi64_epi8(p0), _mm512_cvtepi64_epi8(p1));
            mp_store16_u8(codes + i0 / 2, mp_lanes16((len + 1) / 2), bytes);
        } else {
            mp_store16_u8(codes + i0, k0, _mm512_cvtepi32_epi8(c0));
            mp_store16_u8(codes + i0 + 16, k1, _mm512_cvtepi32_epi8(c1));
        }
    }
}

MP_TARGET_AVX512 static void v_pack(mp_mx_format f, const float *src, size_t n, uint8_t *codes,
                                    uint8_t *scales)
{
#define CALL(F) pack_loop(src, n, codes, scales, F)
    FOR_EACH_FORMAT(f, CALL);
#undef CALL
}

/* ------------------------------------------------------------- unpack */

MP_TARGET_AVX512 INLINE void unpack_loop(const uint8_t *codes, const uint8_t *scales, size_t n,
                                         void *dst, mp_dtype t, mp_mx_format f)
{
    for (size_t b = 0, i0 = 0; i0 < n; b++, i0 += MP_MX_BLOCK) {
        size_t len = n - i0 < MP_MX_BLOCK ? n - i0 : MP_MX_BLOCK;
        __mmask16 k0 = mp_lanes16(len), k1 = mp_lanes16(len > 16 ? len - 16 : 0);
        __m512i c0, c1;
        if (f == MP_MXFP4_E2M1) {
            __m128i bytes = mp_load16_u8(codes + i0 / 2, mp_lanes16((len + 1) / 2));
            __m512i w0 = _mm512_cvtepu8_epi64(bytes);
            __m512i w1 = _mm512_cvtepu8_epi64(_mm_srli_si128(bytes, 8));
            const __m512i lo = _mm512_set1_epi64(0xF);
            /* byte b -> (b & 15) | (b >> 4) << 32: elements 2i, 2i+1 */
            c0 = _mm512_or_si512(_mm512_and_si512(w0, lo),
                                 _mm512_slli_epi64(_mm512_srli_epi64(w0, 4), 32));
            c1 = _mm512_or_si512(_mm512_and_si512(w1, lo),
                                 _mm512_slli_epi64(_mm512_srli_epi64(w1, 4), 32));
        } else {
            c0 = _mm512_cvtepu8_epi32(mp_load16_u8(codes + i0, k0));
            c1 = _mm512_cvtepu8_epi32(mp_load16_u8(codes + i0 + 16, k1));
        }
        uint32_t c = scales[b];
        __m512i v0, v1;
        if (c == MP_E8M0_NAN) {
            v0 = v1 = scale_vec(c);
        } else {
            __m512 s = _mm512_castsi512_ps(scale_vec(c));
            v0 = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(element_bits(c0, f)), s));
            v1 = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(element_bits(c1, f)), s));
        }
        put(dst, i0, t, v0, k0);
        put(dst, i0 + 16, t, v1, k1);
    }
}

MP_TARGET_AVX512 static void v_unpack(mp_mx_format f, const uint8_t *codes, const uint8_t *scales,
                                      size_t n, void *dst, mp_dtype t)
{
#define CALL(F) unpack_loop(codes, scales, n, dst, t, F)
    FOR_EACH_FORMAT(f, CALL);
#undef CALL
}

/* ------------------------------------------------- fake quantization */

/* Quantized and decoded values of x (bits), given the block's reciprocal
 * scale and scale (vectors: per lane for column blocks) and its NaN lanes. */
MP_TARGET_AVX512 INLINE __m512i fake(__m512i x, __m512 recip, __m512 scale, __mmask16 nan,
                                     mp_mx_format f)
{
    __m512i r = encode_mag(abs_bits(x), recip, f);
    __m512i v = _mm512_castps_si512(_mm512_mul_ps(mag_value(r, f), scale));
    __mmask16 neg = _mm512_movepi32_mask(x);
    if (f == MP_MXINT8) neg &= _mm512_test_epi32_mask(r, r); /* no -0 */
    v = _mm512_mask_or_epi32(v, neg, v, _mm512_set1_epi32((int)0x80000000u));
    return _mm512_mask_mov_epi32(v, nan, _mm512_set1_epi32(0x7FC00000));
}

MP_TARGET_AVX512 INLINE void rows_loop(const float *src, size_t rows, size_t cols, void *dst,
                                       mp_dtype t, mp_mx_format f)
{
    const int emax = mp_mx_elems[f].emax;
    for (size_t row = 0; row < rows; row++) {
        const float *x = src + row * cols;
        size_t o = row * cols;
        for (size_t i0 = 0; i0 < cols; i0 += MP_MX_BLOCK) {
            size_t len = cols - i0 < MP_MX_BLOCK ? cols - i0 : MP_MX_BLOCK;
            __mmask16 k0 = mp_lanes16(len), k1 = mp_lanes16(len > 16 ? len - 16 : 0);
            __m512i x0 = load16(x + i0, k0);
            __m512i x1 = load16(x + i0 + 16, k1);
            __m512i am = _mm512_max_epu32(abs_bits(x0), abs_bits(x1));
            uint32_t c = mp_mx_scale_fast(_mm512_reduce_max_epu32(am), emax);
            __mmask16 nan = c == MP_E8M0_NAN ? 0xFFFF : 0;
            __m512 recip = _mm512_castsi512_ps(_mm512_set1_epi32((int)mp_e8m0_recip_bits(c)));
            __m512 scale = _mm512_castsi512_ps(scale_vec(c));
            put(dst, o + i0, t, fake(x0, recip, scale, nan, f), k0);
            put(dst, o + i0 + 16, t, fake(x1, recip, scale, nan, f), k1);
        }
    }
}

MP_TARGET_AVX512 static void v_quantize_rows(mp_mx_format f, const float *src, size_t rows,
                                             size_t cols, void *dst, mp_dtype t)
{
#define CALL(F) rows_loop(src, rows, cols, dst, t, F)
    FOR_EACH_FORMAT(f, CALL);
#undef CALL
}

/* Blocks down the columns: for each strip of up to 32 rows and 16 columns,
 * the amax of each column (one lane each), then every row of the strip. */
MP_TARGET_AVX512 INLINE void cols_loop(const float *src, size_t rows, size_t cols, void *dst,
                                       mp_dtype t, mp_mx_format f)
{
    const __m512i emax = _mm512_set1_epi32(mp_mx_elems[f].emax);
    for (size_t r0 = 0; r0 < rows; r0 += MP_MX_BLOCK) {
        size_t h = rows - r0 < MP_MX_BLOCK ? rows - r0 : MP_MX_BLOCK;
        for (size_t j = 0; j < cols; j += 16) {
            __mmask16 k = mp_lanes16(cols - j);
            __m512i am = _mm512_setzero_si512();
            for (size_t i = 0; i < h; i++)
                am = _mm512_max_epu32(am, abs_bits(load16(src + (r0 + i) * cols + j, k)));
            /* mp_mx_scale_fast per lane */
            __mmask16 nan = _mm512_cmpge_epu32_mask(am, _mm512_set1_epi32(0x7F800000));
            __m512i c = _mm512_max_epi32(_mm512_sub_epi32(_mm512_srli_epi32(am, 23), emax),
                                         _mm512_setzero_si512());
            const __m512i sub = _mm512_set1_epi32(0x00400000);
            __m512i sc = _mm512_mask_mov_epi32(
                _mm512_slli_epi32(c, 23), _mm512_cmpeq_epi32_mask(c, _mm512_setzero_si512()), sub);
            __m512i rc = _mm512_mask_mov_epi32(
                _mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(254), c), 23),
                _mm512_cmpge_epi32_mask(c, _mm512_set1_epi32(254)), sub);
            __m512 recip = _mm512_castsi512_ps(rc), scale = _mm512_castsi512_ps(sc);
            for (size_t i = 0; i < h; i++) {
                size_t o = (r0 + i) * cols + j;
                __m512i x = load16(src + o, k);
                put(dst, o, t, fake(x, recip, scale, nan, f), k);
            }
        }
    }
}

MP_TARGET_AVX512 static void v_quantize_cols(mp_mx_format f, const float *src, size_t rows,
                                             size_t cols, void *dst, mp_dtype t)
{
#define CALL(F) cols_loop(src, rows, cols, dst, t, F)
    FOR_EACH_FORMAT(f, CALL);
#undef CALL
}

const mp_mx_kernels mp_mx_avx512_kernels = {v_pack, v_unpack, v_quantize_rows, v_quantize_cols};

#endif /* MP_X86 */
