/* conv.h - 2-D convolution (channels-last) as implicit GEMMs: image patches
 * are gathered straight into the GEMM's packed panels (no im2col buffer), so
 * every input dtype the GEMM takes works here, with float32 accumulation
 * and the GEMM's fused bias/activation/cast epilogue.
 *
 *   forward   y[n,oh,ow,o] = sum_{kh,kw,c} x[n, oh*sh-pt+kh*dh, ow*sw-pl+kw*dw, c] * w[kh,kw,c,o]
 *             (zero outside the image): C[M=N*OH*OW, O] = patches[M, K=KH*KW*C] * W[K, O]
 *   filter    dW[K, O] = patches^T[K, M] * dY[M, O]
 *   data      dX[N*H*W, C] = dYpatches[N*H*W, KH*KW*O] * W'[KH*KW*O, C], where the
 *             dY patch of input pixel (ih, iw) holds dy at oh = (ih+pt-kh*dh)/sh when
 *             that divides exactly and lies in the output (a transposed convolution)
 *
 * Each output element is one dot product summed in the GEMM's fixed order,
 * so results do not depend on the thread count.
 *
 * On AVX-512, channel counts that are multiples of 16 (inputs of fewer than
 * 16 channels too: an image) with dilation 1 and strides 1 or 2 take direct
 * kernels instead (conv_direct.h): the same three products, every input
 * dtype widened exactly to float32, each element summed in an order fixed
 * by the shape. */
#ifndef MP_CONV_H
#define MP_CONV_H

#include "core/internal.h"

typedef struct {
    int64_t n, h, w, c;     /* input [n, h, w, c] */
    int64_t kh, kw, o;      /* kernel [kh, kw, c, o] */
    int64_t sh, sw, dh, dw; /* strides and dilations (>= 1) */
    int64_t pt, pl;         /* zero rows above / columns left of the image */
    int64_t oh, ow;         /* output [n, oh, ow, o] */
    float alpha;            /* the sums' factor before bias and activation (per-tensor
                             * float8's 1/(scale_a scale_b)); 0 is read as 1 */
} mp_conv_geom;

/* The factor g's sums take before bias and activation (alpha 0 is 1). */
static inline float mp_conv_alpha(const mp_conv_geom *g)
{
    return g->alpha != 0.0f ? g->alpha : 1.0f;
}

/* Phase (ph, pw) of a strided convolution's data gradient (dilation 1):
 * the input pixels (ph + sh a, pw + sw b), hh x ww of them, take gradient
 * only from the kernel's taps (kh0 + i sh, kw0 + j sw), pkh x pkw of them
 * (0: none reaches them), from output row a + ppt - i and column b + ppl -
 * j: a stride-1 data gradient with that sub-kernel. Stride 1: one phase,
 * the whole kernel. */
typedef struct {
    int64_t hh, ww, kh0, kw0, pkh, pkw, ppt, ppl;
} mp_conv_phase;

static inline mp_conv_phase mp_conv_phase_of(const mp_conv_geom *g, int64_t ph, int64_t pw)
{
    mp_conv_phase p;
    p.hh = (g->h - ph + g->sh - 1) / g->sh;
    p.ww = (g->w - pw + g->sw - 1) / g->sw;
    p.kh0 = (ph + g->pt) % g->sh;
    p.kw0 = (pw + g->pl) % g->sw;
    p.pkh = p.kh0 < g->kh ? (g->kh - p.kh0 + g->sh - 1) / g->sh : 0;
    p.pkw = p.kw0 < g->kw ? (g->kw - p.kw0 + g->sw - 1) / g->sw : 0;
    p.ppt = (ph + g->pt - p.kh0) / g->sh;
    p.ppl = (pw + g->pl - p.kw0) / g->sw;
    return p;
}

/* Keras's output size and padding: `same` gives ceil(in / stride) with the
 * odd pad at the end (bottom/right); `valid` gives floor((in - span) /
 * stride) + 1 with span = (k - 1) * dilation + 1. Fills oh, ow, pt, pl from
 * the rest; MP_ERR_INVALID when the kernel does not fit. */
mp_status mp_conv_geom_init(mp_conv_geom *g, bool same);

/* y = act(conv(x, w) + bias), y in yt. bias: o floats or NULL. */
mp_status mp_conv2d_forward(const mp_conv_geom *g, const void *x, mp_dtype xt, const void *w,
                            mp_dtype wt, const float *bias, mp_activation act, void *y,
                            mp_dtype yt);
/* dw (float32 [kh, kw, c, o]) = (accumulate ? dw : 0) + patches(x)^T dy. */
mp_status mp_conv2d_backward_filter(const mp_conv_geom *g, const void *x, mp_dtype xt,
                                    const void *dy, mp_dtype dyt, float *dw, bool accumulate);
/* dx (in dxt, [n, h, w, c]) = the gradient with respect to x. */
mp_status mp_conv2d_backward_data(const mp_conv_geom *g, const void *dy, mp_dtype dyt,
                                  const void *w, mp_dtype wt, void *dx, mp_dtype dxt);

#endif
