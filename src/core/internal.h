/* internal.h - declarations shared inside libmixprec, not part of the API. */
#ifndef MP_INTERNAL_H
#define MP_INTERNAL_H

#include "mixprec.h"

#if defined(__GNUC__)
#define MP_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define MP_PRINTF(f, a)
#endif

/* Record a failure for mp_last_error() and return the status. */
mp_status mp_set_error(mp_status s, const char *fmt, ...) MP_PRINTF(2, 3);

#if defined(__x86_64__) || defined(_M_X64)
#define MP_X86 1
#define MP_TARGET_AVX2 __attribute__((target("avx2,f16c,fma")))
#define MP_TARGET_AVX512                                                                           \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma,prfchw")))
#define MP_TARGET_AVX512BF16                                                                       \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma,prfchw")))
#else
#define MP_X86 0
#endif

/* A portable loop compiled for each vector width the CPU may have, the one
 * to run chosen once at load (GCC's function multiversioning). The same C
 * arithmetic in each (ISO C: no FMA contraction), so the same bits. */
#if MP_X86 && defined(__GNUC__) && !defined(__clang__)
#define MP_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MP_SIMD_CLONES
#endif

static inline uint32_t mp_f32_bits(float x)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = x};
    return v.u;
}
static inline float mp_bits_f32(uint32_t u)
{
    union {
        uint32_t u;
        float f;
    } v = {.u = u};
    return v.f;
}

/* float32 bits to bfloat16, rounded to nearest even, a NaN quieted: the
 * definition mp_f32_to_bf16 exports, inline so that loops over it
 * vectorize (the attention kernel's output rows). Adding 0x7FFF plus the
 * kept LSB rounds to nearest even; a carry out of the largest finite value
 * lands on infinity, as IEEE requires. */
static inline uint16_t mp_bf16_from_bits(uint32_t u)
{
    const uint32_t nan = (u >> 16) | 0x40u, num = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? nan : num);
}

/* Round the finite magnitude with f32 bits `a`, divided by 2^exp_offset, to
 * a format with `mbits` fraction bits and exponent bias `bias`,
 * round-to-nearest-even, subnormals included: one rounding of the exact
 * quotient (the division only moves the exponent). Returns the magnitude
 * encoding; values past the largest finite come out as larger encodings and
 * the caller decides what overflow means. The scalar definition of every
 * narrowing cast (dtype.c, exp_offset 0) and of MX elements (mx.c, the
 * block's shared exponent). */
static inline uint32_t mp_round_magnitude(uint32_t a, int exp_offset, int mbits, int bias)
{
    uint32_t ef = a >> 23;
    uint32_t m = a & 0x7FFFFFu;
    int e = (int)ef - 127;
    if (ef == 0) { /* a subnormal, normalized: the offset may make it a normal */
        if (m == 0) return 0;
        int lz = __builtin_clz(m) - 8;
        m <<= lz;
        e = -126 - lz;
    } else {
        m |= 0x800000u;
    }
    e -= exp_offset;
    int emin = 1 - bias;
    int shift = 23 - mbits;
    if (e < emin) shift += emin - e;
    if (shift > 31) shift = 31; /* m < 2^24 < half: rounds to zero either way */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    q += (rem > half) | ((rem == half) & q & 1u);
    return e >= emin ? ((uint32_t)(e + bias - 1) << mbits) + q : q;
}

/* splitmix64's finaliser: the mixing step of every counter-based random
 * stream in the library (stochastic rounding, initialisers, dropout,
 * shuffling), so each draw depends only on (key, index). */
static inline uint64_t mp_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Bulk conversion kernels of one ISA; every entry is set. */
typedef struct {
    void (*f32_to_bf16)(uint16_t *dst, const float *src, size_t n);
    void (*f32_to_f16)(uint16_t *dst, const float *src, size_t n);
    void (*f32_to_fp8)(uint8_t *dst, const float *src, size_t n, mp_dtype t, mp_overflow ov);
    void (*bf16_to_f32)(float *dst, const uint16_t *src, size_t n);
    void (*f16_to_f32)(float *dst, const uint16_t *src, size_t n);
    void (*fp8_to_f32)(float *dst, const uint8_t *src, size_t n, mp_dtype t);
} mp_convert_kernels;

extern const mp_convert_kernels mp_convert_scalar_kernels;
#if MP_X86
extern const mp_convert_kernels mp_convert_avx2_kernels;
extern const mp_convert_kernels mp_convert_avx512_kernels;
extern const mp_convert_kernels mp_convert_avx512bf16_kernels;
#endif
/* Kernels of a given ISA (scalar if the ISA is not compiled in). */
const mp_convert_kernels *mp_convert_kernels_for(mp_isa isa);
/* The path whose kernel mp_convert uses for dst <- src: measured once per
 * process where paths differ (convert_dispatch.c), the active path when
 * forced or when neither side is float32. */
mp_isa mp_convert_path(mp_dtype dst, mp_dtype src);
/* The conversions' measured choice as text; forget it (tests). */
void mp_convert_dispatch_print(FILE *out);
void mp_convert_dispatch_reset(void);
/* mp_convert_ex on an explicit ISA, for tests and benchmarks. */
void mp_convert_isa(mp_isa isa, void *dst, mp_dtype dst_type, const void *src, mp_dtype src_type,
                    size_t n, mp_overflow ov);

/* fp8 encoding shared by scalar and SIMD paths: format parameters. */
typedef struct {
    int mbits, bias;
    uint32_t max_enc;    /* largest finite magnitude encoding */
    uint32_t ovf_nonsat; /* what non-saturating overflow gives (inf or NaN) */
    uint32_t inf_enc;    /* what +inf becomes in saturating mode */
    uint32_t nan_enc;    /* canonical NaN magnitude */
} mp_fp8_format;
/* The two OCP formats, as constants the SIMD paths can fold. */
static const mp_fp8_format mp_fp8_e4m3 = {/* 0x7F is NaN, there is no infinity */
                                          .mbits = 3,         .bias = 7,       .max_enc = 0x7E,
                                          .ovf_nonsat = 0x7F, .inf_enc = 0x7F, .nan_enc = 0x7F};
static const mp_fp8_format mp_fp8_e5m2 = {/* IEEE-like */
                                          .mbits = 2,         .bias = 15,      .max_enc = 0x7B,
                                          .ovf_nonsat = 0x7C, .inf_enc = 0x7C, .nan_enc = 0x7E};
const mp_fp8_format *mp_fp8_format_of(mp_dtype t);

/* The float8 recipe's scaled cast in one pass over n values of x (float32
 * or bfloat16): codes[i] = fp8(x[i] * scale) (one float32 rounding, then the
 * cast with saturation); with `sign`, a zero code carries x[i] > 0 (0x80 for
 * a positive x cast to zero, 0x00 for any other zero, as nn/fp8.c's
 * carry_sign); decoded[i] = that code's value in bfloat16 (exact). Either
 * output may be NULL. *amax_bits: the largest |x[i]| as float32 bits (a NaN
 * above inf above every finite value). False, touching nothing, where the
 * active path has no such kernel or x's type is another: the caller then
 * takes the conversions one pass at a time, which give the same bits. */
bool mp_fp8_scaled_cast(uint8_t *codes, uint16_t *decoded, mp_dtype fp8, const void *x, mp_dtype t,
                        size_t n, float scale, bool sign, uint32_t *amax_bits);

/* Whether the active ISA was forced (a valid MP_ISA or mp_isa_set) rather
 * than left to the library: a forced path skips measured kernel choice. */
bool mp_isa_forced(void);
/* Tests: forget mp_isa_set and MP_ISA; the next use reads MP_ISA again. */
void mp_isa_reset(void);
/* CPUID leaf 1 EAX (family, model, stepping); 0 off x86. Two CPUs with one
 * brand string (a hypervisor's generic "Xeon Processor") differ here. */
uint32_t mp_cpu_signature(void);
/* Per-core data cache sizes in bytes, level 1 or 2, as the C library reads
 * them from the CPU (sysconf); 0 where unknown. */
size_t mp_cpu_cache_bytes(int level);

/* Tracked huge-page-friendly allocation used by the arena. */
void mp_mem_charge(mp_mem_category cat, size_t bytes);
void mp_mem_uncharge(mp_mem_category cat, size_t bytes);
void *mp_region_alloc(size_t bytes);
void mp_region_free(void *p, size_t bytes);

/* Per-thread scratch that lives as long as the thread and only grows, so hot
 * paths never allocate after warm-up (page faults cost more than the work).
 * The contents are undefined; a slot is the caller's until its next call.
 * Slots: 0-2 GEMM packing, 3-6 row-wise ops and losses, 7-8 a strided
 * convolution's data-gradient phases, 9-13 the direct convolution kernels
 * (conv_direct_internal.h; 9, 11 and 13 also the AMX route, conv_tiles.c),
 * 14 batch norm's fused relu. Charged to
 * MP_MEM_WORKSPACE while the thread keeps it. NULL if out of memory. */
#define MP_SCRATCH_SLOTS 15
void *mp_scratch(int slot, size_t bytes);
/* Tests: scratch requests above this many bytes fail as if memory ran out
 * (SIZE_MAX, the default: none do). */
extern size_t mp_scratch_fail_above;

/* Seconds on the monotonic clock (profile.c), for timing and timeouts. */
double mp_seconds(void);

/* numerics.c: the figures of mp_numerics (mixprec/train.h) gathered chunk
 * by chunk, for a pass that already holds the values. A target's rounding
 * thresholds as bits of |x|: */
typedef struct {
    uint32_t half_sub, sub_hi, ovf, tie_ovf; /* tie_ovf: 0 or 1 */
} mp_numerics_target;
mp_numerics_target mp_numerics_target_of(mp_dtype t);
/* Partial figures in MP_NUMERICS_LANES independent lanes: each lane's
 * float64 sums are plain sequential sums, so the compiler vectorizes across
 * lanes without reordering any addition, and the lanes add up in a fixed
 * order: the same bits on every ISA. */
#define MP_NUMERICS_LANES 8
typedef struct {
    int32_t zeros[MP_NUMERICS_LANES], flush[MP_NUMERICS_LANES], sub[MP_NUMERICS_LANES];
    int32_t ovf[MP_NUMERICS_LANES], nonfin[MP_NUMERICS_LANES];
    uint32_t amax[MP_NUMERICS_LANES], uamax[MP_NUMERICS_LANES]; /* bits of the largest |value| */
    double sumsq[MP_NUMERICS_LANES], err[MP_NUMERICS_LANES], usumsq[MP_NUMERICS_LANES];
} mp_numerics_lanes;
/* Adds len float32 values v (with their rounded copy and earlier values,
 * each optional: NULL) to *out; len at most 2^28. */
void mp_numerics_scan(mp_numerics *out, const float *v, const float *copy, const float *before,
                      int64_t len, const mp_numerics_target *t);
/* *out += *part: counts and sums added, maxima kept. */
void mp_numerics_merge(mp_numerics *out, const mp_numerics *part);

#endif
