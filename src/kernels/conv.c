/* conv.c - 2-D convolution (NHWC, kernel [kh, kw, c, o]) forward, filter
 * gradient and data gradient, each one GEMM over gathered operands (see
 * conv.h for the three products), or the AMX tiles' route (conv_tiles.h)
 * or the direct kernels (conv_direct.h) where they apply. */
#include <string.h>

#include "kernels/conv.h"
#include "kernels/conv_direct.h"
#include "kernels/conv_tiles.h"
#include "kernels/gemm_internal.h"

static int64_t out_size(int64_t in, int64_t k, int64_t stride, int64_t dil, bool same,
                        int64_t *pad_before)
{
    int64_t span = (k - 1) * dil + 1;
    if (!same) {
        *pad_before = 0;
        return in >= span ? (in - span) / stride + 1 : 0;
    }
    int64_t out = (in + stride - 1) / stride;
    int64_t total = (out - 1) * stride + span - in;
    if (total < 0) total = 0;
    *pad_before = total / 2; /* the odd one goes after, as in Keras/TensorFlow */
    return out;
}

mp_status mp_conv_geom_init(mp_conv_geom *g, bool same)
{
    if (g->n < 1 || g->h < 1 || g->w < 1 || g->c < 1 || g->kh < 1 || g->kw < 1 || g->o < 1 ||
        g->sh < 1 || g->sw < 1 || g->dh < 1 || g->dw < 1)
        return mp_set_error(MP_ERR_INVALID, "conv: sizes, strides and dilations must be >= 1");
    const int64_t big = (int64_t)1 << 24;
    if (g->h > big || g->w > big || g->c > big || g->o > big || g->kh > big || g->kw > big ||
        g->sh > big || g->sw > big || g->dh > big || g->dw > big)
        return mp_set_error(MP_ERR_INVALID, "conv: a size above 2^24");
    g->oh = out_size(g->h, g->kh, g->sh, g->dh, same, &g->pt);
    g->ow = out_size(g->w, g->kw, g->sw, g->dw, same, &g->pl);
    if (g->oh < 1 || g->ow < 1)
        return mp_set_error(
            MP_ERR_INVALID,
            "conv: a %lldx%lld kernel (dilation %lldx%lld) does not fit a %lldx%lld "
            "input without padding",
            (long long)g->kh, (long long)g->kw, (long long)g->dh, (long long)g->dw, (long long)g->h,
            (long long)g->w);
    return MP_OK;
}

mp_status mp_conv2d_forward(const mp_conv_geom *g, const void *x, mp_dtype xt, const void *w,
                            mp_dtype wt, const float *bias, mp_activation act, void *y, mp_dtype yt)
{
    if (mp_conv_tiles_ok(g, xt, wt, false)) return mp_conv_tiles_forward(g, x, w, bias, act, y, yt);
    if (mp_conv_direct_ok(g)) return mp_conv_direct_forward(g, x, xt, w, wt, bias, act, y, yt);
    const gemm_gather patches = {GATHER_PATCHES, g};
    const int64_t m = g->n * g->oh * g->ow, k = g->kh * g->kw * g->c;
    gemm_operand a = {x, xt, 0, 0, &patches};
    gemm_operand b = {w, wt, 1, g->o, NULL}; /* W [k, o]: width o, depth k */
    gemm_epilogue e = {mp_conv_alpha(g), 0.0f, y, yt, g->o, bias, act, false, NULL};
    return mp_gemm_run(m, g->o, k, &a, &b, &e);
}

mp_status mp_conv2d_backward_filter(const mp_conv_geom *g, const void *x, mp_dtype xt,
                                    const void *dy, mp_dtype dyt, float *dw, bool accumulate)
{
    if (mp_conv_tiles_filter_ok(g, xt, dyt)) {
        bool taken;
        mp_status s = mp_conv_tiles_filter(g, x, dy, dw, accumulate, &taken);
        if (s || taken) return s;
    }
    if (mp_conv_direct_ok(g)) return mp_conv_direct_filter(g, x, xt, dy, dyt, dw, accumulate);
    const gemm_gather patches_t = {GATHER_PATCHES_T, g};
    const int64_t m = g->kh * g->kw * g->c, k = g->n * g->oh * g->ow;
    gemm_operand a = {x, xt, 0, 0, &patches_t};
    gemm_operand b = {dy, dyt, 1, g->o, NULL}; /* dY [pixels, o]: width o, depth pixels */
    const float beta = accumulate ? 1.0f : 0.0f;
    gemm_epilogue e = {mp_conv_alpha(g), beta, dw, MP_F32, g->o, NULL, MP_ACT_NONE, false, NULL};
    return mp_gemm_run(m, g->o, k, &a, &b, &e);
}

/* The data gradient of a strided convolution, one phase (ph, pw) at a time:
 * the input pixels (ph + sh*a, pw + sw*b) take gradient only from the
 * kernel rows kh = kh0 + j*sh and columns kw = kw0 + l*sw, kh0 = (ph + pt)
 * mod sh, from output row oh = a + (ph + pt - kh0)/sh - j. Each phase is a
 * stride-1 data gradient with that sub-kernel, so no product with a zero is
 * computed (the plain gather would waste sh*sw of the work). Dilation 1. */
static mp_status backward_data_phases(const mp_conv_geom *g, const void *dy, mp_dtype dyt,
                                      const void *w, mp_dtype wt, void *dx, mp_dtype dxt)
{
    const size_t xs = mp_dtype_size(dxt), ws = mp_dtype_size(wt);
    const size_t pixel = (size_t)g->c * xs;
    for (int64_t ph = 0; ph < g->sh && ph < g->h; ph++)
        for (int64_t pw = 0; pw < g->sw && pw < g->w; pw++) {
            const mp_conv_phase phase = mp_conv_phase_of(g, ph, pw);
            const int64_t kh0 = phase.kh0, kw0 = phase.kw0;
            mp_conv_geom p = *g;
            p.h = phase.hh;
            p.w = phase.ww;
            p.kh = phase.pkh;
            p.kw = phase.pkw;
            p.sh = p.sw = 1;
            p.pt = phase.ppt;
            p.pl = phase.ppl;
            char *sub = mp_scratch(7, (size_t)(p.n * p.h * p.w) * pixel);
            char *k =
                mp_scratch(8, (size_t)((p.kh ? p.kh : 1) * (p.kw ? p.kw : 1) * g->c * g->o) * ws);
            if (!sub || !k) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for a phase");
            if (p.kh == 0 || p.kw == 0) {
                memset(sub, 0, (size_t)(p.n * p.h * p.w) * pixel); /* no tap reaches it */
            } else {
                for (int64_t j = 0; j < p.kh; j++) /* the phase's sub-kernel */
                    for (int64_t l = 0; l < p.kw; l++)
                        memcpy(k + (size_t)((j * p.kw + l) * g->c * g->o) * ws,
                               (const char *)w +
                                   (size_t)(((kh0 + j * g->sh) * g->kw + kw0 + l * g->sw) * g->c *
                                            g->o) *
                                       ws,
                               (size_t)(g->c * g->o) * ws);
                const gemm_gather dy_patches = {GATHER_DY_PATCHES, &p},
                                  kernel_t = {GATHER_KERNEL_T, &p};
                gemm_operand a = {dy, dyt, 0, 0, &dy_patches}, b = {k, wt, 0, 0, &kernel_t};
                gemm_epilogue e = {mp_conv_alpha(g), 0.0f,  sub, dxt, g->c, NULL,
                                   MP_ACT_NONE,      false, NULL};
                mp_status s = mp_gemm_run(p.n * p.h * p.w, g->c, p.kh * p.kw * g->o, &a, &b, &e);
                if (s) return s;
            }
            for (int64_t n = 0; n < p.n; n++) /* scatter the phase into dx */
                for (int64_t a = 0; a < p.h; a++)
                    for (int64_t b = 0; b < p.w; b++)
                        memcpy((char *)dx +
                                   (size_t)((n * g->h + ph + a * g->sh) * g->w + pw + b * g->sw) *
                                       pixel,
                               sub + (size_t)((n * p.h + a) * p.w + b) * pixel, pixel);
        }
    return MP_OK;
}

mp_status mp_conv2d_backward_data(const mp_conv_geom *g, const void *dy, mp_dtype dyt,
                                  const void *w, mp_dtype wt, void *dx, mp_dtype dxt)
{
    if (mp_conv_tiles_ok(g, dyt, wt, true)) return mp_conv_tiles_data(g, dy, w, dx, dxt);
    if (g->c % 16 == 0 && mp_conv_direct_ok(g))
        return mp_conv_direct_data(g, dy, dyt, w, wt, dx, dxt);
    if ((g->sh > 1 || g->sw > 1) && g->dh == 1 && g->dw == 1)
        return backward_data_phases(g, dy, dyt, w, wt, dx, dxt);
    const gemm_gather dy_patches = {GATHER_DY_PATCHES, g}, kernel_t = {GATHER_KERNEL_T, g};
    const int64_t m = g->n * g->h * g->w, k = g->kh * g->kw * g->o;
    gemm_operand a = {dy, dyt, 0, 0, &dy_patches};
    gemm_operand b = {w, wt, 0, 0, &kernel_t};
    gemm_epilogue e = {mp_conv_alpha(g), 0.0f, dx, dxt, g->c, NULL, MP_ACT_NONE, false, NULL};
    return mp_gemm_run(m, g->c, k, &a, &b, &e);
}
