/* test_tune.c - automatic per-layer precision (mixprec/tune.h): each
 * candidate's error on known tensors against an independent emulation of
 * its rounding written here (no library conversion used), the choice rule
 * at its edges, a layer whose activations span a huge range kept at 16 bits
 * (and why the flushed fraction is needed to see it), the tuned model file
 * reloading and training a step, the JSON text of MX choices (which does
 * not need an MX trainer), and one-line errors naming the bad value. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* ------------------------------------------------- independent rounding */

/* x rounded to nearest even onto a binary float grid with mbits fraction
 * bits, smallest normal exponent emin (subnormals below it), magnitudes
 * beyond maxv saturated (sat) or infinite. */
static double round_grid(double x, int mbits, int emin, double maxv, bool sat)
{
    if (x == 0 || !isfinite(x)) return x;
    int e;
    frexp(x, &e); /* |x| = m 2^e, m in [0.5, 1): floor(log2 |x|) = e - 1 */
    e -= 1;
    if (e < emin) e = emin;
    double step = ldexp(1.0, e - mbits);
    double q = nearbyint(x / step) * step; /* ties to even in the default mode */
    if (fabs(q) > maxv) q = sat ? copysign(maxv, x) : copysign(INFINITY, x);
    return q;
}

typedef struct {
    int mbits, emin, emax;
    double max;
} elem;
static const elem E4M3 = {3, -6, 8, 448}, E5M2 = {2, -14, 15, 57344}, E2M3 = {3, 0, 2, 7.5},
                  E2M1 = {1, 0, 2, 6};

typedef struct {
    double err2, norm2;
    long nonzero, flushed;
} sums;

static void add(sums *s, double x, double q)
{
    s->err2 += (q - x) * (q - x);
    s->norm2 += x * x;
    if (x != 0) {
        s->nonzero++;
        s->flushed += q == 0;
    }
}

static void result(const sums *s, double *rel, double *flush)
{
    *rel = s->norm2 > 0 ? sqrt(s->err2 / s->norm2) : 0;
    *flush = s->nonzero ? (double)s->flushed / (double)s->nonzero : 0;
}

/* The reference error of one candidate on a rows x cols tensor. */
static void reference(mp_tune_format f, mp_tune_role role, int rows, int cols, const float *x,
                      double *rel, double *flush)
{
    size_t n = (size_t)rows * (size_t)cols;
    sums s = {0};
    if (f == MP_TUNE_FLOAT32 || f == MP_TUNE_BFLOAT16 || f == MP_TUNE_FLOAT16) {
        for (size_t i = 0; i < n; i++) {
            double q = f == MP_TUNE_FLOAT32 ? x[i]
                       : f == MP_TUNE_BFLOAT16
                           ? round_grid(x[i], 7, -126, 3.3895313892515355e38, false)
                           : round_grid(x[i], 10, -14, 65504, false);
            add(&s, x[i], q);
        }
        result(&s, rel, flush);
        return;
    }
    if (f == MP_TUNE_FP8) { /* per tensor, scale = max / amax in float32 */
        elem e = role == MP_TUNE_GRADIENT ? E5M2 : E4M3;
        float amax = 0;
        for (size_t i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        float scale = amax > 0 ? (float)e.max / amax : 1.0f;
        for (size_t i = 0; i < n; i++) {
            float v = x[i] * scale; /* rounded to float32 once */
            add(&s, x[i], round_grid(v, e.mbits, e.emin, e.max, true) / (double)scale);
        }
        result(&s, rel, flush);
        return;
    }
    elem e = role == MP_TUNE_GRADIENT ? E5M2
             : f == MP_TUNE_MXFP8     ? E4M3
             : f == MP_TUNE_MXFP6     ? E2M3
                                      : E2M1;
    double worst_rel = 0, worst_flush = 0;
    for (int axis = 0; axis < 2; axis++) {
        sums a = {0};
        int lines = axis ? rows : cols, len = axis ? cols : rows;
        for (int line = 0; line < lines; line++)
            for (int b0 = 0; b0 < len; b0 += 32) {
                int b1 = b0 + 32 < len ? b0 + 32 : len;
                double amax = 0;
                for (int j = b0; j < b1; j++) {
                    size_t i = axis ? (size_t)line * cols + j : (size_t)j * cols + line;
                    amax = fmax(amax, fabs(x[i]));
                }
                int se = -127;
                if (amax > 0) {
                    int ex;
                    frexp(amax, &ex);
                    se = ex - 1 - e.emax;
                    if (se < -127) se = -127;
                }
                for (int j = b0; j < b1; j++) {
                    size_t i = axis ? (size_t)line * cols + j : (size_t)j * cols + line;
                    double el = round_grid(ldexp(x[i], -se), e.mbits, e.emin, e.max, true);
                    add(&a, x[i], ldexp(el, se));
                }
            }
        double r, fl;
        result(&a, &r, &fl);
        worst_rel = fmax(worst_rel, r);
        worst_flush = fmax(worst_flush, fl);
    }
    *rel = worst_rel;
    *flush = worst_flush;
}

/* Values over many binades, some zeros, some exact ties. */
static void fill(float *x, size_t n, uint64_t seed, double lo_exp, double hi_exp)
{
    test_rng r = {seed};
    for (size_t i = 0; i < n; i++) {
        double u = test_rng_uniform(&r, 0, 1);
        double mag = exp2(test_rng_uniform(&r, lo_exp, hi_exp));
        x[i] = (float)(u < 0.5 ? -mag : mag);
        if (i % 37 == 5) x[i] = 0;
        if (i % 41 == 7) x[i] = 1.0f + 1.0f / 16; /* a tie in E4M3 (even: 1) */
    }
}

static void test_tensor_errors(void **state)
{
    (void)state;
    const int shapes[][2] = {{64, 96}, {40, 70}, {1, 33}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        int rows = shapes[k][0], cols = shapes[k][1];
        float *x = malloc((size_t)rows * cols * sizeof *x);
        fill(x, (size_t)rows * cols, 11 + k, -12, 6);
        for (int f = 0; f < MP_TUNE_FORMAT_COUNT; f++)
            for (int role = 0; role < MP_TUNE_ROLES; role++) {
                double rel, flush, want_rel, want_flush;
                assert_int_equal(mp_tune_tensor_error((mp_tune_format)f, (mp_tune_role)role, rows,
                                                      cols, x, &rel, &flush),
                                 MP_OK);
                reference((mp_tune_format)f, (mp_tune_role)role, rows, cols, x, &want_rel,
                          &want_flush);
                if (fabs(rel - want_rel) > 1e-12 * want_rel || flush != want_flush)
                    fail_msg("%dx%d %s role %d: rel %.17g flush %.17g, reference %.17g %.17g", rows,
                             cols, mp_tune_format_name((mp_tune_format)f), role, rel, flush,
                             want_rel, want_flush);
            }
        free(x);
    }
    /* the expected order on data of ordinary range, and exact cases */
    float g[256];
    fill(g, 256, 5, -3, 2);
    double e[MP_TUNE_FORMAT_COUNT];
    for (int f = 0; f < MP_TUNE_FORMAT_COUNT; f++)
        mp_tune_tensor_error((mp_tune_format)f, MP_TUNE_ACTIVATION, 8, 32, g, &e[f], NULL);
    assert_true(e[MP_TUNE_FLOAT32] == 0 && e[MP_TUNE_FLOAT16] < e[MP_TUNE_BFLOAT16]);
    assert_true(e[MP_TUNE_BFLOAT16] < e[MP_TUNE_FP8] && e[MP_TUNE_MXFP6] < e[MP_TUNE_MXFP4]);
    float exact[4] = {1, 0.5f, -2, 0}, tiny[2] = {1, 1e-30f}, nan2[2] = {1, NAN};
    double rel, flush;
    for (int f = 0; f < MP_TUNE_FORMAT_COUNT; f++) { /* powers of two: every format exact */
        mp_tune_tensor_error((mp_tune_format)f, MP_TUNE_WEIGHT, 1, 4, exact, &rel, &flush);
        assert_true(rel == 0 && flush == 0);
    }
    mp_tune_tensor_error(MP_TUNE_FLOAT16, MP_TUNE_GRADIENT, 1, 2, tiny, &rel, &flush);
    assert_true(flush == 0.5 && rel < 1e-29); /* flushed, yet invisible in the norm */
    mp_tune_tensor_error(MP_TUNE_BFLOAT16, MP_TUNE_GRADIENT, 1, 2, nan2, &rel, &flush);
    assert_true(isnan(rel) && isnan(flush));
    float big[1] = {1e5f}; /* float16 overflows to inf */
    mp_tune_tensor_error(MP_TUNE_FLOAT16, MP_TUNE_ACTIVATION, 1, 1, big, &rel, NULL);
    assert_true(isinf(rel));
}

/* ------------------------------------------------------------- the rule */

static void test_choose_rule(void **state)
{
    (void)state;
    /* float32 bfloat16 float16 fp8 mxfp8 mxfp6 mxfp4 */
    double e[MP_TUNE_FORMAT_COUNT] = {0, 0.003, 0.0004, 0.05, 0.06, 0.055, 0.12};
    unsigned all = MP_TUNE_ALL_FORMATS;
    assert_int_equal(mp_tune_choose(e, all, 0.05), MP_TUNE_FP8); /* error == budget qualifies */
    assert_int_equal(mp_tune_choose(e, all, nextafter(0.05, 0)), MP_TUNE_BFLOAT16);
    assert_int_equal(mp_tune_choose(e, all, 0.055), MP_TUNE_MXFP6);
    assert_int_equal(mp_tune_choose(e, all, 0.12), MP_TUNE_MXFP4);
    assert_int_equal(mp_tune_choose(e, all & ~(1u << MP_TUNE_MXFP4), 1.0), MP_TUNE_MXFP6);
    assert_int_equal(mp_tune_choose(e, all, 0.001), MP_TUNE_FLOAT16); /* bf16 over budget */
    assert_int_equal(mp_tune_choose(e, all, 1e-9), MP_TUNE_FLOAT32);
    assert_int_equal(mp_tune_choose(e, 0, 1.0), MP_TUNE_FLOAT32);
    /* equal cost: bfloat16 before float16, fp8 before mxfp8 */
    double tie[MP_TUNE_FORMAT_COUNT] = {0, 0.001, 0.001, 0.01, 0.01, 1, 1};
    assert_int_equal(mp_tune_choose(tie, all & ~(3u << MP_TUNE_FP8), 0.001), MP_TUNE_BFLOAT16);
    assert_int_equal(mp_tune_choose(tie, all, 0.01), MP_TUNE_FP8);
    /* NaN never qualifies */
    double nan_e[MP_TUNE_FORMAT_COUNT] = {0, NAN, NAN, NAN, NAN, NAN, NAN};
    assert_int_equal(mp_tune_choose(nan_e, all, INFINITY), MP_TUNE_FLOAT32);
    /* costs: the stated bytes per element */
    assert_true(mp_tune_format_bytes(MP_TUNE_MXFP6) == 0.75 + 1.0 / 32);
    assert_true(mp_tune_format_bytes(MP_TUNE_FP8) < mp_tune_format_bytes(MP_TUNE_MXFP8));
}

/* ---------------------------------------------------------- with models */

/* Input(dim) -> Dense x hidden (relu) -> Dense(4) -> float32 softmax. */
static char *mlp_json(int dim, int hidden)
{
    char *s = malloc(4096);
    int n = snprintf(s, 4096,
                     "{\"format\": \"mixprec.model\", \"version\": 2, \"policy\": \"float32\", "
                     "\"seed\": \"0x0000000000000007\", \"layers\": [{\"class_name\": "
                     "\"InputLayer\", \"name\": \"x\", \"inputs\": [], \"shape\": [%d]}",
                     dim);
    const char *prev = "x";
    char names[4][8] = {"a", "b", "c", "d"};
    for (int i = 0; i < hidden; i++) {
        n += snprintf(s + n, 4096 - (size_t)n,
                      ", {\"class_name\": \"Dense\", \"name\": \"%s\", \"inputs\": [\"%s\"], "
                      "\"units\": 48, \"activation\": \"relu\"}",
                      names[i], prev);
        prev = names[i];
    }
    snprintf(
        s + n, 4096 - (size_t)n,
        ", {\"class_name\": \"Dense\", \"name\": \"out\", \"inputs\": [\"%s\"], \"units\": 4}, "
        "{\"class_name\": \"Activation\", \"name\": \"softmax\", \"inputs\": [\"out\"], "
        "\"activation\": \"softmax\", \"policy\": \"float32\"}]}",
        prev);
    return s;
}

static mp_dataset *data(int n, int dim, double lo_exp, double hi_exp, uint64_t seed)
{
    float *x = malloc((size_t)n * dim * sizeof *x);
    int32_t *y = malloc((size_t)n * sizeof *y);
    fill(x, (size_t)n * dim, seed, lo_exp, hi_exp);
    for (int i = 0; i < n; i++) y[i] = i % 4;
    mp_dataset *ds = NULL;
    assert_int_equal(mp_dataset_from_arrays(x, y, n, dim, 4, &ds), MP_OK);
    free(x);
    free(y);
    return ds;
}

static const mp_tune_layer *row(const mp_tune_result *r, const char *name)
{
    for (int k = 0; k < r->nlayers; k++)
        if (!strcmp(r->layers[k].name, name)) return &r->layers[k];
    fail_msg("no row for layer '%s'", name);
    return NULL;
}

static void test_huge_dynamic_range(void **state)
{
    (void)state;
    char *cfg = mlp_json(64, 2);
    mp_dataset *ds = data(64, 64, -40, 0, 3); /* |x| from 2^-40 to 1: the data is a's input */
    mp_tune_options o = mp_tune_options_default();
    o.budget = 0.1;
    o.batch_size = 16;
    o.keep_first_last = false;
    o.trainable_only = false;
    mp_tune_result r;
    assert_int_equal(mp_tune_precision(cfg, ds, &o, &r), MP_OK);
    assert_int_equal(r.nlayers, 3);
    assert_int_equal(r.samples, 64);
    const mp_tune_layer *a = row(&r, "a"), *b = row(&r, "b");
    /* a: fp8 flushes most of its input, float16 too; bfloat16 keeps float32's range */
    assert_int_equal(a->chosen, MP_TUNE_BFLOAT16);
    assert_true(a->flush[MP_TUNE_FP8][MP_TUNE_ACTIVATION] > 0.3);
    assert_true(a->flush[MP_TUNE_MXFP4][MP_TUNE_ACTIVATION] > 0.3);
    assert_true(a->flush[MP_TUNE_FLOAT16][MP_TUNE_ACTIVATION] > 0.2);
    /* ... which the norm alone does not show: it is dominated by the largest values */
    assert_true(a->rel[MP_TUNE_FP8][MP_TUNE_ACTIVATION] < o.budget);
    /* b's input (relu of a) has an ordinary range: below 16 bits fits the budget */
    assert_true(b->chosen >= MP_TUNE_FP8);
    assert_true(b->error[b->chosen] <= o.budget);
    for (int f = 0; f < MP_TUNE_FORMAT_COUNT; f++) assert_false(isnan(b->error[f]));
    mp_tune_result_free(&r);
    mp_dataset_free(ds);
    free(cfg);
}

/* The tuned file of a run reloads with each layer as chosen and trains a step. */
static void reload_and_train(const mp_tune_result *r, const mp_dataset *ds)
{
    mp_model *m = NULL;
    if (mp_model_from_config(r->config, 16, INT64_MAX, &m)) fail_msg("%s", mp_last_error());
    assert_string_equal(mp_model_policy(m).name, "mixed_bfloat16");
    for (int i = 0; i < mp_model_num_layers(m); i++) {
        mp_layer_info info;
        assert_int_equal(mp_model_layer_info(m, i, 16, &info), MP_OK);
        for (int k = 0; k < r->nlayers; k++) {
            const mp_tune_layer *l = &r->layers[k];
            if (strcmp(l->name, info.name)) continue;
            const char *want = l->chosen == MP_TUNE_FLOAT32   ? "float32"
                               : l->chosen == MP_TUNE_FLOAT16 ? "mixed_float16"
                                                              : "mixed_bfloat16";
            assert_string_equal(info.policy.name, want);
            assert_true(info.policy_explicit);
            assert_int_equal(mp_model_layer_float8(m, i), l->chosen == MP_TUNE_FP8);
        }
    }
    mp_compile_options co = mp_compile_options_default();
    assert_int_equal(mp_model_compile(m, &co), MP_OK);
    float x[16 * 32];
    int32_t y[16];
    int64_t idx[16];
    for (int i = 0; i < 16; i++) idx[i] = i;
    assert_int_equal(mp_dataset_gather(ds, idx, 16, x, y), MP_OK);
    mp_tensor t;
    mp_tensor_wrap(&t, MP_F32, 2, (int64_t[]){16, 32}, x);
    mp_step_result sr;
    assert_int_equal(mp_model_train_step(m, &t, y, NULL, &sr), MP_OK);
    assert_true(isfinite(sr.loss));
    mp_model_free(m);
}

static void test_tuned_file_trains(void **state)
{
    (void)state;
    char *cfg = mlp_json(32, 3);
    mp_dataset *ds = data(96, 32, -3, 1, 8);
    mp_tune_options o = mp_tune_options_default();
    o.batch_size = 16;
    o.budget = 0.1; /* admits 8-bit formats in the middle layers */
    mp_tune_result r;
    assert_int_equal(mp_tune_precision(cfg, ds, &o, &r), MP_OK);
    assert_int_equal(r.nlayers, 4);
    assert_true(r.layers[0].first && r.layers[3].last);
    int below16 = 0;
    for (int k = 0; k < r.nlayers; k++) {
        const mp_tune_layer *l = &r.layers[k];
        assert_true(l->eligible & (1u << l->chosen));
        assert_true(l->error[l->chosen] <= o.budget);
        below16 += l->chosen >= MP_TUNE_FP8;
        if (k == 0 || k == 3) assert_true(l->chosen <= MP_TUNE_FLOAT16); /* kept */
        if (!mp_tune_format_trainable(MP_TUNE_MXFP8)) assert_true(l->chosen <= MP_TUNE_FP8);
    }
    assert_true(below16 >= 1);
    assert_non_null(strstr(r.config, "\"policy\": \"mixed_bfloat16\""));
    reload_and_train(&r, ds);
    char dir[256], path[300];
    assert_int_equal(test_scratch_dir(dir, sizeof dir, "tune"), 0);
    snprintf(path, sizeof path, "%s/m-tuned.json", dir);
    assert_int_equal(mp_tune_write_config(&r, path), MP_OK);
    mp_model *m = NULL;
    assert_int_equal(mp_model_from_config_file(path, NULL, 0, 4, &m), MP_OK);
    mp_model_free(m);
    /* probing other weights: the model's kernels tripled give another loss */
    assert_int_equal(mp_model_from_config(cfg, 4, INT64_MAX, &m), MP_OK);
    for (int i = 0; i < mp_model_num_params(m); i++) {
        mp_model_param *p = mp_model_get_param(m, i);
        for (int64_t j = 0; j < p->n; j++) p->master[j] *= 3;
    }
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    assert_int_equal(mp_model_save_weights(m, path), MP_OK);
    mp_model_free(m);
    mp_tune_result r3;
    o.weights = path;
    assert_int_equal(mp_tune_precision(cfg, ds, &o, &r3), MP_OK);
    assert_true(r3.loss != r.loss);
    mp_tune_result_free(&r3);
    snprintf(path, sizeof path, "%s/none.safetensors", dir);
    assert_int_not_equal(mp_tune_precision(cfg, ds, &o, &r3), MP_OK);
    assert_non_null(strstr(mp_last_error(), "none.safetensors"));
    o.weights = NULL;
    assert_int_equal(test_remove_tree(dir), 0);
    mp_tune_result_free(&r);
    /* float32 and float16 choices: per-layer policies */
    assert_int_equal(mp_tune_formats_from_list("float32,float16", &o.candidates), MP_OK);
    o.budget = 1e-12;
    assert_int_equal(mp_tune_precision(cfg, ds, &o, &r), MP_OK);
    for (int k = 0; k < r.nlayers; k++) assert_int_equal(r.layers[k].chosen, MP_TUNE_FLOAT32);
    assert_non_null(strstr(r.config, "\"name\": \"b\", \"inputs\": [\"a\"], \"units\": 48, "
                                     "\"activation\": \"relu\", \"policy\": \"float32\", "
                                     "\"float8\": false}"));
    reload_and_train(&r, ds);
    mp_tune_result_free(&r);
    o.budget = 0.05;
    assert_int_equal(mp_tune_precision(cfg, ds, &o, &r), MP_OK);
    for (int k = 0; k < r.nlayers; k++) assert_int_equal(r.layers[k].chosen, MP_TUNE_FLOAT16);
    reload_and_train(&r, ds);
    mp_tune_result_free(&r);
    mp_dataset_free(ds);
    free(cfg);
}

/* The layer line of `name` in a tuned file (one layer a line). */
static void layer_line(const char *config, const char *name, char *out, size_t len)
{
    char key[64];
    snprintf(key, sizeof key, "\"name\": \"%s\"", name);
    const char *p = strstr(config, key);
    assert_non_null(p);
    while (p > config && p[-1] != '\n') p--;
    size_t n = strcspn(p, "\n");
    assert_true(n < len);
    memcpy(out, p, n);
    out[n] = 0;
}

static void test_mx_choices_text(void **state)
{
    (void)state;
    char *cfg = mlp_json(32, 3);
    mp_dataset *ds = data(64, 32, -3, 1, 9);
    mp_tune_options o = mp_tune_options_default();
    o.batch_size = 16;
    o.trainable_only = false; /* MX written whether or not this build trains it */
    o.budget = 10;            /* everything qualifies: the cheapest eligible wins */
    mp_tune_result r;
    assert_int_equal(mp_tune_precision(cfg, ds, &o, &r), MP_OK);
    char line[1024];
    layer_line(r.config, "b", line, sizeof line);
    assert_int_equal(row(&r, "b")->chosen, MP_TUNE_MXFP4);
    assert_non_null(strstr(line, "\"policy\": \"mixed_bfloat16\", \"mx\": \"mxfp4_e2m1\"}"));
    assert_null(strstr(line, "float8"));
    layer_line(r.config, "a", line, sizeof line); /* the first layer: kept at 16 bits */
    assert_non_null(strstr(line, "\"policy\": \"mixed_bfloat16\", \"float8\": false}"));
    layer_line(r.config, "softmax", line, sizeof line); /* untuned: as it was */
    assert_non_null(strstr(line, "\"activation\": \"softmax\", \"policy\": \"float32\"}"));
    mp_tune_result_free(&r);
    const char *lists[][2] = {{"float32,mxfp6", "mxfp6_e2m3"}, {"mxfp8", "mxfp8_e4m3"}};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(mp_tune_formats_from_list(lists[i][0], &o.candidates), MP_OK);
        assert_int_equal(mp_tune_precision(cfg, ds, &o, &r), MP_OK);
        layer_line(r.config, "c", line, sizeof line);
        char want[64];
        snprintf(want, sizeof want, "\"mx\": \"%s\"", lists[i][1]);
        assert_non_null(strstr(line, want));
        mp_tune_result_free(&r);
    }
    /* fp8: the float8 switch on */
    assert_int_equal(mp_tune_formats_from_list("fp8", &o.candidates), MP_OK);
    assert_int_equal(mp_tune_precision(cfg, ds, &o, &r), MP_OK);
    layer_line(r.config, "b", line, sizeof line);
    assert_non_null(strstr(line, "\"policy\": \"mixed_bfloat16\", \"float8\": true}"));
    mp_tune_result_free(&r);
    mp_dataset_free(ds);
    free(cfg);
}

/* fp8 as delayed scaling's max algorithm: a batch after a larger one is
 * scaled for the larger. One huge sample in the first probe batch makes
 * the next three flush their (small) inputs; current scaling would flush
 * only the first batch's others (15 of 64 samples). */
static void test_delayed_scaling(void **state)
{
    (void)state;
    char *cfg = mlp_json(32, 2);
    mp_dataset *tmp = data(64, 32, -3, 1, 21);
    int64_t order[64];
    assert_int_equal(mp_dataset_order(tmp, 0, 1, true, order), MP_OK); /* the probe's order */
    float x[64 * 32];
    int32_t y[64];
    int64_t all[64];
    for (int i = 0; i < 64; i++) all[i] = i;
    assert_int_equal(mp_dataset_gather(tmp, all, 64, x, y), MP_OK);
    mp_dataset_free(tmp);
    for (int j = 0; j < 32; j++) x[order[0] * 32 + j] *= 0x1p24f;
    mp_dataset *ds = NULL;
    assert_int_equal(mp_dataset_from_arrays(x, y, 64, 32, 4, &ds), MP_OK);
    mp_tune_options o = mp_tune_options_default();
    o.batch_size = 16;
    o.keep_first_last = false;
    mp_tune_result r;
    assert_int_equal(mp_tune_precision(cfg, ds, &o, &r), MP_OK);
    const mp_tune_layer *a = row(&r, "a");
    assert_true(a->flush[MP_TUNE_FP8][MP_TUNE_ACTIVATION] > 0.9);
    assert_true(a->flush[MP_TUNE_BFLOAT16][MP_TUNE_ACTIVATION] == 0);
    assert_true(a->chosen <= MP_TUNE_FLOAT16);
    mp_tune_result_free(&r);
    mp_dataset_free(ds);
    free(cfg);
}

/* Any kind with a kernel is tuned: Conv2D and MultiHeadAttention (its four
 * projections), both with fp8/MX GEMM paths; both files load and train in
 * the format chosen. */
static void test_kinds(void **state)
{
    (void)state;
    const char *conv =
        "{\"format\": \"mixprec.model\", \"version\": 2, \"layers\": ["
        "{\"class_name\": \"InputLayer\", \"name\": \"x\", \"inputs\": [], \"shape\": [8, 4, 2]},"
        "{\"class_name\": \"Conv2D\", \"name\": \"conv\", \"inputs\": [\"x\"], \"filters\": 8,"
        " \"kernel_size\": 3, \"padding\": \"same\", \"activation\": \"relu\"},"
        "{\"class_name\": \"Flatten\", \"name\": \"f\", \"inputs\": [\"conv\"]},"
        "{\"class_name\": \"Dense\", \"name\": \"out\", \"inputs\": [\"f\"], \"units\": 4},"
        "{\"class_name\": \"Activation\", \"name\": \"p\", \"inputs\": [\"out\"],"
        " \"activation\": \"softmax\", \"policy\": \"float32\"}]}";
    const char *mha =
        "{\"format\": \"mixprec.model\", \"version\": 2, \"layers\": ["
        "{\"class_name\": \"InputLayer\", \"name\": \"x\", \"inputs\": [], \"shape\": [4, 16]},"
        "{\"class_name\": \"MultiHeadAttention\", \"name\": \"att\", \"inputs\": [\"x\"],"
        " \"num_heads\": 2, \"key_dim\": 8},"
        "{\"class_name\": \"Flatten\", \"name\": \"f\", \"inputs\": [\"att\"]},"
        "{\"class_name\": \"Dense\", \"name\": \"out\", \"inputs\": [\"f\"], \"units\": 4},"
        "{\"class_name\": \"Activation\", \"name\": \"p\", \"inputs\": [\"out\"],"
        " \"activation\": \"softmax\", \"policy\": \"float32\"}]}";
    mp_dataset *ds = data(32, 64, -3, 1, 12);
    mp_tune_options o = mp_tune_options_default();
    o.batch_size = 16;
    o.budget = 10; /* the cheapest eligible wins */
    o.keep_first_last = false;
    mp_tune_result r;
    assert_int_equal(mp_tune_precision(conv, ds, &o, &r), MP_OK);
    assert_int_equal(r.nlayers, 2);
    const mp_tune_layer *c = row(&r, "conv");
    assert_string_equal(c->type, "Conv2D");
    assert_string_equal(c->shape, "3x3x2x8");
    assert_int_equal(c->weights, 3 * 3 * 2 * 8);
    assert_int_equal(c->acts, 16 * 64);
    assert_true(c->chosen >= MP_TUNE_FP8);
    mp_model *m = NULL;
    if (mp_model_from_config(r.config, 16, INT64_MAX, &m)) fail_msg("%s", mp_last_error());
    mp_compile_options co = mp_compile_options_default();
    assert_int_equal(mp_model_compile(m, &co), MP_OK);
    assert_int_equal(mp_model_layer_float8(m, 1), c->chosen == MP_TUNE_FP8);
    float x[16 * 64];
    int32_t y[16];
    int64_t idx[16];
    for (int i = 0; i < 16; i++) idx[i] = i;
    assert_int_equal(mp_dataset_gather(ds, idx, 16, x, y), MP_OK);
    mp_tensor t;
    mp_step_result sr;
    mp_tensor_wrap(&t, MP_F32, 4, (int64_t[]){16, 8, 4, 2}, x);
    assert_int_equal(mp_model_train_step(m, &t, y, NULL, &sr), MP_OK);
    assert_true(isfinite(sr.loss));
    mp_model_free(m);
    mp_tune_result_free(&r);
    assert_int_equal(mp_tune_precision(mha, ds, &o, &r), MP_OK);
    const mp_tune_layer *a = row(&r, "att");
    assert_int_equal(a->weights, 4 * 16 * 2 * 8); /* query, key, value, output kernels */
    assert_int_equal(a->eligible, 0x7fu);         /* its projections take float8 and MX too */
    assert_true(a->chosen >= MP_TUNE_FP8);
    char line[1024];
    layer_line(r.config, "att", line, sizeof line);
    assert_non_null(strstr(line, a->chosen == MP_TUNE_FP8 ? "\"float8\": true" : "\"mx\": \"mx"));
    if (mp_model_from_config(r.config, 16, INT64_MAX, &m)) fail_msg("%s", mp_last_error());
    assert_int_equal(mp_model_compile(m, &co), MP_OK);
    assert_true(mp_model_layer_float8(m, 1) || mp_model_layer_mx(m, 1, NULL));
    mp_tensor_wrap(&t, MP_F32, 3, (int64_t[]){16, 4, 16}, x);
    assert_int_equal(mp_model_train_step(m, &t, y, NULL, &sr), MP_OK);
    assert_true(isfinite(sr.loss));
    mp_model_free(m);
    mp_tune_result_free(&r);
    mp_dataset_free(ds);
}

/* ------------------------------------------------------------ bad input */

static void one_line(mp_status s, const char *want)
{
    assert_int_equal(s, MP_ERR_INVALID);
    if (!strstr(mp_last_error(), want)) fail_msg("'%s' lacks '%s'", mp_last_error(), want);
    assert_null(strchr(mp_last_error(), '\n'));
}

static void test_bad_input(void **state)
{
    (void)state;
    unsigned mask;
    mp_tune_format f;
    one_line(mp_tune_formats_from_list("bfloat16,fp9", &mask), "'fp9'");
    one_line(mp_tune_formats_from_list("", &mask), "''");
    one_line(mp_tune_format_from_name("mxfp3", &f), "'mxfp3'");
    mp_tune_options o = mp_tune_options_default();
    const double budgets[] = {0, -0.5, NAN, INFINITY};
    const char *names[] = {"budget 0 ", "budget -0.5 ", "budget nan ", "budget inf "};
    for (int i = 0; i < 4; i++) {
        o.budget = budgets[i];
        one_line(mp_tune_options_validate(&o), names[i]);
    }
    o = mp_tune_options_default();
    o.probe_batches = 0;
    one_line(mp_tune_options_validate(&o), "probe batches 0 ");
    o = mp_tune_options_default();
    o.batch_size = 0;
    one_line(mp_tune_options_validate(&o), "batch size 0 ");
    /* no layer with a kernel */
    const char *plain =
        "{\"format\": \"mixprec.model\", \"version\": 2, \"layers\": [{\"class_name\": "
        "\"InputLayer\", \"name\": \"x\", \"inputs\": [], \"shape\": [32]}, {\"class_name\": "
        "\"Activation\", \"name\": \"s\", \"inputs\": [\"x\"], \"activation\": \"softmax\"}]}";
    mp_dataset *ds = data(16, 32, -2, 0, 4);
    mp_tune_result r;
    o = mp_tune_options_default();
    o.budget = NAN; /* checked before anything runs */
    one_line(mp_tune_precision(plain, ds, &o, &r), "budget nan");
    assert_null(r.layers);
    o = mp_tune_options_default();
    one_line(mp_tune_precision(plain, ds, &o, &r), "no layer with a kernel");
    assert_null(r.config);
    /* the data does not fit the model */
    char *cfg = mlp_json(20, 1);
    one_line(mp_tune_precision(cfg, ds, &o, &r), "32 features");
    free(cfg);
    /* broken JSON */
    assert_int_equal(mp_tune_precision("{", ds, &o, &r), MP_ERR_FORMAT);
    assert_null(strchr(mp_last_error(), '\n'));
    mp_dataset_free(ds);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensor_errors),      cmocka_unit_test(test_choose_rule),
        cmocka_unit_test(test_huge_dynamic_range), cmocka_unit_test(test_tuned_file_trains),
        cmocka_unit_test(test_mx_choices_text),    cmocka_unit_test(test_kinds),
        cmocka_unit_test(test_delayed_scaling),    cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests_name("tune", tests, NULL, NULL);
}
