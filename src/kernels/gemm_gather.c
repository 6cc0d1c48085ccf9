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
 * along the depth panel[d / 2][i][d % 2] (an AMX A panel is W panels of
 * one row: the caller packs it so). */
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
/* `run` (<= RUN_MAX) consecutive elements of op from element o, widened
 * exactly to float32 (tmp holds them unless the data already is float32). */
#define RUN_MAX 512
static const float *run_f32(const gemm_operand *op, int64_t o, int64_t run, float *tmp)
{
    if (op->type == MP_F32) return (const float *)op->base + o;
    mp_convert(tmp, MP_F32, (const char *)op->base + (size_t)o * mp_dtype_size(op->type), op->type,
               (size_t)run);
    return tmp;
}

/* The same as bf16 bits, for the bf16 panels (bf16 and fp8 data only, which
 * bf16 holds exactly). */
static const uint16_t *run_bf16(const gemm_operand *op, int64_t o, int64_t run, uint16_t *tmp)
{
    if (op->type == MP_BF16) return (const uint16_t *)op->base + o;
    mp_convert(tmp, MP_BF16, (const char *)op->base + (size_t)o * mp_dtype_size(op->type), op->type,
               (size_t)run);
    return tmp;
}

/* Stores a run at depth d.., row i of a panel, with `step` between depths
 * (W for the depth runs) or along the rows (1 for the width runs): zeros
 * when o < 0. */
static void store_run(const gemm_operand *op, gemm_fmt fmt, int W, void *panel, int64_t d,
                      int64_t i, int64_t run, int64_t o, bool along_depth)
{
    float tf[RUN_MAX];
    uint16_t tb[RUN_MAX];
    for (int64_t c = 0; c < run; c += RUN_MAX) {
        int64_t n = run - c < RUN_MAX ? run - c : RUN_MAX;
        int64_t dd = along_depth ? d + c : d, ii = along_depth ? i : i + c;
        if (fmt == GEMM_FMT_F32) {
            float *pf = (float *)panel + dd * W + ii;
            int64_t step = along_depth ? W : 1;
            if (o < 0) {
                for (int64_t t = 0; t < n; t++) pf[t * step] = 0.0f;
            } else if (op->type == MP_BF16) { /* widened inline: a shift */
                const uint16_t *v = (const uint16_t *)op->base + o + c;
                for (int64_t t = 0; t < n; t++) pf[t * step] = mp_bits_f32((uint32_t)v[t] << 16);
            } else {
                const float *v = run_f32(op, o + c, n, tf);
                for (int64_t t = 0; t < n; t++) pf[t * step] = v[t];
            }
        } else { /* panel[d / 2][i][d % 2] */
            uint16_t *pb = panel;
            const uint16_t *v = o < 0 ? NULL : run_bf16(op, o + c, n, tb);
            for (int64_t t = 0; t < n; t++) {
                int64_t de = along_depth ? dd + t : dd, ie = along_depth ? ii : ii + t;
                pb[(de / 2) * 2 * W + 2 * ie + (de & 1)] = v ? v[t] : 0;
            }
        }
    }
}

/* A window gather into float32 panels, the hot case. Row r of the width is
 * a pixel (n, y, x) of a grid of gh x gw; depth entry (a, b, ch) reads the
 * source image [n, sh_, sw_, sc] at (y*sy + oy + a*ay, x*sx + ox + b*ax, ch),
 * zero outside it. Image patches: the output grid, strides, -padding, the
 * dilations. Output-gradient patches of a stride-1 convolution: the input
 * grid, 1, +padding, -dilations (a transposed convolution). */
typedef struct {
    int64_t gh, gw;         /* grid of the width's pixels */
    int64_t sh_, sw_, sc;   /* source image */
    int64_t sy, sx, oy, ox; /* row -> window corner */
    int64_t ay, ax, kw;     /* kernel entry -> offset from the corner */
} window;

static inline float widen(const void *base, mp_dtype t, int64_t i)
{
    switch (t) {
    case MP_F32:
        return ((const float *)base)[i];
    case MP_BF16:
        return mp_bits_f32((uint32_t)((const uint16_t *)base)[i] << 16);
    default:
        return mp_gemm_load_f32(base, t, i);
    }
}

static void pack_window(const gemm_operand *op, const window *v, int64_t w0, int64_t nw, int64_t d0,
                        int64_t nd, int W, float *dst)
{
    const mp_dtype t = op->type;
    int64_t base[64], top[64], left[64];
    for (int64_t w = 0; w < nw; w += W) {
        float *panel = dst + w / W * nd * W;
        int64_t nv = nw - w < W ? nw - w : W;
        for (int64_t i = 0; i < nv; i++) {
            coord p = split(w0 + w + i, v->gh, v->gw);
            top[i] = p.b * v->sy + v->oy;
            left[i] = p.c * v->sx + v->ox;
            base[i] = ((p.a * v->sh_ + top[i]) * v->sw_ + left[i]) * v->sc;
        }
        for (int64_t d = 0; d < nd;) {
            coord k = split(d0 + d, v->kw, v->sc);
            int64_t run = v->sc - k.c < nd - d ? v->sc - k.c : nd - d;
            int64_t dy = k.a * v->ay, dx = k.b * v->ax, delta = (dy * v->sw_ + dx) * v->sc + k.c;
            for (int64_t i = 0; i < W; i++) {
                float *pf = panel + d * W + i;
                int64_t y = i < nv ? top[i] + dy : -1, x = i < nv ? left[i] + dx : -1;
                if (y < 0 || y >= v->sh_ || x < 0 || x >= v->sw_) {
                    for (int64_t e = 0; e < run; e++) pf[e * W] = 0.0f;
                } else if (t == MP_F32) {
                    const float *src = (const float *)op->base + base[i] + delta;
                    for (int64_t e = 0; e < run; e++) pf[e * W] = src[e];
                } else if (t == MP_BF16) {
                    const uint16_t *src = (const uint16_t *)op->base + base[i] + delta;
                    for (int64_t e = 0; e < run; e++)
                        pf[e * W] = mp_bits_f32((uint32_t)src[e] << 16);
                } else if (run >= 8 && run <= RUN_MAX) { /* the SIMD decoders pay off */
                    float tf[RUN_MAX];
                    const float *src = run_f32(op, base[i] + delta, run, tf);
                    for (int64_t e = 0; e < run; e++) pf[e * W] = src[e];
                } else {
                    for (int64_t e = 0; e < run; e++)
                        pf[e * W] = widen(op->base, t, base[i] + delta + e);
                }
            }
            d += run;
        }
    }
}

/* The window of a view, when it has one (patches; output-gradient patches
 * of a stride-1 convolution). */
static bool window_of(const gemm_gather *ga, window *v)
{
    const mp_conv_geom *g = ga->g;
    if (ga->view == GATHER_PATCHES) {
        *v = (window){g->oh, g->ow,  g->h,   g->w,  g->c,  g->sh,
                      g->sw, -g->pt, -g->pl, g->dh, g->dw, g->kw};
        return true;
    }
    if (ga->view == GATHER_DY_PATCHES && g->sh == 1 && g->sw == 1) {
        *v = (window){g->h, g->w, g->oh, g->ow, g->o, 1, 1, g->pt, g->pl, -g->dh, -g->dw, g->kw};
        return true;
    }
    return false;
}

static void pack_depth_runs(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0, int64_t nd,
                            int W, gemm_fmt fmt, void *dst, int64_t dpad)
{
    const gemm_gather *ga = op->gather;
    window v;
    if (fmt == GEMM_FMT_F32 && window_of(ga, &v)) {
        pack_window(op, &v, w0, nw, d0, nd, W, dst);
        return;
    }
    const int64_t channels = ga->view == GATHER_PATCHES ? ga->g->c : ga->g->o;
    const size_t es = fmt == GEMM_FMT_F32 ? 4 : 2;
    coord wc[64];
    for (int64_t w = 0; w < nw; w += W) {
        char *panel = (char *)dst + (size_t)(w / W * dpad * W) * es;
        int64_t nv = nw - w < W ? nw - w : W;
        for (int64_t i = 0; i < nv; i++) wc[i] = width_coord(ga, w0 + w + i);
        for (int64_t d = 0; d < nd;) {
            coord k = depth_coord(ga, d0 + d);
            int64_t run = channels - k.c < nd - d ? channels - k.c : nd - d;
            for (int64_t i = 0; i < W; i++)
                store_run(op, fmt, W, panel, d, i, run, i < nv ? run_start(ga, wc[i], k) : -1,
                          true);
            d += run;
        }
        for (int64_t d = nd; d < dpad; d++) /* bf16 pairs' and AMX tiles' padding */
            for (int64_t i = 0; i < W; i++) put(panel, fmt, W, d, i, op, -1);
    }
}

/* Transposed patches: along the width, each kernel entry's channels are
 * contiguous in memory for every pixel of the depth. */
static void pack_width_runs(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0, int64_t nd,
                            int W, gemm_fmt fmt, void *dst, int64_t dpad)
{
    const gemm_gather *ga = op->gather;
    const mp_conv_geom *g = ga->g;
    const size_t es = fmt == GEMM_FMT_F32 ? 4 : 2;
    /* the depth's pixels once per call: window corner and base offset */
    int64_t top[RUN_MAX], left[RUN_MAX], base[RUN_MAX];
    for (int64_t d = 0; d < nd && d < RUN_MAX; d++) {
        coord p = split(d0 + d, g->oh, g->ow);
        top[d] = p.b * g->sh - g->pt;
        left[d] = p.c * g->sw - g->pl;
        base[d] = ((p.a * g->h + top[d]) * g->w + left[d]) * g->c;
    }
    for (int64_t w = 0; w < nw; w += W) {
        char *panel = (char *)dst + (size_t)(w / W * dpad * W) * es;
        int64_t nv = nw - w < W ? nw - w : W;
        /* the panel's width as runs of one kernel entry's channels */
        for (int64_t i = 0; i < W;) {
            coord k = i < nv ? split(w0 + w + i, g->kw, g->c) : (coord){0, 0, 0};
            int64_t run = i < nv ? g->c - k.c : W - i;
            if (i < nv && run > nv - i) run = nv - i;
            int64_t dy = k.a * g->dh, dx = k.b * g->dw, delta = (dy * g->w + dx) * g->c + k.c;
            for (int64_t d = 0; d < dpad; d++) {
                int64_t o = -1;
                if (i < nv && d < nd && nd <= RUN_MAX) {
                    int64_t y = top[d] + dy, x = left[d] + dx;
                    if (y >= 0 && y < g->h && x >= 0 && x < g->w) o = base[d] + delta;
                } else if (i < nv && d < nd) {
                    o = patch_offset(g, split(d0 + d, g->oh, g->ow), k);
                }
                store_run(op, fmt, W, panel, d, i, run, o, false);
            }
            i += run;
        }
    }
}

bool mp_gemm_pack_gather(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0, int64_t nd,
                         int W, gemm_fmt fmt, void *dst)
{
    const gemm_gather *ga = op->gather;
    const int64_t dpad = mp_gemm_kpad(fmt, nd);
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
