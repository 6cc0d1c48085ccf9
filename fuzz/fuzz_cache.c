/* fuzz_cache.c - the kernel-choice cache files under a fuzzer: one input is
 * the text of a cache file, put where a choice looks for its file (the
 * cache directory is a scratch directory, MP_DISPATCH_CACHE) before the
 * choice is made again. A bad or stale file must never break anything: it
 * is read (as it must be exactly what this version writes) or ignored,
 * measured again and replaced.
 *   byte 0   bit 0: first give the text this CPU's key on its "cpu " line
 *            and a correct "check " line (FNV-1a of all before it), so
 *            that changed rates, names and layouts get past the checksum
 *            and into the comparison with the canonical text; bit 1: the
 *            group (below) the text is for; bit 2: the result returned is
 *            the GEMM ways' (below), not the group's
 *   byte 1+  the file's text.
 * What reads it:
 *   mp_cache_slurp   (core/cache_file.c) the bounded read: true exactly for
 *                    a file of at most MP_CACHE_MAX bytes without a NUL,
 *                    its bytes unchanged and NUL-terminated;
 *   mp_measured_get  (core/measured.c, the reader of the conversion and
 *                    optimizer-update choices) with one of two groups of
 *                    this target's own, whose timing is made up (so that no
 *                    kernel runs): the choice comes from the file (left as
 *                    it is) or from the timing (the file replaced); then
 *                    the next choice must read the replaced file back as
 *                    the same rates and choices;
 *   the GEMM choice  (kernels/gemm_dispatch.c, mp_gemm_dispatch_query, with
 *                    the test hook's rates instead of timing) the same way,
 *                    where this CPU has more than one bfloat16 kernel
 *                    (AVX-512 and AVX512_BF16); elsewhere it reads no file;
 *   the GEMM ways    (kernels/gemm_ways.c, mp_gemm_ways_on, a float32
 *                    kernel's choice of way) for a kernel of this target's
 *                    own name, with the test hook's rates instead of timing:
 *                    read (the file left as it is) or ignored and replaced,
 *                    and then read back as the same rates and choice.
 *
 * Built two ways: with -DMP_LIBFUZZER as a libFuzzer target (make fuzz
 * FUZZ_TARGET=cache, mk/fuzz.mk), and #included by tests/test_fuzz_cache.c,
 * which runs tests/fuzz/cache/ in make test. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cache_file.h"
#include "core/measured.h"
#include "kernels/gemm_internal.h"
#include "kernels/gemm_ways.h"
#include "mixprec.h"

#define FUZZ_NAME "fuzz_cache"
#include "fuzz_files.h"

/* Run one input; FUZZ_LOADED when a choice was read from it (the file was
 * this version's own), else FUZZ_REFUSED (ignored and replaced). */
int mp_fuzz_cache_one(const uint8_t *data, size_t size);

/* --------------------------------------------------- the made-up groups */

/* Seconds each candidate's run takes, set per input (never 0). */
static double fuzz_seconds[MP_MEASURED_MAX_OPS][MP_ISA_COUNT];

static void fuzz_fill_a(mp_measured_group *g)
{
    static const char *const names[] = {"f32->bf16", "bf16->f32", "adam"};
    static const mp_isa isas[3][MP_MEASURED_MAX] = {
        {MP_ISA_AVX2, MP_ISA_SCALAR, MP_ISA_AVX512},
        {MP_ISA_AVX512BF16, MP_ISA_AVX2, MP_ISA_SCALAR},
        {MP_ISA_SCALAR, MP_ISA_AVX2, MP_ISA_AVX2},
    };
    static const int counts[3] = {3, 2, 3};
    g->nops = 3;
    g->elements = 4099;
    for (int o = 0; o < g->nops; o++) {
        g->op[o] = (mp_measured_op){.name = names[o], .n = counts[o]};
        memcpy(g->op[o].isa, isas[o], sizeof isas[o]);
    }
}

/* One operation with one candidate: nothing to choose, no file read. */
static void fuzz_fill_b(mp_measured_group *g)
{
    g->nops = 2;
    g->elements = 1e6;
    g->op[0] = (mp_measured_op){.name = "sgd", .n = 2, .isa = {MP_ISA_SCALAR, MP_ISA_AVX512}};
    g->op[1] = (mp_measured_op){.name = "f32->e4m3", .n = 1, .isa = {MP_ISA_AVX2}};
}

static bool fuzz_setup(void) { return true; }
static void fuzz_teardown(void) {}
static double fuzz_time(int op, mp_isa isa)
{
    FUZZ_CHECK(op >= 0 && op < MP_MEASURED_MAX_OPS && (unsigned)isa < MP_ISA_COUNT);
    return fuzz_seconds[op][isa];
}

static const mp_measured_spec fuzz_specs[2] = {
    {fuzz_fill_a, fuzz_setup, fuzz_teardown, fuzz_time},
    {fuzz_fill_b, fuzz_setup, fuzz_teardown, fuzz_time},
};
static mp_measured_group fuzz_groups[2] = {{.file = "fuzz-a"}, {.file = "fuzz-b"}};
static atomic_int fuzz_states[2];

/* ----------------------------------------------------------------- text */

/* The text with this CPU's key on its "cpu " line and its "check " line
 * made right, in place (the lines keep their lengths). */
static void fuzz_fix_up(char *t, size_t n)
{
    char hex[17];
    char *cpu = strstr(t, "\ncpu ");
    if (cpu && (size_t)(cpu - t) + 5 + 16 <= n) {
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)mp_cpu_model_key());
        memcpy(cpu + 5, hex, 16);
    }
    char *check = NULL;
    for (char *p = strstr(t, "\ncheck "); p; p = strstr(p + 1, "\ncheck ")) check = p;
    if (check && (size_t)(check - t) + 7 + 16 <= n) {
        snprintf(hex, sizeof hex, "%016llx",
                 (unsigned long long)mp_fnv1a(t, (size_t)(check - t) + 1));
        memcpy(check + 7, hex, 16);
    }
}

/* The file at path, NUL-terminated (malloc'd); its length in *n. */
static char *fuzz_read_back(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    FUZZ_CHECK(f != NULL);
    char *buf = malloc(2 * MP_CACHE_MAX + 2);
    FUZZ_CHECK(buf != NULL);
    *n = fread(buf, 1, 2 * MP_CACHE_MAX + 1, f);
    buf[*n] = '\0';
    fclose(f);
    return buf;
}

/* ------------------------------------------------------------- checks */

/* The bounded read on its own. */
static void fuzz_slurp(const char *path, const char *text, size_t n)
{
    char buf[MP_CACHE_MAX + 2];
    size_t got = (size_t)-1;
    const char *why = NULL;
    bool ok = mp_cache_slurp(path, buf, &got, &why);
    FUZZ_CHECK(why != NULL && why[0]);
    FUZZ_CHECK(ok == (n <= MP_CACHE_MAX && memchr(text, '\0', n) == NULL));
    if (ok) FUZZ_CHECK(got == n && !memcmp(buf, text, n) && buf[n] == '\0');
}

static void fuzz_group_sane(const mp_measured_group *g)
{
    for (int o = 0; o < g->nops; o++) {
        const mp_measured_op *op = &g->op[o];
        FUZZ_CHECK(op->n >= 1 && op->n <= MP_MEASURED_MAX);
        FUZZ_CHECK(op->chosen >= 0 && op->chosen < op->n);
        for (int i = 0; op->n > 1 && i < op->n; i++)
            FUZZ_CHECK(isfinite(op->rate[i]) && op->rate[i] >= 1e-3 && op->rate[i] <= 1e9);
    }
}

/* A choice of group k with the file at its path holding text. */
static int fuzz_measured(int k, const char *text, size_t n)
{
    mp_measured_group *g = &fuzz_groups[k];
    fuzz_write(g->path, text, n, false);
    fuzz_slurp(g->path, text, n);
    mp_measured_reset(&fuzz_states[k]);
    FUZZ_CHECK(mp_measured_get(g, &fuzz_states[k], &fuzz_specs[k]) == g);
    fuzz_group_sane(g);
    size_t back_n;
    char *back = fuzz_read_back(g->path, &back_n);
    int result = FUZZ_REFUSED;
    if (g->source == MP_DISPATCH_CACHED) {
        /* read: the file stays, and it was a whole file of this version */
        FUZZ_CHECK(back_n == n && !memcmp(back, text, n) && !strcmp(g->note, "read"));
        FUZZ_CHECK(n > 0 && text[n - 1] == '\n' && !strncmp(text, "mixprec ", 8));
        result = FUZZ_LOADED;
    } else {
        /* ignored, timed and replaced: the next choice reads it back */
        FUZZ_CHECK(g->source == MP_DISPATCH_MEASURED && strstr(g->note, "ignored") &&
                   strstr(g->note, "written") && !strstr(g->note, "not written"));
        mp_measured_op ops[MP_MEASURED_MAX_OPS];
        memcpy(ops, g->op, sizeof ops);
        mp_measured_reset(&fuzz_states[k]);
        FUZZ_CHECK(mp_measured_get(g, &fuzz_states[k], &fuzz_specs[k]) == g);
        FUZZ_CHECK(g->source == MP_DISPATCH_CACHED && !strcmp(g->note, "read"));
        for (int o = 0; o < g->nops; o++) {
            FUZZ_CHECK(g->op[o].chosen == ops[o].chosen);
            FUZZ_CHECK(!memcmp(g->op[o].rate, ops[o].rate, sizeof ops[o].rate));
        }
    }
    free(back);
    return result;
}

/* The GEMM choice with its file holding text (CPUs with two kernels). */
static void fuzz_gemm(const char *path, const char *text, size_t n, const double *rates)
{
    fuzz_write(path, text, n, false);
    mp_gemm_dispatch_test_rates(rates, 1);
    mp_gemm_dispatch_reset();
    mp_gemm_dispatch_info in;
    FUZZ_CHECK(mp_gemm_dispatch_query(MP_BF16, MP_BF16, &in) == MP_OK);
    FUZZ_CHECK(in.n_kernels >= 2 && in.chosen >= 0 && in.chosen < in.n_kernels);
    FUZZ_CHECK(in.source == MP_DISPATCH_CACHED || in.source == MP_DISPATCH_MEASURED);
    for (int i = 0; i < in.n_kernels; i++)
        FUZZ_CHECK(isfinite(in.gflops[i]) && in.gflops[i] > 0 && in.kernel[i]);
    if (in.source == MP_DISPATCH_CACHED) return;
    /* written again when the rates are clear of each other (they are) */
    FUZZ_CHECK(strstr(in.cache_note, "written") && !strstr(in.cache_note, "not written"));
    mp_gemm_dispatch_reset();
    mp_gemm_dispatch_info back;
    FUZZ_CHECK(mp_gemm_dispatch_query(MP_BF16, MP_BF16, &back) == MP_OK);
    FUZZ_CHECK(back.source == MP_DISPATCH_CACHED && back.chosen == in.chosen);
    FUZZ_CHECK(!memcmp(back.gflops, in.gflops, sizeof in.gflops));
}

/* A float32 kernel's ways with their file holding text; FUZZ_LOADED when
 * the choice was read from it. */
static int fuzz_ways(const char *text, size_t n, uint64_t h)
{
    static gemm_ways w = GEMM_WAYS_INIT("fuzz");
    const double margin = 1.03;
    /* clear of each other (the decision is written), either way ahead */
    const double lo = 10.0 * (double)(1 + (h & 15)), hi = 3 * lo;
    const double rates[4] = {h & 16 ? hi : lo, h & 16 ? lo : hi, h & 16 ? hi : lo,
                             h & 16 ? lo : hi};
    if (!w.path[0]) { /* the file's name, from a first decision */
        mp_gemm_ways_test_rates(rates);
        mp_gemm_ways_force(&w, -1);
        mp_gemm_ways_on(&w, &mp_gemm_scalar_impl, margin);
        FUZZ_CHECK(w.path[0] != '\0');
    }
    fuzz_write(w.path, text, n, false);
    mp_gemm_ways_test_rates(rates);
    mp_gemm_ways_force(&w, -1);
    const bool on = mp_gemm_ways_on(&w, &mp_gemm_scalar_impl, margin);
    FUZZ_CHECK(on == !(w.gflops[0] > margin * w.gflops[1]));
    for (int i = 0; i < 2; i++) FUZZ_CHECK(isfinite(w.gflops[i]) && w.gflops[i] >= 1e-3);
    size_t back_n;
    char *back = fuzz_read_back(w.path, &back_n);
    int result = FUZZ_REFUSED;
    if (w.source == MP_DISPATCH_CACHED) {
        FUZZ_CHECK(back_n == n && !memcmp(back, text, n) && !strcmp(w.note, "read"));
        result = FUZZ_LOADED;
    } else {
        FUZZ_CHECK(w.source == MP_DISPATCH_MEASURED && strstr(w.note, "ignored") &&
                   strstr(w.note, "written") && !strstr(w.note, "not written"));
        FUZZ_CHECK(w.gflops[0] == rates[0] && w.gflops[1] == rates[1]);
        const double got[2] = {w.gflops[0], w.gflops[1]};
        const double others[4] = {rates[1], rates[0], rates[1], rates[0]}; /* the file must win */
        mp_gemm_ways_test_rates(others);
        mp_gemm_ways_force(&w, -1);
        FUZZ_CHECK(mp_gemm_ways_on(&w, &mp_gemm_scalar_impl, margin) == on);
        FUZZ_CHECK(w.source == MP_DISPATCH_CACHED && !strcmp(w.note, "read"));
        FUZZ_CHECK(w.gflops[0] == got[0] && w.gflops[1] == got[1]);
    }
    mp_gemm_ways_test_rates(NULL);
    free(back);
    return result;
}

/* ------------------------------------------------------------ the input */

static char fuzz_gemm_path[sizeof(((mp_gemm_dispatch_info *)0)->cache_file)];

/* The cache in the scratch directory, nothing forced; each group's (and
 * the GEMM choice's) file name, from a first choice. */
static void fuzz_init(void)
{
    static bool done;
    if (done) return;
    done = true;
    unsetenv("MP_ISA");
    mp_isa_reset();
    setenv("MP_DISPATCH_CACHE", fuzz_dir(), 1);
    for (int k = 0; k < 2; k++) {
        for (int o = 0; o < MP_MEASURED_MAX_OPS; o++)
            for (int i = 0; i < MP_ISA_COUNT; i++) fuzz_seconds[o][i] = 1e-3;
        FUZZ_CHECK(mp_measured_get(&fuzz_groups[k], &fuzz_states[k], &fuzz_specs[k]));
        FUZZ_CHECK(fuzz_groups[k].path[0] != '\0');
    }
    const gemm_impl *cands[MP_DISPATCH_MAX_KERNELS];
#if MP_X86
    /* a CPU with one kernel for bf16 operands: the choice between two it
     * has, so that its file is read here too */
    if (mp_gemm_dispatch_candidates(cands, MP_DISPATCH_MAX_KERNELS) < 2 &&
        mp_isa_supported(MP_ISA_AVX2)) {
        const gemm_impl *two[2] = {&mp_gemm_scalar_impl, &mp_gemm_avx2_impl};
        mp_gemm_dispatch_test_candidates(two, 2);
    }
#endif
    /* a CPU with three (AMX tiles too): the first two, whose rates the
     * inputs set below */
    if (mp_gemm_dispatch_candidates(cands, MP_DISPATCH_MAX_KERNELS) > 2)
        mp_gemm_dispatch_test_candidates(cands, 2);
    if (mp_gemm_dispatch_candidates(cands, MP_DISPATCH_MAX_KERNELS) < 2) return;
    static const double rates[2 * MP_DISPATCH_MAX_KERNELS] = {100, 300, 100, 300};
    mp_gemm_dispatch_test_rates(rates, 1);
    mp_gemm_dispatch_reset();
    mp_gemm_dispatch_info in;
    FUZZ_CHECK(mp_gemm_dispatch_query(MP_BF16, MP_BF16, &in) == MP_OK && in.cache_file[0]);
    snprintf(fuzz_gemm_path, sizeof fuzz_gemm_path, "%s", in.cache_file);
}

int mp_fuzz_cache_one(const uint8_t *data, size_t size)
{
    fuzz_init();
    uint8_t flags = size ? data[0] : 0;
    size_t n = size ? size - 1 : 0;
    char *text = malloc(n + 1);
    FUZZ_CHECK(text != NULL);
    if (n) memcpy(text, data + 1, n);
    text[n] = '\0';
    if (flags & 1) fuzz_fix_up(text, n);
    /* made-up times from the input: some choices flip, rates vary */
    uint64_t h = mp_fnv1a(data, size);
    for (int o = 0; o < MP_MEASURED_MAX_OPS; o++)
        for (int i = 0; i < MP_ISA_COUNT; i++)
            fuzz_seconds[o][i] = 1e-4 * (double)(1 + ((h >> ((o * 4 + i) % 60)) & 15));
    int result = fuzz_measured((flags >> 1) & 1, text, n);
    const int ways = fuzz_ways(text, n, h);
    if (flags & 4) result = ways;
    if (fuzz_gemm_path[0]) {
        /* the team's rates, then one thread's: the second kernel clearly ahead */
        const double b = 50.0 * (double)(1 + (h & 15));
        const double rates[2 * MP_DISPATCH_MAX_KERNELS] = {b, 3 * b, b, 3 * b};
        fuzz_gemm(fuzz_gemm_path, text, n, rates);
        mp_gemm_dispatch_test_rates(NULL, 0);
    }
    free(text);
    return result;
}

#ifdef MP_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mp_fuzz_cache_one(data, size);
    return 0;
}
#endif
