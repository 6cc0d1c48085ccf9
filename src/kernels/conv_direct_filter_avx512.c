/* conv_direct_filter_avx512.c - the direct convolution's filter gradient
 * on AVX-512, float32 FMA: per kernel tap, CR input channels x NV*16 output
 * channels summed over one image's output pixels in registers, read from
 * the padded image of conv_direct_avx512.c and the output gradient widened
 * to float32. An image's sums are added to the partial sum of a fixed chunk
 * of images, and the chunks are added in order at the end, so every
 * element is summed in an order fixed by the shape whatever the thread
 * count (threads take whole chunks). */
#include "kernels/conv_direct_avx512.h"

#if MP_X86

/* p[r][j] (row stride ldp; first: =, else +=) gets sum over the oh x ow
 * output pixels of x[pixel][r] * dy[pixel][j], r < CR, j < NV*16: x of
 * output pixel (y, z) at x + y*xrs + z*SW*16, dy at dy + y*dyrs + z*dps. */
#define FILT_KERNEL(SW, NV, CR)                                                                    \
    MP_TARGET_AVX512 static void filt_##SW##_##NV##_##CR(                                          \
        int64_t oh, int64_t ow, const float *x, int64_t xrs, const float *dy, int64_t dyrs,        \
        int64_t dps, float *p, int64_t ldp, int first)                                             \
    {                                                                                              \
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

typedef void (*filt_fn)(int64_t oh, int64_t ow, const float *x, int64_t xrs, const float *dy,
                        int64_t dyrs, int64_t dps, float *p, int64_t ldp, int first);

/* Input channels per call, so that CR*NV accumulators stay in registers
 * with enough independent chains. */
const int mp_conv_filt_cr[4] = {16, 8, 4, 4};
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
        int64_t oh, int64_t ow, const float *x, int64_t xrs, const float *dy, int64_t dyrs,        \
        int64_t dps, float *p, int64_t ldp, int first)                                             \
    {                                                                                              \
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
/* [stride - 1][channels below 16: one at a time][nv - 1] */
static const filt_fn filt_table[2][2][4] = {{{filt_1_1_16, filt_1_2_8, filt_1_3_4, filt_1_4_4},
                                             {filt_1_1_1, filt_1_2_1, filt_1_3_1, filt_1_4_1}},
                                            {{filt_2_1_16, filt_2_2_8, filt_2_3_4, filt_2_4_4},
                                             {filt_2_1_1, filt_2_2_1, filt_2_3_1, filt_2_4_1}}};

/* Columns q and q + sw of the bfloat16 padded image buf (width wp + sw) as
 * one 32-bit lane, out[c/16][hp][wp][16]: the x operand of the pair
 * kernels, whose pair (2z, 2z+1) of a row reads columns 2z*sw + kw and
 * (2z+1)*sw + kw. Rows and columns no tap reads are skipped as in the
 * padding. */
MP_TARGET_AVX512 static void pair_columns(const conv_spec *s, const uint16_t *buf, int64_t hp,
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

/* dy [oh][ow][o] (bfloat16) as pairs of a row's consecutive pixels,
 * out[oh][ceil(ow/2)][o] (32-bit lanes; the partner of an odd row's last
 * pixel is zero). o is a multiple of 16. */
MP_TARGET_AVX512 static void pair_pixels(const uint16_t *dy, int64_t oh, int64_t ow, int64_t o,
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

/* Images per partial sum: a fixed count of chunks from the shape alone, so
 * the summation order does not depend on the thread count; capped so the
 * partial sums stay under 8M floats. */
static int64_t filter_chunks(int64_t n, int64_t nw)
{
    int64_t c = min64(n, 16), cap = ((int64_t)8 << 20) / nw;
    return c < cap ? c : (cap < 1 ? 1 : cap);
}

mp_status mp_conv_direct_filter(const mp_conv_geom *g, const void *x, mp_dtype xt, const void *dy,
                                mp_dtype dyt, float *dw, bool accumulate)
{
    const conv_spec s = {x,     xt,    g->n,  g->h,  g->w,  g->c,  g->oh, g->ow, g->o, g->kh, g->kw,
                         g->sh, g->sw, g->pt, g->pl, g->oh, g->ow, 0,     0,     1,    1};
    const int64_t nw = g->kh * g->kw * g->c * g->o, nch = filter_chunks(g->n, nw);
    const int64_t hp = (g->oh - 1) * g->sh + g->kh, wp = (g->ow - 1) * g->sw + g->kw;
    const int64_t plane = hp * wp * 16, npix = g->oh * g->ow;
    float *part = mp_scratch(SLOT_PART, (size_t)(nch * nw) * sizeof(float));
    if (!part) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for the filter's partial sums");
    const double flops = 2.0 * (double)(g->n * npix) * (double)nw;
    int nt = flops < 4e6 ? 1 : mp_num_threads();
    if (nt > nch) nt = (int)nch;
    const filt_fn *table = filt_table[g->sw - 1][g->c < 16];
    /* bfloat16 x and dy on vdpbf16ps: pairs of output pixels (see
     * pair_columns, pair_pixels), from an image padded sw columns wider */
    const bool bf16 = g->c % 16 == 0 && mp_conv_bf16_family(xt, dyt);
    const int64_t np = cdiv(g->ow, 2), nb = cdiv(g->c, 16);
    const size_t image =
        bf16 ? (size_t)(nb * hp * (wp + g->sw) * 16) * 2 : (size_t)(nb * plane) * sizeof(float);
    const size_t rows = bf16 ? (size_t)(nb * plane + g->oh * np * g->o) * 4
                             : (size_t)(g->w * g->c + npix * g->o) * sizeof(float);
    const size_t dyes = mp_dtype_size(dyt);
    /* rows per band: its input rows and output gradient in about 24 KiB */
    const int64_t band_bytes = (g->sh * wp * cdiv(g->c, 16) * 16 + g->ow * g->o) * 4;
    const int64_t band = band_bytes > 0 ? (int64_t)1 + (24 << 10) / band_bytes : 1;
    bool ok = true;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(&& : ok)
    for (int64_t j = 0; j < nch; j++) {
        void *buf = mp_scratch(SLOT_IMAGE, image);
        float *row = mp_scratch(SLOT_ROW, rows);
        if (!buf || !row) {
            ok = false;
            continue;
        }
        float *p = part + j * nw;
        const int64_t n0 = g->n * j / nch, n1 = g->n * (j + 1) / nch;
        uint32_t *xpairs = (uint32_t *)row, *dypairs = xpairs + nb * plane;
        for (int64_t n = n0; n < n1; n++) {
            const char *dyn = (const char *)dy + (size_t)(n * npix * g->o) * dyes;
            const float *dyf = (const float *)dyn;
            if (bf16) {
                mp_conv_pad_image(&s, n, hp, wp + g->sw, NULL, buf, true);
                pair_columns(&s, buf, hp, wp, xpairs);
                pair_pixels((const uint16_t *)dyn, g->oh, g->ow, g->o, dypairs);
            } else {
                mp_conv_pad_image(&s, n, hp, wp, row, buf, false);
            }
            if (!bf16 && dyt != MP_F32) {
                float *t = row + g->w * g->c;
                mp_convert(t, MP_F32, dyn, dyt, (size_t)(npix * g->o));
                dyf = t;
            }
            /* a band of output rows at a time through every tap, so that its
             * input rows and output gradient stay in L1 */
            for (int64_t y0 = 0; y0 < g->oh; y0 += band) {
                const int64_t nr = min64(band, g->oh - y0);
                const int first = n == n0 && y0 == 0;
                for (int64_t q = 0; q * 64 < g->o; q++) {
                    const int nv = chunk_nv(g->o, q), cr = g->c < 16 ? 1 : mp_conv_filt_cr[nv - 1];
                    for (int64_t kh = 0; kh < g->kh; kh++)
                        for (int64_t kw = 0; kw < g->kw; kw++)
                            for (int64_t c = 0; c < g->c; c += cr) {
                                const int64_t xo =
                                    (c / 16) * plane + ((y0 * g->sh + kh) * wp + kw) * 16 + c % 16;
                                float *pp = p + ((kh * g->kw + kw) * g->c + c) * g->o + 64 * q;
                                if (bf16) {
                                    mp_conv_filt_bf16[g->sw - 1][nv - 1](
                                        nr, np, xpairs + xo, g->sh * wp * 16,
                                        dypairs + y0 * np * g->o + 64 * q, np * g->o, g->o, pp,
                                        g->o, first);
                                    continue;
                                }
                                const float *xb = (const float *)buf + xo;
                                table[nv - 1](nr, g->ow, xb, g->sh * wp * 16,
                                              dyf + y0 * g->ow * g->o + 64 * q, g->ow * g->o, g->o,
                                              pp, g->o, first);
                            }
                }
            }
        }
    }
    if (!ok) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for a padded image");
    /* the chunks in order, then the epilogue's alpha*sum (+ dw) */
    const float alpha = alpha_of(g);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < nw; i++) {
        float v = part[i];
        for (int64_t j = 1; j < nch; j++) v += part[j * nw + i];
        v = alpha * v;
        dw[i] = accumulate ? v + dw[i] : v;
    }
    return MP_OK;
}

#else

mp_status mp_conv_direct_filter(const mp_conv_geom *g, const void *x, mp_dtype xt, const void *dy,
                                mp_dtype dyt, float *dw, bool accumulate)
{
    (void)g, (void)x, (void)xt, (void)dy, (void)dyt, (void)dw, (void)accumulate;
    return mp_set_error(MP_ERR_UNSUPPORTED, "conv: no direct kernels on this CPU");
}

#endif
