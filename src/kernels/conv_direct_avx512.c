/* conv_direct_avx512.c - direct convolution for channel counts that are
 * multiples of 16 (the body of a ResNet): forward, filter gradient and the
 * data gradient of a stride-1 convolution, in float32 FMA on AVX-512.
 *
 * Each image is first copied, widened exactly to float32 and zero-padded,
 * into channel blocks of 16: buf[cb][rows][cols][16]. In that layout the
 * 16 channels of block cb at a pixel are 64 consecutive bytes and pixels
 * are a fixed 64 bytes apart, so a microkernel reads its operands at
 * constant offsets from one pointer:
 *   forward  a tile of MR consecutive output pixels of a row (the GEMM's M)
 *            times NV*16 output channels (N) in MR*NV zmm accumulators; per
 *            input channel one row of the packed weights [tap][16][NV*16]
 *            (NV loads) and one broadcast of each pixel's input (a memory
 *            operand of the FMA). No patch is gathered.
 *   filter   per kernel tap, CR input channels x NV*16 output channels, summed
 *            over one image's output pixels in registers; an image's sums
 *            are added to the partial sum of a fixed chunk of images, and the
 *            chunks are added in order at the end.
 *   data     stride 1: the forward of dy with the kernel flipped and its two
 *            channel axes swapped (padding KH-1-pt). conv.c runs a strided
 *            convolution's data gradient as stride-1 phases.
 * Every output element is summed in one fixed order (taps, then channels;
 * for the filter: pixels of an image, images of a chunk, chunks) that does
 * not depend on the thread count: threads take whole images (forward) or
 * whole chunks (filter), and the number of chunks depends only on the
 * shape. */
#include <string.h>

#include "kernels/conv_direct.h"
#include "kernels/gemm_avx512_common.h"

#if MP_X86

bool mp_conv_direct_ok(const mp_conv_geom *g)
{
    return mp_isa_active() >= MP_ISA_AVX512 && (g->c % 16 == 0 || g->c < 16) && g->o % 16 == 0 &&
           g->dh == 1 && g->dw == 1 && (g->sh == 1 || g->sh == 2) && (g->sw == 1 || g->sw == 2);
}

/* Scratch slots (see mp_scratch): per thread the padded image and a
 * widened row; on the calling thread the packed weights and tap offsets, and
 * the filter gradient's partial sums. */
enum { SLOT_IMAGE = 9, SLOT_ROW = 10, SLOT_W = 11, SLOT_TAPS = 12, SLOT_PART = 13 };

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static float alpha_of(const mp_conv_geom *g) { return g->alpha != 0.0f ? g->alpha : 1.0f; }

/* A forward convolution as the kernels see it: source image [n, h, w, c],
 * output [n, oh, ow, o], kernel kh x kw with strides sh, sw; padding pt, pl
 * (negative: the window starts inside the image). */
typedef struct {
    const void *x;
    mp_dtype xt;
    int64_t n, h, w, c, oh, ow, o, kh, kw, sh, sw, pt, pl;
    /* where output pixel (n, y, z) goes: pixel (y0 + y*ys, z0 + z*zs) of an
     * [n, yh, yw, o] tensor (a strided data gradient's phase; else the
     * output itself: yh = oh, yw = ow, y0 = z0 = 0, ys = zs = 1) */
    int64_t yh, yw, y0, z0, ys, zs;
} spec;

/* The spec's kernel [kh][kw][c][o] as entries of the kernel w being
 * differentiated ([KH][kwo][o][c]): entry (i, j) is w's (r0 + (kh-1-i)*rs,
 * c0 + (kw-1-j)*cs), flipped, its channel axes swapped, every rs-th row and
 * cs-th column from (r0, c0) (a phase of a strided convolution). NULL:
 * the kernel is w itself. */
typedef struct {
    int64_t kwo, r0, c0, rs, cs;
} kernel_map;

/* Image n of s->x, widened to float32, as buf[c/16][hp][wp][16] with buf
 * row r, column q holding source pixel (r - pt, q - pl), zero outside the
 * image. row: w*c floats of scratch for a widened source row. */
MP_TARGET_AVX512 static void pad_image(const spec *s, int64_t n, int64_t hp, int64_t wp, float *row,
                                       float *buf)
{
    const int64_t nb = cdiv(s->c, 16), plane = hp * wp * 16;
    const __mmask16 m = (__mmask16)(s->c < 16 ? (1u << s->c) - 1u : 0xFFFFu);
    const size_t es = mp_dtype_size(s->xt);
    /* a stride above the kernel's size skips rows and columns no tap reads
     * (1x1 stride 2: 3 of every 4 pixels); they are left as they are */
    const bool skip = s->sh > s->kh || s->sw > s->kw;
    for (int64_t r = 0; r < hp; r++) {
        const int64_t ih = r - s->pt;
        if (skip && r % s->sh >= s->kh) continue;
        if (ih < 0 || ih >= s->h) {
            for (int64_t b = 0; b < nb; b++) memset(buf + b * plane + r * wp * 16, 0, wp * 64);
            continue;
        }
        const char *src = (const char *)s->x + (size_t)(((n * s->h + ih) * s->w) * s->c) * es;
        const float *f = (const float *)src;
        if (s->xt != MP_F32) {
            mp_convert(row, MP_F32, src, s->xt, (size_t)(s->w * s->c));
            f = row;
        }
        for (int64_t b = 0; b < nb; b++) {
            float *o = buf + b * plane + r * wp * 16;
            for (int64_t q = 0; q < wp; q++) {
                const int64_t iw = q - s->pl;
                if (skip && q % s->sw >= s->kw) continue;
                __m512 v = iw < 0 || iw >= s->w ? _mm512_setzero_ps()
                                                : _mm512_maskz_loadu_ps(m, f + iw * s->c + b * 16);
                _mm512_store_ps(o + q * 16, v);
            }
        }
    }
}

/* ---------------------------------------------------------------- forward */

/* t[MR][NV*16] (row stride ldt) = sum over ntap taps and cn channels of
 * x[tap][i][c] * w[tap][c][:], with x[tap][i][c] at x + xoff[tap] +
 * i*SW*16 + c. */
#define FWD_KERNEL(SW, NV, MR)                                                                     \
    MP_TARGET_AVX512 static void fwd_##SW##_##NV##_##MR(int64_t ntap, int cn, const int64_t *xoff, \
                                                        const float *x, const float *w, float *t,  \
                                                        int64_t ldt)                               \
    {                                                                                              \
        __m512 acc[MR][NV];                                                                        \
        _Pragma("GCC unroll 28") for (int i = 0; i < MR; i++)                                      \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();  \
        for (int64_t tap = 0; tap < ntap; tap++) {                                                 \
            const float *xp = x + xoff[tap];                                                       \
            for (int c = 0; c < cn; c++) {                                                         \
                __m512 wv[NV];                                                                     \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) wv[v] =                       \
                    _mm512_load_ps(w + v * 16);                                                    \
                _Pragma("GCC unroll 28") for (int i = 0; i < MR; i++)                              \
                {                                                                                  \
                    const __m512 xb = _mm512_set1_ps(xp[i * SW * 16]);                             \
                    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[i][v] =               \
                        _mm512_fmadd_ps(xb, wv[v], acc[i][v]);                                     \
                }                                                                                  \
                xp++;                                                                              \
                w += NV * 16;                                                                      \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 28") for (int i = 0; i < MR; i++)                                      \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)                                   \
                _mm512_storeu_ps(t + i * ldt + v * 16, acc[i][v]);                                 \
    }

typedef void (*fwd_fn)(int64_t ntap, int cn, const int64_t *xoff, const float *x, const float *w,
                       float *t, int64_t ldt);

/* The widest tile per NV: MR*NV accumulators plus NV weight vectors fit the
 * 32 zmm registers. */
enum { MR1 = 28, MR2 = 14, MR3 = 9, MR4 = 7 };

#define MRS_7(F, S, N) F(S, N, 1) F(S, N, 2) F(S, N, 3) F(S, N, 4) F(S, N, 5) F(S, N, 6) F(S, N, 7)
#define MRS_9(F, S, N) MRS_7(F, S, N) F(S, N, 8) F(S, N, 9)
#define MRS_14(F, S, N) MRS_9(F, S, N) F(S, N, 10) F(S, N, 11) F(S, N, 12) F(S, N, 13) F(S, N, 14)
#define MRS_28(F, S, N)                                                                            \
    MRS_14(F, S, N)                                                                                \
    F(S, N, 15)                                                                                    \
    F(S, N, 16)                                                                                    \
    F(S, N, 17)                                                                                    \
    F(S, N, 18)                                                                                    \
    F(S, N, 19)                                                                                    \
    F(S, N, 20)                                                                                    \
    F(S, N, 21) F(S, N, 22) F(S, N, 23) F(S, N, 24) F(S, N, 25) F(S, N, 26) F(S, N, 27) F(S, N, 28)
#define ALL_KERNELS(F, S) MRS_28(F, S, 1) MRS_14(F, S, 2) MRS_9(F, S, 3) MRS_7(F, S, 4)

ALL_KERNELS(FWD_KERNEL, 1)
ALL_KERNELS(FWD_KERNEL, 2)

#define FWD_ENTRY(S, N, M) fwd_##S##_##N##_##M,
static const fwd_fn fwd_s1_1[MR1] = {MRS_28(FWD_ENTRY, 1, 1)};
static const fwd_fn fwd_s1_2[MR2] = {MRS_14(FWD_ENTRY, 1, 2)};
static const fwd_fn fwd_s1_3[MR3] = {MRS_9(FWD_ENTRY, 1, 3)};
static const fwd_fn fwd_s1_4[MR4] = {MRS_7(FWD_ENTRY, 1, 4)};
static const fwd_fn fwd_s2_1[MR1] = {MRS_28(FWD_ENTRY, 2, 1)};
static const fwd_fn fwd_s2_2[MR2] = {MRS_14(FWD_ENTRY, 2, 2)};
static const fwd_fn fwd_s2_3[MR3] = {MRS_9(FWD_ENTRY, 2, 3)};
static const fwd_fn fwd_s2_4[MR4] = {MRS_7(FWD_ENTRY, 2, 4)};
static const fwd_fn *const fwd_table[2][4] = {{fwd_s1_1, fwd_s1_2, fwd_s1_3, fwd_s1_4},
                                              {fwd_s2_1, fwd_s2_2, fwd_s2_3, fwd_s2_4}};
static const int mr_max[4] = {MR1, MR2, MR3, MR4};

/* Output channels in chunks of at most 4 vectors: chunk q starts at
 * 64*q and has nv vectors. */
static int chunk_nv(int64_t o, int64_t q) { return (int)min64(4, o / 16 - 4 * q); }

/* Row tiling of chunk nv: tiles of mr pixels (the last may overrun ow). */
static void tiling(int64_t ow, int nv, int64_t *ntile, int64_t *mr)
{
    *ntile = cdiv(ow, mr_max[nv - 1]);
    *mr = cdiv(ow, *ntile);
}

/* Packs w as the chunks' [tap][16][nv*16] panels in float32: element (tap =
 * (kh, kw, cb), c, j) is kernel entry [kh][kw][cb*16 + c][o0 + j] of the
 * spec's kernel, which is w itself, or, when flip, w of the convolution
 * being differentiated ([kh][kw][o][c] stored as [KH-1-kh][KW-1-kw][c][o]).
 * wf: the kernel widened to float32 (w itself when float32). */
static void pack_weights(const spec *s, const float *wf, const kernel_map *km, float *dst)
{
    const int64_t taps = s->kh * s->kw, C = s->c, O = s->o;
    for (int64_t q = 0; q * 64 < O; q++) {
        const int nv = chunk_nv(O, q);
        float *p = dst + taps * C * 64 * q;
        for (int64_t t = 0; t < taps; t++)
            for (int64_t c = 0; c < C; c++)
                for (int64_t j = 0; j < nv * 16; j++) {
                    const int64_t o = 64 * q + j;
                    int64_t src;
                    if (!km) {
                        src = (t * C + c) * O + o;
                    } else {
                        const int64_t r = km->r0 + (s->kh - 1 - t / s->kw) * km->rs;
                        const int64_t cc = km->c0 + (s->kw - 1 - t % s->kw) * km->cs;
                        src = ((r * km->kwo + cc) * O + o) * C + c;
                    }
                    *p++ = wf[src];
                }
    }
}

/* The kernel as float32: w itself, or widened into scratch; NULL if out of
 * memory. */
static const float *widen_kernel(const void *w, mp_dtype wt, int64_t n, float *tmp)
{
    if (wt == MP_F32) return w;
    mp_convert(tmp, MP_F32, w, wt, (size_t)n);
    return tmp;
}

/* The convolution of spec s with the packed kernel wbuf (pack_weights),
 * through epilogue e (whose ldc is the output's channel count). */
static mp_status run_forward(const spec *s, const float *wbuf, const gemm_epilogue *e)
{
    const int64_t taps = s->kh * s->kw, nb = cdiv(s->c, 16);
    const int64_t ntap = taps * nb;
    const int cn = (int)min64(s->c, 16);
    const int64_t nq = cdiv(s->o, 64);
    int64_t cover = 0;
    for (int64_t q = 0; q < nq; q++) {
        int64_t nt, mr;
        tiling(s->ow, chunk_nv(s->o, q), &nt, &mr);
        if (nt * mr > cover) cover = nt * mr;
    }
    const int64_t hp = (s->oh - 1) * s->sh + s->kh, wp = (cover - 1) * s->sw + s->kw;
    int64_t *xoff = mp_scratch(SLOT_TAPS, (size_t)ntap * sizeof(int64_t));
    if (!xoff) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for the kernel");
    for (int64_t kh = 0, t = 0; kh < s->kh; kh++)
        for (int64_t kw = 0; kw < s->kw; kw++)
            for (int64_t b = 0; b < nb; b++, t++) xoff[t] = b * hp * wp * 16 + (kh * wp + kw) * 16;

    const double flops = 2.0 * (double)(s->n * s->oh * s->ow) * (double)(s->o * taps * s->c);
    int nt = flops < 4e6 ? 1 : mp_num_threads();
    if (nt > s->n) nt = (int)s->n;
    const fwd_fn *const *table = fwd_table[s->sw - 1];
    const size_t image = (size_t)(nb * hp * wp * 16) * sizeof(float);
    /* float32 out with nothing to apply: tiles go straight to y */
    const bool plain = e->c_type == MP_F32 && e->alpha == 1.0f && e->beta == 0.0f && !e->bias &&
                       e->act == MP_ACT_NONE;
    const size_t ys = mp_dtype_size(e->c_type);
    bool ok = true;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(&& : ok)
    for (int64_t n = 0; n < s->n; n++) {
        float *buf = mp_scratch(SLOT_IMAGE, image);
        float *row = mp_scratch(SLOT_ROW, (size_t)(s->w * s->c) * sizeof(float));
        if (!buf || !row) {
            ok = false;
            continue;
        }
        _Alignas(64) float tile[MR1 * 16];
        pad_image(s, n, hp, wp, row, buf);
        for (int64_t q = 0; q < nq; q++) {
            const int nv = chunk_nv(s->o, q);
            int64_t ntile, mr;
            tiling(s->ow, nv, &ntile, &mr);
            const fwd_fn kern = table[nv - 1][mr - 1];
            const float *wq = wbuf + taps * s->c * 64 * q;
            for (int64_t oy = 0; oy < s->oh; oy++) {
                /* the output row as a matrix of pixels: row i at c + i*ldc */
                gemm_epilogue er = *e;
                er.c = (char *)e->c +
                       (size_t)(((n * s->yh + s->y0 + oy * s->ys) * s->yw + s->z0) * e->ldc) * ys;
                er.ldc = s->zs * e->ldc;
                for (int64_t tt = 0; tt < ntile; tt++) {
                    const int64_t ox = tt * mr;
                    const float *xt = buf + (oy * s->sh * wp + ox * s->sw) * 16;
                    if (plain && ox + mr <= s->ow) { /* a whole tile: into y */
                        kern(ntap, cn, xoff, xt, wq, (float *)er.c + ox * er.ldc + 64 * q, er.ldc);
                        continue;
                    }
                    kern(ntap, cn, xoff, xt, wq, tile, nv * 16);
                    mp_gemm_epilogue_avx512(&er, tile, nv * 16, ox, 64 * q, min64(mr, s->ow - ox),
                                            nv * 16);
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
    const spec s = {x,     xt,    g->n,  g->h,  g->w,  g->c,  g->oh, g->ow, g->o, g->kh, g->kw,
                    g->sh, g->sw, g->pt, g->pl, g->oh, g->ow, 0,     0,     1,    1};
    const gemm_epilogue e = {alpha_of(g), 0.0f, y, yt, g->o, bias, act, false};
    const int64_t nw = g->kh * g->kw * g->c * g->o;
    float *wbuf = mp_scratch(SLOT_W, (size_t)(2 * nw) * sizeof(float));
    if (!wbuf) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for the kernel");
    pack_weights(&s, widen_kernel(w, wt, nw, wbuf + nw), NULL, wbuf);
    return run_forward(&s, wbuf, &e);
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
    const float *wf = widen_kernel(w, wt, nw, wbuf + nw);
    const gemm_epilogue e = {alpha_of(g), 0.0f, dx, dxt, g->c, NULL, MP_ACT_NONE, false};
    const size_t pixel = (size_t)g->c * mp_dtype_size(dxt);
    for (int64_t ph = 0; ph < g->sh && ph < g->h; ph++)
        for (int64_t pw = 0; pw < g->sw && pw < g->w; pw++) {
            const int64_t hh = cdiv(g->h - ph, g->sh), ww = cdiv(g->w - pw, g->sw);
            const int64_t kh0 = (ph + g->pt) % g->sh, kw0 = (pw + g->pl) % g->sw;
            const int64_t pkh = kh0 < g->kh ? cdiv(g->kh - kh0, g->sh) : 0;
            const int64_t pkw = kw0 < g->kw ? cdiv(g->kw - kw0, g->sw) : 0;
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
            const int64_t ppt = (ph + g->pt - kh0) / g->sh, ppl = (pw + g->pl - kw0) / g->sw;
            const spec s = {dy,  dyt,   g->n, g->oh, g->ow,         g->o,          hh,   ww,   g->c,
                            pkh, pkw,   1,    1,     pkh - 1 - ppt, pkw - 1 - ppl, g->h, g->w, ph,
                            pw,  g->sh, g->sw};
            const kernel_map km = {g->kw, kh0, kw0, g->sh, g->sw};
            pack_weights(&s, wf, &km, wbuf);
            mp_status st = run_forward(&s, wbuf, &e);
            if (st) return st;
        }
    return MP_OK;
}

/* ---------------------------------------------------------------- filter */

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
static const int filt_cr[4] = {16, 8, 4, 4};
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
    const spec s = {x,     xt,    g->n,  g->h,  g->w,  g->c,  g->oh, g->ow, g->o, g->kh, g->kw,
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
    const size_t image = (size_t)(cdiv(g->c, 16) * plane) * sizeof(float);
    const size_t dyes = mp_dtype_size(dyt);
    /* rows per band: its input rows and output gradient in about 24 KiB */
    const int64_t band_bytes = (g->sh * wp * cdiv(g->c, 16) * 16 + g->ow * g->o) * 4;
    const int64_t band = band_bytes > 0 ? (int64_t)1 + (24 << 10) / band_bytes : 1;
    bool ok = true;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(&& : ok)
    for (int64_t j = 0; j < nch; j++) {
        float *buf = mp_scratch(SLOT_IMAGE, image);
        float *row = mp_scratch(SLOT_ROW, (size_t)(g->w * g->c + npix * g->o) * sizeof(float));
        if (!buf || !row) {
            ok = false;
            continue;
        }
        float *p = part + j * nw;
        const int64_t n0 = g->n * j / nch, n1 = g->n * (j + 1) / nch;
        for (int64_t n = n0; n < n1; n++) {
            pad_image(&s, n, hp, wp, row, buf);
            const char *dyn = (const char *)dy + (size_t)(n * npix * g->o) * dyes;
            const float *dyf = (const float *)dyn;
            if (dyt != MP_F32) {
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
                    const int nv = chunk_nv(g->o, q), cr = g->c < 16 ? 1 : filt_cr[nv - 1];
                    for (int64_t kh = 0; kh < g->kh; kh++)
                        for (int64_t kw = 0; kw < g->kw; kw++)
                            for (int64_t c = 0; c < g->c; c += cr) {
                                const float *xb = buf + (c / 16) * plane +
                                                  ((y0 * g->sh + kh) * wp + kw) * 16 + c % 16;
                                float *pp = p + ((kh * g->kw + kw) * g->c + c) * g->o + 64 * q;
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
mp_status mp_conv_direct_filter(const mp_conv_geom *g, const void *x, mp_dtype xt, const void *dy,
                                mp_dtype dyt, float *dw, bool accumulate)
{
    (void)g, (void)x, (void)xt, (void)dy, (void)dyt, (void)dw, (void)accumulate;
    return mp_set_error(MP_ERR_UNSUPPORTED, "conv: no direct kernels on this CPU");
}
mp_status mp_conv_direct_data(const mp_conv_geom *g, const void *dy, mp_dtype dyt, const void *w,
                              mp_dtype wt, void *dx, mp_dtype dxt)
{
    (void)g, (void)dy, (void)dyt, (void)w, (void)wt, (void)dx, (void)dxt;
    return mp_set_error(MP_ERR_UNSUPPORTED, "conv: no direct kernels on this CPU");
}

#endif
