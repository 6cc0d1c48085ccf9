/* conv_tiles.c - convolutions of bfloat16 operands as one GEMM on the AMX
 * tiles, where the measured dispatch chose them for bf16 x bf16: the
 * forward and the data gradient (the forward of dy with the kernel flipped
 * and its channel axes swapped, a strided one phase by phase: conv_direct.c
 * says why), strides 1 and 2.
 *
 * An output row's receptive field is kh input rows. A copy of the input
 * stacks them for every output row y and padded column q:
 *   F[n][y][q][j][ci] = x[n][y sh + j - pt][q - pl][ci]   (zero off the image)
 * so the kw * kh * ci values of F from position (n, y, z sw) on are exactly
 * output pixel (n, y, z)'s patch, laid [kw][kh][ci]: the GEMM's row of A,
 * read where it lies, consecutive pixels sw positions apart. Each output
 * row carries positions past its last patch up to a whole number of
 * strides, so the next row's pixels continue at the same stride: all rows
 * of all images are one A, the extra (virtual) pixels computed and dropped
 * (a 7x7 image with a 3x3 kernel at stride 1: 63 rows for 49 pixels; 14x14:
 * 224 for 196; 14x14 to 7x7 at stride 2: 8 a row for 7). B is the
 * kernel permuted to [kw][kh][ci] x co. The product goes through the
 * GEMM's epilogue (alpha, bias, activation, the output's type) into a
 * buffer of all pixels, whose real ones are then copied out row by row.
 * No patch is gathered: F is kh times the image, written by row copies,
 * where an implicit GEMM gathers kh * kw times it element by element (that
 * route ran ResNet-20's step at 545 ms against 129 on the direct FMA
 * kernels).
 *
 * ci a multiple of 16; F's positions padded with 16 zeros where kw of them
 * would not be whole 32-deep tiles (a 3x3 kernel over 16 channels: 64 per
 * position, a patch of 192 for 144), so that A is read in place (the
 * kernel's matching rows are zero too). The virtual pixels' rows reach
 * past their output row into real data, but their sums are dropped. Each
 * output is a sum of the patch's products in the tiles' order, within the
 * GEMM's bound; threads split the product's rows, not its sums. Intel Xeon
 * (family 6 model 167), 2 threads, ResNet-20 at batch 128, bf16 output,
 * medians of 41 calls, ms, the direct kernels (FMA: vdpbf16ps is slower
 * there) / these: 28x28x16 forward 1.66-1.70 / 0.99, data gradient
 * 1.65-1.72 / 1.00; 14x14x32 1.51 / 0.45-0.50 and 1.53 / 0.45-0.50; 7x7x64
 * 1.42 / 0.50 and 1.55 / 0.51-0.52 (with an f32 product and a separate
 * epilogue pass: 0.51 and 0.52); stride 2, forward: 28x28x16>32 3x3 0.87 /
 * 0.55, 14x14x32>64 3x3 0.80 / 0.33, 1x1 0.15 / 0.12; data gradients at
 * stride 2, 3x3: 1.33 / 0.89 and 1.02 / 0.36; the mixed_bfloat16 step (make bench-conv)
 * 116.0 -> 91.9 and 93.3 ms (two runs). The filter gradient, whose sum
 * runs over the pixels: conv_tiles_filter.c. */
#include <string.h>

#include "kernels/conv_tiles.h"
#include "kernels/gemm_internal.h"

#if MP_X86

/* Scratch slots of the calling thread (the direct kernels' own, core/internal.h):
 * the stacked copy, the permuted kernel, the product in the output's type. */
enum { SLOT_F = 9, SLOT_KERNEL = 11, SLOT_PRODUCT = 13 };

/* Channels ci a multiple of 16, and not a 1x1 kernel over an odd count of
 * 16 (padded to 32, its patch would double: 28x28x16>32 1x1/2 0.22 ms
 * direct, 0.28 here; over 32 channels 0.15 -> 0.12). Strides 1 and 2;
 * the data gradient of a strided kernel only where every phase has taps
 * (1x1/2: a quarter of dx written pixel by pixel, the rest zeroed, 0.32 ->
 * 0.51 ms over 16 channels, 0.18 -> 0.21 over 32). */
bool mp_conv_tiles_ok(const mp_conv_geom *g, mp_dtype a, mp_dtype b, bool data)
{
    const int64_t ci = data ? g->o : g->c;
    return a == MP_BF16 && b == MP_BF16 && g->sh <= 2 && g->sw <= 2 &&
           (!data || (g->kh >= g->sh && g->kw >= g->sw)) && g->dh == 1 && g->dw == 1 &&
           ci % 16 == 0 && (g->kh * g->kw > 1 || ci % 32 == 0) &&
           mp_gemm_impl_for(MP_BF16, MP_BF16) == &mp_gemm_amx_impl;
}

/* A convolution as the route sees it: the source image [n][h][w][ci], the
 * output [n][oh][ow][co], the kernel's size, its padding before, the
 * strides; output pixel (n, y, z) goes to pixel (y0 + y ys, z0 + z zs) of
 * an [n][yh][yw][co] tensor (a strided data gradient's phase; else the
 * output itself: yh = oh, yw = ow, y0 = z0 = 0, ys = zs = 1). */
typedef struct {
    const uint16_t *src;
    int64_t n, h, w, ci, oh, ow, co, kh, kw, pt, pl, sh, sw;
    int64_t yh, yw, y0, z0, ys, zs;
} tiles_spec;

/* Pixels a row of the product holds: ow real ones and the virtual ones
 * whose positions (sw apart) fill the row's kw - 1 past the last real
 * patch; wv = sw * pixels_of(s) positions a row. */
static int64_t pixels_of(const tiles_spec *s) { return cdiv((s->ow - 1) * s->sw + s->kw, s->sw); }

/* Elements of F per position: kh * ci, and 16 zeros more where kw of them
 * would not be whole 32-deep tiles (ci a multiple of 16; a 3x3 kernel
 * over 16 channels: 64, a patch of 192 for 144). */
static int64_t seg_of(int64_t kh, int64_t ci, int64_t kw)
{
    const int64_t seg = kh * ci;
    return kw % 2 && seg % 32 ? seg + 16 : seg;
}

/* Output rows r of F (see the top), wv positions each, the padding of
 * each position and kw - 1 positions after the last zero. */
static void stack_rows(const tiles_spec *s, int64_t wv, int64_t seg, uint16_t *f)
{
    const int64_t rows = s->n * s->oh, ci = s->ci;
    const int nt = rows * wv * seg < (1 << 16) ? 1 : mp_num_threads();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t n = r / s->oh, y = r % s->oh;
        uint16_t *dst = f + r * wv * seg;
        for (int64_t q = 0; q < wv; q++, dst += seg) {
            const int64_t ix = q - s->pl;
            for (int64_t j = 0; j < s->kh; j++) {
                const int64_t iy = y * s->sh + j - s->pt;
                uint16_t *d = dst + j * ci;
                if (iy >= 0 && iy < s->h && ix >= 0 && ix < s->w) {
                    const uint16_t *src = s->src + ((n * s->h + iy) * s->w + ix) * ci;
                    /* 32 bytes at a time: fixed-size copies inline, where a
                     * length known only at run time calls the library's */
                    for (int64_t c = 0; c < ci; c += 16) memcpy(d + c, src + c, 32);
                } else {
                    memset(d, 0, (size_t)ci * sizeof *d);
                }
            }
            memset(dst + s->kh * ci, 0, (size_t)(seg - s->kh * ci) * sizeof *dst);
        }
    }
    memset(f + rows * wv * seg, 0, (size_t)((s->kw - 1) * seg) * sizeof *f);
}

/* The convolution of s with kernel k ([kw][seg][co], rows j * ci + c of a
 * kw's seg holding the kernel's [kh][ci], the rest zero) through e (e->c:
 * [n][oh][ow][co], e->ldc = co). */
static mp_status tiles_run(const tiles_spec *s, const uint16_t *k, const gemm_epilogue *e)
{
    const int64_t ov = pixels_of(s), wv = ov * s->sw, seg = seg_of(s->kh, s->ci, s->kw);
    const int64_t rows = s->n * s->oh, m = rows * ov;
    const size_t ys = mp_dtype_size(e->c_type);
    uint16_t *f = mp_scratch(SLOT_F, (size_t)((rows * wv + s->kw - 1) * seg) * sizeof *f);
    char *p = mp_scratch(SLOT_PRODUCT, (size_t)(m * s->co) * ys);
    if (!f || !p) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for the stacked rows");
    stack_rows(s, wv, seg, f);
    /* every pixel through e's epilogue (alpha, bias, activation, the
     * output's type) into p, then the real ones to e->c, row by row */
    const gemm_operand a = {f, MP_BF16, s->sw * seg, 1, NULL}, b = {k, MP_BF16, 1, s->co, NULL};
    gemm_epilogue ep = *e;
    ep.c = p;
    ep.ldc = s->co;
    mp_status st = mp_gemm_run(m, s->co, s->kw * seg, &a, &b, &ep);
    if (st) return st;
    const size_t px = (size_t)s->co * ys;
    const int nt = m * s->co < (1 << 16) ? 1 : mp_num_threads();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t n = r / s->oh, y = r % s->oh;
        char *to = (char *)e->c + (size_t)((n * s->yh + s->y0 + y * s->ys) * s->yw + s->z0) * px;
        const char *from = p + (size_t)(r * ov) * px;
        if (s->zs == 1)
            memcpy(to, from, (size_t)s->ow * px);
        else
            for (int64_t z = 0; z < s->ow; z++)
                memcpy(to + (size_t)(z * s->zs) * px, from + (size_t)z * px, px);
    }
    return MP_OK;
}

/* The kernel buffer for s: kw * seg rows of co, its padding rows zero. */
static uint16_t *kernel_buffer(const tiles_spec *s)
{
    const int64_t seg = seg_of(s->kh, s->ci, s->kw);
    uint16_t *k = mp_scratch(SLOT_KERNEL, (size_t)(s->kw * seg * s->co) * sizeof *k);
    if (!k) return NULL;
    for (int64_t l = 0; l < s->kw; l++)
        memset(k + (l * seg + s->kh * s->ci) * s->co, 0,
               (size_t)((seg - s->kh * s->ci) * s->co) * sizeof *k);
    return k;
}

mp_status mp_conv_tiles_forward(const mp_conv_geom *g, const void *x, const void *w,
                                const float *bias, mp_activation act, void *y, mp_dtype yt)
{
    const int64_t c = g->c, o = g->o;
    const tiles_spec s = {x,     g->n,  g->h,  g->w,  c,     g->oh, g->ow, o, g->kh, g->kw,
                          g->pt, g->pl, g->sh, g->sw, g->oh, g->ow, 0,     0, 1,     1};
    const int64_t seg = seg_of(g->kh, c, g->kw);
    uint16_t *k = kernel_buffer(&s);
    if (!k) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for the kernel");
    for (int64_t i = 0; i < g->kh; i++) /* [kh][kw][c][o] -> [kw][kh][c][o] */
        for (int64_t j = 0; j < g->kw; j++)
            memcpy(k + (j * seg + i * c) * o, (const uint16_t *)w + (i * g->kw + j) * c * o,
                   (size_t)(c * o) * sizeof *k);
    const gemm_epilogue e = {mp_conv_alpha(g), 0.0f, y, yt, o, bias, act, false, NULL};
    return tiles_run(&s, k, &e);
}

/* One phase of the data gradient: the stride-1 forward of dy with the
 * sub-kernel of taps (kh0 + i sh, kw0 + j sw), pkh x pkw of them, flipped
 * and its channel axes swapped, into dx's pixels (ph + a sh, pw + b sw)
 * (conv_direct.c's mp_conv_direct_data says why; stride 1: one phase, the
 * whole kernel). */
static mp_status data_phase(const mp_conv_geom *g, const void *dy, const uint16_t *w, void *dx,
                            mp_dtype dxt, int64_t ph, int64_t pw)
{
    const int64_t c = g->c, o = g->o;
    /* every phase has taps: mp_conv_tiles_ok takes no stride above the kernel */
    const mp_conv_phase phase = mp_conv_phase_of(g, ph, pw);
    const int64_t hh = phase.hh, ww = phase.ww, kh0 = phase.kh0, kw0 = phase.kw0, pkh = phase.pkh,
                  pkw = phase.pkw;
    const int64_t ppt = phase.ppt, ppl = phase.ppl;
    const tiles_spec s = {dy,  g->n, g->oh,         g->ow,         o, hh, ww,   c,
                          pkh, pkw,  pkh - 1 - ppt, pkw - 1 - ppl, 1, 1,  g->h, g->w,
                          ph,  pw,   g->sh,         g->sw};
    const int64_t seg = seg_of(pkh, o, pkw);
    uint16_t *k = kernel_buffer(&s);
    if (!k) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for the kernel");
    /* row (j, i, oc) (kw, kh, dy's channel) column cc (dx's) = w's tap
     * (kh0 + (pkh-1-i) sh, kw0 + (pkw-1-j) sw), entry [cc][oc] */
    for (int64_t i = 0; i < pkh; i++)
        for (int64_t j = 0; j < pkw; j++) {
            const int64_t r = kh0 + (pkh - 1 - i) * g->sh, q = kw0 + (pkw - 1 - j) * g->sw;
            const uint16_t *src = w + (r * g->kw + q) * c * o;
            uint16_t *dst = k + (j * seg + i * o) * c;
            for (int64_t cc = 0; cc < c; cc++)
                for (int64_t oc = 0; oc < o; oc++) dst[oc * c + cc] = src[cc * o + oc];
        }
    const gemm_epilogue e = {mp_conv_alpha(g), 0.0f, dx, dxt, c, NULL, MP_ACT_NONE, false, NULL};
    return tiles_run(&s, k, &e);
}

mp_status mp_conv_tiles_data(const mp_conv_geom *g, const void *dy, const void *w, void *dx,
                             mp_dtype dxt)
{
    for (int64_t ph = 0; ph < g->sh && ph < g->h; ph++)
        for (int64_t pw = 0; pw < g->sw && pw < g->w; pw++) {
            mp_status st = data_phase(g, dy, w, dx, dxt, ph, pw);
            if (st) return st;
        }
    return MP_OK;
}

#else

bool mp_conv_tiles_ok(const mp_conv_geom *g, mp_dtype a, mp_dtype b, bool data)
{
    (void)g, (void)a, (void)b, (void)data;
    return false;
}
mp_status mp_conv_tiles_forward(const mp_conv_geom *g, const void *x, const void *w,
                                const float *bias, mp_activation act, void *y, mp_dtype yt)
{
    (void)g, (void)x, (void)w, (void)bias, (void)act, (void)y, (void)yt;
    return mp_set_error(MP_ERR_UNSUPPORTED, "conv: no AMX tiles on this CPU");
}
mp_status mp_conv_tiles_data(const mp_conv_geom *g, const void *dy, const void *w, void *dx,
                             mp_dtype dxt)
{
    (void)g, (void)dy, (void)w, (void)dx, (void)dxt;
    return mp_set_error(MP_ERR_UNSUPPORTED, "conv: no AMX tiles on this CPU");
}

#endif
