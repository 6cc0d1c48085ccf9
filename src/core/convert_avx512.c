/* convert_avx512.c - AVX-512 conversion kernels. Each reproduces the scalar
 * definition in dtype.c bit for bit (checked on all 2^32 inputs by
 * tests/exhaustive.c); they are compiled with per-function target attributes
 * and only called after runtime CPU detection. */
#include "internal.h"
#include "core/avx512_lanes.h"
#include "core/convert_simd.h"

#if MP_X86
#include <immintrin.h>

/* Outputs larger than the caches are written with streaming stores, as
 * memcpy does: the destination is not read for ownership first and the
 * conversion runs at copy speed. Smaller outputs stay in cache for whoever
 * reads them next. */
#define STREAM_BYTES ((size_t)8 << 20)

/* Elements to convert with ordinary stores before the destination is 64-byte
 * aligned, or SIZE_MAX when streaming does not apply. */
static inline size_t stream_head(const void *dst, size_t n, size_t es)
{
    uintptr_t p = (uintptr_t)dst;
    if (n * es < STREAM_BYTES || p % es) return SIZE_MAX;
    return ((64 - (p & 63)) & 63) / es;
}

/* Run LOOP(dst, src, count, streaming, extra...) over the whole array. */
#define STREAMED(LOOP, dst, src, n, es, ...)                                                       \
    do {                                                                                           \
        size_t h_ = stream_head(dst, n, es);                                                       \
        if (h_ == SIZE_MAX || h_ > (n)) {                                                          \
            LOOP(dst, src, n, false, __VA_ARGS__);                                                 \
        } else {                                                                                   \
            LOOP(dst, src, h_, false, __VA_ARGS__);                                                \
            LOOP((dst) + h_, (src) + h_, (n)-h_, true, __VA_ARGS__);                               \
            _mm_sfence();                                                                          \
        }                                                                                          \
    } while (0)

MP_TARGET_AVX512 static inline void put16(void *p, __m128i v, bool nt)
{
    if (nt)
        _mm_stream_si128((__m128i *)p, v);
    else
        _mm_storeu_si128((__m128i *)p, v);
}
MP_TARGET_AVX512 static inline void put32(void *p, __m256i v, bool nt)
{
    if (nt)
        _mm256_stream_si256((__m256i *)p, v);
    else
        _mm256_storeu_si256((__m256i *)p, v);
}
MP_TARGET_AVX512 static inline void put64(void *p, __m512i v, bool nt)
{
    if (nt)
        _mm512_stream_si512(p, v);
    else
        _mm512_storeu_si512(p, v);
}

/* ------------------------------------------------------------ f32 -> bf16 */

MP_TARGET_AVX512 static inline void bf16_loop(uint16_t *dst, const float *src, size_t n, bool nt,
                                              int unused)
{
    (void)unused;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512(src + i);
        put32(dst + i, _mm512_cvtepi32_epi16(mp_bf16_round16(u)), nt);
    }
    if (i < n) {
        __mmask16 k = mp_lanes16((int64_t)(n - i));
        __m512i u = _mm512_maskz_loadu_epi32(k, src + i);
        _mm512_mask_cvtepi32_storeu_epi16(dst + i, k, mp_bf16_round16(u));
    }
}

MP_TARGET_AVX512 static void v_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    STREAMED(bf16_loop, dst, src, n, 2, 0);
}

/* vcvtneps2bf16 rounds to nearest even and quiets NaNs exactly as the scalar
 * definition, but reads subnormal inputs as zero: vectors holding one take the
 * integer path. */
MP_TARGET_AVX512BF16 static inline void bf16_native_loop(uint16_t *dst, const float *src, size_t n,
                                                         bool nt, int unused)
{
    (void)unused;
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF), one = _mm512_set1_epi32(1);
    const __m512i submax = _mm512_set1_epi32(0x7FFFFF - 1);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512(src + i);
        __m512i am1 = _mm512_sub_epi32(_mm512_and_si512(u, absmask), one);
        __m256i out;
        if (_mm512_cmple_epu32_mask(am1, submax))
            out = _mm512_cvtepi32_epi16(mp_bf16_round16(u));
        else
            out = (__m256i)_mm512_cvtneps_pbh(_mm512_castsi512_ps(u));
        put32(dst + i, out, nt);
    }
    if (i < n) bf16_loop(dst + i, src + i, n - i, false, 0);
}

MP_TARGET_AVX512BF16 static void v_f32_to_bf16_native(uint16_t *dst, const float *src, size_t n)
{
    STREAMED(bf16_native_loop, dst, src, n, 2, 0);
}

/* ------------------------------------------------------------- f32 <-> f16 */

MP_TARGET_AVX512 static inline void f16_loop(uint16_t *dst, const float *src, size_t n, bool nt,
                                             int unused)
{
    (void)unused;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(src + i);
        put32(dst + i, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), nt);
    }
    if (i < n) {
        __mmask16 k = mp_lanes16((int64_t)(n - i));
        __m512 x = _mm512_maskz_loadu_ps(k, src + i);
        _mm256_mask_storeu_epi16(dst + i, k,
                                 _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
}

MP_TARGET_AVX512 static void v_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
    STREAMED(f16_loop, dst, src, n, 2, 0);
}

MP_TARGET_AVX512 static inline void f16_dec_loop(float *dst, const uint16_t *src, size_t n, bool nt,
                                                 int unused)
{
    (void)unused;
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        put64(dst + i,
              _mm512_castps_si512(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i)))),
              nt);
    if (i < n) {
        __mmask16 k = mp_lanes16((int64_t)(n - i));
        _mm512_mask_storeu_ps(dst + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, src + i)));
    }
}

MP_TARGET_AVX512 static void v_f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    STREAMED(f16_dec_loop, dst, src, n, 4, 0);
}

MP_TARGET_AVX512 static inline void bf16_dec_loop(float *dst, const uint16_t *src, size_t n,
                                                  bool nt, int unused)
{
    (void)unused;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        put64(dst + i, _mm512_slli_epi32(h, 16), nt);
    }
    if (i < n) {
        __mmask16 k = mp_lanes16((int64_t)(n - i));
        __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, src + i));
        _mm512_mask_storeu_epi32(dst + i, k, _mm512_slli_epi32(h, 16));
    }
}

MP_TARGET_AVX512 static void v_bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    STREAMED(bf16_dec_loop, dst, src, n, 4, 0);
}

/* ------------------------------------------------------------- f32 -> fp8 */

MP_TARGET_AVX512 static inline void fp8_encode_loop(uint8_t *dst, const float *src, size_t n,
                                                    bool nt, const mp_fp8_format f, mp_overflow ov)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512(src + i);
        put16(dst + i, _mm512_cvtepi32_epi8(mp_fp8_encode16(u, &f, ov)), nt);
    }
    if (i < n) {
        __mmask16 k = mp_lanes16((int64_t)(n - i));
        __m512i u = _mm512_maskz_loadu_epi32(k, src + i);
        _mm512_mask_cvtepi32_storeu_epi8(dst + i, k, mp_fp8_encode16(u, &f, ov));
    }
}

/* One instance per format and overflow mode, so the format's parameters are
 * constants inside the loop rather than loads through a pointer that the
 * byte stores might alias. */
MP_TARGET_AVX512 static void v_f32_to_fp8(uint8_t *dst, const float *src, size_t n, mp_dtype t,
                                          mp_overflow ov)
{
    const mp_fp8_format e4m3 = mp_fp8_e4m3, e5m2 = mp_fp8_e5m2;
    if (t == MP_F8E4M3 && ov == MP_OVERFLOW_SATURATE)
        STREAMED(fp8_encode_loop, dst, src, n, 1, e4m3, MP_OVERFLOW_SATURATE);
    else if (t == MP_F8E4M3)
        STREAMED(fp8_encode_loop, dst, src, n, 1, e4m3, MP_OVERFLOW_NONSAT);
    else if (ov == MP_OVERFLOW_SATURATE)
        STREAMED(fp8_encode_loop, dst, src, n, 1, e5m2, MP_OVERFLOW_SATURATE);
    else
        STREAMED(fp8_encode_loop, dst, src, n, 1, e5m2, MP_OVERFLOW_NONSAT);
}

/* ------------------------------------------------------------- fp8 -> f32 */

MP_TARGET_AVX512 static inline void fp8_dec_loop(float *dst, const uint8_t *src, size_t n, bool nt,
                                                 mp_dtype t)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        put64(dst + i, _mm512_castps_si512(mp_fp8_decode16(b, t)), nt);
    }
    if (i < n) {
        __mmask16 k = mp_lanes16((int64_t)(n - i));
        __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, src + i));
        _mm512_mask_storeu_ps(dst + i, k, mp_fp8_decode16(b, t));
    }
}

MP_TARGET_AVX512 static void v_fp8_to_f32(float *dst, const uint8_t *src, size_t n, mp_dtype t)
{
    if (t == MP_F8E4M3)
        STREAMED(fp8_dec_loop, dst, src, n, 4, MP_F8E4M3);
    else
        STREAMED(fp8_dec_loop, dst, src, n, 4, MP_F8E5M2);
}

const mp_convert_kernels mp_convert_avx512_kernels = {
    v_f32_to_bf16, v_f32_to_f16, v_f32_to_fp8, v_bf16_to_f32, v_f16_to_f32, v_fp8_to_f32,
};

const mp_convert_kernels mp_convert_avx512bf16_kernels = {
    v_f32_to_bf16_native, v_f32_to_f16, v_f32_to_fp8, v_bf16_to_f32, v_f16_to_f32, v_fp8_to_f32,
};

#endif /* MP_X86 */
