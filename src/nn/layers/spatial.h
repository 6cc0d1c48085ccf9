/* spatial.h - what the 2-D image layers (Conv2D, DepthwiseConv2D, the
 * pooling layers, ZeroPadding2D) share: the channels-last input check, the
 * Keras window geometry with errors that name the layer, and the JSON
 * readers for their settings (int pairs, padding, booleans). Errors start
 * with the layer's kind and name: "conv2d 'c1': ...". */
#ifndef MP_SPATIAL_H
#define MP_SPATIAL_H

#include "kernels/conv.h"
#include "nn/layer.h"

/* The largest window, stride or dilation a layer takes (the kernels' bound). */
#define MP_SPATIAL_MAX ((int64_t)1 << 24)

/* l's input (l->shape at build) is [h, w, c], all >= 1. */
mp_status mp_spatial_input(const mp_layer *l);

/* Fill g from l's input (n = 1) and the window (kh, kw, strides, dilations,
 * o output channels) and run mp_conv_geom_init; a window that does not fit,
 * or an output above 2^40 elements per sample, is refused naming the layer. */
mp_status mp_spatial_geom(const mp_layer *l, mp_conv_geom *g, const int64_t kernel[2],
                          const int64_t strides[2], const int64_t dilation[2], int64_t o,
                          mp_padding padding);

/* Settings every window layer checks at build: window, strides and
 * dilations in 1..MP_SPATIAL_MAX (`what` names the window: "kernel_size",
 * "pool_size"), a known padding, and Keras's rule that strides > 1 and
 * dilation > 1 do not mix. dilation may be NULL (pooling). */
mp_status mp_spatial_check(const mp_layer *l, const char *what, const int64_t window[2],
                           const int64_t strides[2], const int64_t dilation[2], mp_padding padding);

/* An activation a layer applies elementwise (any but softmax). */
mp_status mp_spatial_activation(const mp_layer *l, mp_activation a);

/* ------------------------------------------------------------ JSON */

/* An integer or a list of two, each in lo..hi, into out[0..1]. */
mp_status mp_json_pair_field(const json_t *o, const char *key, int64_t lo, int64_t hi,
                             int64_t out[2]);
json_t *mp_json_pair(const int64_t v[2]);
/* "valid" or "same". */
mp_status mp_json_padding_field(const json_t *o, const char *key, mp_padding *out);
const char *mp_padding_name(mp_padding p);
/* An optional pair / activation (absent: out keeps its value). */
mp_status mp_json_pair_opt(const json_t *o, const char *key, int64_t lo, int64_t hi,
                           int64_t out[2]);
mp_status mp_json_activation_opt(const json_t *o, const char *key, mp_activation *out);

#endif
