/* gemm_dispatch_timing.c - the timing behind the measured GEMM kernel
 * choice (gemm_dispatch.c): each candidate for a pair of bf16-like input
 * types, the best of MP_DISPATCH_TIMING_REPS runs of MP_DISPATCH_TIMING_N^3
 * through the driver with the caller's threads, and of
 * MP_DISPATCH_TIMING_N1^3 on one thread. About 15 ms per pair on two
 * cores. */
#include <stdlib.h>

#include "core/cache_file.h"
#include "kernels/gemm_internal.h"

enum { TIMING_N = MP_DISPATCH_TIMING_N, TIMING_N1 = MP_DISPATCH_TIMING_N1 };
enum { TIMING_REPS = MP_DISPATCH_TIMING_REPS };

/* The timing data: A and B (TIMING_N^2 each of the class's types, values in
 * [-1, 1)) and C. */
typedef struct {
    const gemm_impl *const *cand;
    int n;
    mp_dtype at, bt;
    void *a, *b;
    float *c;
} timing_data;

/* One run of candidate i through the driver, with the caller's threads. */
static bool run_driver(const timing_data *td, int i)
{
    mp_gemm_args g = mp_gemm_args_default();
    g.m = g.n = g.k = TIMING_N;
    g.a = td->a;
    g.b = td->b;
    g.c = td->c;
    g.a_type = td->at;
    g.b_type = td->bt;
    g.lda = g.ldb = g.ldc = TIMING_N;
    return mp_gemm_ex_on(td->cand[i], &g) == MP_OK;
}

/* One run of candidate i on this thread alone, as each driver thread works
 * (pack a depth block of A and of B, microkernel over the tiles) on the
 * leading TIMING_N1^3 of the data: a reference that other load on the
 * machine cannot drag down the way it stalls a team of threads at its
 * barriers. */
static bool run_one_thread(const timing_data *td, int i)
{
    const gemm_impl *im = td->cand[i];
    const gemm_operand a = {.base = td->a, .type = td->at, .sw = TIMING_N, .sd = 1};
    const gemm_operand b = {.base = td->b, .type = td->bt, .sw = 1, .sd = TIMING_N};
    const size_t esz = (size_t)mp_gemm_fmt_bytes(im->fmt);
    const int64_t n = TIMING_N1, kc = im->kc < n ? im->kc : n;
    const size_t panels = (size_t)(n * mp_gemm_kpad(im->fmt, kc)) * esz;
    char *ap = mp_scratch(0, panels);
    char *bp = mp_scratch(1, panels);
    if (!ap || !bp || n % im->mr || n % im->nr) return false;
    for (int64_t pc = 0; pc < n; pc += kc) {
        const int64_t kb = n - pc < kc ? n - pc : kc;
        const int64_t kpad = mp_gemm_kpad(im->fmt, kb);
        (im->pack_a ? im->pack_a : im->pack)(&a, 0, n, pc, kb, im->mr, ap);
        im->pack(&b, 0, n, pc, kb, im->nr, bp);
        for (int64_t ir = 0; ir < n; ir += im->mr)
            for (int64_t jr = 0; jr < n; jr += im->nr)
                im->kernel(kpad, ap + (size_t)(ir * kpad) * esz, bp + (size_t)(jr * kpad) * esz,
                           td->c + ir * TIMING_N + jr, TIMING_N, pc > 0);
    }
    return true;
}

/* GFLOP/s of each candidate for runs of `flops`: the best of TIMING_REPS
 * rounds after an untimed one, the candidates in turns (the order rotating)
 * so drift in clock or load hits all alike. */
static bool time_runs(const timing_data *td, bool (*run)(const timing_data *, int), double flops,
                      double *gflops)
{
    const int n = td->n;
    double best[MP_DISPATCH_MAX_KERNELS];
    for (int i = 0; i < n; i++) best[i] = 1e30;
    for (int rep = -1; rep < TIMING_REPS; rep++)
        for (int j = 0; j < n; j++) {
            const int i = (j + rep + 1) % n;
            const double t0 = mp_seconds();
            if (!run(td, i)) return false;
            const double t = mp_seconds() - t0;
            if (rep >= 0 && t < best[i]) best[i] = t;
        }
    for (int i = 0; i < n; i++)
        gflops[i] = mp_cache_rate_round(flops * 1e-9 / (best[i] > 1e-12 ? best[i] : 1e-12));
    return true;
}

bool mp_gemm_dispatch_time(const gemm_impl *const *cand, int n, mp_dtype at, mp_dtype bt,
                           int threads, double *team, double *one)
{
    const size_t ne = (size_t)TIMING_N * TIMING_N;
    timing_data td = {cand, n, at, bt, malloc(ne * 2), malloc(ne * 2), malloc(ne * sizeof(float))};
    bool ok = td.a && td.b && td.c;
    uint64_t z = 0x9E3779B97F4A7C15ull;
    for (int op = 0; ok && op < 2; op++) {
        for (size_t i = 0; i < ne; i++) {
            z = mp_mix64(z + i);
            td.c[i] = (float)((double)(z >> 40) * 0x1p-23 - 1.0); /* uniform in [-1, 1) */
        }
        mp_convert(op ? td.b : td.a, op ? td.bt : td.at, td.c, MP_F32, ne);
    }
    ok = ok && time_runs(&td, run_one_thread, 2.0 * TIMING_N1 * TIMING_N1 * TIMING_N1, one);
    if (ok && threads > 1)
        ok = time_runs(&td, run_driver, 2.0 * TIMING_N * TIMING_N * TIMING_N, team);
    free(td.a);
    free(td.b);
    free(td.c);
    return ok;
}
