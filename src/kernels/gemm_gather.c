/* gemm_gather.c - packing of implicit GEMM operands: the panels of a
 * convolution's patch matrices (and of its kernel seen for the data
 * gradient) are filled straight from the image, the output gradient or the
 * kernel by their geometry, with zeros for positions outside the image. The
 * layouts are those of mp_gemm_pack_generic (f32 panels, or bf16 pairs along
 * the depth), and values are widened exactly as there.
 *
 * Each view turns (w, d) into an element offset, or -1 for a zero. Depth
 * positions are split into coordinates once per call and width positions
 * once per panel, so the inner loop does only multiplies, adds and range
 * checks. */
#include "kernels/gemm_internal.h"

/* A position split into three coordinates: a pixel (n, row, column) or a
 * kernel entry (kernel row, kernel column, channel). */
typedef struct {
    int64_t a, b, c;
} coord;

static coord split(int64_t x, int64_t rows, int64_t cols)
{
    coord k;
    k.c = x % cols;
    x /= cols;
    k.b = x % rows;
    k.a = x / rows;
    return k;
}

/* Width and depth positions of a view as coordinates. */
static coord width_coord(const gemm_gather *ga, int64_t w)
{
    const mp_conv_geom *g = ga->g;
    switch (ga->view) {
    case GATHER_PATCHES:
        return split(w, g->oh, g->ow);
    case GATHER_PATCHES_T:
        return split(w, g->kw, g->c);
    case GATHER_DY_PATCHES:
        return split(w, g->h, g->w);
    default: /* GATHER_KERNEL_T: the input channel */
        return (coord){0, 0, w};
    }
}

static coord depth_coord(const gemm_gather *ga, int64_t d)
{
    const mp_conv_geom *g = ga->g;
    switch (ga->view) {
    case GATHER_PATCHES:
        return split(d, g->kw, g->c);
    case GATHER_PATCHES_T:
        return split(d, g->oh, g->ow);
    default: /* GATHER_DY_PATCHES, GATHER_KERNEL_T: (kh, kw, o) */
        return split(d, g->kw, g->o);
    }
}

/* Offset of x[n, ih, iw, ch] for output pixel p at kernel entry k, or -1
 * outside the image. */
static int64_t patch_offset(const mp_conv_geom *g, coord p, coord k)
{
    int64_t ih = p.b * g->sh - g->pt + k.a * g->dh, iw = p.c * g->sw - g->pl + k.b * g->dw;
    if (ih < 0 || ih >= g->h || iw < 0 || iw >= g->w) return -1;
    return ((p.a * g->h + ih) * g->w + iw) * g->c + k.c;
}

/* Offset of dy[n, oh, ow, o] that input pixel p fed at kernel entry k
 * (channel o), or -1 when no output took it from there. */
static int64_t dy_offset(const mp_conv_geom *g, coord p, coord k)
{
    int64_t th = p.b + g->pt - k.a * g->dh, tw = p.c + g->pl - k.b * g->dw;
    if (th < 0 || tw < 0 || th % g->sh || tw % g->sw) return -1;
    int64_t oh = th / g->sh, ow = tw / g->sw;
    if (oh >= g->oh || ow >= g->ow) return -1;
    return ((p.a * g->oh + oh) * g->ow + ow) * g->o + k.c;
}

static int64_t offset(const gemm_gather *ga, coord w, coord d)
{
    const mp_conv_geom *g = ga->g;
    switch (ga->view) {
    case GATHER_PATCHES:
        return patch_offset(g, w, d);
    case GATHER_PATCHES_T:
        return patch_offset(g, d, w);
    case GATHER_DY_PATCHES:
        return dy_offset(g, w, d);
    default: /* GATHER_KERNEL_T: w [kh, kw, c, o] */
        return ((d.a * g->kw + d.b) * g->c + w.c) * g->o + d.c;
    }
}

/* Where the contiguous channel run of kernel entry k starts for width
 * position w (a pixel), or -1 when that entry reads padding. */
static int64_t run_start(const gemm_gather *ga, coord w, coord k)
{
    return ga->view == GATHER_PATCHES ? patch_offset(ga->g, w, k) : dy_offset(ga->g, w, k);
}

/* Element (d, i) of a panel with W rows: f32 panel[d][i], or bf16 pairs
 * along the depth panel[d / 2][i][d % 2]. */
static inline void put(void *panel, gemm_fmt fmt, int W, int64_t d, int64_t i,
                       const gemm_operand *op, int64_t o)
{
    if (fmt == GEMM_FMT_F32)
        ((float *)panel)[d * W + i] = o < 0 ? 0.0f : mp_gemm_load_f32(op->base, op->type, o);
    else
        ((uint16_t *)panel)[(d / 2) * 2 * W + 2 * i + (d & 1)] =
            o < 0 ? 0 : mp_gemm_load_bf16(op->base, op->type, o);
}

/* Patches and output-gradient patches: along the depth, each kernel entry's
 * channels lie next to each other in memory, so a row is a few contiguous
 * runs (or zeros). */
/* Image patches of float32 data into float32 panels, the hot case: per row
 * the pixel's window corner, per kernel entry one offset and two range
 * checks. */
static void pack_patches_f32(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0, int64_t nd,
                             int W, float *dst)
{
    const mp_conv_geom *g = op->gather->g;
    const float *x = op->base;
    int64_t base[64], top[64], left[64];
    for (int64_t w = 0; w < nw; w += W) {
        float *panel = dst + w / W * nd * W;
        int64_t nv = nw - w < W ? nw - w : W;
        for (int64_t i = 0; i < nv; i++) {
            coord p = split(w0 + w + i, g->oh, g->ow);
            top[i] = p.b * g->sh - g->pt;
            left[i] = p.c * g->sw - g->pl;
            base[i] = ((p.a * g->h + top[i]) * g->w + left[i]) * g->c;
        }
        for (int64_t d = 0; d < nd;) {
            coord k = split(d0 + d, g->kw, g->c);
            int64_t run = g->c - k.c < nd - d ? g->c - k.c : nd - d;
            int64_t dh = k.a * g->dh, dw = k.b * g->dw, delta = (dh * g->w + dw) * g->c + k.c;
            for (int64_t i = 0; i < W; i++) {
                float *pf = panel + d * W + i;
                int64_t ih = i < nv ? top[i] + dh : -1, iw = i < nv ? left[i] + dw : -1;
                if (ih < 0 || ih >= g->h || iw < 0 || iw >= g->w) {
                    for (int64_t t = 0; t < run; t++) pf[t * W] = 0.0f;
                } else {
                    const float *src = x + base[i] + delta;
                    for (int64_t t = 0; t < run; t++) pf[t * W] = src[t];
                }
            }
            d += run;
        }
    }
}

static void pack_depth_runs(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0, int64_t nd,
                            int W, gemm_fmt fmt, void *dst, int64_t dpad)
{
    const gemm_gather *ga = op->gather;
    if (ga->view == GATHER_PATCHES && fmt == GEMM_FMT_F32 && op->type == MP_F32) {
        pack_patches_f32(op, w0, nw, d0, nd, W, dst);
        return;
    }
    const int64_t channels = ga->view == GATHER_PATCHES ? ga->g->c : ga->g->o;
    const size_t es = fmt == GEMM_FMT_F32 ? 4 : 2;
    const bool f32 = fmt == GEMM_FMT_F32 && op->type == MP_F32;
    coord wc[64];
    for (int64_t w = 0; w < nw; w += W) {
        char *panel = (char *)dst + (size_t)(w / W * dpad * W) * es;
        int64_t nv = nw - w < W ? nw - w : W;
        for (int64_t i = 0; i < nv; i++) wc[i] = width_coord(ga, w0 + w + i);
        for (int64_t d = 0; d < nd;) {
            coord k = depth_coord(ga, d0 + d);
            int64_t run = channels - k.c < nd - d ? channels - k.c : nd - d;
            for (int64_t i = 0; i < W; i++) {
                int64_t o = i < nv ? run_start(ga, wc[i], k) : -1;
                if (f32) {
                    float *pf = (float *)panel + d * W + i;
                    const float *src = (const float *)op->base + (o < 0 ? 0 : o);
                    if (o < 0)
                        for (int64_t t = 0; t < run; t++) pf[t * W] = 0.0f;
                    else
                        for (int64_t t = 0; t < run; t++) pf[t * W] = src[t];
                } else {
                    for (int64_t t = 0; t < run; t++)
                        put(panel, fmt, W, d + t, i, op, o < 0 ? -1 : o + t);
                }
            }
            d += run;
        }
        if (fmt == GEMM_FMT_BF16 && (nd & 1))
            for (int64_t i = 0; i < W; i++) put(panel, fmt, W, nd, i, op, -1);
    }
}

/* Transposed patches: along the width, each kernel entry's channels are
 * contiguous in memory for every pixel of the depth. */
static void pack_width_runs(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0, int64_t nd,
                            int W, gemm_fmt fmt, void *dst, int64_t dpad)
{
    const gemm_gather *ga = op->gather;
    const size_t es = fmt == GEMM_FMT_F32 ? 4 : 2;
    for (int64_t w = 0; w < nw; w += W) {
        char *panel = (char *)dst + (size_t)(w / W * dpad * W) * es;
        int64_t nv = nw - w < W ? nw - w : W;
        for (int64_t d = 0; d < dpad; d++) {
            coord pix = d < nd ? depth_coord(ga, d0 + d) : (coord){0, 0, 0};
            for (int64_t i = 0; i < W;) {
                coord k = i < nv ? width_coord(ga, w0 + w + i) : (coord){0, 0, 0};
                int64_t run = i < nv ? ga->g->c - k.c : W - i;
                if (run > nv - i && i < nv) run = nv - i;
                int64_t o = i < nv && d < nd ? patch_offset(ga->g, pix, k) : -1;
                if (fmt == GEMM_FMT_F32 && op->type == MP_F32) {
                    float *pf = (float *)panel + d * W + i;
                    const float *src = (const float *)op->base + o;
                    if (o < 0)
                        for (int64_t t = 0; t < run; t++) pf[t] = 0.0f;
                    else
                        for (int64_t t = 0; t < run; t++) pf[t] = src[t];
                } else {
                    for (int64_t t = 0; t < run; t++)
                        put(panel, fmt, W, d, i + t, op, o < 0 ? -1 : o + t);
                }
                i += run;
            }
        }
    }
}

bool mp_gemm_pack_gather(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0, int64_t nd,
                         int W, gemm_fmt fmt, void *dst)
{
    const gemm_gather *ga = op->gather;
    const int64_t dpad = fmt == GEMM_FMT_F32 ? nd : nd + (nd & 1);
    if (ga->view == GATHER_PATCHES || ga->view == GATHER_DY_PATCHES) {
        pack_depth_runs(op, w0, nw, d0, nd, W, fmt, dst, dpad);
        return true;
    }
    if (ga->view == GATHER_PATCHES_T) {
        pack_width_runs(op, w0, nw, d0, nd, W, fmt, dst, dpad);
        return true;
    }
    /* the kernel seen for the data gradient: small, element by element */
    for (int64_t w = 0; w < nw; w += W) {
        void *panel = (char *)dst + (size_t)(w / W * dpad * W) * (fmt == GEMM_FMT_F32 ? 4 : 2);
        int64_t nv = nw - w < W ? nw - w : W;
        for (int64_t d = 0; d < dpad; d++) {
            coord dc = d < nd ? depth_coord(ga, d0 + d) : (coord){0, 0, 0};
            for (int64_t i = 0; i < W; i++)
                put(panel, fmt, W, d, i, op,
                    i < nv && d < nd ? offset(ga, width_coord(ga, w0 + w + i), dc) : -1);
        }
    }
    return true;
}
