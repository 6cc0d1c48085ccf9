/* bench_util.h - the clock, the median, the CPU's name, a watch on what
 * other processes ran while we timed, and the seed model and a batch for
 * it, shared by the benchmark programs. */
#ifndef MP_BENCH_UTIL_H
#define MP_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/times.h>
#include <time.h>
#include <unistd.h>

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

/* The median of n samples, t left as it is (at most 256). */
static inline double median_copy(const double *t, int n)
{
    double c[256];
    if (n > 256) n = 256;
    memcpy(c, t, (size_t)n * sizeof *c);
    return median(c, (size_t)n);
}

/* A second run's m samples appended to the *n at t (room for them
 * assumed), *n raised to the total: the median of all of them. */
static inline double append_median(double *t, int *n, const double *more, int m)
{
    memcpy(t + *n, more, (size_t)m * sizeof *t);
    *n += m;
    return median_copy(t, *n);
}

/* The first processor's model name, family, model and stepping. */
static inline void bench_cpu_model(char *out, size_t len)
{
    char line[512], name[256] = "", family[32] = "?", model[32] = "?", stepping[32] = "?";
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) {
            if (line[0] == '\n' && name[0]) break; /* the first processor only */
            continue;
        }
        char *v = colon + 1 + (colon[1] == ' ');
        v[strcspn(v, "\n")] = 0;
        if (!strncmp(line, "model name", 10))
            snprintf(name, sizeof name, "%s", v);
        else if (!strncmp(line, "cpu family", 10))
            snprintf(family, sizeof family, "%s", v);
        else if (!strncmp(line, "model\t", 6))
            snprintf(model, sizeof model, "%s", v);
        else if (!strncmp(line, "stepping", 8))
            snprintf(stepping, sizeof stepping, "%s", v);
    }
    if (f) fclose(f);
    snprintf(out, len, "%s (family %s, model %s, stepping %s)", name[0] ? name : "unknown", family,
             model, stepping);
}

/* CPU seconds that processes other than this one and its children have
 * used so far: busy time in /proc/stat minus our own (both in clock ticks).
 * Differences of it say whether something else ran while we timed. */
static inline double bench_others_cpu_s(void)
{
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return 0;
    int got = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                     &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (got != 8) return 0;
    /* user nice system idle iowait irq softirq steal: all but idle and iowait */
    double busy = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
    struct tms t;
    times(&t);
    double own = (double)(t.tms_utime + t.tms_stime + t.tms_cutime + t.tms_cstime);
    return (busy - own) / (double)sysconf(_SC_CLK_TCK);
}

/* What other processes used between bench_watch_start and
 * bench_watch_report, printed as a line that says whether the machine was
 * idle while a section was timed. */
typedef struct {
    double cpu0, t0;
} bench_watch;

static inline bench_watch bench_watch_start(void)
{
    return (bench_watch){bench_others_cpu_s(), now()};
}

static inline void bench_watch_report(bench_watch w, const char *what)
{
    double cpu = bench_others_cpu_s() - w.cpu0, wall = now() - w.t0;
    printf("  (other processes during %s: %.1f CPU s in %.0f s = %.0f%% of one core%s)\n", what,
           cpu, wall, 100.0 * cpu / wall, cpu > 0.05 * wall ? ": the machine was NOT idle" : "");
    fflush(stdout);
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

/* A batch for the seed MLP: x [batch, 784] uniform in [0, 1] (charged to
 * "other"), labels 0..9; the same values every call (srand(3)). Returns the
 * labels (free them; release x). */
static inline int32_t *seed_batch(int64_t batch, mp_tensor *x)
{
    mp_tensor_init(x, MP_F32, 2, (int64_t[]){batch, 784}, MP_MEM_OTHER);
    int32_t *y = malloc((size_t)batch * sizeof *y);
    if (!x->data || !y) {
        fprintf(stderr, "benchmark: out of memory for a batch of %lld\n", (long long)batch);
        exit(1);
    }
    srand(3);
    for (int64_t i = 0; i < batch * 784; i++)
        ((float *)x->data)[i] = (float)rand() / (float)RAND_MAX;
    for (int64_t i = 0; i < batch; i++) y[i] = rand() % 10;
    return y;
}

#endif
