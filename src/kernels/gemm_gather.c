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

bool mp_gemm_pack_gather(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0, int64_t nd,
                         int W, gemm_fmt fmt, void *dst)
{
    const gemm_gather *ga = op->gather;
    coord *dc = mp_scratch(7, (size_t)nd * sizeof *dc), wc[64];
    if (!dc || W > 64) return false;
    for (int64_t d = 0; d < nd; d++) dc[d] = depth_coord(ga, d0 + d);
    const bool f32 = fmt == GEMM_FMT_F32;
    const int64_t dpad = f32 ? nd : nd + (nd & 1);
    for (int64_t w = 0; w < nw; w += W) {
        int64_t nv = nw - w < W ? nw - w : W;
        for (int64_t i = 0; i < nv; i++) wc[i] = width_coord(ga, w0 + w + i);
        if (f32) {
            float *p = (float *)dst + w / W * dpad * W;
            for (int64_t d = 0; d < nd; d++) {
                for (int64_t i = 0; i < nv; i++) {
                    int64_t o = offset(ga, wc[i], dc[d]);
                    p[d * W + i] = o < 0 ? 0.0f : mp_gemm_load_f32(op->base, op->type, o);
                }
                for (int64_t i = nv; i < W; i++) p[d * W + i] = 0.0f;
            }
        } else { /* pairs along the depth: panel[d / 2][i][d % 2] */
            uint16_t *p = (uint16_t *)dst + w / W * dpad * W;
            for (int64_t d = 0; d < dpad; d++) {
                uint16_t *q = p + (d / 2) * 2 * W + (d & 1);
                for (int64_t i = 0; i < W; i++) {
                    int64_t o = i < nv && d < nd ? offset(ga, wc[i], dc[d]) : -1;
                    q[2 * i] = o < 0 ? 0 : mp_gemm_load_bf16(op->base, op->type, o);
                }
            }
        }
    }
    return true;
}
