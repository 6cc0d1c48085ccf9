/* conv_direct_avx2.c - the direct convolution's float32 kernels on AVX2
 * (the family mp_conv_avx2; drivers in conv_direct.c and
 * conv_direct_filter.c), for CPUs without AVX-512 (AMD Zen 2/3, Intel
 * client cores). The layout is the AVX-512 family's: 16-channel blocks, a
 * block of a pixel as two ymm registers; with 16 registers the tiles are
 * smaller.
 *   forward  MR <= 6 consecutive output pixels of a row x 16 output channels
 *            in 12 accumulators (the AVX2 GEMM's 6x16 shape); per input
 *            channel two weight loads and one broadcast per pixel.
 *   filter   4 input channels x 16 output channels in 8 accumulators,
 *            summed over the pixels of a band of rows; an image's single
 *            channel (fewer than 16) with its pixels dealt to 4 partial
 *            sums, as the AVX-512 kernel does. */
#include <string.h>

#include "kernels/conv_direct_internal.h"
#include "kernels/gemm_simd.h"

#if MP_X86

enum { AMR = 6, ACR = 4 };

/* See conv_pad_fn: float32, inputs widened exactly. */
MP_TARGET_AVX2 static void pad_f32(const conv_spec *s, int64_t n, int64_t hp, int64_t wp,
                                   float *row, void *buf)
{
    const int64_t nb = cdiv(s->c, 16), plane = hp * wp * 16;
    const size_t xs = mp_dtype_size(s->xt);
    const bool skip = s->sh > s->kh || s->sw > s->kw;
    float *out = buf;
    for (int64_t r = 0; r < hp; r++) {
        const int64_t ih = r - s->pt;
        if (skip && r % s->sh >= s->kh) continue;
        if (ih < 0 || ih >= s->h) {
            for (int64_t b = 0; b < nb; b++)
                memset(out + b * plane + r * wp * 16, 0, (size_t)(wp * 16) * sizeof(float));
            continue;
        }
        const char *src = (const char *)s->x + (size_t)(((n * s->h + ih) * s->w) * s->c) * xs;
        /* float16 and bfloat16 rows of whole channel blocks widen as they
         * are copied; other rows are converted first */
        mp_dtype et = s->xt;
        size_t es = xs;
        if (et != MP_F32 && (s->c < 16 || (et != MP_BF16 && et != MP_F16))) {
            mp_convert(row, MP_F32, src, s->xt, (size_t)(s->w * s->c));
            src = (const char *)row;
            et = MP_F32;
            es = sizeof(float);
        }
        const float *f = (const float *)src;
        for (int64_t b = 0; b < nb; b++) {
            float *o = out + b * plane + r * wp * 16;
            for (int64_t q = 0; q < wp; q++) {
                const int64_t iw = q - s->pl;
                if (skip && q % s->sw >= s->kw) continue;
                if (iw < 0 || iw >= s->w) {
                    _mm256_storeu_ps(o + q * 16, _mm256_setzero_ps());
                    _mm256_storeu_ps(o + q * 16 + 8, _mm256_setzero_ps());
                } else if (s->c >= 16) {
                    const char *p = src + (size_t)(iw * s->c + b * 16) * es;
                    _mm256_storeu_ps(o + q * 16, mp_widen8(p, et));
                    _mm256_storeu_ps(o + q * 16 + 8, mp_widen8(p + 8 * es, et));
                } else { /* an image's few channels, zero after them */
                    float t[16] = {0};
                    memcpy(t, f + iw * s->c, (size_t)s->c * sizeof(float));
                    _mm256_storeu_ps(o + q * 16, _mm256_loadu_ps(t));
                    _mm256_storeu_ps(o + q * 16 + 8, _mm256_loadu_ps(t + 8));
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- forward */

/* See conv_fwd_fn (NV = 1: 16 output channels, two ymm). */
#define FWD2_KERNEL(SW, NV, MR)                                                                    \
    MP_TARGET_AVX2 static void afwd_##SW##_##NV##_##MR(int64_t ntap, int steps,                    \
                                                       const int64_t *xoff, const void *xv,        \
                                                       const void *wv, float *t, int64_t ldt)      \
    {                                                                                              \
        const float *x = xv, *w = wv;                                                              \
        __m256 acc[MR][2];                                                                         \
        _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] =               \
            _mm256_setzero_ps();                                                                   \
        for (int64_t tap = 0; tap < ntap; tap++) {                                                 \
            const float *xp = x + xoff[tap];                                                       \
            for (int c = 0; c < steps; c++) {                                                      \
                const __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);                 \
                _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++)                               \
                {                                                                                  \
                    const __m256 xb = _mm256_broadcast_ss(xp + i * SW * 16);                       \
                    acc[i][0] = _mm256_fmadd_ps(xb, w0, acc[i][0]);                                \
                    acc[i][1] = _mm256_fmadd_ps(xb, w1, acc[i][1]);                                \
                }                                                                                  \
                xp++;                                                                              \
                w += 16;                                                                           \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 6") for (int i = 0; i < MR; i++)                                       \
        {                                                                                          \
            _mm256_storeu_ps(t + i * ldt, acc[i][0]);                                              \
            _mm256_storeu_ps(t + i * ldt + 8, acc[i][1]);                                          \
        }                                                                                          \
    }

MRS_6(FWD2_KERNEL, 1, 1)
MRS_6(FWD2_KERNEL, 2, 1)

#define afwd_ENTRY(S, N, M) afwd_##S##_##N##_##M,
static const conv_fwd_fn afwd_s1[AMR] = {MRS_6(afwd_ENTRY, 1, 1)};
static const conv_fwd_fn afwd_s2[AMR] = {MRS_6(afwd_ENTRY, 2, 1)};

/* ---------------------------------------------------------------- filter */

/* See conv_filt_fn: ACR input channels x 16 output channels. */
#define FILT2_KERNEL(SW)                                                                           \
    MP_TARGET_AVX2 static void afilt_##SW(int64_t oh, int64_t ow, const void *xv, int64_t xrs,     \
                                          const void *dyv, int64_t dyrs, int64_t dps, float *p,    \
                                          int64_t ldp, int first)                                  \
    {                                                                                              \
        const float *x = xv, *dy = dyv;                                                            \
        __m256 acc[ACR][2];                                                                        \
        _Pragma("GCC unroll 4") for (int r = 0; r < ACR; r++) acc[r][0] = acc[r][1] =              \
            _mm256_setzero_ps();                                                                   \
        for (int64_t y = 0; y < oh; y++) {                                                         \
            const float *xp = x + y * xrs, *dp = dy + y * dyrs;                                    \
            for (int64_t z = 0; z < ow; z++) {                                                     \
                const __m256 d0 = _mm256_loadu_ps(dp), d1 = _mm256_loadu_ps(dp + 8);               \
                _Pragma("GCC unroll 4") for (int r = 0; r < ACR; r++)                              \
                {                                                                                  \
                    const __m256 xb = _mm256_broadcast_ss(xp + r);                                 \
                    acc[r][0] = _mm256_fmadd_ps(xb, d0, acc[r][0]);                                \
                    acc[r][1] = _mm256_fmadd_ps(xb, d1, acc[r][1]);                                \
                }                                                                                  \
                xp += SW * 16;                                                                     \
                dp += dps;                                                                         \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int r = 0; r < ACR; r++) for (int h = 0; h < 2; h++)          \
        {                                                                                          \
            float *o = p + r * ldp + h * 8;                                                        \
            _mm256_storeu_ps(o, first ? acc[r][h] : _mm256_add_ps(_mm256_loadu_ps(o), acc[r][h])); \
        }                                                                                          \
    }
FILT2_KERNEL(1)
FILT2_KERNEL(2)

/* One input channel (images of fewer than 16 channels): the pixels of a
 * row dealt to 4 partial sums, added as (s0 + s1) + (s2 + s3) at the end. */
#define FILT2_ONE(SW)                                                                              \
    MP_TARGET_AVX2 static void afilt1_##SW(int64_t oh, int64_t ow, const void *xv, int64_t xrs,    \
                                           const void *dyv, int64_t dyrs, int64_t dps, float *p,   \
                                           int64_t ldp, int first)                                 \
    {                                                                                              \
        (void)ldp;                                                                                 \
        const float *x = xv, *dy = dyv;                                                            \
        __m256 acc[4][2];                                                                          \
        _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) acc[u][0] = acc[u][1] =                \
            _mm256_setzero_ps();                                                                   \
        for (int64_t y = 0; y < oh; y++) {                                                         \
            const float *xp = x + y * xrs, *dp = dy + y * dyrs;                                    \
            int64_t z = 0;                                                                         \
            for (; z + 4 <= ow; z += 4) _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)        \
                {                                                                                  \
                    const __m256 xb = _mm256_broadcast_ss(xp + (z + u) * SW * 16);                 \
                    const float *d = dp + (z + u) * dps;                                           \
                    acc[u][0] = _mm256_fmadd_ps(xb, _mm256_loadu_ps(d), acc[u][0]);                \
                    acc[u][1] = _mm256_fmadd_ps(xb, _mm256_loadu_ps(d + 8), acc[u][1]);            \
                }                                                                                  \
            for (; z < ow; z++) {                                                                  \
                const __m256 xb = _mm256_broadcast_ss(xp + z * SW * 16);                           \
                const float *d = dp + z * dps;                                                     \
                acc[0][0] = _mm256_fmadd_ps(xb, _mm256_loadu_ps(d), acc[0][0]);                    \
                acc[0][1] = _mm256_fmadd_ps(xb, _mm256_loadu_ps(d + 8), acc[0][1]);                \
            }                                                                                      \
        }                                                                                          \
        for (int h = 0; h < 2; h++) {                                                              \
            const __m256 t = _mm256_add_ps(_mm256_add_ps(acc[0][h], acc[1][h]),                    \
                                           _mm256_add_ps(acc[2][h], acc[3][h]));                   \
            float *o = p + h * 8;                                                                  \
            _mm256_storeu_ps(o, first ? t : _mm256_add_ps(_mm256_loadu_ps(o), t));                 \
        }                                                                                          \
    }
FILT2_ONE(1)
FILT2_ONE(2)

const conv_family mp_conv_avx2 = {
    .name = "avx2",
    .bf16 = false,
    .nvmax = 1,
    .mr_max = {AMR, 0, 0, 0},
    .fwd = {{afwd_s1, NULL, NULL, NULL}, {afwd_s2, NULL, NULL, NULL}},
    .filt = {{{afilt_1, NULL, NULL, NULL}, {afilt1_1, NULL, NULL, NULL}},
             {{afilt_2, NULL, NULL, NULL}, {afilt1_2, NULL, NULL, NULL}}},
    .filt_cr = {ACR, 0, 0, 0},
    .pad = pad_f32,
    .epilogue = mp_gemm_epilogue_avx2,
};

#endif
