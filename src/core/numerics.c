/* numerics.c - what rounding into a dtype does to a set of values
 * (mp_numerics_compute): how many flush to zero, become subnormal or
 * overflow, the largest magnitude, and against a rounded copy and an
 * earlier state the copy's error and the update, in one parallel,
 * vectorized pass; and the same chunk by chunk (mp_numerics_scan) for a
 * pass that already holds the values: the optimizer's update gathers its
 * weights' and gradients' figures as it goes on a diagnostic step. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <omp.h>

#include "internal.h"

/* Values are decoded to float32 in chunks of this many (stack buffers). */
#define CHUNK 2048

/* Round-to-nearest-even thresholds of a target format, as float32 values
 * (each exact: the comparisons below decide exactly). */
typedef struct {
    float half_sub; /* at or below: rounds to zero (the tie goes to even 0) */
    float sub_hi;   /* below (and above half_sub): rounds to a subnormal */
    float ovf;      /* above (at, when tie_ovf): rounds past the largest finite */
    int tie_ovf;
} thresholds;

static thresholds thresholds_of(mp_dtype t)
{
    mp_dtype_info in;
    mp_dtype_get_info(t, &in);
    thresholds th;
    if (t == MP_F32) { /* nothing rounds to zero or past max; subnormals stay */
        th = (thresholds){0.0f, in.min_normal, INFINITY, 0};
        return th;
    }
    th.half_sub = in.min_subnormal / 2;
    /* the largest subnormal has an odd significand: the tie with min_normal
     * rounds up to the normal */
    th.sub_hi = (float)((double)in.min_normal - (double)in.min_subnormal / 2);
    int e;
    frexp((double)in.max, &e); /* max = f * 2^e, f in [0.5, 1) */
    th.ovf = (float)((double)in.max + ldexp(1.0, e - 2 - in.mantissa_bits));
    /* E4M3's max has an even significand (1.110b): the tie stays at max;
     * elsewhere max's significand is all ones and the tie rounds past it */
    th.tie_ovf = t != MP_F8E4M3;
    return th;
}

static const float *as_f32(const void *src, mp_dtype t, int64_t off, int64_t len, float *buf)
{
    if (t == MP_F32) return (const float *)src + off;
    mp_convert(buf, MP_F32, (const char *)src + (size_t)off * mp_dtype_size(t), t, (size_t)len);
    return buf;
}

/* The comparisons run on the bits of |x| (mp_numerics_target): for
 * non-negative floats their order as integers is their order as numbers,
 * inf is 0x7f800000 and every NaN lies above it. Integer compares and
 * masks keep the loop free of branches and float selects, so that it
 * vectorizes. */
static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

#define FINITE_END 0x7f800000u /* |x|'s bits below this: finite */

/* One value into lane j; the flags are constants where it is inlined, so
 * each combination is its own loop without the other's work. */
static inline __attribute__((always_inline)) void one(mp_numerics_lanes *l, int j, float v, float w,
                                                      float b, const mp_numerics_target th,
                                                      bool use_copy, bool use_before)
{
    uint32_t a = bits_of(v) & 0x7fffffffu, fin = a < FINITE_END;
    l->nonfin[j] += (int32_t)!fin;
    l->zeros[j] += a == 0;
    l->flush[j] += (a > 0) & (a <= th.half_sub);
    l->sub[j] += (a > th.half_sub) & (a < th.sub_hi);
    l->ovf[j] += (int32_t)(fin & ((a > th.ovf) | (th.tie_ovf & (a == th.ovf))));
    uint32_t af = a & -fin; /* non-finite: 0 */
    l->amax[j] = af > l->amax[j] ? af : l->amax[j];
    float f = float_of(af);
    l->sumsq[j] += (double)f * f;
    if (use_copy) { /* close values: their difference is exact in float32 */
        uint32_t ok = fin & ((bits_of(w) & 0x7fffffffu) < FINITE_END);
        float d = float_of(bits_of(w - v) & -ok);
        l->err[j] += (double)d * d;
    }
    if (use_before) {
        uint32_t ok = fin & ((bits_of(b) & 0x7fffffffu) < FINITE_END);
        uint32_t au = bits_of(v - b) & 0x7fffffffu & -ok;
        float u = float_of(au);
        l->usumsq[j] += (double)u * u;
        l->uamax[j] = au > l->uamax[j] ? au : l->uamax[j];
    }
}

static inline __attribute__((always_inline)) void
scan(mp_numerics_lanes *l, const float *restrict v, const float *restrict w,
     const float *restrict b, int64_t len, const mp_numerics_target th, bool use_copy,
     bool use_before)
{
    int64_t i = 0;
    for (; i + MP_NUMERICS_LANES <= len; i += MP_NUMERICS_LANES)
        for (int j = 0; j < MP_NUMERICS_LANES; j++)
            one(l, j, v[i + j], use_copy ? w[i + j] : 0, use_before ? b[i + j] : 0, th, use_copy,
                use_before);
    for (; i < len; i++)
        one(l, 0, v[i], use_copy ? w[i] : 0, use_before ? b[i] : 0, th, use_copy, use_before);
}

/* A chunk with the flags as constants: four loops, each without the work
 * of the figures it does not compute. */
static inline __attribute__((always_inline)) void
scan_chunk(mp_numerics_lanes *l, const float *restrict v, const float *restrict w,
           const float *restrict b, int64_t len, const mp_numerics_target th)
{
    if (w && b)
        scan(l, v, w, b, len, th, true, true);
    else if (w)
        scan(l, v, w, b, len, th, true, false);
    else if (b)
        scan(l, v, w, b, len, th, false, true);
    else
        scan(l, v, w, b, len, th, false, false);
}

typedef void (*scan_fn)(mp_numerics_lanes *l, const float *v, const float *w, const float *b,
                        int64_t len, const mp_numerics_target th);

static void scan_default(mp_numerics_lanes *l, const float *v, const float *w, const float *b,
                         int64_t len, const mp_numerics_target th)
{
    scan_chunk(l, v, w, b, len, th);
}

#if MP_X86
/* The same loops compiled for AVX-512 and for AVX2 (wider vectors, the same lanes: the
 * same sums to the last bit). */
MP_TARGET_AVX512 static void scan_avx512(mp_numerics_lanes *l, const float *v, const float *w,
                                         const float *b, int64_t len, const mp_numerics_target th)
{
    scan_chunk(l, v, w, b, len, th);
}

MP_TARGET_AVX2 static void scan_avx2(mp_numerics_lanes *l, const float *v, const float *w,
                                     const float *b, int64_t len, const mp_numerics_target th)
{
    scan_chunk(l, v, w, b, len, th);
}
#endif

mp_numerics_target mp_numerics_target_of(mp_dtype t)
{
    const thresholds tf = thresholds_of(t);
    return (mp_numerics_target){bits_of(tf.half_sub), bits_of(tf.sub_hi), bits_of(tf.ovf),
                                (uint32_t)tf.tie_ovf};
}

void mp_numerics_scan(mp_numerics *out, const float *v, const float *copy, const float *before,
                      int64_t len, const mp_numerics_target *t)
{
    scan_fn fn = scan_default;
#if MP_X86
    if (mp_isa_active() >= MP_ISA_AVX512)
        fn = scan_avx512;
    else if (mp_isa_active() == MP_ISA_AVX2)
        fn = scan_avx2;
#endif
    mp_numerics_lanes l;
    memset(&l, 0, sizeof l);
    fn(&l, v, copy, before, len, *t);
    out->n += len;
    for (int j = 0; j < MP_NUMERICS_LANES; j++) {
        out->zeros += l.zeros[j], out->flush += l.flush[j], out->subnormal += l.sub[j];
        out->overflow += l.ovf[j], out->nonfinite += l.nonfin[j];
        out->sumsq += l.sumsq[j], out->err_sumsq += l.err[j], out->upd_sumsq += l.usumsq[j];
        out->amax = fmax(out->amax, (double)float_of(l.amax[j]));
        out->upd_amax = fmax(out->upd_amax, (double)float_of(l.uamax[j]));
    }
}

void mp_numerics_merge(mp_numerics *out, const mp_numerics *part)
{
    out->n += part->n;
    out->zeros += part->zeros, out->flush += part->flush, out->subnormal += part->subnormal;
    out->overflow += part->overflow, out->nonfinite += part->nonfinite;
    out->sumsq += part->sumsq, out->err_sumsq += part->err_sumsq;
    out->upd_sumsq += part->upd_sumsq;
    out->amax = fmax(out->amax, part->amax);
    out->upd_amax = fmax(out->upd_amax, part->upd_amax);
}

void mp_numerics_compute(const void *x, mp_dtype x_type, int64_t n, mp_dtype target,
                         const void *copy, mp_dtype copy_type, const float *before,
                         mp_numerics *out)
{
    const mp_numerics_target th = mp_numerics_target_of(target);
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
    enum { MAX_THREADS = 64 };
    int nt = chunks > 4 ? mp_num_threads() : 1;
    nt = nt < MAX_THREADS ? nt : MAX_THREADS;
    mp_numerics part[MAX_THREADS];
    memset(out, 0, sizeof *out);
    memset(part, 0, sizeof part);
    /* each thread sums its own chunks; the threads' sums add up in order */
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        mp_numerics *mine = &part[omp_get_thread_num()];
#pragma omp for schedule(static)
        for (int64_t c = 0; c < chunks; c++) {
            float bx[CHUNK], bc[CHUNK];
            const int64_t off = c * CHUNK, len = n - off < CHUNK ? n - off : CHUNK;
            const float *v = as_f32(x, x_type, off, len, bx);
            const float *w = copy ? as_f32(copy, copy_type, off, len, bc) : NULL;
            mp_numerics_scan(mine, v, w, before ? before + off : NULL, len, &th);
        }
    }
    for (int i = 0; i < nt; i++) mp_numerics_merge(out, &part[i]);
    out->n = n;
}
