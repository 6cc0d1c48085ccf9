/* measured.c - the measured choice of measured.h: timing, the choice and its
 * cache file. */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cache_file.h"
#include "core/measured.h"

/* Best of TIMING_REPS runs per candidate after an untimed one, candidates
 * in turns; a later candidate must beat the first (the feature-flag choice)
 * by TIMING_MARGIN, so that noise rarely flips the choice. */
enum { TIMING_REPS = 5 };
#define TIMING_MARGIN 1.03
/* Its number goes up whenever a candidate kernel or the rule changes (2:
 * written only when a second round confirms every choice, with each
 * candidate's faster rate). */
#define CACHE_MAGIC "mixprec kernel choice 2"

enum { IDLE = 0, BUSY = 1, DONE = 2 };

static int pick(const mp_measured_op *op)
{
    int best = 0;
    for (int i = 1; i < op->n; i++)
        if (op->rate[i] > TIMING_MARGIN * op->rate[best]) best = i;
    return best;
}

/* ------------------------------------------------------------ the timing */

void mp_measured_fill_op(mp_measured_op *op, const char *name, int o,
                         bool (*same)(int o, mp_isa a, mp_isa b))
{
    op->name = name;
    op->n = 0;
    op->chosen = 0;
    /* the feature-flag choice; amx adds tiles for GEMM only, its other
     * kernels are avx512bf16's and named so */
    const mp_isa best = mp_isa_best();
    op->isa[op->n++] = best == MP_ISA_AMX ? MP_ISA_AVX512BF16 : best;
    for (int i = MP_ISA_COUNT - 1; i >= 0 && op->n < MP_MEASURED_MAX; i--) {
        bool dup = !mp_isa_supported((mp_isa)i);
        for (int j = 0; j < op->n && !dup; j++) dup = same(o, (mp_isa)i, op->isa[j]);
        if (!dup) op->isa[op->n++] = (mp_isa)i;
    }
    for (int i = 0; i < op->n; i++) op->rate[i] = 0;
}

static bool measure(mp_measured_group *g, const mp_measured_spec *spec)
{
    if (!spec->setup()) return false;
    for (int o = 0; o < g->nops; o++) {
        mp_measured_op *op = &g->op[o];
        double best[MP_MEASURED_MAX];
        for (int i = 0; i < op->n; i++) best[i] = 1e30;
        for (int rep = -1; rep < TIMING_REPS; rep++)
            for (int j = 0; j < op->n; j++) {
                const int i = (j + rep + 1) % op->n;
                const double t = spec->time(o, op->isa[i]);
                if (t < 0) {
                    spec->teardown();
                    return false;
                }
                if (rep >= 0 && t < best[i]) best[i] = t;
            }
        for (int i = 0; i < op->n; i++)
            op->rate[i] =
                mp_cache_rate_round(g->elements * 1e-6 / (best[i] > 1e-12 ? best[i] : 1e-12));
        op->chosen = pick(op);
    }
    spec->teardown();
    return true;
}

/* ------------------------------------------------------------- the cache */

/* The file's text for g: canonical, so a file is valid exactly when it
 * equals what this function writes for the rates it holds. */
static int cache_text(char *buf, size_t len, const mp_measured_group *g, uint64_t key)
{
    int n = snprintf(buf, len, "%s\nversion %s revision %d\ncpu %016llx\n", CACHE_MAGIC,
                     MP_VERSION_STRING, g->revision, (unsigned long long)key);
    for (int o = 0; o < g->nops && n > 0 && (size_t)n < len; o++) {
        const mp_measured_op *op = &g->op[o];
        n += snprintf(buf + n, len - (size_t)n, "%s", op->name);
        for (int i = 0; i < op->n && n > 0 && (size_t)n < len; i++)
            n += snprintf(buf + n, len - (size_t)n, " %s %lld", mp_isa_name(op->isa[i]),
                          mp_cache_rate_thousandths(op->rate[i]));
        if (n > 0 && (size_t)n < len)
            n += snprintf(buf + n, len - (size_t)n, " -> %s\n", mp_isa_name(op->isa[op->chosen]));
    }
    if (n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, "check %016llx\n",
                      (unsigned long long)mp_fnv1a(buf, (size_t)n));
    return n > 0 && (size_t)n < len ? n : -1;
}

/* Reads the rates from path; false (the reason in why) unless the file is a
 * regular file of at most MP_CACHE_MAX bytes equal to what cache_text writes.
 * Never blocks (a FIFO) and never follows a link at the last component. */
static bool cache_read(const char *path, uint64_t key, mp_measured_group *g, const char **why)
{
    char buf[MP_CACHE_MAX + 2], want[MP_CACHE_MAX + 2];
    size_t n;
    if (!mp_cache_slurp(path, buf, &n, why)) return false;
    mp_measured_group got = *g;
    for (int o = 0; o < got.nops; o++) {
        mp_measured_op *op = &got.op[o];
        char label[48];
        snprintf(label, sizeof label, "\n%s ", op->name);
        const char *p = strstr(buf, label);
        if (!p) return false;
        p += strlen(label) - 1;
        for (int i = 0; i < op->n; i++)
            if (*p++ != ' ' || !mp_cache_rate_after(&p, mp_isa_name(op->isa[i]), &op->rate[i]))
                return false;
        op->chosen = pick(op);
    }
    int wn = cache_text(want, sizeof want, &got, key);
    if (wn < 0 || (size_t)wn != n || memcmp(buf, want, n)) return false;
    memcpy(g->op, got.op, sizeof g->op);
    *why = "read";
    return true;
}

/* ---------------------------------------------------------- the decision */

static void decide(mp_measured_group *g, const mp_measured_spec *spec)
{
    memset(g->path, 0, sizeof g->path);
    g->note[0] = '\0';
    spec->fill(g);
    bool several = false;
    for (int o = 0; o < g->nops; o++) several = several || g->op[o].n > 1;
    if (!several) {
        g->source = MP_DISPATCH_ONLY;
        snprintf(g->note, sizeof g->note, "not used (nothing to choose)");
        return;
    }
    const uint64_t key = mp_cpu_model_key();
    char dir[400];
    const char *status = "";
    if (mp_cache_dir(dir, sizeof dir, g->note, sizeof g->note)) {
        int w = snprintf(g->path, sizeof g->path, "%s/%s-%016llx-%s", dir, g->file,
                         (unsigned long long)key, MP_VERSION_STRING);
        if (w < 0 || (size_t)w >= sizeof g->path - 8) {
            g->path[0] = '\0';
            snprintf(g->note, sizeof g->note, "off (the cache path is too long)");
        } else if (cache_read(g->path, key, g, &status)) {
            g->source = MP_DISPATCH_CACHED;
            snprintf(g->note, sizeof g->note, "%s", status);
            return;
        }
    }
    if (!measure(g, spec)) {
        /* Out of memory: the feature-flag choice, each op's first candidate. */
        g->source = MP_DISPATCH_DEFAULT;
        for (int o = 0; o < g->nops; o++) {
            memset(g->op[o].rate, 0, sizeof g->op[o].rate);
            g->op[o].chosen = 0;
        }
        snprintf(g->note, sizeof g->note, "not written (timing failed)");
        return;
    }
    g->source = MP_DISPATCH_MEASURED;
    if (!g->path[0]) return;
    /* A file outlives the process, and one round in a moment of load can
     * mislead: a second round must make every op's choice again before it
     * is written. Each candidate keeps its faster rate. */
    mp_measured_group again = *g;
    if (!measure(&again, spec)) {
        snprintf(g->note, sizeof g->note, "%s, not written (timing failed)", status);
        return;
    }
    int differs = -1;
    for (int o = 0; o < g->nops; o++) {
        mp_measured_op *op = &g->op[o];
        if (again.op[o].chosen != op->chosen && differs < 0) differs = o;
        for (int i = 0; i < op->n; i++)
            if (again.op[o].rate[i] > op->rate[i]) op->rate[i] = again.op[o].rate[i];
        op->chosen = pick(op);
    }
    if (differs >= 0) {
        const mp_measured_op *a = &again.op[differs];
        snprintf(g->note, sizeof g->note,
                 "%s, not written (a second round did not confirm it: %s chose %s)", status,
                 a->name, mp_isa_name(a->isa[a->chosen]));
        return;
    }
    char text[MP_CACHE_MAX];
    int n = cache_text(text, sizeof text, g, key);
    int err = n < 0 ? ENOSPC : mp_cache_write(dir, g->path, text, (size_t)n);
    snprintf(g->note, sizeof g->note, "%s, %s%s%s", status, err ? "not written (" : "written",
             err ? strerror(err) : "", err ? ")" : "");
}

const mp_measured_group *mp_measured_get(mp_measured_group *g, atomic_int *state,
                                         const mp_measured_spec *spec)
{
    if (mp_isa_forced()) return NULL;
    if (atomic_load_explicit(state, memory_order_acquire) == DONE) return g;
    int expected = IDLE;
    if (atomic_compare_exchange_strong(state, &expected, BUSY)) {
        char saved[512]; /* the timing's own messages are not the caller's */
        snprintf(saved, sizeof saved, "%s", mp_last_error());
        decide(g, spec);
        mp_set_error(MP_OK, "%s", saved);
        atomic_store_explicit(state, DONE, memory_order_release);
    } else {
        while (atomic_load_explicit(state, memory_order_acquire) != DONE) sched_yield();
    }
    return g;
}

void mp_measured_reset(atomic_int *state) { atomic_store(state, IDLE); }

static const char *const source_text[] = {
    [MP_DISPATCH_ONLY] = "one kernel each",
    [MP_DISPATCH_FORCED] = "forced by MP_ISA or mp_isa_set, nothing timed",
    [MP_DISPATCH_MEASURED] = "timed in this process",
    [MP_DISPATCH_CACHED] = "read from the cache",
    [MP_DISPATCH_DEFAULT] = "timing failed (out of memory): the feature-flag choice",
};

void mp_measured_print(FILE *out, const mp_measured_group *g, const char *what)
{
    if (!g) {
        fprintf(out, "%s: path %s (%s)\n", what, mp_isa_name(mp_isa_active()),
                source_text[MP_DISPATCH_FORCED]);
        return;
    }
    fprintf(out,
            "%s: the same bits on every path; each timed once (best of %d runs of %.0f "
            "elements, one thread), the faster kept (the first unless another is %.0f%% faster), "
            "%s; million elements/s:\n",
            what, TIMING_REPS, g->elements, (TIMING_MARGIN - 1) * 100, source_text[g->source]);
    for (int o = 0; o < g->nops; o++) {
        const mp_measured_op *op = &g->op[o];
        fprintf(out, "  %-12s", op->name);
        for (int i = 0; i < op->n; i++)
            fprintf(out, " %s %.0f%s", mp_isa_name(op->isa[i]), op->rate[i],
                    i + 1 < op->n ? "," : "");
        fprintf(out, "  -> %s\n", mp_isa_name(op->isa[op->chosen]));
    }
    if (g->path[0] || g->note[0])
        fprintf(out, "  cache: %s%s%s\n", g->path[0] ? g->path : "", g->path[0] ? ": " : "",
                g->note);
}
