/* profile.c - the monotonic clock (mp_seconds, core/internal.h) and the
 * per-thread sums behind profile.h. */
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/internal.h"
#include "core/profile.h"

bool mp_prof_on;
static _Thread_local mp_prof_times sums;
static _Thread_local mp_prof_region current; /* the region being timed */
static _Thread_local bool in_leaf;

double mp_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool in_parallel(void)
{
#ifdef _OPENMP
    return omp_in_parallel();
#else
    return false;
#endif
}

void mp_prof_enable(bool on)
{
    memset(&sums, 0, sizeof sums);
    current = MP_PROF_NONE;
    in_leaf = false;
    mp_prof_on = on;
}

void mp_prof_get(mp_prof_times *out) { *out = sums; }

double mp_prof_region_begin_(mp_prof_region r)
{
    if (current != MP_PROF_NONE || in_leaf || in_parallel()) return 0;
    current = r;
    return mp_seconds();
}

void mp_prof_region_end_(double t0)
{
    sums.region[current] += mp_seconds() - t0;
    current = MP_PROF_NONE;
}

double mp_prof_leaf_begin_(void)
{
    if (in_leaf || in_parallel()) return 0;
    in_leaf = true;
    return mp_seconds();
}

void mp_prof_leaf_end_(mp_prof_leaf l, double t0)
{
    sums.leaf[current][l] += mp_seconds() - t0;
    in_leaf = false;
}
