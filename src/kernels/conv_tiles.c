/* conv_tiles.c - stride-1 convolutions of bfloat16 operands as one GEMM on
 * the AMX tiles, where the measured dispatch chose them for bf16 x bf16:
 * the forward, and the data gradient as the forward of dy with the kernel
 * flipped and its channel axes swapped (conv_direct.c says why).
 *
 * An output row's receptive field is kh input rows. A copy of the input
 * stacks them for every output row y and padded column q:
 *   F[n][y][q][j][ci] = x[n][y + j - pt][q - pl][ci]   (zero off the image)
 * so the kw * kh * ci values of F from position (n, y, z) on are exactly
 * output pixel (n, y, z)'s patch, laid [kw][kh][ci]: the GEMM's row of A,
 * read where it lies, consecutive pixels kh * ci apart. Each output row
 * carries kw - 1 positions past ow, so the next row's pixels continue at
 * the same stride: all rows of all images are one A of n * oh * (ow + kw -
 * 1) rows, the extra (virtual) pixels computed and dropped (a 7x7 image
 * with a 3x3 kernel: 63 rows for 49 pixels; 14x14: 224 for 196). B is the
 * kernel permuted to [kw][kh][ci] x co. One product into float32, then the
 * epilogue (alpha, bias, activation, the output's type) on the real
 * pixels. No patch is gathered: F is kh times the image, written by row
 * copies, where an implicit GEMM gathers kh * kw times it element by
 * element (that route ran ResNet-20's step at 545 ms against 129 on the
 * direct FMA kernels).
 *
 * ci a multiple of 32 (every 32-deep tile of the patch inside it: A read
 * in place, its padding never multiplied; the virtual pixels' rows reach
 * past their output row into real data, but their sums are dropped).
 * Each output is a sum of the patch's products in the tiles' order, within
 * the GEMM's bound; threads split the product's rows, not its sums. Intel
 * Xeon (family 6 model 167), 2 threads, ResNet-20 at batch 128 (make
 * bench-conv), ms per call, the direct kernels (FMA: vdpbf16ps is slower
 * there) / these: 14x14x32 forward 1.51 / 0.56, data gradient 1.53 /
 * 0.60; 7x7x64 forward 1.42 / 0.56, data gradient 1.55 / 0.61; the
 * mixed_bfloat16 step 116.0 -> 100.6 ms. The filter gradient stays
 * direct: its sum runs over the pixels, which the tiles want along A's
 * rows. Tried: F transposed (G[j][ci][p]) read in place, a GEMM of (kh *
 * ci) x co over the pixels per kw, dy zero at the virtual pixels and an x
 * with a non-finite value left to the direct kernels (the virtual pixels'
 * products with it would be NaN where the exact sum is not): 14x14x32
 * 2.18 ms against 1.49, 7x7x64 1.54 against 1.63 (96 rows of C: panels of
 * 64 and 32, one thread twice the other's work; the transposing copy; dy
 * packed once per kw). 16 channels (28x28x16) stay direct too: a patch of
 * 144 is not whole tiles, and a product 16 columns wide ran the tiles at
 * 306 GFLOP/s, the FMA kernels' rate. */
#include <string.h>

#include "kernels/conv_tiles.h"
#include "kernels/gemm_avx512_common.h"

#if MP_X86

/* Scratch slots of the calling thread (the direct kernels' own, core/internal.h):
 * the stacked copy, the permuted kernel, the float32 product. */
enum { SLOT_F = 9, SLOT_KERNEL = 11, SLOT_PRODUCT = 13 };

bool mp_conv_tiles_ok(const mp_conv_geom *g, mp_dtype a, mp_dtype b, bool data)
{
    return a == MP_BF16 && b == MP_BF16 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 &&
           (data ? g->o : g->c) % 32 == 0 &&
           mp_gemm_impl_for(MP_BF16, MP_BF16) == &mp_gemm_amx_impl;
}

/* A stride-1 convolution as the route sees it: the source image [n][h][w][ci],
 * the output [n][oh][ow][co], the kernel's size and its padding before. */
typedef struct {
    const uint16_t *src;
    int64_t n, h, w, ci, oh, ow, co, kh, kw, pt, pl;
} tiles_spec;

/* Output rows r of F (see the top), kw - 1 zero positions after the last. */
static void stack_rows(const tiles_spec *s, uint16_t *f)
{
    const int64_t wv = s->ow + s->kw - 1, seg = s->kh * s->ci, rows = s->n * s->oh;
    const size_t px = (size_t)s->ci * sizeof(uint16_t);
    const int nt = rows * wv * seg < (1 << 16) ? 1 : mp_num_threads();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t n = r / s->oh, y = r % s->oh;
        for (int64_t j = 0; j < s->kh; j++) {
            const int64_t iy = y + j - s->pt;
            const bool row_in = iy >= 0 && iy < s->h;
            const uint16_t *src = s->src + (n * s->h + (row_in ? iy : 0)) * s->w * s->ci;
            uint16_t *dst = f + r * wv * seg + j * s->ci;
            for (int64_t q = 0; q < wv; q++, dst += seg) {
                const int64_t ix = q - s->pl;
                if (row_in && ix >= 0 && ix < s->w)
                    memcpy(dst, src + ix * s->ci, px);
                else
                    memset(dst, 0, px);
            }
        }
    }
    memset(f + rows * wv * seg, 0, (size_t)((s->kw - 1) * seg) * sizeof *f);
}

/* The convolution of s with kernel k ([kw][kh][ci][co]) through e (e->c:
 * [n][oh][ow][co], e->ldc = co). */
static mp_status tiles_run(const tiles_spec *s, const uint16_t *k, const gemm_epilogue *e)
{
    const int64_t wv = s->ow + s->kw - 1, seg = s->kh * s->ci, rows = s->n * s->oh;
    const int64_t m = rows * wv;
    uint16_t *f = mp_scratch(SLOT_F, (size_t)((m + s->kw - 1) * seg) * sizeof *f);
    float *p = mp_scratch(SLOT_PRODUCT, (size_t)(m * s->co) * sizeof *p);
    if (!f || !p) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for the stacked rows");
    stack_rows(s, f);
    const gemm_operand a = {f, MP_BF16, seg, 1, NULL}, b = {k, MP_BF16, 1, s->co, NULL};
    const gemm_epilogue plain = {1.0f, 0.0f, p, MP_F32, s->co, NULL, MP_ACT_NONE, false, NULL};
    mp_status st = mp_gemm_run(m, s->co, s->kw * seg, &a, &b, &plain);
    if (st) return st;
    /* the real pixels of each output row, 64 x 64 at a time (the AVX-512
     * epilogue's largest tile) */
    const size_t ys = mp_dtype_size(e->c_type);
    const int nt = m * s->co < (1 << 16) ? 1 : mp_num_threads();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        gemm_epilogue er = *e;
        er.c = (char *)e->c + (size_t)(r * s->ow * s->co) * ys;
        for (int64_t i = 0; i < s->ow; i += 64)
            for (int64_t j = 0; j < s->co; j += 64)
                mp_gemm_epilogue_avx512(&er, p + (r * wv + i) * s->co + j, s->co, i, j,
                                        min64(64, s->ow - i), min64(64, s->co - j));
    }
    return MP_OK;
}

static float alpha_of(const mp_conv_geom *g) { return g->alpha != 0.0f ? g->alpha : 1.0f; }

mp_status mp_conv_tiles_forward(const mp_conv_geom *g, const void *x, const void *w,
                                const float *bias, mp_activation act, void *y, mp_dtype yt)
{
    const int64_t c = g->c, o = g->o;
    uint16_t *k = mp_scratch(SLOT_KERNEL, (size_t)(g->kh * g->kw * c * o) * sizeof *k);
    if (!k) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for the kernel");
    for (int64_t i = 0; i < g->kh; i++) /* [kh][kw][c][o] -> [kw][kh][c][o] */
        for (int64_t j = 0; j < g->kw; j++)
            memcpy(k + (j * g->kh + i) * c * o, (const uint16_t *)w + (i * g->kw + j) * c * o,
                   (size_t)(c * o) * sizeof *k);
    const tiles_spec s = {x, g->n, g->h, g->w, c, g->oh, g->ow, o, g->kh, g->kw, g->pt, g->pl};
    const gemm_epilogue e = {alpha_of(g), 0.0f, y, yt, o, bias, act, false, NULL};
    return tiles_run(&s, k, &e);
}

mp_status mp_conv_tiles_data(const mp_conv_geom *g, const void *dy, const void *w, void *dx,
                             mp_dtype dxt)
{
    const int64_t c = g->c, o = g->o, kh = g->kh, kw = g->kw;
    uint16_t *k = mp_scratch(SLOT_KERNEL, (size_t)(kh * kw * c * o) * sizeof *k);
    if (!k) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for the kernel");
    /* entry [j][i][oc][cc] (kw, kh, dy's channel, dx's) = w[kh-1-i][kw-1-j][cc][oc] */
    const uint16_t *wk = w;
    for (int64_t i = 0; i < kh; i++)
        for (int64_t j = 0; j < kw; j++) {
            const uint16_t *src = wk + ((kh - 1 - i) * kw + (kw - 1 - j)) * c * o;
            uint16_t *dst = k + (j * kh + i) * o * c;
            for (int64_t cc = 0; cc < c; cc++)
                for (int64_t oc = 0; oc < o; oc++) dst[oc * c + cc] = src[cc * o + oc];
        }
    const tiles_spec s = {dy, g->n, g->oh,          g->ow,         o, g->h, g->w, c,
                          kh, kw,   kh - 1 - g->pt, kw - 1 - g->pl};
    const gemm_epilogue e = {alpha_of(g), 0.0f, dx, dxt, c, NULL, MP_ACT_NONE, false, NULL};
    return tiles_run(&s, k, &e);
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
