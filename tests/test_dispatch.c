/* test_dispatch.c - GEMM kernel choice by measurement (gemm_dispatch.c):
 * every candidate for bf16-like operands within the GEMM error bound, the
 * choice one of them and the one mp_gemm runs, MP_ISA / mp_isa_set forcing a
 * path without timing, the cache file's round trip, bad cache files
 * (corrupt, truncated, oversized, stale, hostile) ignored and replaced, an
 * unwritable cache directory harmless, a choice written only when a second
 * round confirms it, first use from many threads, the API and `mixprec
 * info`. Rates that decide are injected where a test needs a given outcome;
 * no assertion depends on how fast anything runs. On a CPU without
 * AVX512_BF16 (one kernel for bf16 operands) the choice runs between the
 * portable and the AVX2 kernels, substituted as the candidates. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "kernels/gemm_internal.h"

static char dir[64];
static const gemm_impl *cands[MP_DISPATCH_MAX_KERNELS];
static int ncands;
static bool own_cands; /* the CPU's own (AVX-512) candidates, not substitutes */

static int setup(void **state)
{
    (void)state;
    /* The process starts on the library's own choice, whatever the caller's
     * environment said. */
    unsetenv("MP_ISA");
    mp_isa_reset();
    ncands = mp_gemm_dispatch_candidates(cands, MP_DISPATCH_MAX_KERNELS);
    own_cands = ncands >= 2;
#if MP_X86
    /* A CPU with one kernel for bf16 operands (no AVX512_BF16) checks the
     * choice's logic on two it has: the portable kernel and AVX2's. */
    if (ncands < 2 && mp_isa_supported(MP_ISA_AVX2)) {
        const gemm_impl *two[2] = {&mp_gemm_scalar_impl, &mp_gemm_avx2_impl};
        mp_gemm_dispatch_test_candidates(two, 2);
        ncands = mp_gemm_dispatch_candidates(cands, MP_DISPATCH_MAX_KERNELS);
    }
#endif
    return test_scratch_dir(dir, sizeof dir, "mp_dispatch");
}

static int teardown(void **state)
{
    (void)state;
    mp_gemm_dispatch_test_candidates(NULL, 0);
    return test_remove_tree(dir);
}

/* A fresh choice on the next use, with the cache in `cache` ("0": off) and
 * the given rates (NULL: timed). */
static void fresh(const char *cache, const double *rates)
{
    setenv("MP_DISPATCH_CACHE", cache, 1);
    mp_gemm_dispatch_test_rates(rates, 1);
    mp_gemm_dispatch_reset();
}

static mp_gemm_dispatch_info query(void)
{
    mp_gemm_dispatch_info in;
    assert_int_equal(mp_gemm_dispatch_query(MP_BF16, MP_BF16, &in), MP_OK);
    return in;
}

/* ------------------------------------------------------------ numerics */

static double gamma_n(double n)
{
    const double u = 0x1p-24;
    return n * u / (1.0 - n * u);
}

/* C = op(A) op(B) on kernel im (NULL: the driver's choice) against a float64
 * reference on the same rounded inputs: within gamma_{k+3} sum |a||b| plus
 * the final rounding, the bound test_gemm.c derives. */
static void check_bound(const gemm_impl *im, mp_dtype at, mp_dtype bt, bool ta, bool tb, int64_t m,
                        int64_t n, int64_t k, uint64_t seed)
{
    test_rng r = {seed};
    const int64_t na = m * k, nb = k * n;
    float *fa = malloc((size_t)na * 4), *fb = malloc((size_t)nb * 4),
          *c = malloc((size_t)(m * n) * 4);
    void *a = malloc((size_t)na * 2), *b = malloc((size_t)nb * 2);
    for (int64_t i = 0; i < na; i++) fa[i] = (float)test_rng_uniform(&r, -1, 1);
    for (int64_t i = 0; i < nb; i++) fb[i] = (float)test_rng_uniform(&r, -1, 1);
    mp_convert(a, at, fa, MP_F32, (size_t)na);
    mp_convert(b, bt, fb, MP_F32, (size_t)nb);
    mp_convert(fa, MP_F32, a, at, (size_t)na);
    mp_convert(fb, MP_F32, b, bt, (size_t)nb);
    mp_gemm_args g = mp_gemm_args_default();
    g.trans_a = ta;
    g.trans_b = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = a;
    g.a_type = at;
    g.lda = ta ? m : k;
    g.b = b;
    g.b_type = bt;
    g.ldb = tb ? k : n;
    g.c = c;
    g.ldc = n;
    assert_int_equal(im ? mp_gemm_ex_on(im, &g) : mp_gemm_ex(&g), MP_OK);
    int bad = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double dot = 0, s = 0;
            for (int64_t p = 0; p < k; p++) {
                double x = ta ? fa[p * m + i] : fa[i * k + p];
                double y = tb ? fb[j * k + p] : fb[p * n + j];
                dot += x * y;
                s += fabs(x * y);
            }
            double tol = gamma_n((double)k + 3.0) * s;
            tol += 0x1p-24 * (fabs(dot) + tol) * 1.0001;
            if (!(fabs((double)c[i * n + j] - dot) <= tol) && bad++ < 5)
                print_error("  C[%lld,%lld] = %.9g, want %.9g (tol %.3g)\n", (long long)i,
                            (long long)j, (double)c[i * n + j], dot, tol);
        }
    free(fa);
    free(fb);
    free(c);
    free(a);
    free(b);
    if (bad) fail_msg("%d elements outside the bound", bad);
}

static void test_candidates_within_bound(void **state)
{
    (void)state;
    if (ncands < 2) skip();
    for (int i = 0; i < ncands; i++) {
        /* Several depth blocks, transposes, fp8 decoded on either route. */
        check_bound(cands[i], MP_BF16, MP_BF16, false, false, 70, 100, 1100, 1);
        check_bound(cands[i], MP_BF16, MP_BF16, true, true, 33, 97, 301, 2);
        check_bound(cands[i], MP_F8E4M3, MP_BF16, false, true, 64, 50, 200, 3);
        check_bound(cands[i], MP_F8E5M2, MP_F8E4M3, true, false, 17, 130, 77, 4);
    }
}

/* C = A B for one row of A holding a bf16 subnormal: vdpbf16ps reads it as
 * zero, the FMA route keeps it. The bits tell which kernel ran. */
static uint32_t signature(const gemm_impl *im)
{
    const uint16_t a[2] = {0x0040 /* 2^-127 */, 0x3F80 /* 1 */};
    const uint16_t b[2] = {0x3F80, 0x0000};
    float c = -1.0f;
    mp_gemm_args g = mp_gemm_args_default();
    g.m = g.n = 1;
    g.k = 2;
    g.a = a;
    g.b = b;
    g.c = &c;
    g.a_type = g.b_type = MP_BF16;
    g.lda = 2;
    g.ldb = g.ldc = 1;
    assert_int_equal(im ? mp_gemm_ex_on(im, &g) : mp_gemm_ex(&g), MP_OK);
    return f32_bits(c);
}

/* mp_gemm on bf16 inputs runs kernel im. */
static void assert_runs(const gemm_impl *im)
{
    assert_ptr_equal(mp_gemm_impl_for(MP_BF16, MP_BF16), im);
    bool tell = true;
    for (int i = 0; i < ncands; i++)
        for (int j = 0; j < i; j++) tell = tell && signature(cands[i]) != signature(cands[j]);
    if (tell) assert_int_equal(signature(NULL), signature(im));
}

/* ------------------------------------------------------------- choosing */

static void test_choice_is_a_candidate(void **state)
{
    (void)state;
    fresh("0", NULL); /* timed for real */
    mp_gemm_dispatch_info in = query();
    if (ncands < 2) {
        assert_int_equal(in.source, MP_DISPATCH_ONLY);
        assert_int_equal(in.n_kernels, 1);
        return;
    }
    assert_int_equal(in.source, MP_DISPATCH_MEASURED);
    assert_int_equal(in.n_kernels, ncands);
    assert_true(in.chosen >= 0 && in.chosen < ncands);
    assert_true(in.threads >= 1);
    for (int i = 0; i < ncands; i++) {
        assert_true(in.gflops[i] > 0);
        assert_non_null(in.method[i]);
        mp_isa isa;
        assert_int_equal(mp_isa_from_name(in.kernel[i], &isa), MP_OK);
        assert_true(mp_isa_supported(isa));
    }
    assert_string_equal(in.cache_file, "");
    assert_non_null(strstr(in.cache_note, "MP_DISPATCH_CACHE=0"));
    assert_runs(cands[in.chosen]);
    check_bound(NULL, MP_BF16, MP_BF16, false, true, 40, 60, 500, 5);
    /* Every pair of bf16/fp8 types is a class of its own, timed on its own
     * operands; each picks a candidate and mp_gemm runs it. */
    const mp_dtype like[3] = {MP_BF16, MP_F8E4M3, MP_F8E5M2};
    for (int x = 0; x < 3; x++)
        for (int y = 0; y < 3; y++) {
            mp_gemm_dispatch_info p;
            assert_int_equal(mp_gemm_dispatch_query(like[x], like[y], &p), MP_OK);
            assert_int_equal(p.source, MP_DISPATCH_MEASURED);
            assert_int_equal(p.n_kernels, ncands);
            assert_true(p.chosen >= 0 && p.chosen < ncands);
            assert_ptr_equal(mp_gemm_impl_for(like[x], like[y]), cands[p.chosen]);
        }
    /* The choice is kept: asking again times nothing new. */
    mp_gemm_dispatch_info again = query();
    assert_int_equal(again.chosen, in.chosen);
    assert_memory_equal(again.gflops, in.gflops, sizeof in.gflops);
    /* Other pairs have one kernel. */
    mp_gemm_dispatch_info f;
    assert_int_equal(mp_gemm_dispatch_query(MP_F32, MP_BF16, &f), MP_OK);
    assert_int_equal(f.source, MP_DISPATCH_ONLY);
    assert_int_equal(f.n_kernels, 1);
    assert_string_equal(f.kernel[0], mp_isa_supported(MP_ISA_AVX512) ? "avx512"
                                     : mp_isa_supported(MP_ISA_AVX2)   ? "avx2"
                                                                       : "scalar");
}

/* Injected rates decide, the faster wins, the preferred (first) candidate
 * keeps ties inside the margin. */
static void test_faster_wins(void **state)
{
    (void)state;
    if (ncands < 2) skip();
    const double slow_first[4] = {100, 200, 100, 200}, fast_first[4] = {200, 100, 200, 100},
                 tie[4] = {100, 102, 100, 102};
    fresh("0", slow_first);
    assert_int_equal(query().chosen, 1);
    assert_runs(cands[1]);
    fresh("0", fast_first);
    assert_int_equal(query().chosen, 0);
    assert_runs(cands[0]);
    fresh("0", tie);
    assert_int_equal(query().chosen, 0);
    assert_runs(cands[0]);
    mp_gemm_dispatch_test_rates(NULL, 0);
}

static void test_forced_path(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/forced", dir);
    fresh(path, NULL);
    /* MP_ISA, read when the path is first needed. */
    setenv("MP_ISA", "avx512", 1);
    mp_isa_reset();
    if (mp_isa_supported(MP_ISA_AVX512)) {
        mp_gemm_dispatch_info in = query();
        assert_int_equal(in.source, MP_DISPATCH_FORCED);
        assert_int_equal(in.n_kernels, 1);
        assert_string_equal(in.kernel[0], "avx512");
#if MP_X86
        assert_runs(&mp_gemm_avx512_impl);
#endif
    }
#if MP_X86
    if (mp_isa_supported(MP_ISA_AVX512BF16)) {
        setenv("MP_ISA", "avx512bf16", 1);
        mp_isa_reset();
        mp_gemm_dispatch_info in = query();
        assert_int_equal(in.source, MP_DISPATCH_FORCED);
        assert_string_equal(in.kernel[0], "avx512bf16");
        assert_runs(&mp_gemm_avx512bf16_impl);
        check_bound(NULL, MP_BF16, MP_BF16, false, false, 50, 70, 600, 6);
        /* mp_isa_set forces too. */
        unsetenv("MP_ISA");
        mp_isa_reset();
        assert_int_equal(mp_isa_set(MP_ISA_AVX512), MP_OK);
        assert_int_equal(query().source, MP_DISPATCH_FORCED);
        assert_runs(&mp_gemm_avx512_impl);
        assert_int_equal(mp_isa_set(MP_ISA_AVX512BF16), MP_OK);
        assert_runs(&mp_gemm_avx512bf16_impl);
    }
#endif
    /* A forced path times nothing and writes no cache. */
    struct stat st;
    assert_int_not_equal(stat(path, &st), 0);
    unsetenv("MP_ISA");
    mp_isa_reset();
    assert_false(mp_isa_forced());
}

/* ---------------------------------------------------------------- cache */

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 16);
    *n = fread(buf, 1, (1 << 16) - 1, f);
    fclose(f);
    return buf;
}

static void spit(const char *path, const char *data, size_t n)
{
    unlink(path);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* The cache file's closing line: FNV-1a 64 over everything before it. */
static void recheck(char *text)
{
    char *chk = strstr(text, "check ");
    assert_non_null(chk);
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = text; p < chk; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    sprintf(chk, "check %016llx\n", (unsigned long long)h);
}

/* text with the first `from` replaced by `to`, its check line recomputed. */
static char *variant(const char *text, const char *from, const char *to)
{
    char *out = calloc(1, strlen(text) + strlen(to) + 64);
    const char *p = strstr(text, from);
    assert_non_null(p);
    memcpy(out, text, (size_t)(p - text));
    strcat(out, to);
    strcat(out, p + strlen(from));
    recheck(out);
    return out;
}

static void test_cache_round_trip(void **state)
{
    (void)state;
    if (ncands < 2) skip();
    char cdir[128];
    snprintf(cdir, sizeof cdir, "%s/rt/nested", dir); /* made on demand */
    const double rates[4] = {120.5, 250.25, 120.5, 250.25}, other[4] = {999, 1, 999, 1};
    fresh(cdir, rates);
    mp_clear_error();
    mp_gemm_dispatch_info in = query();
    assert_int_equal(in.source, MP_DISPATCH_MEASURED);
    assert_int_equal(in.chosen, 1);
    assert_non_null(strstr(in.cache_file, cdir));
    assert_non_null(strstr(in.cache_note, "written"));
    assert_null(strstr(in.cache_note, "not written"));
    assert_string_equal(mp_last_error(), "");
    /* The name carries the CPU hash, the version and the thread count. */
    char tail[64];
    snprintf(tail, sizeof tail, "-%s-t%d-bf16xbf16", MP_VERSION_STRING, in.threads);
    assert_non_null(strstr(in.cache_file, "/gemm-"));
    assert_non_null(strstr(in.cache_file, tail));
    /* Read back, even with other rates on offer. */
    fresh(cdir, other);
    mp_gemm_dispatch_info back = query();
    assert_int_equal(back.source, MP_DISPATCH_CACHED);
    assert_int_equal(back.chosen, 1);
    assert_true(back.gflops[0] == 120.5 && back.gflops[1] == 250.25);
    assert_string_equal(back.cache_note, "read");
    assert_runs(cands[1]);
    /* A file this test writes the same way decides the same (the format is
     * what the test believes it is). */
    size_t n;
    char *text = slurp(in.cache_file, &n);
    char from[48], to[48];
    snprintf(from, sizeof from, "%s 120500 ", in.kernel[0]);
    snprintf(to, sizeof to, "%s 500000 ", in.kernel[0]);
    char *rate = variant(text, from, to);
    snprintf(from, sizeof from, "-> %s\n", in.kernel[1]);
    snprintf(to, sizeof to, "-> %s\n", in.kernel[0]);
    char *flip = variant(rate, from, to);
    spit(in.cache_file, flip, strlen(flip));
    fresh(cdir, other);
    back = query();
    assert_int_equal(back.source, MP_DISPATCH_CACHED);
    assert_int_equal(back.chosen, 0);
    assert_runs(cands[0]);
    free(rate);
    free(flip);
    free(text);
    /* Classes are timed when first used: only this pair's file is there,
     * and no temporary file beside it. */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq 1", cdir);
    assert_int_equal(system(cmd), 0);
    mp_gemm_dispatch_test_rates(NULL, 0);
}

/* Every bad file is ignored without an error, the choice measured again and
 * the file replaced by a good one. */
static void test_bad_cache_files(void **state)
{
    (void)state;
    if (ncands < 2) skip();
    char cdir[128];
    snprintf(cdir, sizeof cdir, "%s/bad", dir);
    const double first[4] = {100, 300, 100, 300}, again[4] = {400, 100, 400, 100},
                 unused[4] = {1, 1, 1, 1};
    fresh(cdir, first);
    mp_gemm_dispatch_info in = query();
    assert_int_equal(in.source, MP_DISPATCH_MEASURED);
    size_t n;
    char *good = slurp(in.cache_file, &n);
    assert_non_null(good);
    assert_int_equal(n, strlen(good));

    char garbage[300];
    test_rng r = {9};
    for (size_t i = 0; i < sizeof garbage; i++) garbage[i] = (char)test_rng_u32(&r);
    char *big = malloc(8192);
    memcpy(big, good, n);
    memset(big + n, ' ', 8192 - n);
    char *nul = strdup(good);
    nul[n / 2] = '\0';
    char r0[48], to[48], c1[48], c0[48];
    snprintf(r0, sizeof r0, "%s 100000 ", in.kernel[0]);
    snprintf(c1, sizeof c1, "-> %s\n", in.kernel[1]);
    snprintf(c0, sizeof c0, "-> %s\n", in.kernel[0]);
    char *digit = strdup(good);
    strstr(digit, r0)[strlen(in.kernel[0]) + 1] = '7'; /* a rate changed behind the check line */
    char *version = variant(good, "version " MP_VERSION_STRING, "version 0.0.9");
    char *cpu = strdup(good); /* another CPU's file under this one's name */
    char *hex = strstr(cpu, "\ncpu ") + 5;
    *hex = *hex == '0' ? '1' : '0';
    recheck(cpu);
    char *threads = variant(good, "threads ", "threads 1");
    char *choice = variant(good, c1, c0);
    snprintf(to, sizeof to, "%s 0 ", in.kernel[0]);
    char *zero = variant(good, r0, to);
    snprintf(to, sizeof to, "%s 99999999999 ", in.kernel[0]);
    char *huge = variant(good, r0, to);
    snprintf(to, sizeof to, "%s nan ", in.kernel[0]);
    char *nan = variant(good, r0, to);
    snprintf(to, sizeof to, "%s -100000 ", in.kernel[0]);
    char *sign = variant(good, r0, to);
    char *extra = variant(good, "check", "spare line\ncheck");
    char *pair = variant(good, "\nbf16xbf16 ", "\ne4m3xe4m3 "); /* another pair's file */
    const struct {
        const char *what, *data;
        size_t n;
    } bad[] = {
        {"garbage", garbage, sizeof garbage},
        {"empty", "", 0},
        {"truncated", good, n / 2},
        {"no final newline", good, n - 1},
        {"oversized", big, 8192},
        {"NUL inside", nul, n},
        {"digit changed", digit, n},
        {"other version", version, strlen(version)},
        {"other cpu", cpu, strlen(cpu)},
        {"other threads", threads, strlen(threads)},
        {"choice against its rates", choice, strlen(choice)},
        {"zero rate", zero, strlen(zero)},
        {"huge rate", huge, strlen(huge)},
        {"nan rate", nan, strlen(nan)},
        {"negative rate", sign, strlen(sign)},
        {"extra line", extra, strlen(extra)},
        {"another pair's file", pair, strlen(pair)},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        spit(in.cache_file, bad[i].data, bad[i].n);
        fresh(cdir, again);
        mp_set_error(MP_ERR_IO, "sentinel");
        mp_gemm_dispatch_info x = query();
        if (x.source != MP_DISPATCH_MEASURED || !strstr(x.cache_note, "ignored") ||
            !strstr(x.cache_note, "written") || strstr(x.cache_note, "not written"))
            fail_msg("%s: source %d, note '%s'", bad[i].what, (int)x.source, x.cache_note);
        assert_int_equal(x.chosen, 0);
        assert_string_equal(mp_last_error(), "sentinel");
        /* replaced: the next process reads the new rates */
        fresh(cdir, unused);
        x = query();
        if (x.source != MP_DISPATCH_CACHED || x.gflops[0] != 400)
            fail_msg("%s: not replaced (source %d)", bad[i].what, (int)x.source);
    }

    /* Hostile things at the file's place. A FIFO would block a plain open. */
    unlink(in.cache_file);
    assert_int_equal(mkfifo(in.cache_file, 0600), 0);
    fresh(cdir, first);
    assert_int_equal(query().source, MP_DISPATCH_MEASURED);
    fresh(cdir, unused);
    assert_int_equal(query().source, MP_DISPATCH_CACHED);
    /* A link is not followed: its target stays as it was, the link is
     * replaced by a file. */
    char target[160];
    snprintf(target, sizeof target, "%s/target", dir);
    spit(target, good, n);
    unlink(in.cache_file);
    assert_int_equal(symlink(target, in.cache_file), 0);
    fresh(cdir, again);
    in = query();
    assert_int_equal(in.source, MP_DISPATCH_MEASURED);
    size_t tn;
    char *t = slurp(target, &tn);
    assert_int_equal(tn, n);
    assert_memory_equal(t, good, n);
    free(t);
    struct stat st;
    assert_int_equal(lstat(in.cache_file, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    /* A directory cannot be replaced: measured each time, no harm. */
    unlink(in.cache_file);
    assert_int_equal(mkdir(in.cache_file, 0700), 0);
    fresh(cdir, first);
    in = query();
    assert_int_equal(in.source, MP_DISPATCH_MEASURED);
    assert_non_null(strstr(in.cache_note, "not written"));
    assert_int_equal(in.chosen, 1);
    assert_runs(cands[1]);
    rmdir(in.cache_file);

    free(big);
    free(nul);
    free(digit);
    free(version);
    free(cpu);
    free(threads);
    free(choice);
    free(zero);
    free(huge);
    free(nan);
    free(sign);
    free(extra);
    free(pair);
    free(good);
    mp_gemm_dispatch_test_rates(NULL, 0);
}

static void test_unwritable_cache(void **state)
{
    (void)state;
    if (ncands < 2) skip();
    /* A regular file where a directory should be (root ignores modes). */
    char file[128], cdir[160];
    snprintf(file, sizeof file, "%s/plainfile", dir);
    spit(file, "x", 1);
    snprintf(cdir, sizeof cdir, "%s/sub", file);
    const double rates[4] = {100, 300, 100, 300};
    fresh(cdir, rates);
    mp_set_error(MP_ERR_IO, "sentinel");
    mp_gemm_dispatch_info in = query();
    assert_int_equal(in.source, MP_DISPATCH_MEASURED);
    assert_non_null(strstr(in.cache_note, "not written"));
    assert_string_equal(mp_last_error(), "sentinel");
    assert_runs(cands[1]);
    check_bound(NULL, MP_BF16, MP_BF16, true, false, 30, 40, 300, 7);
    /* Rates too close to call are not cached: the next process times again. */
    const double close[4] = {100, 101, 100, 101};
    snprintf(cdir, sizeof cdir, "%s/close", dir);
    fresh(cdir, close);
    in = query();
    assert_int_equal(in.source, MP_DISPATCH_MEASURED);
    assert_non_null(strstr(in.cache_note, "too close"));
    fresh(cdir, rates);
    assert_int_equal(query().source, MP_DISPATCH_MEASURED);
    /* Ahead by more than the choosing margin but less than the keeping one:
     * chosen, not kept. */
    const double ahead[4] = {100, 106, 100, 106};
    snprintf(cdir, sizeof cdir, "%s/ahead", dir);
    fresh(cdir, ahead);
    in = query();
    assert_int_equal(in.chosen, 1);
    assert_non_null(strstr(in.cache_note, "too close"));
    assert_runs(cands[1]);
    mp_gemm_dispatch_test_rates(NULL, 0);
}

/* A clear choice is timed again before it is written (a file outlives the
 * process; one round in a moment of load can mislead): a second round that
 * picks the other kernel, finds the two within the cache margin or runs on
 * a busy machine writes nothing, and one that agrees writes each kernel's
 * faster rate. Per round: the team's rates, then one thread's. */
static void test_second_round(void **state)
{
    (void)state;
    if (ncands < 2) skip();
    char cdir[128], want[160];
    snprintf(cdir, sizeof cdir, "%s/second", dir);
    const double flip[8] = {100, 300, 100, 300, 300, 100, 300, 100},
                 close[8] = {100, 300, 100, 300, 100, 105, 100, 105},
                 busy[8] = {100, 300, 100, 300, 100, 300, 150, 350},
                 agree[8] = {100, 300, 100, 300, 110, 280, 110, 280},
                 unused[4] = {1, 1, 1, 1};
    struct stat st;
    fresh(cdir, NULL);
    mp_gemm_dispatch_test_rates(flip, 2);
    mp_gemm_dispatch_info in = query();
    snprintf(want, sizeof want, "not written (a second round did not confirm it: %s 300.0 %s 100.0)",
             in.kernel[0], in.kernel[1]);
    if (!strstr(in.cache_note, want)) fail_msg("note '%s', want '%s'", in.cache_note, want);
    assert_true(in.gflops[0] == 300 && in.gflops[1] == 300); /* each kernel's faster rate */
    assert_int_equal(in.chosen, 0);                          /* a tie: the preferred one */
    assert_runs(cands[0]);
    assert_int_not_equal(stat(in.cache_file, &st), 0);
    mp_gemm_dispatch_test_rates(close, 2);
    mp_gemm_dispatch_reset();
    in = query();
    assert_non_null(strstr(in.cache_note, "a second round did not confirm it"));
    assert_true(in.gflops[0] == 100 && in.gflops[1] == 300);
    assert_int_equal(in.chosen, 1);
    assert_int_not_equal(stat(in.cache_file, &st), 0);
    if (mp_num_threads() > 1) {
        mp_gemm_dispatch_test_rates(busy, 2);
        mp_gemm_dispatch_reset();
        in = query();
        assert_non_null(strstr(in.cache_note, "a second round did not confirm it"));
        assert_non_null(strstr(in.cache_note, "busy"));
        assert_true(in.gflops[0] == 100 && in.gflops[1] == 300); /* the first round's */
        assert_int_not_equal(stat(in.cache_file, &st), 0);
    }
    mp_gemm_dispatch_test_rates(agree, 2);
    mp_gemm_dispatch_reset();
    in = query();
    assert_non_null(strstr(in.cache_note, "written"));
    assert_null(strstr(in.cache_note, "not written"));
    assert_true(in.gflops[0] == 110 && in.gflops[1] == 300);
    fresh(cdir, unused);
    in = query();
    assert_int_equal(in.source, MP_DISPATCH_CACHED);
    assert_true(in.gflops[0] == 110 && in.gflops[1] == 300);
    assert_int_equal(in.chosen, 1);
    assert_runs(cands[1]);
    mp_gemm_dispatch_test_rates(NULL, 0);
}

/* A team slower than one thread means other work holds the cores: the
 * one-thread rates decide and nothing is cached. */
static void test_busy_machine(void **state)
{
    (void)state;
    if (ncands < 2) skip();
    const double busy[4] = {15, 7, 150, 85}, calm[4] = {270, 165, 150, 85};
    char cdir[128];
    snprintf(cdir, sizeof cdir, "%s/busy", dir);
    fresh(cdir, busy);
    mp_gemm_dispatch_info in = query();
    assert_int_equal(in.source, MP_DISPATCH_MEASURED);
    assert_int_equal(in.threads, 1);
    assert_true(in.gflops[0] == 150 && in.gflops[1] == 85);
    assert_int_equal(in.chosen, 0);
    if (mp_num_threads() > 1) {
        assert_non_null(strstr(in.cache_note, "busy"));
        struct stat st;
        assert_int_not_equal(stat(in.cache_file, &st), 0);
    }
    /* A calm machine: the team's rates, kept. */
    fresh(cdir, calm);
    in = query();
    assert_int_equal(in.threads, mp_num_threads());
    assert_true(in.gflops[0] == (mp_num_threads() > 1 ? 270 : 150));
    assert_non_null(strstr(in.cache_note, "written"));
    assert_null(strstr(in.cache_note, "not written"));
    mp_gemm_dispatch_test_rates(NULL, 0);
}

/* Timing that runs out of memory falls back to the feature-flag rule,
 * caches nothing and leaves the caller's error message alone. */
static void test_timing_out_of_memory(void **state)
{
    (void)state;
    if (ncands < 2) skip();
    char cdir[128];
    snprintf(cdir, sizeof cdir, "%s/oom", dir);
    fresh(cdir, NULL);
    mp_set_error(MP_ERR_IO, "sentinel");
    mp_scratch_fail_above = 64 << 10;
    mp_gemm_dispatch_info in = query();
    mp_scratch_fail_above = SIZE_MAX;
    assert_int_equal(in.source, MP_DISPATCH_DEFAULT);
    assert_int_equal(in.chosen, ncands - 1);
    assert_true(in.gflops[0] == 0);
    assert_non_null(strstr(in.cache_note, "not written"));
    assert_string_equal(mp_last_error(), "sentinel");
    assert_runs(cands[ncands - 1]);
    check_bound(NULL, MP_BF16, MP_BF16, false, false, 20, 30, 100, 8);
    struct stat st;
    assert_int_not_equal(stat(in.cache_file, &st), 0);
    fresh("0", NULL);
}

/* Where the file goes without MP_DISPATCH_CACHE. */
static void test_cache_location(void **state)
{
    (void)state;
    if (ncands < 2) skip();
    char *home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
    char *xdg = getenv("XDG_CACHE_HOME") ? strdup(getenv("XDG_CACHE_HOME")) : NULL;
    const double rates[4] = {100, 300, 100, 300};
    char want[160], p[160];
    unsetenv("MP_DISPATCH_CACHE");
    mp_gemm_dispatch_test_rates(rates, 1);

    snprintf(p, sizeof p, "%s/xdg", dir);
    setenv("XDG_CACHE_HOME", p, 1);
    mp_gemm_dispatch_reset();
    snprintf(want, sizeof want, "%s/xdg/mixprec/gemm-", dir);
    assert_non_null(strstr(query().cache_file, want));

    setenv("XDG_CACHE_HOME", "relative/is/ignored", 1);
    snprintf(p, sizeof p, "%s/home", dir);
    setenv("HOME", p, 1);
    mp_gemm_dispatch_reset();
    snprintf(want, sizeof want, "%s/home/.cache/mixprec/gemm-", dir);
    mp_gemm_dispatch_info in = query();
    assert_non_null(strstr(in.cache_file, want));
    assert_int_equal(access(in.cache_file, R_OK), 0);

    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    mp_gemm_dispatch_reset();
    in = query();
    assert_int_equal(in.source, MP_DISPATCH_MEASURED);
    assert_string_equal(in.cache_file, "");
    assert_non_null(strstr(in.cache_note, "off"));

    if (home) setenv("HOME", home, 1);
    if (xdg) setenv("XDG_CACHE_HOME", xdg, 1);
    free(home);
    free(xdg);
    fresh("0", NULL);
}

/* First use from several threads at once (inside an OpenMP region of the
 * kernels' own team size: threads beyond it would exit later and take their
 * scratch with them): one choice, the same bits everywhere. */
static void test_first_use_threads(void **state)
{
    (void)state;
    enum { T = 8, M = 48, N = 64, K = 300 };
    test_rng r = {11};
    uint16_t *a = malloc(M * K * 2), *b = malloc(K * N * 2);
    float *c = malloc((size_t)T * M * N * 4), *f = malloc(K * N * 4);
    for (int i = 0; i < K * N; i++) f[i] = (float)test_rng_uniform(&r, -1, 1);
    mp_convert(a, MP_BF16, f, MP_F32, M * K);
    mp_convert(b, MP_BF16, f, MP_F32, K * N);
    char cdir[128];
    snprintf(cdir, sizeof cdir, "%s/threads", dir);
    fresh(cdir, NULL);
#pragma omp parallel for num_threads(mp_num_threads()) schedule(static, 1)
    for (int t = 0; t < T; t++)
        mp_gemm(false, false, M, N, K, 1.0f, a, MP_BF16, K, b, MP_BF16, N, 0.0f, c + t * M * N,
                MP_F32, N);
    for (int t = 1; t < T; t++) assert_memory_equal(c, c + t * M * N, M * N * 4);
    mp_gemm_dispatch_info in = query();
    if (ncands >= 2) {
        assert_int_equal(in.source, MP_DISPATCH_MEASURED);
        float *d = malloc(M * N * 4);
        mp_gemm_args g = mp_gemm_args_default();
        g.m = M;
        g.n = N;
        g.k = K;
        g.a = a;
        g.b = b;
        g.c = d;
        g.a_type = g.b_type = MP_BF16;
        g.lda = K;
        g.ldb = g.ldc = N;
        assert_int_equal(mp_gemm_ex_on(cands[in.chosen], &g), MP_OK);
        assert_memory_equal(c, d, M * N * 4);
        free(d);
    }
    free(a);
    free(b);
    free(c);
    free(f);
    fresh("0", NULL);
}

/* ------------------------------------------------------------- the API */

static void test_api(void **state)
{
    (void)state;
    mp_gemm_dispatch_info in;
    assert_int_equal(mp_gemm_dispatch_query(MP_BF16, MP_BF16, NULL), MP_ERR_INVALID);
    assert_int_equal(mp_gemm_dispatch_query((mp_dtype)42, MP_BF16, &in), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "dtype"));
    assert_int_equal(mp_gemm_dispatch_report(NULL), MP_ERR_INVALID);
    const double rates[4] = {100, 300, 100, 300};
    fresh("0", ncands >= 2 ? rates : NULL);
    FILE *f = tmpfile();
    assert_int_equal(mp_gemm_dispatch_report(f), MP_OK);
    char buf[4096] = {0};
    rewind(f);
    assert_true(fread(buf, 1, sizeof buf - 1, f) > 0);
    fclose(f);
    assert_non_null(strstr(buf, "gemm bf16/fp8 inputs: "));
    assert_non_null(strstr(buf, "gemm other input types: "));
    assert_non_null(strstr(buf, "gemm blocks at depth 4096 (L1d "));
    if (own_cands) {
#if MP_X86
        /* both kernels' blocks, as the driver takes them */
        int64_t kcb, nc;
        char want[96];
        mp_gemm_blocks(&mp_gemm_avx512bf16_impl, 4096, 4096, false, false, &kcb, &nc);
        snprintf(want, sizeof want, "avx512bf16 %lld deep x %lld columns", (long long)kcb,
                 (long long)nc);
        assert_non_null(strstr(buf, want));
        mp_gemm_blocks(&mp_gemm_avx512_impl, 4096, 4096, false, false, &kcb, &nc);
        snprintf(want, sizeof want, "avx512 %lld deep x %lld columns", (long long)kcb,
                 (long long)nc);
        assert_non_null(strstr(buf, want));
        /* the rule (gemm_internal.h's kc_l1), for both kernels: where L1d
         * holds the 8 x kc_l1 micro-panel in two thirds, depth kc_l1 and
         * the B block within half of L2; else kc and nc as the impl has
         * them */
        const gemm_impl *ims[2] = {&mp_gemm_avx512bf16_impl, &mp_gemm_avx512_impl};
        const int64_t l1 = (int64_t)mp_cpu_cache_bytes(1), l2 = (int64_t)mp_cpu_cache_bytes(2);
        for (int i = 0; i < 2; i++) {
            const gemm_impl *im = ims[i];
            const int64_t esz = im->fmt == GEMM_FMT_BF16 ? 2 : 4;
            assert_true(im->kc_l1 > 0);
            mp_gemm_blocks(im, 4096, 4096, false, false, &kcb, &nc);
            const bool fits = 3 * im->mr * im->kc_l1 * esz <= 2 * l1 && l2 > 0;
            if (fits) { /* 48 KiB and more */
                assert_int_equal(kcb, im->kc_l1);
                assert_true(nc % im->nr == 0 && nc >= im->nr && nc <= im->nc);
                assert_true(nc == im->nr || nc * kcb * esz <= l2 / 2);
            } else {
                assert_int_equal(kcb, im->kc);
                assert_int_equal(nc, im->nc);
            }
            /* a depth beyond a block splits into equal blocks: 4500 is 3 x
             * 1500 under 2048, 2 x 2250 under 4096 (bf16); 5 x 900 under
             * 1024 (float32, both ways) */
            mp_gemm_blocks(im, 4500, 4096, false, false, &kcb, &nc);
            assert_int_equal(kcb, im->fmt == GEMM_FMT_F32 ? 900 : fits ? 1500 : 2250);
        }
#endif
    }
    if (ncands >= 2) {
        char want[96];
        snprintf(want, sizeof want, "bf16 x bf16        100.0       300.0  %-11s timed in this "
                 "process", query().kernel[1]);
        assert_non_null(strstr(buf, "a x b"));
        assert_non_null(strstr(buf, want));
        assert_non_null(strstr(buf, "e5m2 x e4m3"));
    }
    mp_gemm_dispatch_test_rates(NULL, 0);
}

/* `mixprec info` prints the rates, the choice and where it came from, and
 * MP_ISA from the environment forces the path. */
static void test_cli_info(void **state)
{
    (void)state;
    const char *cli = getenv("MP_CLI");
    if (!cli) cli = "build/mixprec";
    if (access(cli, X_OK) != 0) skip();
    char cmd[512], out[160];
    snprintf(out, sizeof out, "%s/info.txt", dir);
    const char *cases[3][2] = {
        {"MP_DISPATCH_CACHE=%s/cli", "timed in this process"},
        {"MP_DISPATCH_CACHE=%s/cli", "read from the cache"},
        {"MP_ISA=avx512 MP_DISPATCH_CACHE=%s/cli", "forced by MP_ISA"},
    };
    for (int i = own_cands ? 0 : 2; i < 3; i++) {
        if (i == 2 && !mp_isa_supported(MP_ISA_AVX512)) break;
        char env[256];
        snprintf(env, sizeof env, cases[i][0], dir);
        snprintf(cmd, sizeof cmd, "env %s %s info > %s 2>&1", env, cli, out);
        int st = system(cmd);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        size_t n;
        char *text = slurp(out, &n);
        if (!strstr(text, cases[i][1])) {
            /* A choice too close to keep, or made on a busy machine, is
             * timed again: that is not a failure. */
            if (i == 1 && (strstr(text, "too close") || strstr(text, "busy"))) {
                free(text);
                continue;
            }
            fail_msg("mixprec info (%s) does not say '%s':\n%s", env, cases[i][1], text);
        }
        if (i < 2) assert_non_null(strstr(text, "  bf16 x bf16 "));
        free(text);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_candidates_within_bound),
        cmocka_unit_test(test_choice_is_a_candidate),
        cmocka_unit_test(test_faster_wins),
        cmocka_unit_test(test_forced_path),
        cmocka_unit_test(test_cache_round_trip),
        cmocka_unit_test(test_bad_cache_files),
        cmocka_unit_test(test_unwritable_cache),
        cmocka_unit_test(test_busy_machine),
        cmocka_unit_test(test_second_round),
        cmocka_unit_test(test_timing_out_of_memory),
        cmocka_unit_test(test_cache_location),
        cmocka_unit_test(test_first_use_threads),
        cmocka_unit_test(test_api),
        cmocka_unit_test(test_cli_info),
    };
    return cmocka_run_group_tests_name("dispatch", tests, setup, teardown);
}
