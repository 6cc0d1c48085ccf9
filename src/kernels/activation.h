/* activation.h - the activation functions, elementwise in float32, shared
 * by the elementwise ops (ops.c) and the GEMM epilogues so that a fused
 * Dense activation and a separate Activation layer give the same values.
 * NaN passes through every one of them (as in PyTorch): a relu that turned
 * NaN into 0 would hide an overflow from loss scaling. */
#ifndef MP_KERNELS_ACTIVATION_H
#define MP_KERNELS_ACTIVATION_H

#include <math.h>

#include "core/internal.h"

#define MP_SQRT1_2 0.70710678118654752440f
#define MP_SQRT2_PI 0.79788456080286535588f /* sqrt(2/pi) */

static inline float mp_activate(mp_activation a, float x)
{
    switch (a) {
    case MP_ACT_RELU:
        return x > 0.0f ? x : (x == x ? 0.0f : x);
    case MP_ACT_GELU:
        return 0.5f * x * (1.0f + erff(x * MP_SQRT1_2));
    case MP_ACT_GELU_TANH:
        return 0.5f * x * (1.0f + tanhf(MP_SQRT2_PI * (x + 0.044715f * x * x * x)));
    case MP_ACT_SIGMOID:
        return 1.0f / (1.0f + expf(-x));
    case MP_ACT_TANH:
        return tanhf(x);
    default: /* linear; softmax is row-wise and never comes here */
        return x;
    }
}

#endif
