/* ops.h - elementwise, row-wise and reduction kernels used by the layers.
 * Inputs and outputs may be in any float dtype; arithmetic is float32 (sums
 * float64 where stated) and each output is rounded once. */
#ifndef MP_OPS_H
#define MP_OPS_H

#include "core/internal.h"

/* y = act(x) for elementwise activations (not softmax). */
void mp_op_activation(mp_activation act, const void *x, mp_dtype xt, void *y, mp_dtype yt,
                      size_t n);
/* Which tensor the derivative needs: true = the input x, false = the output y. */
bool mp_op_activation_grad_needs_input(mp_activation act);
/* dx = dy * act'(.), `saved` being x or y as above. */
void mp_op_activation_grad(mp_activation act, const void *saved, mp_dtype st, const void *dy,
                           mp_dtype dyt, void *dx, mp_dtype dxt, size_t n);
/* o = g * relu'(y) on float32 chunks, y relu's output: the product g * 1 or
 * g * 0 (-0 and NaN alike), compare-and-multiply vector code; o may be g.
 * The one relu derivative (mp_op_activation_grad, BatchNorm's fused relu). */
void mp_op_relu_grad_f32(const float *g, const float *y, size_t n, float *o);
/* Bit i of mask (least significant first in each byte) = y[i] > 0: all a
 * relu's derivative reads of its output, in (n + 7) / 8 bytes. */
void mp_op_positive_mask(const void *y, mp_dtype yt, uint8_t *mask, size_t n);
/* dx = dy * (bit i of mask ? 1 : 0): the relu gradient from that mask, the
 * bits mp_op_activation_grad(MP_ACT_RELU, y, ...) gives (-0 and NaN alike). */
void mp_op_mask_grad(const uint8_t *mask, const void *dy, mp_dtype dyt, void *dx, mp_dtype dxt,
                     size_t n);
/* The same from fp8 codes (ct MP_F8E4M3 or MP_F8E5M2) that carry y > 0
 * (nn/quant.h, keeps_sign): element i counts as > 0 when codes[i] is 0x80
 * or decodes to more than 0; a NaN code as not. E4M3 has no infinity: a y
 * whose scaled value is +inf in float32 casts to NaN and so counts as not
 * > 0; every GEMM reading the codes reads NaN for it then, and dy there,
 * NaN or zero after such a forward, gives the same bits either way. */
void mp_op_code_mask_grad(const uint8_t *codes, mp_dtype ct, const void *dy, mp_dtype dyt, void *dx,
                          mp_dtype dxt, size_t n);
/* Row-wise softmax over `cols`, float32 inside with the row max subtracted. */
void mp_op_softmax(const void *x, mp_dtype xt, void *y, mp_dtype yt, int64_t rows, int64_t cols);
/* dx = y * (dy - sum(dy * y)) row-wise. */
void mp_op_softmax_grad(const void *y, mp_dtype yt, const void *dy, mp_dtype dyt, void *dx,
                        mp_dtype dxt, int64_t rows, int64_t cols);
/* y = a + b. */
void mp_op_add(const void *a, mp_dtype at, const void *b, mp_dtype bt, void *y, mp_dtype yt,
               size_t n);
/* y = relu(a + b) in one pass: the bits of mp_op_add followed by
 * mp_op_activation(MP_ACT_RELU), relu commuting with the rounding to yt. */
void mp_op_add_relu(const void *a, mp_dtype at, const void *b, mp_dtype bt, void *y, mp_dtype yt,
                    size_t n);
/* dst += src (one rounding to dst's dtype). */
void mp_op_accumulate(void *dst, mp_dtype dt, const void *src, mp_dtype st, size_t n);
/* y = x * mask * scale where mask is 0/1 bytes. */
void mp_op_mask_scale(const void *x, mp_dtype xt, const uint8_t *mask, float scale, void *y,
                      mp_dtype yt, size_t n);
/* out[c] (+)= sum over rows of x[r][c], summed in float64. */
void mp_op_column_sum(const void *x, mp_dtype xt, int64_t rows, int64_t cols, float *out,
                      bool accumulate);
/* LayerNorm over the last axis: statistics in float32 from float64 sums;
 * mean and rstd (rows each) are kept for the backward pass. */
void mp_op_layer_norm(const void *x, mp_dtype xt, const float *gamma, const float *beta, float eps,
                      void *y, mp_dtype yt, float *mean, float *rstd, int64_t rows, int64_t cols);
void mp_op_layer_norm_grad(const void *x, mp_dtype xt, const float *gamma, const float *mean,
                           const float *rstd, const void *dy, mp_dtype dyt, void *dx, mp_dtype dxt,
                           float *dgamma, float *dbeta, bool accumulate, int64_t rows,
                           int64_t cols);

#endif
