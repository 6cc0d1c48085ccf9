/* openblas_core.h - OpenBLAS at its best on this CPU, for the benchmarks
 * that run it (bench_gemm's sgemm, bench_step's PyTorch, which calls it for
 * float32 matrix products).
 *
 * OpenBLAS picks its kernel ("core type") when it is loaded: from the CPU's
 * flags, or from OPENBLAS_CORETYPE. Debian's build on some AVX-512 CPUs
 * picks a generic kernel at a fifth of the rate or less, so each candidate is tried
 * in a child process (this program with --openblas-probe, which prints the
 * core type OpenBLAS took and its GFLOP/s on fc2 fwd), and the fastest is
 * set in our environment before OpenBLAS is loaded here. */

#ifndef MP_BENCH_OPENBLAS_CORE_H
#define MP_BENCH_OPENBLAS_CORE_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mixprec.h"
#include "bench_util.h"

typedef struct {
    const char *want; /* NULL: OpenBLAS's own choice */
    char got[64];     /* what openblas_get_corename() said; "" if the child failed */
    double gflops;
} coretype_try;

static inline void *dlopen_openblas(void)
{
    const char *names[] = {"libopenblas.so.0", "libopenblas.so",
                           "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"};
    for (int i = 0; i < 3; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
    }
    return NULL;
}

/* The child: sgemm on fc2 fwd (1024x4096x4096), median of 3 after one. */
static inline int openblas_probe(int threads)
{
    void *h = dlopen_openblas();
    if (!h) return 1;
    void (*sgemm)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                  float, float *, int);
    void (*set_threads)(int);
    char *(*corename)(void);
    *(void **)&sgemm = dlsym(h, "cblas_sgemm");
    *(void **)&set_threads = dlsym(h, "openblas_set_num_threads");
    *(void **)&corename = dlsym(h, "openblas_get_corename");
    if (!sgemm) return 1;
    if (set_threads) set_threads(threads);
    const int m = 1024, n = 4096, k = 4096;
    float *a = malloc((size_t)m * k * 4), *b = malloc((size_t)k * n * 4),
          *c = malloc((size_t)m * n * 4);
    if (!a || !b || !c) return 1;
    for (size_t i = 0; i < (size_t)m * k; i++) a[i] = (float)(i % 7) * 0.25f - 0.75f;
    for (size_t i = 0; i < (size_t)k * n; i++) b[i] = (float)(i % 5) * 0.25f - 0.5f;
    double t[3];
    for (int r = 0; r < 4; r++) {
        double t0 = now();
        sgemm(101, 111, 111, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
        if (r) t[r - 1] = now() - t0;
    }
    printf("core=%s gflops=%.1f\n", corename ? corename() : "?",
           2.0 * m * n * k / median(t, 3) * 1e-9);
    free(a);
    free(b);
    free(c);
    return 0;
}

/* Tries OpenBLAS's own choice and, on an AVX-512 CPU, the AVX-512 core
 * types, each in a child: this program run with --openblas-probe (its main
 * answers that with openblas_probe). Sets OPENBLAS_CORETYPE to the fastest
 * (or leaves it unset when OpenBLAS's own is). Returns the number of tries
 * filled in (0 without OpenBLAS). */
static inline int choose_openblas_coretype(coretype_try *tries, int max, int *best)
{
    static const char *avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    *best = -1;
    void *h = dlopen_openblas(); /* only to know whether it is there */
    if (!h || len <= 0) return 0;
    dlclose(h);
    self[len] = 0;
    int n = 0;
    tries[n++] = (coretype_try){.want = NULL};
    if (mp_isa_supported(MP_ISA_AVX512))
        for (int i = 0; i < 3 && n < max; i++) tries[n++] = (coretype_try){.want = avx512[i]};
    for (int i = 0; i < n; i++) {
        char cmd[4400];
        if (tries[i].want)
            snprintf(cmd, sizeof cmd, "env OPENBLAS_CORETYPE=%s '%s' --openblas-probe 2>/dev/null",
                     tries[i].want, self);
        else
            snprintf(cmd, sizeof cmd, "env -u OPENBLAS_CORETYPE '%s' --openblas-probe 2>/dev/null",
                     self);
        FILE *p = popen(cmd, "r");
        if (!p) continue;
        char line[256];
        if (fgets(line, sizeof line, p) &&
            sscanf(line, "core=%63s gflops=%lf", tries[i].got, &tries[i].gflops) == 2 &&
            (*best < 0 || tries[i].gflops > tries[*best].gflops))
            *best = i;
        pclose(p);
    }
    if (*best >= 0 && tries[*best].want)
        setenv("OPENBLAS_CORETYPE", tries[*best].want, 1);
    else
        unsetenv("OPENBLAS_CORETYPE");
    return n;
}

/* One line: the core types tried and the one kept. */
static inline void print_openblas_coretypes(const coretype_try *tries, int ntries, int best)
{
    if (!ntries) return;
    printf("openblas core types tried (sgemm fc2 fwd, GFLOP/s, each in a child process):");
    for (int i = 0; i < ntries; i++)
        printf(" %s -> %s %.0f%s", tries[i].want ? tries[i].want : "own choice",
               tries[i].got[0] ? tries[i].got : "(failed)", tries[i].gflops,
               i + 1 < ntries ? "," : "\n");
    if (best >= 0) {
        if (tries[best].want)
            printf("openblas runs with OPENBLAS_CORETYPE=%s (core type %s)\n", tries[best].want,
                   tries[best].got);
        else
            printf("openblas runs with its own choice (core type %s)\n", tries[best].got);
    }
}

#endif
