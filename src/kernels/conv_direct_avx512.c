/* conv_direct_avx512.c - the direct convolution's float32 kernels on
 * AVX-512 (the family mp_conv_avx512; drivers in conv_direct.c and
 * conv_direct_filter.c): the padding into 16-channel blocks (also in
 * bfloat16, for the vdpbf16ps family), the forward microkernels and the
 * filter gradient's.
 *   forward  a tile of MR consecutive output pixels of a row (the GEMM's M)
 *            times NV*16 output channels (N) in MR*NV zmm accumulators; per
 *            input channel one row of the packed weights [tap][16][NV*16]
 *            (NV loads) and one broadcast of each pixel's input (a memory
 *            operand of the FMA). No patch is gathered.
 *   filter   per kernel tap, CR input channels x NV*16 output channels,
 *            summed over one image's output pixels in registers. */
#include <string.h>

#include "core/avx512_lanes.h"
#include "kernels/conv_direct_internal.h"
#include "kernels/gemm_avx512_common.h"

#if MP_X86

/* The float32 and bfloat16 padding (see conv_pad_fn). Whole blocks of 16
 * channels load plainly, only a short block (fewer than 16 channels: the
 * image's) under a mask (avx512_lanes.h): masked loads of every block cost
 * the ResNet-20 step at batch 128 (Zen 5, 2 threads, alternating in one
 * process) 3-12%: float32 101.7 -> 97.4 and 110.8 -> 102.9 ms,
 * mixed_bfloat16 71.1 -> 62.4, 77.8 -> 75.4 and 81.9 -> 78.5 ms. */
MP_TARGET_AVX512 static void pad_image(const conv_spec *s, int64_t n, int64_t hp, int64_t wp,
                                       float *row, void *buf, bool bf16)
{
    const int64_t nb = cdiv(s->c, 16), es = bf16 ? 2 : 4, plane = hp * wp * 16 * es;
    const __mmask16 m = mp_lanes16(s->c);
    const size_t xs = mp_dtype_size(s->xt);
    /* a stride above the kernel's size skips rows and columns no tap reads
     * (1x1 stride 2: 3 of every 4 pixels); they are left as they are */
    const bool skip = s->sh > s->kh || s->sw > s->kw;
    for (int64_t r = 0; r < hp; r++) {
        const int64_t ih = r - s->pt;
        if (skip && r % s->sh >= s->kh) continue;
        if (ih < 0 || ih >= s->h) {
            for (int64_t b = 0; b < nb; b++)
                memset((char *)buf + b * plane + r * wp * 16 * es, 0, (size_t)(wp * 16 * es));
            continue;
        }
        const char *src = (const char *)s->x + (size_t)(((n * s->h + ih) * s->w) * s->c) * xs;
        const float *f = (const float *)src;
        if (!bf16 && s->xt != MP_F32) {
            mp_convert(row, MP_F32, src, s->xt, (size_t)(s->w * s->c));
            f = row;
        }
        for (int64_t b = 0; b < nb; b++) {
            char *o = (char *)buf + b * plane + r * wp * 16 * es;
            for (int64_t q = 0; q < wp; q++) {
                const int64_t iw = q - s->pl;
                if (skip && q % s->sw >= s->kw) continue;
                const bool out = iw < 0 || iw >= s->w;
                if (bf16) {
                    __m256i v = out ? _mm256_setzero_si256()
                                    : mp_load16_u16((const uint16_t *)src + iw * s->c + b * 16, m);
                    _mm256_store_si256((__m256i *)(o + q * 32), v);
                } else {
                    __m512 v = out ? _mm512_setzero_ps() : mp_load16(f + iw * s->c + b * 16, m);
                    _mm512_store_ps((float *)(o + q * 64), v);
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- forward */

/* The float32 family (see conv_fwd_fn): one input channel a step, its
 * value broadcast. */
#define FWD_KERNEL(SW, NV, MR)                                                                     \
    MP_TARGET_AVX512 static void fwd_##SW##_##NV##_##MR(int64_t ntap, int steps,                   \
                                                        const int64_t *xoff, const void *xv,       \
                                                        const void *wv, float *t, int64_t ldt)     \
    {                                                                                              \
        const float *x = xv, *w = wv;                                                              \
        __m512 acc[MR][NV];                                                                        \
        _Pragma("GCC unroll 28") for (int i = 0; i < MR; i++)                                      \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();  \
        for (int64_t tap = 0; tap < ntap; tap++) {                                                 \
            const float *xp = x + xoff[tap];                                                       \
            for (int c = 0; c < steps; c++) {                                                      \
                __m512 wp[NV];                                                                     \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) wp[v] =                       \
                    _mm512_load_ps(w + v * 16);                                                    \
                _Pragma("GCC unroll 28") for (int i = 0; i < MR; i++)                              \
                {                                                                                  \
                    const __m512 xb = _mm512_set1_ps(xp[i * SW * 16]);                             \
                    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[i][v] =               \
                        _mm512_fmadd_ps(xb, wp[v], acc[i][v]);                                     \
                }                                                                                  \
                xp++;                                                                              \
                w += NV * 16;                                                                      \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 28") for (int i = 0; i < MR; i++)                                      \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)                                   \
                _mm512_storeu_ps(t + i * ldt + v * 16, acc[i][v]);                                 \
    }

CONV_ALL_KERNELS(FWD_KERNEL, 1)
CONV_ALL_KERNELS(FWD_KERNEL, 2)

#define fwd_ENTRY(S, N, M) fwd_##S##_##N##_##M,
CONV_FWD_TABLES(fwd_)

static void pad_f32(const conv_spec *s, int64_t n, int64_t hp, int64_t wp, float *row, void *buf)
{
    pad_image(s, n, hp, wp, row, buf, false);
}

void mp_conv_pad_bf16(const conv_spec *s, int64_t n, int64_t hp, int64_t wp, float *row, void *buf)
{
    pad_image(s, n, hp, wp, row, buf, true);
}

/* ---------------------------------------------------------------- filter */

/* p[r][j] (row stride ldp; first: =, else +=) gets sum over the oh x ow
 * output pixels of x[pixel][r] * dy[pixel][j], r < CR, j < NV*16: x of
 * output pixel (y, z) at x + y*xrs + z*SW*16, dy at dy + y*dyrs + z*dps. */
#define FILT_KERNEL(SW, NV, CR)                                                                    \
    MP_TARGET_AVX512 static void filt_##SW##_##NV##_##CR(                                          \
        int64_t oh, int64_t ow, const void *xv, int64_t xrs, const void *dyv, int64_t dyrs,        \
        int64_t dps, float *p, int64_t ldp, int first)                                             \
    {                                                                                              \
        const float *x = xv, *dy = dyv;                                                            \
        __m512 acc[CR][NV];                                                                        \
        _Pragma("GCC unroll 16") for (int r = 0; r < CR; r++)                                      \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();  \
        for (int64_t y = 0; y < oh; y++) {                                                         \
            const float *xp = x + y * xrs, *dp = dy + y * dyrs;                                    \
            for (int64_t z = 0; z < ow; z++) {                                                     \
                __m512 dv[NV];                                                                     \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) dv[v] =                       \
                    _mm512_loadu_ps(dp + v * 16);                                                  \
                _Pragma("GCC unroll 16") for (int r = 0; r < CR; r++)                              \
                {                                                                                  \
                    const __m512 xb = _mm512_set1_ps(xp[r]);                                       \
                    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] =               \
                        _mm512_fmadd_ps(xb, dv[v], acc[r][v]);                                     \
                }                                                                                  \
                xp += SW * 16;                                                                     \
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

FILT_KERNEL(1, 1, 16)
FILT_KERNEL(1, 2, 8)
FILT_KERNEL(1, 3, 4)
FILT_KERNEL(1, 4, 4)
FILT_KERNEL(2, 1, 16)
FILT_KERNEL(2, 2, 8)
FILT_KERNEL(2, 3, 4)
FILT_KERNEL(2, 4, 4)
/* One input channel (images of fewer than 16 channels): as FILT_KERNEL with
 * CR = 1, the pixels of a row dealt to 4 partial sums (4 independent FMA
 * chains instead of 1), added as (s0 + s1) + (s2 + s3) at the end. */
#define FILT1_KERNEL(SW, NV)                                                                       \
    MP_TARGET_AVX512 static void filt_##SW##_##NV##_1(                                             \
        int64_t oh, int64_t ow, const void *xv, int64_t xrs, const void *dyv, int64_t dyrs,        \
        int64_t dps, float *p, int64_t ldp, int first)                                             \
    {                                                                                              \
        const float *x = xv, *dy = dyv;                                                            \
        (void)ldp;                                                                                 \
        __m512 acc[4][NV];                                                                         \
        _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)                                        \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[u][v] = _mm512_setzero_ps();  \
        for (int64_t y = 0; y < oh; y++) {                                                         \
            const float *xp = x + y * xrs, *dp = dy + y * dyrs;                                    \
            int64_t z = 0;                                                                         \
            for (; z + 4 <= ow; z += 4) _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)        \
                {                                                                                  \
                    const __m512 xb = _mm512_set1_ps(xp[(z + u) * SW * 16]);                       \
                    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[u][v] =               \
                        _mm512_fmadd_ps(xb, _mm512_loadu_ps(dp + (z + u) * dps + v * 16),          \
                                        acc[u][v]);                                                \
                }                                                                                  \
            for (; z < ow; z++) {                                                                  \
                const __m512 xb = _mm512_set1_ps(xp[z * SW * 16]);                                 \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[0][v] =                   \
                    _mm512_fmadd_ps(xb, _mm512_loadu_ps(dp + z * dps + v * 16), acc[0][v]);        \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)                                       \
        {                                                                                          \
            const __m512 t = _mm512_add_ps(_mm512_add_ps(acc[0][v], acc[1][v]),                    \
                                           _mm512_add_ps(acc[2][v], acc[3][v]));                   \
            float *o = p + v * 16;                                                                 \
            _mm512_storeu_ps(o, first ? t : _mm512_add_ps(_mm512_loadu_ps(o), t));                 \
        }                                                                                          \
    }
FILT1_KERNEL(1, 1)
FILT1_KERNEL(1, 2)
FILT1_KERNEL(1, 3)
FILT1_KERNEL(1, 4)
FILT1_KERNEL(2, 1)
FILT1_KERNEL(2, 2)
FILT1_KERNEL(2, 3)
FILT1_KERNEL(2, 4)

const conv_family mp_conv_avx512 = {
    .name = "avx512",
    .bf16 = false,
    .nvmax = 4,
    .mr_max = {MR1, MR2, MR3, MR4},
    .fwd = CONV_FWD_TABLE_INIT(fwd_),
    .filt = {{{filt_1_1_16, filt_1_2_8, filt_1_3_4, filt_1_4_4},
              {filt_1_1_1, filt_1_2_1, filt_1_3_1, filt_1_4_1}},
             {{filt_2_1_16, filt_2_2_8, filt_2_3_4, filt_2_4_4},
              {filt_2_1_1, filt_2_2_1, filt_2_3_1, filt_2_4_1}}},
    .filt_cr = {16, 8, 4, 4},
    .pad = pad_f32,
    .epilogue = mp_gemm_epilogue_avx512,
};

#endif
