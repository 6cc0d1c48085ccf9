/* profile.h - where a training step's time goes: an optional clock on a few
 * regions of the library (forward, backward, optimizer update, the
 * gradients' inf/NaN check) and on the leaves inside them (GEMM, casts).
 * Off by default; while off a hook is one load of a global and a branch.
 * The sums are per thread: each thread's calls go into its own, and
 * mp_prof_get reads the calling thread's (calls made inside an OpenMP
 * parallel region are not timed). Regions do not nest (an inner one
 * is not timed apart), nor do leaves (a cast inside a GEMM is GEMM time).
 * Internal: bench_step reads it; not part of the API. */
#ifndef MP_PROFILE_H
#define MP_PROFILE_H

#include <stdbool.h>

typedef enum {
    MP_PROF_NONE, /* outside every region */
    MP_PROF_FORWARD,
    MP_PROF_BACKWARD, /* the loss and its gradient included */
    MP_PROF_OPTIMIZER,
    MP_PROF_GRAD_CHECK, /* unscale and inf/NaN check (loss scaler), or the check alone */
    MP_PROF_REGIONS
} mp_prof_region;

typedef enum { MP_PROF_GEMM, MP_PROF_CONVERT, MP_PROF_LEAVES } mp_prof_leaf;

/* Seconds: region[r] is the time spent in region r (region[MP_PROF_NONE]
 * stays 0), leaf[r][l] the time of leaf l inside region r. */
typedef struct {
    double region[MP_PROF_REGIONS];
    double leaf[MP_PROF_REGIONS][MP_PROF_LEAVES];
} mp_prof_times;

extern bool mp_prof_on; /* process-wide */

/* Turns the clock on or off (process-wide) and zeroes the calling thread's
 * sums. */
void mp_prof_enable(bool on);
/* The calling thread's sums since it was enabled. */
void mp_prof_get(mp_prof_times *out);

double mp_prof_region_begin_(mp_prof_region r);
void mp_prof_region_end_(double t0);
double mp_prof_leaf_begin_(void);
void mp_prof_leaf_end_(mp_prof_leaf l, double t0);

/* t0 = mp_prof_region_enter(R); ...; mp_prof_region_leave(t0); (t0 is 0
 * when not timed: off, nested or in a parallel region) */
static inline double mp_prof_region_enter(mp_prof_region r)
{
    return mp_prof_on ? mp_prof_region_begin_(r) : 0;
}
static inline void mp_prof_region_leave(double t0)
{
    if (t0 != 0) mp_prof_region_end_(t0);
}
static inline double mp_prof_leaf_enter(void) { return mp_prof_on ? mp_prof_leaf_begin_() : 0; }
static inline void mp_prof_leaf_leave(mp_prof_leaf l, double t0)
{
    if (t0 != 0) mp_prof_leaf_end_(l, t0);
}

#endif
