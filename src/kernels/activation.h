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

/* tanh in float32 from arithmetic alone (no libm call, no branch), so loops
 * over it vectorize; within 2.1 ulp of tanh on every 7th float32 bit
 * pattern (measured), 3 ulp asserted by tests/test_activation.c.
 *   |u| < 0.5: the odd Taylor series u - u^3/3 + 2u^5/15 - ... to u^15 (the
 *     next term is below 2^-26 |u|);
 *   else:      sign(u) (1 - 2 / (e^(2|u|) + 1)) with |u| capped at 10 (tanh
 *     rounds to 1 from 9.01 on), e^x = 2^n e^r, n = round(x / ln 2), r = x - n ln 2 in two
 *     parts (|r| <= ln2 / 2), e^r by its Taylor series to r^7 (remainder
 *     below 2^-27), 2^n from the exponent bits.
 * NaN passes through; +-inf gives +-1. */
/* `c ? a : b` on the bits (c 0 or 1): no branch for a compiler to keep. */
static inline float mp_select(uint32_t c, float a, float b)
{
    uint32_t m = 0u - c;
    return mp_bits_f32((mp_f32_bits(a) & m) | (mp_f32_bits(b) & ~m));
}

static inline float mp_tanhf(float u)
{
    /* selections on the bits (|u| orders as its bits): with float compares
     * and ?: a compiler keeps branches (float operations may trap), and the
     * loops would not vectorize */
    const uint32_t abits = mp_f32_bits(u) & 0x7FFFFFFFu;
    const float a = mp_bits_f32(abits), s = u * u;
    /* Taylor coefficients of tanh, each rounded once from its exact ratio */
    const float c3 = (float)(-1.0 / 3), c5 = (float)(2.0 / 15), c7 = (float)(-17.0 / 315),
                c9 = (float)(62.0 / 2835), c11 = (float)(-1382.0 / 155925),
                c13 = (float)(21844.0 / 6081075), c15 = (float)(-929569.0 / 638512875);
    float small =
        u * (1.0f + s * (c3 + s * (c5 + s * (c7 + s * (c9 + s * (c11 + s * (c13 + s * c15)))))));
    float x = 2.0f * mp_select(abits < 0x41200000u, a, 10.0f);   /* min(|u|, 10); NaN: 10 */
    float n = (float)(int32_t)(x * 1.44269504088896341f + 0.5f); /* x >= 0: rounds */
    float r = (x - n * 0.693145751953125f) - n * 1.42860676533018704e-06f;
    const float e3 = (float)(1.0 / 6), e4 = (float)(1.0 / 24), e5 = (float)(1.0 / 120),
                e6 = (float)(1.0 / 720), e7 = (float)(1.0 / 5040);
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (e3 + r * (e4 + r * (e5 + r * (e6 + r * e7))))));
    float e = p * mp_bits_f32((uint32_t)((int32_t)n + 127) << 23);
    float big = mp_bits_f32((mp_f32_bits(1.0f - 2.0f / (e + 1.0f)) & 0x7FFFFFFFu) |
                            (mp_f32_bits(u) & 0x80000000u));
    float t = mp_select(abits < 0x3F000000u, small, big); /* |u| < 0.5 */
    return mp_select(abits > 0x7F800000u, u, t);          /* NaN passes */
}

/* e^x in float32 from arithmetic alone (the loops of the attention kernel
 * vectorize over it): e^x = 2^n e^r with n = round(x / ln 2), r = x - n ln 2
 * in two parts (|r| <= ln 2 / 2) and e^r by its Taylor series to r^7, 2^n
 * from the exponent bits. Within 2 ulp of e^x wherever the result is a
 * normal float (tests/test_activation.c); x below -87.33 (a result below
 * the normal range) gives 0, above 88.72 +inf; NaN passes through. */
static inline float mp_expf(float x)
{
    const uint32_t bits = mp_f32_bits(x), abits = bits & 0x7FFFFFFFu, neg = bits >> 31;
    /* below the normals / past the largest float ('&', not '&&': no branch) */
    const uint32_t low = neg & (abits > 0x42AEAC4Fu), high = (neg ^ 1u) & (abits > 0x42B17217u);
    float xc = mp_select(low, -87.33654f, mp_select(high, 88.72283f, x));
    float t = xc * 1.44269504088896341f;
    float n = (float)(int32_t)(t + mp_select(neg, -0.5f, 0.5f)); /* round half away */
    float r = (xc - n * 0.693145751953125f) - n * 1.42860676533018704e-06f;
    const float e3 = (float)(1.0 / 6), e4 = (float)(1.0 / 24), e5 = (float)(1.0 / 120),
                e6 = (float)(1.0 / 720), e7 = (float)(1.0 / 5040);
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (e3 + r * (e4 + r * (e5 + r * (e6 + r * e7))))));
    /* 2^n for n in -126 .. 128: 2^128 as 2 * 2^127 */
    const int32_t ni = (int32_t)n, n1 = ni - (ni > 127);
    float y = p * mp_bits_f32((uint32_t)(n1 + 127) << 23) * mp_select(ni > 127, 2.0f, 1.0f);
    y = mp_select(low, 0.0f, mp_select(high, mp_bits_f32(0x7F800000u), y));
    return mp_select(abits > 0x7F800000u, x, y); /* NaN */
}

/* GPT-2's GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
static inline float mp_gelu_tanh(float x)
{
    return 0.5f * x * (1.0f + mp_tanhf(MP_SQRT2_PI * (x + 0.044715f * x * x * x)));
}

static inline float mp_activate(mp_activation a, float x)
{
    switch (a) {
    case MP_ACT_RELU:
        return x > 0.0f ? x : (x == x ? 0.0f : x);
    case MP_ACT_GELU:
        return 0.5f * x * (1.0f + erff(x * MP_SQRT1_2));
    case MP_ACT_GELU_TANH:
        return mp_gelu_tanh(x);
    case MP_ACT_SIGMOID:
        return 1.0f / (1.0f + expf(-x));
    case MP_ACT_TANH:
        return mp_tanhf(x);
    default: /* linear; softmax is row-wise and never comes here */
        return x;
    }
}

/* y[i] = act(x[i]) (y may be x), the same values as mp_activate, with the kind chosen
 * once so the loops vectorize (inlined always: into a caller compiled for
 * a wider ISA, the loops take its vector width). */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline void
mp_activate_row(mp_activation a, const float *x, float *y, size_t n)
{
    switch (a) {
    case MP_ACT_RELU: /* a select, not a branch: signs are random */
#pragma omp simd
        for (size_t i = 0; i < n; i++) y[i] = mp_activate(MP_ACT_RELU, x[i]);
        break;
    case MP_ACT_GELU_TANH:
#pragma omp simd
        for (size_t i = 0; i < n; i++) y[i] = mp_gelu_tanh(x[i]);
        break;
    case MP_ACT_TANH:
#pragma omp simd
        for (size_t i = 0; i < n; i++) y[i] = mp_tanhf(x[i]);
        break;
    default:
        for (size_t i = 0; i < n; i++) y[i] = mp_activate(a, x[i]);
        break;
    }
}

#endif
