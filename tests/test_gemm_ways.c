/* test_gemm_ways.c - the float32 kernels' measured choice of way
 * (kernels/gemm_ways.c) and its cache file: the choice follows the rule
 * (way 1 unless way 0 is `margin` faster), only a clear choice that a
 * second round confirms is written, a written file is read back as the
 * same rates, and a bad or stale file (garbage, a changed digit, another
 * CPU, another kernel, a choice against the rule, oversized, a directory)
 * is ignored, timed again and replaced, never trusted. The rates come from the test hook, so
 * nothing here depends on how fast anything runs; test_gemm_stream holds the two ways to the same
 * bits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "core/cache_file.h"
#include "kernels/gemm_ways.h"

#define MARGIN 1.03

static char dir[64];

static int setup(void **state)
{
    (void)state;
    if (test_scratch_dir(dir, sizeof dir, "mp_gemm_ways")) return -1;
    setenv("MP_DISPATCH_CACHE", dir, 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    mp_gemm_ways_test_rates(NULL);
    setenv("MP_DISPATCH_CACHE", "0", 1);
    return test_remove_tree(dir);
}

/* A fresh decision with the first round's rates r0, r1 and the second's
 * s0, s1: way 1 chosen or not. */
static bool decide2(gemm_ways *w, double r0, double r1, double s0, double s1)
{
    const double rates[4] = {r0, r1, s0, s1};
    mp_gemm_ways_test_rates(rates);
    mp_gemm_ways_force(w, -1);
    const bool on = mp_gemm_ways_on(w, &mp_gemm_scalar_impl, MARGIN);
    mp_gemm_ways_test_rates(NULL);
    return on;
}

/* The same, both rounds timing r0, r1. */
static bool decide(gemm_ways *w, double r0, double r1) { return decide2(w, r0, r1, r0, r1); }

static char *slurp(const char *path)
{
    size_t n;
    char *t = (char *)test_read_file(path, &n);
    t = realloc(t, n + 1);
    assert_non_null(t);
    t[n] = '\0';
    return t;
}

static void spit(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* text's "check " line made right for what is before it, in place. */
static void fix_check(char *text)
{
    char *check = strstr(text, "check ");
    assert_non_null(check);
    snprintf(check, 24, "check %016llx\n",
             (unsigned long long)mp_fnv1a(text, (size_t)(check - text)));
}

static void the_rule_and_what_is_written(void **state)
{
    (void)state;
    gemm_ways w = GEMM_WAYS_INIT("test");
    /* way 0 more than the margin ahead: way 0, clear (> 10%), written */
    assert_false(decide(&w, 100, 50));
    assert_int_equal(w.source, MP_DISPATCH_MEASURED);
    assert_string_equal(w.note, "none yet, written");
    assert_non_null(strstr(w.path, "/gemm-ways-test-"));
    char *t = slurp(w.path);
    char want[64];
    snprintf(want, sizeof want, "\nway0 100000 way1 50000 -> way0\ncheck ");
    assert_non_null(strstr(t, want));
    assert_non_null(strstr(t, " kernel test margin 1.03\n"));
    free(t);
    /* read back: the file's rates and choice, whatever the timing says */
    assert_false(decide(&w, 50, 100));
    assert_int_equal(w.source, MP_DISPATCH_CACHED);
    assert_string_equal(w.note, "read");
    assert_true(w.gflops[0] == 100 && w.gflops[1] == 50);

    assert_int_equal(unlink(w.path), 0);
    /* way 1 clearly ahead: written, read back */
    assert_true(decide(&w, 40, 100));
    assert_string_equal(w.note, "none yet, written");
    assert_true(decide(&w, 100, 40));
    assert_int_equal(w.source, MP_DISPATCH_CACHED);

    /* within 10%: timed, chosen by the rule, not written */
    assert_int_equal(unlink(w.path), 0);
    assert_true(decide(&w, 100, 98));     /* way 0 not 3% ahead */
    assert_false(decide(&w, 103.5, 100)); /* 3.5% ahead */
    assert_int_equal(w.source, MP_DISPATCH_MEASURED);
    assert_non_null(strstr(w.note, "not written (too close to keep"));
    assert_int_equal(access(w.path, F_OK), -1);
    /* a clear first round the second does not confirm: each way's faster
     * rate decides, nothing is written */
    assert_true(decide2(&w, 100, 50, 60, 100)); /* the other way ahead */
    assert_true(w.gflops[0] == 100 && w.gflops[1] == 100);
    assert_string_equal(
        w.note, "none yet, not written (a second round did not confirm it: 60.0 and 100.0)");
    assert_false(decide2(&w, 100, 50, 100, 95)); /* too close the second time */
    assert_true(w.gflops[0] == 100 && w.gflops[1] == 95);
    assert_non_null(strstr(w.note, "not written (a second round did not confirm it"));
    assert_int_equal(access(w.path, F_OK), -1);
    /* confirmed: written with each way's faster rate */
    assert_false(decide2(&w, 90, 50, 100, 40));
    assert_string_equal(w.note, "none yet, written");
    assert_true(w.gflops[0] == 100 && w.gflops[1] == 50);
    t = slurp(w.path);
    assert_non_null(strstr(t, "\nway0 100000 way1 50000 -> way0\n"));
    free(t);
    assert_int_equal(unlink(w.path), 0);
    /* rates are kept in whole MFLOP/s, before the rule */
    assert_true(decide(&w, 100.0004, 100));
    assert_true(w.gflops[0] == 100 && w.gflops[1] == 100);

    /* forced: no timing, no file */
    mp_gemm_ways_force(&w, 1);
    assert_true(mp_gemm_ways_on(&w, &mp_gemm_scalar_impl, MARGIN));
    mp_gemm_ways_force(&w, 0);
    assert_false(mp_gemm_ways_on(&w, &mp_gemm_scalar_impl, MARGIN));
    assert_int_equal(access(w.path, F_OK), -1);

    /* the cache off: timed, nothing written, the caller's message kept */
    setenv("MP_DISPATCH_CACHE", "0", 1);
    mp_set_error(MP_ERR_INVALID, "the caller's own");
    assert_false(decide(&w, 100, 50));
    assert_string_equal(w.path, "");
    assert_string_equal(w.note, "off (MP_DISPATCH_CACHE=0)");
    assert_string_equal(mp_last_error(), "the caller's own");
    setenv("MP_DISPATCH_CACHE", dir, 1);
}

/* Each bad file: ignored, timed (the hook's rates: way 1 clearly ahead),
 * and replaced by this version's text, which the next decision reads. */
static void bad_files_are_replaced(void **state)
{
    (void)state;
    gemm_ways w = GEMM_WAYS_INIT("test");
    assert_false(decide(&w, 100, 50)); /* a good file to spoil */
    char *good = slurp(w.path);
    for (int bad = 0; bad < 7; bad++) {
        char text[2 * MP_CACHE_MAX];
        snprintf(text, sizeof text, "%s", good);
        char *p;
        switch (bad) {
        case 0: /* garbage */
            snprintf(text, sizeof text, "mixprec gemm ways 2\nnot rates\n");
            break;
        case 1: /* one digit of a rate changed: the check line no longer holds */
            p = strstr(text, "way0 ") + 5;
            *p = *p == '9' ? '1' : (char)(*p + 1);
            break;
        case 2: /* another CPU's key, its check made right */
            p = strstr(text, "\ncpu ") + 5;
            *p = *p == 'f' ? '0' : 'f';
            fix_check(text);
            break;
        case 3: /* another kernel's file, renamed */
            p = strstr(text, "kernel test");
            memcpy(p + 7, "tesu", 4);
            fix_check(text);
            break;
        case 4: /* a choice against the rule, its check made right */
            p = strstr(text, "-> way0");
            p[6] = '1';
            fix_check(text);
            break;
        case 5: /* another margin, the rule's choice kept */
            p = strstr(text, "margin 1.03");
            p[10] = '5';
            fix_check(text);
            break;
        case 6: /* oversized: the good text and more */
            for (size_t n = strlen(text); n < MP_CACHE_MAX + 100; n++) text[n] = '\n';
            text[MP_CACHE_MAX + 100] = '\0';
            break;
        }
        spit(w.path, text);
        assert_true(decide(&w, 40, 100));
        assert_int_equal(w.source, MP_DISPATCH_MEASURED);
        assert_non_null(strstr(w.note, "ignored ("));
        assert_non_null(strstr(w.note, ", written"));
        assert_true(decide(&w, 100, 40)); /* the replacement, read back */
        assert_int_equal(w.source, MP_DISPATCH_CACHED);
        assert_true(w.gflops[0] == 40 && w.gflops[1] == 100);
    }
    /* a directory where the file should be: ignored, not written */
    assert_int_equal(unlink(w.path), 0);
    assert_int_equal(mkdir(w.path, 0700), 0);
    assert_false(decide(&w, 100, 50));
    assert_int_equal(w.source, MP_DISPATCH_MEASURED);
    assert_non_null(strstr(w.note, "ignored (not a regular file), not written ("));
    assert_int_equal(rmdir(w.path), 0);
    free(good);
}

/* The AVX2 kernel's ways, through its own hook: its file is its own. */
static void a_kernel_keeps_its_file(void **state)
{
    (void)state;
#if MP_X86
    if (!mp_isa_supported(MP_ISA_AVX2)) skip();
    const double rates[4] = {40, 100, 40, 100};
    mp_gemm_ways_test_rates(rates);
    mp_gemm_avx2_pack_force(-1);
    assert_true(mp_gemm_avx2_impl.streams());
    mp_gemm_ways_test_rates(NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/gemm-ways-avx2-%016llx-%s", dir,
             (unsigned long long)mp_cpu_model_key(), MP_VERSION_STRING);
    char *t = slurp(path);
    assert_non_null(strstr(t, "\nway0 40000 way1 100000 -> way1\n"));
    free(t);
    mp_gemm_avx2_pack_force(-1);
#else
    skip();
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_rule_and_what_is_written),
        cmocka_unit_test(bad_files_are_replaced),
        cmocka_unit_test(a_kernel_keeps_its_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
