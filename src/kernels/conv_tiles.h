/* conv_tiles.h - convolutions of bfloat16 operands as one GEMM on the AMX
 * tiles over a copy of the input that stacks each output row's kh input
 * rows (conv_tiles.c). conv.c takes this route where mp_conv_tiles_ok says
 * so, before the direct kernels. */
#ifndef MP_CONV_TILES_H
#define MP_CONV_TILES_H

#include "kernels/conv.h"

/* Whether the route takes this geometry and these operand types (a: the
 * image, or dy for the data gradient; b: the kernel): both bfloat16, the
 * GEMM's choice for bf16 x bf16 the AMX tiles, dilation 1, strides 1 or 2
 * (the data gradient: no larger than the kernel), and the channels the
 * product runs over (c; o for the data gradient) a multiple of 16 (of 32
 * for a 1x1 kernel). */
bool mp_conv_tiles_ok(const mp_conv_geom *g, mp_dtype a, mp_dtype b, bool data);

/* As mp_conv2d_forward with bfloat16 x and w. */
mp_status mp_conv_tiles_forward(const mp_conv_geom *g, const void *x, const void *w,
                                const float *bias, mp_activation act, void *y, mp_dtype yt);

/* As mp_conv2d_backward_filter with bfloat16 x and dy, stride 1, c a
 * multiple of 32 and kh * c of 64 (mp_conv_tiles_filter_ok;
 * conv_tiles_filter.c), unless x
 * holds a non-finite value: then *taken is false and nothing was written
 * (the route's extra products would turn it into NaN where the exact sum
 * is not). */
bool mp_conv_tiles_filter_ok(const mp_conv_geom *g, mp_dtype a, mp_dtype b);
mp_status mp_conv_tiles_filter(const mp_conv_geom *g, const void *x, const void *dy, float *dw,
                               bool accumulate, bool *taken);

/* As mp_conv2d_backward_data with bfloat16 dy and w. */
mp_status mp_conv_tiles_data(const mp_conv_geom *g, const void *dy, const void *w, void *dx,
                             mp_dtype dxt);

#endif
