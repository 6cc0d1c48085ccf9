/* reference.h - an independent reference for the number formats, written
 * from the IEEE-754 and OCP FP8 definitions in double arithmetic (frexp,
 * ldexp, nearbyint), sharing no code with the library's integer algorithm. */
#ifndef MP_TEST_REFERENCE_H
#define MP_TEST_REFERENCE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct {
    int ebits, mbits, bias;
    bool ieee; /* all-ones exponent is inf/NaN; else OCP E4M3 (only S.1111.111 is NaN) */
} ref_format;

static const ref_format REF_F16 = {5, 10, 15, true};
static const ref_format REF_BF16 = {8, 7, 127, true};
static const ref_format REF_E4M3 = {4, 3, 7, false};
static const ref_format REF_E5M2 = {5, 2, 15, true};

/* The value a bit pattern denotes, by the format's definition. */
static inline double ref_decode(const ref_format *f, uint32_t bits)
{
    uint32_t emask = (1u << f->ebits) - 1, mmask = (1u << f->mbits) - 1;
    int sign = (bits >> (f->ebits + f->mbits)) & 1;
    uint32_t e = (bits >> f->mbits) & emask, m = bits & mmask;
    double v;
    if (f->ieee && e == emask)
        v = m ? NAN : INFINITY;
    else if (!f->ieee && e == emask && m == mmask)
        v = NAN;
    else if (e == 0)
        v = ldexp((double)m, 1 - f->bias - f->mbits);
    else
        v = ldexp(1.0 + ldexp((double)m, -f->mbits), (int)e - f->bias);
    return sign ? -v : v;
}

static inline double ref_max(const ref_format *f)
{
    uint32_t emax = (1u << f->ebits) - (f->ieee ? 2 : 1);
    double frac = f->ieee ? 2.0 - ldexp(1.0, -f->mbits) : 2.0 - ldexp(2.0, -f->mbits);
    return ldexp(frac, (int)emax - f->bias);
}

/* Round a finite x to the format's grid, round-to-nearest-even, as if the
 * exponent range were unbounded above; the caller applies overflow rules. */
static inline double ref_round_unbounded(const ref_format *f, double x)
{
    double a = fabs(x);
    if (a == 0) return x;
    int e;
    frexp(a, &e); /* a = g * 2^e, g in [0.5, 1): leading bit at 2^(e-1) */
    int lead = e - 1, emin = 1 - f->bias;
    if (lead < emin) lead = emin;
    double quantum = ldexp(1.0, lead - f->mbits);
    double r = nearbyint(a / quantum) * quantum; /* default mode: ties to even */
    return copysign(r, x);
}

enum { REF_OVF_INF, REF_OVF_SATURATE, REF_OVF_NAN };

/* Reference cast of a float32 value: NaN in -> NaN out. `inf_rule` is what an
 * infinite input gives, `ovf_rule` what a finite value rounding past max gives. */
static inline double ref_cast(const ref_format *f, double x, int ovf_rule, int inf_rule)
{
    if (isnan(x)) return NAN;
    double maxv = ref_max(f);
    if (isinf(x)) return inf_rule == REF_OVF_NAN ? NAN : copysign(INFINITY, x);
    double r = ref_round_unbounded(f, x);
    if (fabs(r) > maxv) {
        if (ovf_rule == REF_OVF_SATURATE) return copysign(maxv, x);
        if (ovf_rule == REF_OVF_NAN) return NAN;
        return copysign(INFINITY, x);
    }
    return r;
}

/* Does encoded `bits` represent exactly `want` (a reference value from a
 * float32 input `x`)? Zeros must carry x's sign; NaNs must be NaN with x's
 * sign (E4M3: NaN from an infinity keeps the infinity's sign). */
static inline bool ref_matches(const ref_format *f, uint32_t bits, double want, float x)
{
    double got = ref_decode(f, bits);
    int sign = (bits >> (f->ebits + f->mbits)) & 1;
    if (isnan(want)) return isnan(got) && sign == (signbit(x) ? 1 : 0);
    if (got != want) return false;
    return sign == (signbit(want) ? 1 : 0);
}

#endif
