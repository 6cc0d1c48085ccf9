/* stochastic.c - stochastic rounding f32 -> bf16/f16/E4M3/E5M2.
 *
 * Element i of a call with seed s draws 64 random bits from a counter-based
 * generator, splitmix64's finaliser applied to (key(s) + (i + 1) * golden):
 * no state is carried from element to element, so the bits depend only on
 * (seed, index), never on threads or how the array is split. The magnitude is
 * truncated onto the target grid and rounded up with probability
 * (dropped bits) / (grid step), compared exactly in integers, so the
 * expectation equals the input. */
#include <math.h>

#include "internal.h"

static inline uint64_t random_bits(uint64_t key, uint64_t index)
{
    return mp_mix64(key + (index + 1) * 0x9E3779B97F4A7C15ull);
}

/* As mp_round_magnitude() in internal.h with the round-to-nearest step replaced by
 * a random one. A value more than 63 bits below the grid step (less than
 * 2^-39 of the smallest subnormal) rounds to zero. */
static inline uint32_t sr_magnitude(uint32_t a, int mbits, int bias, uint64_t rnd)
{
    uint32_t ef = a >> 23;
    uint64_t m = a & 0x7FFFFFu;
    int e = (int)ef - 127;
    if (ef == 0)
        e = -126;
    else
        m |= 0x800000u;
    int emin = 1 - bias;
    int shift = 23 - mbits;
    if (e < emin) shift += emin - e;
    uint32_t q = 0;
    if (shift <= 63) {
        uint64_t mask = (1ull << shift) - 1;
        q = (uint32_t)(m >> shift);
        q += (rnd & mask) < (m & mask);
    }
    return e >= emin ? ((uint32_t)(e + bias - 1) << mbits) + q : q;
}

void mp_convert_stochastic_at(void *dst, mp_dtype dst_type, const float *src, size_t n,
                              uint64_t seed, uint64_t offset)
{
    if (dst_type == MP_F32) {
        mp_convert(dst, MP_F32, src, MP_F32, n);
        return;
    }
    int mbits, bias;
    mp_dtype_info info;
    mp_dtype_get_info(dst_type, &info);
    mbits = info.mantissa_bits;
    bias = info.exponent_bias;
    const float maxv = info.max;
    const uint64_t key = mp_mix64(seed ^ 0x6D69787072656331ull);
    const long long nn = (long long)n;

#pragma omp parallel for schedule(static) if (nn > (1 << 16))
    for (long long i = 0; i < nn; i++) {
        float x = src[i];
        if (!(fabsf(x) <= maxv)) { /* NaN, inf, beyond max: the ordinary cast */
            mp_convert((char *)dst + (size_t)i * info.bits / 8, dst_type, &x, MP_F32, 1);
            continue;
        }
        uint32_t u = mp_f32_bits(x);
        uint32_t r =
            sr_magnitude(u & 0x7FFFFFFFu, mbits, bias, random_bits(key, offset + (uint64_t)i));
        if (info.bits == 16)
            ((uint16_t *)dst)[i] = (uint16_t)(((u >> 16) & 0x8000u) | r);
        else
            ((uint8_t *)dst)[i] = (uint8_t)(((u >> 24) & 0x80u) | r);
    }
}

void mp_convert_stochastic(void *dst, mp_dtype dst_type, const float *src, size_t n, uint64_t seed)
{
    mp_convert_stochastic_at(dst, dst_type, src, n, seed, 0);
}
