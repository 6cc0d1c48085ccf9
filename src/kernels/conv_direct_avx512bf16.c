/* conv_direct_avx512bf16.c - the direct convolution's forward microkernels
 * on AVX512_BF16: bfloat16 input and weights, the input channels taken in
 * pairs by vdpbf16ps (one 32-bit lane holds channels c and c+1 of a pixel,
 * or of a weight column), float32 accumulators. The driver, padding and
 * packing are conv_direct_avx512.c's; this file is the kernels alone.
 *
 * Filter gradient: the same on pairs of consecutive output pixels of a
 * row (the sum's index), CR input channels x NV*16 output channels per
 * call; the pairs are interleaved by conv_direct_filter_avx512.c.
 *
 * Forward: per pair of channels a tile of MR pixels x NV*16 output channels takes
 * NV weight loads and MR broadcasts (memory operands of vdpbf16ps), twice
 * the work of the float32 kernel per instruction. Each vdpbf16ps adds the
 * two products of a pair to the accumulator one after the other, each
 * rounded (products of bfloat16 values are exact in float32), so a result
 * is a float32 sum of the same terms as the FMA kernel's in a fixed order;
 * vdpbf16ps reads subnormal inputs as zero and flushes subnormal sums (as
 * the GEMM's vdpbf16ps kernel, gemm_avx512bf16.c). */
#include <string.h>

#include "kernels/conv_direct_internal.h"
#include "kernels/gemm_avx512_common.h"

#if MP_X86

#define BF16_KERNEL(SW, NV, MR)                                                                    \
    MP_TARGET_AVX512BF16 static void bfwd_##SW##_##NV##_##MR(                                      \
        int64_t ntap, int steps, const int64_t *xoff, const void *xv, const void *wv, float *t,    \
        int64_t ldt)                                                                               \
    {                                                                                              \
        const uint16_t *x = xv, *w = wv;                                                           \
        __m512 acc[MR][NV];                                                                        \
        _Pragma("GCC unroll 28") for (int i = 0; i < MR; i++)                                      \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();  \
        for (int64_t tap = 0; tap < ntap; tap++) {                                                 \
            const uint16_t *xp = x + xoff[tap];                                                    \
            for (int c = 0; c < steps; c++) {                                                      \
                __m512bh wp[NV];                                                                   \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) wp[v] =                       \
                    (__m512bh)_mm512_load_si512(w + v * 32);                                       \
                _Pragma("GCC unroll 28") for (int i = 0; i < MR; i++)                              \
                {                                                                                  \
                    int32_t pair;                                                                  \
                    memcpy(&pair, xp + i * SW * 16, sizeof pair);                                  \
                    const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);                         \
                    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[i][v] =               \
                        _mm512_dpbf16_ps(acc[i][v], xb, wp[v]);                                    \
                }                                                                                  \
                xp += 2;                                                                           \
                w += NV * 32;                                                                      \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 28") for (int i = 0; i < MR; i++)                                      \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)                                   \
                _mm512_storeu_ps(t + i * ldt + v * 16, acc[i][v]);                                 \
    }

CONV_ALL_KERNELS(BF16_KERNEL, 1)
CONV_ALL_KERNELS(BF16_KERNEL, 2)

#define bfwd_ENTRY(S, N, M) bfwd_##S##_##N##_##M,
CONV_FWD_TABLES(bfwd_)

#define BF16_FILT(SW, NV, CR)                                                                      \
    MP_TARGET_AVX512BF16 static void bfilt_##SW##_##NV(                                            \
        int64_t oh, int64_t np, const void *xv, int64_t xrs, const void *dyv, int64_t dyrs,        \
        int64_t dps, float *p, int64_t ldp, int first)                                             \
    {                                                                                              \
        const uint32_t *x = xv, *dy = dyv;                                                         \
        __m512 acc[CR][NV];                                                                        \
        _Pragma("GCC unroll 16") for (int r = 0; r < CR; r++)                                      \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();  \
        for (int64_t y = 0; y < oh; y++) {                                                         \
            const uint32_t *xp = x + y * xrs, *dp = dy + y * dyrs;                                 \
            for (int64_t z = 0; z < np; z++) {                                                     \
                __m512bh dv[NV];                                                                   \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) dv[v] =                       \
                    (__m512bh)_mm512_loadu_si512(dp + v * 16);                                     \
                _Pragma("GCC unroll 16") for (int r = 0; r < CR; r++)                              \
                {                                                                                  \
                    const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)xp[r]);                   \
                    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] =               \
                        _mm512_dpbf16_ps(acc[r][v], xb, dv[v]);                                    \
                }                                                                                  \
                xp += 2 * SW * 16;                                                                 \
                dp += dps;                                                                         \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 16") for (int r = 0; r < CR; r++)                                      \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)                                   \
        {                                                                                          \
            float *o = p + r * ldp + v * 16;                                                       \
            _mm512_storeu_ps(o, first ? acc[r][v] : _mm512_add_ps(_mm512_loadu_ps(o), acc[r][v])); \
        }                                                                                          \
    }

BF16_FILT(1, 1, 16)
BF16_FILT(1, 2, 8)
BF16_FILT(1, 3, 4)
BF16_FILT(1, 4, 4)
BF16_FILT(2, 1, 16)
BF16_FILT(2, 2, 8)
BF16_FILT(2, 3, 4)
BF16_FILT(2, 4, 4)

/* See conv_direct_internal.h: the x operand of the pair kernels, whose
 * pair (2z, 2z+1) of a row reads columns 2z*sw + kw and (2z+1)*sw + kw. */
MP_TARGET_AVX512 void mp_conv_pair_columns(const conv_spec *s, const uint16_t *buf, int64_t hp,
                                           int64_t wp, uint32_t *out)
{
    const int64_t nb = cdiv(s->c, 16), wb = wp + s->sw;
    const bool skip = s->sh > s->kh || s->sw > s->kw;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t r = 0; r < hp; r++) {
            if (skip && r % s->sh >= s->kh) continue;
            const uint16_t *src = buf + (b * hp + r) * wb * 16;
            uint32_t *dst = out + (b * hp + r) * wp * 16;
            for (int64_t q = 0; q < wp; q++) {
                if (skip && q % s->sw >= s->kw) continue;
                const __m512i lo =
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(src + q * 16)));
                const __m512i hi = _mm512_cvtepu16_epi32(
                    _mm256_loadu_si256((const void *)(src + (q + s->sw) * 16)));
                _mm512_storeu_si512(dst + q * 16, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
        }
}

/* See conv_direct_internal.h. */
MP_TARGET_AVX512 void mp_conv_pair_pixels(const uint16_t *dy, int64_t oh, int64_t ow, int64_t o,
                                          uint32_t *out)
{
    const int64_t np = cdiv(ow, 2);
    for (int64_t y = 0; y < oh; y++)
        for (int64_t z = 0; z < np; z++)
            for (int64_t j = 0; j < o; j += 16) {
                const uint16_t *a = dy + ((y * ow + 2 * z) * o + j);
                const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)a));
                const __m512i hi =
                    2 * z + 1 < ow
                        ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(a + o)))
                        : _mm512_setzero_si512();
                _mm512_storeu_si512(out + ((y * np + z) * o + j),
                                    _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
}

const conv_family mp_conv_avx512bf16 = {
    .name = "avx512bf16",
    .bf16 = true,
    .nvmax = 4,
    .mr_max = {MR1, MR2, MR3, MR4},
    .fwd = CONV_FWD_TABLE_INIT(bfwd_),
    /* images of fewer than 16 channels take the float32 family's filter */
    .filt = {{{bfilt_1_1, bfilt_1_2, bfilt_1_3, bfilt_1_4}, {NULL, NULL, NULL, NULL}},
             {{bfilt_2_1, bfilt_2_2, bfilt_2_3, bfilt_2_4}, {NULL, NULL, NULL, NULL}}},
    .filt_cr = {16, 8, 4, 4},
    .pad = mp_conv_pad_bf16,
    .epilogue = mp_gemm_epilogue_avx512,
};

#endif
