/* test_dispatch.c - GEMM kernel choice by measurement (gemm_dispatch.c):
 * every candidate for bf16-like operands within the GEMM error bound, the
 * choice one of them and the one mp_gemm runs, MP_ISA / mp_isa_set forcing a
 * path without timing, a busy machine's rates, timing out of memory, first
 * use from many threads, the API and `mixprec info` (the cache file:
 * test_dispatch_cache.c). Rates that decide are injected where a test needs
 * a given outcome; no assertion depends on how fast anything runs. On a CPU
 * without AVX512_BF16 (one kernel for bf16 operands) the choice runs between
 * the portable and the AVX2 kernels, substituted as the candidates
 * (dispatch_test.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "dispatch_test.h"

/* ------------------------------------------------------------ numerics */

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
                                     : mp_isa_supported(MP_ISA_AVX2) ? "avx2"
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
    if (mp_isa_supported(MP_ISA_AMX)) {
        setenv("MP_ISA", "amx", 1);
        mp_isa_reset();
        mp_gemm_dispatch_info in = query();
        assert_int_equal(in.source, MP_DISPATCH_FORCED);
        assert_string_equal(in.kernel[0], "amx");
        assert_runs(&mp_gemm_amx_impl);
        check_bound(NULL, MP_BF16, MP_BF16, false, false, 50, 70, 600, 6);
        unsetenv("MP_ISA");
        mp_isa_reset();
        assert_int_equal(mp_isa_set(MP_ISA_AMX), MP_OK);
        assert_runs(&mp_gemm_amx_impl);
    }
#endif
    /* A forced path times nothing and writes no cache. */
    struct stat st;
    assert_int_not_equal(stat(path, &st), 0);
    unsetenv("MP_ISA");
    mp_isa_reset();
    assert_false(mp_isa_forced());
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
        snprintf(want, sizeof want,
                 "bf16 x bf16        100.0       300.0  %-11s timed in this "
                 "process",
                 query().kernel[1]);
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

/* Three candidates (AMX tiles, vdpbf16ps and FMA where the OS grants the
 * tiles): injected rates pick the fastest, the first keeps a tie within
 * the margin, and the real timing's choice runs within the error bound. */
static void test_three_candidates(void **state)
{
    (void)state;
    if (n_all < 3) skip();
    mp_gemm_dispatch_test_candidates(all, 3);
    ncands = 3;
    for (int i = 0; i < 3; i++) cands[i] = all[i];
    const double middle[6] = {100, 300, 200, 100, 300, 200},
                 last[6] = {100, 200, 300, 100, 200, 300}, tie[6] = {300, 100, 305, 300, 100, 305};
    fresh("0", middle);
    assert_int_equal(query().chosen, 1);
    assert_runs(all[1]);
    fresh("0", last);
    assert_int_equal(query().chosen, 2);
    assert_runs(all[2]);
    /* A product less deep than the chosen kernel takes runs on the one it
     * names (AMX: the FMA kernel below a tile's depth of 32), whose bits
     * tell it from the tiles'. */
    if (all[2]->shallow_k > 2) {
        assert_int_equal(signature_at(NULL, 2), signature_at(all[2]->shallow, 2));
        assert_int_not_equal(signature_at(NULL, 2), signature_at(all[2], 2));
        assert_int_equal(signature_at(NULL, all[2]->shallow_k), signature(all[2]));
    }
    fresh("0", tie);
    assert_int_equal(query().chosen, 0);
    assert_runs(all[0]);
    fresh("0", NULL); /* timed for real */
    mp_gemm_dispatch_info in = query();
    assert_int_equal(in.n_kernels, 3);
    for (int i = 0; i < 3; i++) assert_true(in.gflops[i] > 0);
    assert_runs(all[in.chosen]);
    check_bound(NULL, MP_BF16, MP_BF16, false, true, 40, 60, 500, 5);
    for (int i = 0; i < 3; i++) {
        check_bound(all[i], MP_BF16, MP_BF16, false, false, 70, 100, 1100, 1);
        check_bound(all[i], MP_F8E5M2, MP_F8E4M3, true, false, 17, 130, 77, 4);
    }
    mp_gemm_dispatch_test_candidates(all, 2);
    ncands = 2;
    fresh("0", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_candidates_within_bound),
        cmocka_unit_test(test_choice_is_a_candidate),
        cmocka_unit_test(test_faster_wins),
        cmocka_unit_test(test_forced_path),
        cmocka_unit_test(test_busy_machine),
        cmocka_unit_test(test_timing_out_of_memory),
        cmocka_unit_test(test_first_use_threads),
        cmocka_unit_test(test_api),
        cmocka_unit_test(test_cli_info),
        cmocka_unit_test(test_three_candidates),
    };
    return cmocka_run_group_tests_name("dispatch", tests, setup, teardown);
}
