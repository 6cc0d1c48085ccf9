/* gemm_dispatch.c - GEMM kernel choice by measurement. Feature flags say
 * which kernels a CPU can run, not which is fast: vdpbf16ps runs at twice the
 * float32 FMA rate on some CPUs (AMD Zen 5) and at half of it on others
 * (Intel Xeons), where AMX tiles, when the OS grants them, run at ten times
 * the FMA rate. Where an input-type class has more than one kernel this CPU
 * supports (today each pair of bf16 / fp8 input types: vdpbf16ps, AMX
 * tiles, or exact widening to float32 and FMA), the candidates are timed
 * on that pair once per process on its first use (gemm_dispatch_timing.c)
 * and the faster is kept. A choice clear of the noise, and confirmed by a
 * second round, is cached with the rates per CPU model, library version,
 * thread count and pair in small files under the user's cache directory; a
 * file that is not exactly what this version would write is ignored,
 * re-measured and replaced, so a bad one never breaks anything. MP_ISA /
 * mp_isa_set force a path and skip all of this (gemm.c). */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/cache_file.h"
#include "kernels/gemm_internal.h"

/* A later candidate must beat the preferred one by this factor: inside the
 * noise the choice (and the low bits of results) then rarely flips between
 * processes, and the preferred FMA route is exact on subnormal inputs, which
 * vdpbf16ps reads as zero. */
#define TIMING_MARGIN 1.03
/* A choice is cached only when its kernel is ahead by this factor in two
 * rounds of timing: a file outlives the process, so it holds only what no
 * plausible noise made (one round in a moment of load can mislead). */
#define CACHE_MARGIN 1.10
/* Its number goes up whenever a candidate kernel changes, so rates measured
 * on older kernels (2: the FMA kernel got narrow panels and in-place A; 3:
 * its depth block went from 256 to 1024; 4: both AVX-512 kernels ask for
 * their C tile ahead of its stores; 5: a choice is written only when a
 * second round confirms it, with each kernel's faster rate; 6: AMX tiles
 * joined the candidates) are measured
 * again rather than trusted. */
#define CACHE_MAGIC "mixprec gemm dispatch 6"

typedef struct {
    const gemm_impl *impl;
    const char *name;   /* the path MP_ISA names it by */
    const char *method; /* what it does with the operands */
} kernel_desc;

static const kernel_desc kernels[] = {
    {&mp_gemm_scalar_impl, "scalar", "portable C, float32"},
#if MP_X86
    {&mp_gemm_avx2_impl, "avx2", "widen to float32, FMA"},
    {&mp_gemm_avx512_impl, "avx512", "widen to float32, FMA"},
    {&mp_gemm_avx512bf16_impl, "avx512bf16", "vdpbf16ps"},
    {&mp_gemm_amx_impl, "amx", "AMX tiles, tdpbf16ps"},
#endif
};
#define NKERNELS ((int)(sizeof kernels / sizeof kernels[0]))

static const kernel_desc *describe(const gemm_impl *im)
{
    for (int i = 0; i < NKERNELS; i++)
        if (kernels[i].impl == im) return &kernels[i];
    return &kernels[0];
}

/* The candidates for bf16-like x bf16-like operands, in order of preference,
 * with the path each needs. */
#if MP_X86
static const struct {
    const gemm_impl *impl;
    mp_isa needs;
} bf16_candidates[] = {
    {&mp_gemm_avx512_impl, MP_ISA_AVX512},
    {&mp_gemm_avx512bf16_impl, MP_ISA_AVX512BF16},
    {&mp_gemm_amx_impl, MP_ISA_AMX},
};
#define NBF16 ((int)(sizeof bf16_candidates / sizeof bf16_candidates[0]))
#endif

/* The timed classes: every ordered pair of bf16-like input types, each timed
 * on its own operands (decoding fp8 costs the two routes differently: on an
 * Intel Xeon FMA wins on bf16 and loses on fp8). */
static const struct {
    mp_dtype type;
    const char *tag;
} like[] = {{MP_BF16, "bf16"}, {MP_F8E4M3, "e4m3"}, {MP_F8E5M2, "e5m2"}};
enum { NLIKE = 3, NCLASSES = NLIKE * NLIKE };

/* The class of an input-type pair, or -1 when either is not bf16-like. */
static int class_of(mp_dtype a, mp_dtype b)
{
    int ia = -1, ib = -1;
    for (int i = 0; i < NLIKE; i++) {
        if (like[i].type == a) ia = i;
        if (like[i].type == b) ib = i;
    }
    return ia < 0 || ib < 0 ? -1 : ia * NLIKE + ib;
}

/* ------------------------------------------------------------- the state */

typedef struct {
    int cls; /* a_type like[cls / NLIKE], b_type like[cls % NLIKE] */
    int n;
    const gemm_impl *cand[MP_DISPATCH_MAX_KERNELS];
    double gflops[MP_DISPATCH_MAX_KERNELS];
    int chosen;
    mp_dispatch_source source;
    int threads;
    char path[sizeof(((mp_gemm_dispatch_info *)0)->cache_file)];
    char note[sizeof(((mp_gemm_dispatch_info *)0)->cache_note)];
} decision;

enum { IDLE = 0, BUSY = 1, DONE = 2 };
static atomic_int state[NCLASSES];        /* all IDLE */
static decision dec[NCLASSES];            /* written only while BUSY, read after DONE */
static const gemm_impl *chosen[NCLASSES]; /* dec's choice, for the fast path */
static _Thread_local const gemm_impl *timing_impl;

const gemm_impl *mp_gemm_dispatch_override(void) { return timing_impl; }

mp_status mp_gemm_ex_on(const gemm_impl *im, const mp_gemm_args *g)
{
    const gemm_impl *saved = timing_impl;
    timing_impl = im;
    mp_status st = mp_gemm_ex(g);
    timing_impl = saved;
    return st;
}

/* Tests: a candidate list that replaces this CPU's (n 0: none). */
static const gemm_impl *test_cands[MP_DISPATCH_MAX_KERNELS];
static int test_ncands;

void mp_gemm_dispatch_test_candidates(const gemm_impl *const *list, int n)
{
    test_ncands = n < 0 ? 0 : n > MP_DISPATCH_MAX_KERNELS ? MP_DISPATCH_MAX_KERNELS : n;
    for (int i = 0; i < test_ncands; i++) test_cands[i] = list[i];
}

bool mp_gemm_dispatch_testing(void) { return test_ncands > 0; }

int mp_gemm_dispatch_candidates(const gemm_impl **out, int max)
{
    int n = 0;
    if (test_ncands) {
        for (; n < test_ncands && n < max; n++) out[n] = test_cands[n];
        return n;
    }
#if MP_X86
    for (int i = 0; i < NBF16 && n < max; i++)
        if (mp_isa_supported(bf16_candidates[i].needs)) out[n++] = bf16_candidates[i].impl;
#else
    (void)out;
    (void)max;
#endif
    return n;
}

/* ------------------------------------------------------------ the timing */

/* Threads a GEMM started here gets: mp_num_threads(), or 1 inside an OpenMP
 * region where nesting is off. */
static int team_threads(void)
{
    int got = 1;
#ifdef _OPENMP
    int nt = mp_num_threads();
#pragma omp parallel num_threads(nt)
    if (omp_get_thread_num() == 0) got = omp_get_num_threads();
#endif
    return got;
}

/* Tests: rates that replace the timing, per round the team's then one
 * thread's; rounds past test_rounds repeat the last. */
static const double *test_rates;
static int test_rounds;

void mp_gemm_dispatch_test_rates(const double *gflops, int rounds)
{
    test_rates = gflops;
    test_rounds = rounds < 1 ? 1 : rounds;
}

/* One round of timing (round 0, 1) into g; false if the runs could not
 * get memory. The team's rates (d->threads of them) decide unless some
 * kernel ran slower on the team than on one thread: then the machine is
 * busy with other work (a team stalled at its barriers times every kernel
 * alike, or worse, at random), the one-thread rates decide and *busy is
 * set. */
static bool measure(const decision *d, int round, double *g, bool *busy)
{
    double team[MP_DISPATCH_MAX_KERNELS] = {0}, one[MP_DISPATCH_MAX_KERNELS] = {0};
    if (test_rates) {
        const double *r = test_rates + 2 * d->n * (round < test_rounds ? round : test_rounds - 1);
        for (int i = 0; i < d->n; i++) {
            team[i] = mp_cache_rate_round(r[i]);
            one[i] = mp_cache_rate_round(r[d->n + i]);
        }
    } else if (!mp_gemm_dispatch_time(d->cand, d->n, like[d->cls / NLIKE].type,
                                      like[d->cls % NLIKE].type, d->threads, team, one)) {
        return false;
    }
    *busy = false;
    for (int i = 0; d->threads > 1 && i < d->n; i++) *busy = *busy || team[i] < one[i];
    memcpy(g, d->threads > 1 && !*busy ? team : one, sizeof team);
    return true;
}

static int pick(const decision *d)
{
    int best = 0;
    for (int i = 1; i < d->n; i++)
        if (d->gflops[i] > TIMING_MARGIN * d->gflops[best]) best = i;
    return best;
}

/* Whether the choice stands clear of the noise: the chosen kernel beats every
 * other by CACHE_MARGIN. Only such a choice is cached; closer rates (or a
 * machine so loaded that every kernel looks alike) are timed again by the
 * next process rather than kept for good. */
static bool clear_choice(const decision *d)
{
    for (int i = 0; i < d->n; i++)
        if (i != d->chosen && !(d->gflops[d->chosen] > CACHE_MARGIN * d->gflops[i])) return false;
    return true;
}

/* ------------------------------------------------------------- the cache */

/* The file's text for d: canonical, so a file is valid exactly when it equals
 * what this function writes for the rates it holds. */
static int cache_text(char *buf, size_t len, const decision *d, uint64_t key)
{
    int n = snprintf(buf, len, "%s\nversion %s\ncpu %016llx\nthreads %d\n%sx%s", CACHE_MAGIC,
                     MP_VERSION_STRING, (unsigned long long)key, d->threads,
                     like[d->cls / NLIKE].tag, like[d->cls % NLIKE].tag);
    for (int i = 0; i < d->n && n > 0 && (size_t)n < len; i++)
        n += snprintf(buf + n, len - (size_t)n, " %s %lld", describe(d->cand[i])->name,
                      mp_cache_rate_thousandths(d->gflops[i]));
    if (n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, " -> %s\n", describe(d->cand[d->chosen])->name);
    if (n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, "check %016llx\n",
                      (unsigned long long)mp_fnv1a(buf, (size_t)n));
    return n > 0 && (size_t)n < len ? n : -1;
}

/* Reads d's rates from path; false (the reason in why) unless the file is a
 * regular file of at most MP_CACHE_MAX bytes equal to what cache_text writes.
 * Never blocks (a FIFO) and never follows a link at the last component. */
static bool cache_read(const char *path, uint64_t key, decision *d, const char **why)
{
    char buf[MP_CACHE_MAX + 2], want[MP_CACHE_MAX + 2];
    size_t n;
    if (!mp_cache_slurp(path, buf, &n, why)) return false;
    /* The rates: the one thing the text does not fix. */
    char label[16];
    snprintf(label, sizeof label, "\n%sx%s ", like[d->cls / NLIKE].tag, like[d->cls % NLIKE].tag);
    const char *p = strstr(buf, label);
    if (!p) return false;
    p += strlen(label) - 1;
    for (int i = 0; i < d->n; i++)
        if (*p++ != ' ' || !mp_cache_rate_after(&p, describe(d->cand[i])->name, &d->gflops[i]))
            return false;
    d->chosen = pick(d);
    int wn = cache_text(want, sizeof want, d, key);
    if (wn < 0 || (size_t)wn != n || memcmp(buf, want, n)) return false;
    *why = "read";
    return true;
}

/* ---------------------------------------------------------- the decision */

/* A decision for class cls with its candidates and nothing chosen yet. */
static void begin(decision *d, int cls)
{
    memset(d, 0, sizeof *d);
    d->cls = cls;
    d->n = mp_gemm_dispatch_candidates(d->cand, MP_DISPATCH_MAX_KERNELS);
}

static void decide(decision *d, int cls)
{
    begin(d, cls);
    if (d->n <= 1) {
        d->source = MP_DISPATCH_ONLY;
        if (d->n == 0) d->cand[d->n++] = &mp_gemm_scalar_impl;
        snprintf(d->note, sizeof d->note, "not used (nothing to choose)");
        return;
    }
    d->threads = team_threads();
    const uint64_t key = mp_cpu_model_key();
    char dir[sizeof d->path];
    const bool cached = mp_cache_dir(dir, sizeof dir, d->note, sizeof d->note);
    const char *status = "";
    if (cached) {
        int w = snprintf(d->path, sizeof d->path, "%s/gemm-%016llx-%s-t%d-%sx%s", dir,
                         (unsigned long long)key, MP_VERSION_STRING, d->threads,
                         like[cls / NLIKE].tag, like[cls % NLIKE].tag);
        if (w < 0 || (size_t)w >= sizeof d->path - 8) { /* room for the temporary's suffix */
            d->path[0] = '\0';
            snprintf(d->note, sizeof d->note, "off (the cache path is too long)");
        } else if (cache_read(d->path, key, d, &status)) {
            d->source = MP_DISPATCH_CACHED;
            snprintf(d->note, sizeof d->note, "%s", status);
            return;
        }
    }
    const int team = d->threads;
    bool busy = false;
    if (!measure(d, 0, d->gflops, &busy)) {
        /* Out of memory: the feature-flag rule, the most specialised kernel. */
        d->source = MP_DISPATCH_DEFAULT;
        memset(d->gflops, 0, sizeof d->gflops);
        d->chosen = d->n - 1;
        snprintf(d->note, sizeof d->note, "%s%snot written (timing failed)", status,
                 *status ? ", " : "");
        return;
    }
    d->source = MP_DISPATCH_MEASURED;
    if (busy) d->threads = 1;
    d->chosen = pick(d);
    if (!d->path[0]) return;
    if (busy) {
        snprintf(d->note, sizeof d->note,
                 "%s, not written (%d threads ran slower than one: the machine is busy)", status,
                 team);
        return;
    }
    if (!clear_choice(d)) {
        snprintf(d->note, sizeof d->note, "%s, not written (too close to keep: within %.0f%%)",
                 status, (CACHE_MARGIN - 1) * 100);
        return;
    }
    /* Before it is written, a second round must make the same clear choice
     * on the team; the process then keeps each kernel's faster rate. */
    decision again = *d;
    bool busy2 = false;
    if (!measure(d, 1, again.gflops, &busy2)) {
        snprintf(d->note, sizeof d->note, "%s, not written (timing failed)", status);
        return;
    }
    again.chosen = pick(&again);
    const bool confirmed = !busy2 && again.chosen == d->chosen && clear_choice(&again);
    if (!busy2) {
        for (int i = 0; i < d->n; i++)
            if (again.gflops[i] > d->gflops[i]) d->gflops[i] = again.gflops[i];
        d->chosen = pick(d);
    }
    if (!confirmed) {
        int w = snprintf(d->note, sizeof d->note,
                         "%s, not written (a second round did not confirm it:", status);
        for (int i = 0; i < d->n && w > 0 && (size_t)w < sizeof d->note; i++)
            w += snprintf(d->note + w, sizeof d->note - (size_t)w, " %s %.1f%s",
                          describe(d->cand[i])->name, again.gflops[i],
                          i < d->n - 1 ? ""
                          : busy2      ? ", a busy machine)"
                                       : ")");
        return;
    }
    char text[MP_CACHE_MAX];
    int n = cache_text(text, sizeof text, d, key);
    int err = n < 0 ? ENOSPC : mp_cache_write(dir, d->path, text, (size_t)n);
    snprintf(d->note, sizeof d->note, "%s, %s%s%s", status, err ? "not written (" : "written",
             err ? strerror(err) : "", err ? ")" : "");
}

const gemm_impl *mp_gemm_dispatch_bf16(mp_dtype at, mp_dtype bt)
{
    int c = class_of(at, bt);
    if (c < 0) c = 0; /* not a bf16-like pair: the driver does not ask */
    if (atomic_load_explicit(&state[c], memory_order_acquire) == DONE) return chosen[c];
    int expected = IDLE;
    if (atomic_compare_exchange_strong(&state[c], &expected, BUSY)) {
        /* The timing's own messages (a failed run) are not the caller's. */
        char saved[512];
        snprintf(saved, sizeof saved, "%s", mp_last_error());
        decide(&dec[c], c);
        chosen[c] = dec[c].cand[dec[c].chosen];
        mp_set_error(MP_OK, "%s", saved);
        atomic_store_explicit(&state[c], DONE, memory_order_release);
    } else {
        while (atomic_load_explicit(&state[c], memory_order_acquire) != DONE) sched_yield();
    }
    return chosen[c];
}

int mp_gemm_dispatch_choices(int8_t *out, int max)
{
    if (mp_isa_forced()) return 0;
    int n = 0;
    for (int c = 0; c < NCLASSES && n < max; c++) {
        (void)mp_gemm_dispatch_bf16(like[c / NLIKE].type, like[c % NLIKE].type);
        out[n++] = (int8_t)dec[c].chosen;
    }
    return n;
}

void mp_gemm_dispatch_adopt(const int8_t *in, int n)
{
    if (n != NCLASSES || mp_isa_forced()) return;
    for (int c = 0; c < NCLASSES; c++) {
        decision d;
        begin(&d, c);
        if (d.n <= 1 || in[c] < 0 || in[c] >= d.n) continue; /* its own choice stands */
        d.chosen = in[c];
        d.source = MP_DISPATCH_AGREED;
        d.threads = team_threads();
        snprintf(d.note, sizeof d.note, "not used (rank 0's choice)");
        /* called before any GEMM of the job runs: nothing reads dec[c] now */
        dec[c] = d;
        chosen[c] = d.cand[d.chosen];
        atomic_store_explicit(&state[c], DONE, memory_order_release);
    }
}

void mp_gemm_dispatch_reset(void)
{
    for (int c = 0; c < NCLASSES; c++) atomic_store(&state[c], IDLE);
}

/* ------------------------------------------------------------ the report */

mp_status mp_gemm_dispatch_query(mp_dtype a_type, mp_dtype b_type, mp_gemm_dispatch_info *out)
{
    if (!out) return mp_set_error(MP_ERR_INVALID, "mp_gemm_dispatch_query: NULL info");
    if ((unsigned)a_type >= MP_DTYPE_COUNT || (unsigned)b_type >= MP_DTYPE_COUNT)
        return mp_set_error(MP_ERR_INVALID, "mp_gemm_dispatch_query: unknown dtype (a=%d, b=%d)",
                            (int)a_type, (int)b_type);
    memset(out, 0, sizeof *out);
    /* Asking the driver's rule also runs the timing if this pair needs it. */
    const gemm_impl *im = mp_gemm_impl_for(a_type, b_type);
    /* The pair went through the measured choice: bf16-like operands on an
     * unforced path that has more than one kernel for them. */
    const int c = class_of(a_type, b_type);
    const decision *d = c >= 0 && !mp_isa_forced() &&
                                atomic_load_explicit(&state[c], memory_order_acquire) == DONE &&
                                dec[c].cand[dec[c].chosen] == im
                            ? &dec[c]
                            : NULL;
    if (d) {
        out->n_kernels = d->n;
        for (int i = 0; i < d->n; i++) {
            out->kernel[i] = describe(d->cand[i])->name;
            out->method[i] = describe(d->cand[i])->method;
            out->gflops[i] = d->gflops[i];
        }
        out->chosen = d->chosen;
        out->source = d->source;
        out->threads = d->threads;
        _Static_assert(sizeof out->cache_file == sizeof d->path, "path sizes");
        _Static_assert(sizeof out->cache_note == sizeof d->note, "note sizes");
        memcpy(out->cache_file, d->path, sizeof d->path);
        memcpy(out->cache_note, d->note, sizeof d->note);
    } else {
        out->n_kernels = 1;
        out->kernel[0] = describe(im)->name;
        out->method[0] = describe(im)->method;
        out->source = mp_isa_forced() ? MP_DISPATCH_FORCED : MP_DISPATCH_ONLY;
        snprintf(out->cache_note, sizeof out->cache_note, "not used (nothing timed)");
    }
    return MP_OK;
}

static const char *const source_text[] = {
    [MP_DISPATCH_ONLY] = "the only kernel for them",
    [MP_DISPATCH_FORCED] = "forced by MP_ISA or mp_isa_set, nothing timed",
    [MP_DISPATCH_MEASURED] = "timed in this process",
    [MP_DISPATCH_CACHED] = "read from the cache",
    [MP_DISPATCH_DEFAULT] = "timing failed (out of memory): the feature-flag rule",
    [MP_DISPATCH_AGREED] = "rank 0's choice (data parallel: every rank takes it)",
};

mp_status mp_gemm_dispatch_report(FILE *out)
{
    if (!out) return mp_set_error(MP_ERR_INVALID, "mp_gemm_dispatch_report: NULL stream");
    mp_gemm_dispatch_info in[NCLASSES], f32;
    for (int c = 0; c < NCLASSES; c++) {
        mp_status st = mp_gemm_dispatch_query(like[c / NLIKE].type, like[c % NLIKE].type, &in[c]);
        if (st != MP_OK) return st;
    }
    mp_status st = mp_gemm_dispatch_query(MP_F32, MP_F32, &f32);
    if (st != MP_OK) return st;
    const mp_gemm_dispatch_info *b = &in[0];
    if (b->source != MP_DISPATCH_MEASURED && b->source != MP_DISPATCH_CACHED &&
        b->source != MP_DISPATCH_DEFAULT) {
        /* One kernel for every pair: nothing was timed. */
        fprintf(out, "gemm bf16/fp8 inputs: %s (%s), %s\n", b->kernel[0], b->method[0],
                source_text[b->source]);
    } else {
        fprintf(out,
                "gemm bf16/fp8 inputs: each pair's kernels timed once (best of %d runs of "
                "%d^3 on %d threads), the faster kept (%s unless another is %.0f%% faster); "
                "GFLOP/s:\n",
                MP_DISPATCH_TIMING_REPS, MP_DISPATCH_TIMING_N, mp_num_threads(), b->kernel[0],
                (TIMING_MARGIN - 1) * 100);
        fprintf(out, "  %-12s", "a x b");
        for (int i = 0; i < b->n_kernels; i++) fprintf(out, " %11s", b->kernel[i]);
        fprintf(out, "  %-11s %s\n", "chosen", "source");
        for (int c = 0; c < NCLASSES; c++) {
            const mp_gemm_dispatch_info *x = &in[c];
            char pair[16];
            snprintf(pair, sizeof pair, "%s x %s", like[c / NLIKE].tag, like[c % NLIKE].tag);
            fprintf(out, "  %-12s", pair);
            for (int i = 0; i < x->n_kernels; i++) fprintf(out, " %11.1f", x->gflops[i]);
            fprintf(out, "  %-11s %s", x->kernel[x->chosen], source_text[x->source]);
            if (x->threads == 1) fprintf(out, " (%d^3 on one thread)", MP_DISPATCH_TIMING_N1);
            if (x->cache_file[0] && x->source != MP_DISPATCH_CACHED)
                fprintf(out, "; cache: %s", x->cache_note);
            fprintf(out, "\n");
        }
        fprintf(out, "  (");
        for (int i = 0; i < b->n_kernels; i++)
            fprintf(out, "%s%s: %s", i ? "; " : "", b->kernel[i], b->method[i]);
        char dir[sizeof b->cache_file];
        snprintf(dir, sizeof dir, "%s", b->cache_file);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        fprintf(out, ")\n  cache: %s\n", b->cache_file[0] ? dir : b->cache_note);
    }
    fprintf(out, "gemm other input types: %s (%s), %s\n", f32.kernel[0], f32.method[0],
            source_text[f32.source]);
    const gemm_impl *cand[MP_DISPATCH_MAX_KERNELS];
    int nc = mp_gemm_dispatch_candidates(cand, MP_DISPATCH_MAX_KERNELS);
    if (nc == 0) cand[nc++] = mp_gemm_impl_for(MP_F32, MP_F32); /* one kernel for all */
    for (int i = 0; i < nc; i++)
        if (cand[i]->streams_report) cand[i]->streams_report(out);
    fprintf(out, "gemm blocks at depth 4096 (L1d %zu KiB, L2 %zu KiB per core):",
            mp_cpu_cache_bytes(1) >> 10, mp_cpu_cache_bytes(2) >> 10);
    for (int i = 0; i < nc; i++) {
        int64_t kcb, ncb;
        mp_gemm_blocks(cand[i], 4096, 4096, false, false, &kcb, &ncb);
        fprintf(out, "%s %s %lld deep x %lld columns", i ? "," : "", describe(cand[i])->name,
                (long long)kcb, (long long)ncb);
    }
    fprintf(out, "\n");
    return ferror(out) ? mp_set_error(MP_ERR_IO, "mp_gemm_dispatch_report: write failed") : MP_OK;
}
