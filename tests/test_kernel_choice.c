/* test_kernel_choice.c - the measured choice for conversions, MX blocks and
 * optimizer updates (core/measured.c, core/convert_dispatch.c,
 * core/mx_dispatch.c, optim/update_dispatch.c): the candidates give the
 * same bits (so the choice cannot change a result), the choice is a path
 * this CPU supports, a forced path is used as is, the rates as cache files
 * keep them, the cache file's round trip, bad cache files (garbage, a
 * directory, oversized) ignored and replaced, and a choice written only
 * when a second round of timing confirms it (made-up times). No assertion
 * depends on how fast anything runs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "core/cache_file.h"
#include "core/internal.h"
#include "core/measured.h"
#include "core/mx_internal.h"
#include "optim/optim_internal.h"

enum { N = 4099 }; /* not a multiple of any vector width */

static char dir[64];

static int setup(void **state)
{
    (void)state;
    unsetenv("MP_ISA");
    mp_isa_reset();
    return test_scratch_dir(dir, sizeof dir, "mp_kernel_choice");
}

static int teardown(void **state)
{
    (void)state;
    setenv("MP_DISPATCH_CACHE", "0", 1);
    return test_remove_tree(dir);
}

static void fresh(const char *cache)
{
    setenv("MP_DISPATCH_CACHE", cache, 1);
    mp_convert_dispatch_reset();
    mp_mx_dispatch_reset();
    mp_update_dispatch_reset();
}

/* float32 inputs with every special: zeros, subnormals, the edges of each
 * format's range, ties, infinities and NaN, then random bits. */
static void inputs(float *x)
{
    const float special[] = {0.0f,      -0.0f,  0x1p-149f,   -0x1p-130f,     0x1p-126f, 65504.0f,
                             65520.0f,  448.0f, 464.0f,      57344.0f,       3.4e38f,   INFINITY,
                             -INFINITY, NAN,    1.00390625f, 1.0f + 0x1p-8f, -2.5f};
    const int ns = (int)(sizeof special / sizeof special[0]);
    test_rng r = {42};
    for (int i = 0; i < N; i++) x[i] = i < ns ? special[i] : bits_f32(test_rng_u32(&r));
}

/* mp_convert (the chosen path) against every supported path, both ways, for
 * each measured pair. */
static void conversions_same_bits_on_every_path(void **state)
{
    (void)state;
    fresh("0");
    static float x[N], back[N], ref_back[N];
    static uint8_t got[N * 2], ref[N * 2];
    inputs(x);
    const mp_dtype types[] = {MP_BF16, MP_F16, MP_F8E4M3, MP_F8E5M2};
    mp_isa isas[MP_ISA_COUNT];
    int nisa = test_isas(isas);
    for (int t = 0; t < 4; t++) {
        const size_t es = mp_dtype_size(types[t]);
        const mp_isa chosen = mp_convert_path(types[t], MP_F32);
        assert_true(mp_isa_supported(chosen));
        assert_true(mp_isa_supported(mp_convert_path(MP_F32, types[t])));
        mp_convert(got, types[t], x, MP_F32, N);
        mp_convert(back, MP_F32, got, types[t], N);
        for (int k = 0; k < nisa; k++) {
            mp_convert_isa(isas[k], ref, types[t], x, MP_F32, N, MP_OVERFLOW_SATURATE);
            assert_memory_equal(got, ref, N * es);
            mp_convert_isa(isas[k], ref_back, MP_F32, got, types[t], N, MP_OVERFLOW_SATURATE);
            assert_memory_equal(back, ref_back, N * sizeof(float));
        }
    }
}

/* mp_mx_pack, mp_mx_unpack and mp_mx_quantize_2d (the chosen paths)
 * against every supported path, for a float and an integer element format
 * (N is not a multiple of the block: a short last block). */
static void mx_same_bits_on_every_path(void **state)
{
    (void)state;
    fresh("0");
    static float x[N], got_v[N], ref_v[N];
    static uint8_t codes[N], ref_codes[N], scales[N / 32 + 1], ref_scales[N / 32 + 1];
    inputs(x);
    for (int i = 0; i < N; i++)
        if (!isfinite(x[i])) x[i] = 1.5f; /* an inf or NaN takes its whole block to NaN */
    for (int op = 0; op < MP_MX_OPS; op++) assert_true(mp_isa_supported(mp_mx_path((mp_mx_op)op)));
    mp_isa isas[MP_ISA_COUNT];
    const int nisa = test_isas(isas);
    const mp_mx_format formats[] = {MP_MXFP8_E4M3, MP_MXINT8};
    for (int fi = 0; fi < 2; fi++) {
        const mp_mx_format f = formats[fi];
        const size_t nb = (N + 31) / 32;
        assert_int_equal(mp_mx_pack(f, 32, x, N, codes, scales), MP_OK);
        assert_int_equal(mp_mx_unpack(f, 32, codes, scales, N, got_v, MP_F32), MP_OK);
        for (int k = 0; k < nisa; k++) {
            assert_int_equal(mp_mx_pack_isa(isas[k], f, 32, x, N, ref_codes, ref_scales), MP_OK);
            assert_memory_equal(codes, ref_codes, N);
            assert_memory_equal(scales, ref_scales, nb);
            assert_int_equal(mp_mx_unpack_isa(isas[k], f, 32, codes, scales, N, ref_v, MP_F32),
                             MP_OK);
            assert_memory_equal(got_v, ref_v, sizeof got_v);
        }
        for (int axis = 0; axis < 2; axis++) { /* 61 x 67 = 4087 values */
            assert_int_equal(mp_mx_quantize_2d(f, 32, 61, 67, axis, x, got_v, MP_F32), MP_OK);
            for (int k = 0; k < nisa; k++) {
                assert_int_equal(
                    mp_mx_quantize_2d_isa(isas[k], f, 32, 61, 67, axis, x, ref_v, MP_F32), MP_OK);
                assert_memory_equal(got_v, ref_v, 61 * 67 * sizeof(float));
            }
        }
    }
}

/* The update rules the choice picks from give the scalar rules' bits, on
 * every path this CPU has (N is not a multiple of 8 or 16: the vector
 * paths' tails are in it). */
static void updates_same_bits_on_every_path(void **state)
{
    (void)state;
    fresh("0");
    assert_true(mp_isa_supported(mp_update_path(false)));
    assert_true(mp_isa_supported(mp_update_path(true)));
    mp_isa isas[MP_ISA_COUNT];
    const int nisa = test_isas(isas);
    if (nisa < 2) skip();
    static float w[2][N], g[N], m[2][N], v[2][N];
    test_fill(g, N, 1, -2, 2);
    mp_step_coefs c = {.lr = 1e-2f,
                       .gfactor = 0.5f,
                       .clip_value = 0.75f,
                       .weight_decay = 0.01f,
                       .momentum = 0.9f,
                       .nesterov = true,
                       .beta1 = 0.9f,
                       .one_minus_beta1 = 0.1f,
                       .beta2 = 0.999f,
                       .one_minus_beta2 = 0.001f,
                       .eps = 1e-7f,
                       .step_size = 3e-3f,
                       .sqrt_bc2 = 0.3f,
                       .decoupled_decay = 0.999f};
    for (int k = 1; k < nisa; k++) {
        mp_sgd_kernel sgd;
        mp_adam_kernel adam;
        mp_update_kernels_for(isas[k], &sgd, &adam);
        assert_ptr_not_equal(adam, mp_update_adam_scalar);
        for (int decoupled = 0; decoupled < 2; decoupled++) {
            for (int p = 0; p < 2; p++) {
                test_fill(w[p], N, 2, -1, 1);
                test_fill(m[p], N, 3, -0.1, 0.1);
                test_fill(v[p], N, 4, 0, 0.01);
            }
            mp_update_adam_scalar(&c, decoupled, w[0], g, m[0], v[0], N);
            adam(&c, decoupled, w[1], g, m[1], v[1], N);
            assert_memory_equal(w[0], w[1], sizeof w[0]);
            assert_memory_equal(m[0], m[1], sizeof m[0]);
            assert_memory_equal(v[0], v[1], sizeof v[0]);
        }
        for (int p = 0; p < 2; p++) {
            test_fill(w[p], N, 2, -1, 1);
            test_fill(m[p], N, 3, -0.1, 0.1);
        }
        mp_update_sgd_scalar(&c, w[0], g, m[0], N);
        sgd(&c, w[1], g, m[1], N);
        assert_memory_equal(w[0], w[1], sizeof w[0]);
        assert_memory_equal(m[0], m[1], sizeof m[0]);
    }
}

static void forced_path_is_used(void **state)
{
    (void)state;
    mp_isa isas[MP_ISA_COUNT];
    int nisa = test_isas(isas);
    for (int k = 0; k < nisa; k++) {
        assert_int_equal(mp_isa_set(isas[k]), MP_OK);
        fresh("0");
        assert_int_equal(mp_convert_path(MP_BF16, MP_F32), isas[k]);
        assert_int_equal(mp_convert_path(MP_F32, MP_F8E5M2), isas[k]);
        assert_int_equal(mp_update_path(false), isas[k]);
        assert_int_equal(mp_mx_path(MP_MX_OP_PACK), isas[k]);
        assert_int_equal(mp_mx_path(MP_MX_OP_COLS), isas[k]);
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        assert_int_equal(mp_kernel_dispatch_report(f), MP_OK);
        fclose(f);
        assert_non_null(strstr(text, "forced by MP_ISA"));
        free(text);
    }
    mp_isa_reset();
}

/* The report as text. */
static char *report(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_int_equal(mp_kernel_dispatch_report(f), MP_OK);
    fclose(f);
    return text;
}

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what)) n++;
    return n;
}

/* The one file of each group in the cache directory. */
static void cache_file(const char *group, char *path, size_t len)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls %s/%s-* 2>/dev/null | head -1", dir, group);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    assert_non_null(fgets(path, (int)len, p));
    pclose(p);
    path[strcspn(path, "\n")] = 0;
}

/* The rates as every cache file keeps them (core/cache_file.c): whole
 * thousandths from 1 to 1e9, and the one parser the three readers share. */
static void cache_rates_written_and_parsed(void **state)
{
    (void)state;
    assert_int_equal(mp_cache_rate_thousandths(12.3454), 12345);
    assert_int_equal(mp_cache_rate_thousandths(12.3455), 12346); /* halves round up */
    assert_int_equal(mp_cache_rate_thousandths(0.0004), 1);      /* at least 1 */
    assert_int_equal(mp_cache_rate_thousandths(-5.0), 1);
    assert_int_equal(mp_cache_rate_thousandths(NAN), 1);
    assert_int_equal(mp_cache_rate_thousandths(1e7), 1000000000); /* at most 1e9 */
    assert_int_equal(mp_cache_rate_thousandths(INFINITY), 1000000000);
    assert_true(mp_cache_rate_round(66.2004) == 66.2);

    static const struct {
        const char *text, *name;
        bool ok;
        double rate;
        int used; /* bytes consumed */
    } cases[] = {
        {"avx2 66200 ->", "avx2", true, 66.2, 10},
        {"avx2 1000000000\n", "avx2", true, 1e6, 15}, /* the largest */
        {"avx2 1", "avx2", true, 0.001, 6},
        {"avx2 1000000001", "avx2", false, 0, 0},
        {"avx2 99999999999", "avx2", false, 0, 0}, /* 11 digits */
        {"avx2 0", "avx2", false, 0, 0},
        {"avx2 ", "avx2", false, 0, 0},
        {"avx2 -5", "avx2", false, 0, 0},
        {"avx2  5", "avx2", false, 0, 0},
        {"avx2x 5", "avx2", false, 0, 0}, /* a longer name */
        {"avx 5", "avx2", false, 0, 0},
        {"way1 5", "way0", false, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *p = cases[i].text;
        double r = -1;
        assert_int_equal(mp_cache_rate_after(&p, cases[i].name, &r), cases[i].ok);
        if (cases[i].ok) assert_true(r == cases[i].rate);
        assert_int_equal(p - cases[i].text, cases[i].used); /* untouched on failure */
        if (!cases[i].ok) assert_true(r == -1);
    }
}

/* Whether the file at path holds the text s. */
static bool file_has(const char *path, const char *s)
{
    char text[4096];
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    return strstr(text, s) != NULL;
}

static void cache_round_trip_and_bad_files(void **state)
{
    (void)state;
    mp_isa isas[MP_ISA_COUNT];
    if (test_isas(isas) < 2) skip(); /* one path: nothing is chosen or cached */
    mp_isa_reset();
    /* Where two paths run within the timing margin of each other (Intel
     * Xeon, family 6 model 167: bf16->f32 on avx512bf16 and avx2 2.4%
     * apart), the two rounds may choose differently and, by design, nothing
     * is written: measured again until all three groups are (each try about
     * a third likely there). */
    char *t = NULL;
    for (int tries = 0; tries < 20; tries++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -f %s/convert-* %s/update-* %s/mx-*", dir, dir, dir);
        assert_int_equal(system(cmd), 0);
        free(t);
        fresh(dir);
        t = report();
        if (count(t, "none yet, written") == 3) break;
    }
    assert_int_equal(count(t, "timed in this process"), 3);
    assert_int_equal(count(t, "none yet, written"), 3);
    free(t);
    char conv[512], upd[512], mx[512];
    cache_file("convert", conv, sizeof conv);
    cache_file("update", upd, sizeof upd);
    cache_file("mx", mx, sizeof mx);
    const mp_isa before = mp_convert_path(MP_BF16, MP_F32);
    const mp_isa mx_before = mp_mx_path(MP_MX_OP_UNPACK);

    fresh(dir);
    t = report();
    assert_int_equal(count(t, "read from the cache"), 3);
    free(t);
    assert_int_equal(mp_convert_path(MP_BF16, MP_F32), before);
    assert_int_equal(mp_mx_path(MP_MX_OP_UNPACK), mx_before);

    /* the rates of another revision of the kernels (a valid file of the
     * same version, its check line correct): ignored and timed again */
    {
        char text[4096];
        FILE *f = fopen(upd, "r");
        assert_non_null(f);
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = 0;
        /* written with its group's revision (optim/update_dispatch.c: 2,
         * the unmasked AVX-512 rules; raise both together) */
        char *rev = strstr(text, " revision ");
        assert_non_null(rev);
        assert_int_equal(atoi(rev + 10), 2);
        rev[10] = rev[10] == '9' ? '1' : (char)(rev[10] + 1);
        char *check = strstr(text, "check ");
        assert_non_null(check);
        snprintf(check, sizeof text - (size_t)(check - text), "check %016llx\n",
                 (unsigned long long)mp_fnv1a(text, (size_t)(check - text)));
        f = fopen(upd, "w");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
        fresh(dir);
        t = report();
        assert_int_equal(count(t, "read from the cache"), 2); /* conversions' and MX */
        assert_int_equal(count(t, "ignored"), 1);
        free(t);
        /* timed again; where its rounds disagreed (a tie: adam on avx512
         * and avx2 1% apart on the same Xeon) nothing was written: measured
         * until the file is this revision's again, which the checks below
         * read */
        for (int tries = 0; tries < 20 && !file_has(upd, " revision 2\n"); tries++) {
            fresh(dir);
            free(report());
        }
        assert_true(file_has(upd, " revision 2\n"));
    }
    /* garbage, then one changed digit, then oversized: each ignored and
     * replaced by a fresh measurement */
    for (int bad = 0; bad < 3; bad++) {
        /* the one-digit change needs the file the last measurement wrote
         * (or, its rounds disagreeing, did not: measured again) */
        for (int tries = 0; bad == 1 && tries < 20 && !file_has(conv, "f32->bf16"); tries++) {
            fresh(dir);
            free(report());
        }
        FILE *f = fopen(conv, bad == 1 ? "r+" : "w");
        assert_non_null(f);
        if (bad == 0) fputs("mixprec kernel choice 2\nnot a rate\n", f);
        if (bad == 1) {
            char text[4096];
            size_t n = fread(text, 1, sizeof text - 1, f);
            text[n] = 0;
            char *digit = strstr(text, "f32->bf16");
            assert_non_null(digit);
            while (!(digit[0] == ' ' && digit[1] >= '0' && digit[1] <= '9')) digit++;
            digit++; /* the first digit of the first rate */
            *digit = *digit == '9' ? '1' : (char)(*digit + 1);
            rewind(f);
            fwrite(text, 1, n, f);
        }
        if (bad == 2)
            for (int i = 0; i < 5000; i++) fputc('x', f);
        fclose(f);
        fresh(dir);
        t = report();
        assert_non_null(strstr(t, "ignored"));
        assert_int_equal(count(t, "read from the cache"), 2); /* the updates' and MX files */
        free(t);
        assert_true(mp_isa_supported(mp_convert_path(MP_BF16, MP_F32)));
    }
    /* a directory where the file should be: ignored, not written */
    assert_int_equal(unlink(upd), 0);
    assert_int_equal(mkdir(upd, 0700), 0);
    fresh(dir);
    t = report();
    assert_non_null(strstr(t, "not a regular file"));
    free(t);
    assert_true(mp_isa_supported(mp_update_path(false)));
    fresh("0");
}

/* A group of one op between two candidates whose times the test sets per
 * round (setup() counts the rounds; later rounds repeat the second). */
static int fake_round;
static double fake_ms[2][2]; /* [round][candidate] */

static void fake_fill(mp_measured_group *g)
{
    g->nops = 1;
    g->elements = 1e6;
    mp_measured_op *op = &g->op[0];
    op->name = "fake";
    op->n = 2;
    op->isa[0] = MP_ISA_SCALAR;
    op->isa[1] = MP_ISA_AVX2;
    op->rate[0] = op->rate[1] = 0;
    op->chosen = 0;
}
static bool fake_setup(void) { return ++fake_round > 0; }
static void fake_teardown(void) {}
static double fake_time(int o, mp_isa isa)
{
    (void)o;
    return fake_ms[fake_round > 1][isa == MP_ISA_SCALAR ? 0 : 1] * 1e-3;
}

/* A choice is written only when a second round makes it again (a file
 * outlives the process; one round in a moment of load can mislead), with
 * each candidate's faster rate, which the process keeps either way. */
static void second_round_confirms(void **state)
{
    (void)state;
    static const mp_measured_spec spec = {fake_fill, fake_setup, fake_teardown, fake_time};
    static mp_measured_group g = {.file = "fake", .revision = 1};
    static atomic_int st;
    char cdir[128];
    snprintf(cdir, sizeof cdir, "%s/second", dir);
    setenv("MP_DISPATCH_CACHE", cdir, 1);
    /* round 1: scalar 1000 M/s, avx2 500; round 2 the other way round */
    const double flip[2][2] = {{1, 2}, {2, 1}}, agree[2][2] = {{1, 2}, {1.25, 2}};
    memcpy(fake_ms, flip, sizeof fake_ms);
    fake_round = 0;
    mp_measured_reset(&st);
    assert_ptr_equal(mp_measured_get(&g, &st, &spec), &g);
    assert_int_equal(fake_round, 2);
    assert_int_equal(g.source, MP_DISPATCH_MEASURED);
    if (!strstr(g.note, "not written (a second round did not confirm it: fake chose avx2)"))
        fail_msg("note '%s'", g.note);
    assert_true(g.op[0].rate[0] == 1000 && g.op[0].rate[1] == 1000);
    assert_int_equal(g.op[0].chosen, 0); /* a tie: the first */
    struct stat sb;
    assert_int_not_equal(stat(g.path, &sb), 0);
    /* two rounds that agree: written with the faster rates, read back */
    memcpy(fake_ms, agree, sizeof fake_ms);
    fake_round = 0;
    mp_measured_reset(&st);
    assert_ptr_equal(mp_measured_get(&g, &st, &spec), &g);
    assert_non_null(strstr(g.note, "written"));
    assert_null(strstr(g.note, "not written"));
    assert_true(g.op[0].rate[0] == 1000 && g.op[0].rate[1] == 500);
    fake_round = 0;
    mp_measured_reset(&st);
    assert_ptr_equal(mp_measured_get(&g, &st, &spec), &g);
    assert_int_equal(fake_round, 0); /* nothing timed */
    assert_int_equal(g.source, MP_DISPATCH_CACHED);
    assert_true(g.op[0].rate[0] == 1000 && g.op[0].rate[1] == 500);
    assert_int_equal(g.op[0].chosen, 0);
    setenv("MP_DISPATCH_CACHE", "0", 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(conversions_same_bits_on_every_path),
        cmocka_unit_test(mx_same_bits_on_every_path),
        cmocka_unit_test(updates_same_bits_on_every_path),
        cmocka_unit_test(forced_path_is_used),
        cmocka_unit_test(cache_rates_written_and_parsed),
        cmocka_unit_test(cache_round_trip_and_bad_files),
        cmocka_unit_test(second_round_confirms),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
