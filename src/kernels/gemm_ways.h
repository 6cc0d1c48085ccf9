/* gemm_ways.h - a float32 kernel's two ways of running the same products,
 * timed once per process and the faster kept (gemm_impl.streams): way 0,
 * as loaded, reads A where it lies where the driver can (a_in_place); way
 * 1 reads A packed, and the kernel may also ask for its panels' rows ahead
 * (the AVX-512 kernel's streaming). CPUs differ on which is faster: on an
 * Intel Xeon and an AMD Zen 3 way 1, on Zen 5 way 0 (the kernel files give
 * the figures). Each element of C is the same FMA chain either way, so the
 * bits do not depend on the choice. A clear choice (one way GEMM_WAYS_CLEAR
 * faster) is cached per CPU model and library version in a small file
 * under the user's cache directory (cache_file.h: MP_DISPATCH_CACHE, else
 * XDG_CACHE_HOME/mixprec, else HOME/.cache/mixprec), beside the other
 * measured choices; a file that is not exactly what this version would
 * write is ignored, timed again and replaced. */
#ifndef MP_GEMM_WAYS_H
#define MP_GEMM_WAYS_H

#include "kernels/gemm_internal.h"

typedef struct {
    const char *kernel;        /* the path's name, "avx2": the cache file's */
    atomic_int state;          /* idle, being decided, decided */
    atomic_int on;             /* way 1 chosen; read by the kernels, 0 until decided */
    int forced;                /* -1: timed; 0 or 1: forced (tests) */
    double gflops[2];          /* the two ways' rates; 0: not timed */
    int64_t kc, nc;            /* the B block they were timed on */
    mp_dispatch_source source; /* timed, read from the cache, or timing failed */
    char path[512];            /* the cache file; empty when off */
    char note[160];            /* what became of it */
} gemm_ways;

#define GEMM_WAYS_INIT(name)                                                                       \
    {                                                                                              \
        .kernel = (name), .forced = -1                                                             \
    }

/* Whether way 1 is chosen for the kernels of im: decided on the first call
 * (thread-safe; others wait), from the cache file where it holds this
 * CPU's rates, else by timing. The timing, on one thread, runs im's kernels
 * over a B block of the size the driver uses at depth 4096 (from L2) and
 * GEMM_WAYS_PANELS A micro-panels, each meeting every B panel as in the
 * driver: way 0 through kernel_a on A's rows 16 KiB apart (fc2 forward's
 * x), way 1 through kernel on a packed A with `on` set while it runs; the
 * fastest of GEMM_WAYS_REPS runs each after an untimed one (noise only
 * adds time), the ways in turns (about 5 ms). Way 1 is kept unless way 0
 * is `margin` faster (a timing in a quiet moment must not undo a gain the
 * machine's load hides); way 0 where the timing cannot allocate. A round
 * that finds one way clearly ahead is followed by a second: the file is
 * written only when both find the same way clearly ahead, and the rates
 * are each way's faster of the two. */
enum { GEMM_WAYS_PANELS = 8, GEMM_WAYS_REPS = 9 };
#define GEMM_WAYS_CLEAR 1.10
bool mp_gemm_ways_on(gemm_ways *w, const gemm_impl *im, double margin);

/* The kernels' read of the choice. */
static inline bool mp_gemm_ways_get(gemm_ways *w)
{
    return atomic_load_explicit(&w->on, memory_order_relaxed);
}

/* Tests: 0 or 1 forces the way; -1: decided again on the next call. */
void mp_gemm_ways_force(gemm_ways *w, int on);

/* Tests and the cache fuzzer: rates[0..1] and rates[2..3] (GFLOP/s,
 * positive) stand for the first and second rounds' timings, which then run
 * nothing; NULL: timed again. */
void mp_gemm_ways_test_rates(const double *rates);

/* The line mixprec info prints: the rates and the choice, naming the
 * kernel and each way as given. */
void mp_gemm_ways_report(FILE *out, gemm_ways *w, const gemm_impl *im, double margin,
                         const char *kernel, const char *way0, const char *way1);

#endif
