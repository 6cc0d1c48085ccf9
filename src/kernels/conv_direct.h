/* conv_direct.h - direct convolution kernels for channel counts that are
 * multiples of 16 (conv_direct.c, conv_direct_filter.c, one family of
 * microkernels per ISA and operand type): the output pixels of a row are
 * the microkernel's M and the output channels its N, read straight from a
 * zero-padded copy of one image, so no patch element is gathered per
 * product. conv.c takes this path where mp_conv_direct_ok says so and the
 * implicit GEMM otherwise. */
#ifndef MP_CONV_DIRECT_H
#define MP_CONV_DIRECT_H

#include "kernels/conv.h"

/* Whether the direct kernels take this geometry on this CPU: AVX2 or above,
 * c a multiple of 16 or below 16 (an image's few colour channels), o a
 * multiple of 16, dilation 1, strides 1 or 2. */
bool mp_conv_direct_ok(const mp_conv_geom *g);

/* As mp_conv2d_forward. */
mp_status mp_conv_direct_forward(const mp_conv_geom *g, const void *x, mp_dtype xt, const void *w,
                                 mp_dtype wt, const float *bias, mp_activation act, void *y,
                                 mp_dtype yt);
/* As mp_conv2d_backward_filter. */
mp_status mp_conv_direct_filter(const mp_conv_geom *g, const void *x, mp_dtype xt, const void *dy,
                                mp_dtype dyt, float *dw, bool accumulate);
/* As mp_conv2d_backward_data, where c is also a multiple of 16 (the
 * output's channel count there): per phase of the stride, a forward
 * convolution of dy with the phase's taps of the kernel, flipped and its
 * channel axes swapped. */
mp_status mp_conv_direct_data(const mp_conv_geom *g, const void *dy, mp_dtype dyt, const void *w,
                              mp_dtype wt, void *dx, mp_dtype dxt);

#endif
