/* conv_direct.c - direct convolution for channel counts that are multiples
 * of 16 (the body of a ResNet): the forward and the data gradient, written
 * once over a family of microkernels (conv_direct_internal.h); the filter
 * gradient is conv_direct_filter.c.
 *
 * Each image is first copied, zero-padded, into channel blocks of 16:
 * buf[cb][rows][cols][16], in float32 (widened exactly) or bfloat16. In
 * that layout the 16 channels of block cb at a pixel are consecutive and
 * pixels a fixed stride apart, so a microkernel reads its operands at
 * constant offsets from one pointer:
 *   forward  a tile of MR consecutive output pixels of a row (the GEMM's M)
 *            times NV*16 output channels (N); per input channel (or pair)
 *            one row of the packed weights and one broadcast of each
 *            pixel's input. No patch is gathered.
 *   data     stride 1: the forward of dy with the kernel flipped and its two
 *            channel axes swapped (padding KH-1-pt); a strided convolution's
 *            data gradient runs as stride-1 phases.
 * bfloat16 input and weights take the vdpbf16ps family where the GEMM's
 * measured choice for bf16 x bf16 is vdpbf16ps (gemm_dispatch.c): the
 * image is then padded in bfloat16 and the weights packed in channel
 * pairs, [tap][16/2][NV*16][2]; other types are widened to float32 for the
 * FMA family of the active ISA (AVX-512 or AVX2).
 * Every output element is summed in one fixed order (taps, then channels)
 * that does not depend on the thread count: threads take whole images. */
#include <string.h>

#include "kernels/conv_direct_internal.h"

#if MP_X86

bool mp_conv_direct_ok(const mp_conv_geom *g)
{
    return mp_isa_active() >= MP_ISA_AVX2 && (g->c % 16 == 0 || g->c < 16) && g->o % 16 == 0 &&
           g->dh == 1 && g->dw == 1 && (g->sh == 1 || g->sh == 2) && (g->sw == 1 || g->sw == 2);
}

const conv_family *mp_conv_family(mp_dtype a, mp_dtype b, bool pairs)
{
    const mp_isa isa = mp_isa_active();
    if (pairs && a == MP_BF16 && b == MP_BF16 && isa >= MP_ISA_AVX512BF16 &&
        mp_gemm_impl_for(MP_BF16, MP_BF16) == &mp_gemm_avx512bf16_impl)
        return &mp_conv_avx512bf16;
    return isa >= MP_ISA_AVX512 ? &mp_conv_avx512 : &mp_conv_avx2;
}

/* The spec's kernel [kh][kw][c][o] as entries of the kernel w being
 * differentiated ([KH][kwo][o][c]): entry (i, j) is w's (r0 + (kh-1-i)*rs,
 * c0 + (kw-1-j)*cs), flipped, its channel axes swapped, every rs-th row and
 * cs-th column from (r0, c0) (a phase of a strided convolution). NULL:
 * the kernel is w itself. */
typedef struct {
    int64_t kwo, r0, c0, rs, cs;
} kernel_map;

/* Row tiling of chunk nv: tiles of mr pixels (the last may overrun ow). */
static void tiling(const conv_family *f, int64_t ow, int nv, int64_t *ntile, int64_t *mr)
{
    *ntile = cdiv(ow, f->mr_max[nv - 1]);
    *mr = cdiv(ow, *ntile);
}

/* Channels of a tap's block in the packed weights: min(c, 16), rounded up
 * to a pair in bfloat16 (the odd one's weights are zero). */
static int64_t block_channels(int64_t c, bool bf16)
{
    const int64_t cn = min64(c, 16);
    return bf16 ? cn + (cn & 1) : cn;
}

/* Packs w as the chunks' [tap][cp][nv*16] panels: element (tap = (kh, kw,
 * cb), c, j) is kernel entry [kh][kw][cb*16 + c][o0 + j] of the spec's
 * kernel, which is w itself, or, with km, w of the convolution being
 * differentiated (see kernel_map). wf: the kernel in float32 (bf16 false;
 * w itself when float32, else widened) or bfloat16 (bf16 true), packed in
 * channel pairs [tap][cp/2][nv*16][2] (cp: block_channels). */
static void pack_weights(const conv_family *f, const conv_spec *s, const void *wf,
                         const kernel_map *km, void *dst)
{
    const bool bf16 = f->bf16;
    const int64_t cw = 16 * f->nvmax; /* output channels of a whole chunk */
    const int64_t taps = s->kh * s->kw, C = s->c, O = s->o, nb = cdiv(C, 16);
    const int64_t cp = block_channels(C, bf16);
    for (int64_t q = 0; q * cw < O; q++) {
        const int nv = chunk_nv(f, O, q);
        const int64_t base = taps * nb * cp * cw * q;
        for (int64_t t = 0; t < taps; t++)
            for (int64_t b = 0; b < nb; b++)
                for (int64_t cc = 0; cc < cp; cc++)
                    for (int64_t j = 0; j < nv * 16; j++) {
                        const int64_t o = cw * q + j, c = b * 16 + cc;
                        int64_t src = -1;
                        if (c >= C) {
                            /* the zero partner of an odd channel count */
                        } else if (!km) {
                            src = (t * C + c) * O + o;
                        } else {
                            const int64_t r = km->r0 + (s->kh - 1 - t / s->kw) * km->rs;
                            const int64_t co = km->c0 + (s->kw - 1 - t % s->kw) * km->cs;
                            src = ((r * km->kwo + co) * O + o) * C + c;
                        }
                        const int64_t step = (t * nb + b) * cp + cc;
                        if (bf16)
                            ((uint16_t *)dst)[base + ((step / 2) * nv * 16 + j) * 2 + step % 2] =
                                src < 0 ? 0 : ((const uint16_t *)wf)[src];
                        else
                            ((float *)dst)[base + step * nv * 16 + j] = ((const float *)wf)[src];
                    }
    }
}

/* The kernel as the family reads it: w itself (float32, or bfloat16 for
 * the bf16 family), or widened to float32 into tmp. */
static const void *widen_kernel(const conv_family *f, const void *w, mp_dtype wt, int64_t n,
                                float *tmp)
{
    if (wt == MP_F32 || f->bf16) return w;
    mp_convert(tmp, MP_F32, w, wt, (size_t)n);
    return tmp;
}

/* The convolution of spec s with the packed kernel wbuf (pack_weights),
 * through epilogue e (whose ldc is the output's channel count), on the
 * float32 or the bfloat16 family. */
static mp_status run_forward(const conv_family *f, const conv_spec *s, const void *wbuf,
                             const gemm_epilogue *e)
{
    const bool bf16 = f->bf16;
    const int64_t cw = 16 * f->nvmax;
    const int64_t taps = s->kh * s->kw, nb = cdiv(s->c, 16);
    const int64_t ntap = taps * nb, cp = block_channels(s->c, bf16), es = bf16 ? 2 : 4;
    const int steps = (int)(bf16 ? cp / 2 : cp);
    const int64_t nq = cdiv(s->o, cw);
    int64_t cover = 0;
    for (int64_t q = 0; q < nq; q++) {
        int64_t nt, mr;
        tiling(f, s->ow, chunk_nv(f, s->o, q), &nt, &mr);
        if (nt * mr > cover) cover = nt * mr;
    }
    const int64_t hp = (s->oh - 1) * s->sh + s->kh, wp = (cover - 1) * s->sw + s->kw;
    int64_t *xoff = mp_scratch(SLOT_TAPS, (size_t)ntap * sizeof(int64_t));
    if (!xoff) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for the kernel");
    for (int64_t kh = 0, t = 0; kh < s->kh; kh++)
        for (int64_t kw = 0; kw < s->kw; kw++)
            for (int64_t b = 0; b < nb; b++, t++) xoff[t] = b * hp * wp * 16 + (kh * wp + kw) * 16;

    const double flops = 2.0 * (double)(s->n * s->oh * s->ow) * (double)(s->o * taps * s->c);
    int nt = flops < MP_GEMM_FORK_FLOPS ? 1 : mp_num_threads();
    if (nt > s->n) nt = (int)s->n;
    const conv_fwd_fn *const *table = f->fwd[s->sw - 1];
    const size_t image = (size_t)(nb * hp * wp * 16 * es);
    const bool widen = !bf16 && s->xt != MP_F32;
    /* float32 out with nothing to apply: tiles go straight to y */
    const bool plain = e->c_type == MP_F32 && e->alpha == 1.0f && e->beta == 0.0f && !e->bias &&
                       e->act == MP_ACT_NONE;
    const size_t ys = mp_dtype_size(e->c_type);
    bool ok = true;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(&& : ok)
    for (int64_t n = 0; n < s->n; n++) {
        char *buf = mp_scratch(SLOT_IMAGE, image);
        float *row = widen ? mp_scratch(SLOT_ROW, (size_t)(s->w * s->c) * sizeof(float)) : NULL;
        if (!buf || (widen && !row)) {
            ok = false;
            continue;
        }
        _Alignas(64) float tile[MR1 * 16]; /* mr * nv <= 28 in every family */
        f->pad(s, n, hp, wp, row, buf);
        for (int64_t q = 0; q < nq; q++) {
            const int nv = chunk_nv(f, s->o, q);
            int64_t ntile, mr;
            tiling(f, s->ow, nv, &ntile, &mr);
            const conv_fwd_fn kern = table[nv - 1][mr - 1];
            const char *wq = (const char *)wbuf + taps * nb * cp * cw * q * es;
            for (int64_t oy = 0; oy < s->oh; oy++) {
                /* the output row as a matrix of pixels: row i at c + i*ldc */
                gemm_epilogue er = *e;
                er.c = (char *)e->c +
                       (size_t)(((n * s->yh + s->y0 + oy * s->ys) * s->yw + s->z0) * e->ldc) * ys;
                er.ldc = s->zs * e->ldc;
                for (int64_t tt = 0; tt < ntile; tt++) {
                    const int64_t ox = tt * mr;
                    const char *xt = buf + (oy * s->sh * wp + ox * s->sw) * 16 * es;
                    if (plain && ox + mr <= s->ow) { /* a whole tile: into y */
                        kern(ntap, steps, xoff, xt, wq, (float *)er.c + ox * er.ldc + cw * q,
                             er.ldc);
                        continue;
                    }
                    kern(ntap, steps, xoff, xt, wq, tile, nv * 16);
                    f->epilogue(&er, tile, nv * 16, ox, cw * q, min64(mr, s->ow - ox), nv * 16);
                }
            }
        }
    }
    if (!ok) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for a padded image");
    return MP_OK;
}

mp_status mp_conv_direct_forward(const mp_conv_geom *g, const void *x, mp_dtype xt, const void *w,
                                 mp_dtype wt, const float *bias, mp_activation act, void *y,
                                 mp_dtype yt)
{
    const conv_spec s = {x,     xt,    g->n,  g->h,  g->w,  g->c,  g->oh, g->ow, g->o, g->kh, g->kw,
                         g->sh, g->sw, g->pt, g->pl, g->oh, g->ow, 0,     0,     1,    1};
    const gemm_epilogue e = {mp_conv_alpha(g), 0.0f, y, yt, g->o, bias, act, false, NULL};
    const int64_t nw = g->kh * g->kw * g->c * g->o;
    float *wbuf = mp_scratch(SLOT_W, (size_t)(2 * nw) * sizeof(float));
    if (!wbuf) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for the kernel");
    const conv_family *f = mp_conv_family(xt, wt, true);
    pack_weights(f, &s, widen_kernel(f, w, wt, nw, wbuf + nw), NULL, wbuf);
    return run_forward(f, &s, wbuf, &e);
}

/* The data gradient one phase (ph, pw) at a time: the input pixels (ph +
 * sh*a, pw + sw*b) take gradient only from the kernel rows kh0 + j*sh and
 * columns kw0 + l*sw (kh0 = (ph + pt) mod sh), from output row a + (ph + pt
 * - kh0)/sh - j: a stride-1 data gradient with that sub-kernel, which is the
 * forward of dy with the sub-kernel flipped (padding its size - 1 - its
 * offset), written straight into dx's phase pixels. Stride 1: one phase,
 * dx[ih] = sum_kh dy[ih + pt - kh] w[kh] = sum_kh' dy[ih - (KH-1-pt) + kh']
 * w[KH-1-kh']. No product with a structural zero is computed. */
mp_status mp_conv_direct_data(const mp_conv_geom *g, const void *dy, mp_dtype dyt, const void *w,
                              mp_dtype wt, void *dx, mp_dtype dxt)
{
    const int64_t nw = g->kh * g->kw * g->c * g->o;
    float *wbuf = mp_scratch(SLOT_W, (size_t)(2 * nw) * sizeof(float));
    if (!wbuf) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for the kernel");
    const conv_family *f = mp_conv_family(dyt, wt, true);
    const void *wf = widen_kernel(f, w, wt, nw, wbuf + nw);
    const gemm_epilogue e = {mp_conv_alpha(g), 0.0f, dx, dxt, g->c, NULL, MP_ACT_NONE, false, NULL};
    const size_t pixel = (size_t)g->c * mp_dtype_size(dxt);
    for (int64_t ph = 0; ph < g->sh && ph < g->h; ph++)
        for (int64_t pw = 0; pw < g->sw && pw < g->w; pw++) {
            const mp_conv_phase phase = mp_conv_phase_of(g, ph, pw);
            const int64_t hh = phase.hh, ww = phase.ww, kh0 = phase.kh0, kw0 = phase.kw0,
                          pkh = phase.pkh, pkw = phase.pkw;
            if (pkh == 0 || pkw == 0) { /* no tap reaches these pixels */
#pragma omp parallel for schedule(static) if (g->n * hh * ww > 4096)
                for (int64_t n = 0; n < g->n; n++)
                    for (int64_t a = 0; a < hh; a++)
                        for (int64_t b = 0; b < ww; b++)
                            memset((char *)dx + (size_t)((n * g->h + ph + a * g->sh) * g->w + pw +
                                                         b * g->sw) *
                                                    pixel,
                                   0, pixel);
                continue;
            }
            const int64_t ppt = phase.ppt, ppl = phase.ppl;
            const conv_spec s = {
                dy, dyt, g->n,          g->oh,         g->ow, g->o, hh, ww, g->c,  pkh,  pkw,
                1,  1,   pkh - 1 - ppt, pkw - 1 - ppl, g->h,  g->w, ph, pw, g->sh, g->sw};
            const kernel_map km = {g->kw, kh0, kw0, g->sh, g->sw};
            pack_weights(f, &s, wf, &km, wbuf);
            mp_status st = run_forward(f, &s, wbuf, &e);
            if (st) return st;
        }
    return MP_OK;
}

#else

bool mp_conv_direct_ok(const mp_conv_geom *g)
{
    (void)g;
    return false;
}
mp_status mp_conv_direct_forward(const mp_conv_geom *g, const void *x, mp_dtype xt, const void *w,
                                 mp_dtype wt, const float *bias, mp_activation act, void *y,
                                 mp_dtype yt)
{
    (void)g, (void)x, (void)xt, (void)w, (void)wt, (void)bias, (void)act, (void)y, (void)yt;
    return mp_set_error(MP_ERR_UNSUPPORTED, "conv: no direct kernels on this CPU");
}
mp_status mp_conv_direct_data(const mp_conv_geom *g, const void *dy, mp_dtype dyt, const void *w,
                              mp_dtype wt, void *dx, mp_dtype dxt)
{
    (void)g, (void)dy, (void)dyt, (void)w, (void)wt, (void)dx, (void)dxt;
    return mp_set_error(MP_ERR_UNSUPPORTED, "conv: no direct kernels on this CPU");
}

#endif
