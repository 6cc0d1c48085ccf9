/* gemm_ways.c - the timed choice between a float32 kernel's two ways of
 * running the same products (gemm_ways.h says what they are and how the
 * timing runs). */
#include <sched.h>
#include <time.h>

#include "core/internal.h"
#include "kernels/gemm_ways.h"

enum { IDLE = 0, BUSY = 1, DONE = 2 };
enum { LDA = 4096 }; /* A's row stride for way 0, in floats */

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The median of n values (sorted in place). */
static double median_of(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            const double x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    return v[n / 2];
}

/* Fills w->gflops; false if out of memory. */
static bool time_ways(gemm_ways *w, const gemm_impl *im)
{
    int64_t kc, nc;
    mp_gemm_blocks(im, LDA, LDA, false, false, &kc, &nc);
    const int64_t MR = im->mr, NR = im->nr, rows = GEMM_WAYS_PANELS * MR;
    const int64_t lda = kc > LDA ? kc : LDA;
    /* 64-byte aligned, as the driver's packed buffers (the kernels may
     * load them aligned) */
    const size_t sa = (size_t)(rows * lda) * sizeof(float),
                 sap = (size_t)(rows * kc) * sizeof(float);
    const size_t sb = (size_t)(nc * kc) * sizeof(float), sc = (size_t)(rows * nc) * sizeof(float);
    float *a = mp_region_alloc(sa);   /* way 0: in place */
    float *ap = mp_region_alloc(sap); /* way 1: packed */
    float *b = mp_region_alloc(sb);   /* a packed B block */
    float *c = mp_region_alloc(sc);
    const bool ok = a && ap && b && c;
    if (ok) {
        for (int64_t i = 0; i < rows * lda; i++) a[i] = (float)(i % 7) * 0.125f;
        for (int64_t i = 0; i < rows * kc; i++) ap[i] = (float)(i % 7) * 0.125f;
        for (int64_t i = 0; i < nc * kc; i++) b[i] = (float)(i % 5) * 0.25f;
        double t[2][GEMM_WAYS_REPS];
        for (int rep = -1; rep < GEMM_WAYS_REPS; rep++)
            for (int j = 0; j < 2; j++) {
                const int way = (j + rep + 1) & 1;
                atomic_store(&w->on, way);
                const double t0 = seconds();
                for (int64_t ir = 0; ir < rows; ir += MR)
                    for (int64_t jr = 0; jr < nc; jr += NR) {
                        float *ct = c + ir * nc + jr;
                        if (way)
                            im->kernel(kc, ap + ir * kc, b + jr * kc, ct, nc, 0);
                        else
                            im->kernel_a(kc, a + ir * lda, lda, 1, b + jr * kc, ct, nc, 0,
                                         (int)(NR / 16));
                    }
                if (rep >= 0) t[way][rep] = seconds() - t0;
            }
        atomic_store(&w->on, 0);
        for (int i = 0; i < 2; i++) {
            const double m = median_of(t[i], GEMM_WAYS_REPS);
            w->gflops[i] = 2e-9 * (double)(rows * nc * kc) / (m > 1e-12 ? m : 1e-12);
        }
        w->kc = kc;
        w->nc = nc;
    }
    mp_region_free(a, sa);
    mp_region_free(ap, sap);
    mp_region_free(b, sb);
    mp_region_free(c, sc);
    return ok;
}

bool mp_gemm_ways_on(gemm_ways *w, const gemm_impl *im, double margin)
{
    int s = IDLE;
    if (atomic_compare_exchange_strong(&w->state, &s, BUSY)) {
        bool on = false;
        if (w->forced >= 0)
            on = w->forced;
        else if (time_ways(w, im))
            on = !(w->gflops[0] > margin * w->gflops[1]);
        atomic_store(&w->on, on);
        atomic_store_explicit(&w->state, DONE, memory_order_release);
    } else {
        while (atomic_load_explicit(&w->state, memory_order_acquire) != DONE) sched_yield();
    }
    return mp_gemm_ways_get(w);
}

void mp_gemm_ways_force(gemm_ways *w, int on)
{
    w->forced = on;
    atomic_store(&w->on, 0);
    atomic_store(&w->state, IDLE);
}

void mp_gemm_ways_report(FILE *out, gemm_ways *w, const gemm_impl *im, double margin,
                         const char *kernel, const char *way0, const char *way1)
{
    const bool on = mp_gemm_ways_on(w, im, margin);
    if (w->forced >= 0)
        fprintf(out, "gemm float32 kernel (%s): forced: %s\n", kernel, on ? way1 : way0);
    else if (w->gflops[0] <= 0)
        fprintf(out, "gemm float32 kernel (%s): not timed (out of memory): %s\n", kernel,
                on ? way1 : way0);
    else
        fprintf(out,
                "gemm float32 kernel (%s): a %lld deep x %lld column B block from L2 on one "
                "thread (median of %d), GFLOP/s: %s %.1f, %s %.1f -> %s\n",
                kernel, (long long)w->kc, (long long)w->nc, GEMM_WAYS_REPS, way0, w->gflops[0],
                way1, w->gflops[1], on ? way1 : way0);
}
