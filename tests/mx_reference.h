/* mx_reference.h - an independent reference for the OCP MX block formats,
 * for tests/test_mx.c: element values from their sign, exponent and
 * mantissa fields with ldexp, the block scale from frexp of the amax, the
 * rounding with nearbyint in double arithmetic; no library code. */
#ifndef MP_TEST_MX_REFERENCE_H
#define MP_TEST_MX_REFERENCE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "common.h"
#include "reference.h"

/* ------------------------------------------------- the reference formats */

enum { K_E4M3, K_E5M2, K_FP, K_INT8 }; /* K_FP: no inf or NaN codes */

typedef struct {
    mp_mx_format f;
    const char *name;
    int kind, ebits, mbits, bias, bits; /* bits: element width */
    double max;                         /* filled by setup: the largest decoded value */
    int emax;                           /* floor(log2(max)) */
} tfmt;

static tfmt T[MP_MX_FORMAT_COUNT] = {
    {MP_MXFP8_E4M3, "mxfp8_e4m3", K_E4M3, 4, 3, 7, 8, 0, 0},
    {MP_MXFP8_E5M2, "mxfp8_e5m2", K_E5M2, 5, 2, 15, 8, 0, 0},
    {MP_MXFP6_E2M3, "mxfp6_e2m3", K_FP, 2, 3, 1, 6, 0, 0},
    {MP_MXFP6_E3M2, "mxfp6_e3m2", K_FP, 3, 2, 3, 6, 0, 0},
    {MP_MXFP4_E2M1, "mxfp4_e2m1", K_FP, 2, 1, 1, 4, 0, 0},
    {MP_MXINT8, "mxint8", K_INT8, 0, 0, 0, 8, 0, 0},
};

/* The value of an element code by the format's definition. */
static inline double ref_elem(const tfmt *t, uint32_t code)
{
    code &= (1u << t->bits) - 1;
    if (t->kind == K_INT8) return (double)(int8_t)code / 64.0;
    if (t->kind == K_E4M3) return ref_decode(&REF_E4M3, code);
    if (t->kind == K_E5M2) return ref_decode(&REF_E5M2, code);
    uint32_t s = code >> (t->ebits + t->mbits), e = (code >> t->mbits) & ((1u << t->ebits) - 1);
    uint32_t m = code & ((1u << t->mbits) - 1);
    double v = e == 0 ? ldexp((double)m, 1 - t->bias - t->mbits)
                      : ldexp(1.0 + ldexp((double)m, -t->mbits), (int)e - t->bias);
    return s ? -v : v;
}

static inline void mx_ref_init(void)
{
    for (int i = 0; i < MP_MX_FORMAT_COUNT; i++) {
        T[i].max = 0;
        for (uint32_t c = 0; c < (1u << T[i].bits); c++) {
            double v = ref_elem(&T[i], c);
            if (isfinite(v) && v > T[i].max) T[i].max = v;
        }
        int e;
        frexp(T[i].max, &e);
        T[i].emax = e - 1;
    }
}

/* Round q (the block value divided by the scale, exact in double) onto the
 * element grid, nearest even, clamped to +-max. MXINT8's zero has no sign. */
static inline double ref_round(const tfmt *t, double q)
{
    double a = fabs(q), r;
    if (t->kind == K_INT8) {
        r = fmin(nearbyint(a * 64.0) / 64.0, t->max);
        return r == 0 ? 0.0 : copysign(r, q);
    }
    if (a == 0) return q;
    int e;
    frexp(a, &e);
    int lead = e - 1 < 1 - t->bias ? 1 - t->bias : e - 1;
    double quantum = ldexp(1.0, lead - t->mbits);
    r = fmin(nearbyint(a / quantum) * quantum, t->max);
    return copysign(r, q);
}

/* One block by the specification: returns the E8M0 code, want[i] the
 * element value (NaN for every element of a NaN-scale block). */
static inline int ref_block(const tfmt *t, const float *x, size_t stride, size_t len, double *want)
{
    double amax = 0;
    bool special = false;
    for (size_t i = 0; i < len; i++) {
        double v = x[i * stride];
        if (!isfinite(v)) special = true;
        if (fabs(v) > amax) amax = fabs(v);
    }
    if (special) {
        for (size_t i = 0; i < len; i++) want[i] = NAN;
        return 255;
    }
    int se = -127;
    if (amax > 0) {
        int e;
        frexp(amax, &e);
        se = e - 1 - t->emax;
        if (se < -127) se = -127;
        if (se > 127) se = 127;
    }
    for (size_t i = 0; i < len; i++) want[i] = ref_round(t, ldexp((double)x[i * stride], -se));
    return se + 127;
}

/* Is a decoded float32 want * 2^(scale-127) rounded once to float32 (the C
 * conversion from double: nearest even, +-inf past the range)? */
static inline bool value_ok(float got, double want, int scale)
{
    if (scale == 255) return f32_bits(got) == 0x7FC00000u;
    return f32_bits(got) == f32_bits((float)ldexp(want, scale - 127));
}

static inline bool bf16_ok(uint16_t got, double want, int scale)
{
    if (scale == 255) return got == 0x7FC0;
    double v = ref_cast(&REF_BF16, ldexp(want, scale - 127), REF_OVF_INF, REF_OVF_INF);
    return ref_decode(&REF_BF16, got) == v && !!(got & 0x8000) == !!signbit(v);
}

static inline uint32_t code_at(const tfmt *t, const uint8_t *codes, size_t i)
{
    return t->f == MP_MXFP4_E2M1 ? (codes[i / 2] >> (4 * (i % 2))) & 0xFu : codes[i];
}

#endif
