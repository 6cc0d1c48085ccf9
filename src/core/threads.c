/* threads.c - how many threads kernels use: MP_NUM_THREADS, else
 * OMP_NUM_THREADS, else every core OpenMP offers. */
#include <stdatomic.h>
#include <stdlib.h>

#include "internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static atomic_int num_threads = 0;

static int from_env(const char *name)
{
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    long v = strtol(s, &end, 10);
    return (*end == '\0' && v > 0 && v <= 4096) ? (int)v : 0;
}

int mp_num_threads(void)
{
    int n = atomic_load(&num_threads);
    if (n > 0) return n;
    n = from_env("MP_NUM_THREADS");
    if (!n) n = from_env("OMP_NUM_THREADS");
#ifdef _OPENMP
    if (!n) n = omp_get_num_procs();
#endif
    if (n < 1) n = 1;
    atomic_store(&num_threads, n);
    return n;
}

void mp_set_num_threads(int n) { atomic_store(&num_threads, n > 0 ? n : 0); }
