/* gemm_ways.c - the measured choice between a float32 kernel's two ways of
 * running the same products (gemm_ways.h says what they are and how the
 * timing runs): the timing, the choice and its cache file. */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "core/cache_file.h"
#include "core/internal.h"
#include "kernels/gemm_ways.h"

enum { IDLE = 0, BUSY = 1, DONE = 2 };
enum { LDA = 4096 }; /* A's row stride for way 0, in floats */
/* Its number goes up whenever either kernel's ways or the timing's rule
 * change, so rates timed otherwise are timed again rather than trusted (2:
 * the fastest of the runs, a second round to confirm). */
#define CACHE_MAGIC "mixprec gemm ways 2"

static _Atomic(const double *) test_rates;

void mp_gemm_ways_test_rates(const double *rates) { atomic_store(&test_rates, rates); }

/* One round: the two ways' rates into r, timed on the block w->kc x
 * w->nc; false if out of memory. */
static bool time_ways(gemm_ways *w, const gemm_impl *im, double r[2])
{
    const int64_t kc = w->kc, nc = w->nc;
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
        double best[2] = {1e30, 1e30}; /* noise only ever adds time */
        for (int rep = -1; rep < GEMM_WAYS_REPS; rep++)
            for (int j = 0; j < 2; j++) {
                const int way = (j + rep + 1) & 1;
                atomic_store(&w->on, way);
                const double t0 = mp_seconds();
                for (int64_t ir = 0; ir < rows; ir += MR)
                    for (int64_t jr = 0; jr < nc; jr += NR) {
                        float *ct = c + ir * nc + jr;
                        if (way)
                            im->kernel(kc, ap + ir * kc, b + jr * kc, ct, nc, 0);
                        else
                            im->kernel_a(kc, a + ir * lda, lda, 1, b + jr * kc, ct, nc, 0,
                                         (int)(NR / 16));
                    }
                const double t = mp_seconds() - t0;
                if (rep >= 0 && t < best[way]) best[way] = t;
            }
        atomic_store(&w->on, 0);
        for (int i = 0; i < 2; i++)
            r[i] = 2e-9 * (double)(rows * nc * kc) / (best[i] > 1e-12 ? best[i] : 1e-12);
    }
    mp_region_free(a, sa);
    mp_region_free(ap, sap);
    mp_region_free(b, sb);
    mp_region_free(c, sc);
    return ok;
}

/* ------------------------------------------------------------- the cache */

static bool choose(const gemm_ways *w, double margin)
{
    return !(w->gflops[0] > margin * w->gflops[1]);
}

/* A round's rates rounded as the file keeps them; then which way is
 * clearly (GEMM_WAYS_CLEAR) ahead: 0 or 1, or -1 when neither is. */
static int clear_winner(double r[2])
{
    r[0] = mp_cache_rate_round(r[0]);
    r[1] = mp_cache_rate_round(r[1]);
    return r[0] > GEMM_WAYS_CLEAR * r[1] ? 0 : r[1] > GEMM_WAYS_CLEAR * r[0] ? 1 : -1;
}

/* A round of timing into r, or the test hook's rates for round `round`. */
static bool time_round(gemm_ways *w, const gemm_impl *im, int round, double r[2])
{
    const double *fake = atomic_load(&test_rates);
    if (!fake) return time_ways(w, im, r);
    r[0] = fake[2 * round];
    r[1] = fake[2 * round + 1];
    return true;
}

/* The file's text for w's rates: canonical, so a file is valid exactly
 * when it equals what this function writes for the rates it holds. */
static int cache_text(char *buf, size_t len, const gemm_ways *w, double margin, uint64_t key)
{
    int n = snprintf(buf, len,
                     "%s\nversion %s kernel %s margin %.2f\ncpu %016llx\nway0 %lld way1 %lld -> "
                     "way%d\n",
                     CACHE_MAGIC, MP_VERSION_STRING, w->kernel, margin, (unsigned long long)key,
                     mp_cache_rate_thousandths(w->gflops[0]),
                     mp_cache_rate_thousandths(w->gflops[1]), choose(w, margin));
    if (n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, "check %016llx\n",
                      (unsigned long long)mp_fnv1a(buf, (size_t)n));
    return n > 0 && (size_t)n < len ? n : -1;
}

/* The rates from path into w; false (the reason in why) unless the file is
 * exactly what cache_text writes for them. */
static bool cache_read(const char *path, gemm_ways *w, double margin, uint64_t key,
                       const char **why)
{
    char buf[MP_CACHE_MAX + 2], want[MP_CACHE_MAX + 2];
    size_t n;
    if (!mp_cache_slurp(path, buf, &n, why)) return false;
    gemm_ways got = {.kernel = w->kernel};
    *why = "ignored (not this version's format, or corrupt)";
    const char *p = strstr(buf, "\nway0 ");
    if (!p) return false;
    p++;
    if (!mp_cache_rate_after(&p, "way0", &got.gflops[0]) || *p++ != ' ' ||
        !mp_cache_rate_after(&p, "way1", &got.gflops[1]))
        return false;
    const int wn = cache_text(want, sizeof want, &got, margin, key);
    if (wn < 0 || (size_t)wn != n || memcmp(buf, want, n)) return false;
    w->gflops[0] = got.gflops[0];
    w->gflops[1] = got.gflops[1];
    *why = "read";
    return true;
}

/* ---------------------------------------------------------- the decision */

static void decide(gemm_ways *w, const gemm_impl *im, double margin)
{
    w->path[0] = w->note[0] = '\0';
    w->gflops[0] = w->gflops[1] = 0;
    mp_gemm_blocks(im, LDA, LDA, false, false, &w->kc, &w->nc);
    const uint64_t key = mp_cpu_model_key();
    char dir[400];
    const char *status = "";
    if (mp_cache_dir(dir, sizeof dir, w->note, sizeof w->note)) {
        const int n = snprintf(w->path, sizeof w->path, "%s/gemm-ways-%s-%016llx-%s", dir,
                               w->kernel, (unsigned long long)key, MP_VERSION_STRING);
        if (n < 0 || (size_t)n >= sizeof w->path - 8) { /* room for the temporary's suffix */
            w->path[0] = '\0';
            snprintf(w->note, sizeof w->note, "off (the cache path is too long)");
        } else if (cache_read(w->path, w, margin, key, &status)) {
            w->source = MP_DISPATCH_CACHED;
            snprintf(w->note, sizeof w->note, "%s", status);
            return;
        }
    }
    double r[2];
    if (!time_round(w, im, 0, r)) {
        w->source = MP_DISPATCH_DEFAULT;
        snprintf(w->note, sizeof w->note, "%s%snot written (timing failed)", status,
                 *status ? ", " : "");
        return;
    }
    /* A clear winner is timed again before it is written: a file outlives
     * the process, and one round in a moment of load can mislead. */
    const int first = clear_winner(r);
    double again[2] = {0, 0};
    const bool confirmed =
        first >= 0 && time_round(w, im, 1, again) && clear_winner(again) == first;
    for (int i = 0; i < 2; i++) w->gflops[i] = r[i] > again[i] ? r[i] : again[i];
    w->source = MP_DISPATCH_MEASURED;
    if (!w->path[0]) return;
    if (first < 0) {
        snprintf(w->note, sizeof w->note, "%s, not written (too close to keep: within %.0f%%)",
                 status, (GEMM_WAYS_CLEAR - 1) * 100);
        return;
    }
    if (!confirmed) {
        snprintf(w->note, sizeof w->note,
                 "%s, not written (a second round did not confirm it: %.1f and %.1f)", status,
                 again[0], again[1]);
        return;
    }
    char text[MP_CACHE_MAX];
    const int n = cache_text(text, sizeof text, w, margin, key);
    const int err = n < 0 ? ENOSPC : mp_cache_write(dir, w->path, text, (size_t)n);
    snprintf(w->note, sizeof w->note, "%s, %s%s%s", status, err ? "not written (" : "written",
             err ? strerror(err) : "", err ? ")" : "");
}

bool mp_gemm_ways_on(gemm_ways *w, const gemm_impl *im, double margin)
{
    int s = IDLE;
    if (atomic_compare_exchange_strong(&w->state, &s, BUSY)) {
        bool on;
        if (w->forced >= 0) {
            on = w->forced;
        } else {
            char saved[512]; /* the timing's own messages are not the caller's */
            snprintf(saved, sizeof saved, "%s", mp_last_error());
            decide(w, im, margin);
            mp_set_error(MP_OK, "%s", saved);
            on = w->source == MP_DISPATCH_DEFAULT ? false : choose(w, margin);
        }
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
    if (w->forced >= 0) {
        fprintf(out, "gemm float32 kernel (%s): forced: %s\n", kernel, on ? way1 : way0);
        return;
    }
    if (w->source == MP_DISPATCH_DEFAULT)
        fprintf(out, "gemm float32 kernel (%s): not timed (out of memory): %s\n", kernel,
                on ? way1 : way0);
    else
        fprintf(out,
                "gemm float32 kernel (%s): a %lld deep x %lld column B block from L2 on one "
                "thread (the fastest of %d runs), %s, GFLOP/s: %s %.1f, %s %.1f -> %s\n",
                kernel, (long long)w->kc, (long long)w->nc, GEMM_WAYS_REPS,
                w->source == MP_DISPATCH_CACHED ? "read from the cache" : "timed in this process",
                way0, w->gflops[0], way1, w->gflops[1], on ? way1 : way0);
    if (w->path[0] || w->note[0])
        fprintf(out, "  cache: %s%s%s\n", w->path, w->path[0] ? ": " : "", w->note);
}
