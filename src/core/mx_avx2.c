/* mx_avx2.c - AVX2 kernels for the MX block formats, for x86-64 CPUs without
 * AVX-512 (AMD Zen 2/3, Intel client cores): the route of mx_avx512.c (scale
 * from the amax's biased exponent, x / 2^shared_exp as a multiply by the
 * reciprocal power of two, integer round-to-nearest-even on the float32 bits
 * for element normals and a magic-constant add for element subnormals; see
 * that file's header for why each step gives the scalar bits), with a block
 * of 32 elements as four 8-lane vectors and blends where AVX-512 has masks.
 * Each kernel gives the bits of the scalar definition in mx.c on every input
 * (tests/test_mx.c checks every path against the scalar one and against an
 * independent reference).
 *
 * AVX2 has no unsigned compares or min/max: every value compared here is
 * the bits of a non-negative float32 (|x|, |x| * 2^-shared_exp), a small
 * code or a block scale, all below 2^31, where the signed compares order as
 * the unsigned ones would.
 *
 * A partial last block (and the last cols % 8 columns of a column-blocked
 * matrix) goes through a zero-padded local copy, not masked loads and
 * stores (vmaskmovps to memory is slow on AMD): zeros never raise a block's
 * amax and encode to code 0 (an MXFP4 pair's high nibble, as the scalar
 * kernel leaves it), and only the real elements are copied out.
 * Compiled with target attributes and only called after runtime CPU
 * detection, as convert_avx2.c. */
#include <string.h>

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

enum { V = 8, NV = MP_MX_BLOCK / V }; /* lanes per vector, vectors per block */

MP_TARGET_AVX2 INLINE __m256i set1(uint32_t v) { return _mm256_set1_epi32((int)v); }

MP_TARGET_AVX2 INLINE __m256i abs_bits(__m256i x) { return _mm256_and_si256(x, set1(0x7FFFFFFFu)); }

MP_TARGET_AVX2 INLINE __m256i load8(const float *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

/* All lanes of x where m is set, else those of y (m: each lane 0 or ~0). */
MP_TARGET_AVX2 INLINE __m256i sel(__m256i m, __m256i x, __m256i y)
{
    return _mm256_blendv_epi8(y, x, m);
}

/* The largest of the absolute bits of a block's four vectors (signed max:
 * every lane is below 2^31). */
MP_TARGET_AVX2 INLINE uint32_t block_amax(const __m256i a[NV])
{
    __m256i m = _mm256_max_epi32(_mm256_max_epi32(a[0], a[1]), _mm256_max_epi32(a[2], a[3]));
    __m128i h = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    return (uint32_t)_mm_cvtsi128_si32(h);
}

/* Magnitude code of |x| (bits a) in a block whose reciprocal scale is recip:
 * rounded to nearest even onto the element grid, clamped to max. y is
 * non-negative float32 bits, below 2^31: the signed compare is unsigned. */
MP_TARGET_AVX2 INLINE __m256i encode_mag(__m256i a, __m256 recip, mp_mx_format f)
{
    const mp_mx_elem e = mp_mx_elems[f];
    const int shift = 23 - e.mbits, emin = 1 - e.bias;
    const uint32_t min_normal = (uint32_t)(emin + 127) << 23;
    const uint32_t magic = (uint32_t)(emin - e.mbits + 23 + 127) << 23;
    __m256i y = _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(a), recip));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(y, shift), set1(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(y, set1((1u << (shift - 1)) - 1)), lsb);
    r = _mm256_sub_epi32(_mm256_srli_epi32(r, shift), set1((uint32_t)(127 - e.bias) << e.mbits));
    __m256 mg = _mm256_castsi256_ps(set1(magic));
    __m256i sub = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(y), mg)),
                                   _mm256_castps_si256(mg));
    r = sel(_mm256_cmpgt_epi32(set1(min_normal), y), sub, r);
    /* r may be negative only in element-subnormal lanes, replaced above */
    return _mm256_min_epi32(r, set1(e.max_mag));
}

/* The code of an element from its magnitude code and its input x (sign
 * lanes of x: all ones where negative). */
MP_TARGET_AVX2 INLINE __m256i with_sign(__m256i r, __m256i x, mp_mx_format f)
{
    __m256i neg = _mm256_srai_epi32(x, 31);
    if (f == MP_MXINT8) return _mm256_sub_epi32(_mm256_xor_si256(r, neg), neg); /* -r */
    return _mm256_or_si256(r, _mm256_and_si256(neg, set1(mp_mx_elems[f].sign_bit)));
}

/* The float32 value of a magnitude code (exact): the code's bits placed at
 * the top of a float32's exponent and fraction, times 2^(127 - bias). */
MP_TARGET_AVX2 INLINE __m256 mag_value(__m256i mag, mp_mx_format f)
{
    const mp_mx_elem e = mp_mx_elems[f];
    __m256 v = _mm256_castsi256_ps(_mm256_slli_epi32(mag, 23 - e.mbits));
    return _mm256_mul_ps(v, _mm256_castsi256_ps(set1((uint32_t)(254 - e.bias) << 23)));
}

/* The signed float32 value of element codes (one per 32-bit lane), as
 * mp_mx_element_to_f32: inf and NaN codes of E4M3 and E5M2 included. */
MP_TARGET_AVX2 INLINE __m256i element_bits(__m256i code, mp_mx_format f)
{
    const mp_mx_elem e = mp_mx_elems[f];
    __m256i mag, neg;
    if (f == MP_MXINT8) {
        __m256i s = _mm256_srai_epi32(_mm256_slli_epi32(code, 24), 24);
        neg = _mm256_srai_epi32(s, 31);
        mag = _mm256_abs_epi32(s);
    } else {
        __m256i sb = set1(e.sign_bit);
        neg = _mm256_cmpeq_epi32(_mm256_and_si256(code, sb), sb);
        mag = _mm256_and_si256(code, set1(e.sign_bit - 1));
    }
    __m256i v = _mm256_castps_si256(mag_value(mag, f));
    if (e.fp8 == MP_F8E4M3) {
        v = sel(_mm256_cmpeq_epi32(mag, set1(0x7F)), set1(0x7FC00000u), v);
    } else if (e.fp8 == MP_F8E5M2) { /* mag < 128: signed compares */
        __m256i special = _mm256_cmpgt_epi32(mag, set1(0x7B));
        __m256i nan = _mm256_cmpgt_epi32(mag, set1(0x7C));
        __m256i s = _mm256_or_si256(set1(0x7F800000u),
                                    _mm256_slli_epi32(_mm256_and_si256(mag, set1(3)), 21));
        v = sel(special, s, v);
        v = _mm256_or_si256(v, _mm256_and_si256(nan, set1(0x400000)));
    }
    return _mm256_or_si256(v, _mm256_and_si256(neg, set1(0x80000000u)));
}

/* f32 bits -> bf16 as mp_f32_to_bf16 (nearest even, NaN quieted), in the
 * low half of each lane; |u| < 2^31, so the NaN compare is unsigned. */
MP_TARGET_AVX2 INLINE __m256i to_bf16(__m256i u)
{
    __m256i nan = _mm256_cmpgt_epi32(abs_bits(u), set1(0x7F800000u));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), set1(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, set1(0x7FFF)), lsb), 16);
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), set1(0x40));
    return sel(nan, q, r);
}

/* Store 8 values (float32 bits) at element i of dst. */
MP_TARGET_AVX2 INLINE void put(void *dst, size_t i, mp_dtype t, __m256i v)
{
    if (t == MP_BF16) {
        __m256i h = to_bf16(v); /* each lane < 2^16: packus keeps it */
        _mm_storeu_si128(
            (__m128i *)((uint16_t *)dst + i),
            _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
    } else {
        _mm256_storeu_si256((__m256i *)((float *)dst + i), v);
    }
}

/* The scale (2^(c-127), or NaN for code 255) as float32 bits. */
MP_TARGET_AVX2 INLINE uint32_t scale_bits(uint32_t c)
{
    return c == MP_E8M0_NAN ? 0x7FC00000u : mp_e8m0_bits(c);
}

/* A partial block (len < 32) or strip (len < 8) of float32 values, zero
 * padded: the part that does not fit is never read or written. */
typedef union {
    float f[MP_MX_BLOCK];
    uint32_t u[MP_MX_BLOCK];
    uint16_t h[MP_MX_BLOCK];
    uint8_t b[MP_MX_BLOCK];
} block_buf;

/* --------------------------------------------------------------- pack */

/* The low bytes of the 32 lanes of c[0..3], in order. */
MP_TARGET_AVX2 INLINE __m256i narrow_bytes(const __m256i c[NV])
{
    const __m256i lo = set1(0xFF);
    __m256i p01 = _mm256_packus_epi32(_mm256_and_si256(c[0], lo), _mm256_and_si256(c[1], lo));
    __m256i p23 = _mm256_packus_epi32(_mm256_and_si256(c[2], lo), _mm256_and_si256(c[3], lo));
    /* dword k of the pack holds 4 bytes: (c0 c1 c2 c3) low halves, then high */
    return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(p01, p23),
                                       _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* One whole block of 32 floats at x: its scale code, its codes at out (32
 * bytes, MXFP4 16: even element low nibble, odd high). */
MP_TARGET_AVX2 INLINE uint32_t pack_block(const float *x, uint8_t *out, mp_mx_format f)
{
    __m256i v[NV], a[NV], c[NV];
    for (int k = 0; k < NV; k++) {
        v[k] = load8(x + k * V);
        a[k] = abs_bits(v[k]);
    }
    uint32_t sc = mp_mx_scale_fast(block_amax(a), mp_mx_elems[f].emax);
    __m256 recip = _mm256_castsi256_ps(set1(mp_e8m0_recip_bits(sc)));
    for (int k = 0; k < NV; k++)
        c[k] = sc == MP_E8M0_NAN ? _mm256_setzero_si256()
                                 : with_sign(encode_mag(a[k], recip, f), v[k], f);
    __m256i bytes = narrow_bytes(c);
    if (f == MP_MXFP4_E2M1) {
        /* 16-bit word = even | odd << 8, codes < 16: -> even | odd << 4 */
        __m256i w = _mm256_and_si256(_mm256_or_si256(bytes, _mm256_srli_epi16(bytes, 4)),
                                     _mm256_set1_epi16(0xFF));
        _mm_storeu_si128((__m128i *)out, _mm_packus_epi16(_mm256_castsi256_si128(w),
                                                          _mm256_extracti128_si256(w, 1)));
    } else {
        _mm256_storeu_si256((__m256i *)out, bytes);
    }
    return sc;
}

MP_TARGET_AVX2 INLINE void pack_loop(const float *src, size_t n, uint8_t *codes, uint8_t *scales,
                                     mp_mx_format f)
{
    const int fp4 = f == MP_MXFP4_E2M1;
    size_t b = 0, i0 = 0;
    for (; i0 + MP_MX_BLOCK <= n; b++, i0 += MP_MX_BLOCK)
        scales[b] = (uint8_t)pack_block(src + i0, codes + (fp4 ? i0 / 2 : i0), f);
    if (i0 < n) {
        size_t len = n - i0;
        block_buf x = {{0}}, c;
        memcpy(x.f, src + i0, len * sizeof(float));
        scales[b] = (uint8_t)pack_block(x.f, c.b, f);
        memcpy(codes + (fp4 ? i0 / 2 : i0), c.b, fp4 ? (len + 1) / 2 : len);
    }
}

MP_TARGET_AVX2 static void v_pack(mp_mx_format f, const float *src, size_t n, uint8_t *codes,
                                  uint8_t *scales)
{
#define CALL(F) pack_loop(src, n, codes, scales, F)
    FOR_EACH_FORMAT(f, CALL);
#undef CALL
}

/* ------------------------------------------------------------- unpack */

/* One whole block: codes at p (32 bytes, MXFP4 16), scale code sc, 32
 * values to element i of dst. */
MP_TARGET_AVX2 INLINE void unpack_block(const uint8_t *p, uint32_t sc, void *dst, size_t i,
                                        mp_dtype t, mp_mx_format f)
{
    if (sc == MP_E8M0_NAN) {
        for (int k = 0; k < NV; k++) put(dst, i + (size_t)k * V, t, set1(0x7FC00000u));
        return;
    }
    __m256 s = _mm256_castsi256_ps(set1(scale_bits(sc)));
    for (int k = 0; k < NV; k++) {
        __m256i c;
        if (f == MP_MXFP4_E2M1) {
            /* 4 bytes, byte b -> (b & 15) | (b >> 4) << 32: elements 2j, 2j+1 */
            int32_t q;
            memcpy(&q, p + k * V / 2, sizeof q);
            __m256i w = _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(q));
            c = _mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi64x(0xF)),
                                _mm256_slli_epi64(_mm256_srli_epi64(w, 4), 32));
        } else {
            c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + k * V)));
        }
        __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(element_bits(c, f)), s);
        put(dst, i + (size_t)k * V, t, _mm256_castps_si256(v));
    }
}

MP_TARGET_AVX2 INLINE void unpack_loop(const uint8_t *codes, const uint8_t *scales, size_t n,
                                       void *dst, mp_dtype t, mp_mx_format f)
{
    const int fp4 = f == MP_MXFP4_E2M1;
    size_t b = 0, i0 = 0;
    for (; i0 + MP_MX_BLOCK <= n; b++, i0 += MP_MX_BLOCK)
        unpack_block(codes + (fp4 ? i0 / 2 : i0), scales[b], dst, i0, t, f);
    if (i0 < n) {
        size_t len = n - i0, es = mp_dtype_size(t);
        block_buf c = {{0}}, out;
        memcpy(c.b, codes + (fp4 ? i0 / 2 : i0), fp4 ? (len + 1) / 2 : len);
        unpack_block(c.b, scales[b], out.u, 0, t, f);
        memcpy((char *)dst + i0 * es, out.u, len * es);
    }
}

MP_TARGET_AVX2 static void v_unpack(mp_mx_format f, const uint8_t *codes, const uint8_t *scales,
                                    size_t n, void *dst, mp_dtype t)
{
#define CALL(F) unpack_loop(codes, scales, n, dst, t, F)
    FOR_EACH_FORMAT(f, CALL);
#undef CALL
}

/* ------------------------------------------------- fake quantization */

/* Quantized and decoded values of x (bits), given the block's reciprocal
 * scale and scale (per lane for column blocks); NaN-scale lanes are the
 * caller's. */
MP_TARGET_AVX2 INLINE __m256i fake(__m256i x, __m256 recip, __m256 scale, mp_mx_format f)
{
    __m256i r = encode_mag(abs_bits(x), recip, f);
    __m256i v = _mm256_castps_si256(_mm256_mul_ps(mag_value(r, f), scale));
    __m256i neg = _mm256_and_si256(x, set1(0x80000000u));
    if (f == MP_MXINT8) /* no -0: two's complement has none */
        neg = _mm256_andnot_si256(_mm256_cmpeq_epi32(r, _mm256_setzero_si256()), neg);
    return _mm256_or_si256(v, neg);
}

/* One whole block of 32 floats at x, its values to element i of dst. */
MP_TARGET_AVX2 INLINE void rows_block(const float *x, void *dst, size_t i, mp_dtype t,
                                      mp_mx_format f)
{
    __m256i v[NV], a[NV];
    for (int k = 0; k < NV; k++) {
        v[k] = load8(x + k * V);
        a[k] = abs_bits(v[k]);
    }
    uint32_t sc = mp_mx_scale_fast(block_amax(a), mp_mx_elems[f].emax);
    if (sc == MP_E8M0_NAN) {
        for (int k = 0; k < NV; k++) put(dst, i + (size_t)k * V, t, set1(0x7FC00000u));
        return;
    }
    __m256 recip = _mm256_castsi256_ps(set1(mp_e8m0_recip_bits(sc)));
    __m256 scale = _mm256_castsi256_ps(set1(scale_bits(sc)));
    for (int k = 0; k < NV; k++) put(dst, i + (size_t)k * V, t, fake(v[k], recip, scale, f));
}

MP_TARGET_AVX2 INLINE void rows_loop(const float *src, size_t rows, size_t cols, void *dst,
                                     mp_dtype t, mp_mx_format f)
{
    const size_t es = mp_dtype_size(t);
    for (size_t row = 0; row < rows; row++) {
        const float *x = src + row * cols;
        size_t o = row * cols, i0 = 0;
        for (; i0 + MP_MX_BLOCK <= cols; i0 += MP_MX_BLOCK) rows_block(x + i0, dst, o + i0, t, f);
        if (i0 < cols) {
            size_t len = cols - i0;
            block_buf in = {{0}}, out;
            memcpy(in.f, x + i0, len * sizeof(float));
            rows_block(in.f, out.u, 0, t, f);
            memcpy((char *)dst + (o + i0) * es, out.u, len * es);
        }
    }
}

MP_TARGET_AVX2 static void v_quantize_rows(mp_mx_format f, const float *src, size_t rows,
                                           size_t cols, void *dst, mp_dtype t)
{
#define CALL(F) rows_loop(src, rows, cols, dst, t, F)
    FOR_EACH_FORMAT(f, CALL);
#undef CALL
}

/* w <= 8 floats at p; those past w are 0. */
MP_TARGET_AVX2 INLINE __m256i load_part(const float *p, size_t w)
{
    if (w == V) return load8(p);
    block_buf b = {{0}};
    memcpy(b.f, p, w * sizeof(float));
    return load8(b.f);
}

/* The first w <= 8 of 8 values to element i of dst. */
MP_TARGET_AVX2 INLINE void put_part(void *dst, size_t i, mp_dtype t, __m256i v, size_t w)
{
    if (w == V) {
        put(dst, i, t, v);
        return;
    }
    block_buf b;
    size_t es = mp_dtype_size(t);
    put(b.u, 0, t, v);
    memcpy((char *)dst + i * es, b.u, w * es);
}

/* A strip of h <= 32 rows and w <= 8 columns at column j: the amax of each
 * column (one lane each), the scale rule per lane, then every row. */
MP_TARGET_AVX2 INLINE void cols_strip(const float *src, size_t r0, size_t h, size_t j, size_t w,
                                      size_t cols, void *dst, mp_dtype t, mp_mx_format f)
{
    __m256i am = _mm256_setzero_si256();
    for (size_t i = 0; i < h; i++)
        am = _mm256_max_epi32(am, abs_bits(load_part(src + (r0 + i) * cols + j, w)));
    /* mp_mx_scale_fast and mp_e8m0_(recip_)bits per lane; am, c < 2^31 */
    __m256i nan = _mm256_cmpgt_epi32(am, set1(0x7F7FFFFFu));
    __m256i c = _mm256_max_epi32(
        _mm256_sub_epi32(_mm256_srli_epi32(am, 23), set1((uint32_t)mp_mx_elems[f].emax)),
        _mm256_setzero_si256());
    const __m256i sub = set1(0x00400000u);
    __m256i sc = sel(_mm256_cmpeq_epi32(c, _mm256_setzero_si256()), sub, _mm256_slli_epi32(c, 23));
    __m256i rc = sel(_mm256_cmpgt_epi32(c, set1(253)), sub,
                     _mm256_slli_epi32(_mm256_sub_epi32(set1(254), c), 23));
    __m256 recip = _mm256_castsi256_ps(rc), scale = _mm256_castsi256_ps(sc);
    for (size_t i = 0; i < h; i++) {
        size_t o = (r0 + i) * cols + j;
        __m256i v = fake(load_part(src + o, w), recip, scale, f);
        put_part(dst, o, t, sel(nan, set1(0x7FC00000u), v), w);
    }
}

/* Blocks down the columns: strips of up to 32 rows and 8 columns. */
MP_TARGET_AVX2 INLINE void cols_loop(const float *src, size_t rows, size_t cols, void *dst,
                                     mp_dtype t, mp_mx_format f)
{
    for (size_t r0 = 0; r0 < rows; r0 += MP_MX_BLOCK) {
        size_t h = rows - r0 < MP_MX_BLOCK ? rows - r0 : MP_MX_BLOCK, j = 0;
        for (; j + V <= cols; j += V) cols_strip(src, r0, h, j, V, cols, dst, t, f);
        if (j < cols) cols_strip(src, r0, h, j, cols - j, cols, dst, t, f);
    }
}

MP_TARGET_AVX2 static void v_quantize_cols(mp_mx_format f, const float *src, size_t rows,
                                           size_t cols, void *dst, mp_dtype t)
{
#define CALL(F) cols_loop(src, rows, cols, dst, t, F)
    FOR_EACH_FORMAT(f, CALL);
#undef CALL
}

const mp_mx_kernels mp_mx_avx2_kernels = {v_pack, v_unpack, v_quantize_rows, v_quantize_cols};

#endif /* MP_X86 */
