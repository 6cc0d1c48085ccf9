/* conv_direct_filter.c - the direct convolution's filter gradient, written
 * once over a family of microkernels (conv_direct_internal.h): per kernel
 * tap, CR input channels x NV*16 output channels summed over a band of one
 * image's output pixels in registers, read from the padded image (in
 * float32) and the output gradient widened to float32, or, in the
 * vdpbf16ps family, from both in bfloat16 as pairs of a row's consecutive
 * output pixels (see mp_conv_pair_columns). An image's sums are added to
 * the partial sum of a fixed chunk of images, and the chunks are added in
 * order at the end, so every element is summed in an order fixed by the
 * shape whatever the thread count (threads take whole chunks). */
#include "kernels/conv_direct_internal.h"

#if MP_X86

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
    int nt = flops < MP_GEMM_FORK_FLOPS ? 1 : mp_num_threads();
    if (nt > nch) nt = (int)nch;
    /* bfloat16 x and dy on vdpbf16ps: pairs of output pixels, from an
     * image padded sw columns wider (the pairs' partners) */
    const conv_family *f = mp_conv_family(xt, dyt, g->c % 16 == 0);
    const bool bf16 = f->bf16;
    const conv_filt_fn *table = f->filt[g->sw - 1][g->c < 16];
    const int64_t cw = 16 * f->nvmax; /* output channels of a whole chunk */
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
                f->pad(&s, n, hp, wp + g->sw, NULL, buf);
                mp_conv_pair_columns(&s, buf, hp, wp, xpairs);
                mp_conv_pair_pixels((const uint16_t *)dyn, g->oh, g->ow, g->o, dypairs);
            } else {
                f->pad(&s, n, hp, wp, row, buf);
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
                for (int64_t q = 0; q * cw < g->o; q++) {
                    const int nv = chunk_nv(f, g->o, q), cr = g->c < 16 ? 1 : f->filt_cr[nv - 1];
                    for (int64_t kh = 0; kh < g->kh; kh++)
                        for (int64_t kw = 0; kw < g->kw; kw++)
                            for (int64_t c = 0; c < g->c; c += cr) {
                                const int64_t xo =
                                    (c / 16) * plane + ((y0 * g->sh + kh) * wp + kw) * 16 + c % 16;
                                float *pp = p + ((kh * g->kw + kw) * g->c + c) * g->o + cw * q;
                                if (bf16)
                                    table[nv - 1](nr, np, xpairs + xo, g->sh * wp * 16,
                                                  dypairs + y0 * np * g->o + cw * q, np * g->o,
                                                  g->o, pp, g->o, first);
                                else
                                    table[nv - 1](nr, g->ow, (const float *)buf + xo,
                                                  g->sh * wp * 16, dyf + y0 * g->ow * g->o + cw * q,
                                                  g->ow * g->o, g->o, pp, g->o, first);
                            }
                }
            }
        }
    }
    if (!ok) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for a padded image");
    /* the chunks in order, then the epilogue's alpha*sum (+ dw) */
    const float alpha = mp_conv_alpha(g);
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
