/* test_dispatch_cache.c - the GEMM kernel choice's cache file
 * (gemm_dispatch.c): its round trip, bad files (corrupt, truncated,
 * oversized, stale, hostile) ignored and replaced, an unwritable directory
 * harmless, a choice written only when a second round of timing confirms
 * it, where the file goes, and that a sanitized build keys its files
 * apart from an optimized one. Rates are injected; no assertion depends on
 * how fast anything runs. */
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cache_file.h"
#include "dispatch_test.h"

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
                 agree[8] = {100, 300, 100, 300, 110, 280, 110, 280}, unused[4] = {1, 1, 1, 1};
    struct stat st;
    fresh_rounds(cdir, flip, 2);
    mp_gemm_dispatch_info in = query();
    snprintf(want, sizeof want,
             "not written (a second round did not confirm it: %s 300.0 %s 100.0)", in.kernel[0],
             in.kernel[1]);
    if (!strstr(in.cache_note, want)) fail_msg("note '%s', want '%s'", in.cache_note, want);
    assert_true(in.gflops[0] == 300 && in.gflops[1] == 300); /* each kernel's faster rate */
    assert_int_equal(in.chosen, 0);                          /* a tie: the preferred one */
    assert_runs(cands[0]);
    assert_int_not_equal(stat(in.cache_file, &st), 0);
    fresh_rounds(cdir, close, 2);
    in = query();
    assert_non_null(strstr(in.cache_note, "a second round did not confirm it"));
    assert_true(in.gflops[0] == 100 && in.gflops[1] == 300);
    assert_int_equal(in.chosen, 1);
    assert_int_not_equal(stat(in.cache_file, &st), 0);
    if (mp_num_threads() > 1) {
        fresh_rounds(cdir, busy, 2);
        in = query();
        assert_non_null(strstr(in.cache_note, "a second round did not confirm it"));
        assert_non_null(strstr(in.cache_note, "busy"));
        assert_true(in.gflops[0] == 100 && in.gflops[1] == 300); /* the first round's */
        assert_int_not_equal(stat(in.cache_file, &st), 0);
    }
    fresh_rounds(cdir, agree, 2);
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

/* The files' key holds the build flavor: a sanitized build (this test is
 * compiled with the library's flags, build/san under SANITIZE=1) times its
 * kernels at other ratios and must not hand its choices to an optimized
 * build. The key is the hash of a string that includes the flavor, so it
 * cannot be recomputed here; the flavor itself is checked against how this
 * file was compiled. */
static void test_build_flavor(void **state)
{
    (void)state;
#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
    assert_string_equal(mp_build_flavor(), "asan");
#elif defined(__OPTIMIZE__)
    assert_string_equal(mp_build_flavor(), "optimized");
#else
    assert_string_equal(mp_build_flavor(), "unoptimized");
#endif
    if (ncands < 2) skip();
    const double rates[4] = {100, 300, 100, 300};
    char want[64];
    snprintf(want, sizeof want, "-%016llx-", (unsigned long long)mp_cpu_model_key());
    fresh(dir, rates);
    assert_non_null(strstr(query().cache_file, want));
    fresh("0", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_round_trip), cmocka_unit_test(test_bad_cache_files),
        cmocka_unit_test(test_unwritable_cache), cmocka_unit_test(test_second_round),
        cmocka_unit_test(test_cache_location),   cmocka_unit_test(test_build_flavor),
    };
    return cmocka_run_group_tests_name("dispatch cache", tests, setup, teardown);
}
