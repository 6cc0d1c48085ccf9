/* bench_util.h - the clock, the median and the seed model shared by the
 * benchmark programs. */
#ifndef MP_BENCH_UTIL_H
#define MP_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "mixprec.h"

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts t in place and returns its median. */
static inline double median(double *t, size_t n)
{
    qsort(t, n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* The seed MLP 784 -> 4096 -> 4096 -> 10 (relu, float32 softmax) under
 * `policy`, built for `batch` and compiled with the defaults (Adam). */
static inline mp_model *seed_model(const char *policy, int64_t batch)
{
    mp_set_global_policy(policy);
    mp_model *m = mp_model_new(1);
    mp_node x = mp_input(m, 1, (int64_t[]){784}, NULL);
    x = mp_dense(m, x, 4096, MP_ACT_RELU, NULL);
    x = mp_dense(m, x, 4096, MP_ACT_RELU, NULL);
    x = mp_dense(m, x, 10, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    mp_set_global_policy("float32");
    if (mp_model_build(m, x, batch) || mp_model_compile(m, NULL)) {
        fprintf(stderr, "benchmark: %s\n", mp_last_error());
        exit(1);
    }
    return m;
}

#endif
