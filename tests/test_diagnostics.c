/* test_diagnostics.c - the per-layer numerics statistics (underflow, overflow,
 * copy error, update) against counts built into scripted tensors and against
 * an independent classification through the scalar conversions, the same
 * figures gathered by the optimizer's update pass, and a short fit with a
 * run directory writing its files. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "optim/optim_internal.h"

/* What round-to-nearest-even into t does to x, read off the scalar
 * conversion's bits: 0 zero/normal, 1 flushed, 2 subnormal, 3 overflow,
 * 4 non-finite input. */
static int classify(float x, mp_dtype t)
{
    if (!isfinite(x)) return 4;
    if (x == 0) return 0;
    uint32_t exp, man, expmax;
    if (t == MP_F16) {
        uint16_t h = mp_f32_to_f16(x);
        exp = (h >> 10) & 0x1F, man = h & 0x3FF, expmax = 0x1F;
    } else {
        uint16_t h = mp_f32_to_bf16(x);
        exp = (h >> 7) & 0xFF, man = h & 0x7F, expmax = 0xFF;
    }
    if (exp == expmax) return 3; /* a finite input became inf */
    if (exp == 0) return man == 0 ? 1 : 2;
    return 0;
}

/* n values: the first counts[k] of each kind k (scripted values), the rest
 * ordinary normals, then shuffled. */
static float *scripted(mp_dtype t, int64_t n, const int64_t counts[5], test_rng *r)
{
    mp_dtype_info in;
    mp_dtype_get_info(t, &in);
    double sub = in.min_subnormal, mn = in.min_normal, mx = in.max;
    int e;
    frexp(mx, &e);
    double half_ulp = ldexp(1.0, e - 2 - in.mantissa_bits);
    /* per kind, values cycling through the edges of its range */
    const double flush[] = {sub / 2, sub / 4, sub / 1024, sub * 0.49};
    const double subn[] = {sub, sub * 3, mn / 2, mn - sub, sub * 0.51};
    const double ovf[] = {mx + half_ulp, mx * 1.5, mx * 1.0001 + half_ulp};
    const double fine[] = {mn, mn - sub / 2, mn - sub / 4, mx, mx + half_ulp * 0.99, 1.0, 0.001};
    float *x = malloc((size_t)n * sizeof *x);
    int64_t i = 0;
    for (int64_t k = 0; k < counts[0]; k++) x[i++] = (float)flush[k % 4] * (k & 1 ? -1.f : 1.f);
    for (int64_t k = 0; k < counts[1]; k++) x[i++] = (float)subn[k % 5] * (k & 1 ? -1.f : 1.f);
    for (int64_t k = 0; k < counts[2]; k++) {
        double v = ovf[k % 3];
        x[i++] = (float)(v < 3.4e38 ? v : 3.4e38) * (k & 1 ? -1.f : 1.f);
    }
    for (int64_t k = 0; k < counts[3]; k++) x[i++] = k % 2 ? NAN : -INFINITY;
    for (int64_t k = 0; k < counts[4]; k++) x[i++] = k & 1 ? 0.0f : -0.0f;
    for (int64_t k = 0; i < n; k++) x[i++] = (float)fine[k % 7] * (k & 1 ? -1.f : 1.f);
    for (int64_t j = n - 1; j > 0; j--) {
        int64_t s = (int64_t)(test_rng_next(r) % (uint64_t)(j + 1));
        float tmp = x[j];
        x[j] = x[s];
        x[s] = tmp;
    }
    return x;
}

static void test_scripted_counts(void **state)
{
    (void)state;
    test_rng r = {7};
    const mp_dtype types[] = {MP_F16, MP_BF16};
    for (int ti = 0; ti < 2; ti++) {
        const int64_t n = 100003, counts[5] = {1234, 2345, 345, 45, 5678};
        float *x = scripted(types[ti], n, counts, &r);
        /* the independent count: the conversion's bits */
        int64_t want[5] = {0};
        for (int64_t i = 0; i < n; i++) want[classify(x[i], types[ti])]++;
        assert_int_equal(want[1], counts[0]);
        assert_int_equal(want[2], counts[1]);
        assert_int_equal(want[3], counts[2]);
        assert_int_equal(want[4], counts[3]);
        mp_numerics st;
        mp_numerics_compute(x, MP_F32, n, types[ti], NULL, MP_F32, NULL, &st);
        assert_int_equal(st.n, n);
        assert_int_equal(st.flush, counts[0]);
        assert_int_equal(st.subnormal, counts[1]);
        assert_int_equal(st.overflow, counts[2]);
        assert_int_equal(st.nonfinite, counts[3]);
        assert_int_equal(st.zeros, counts[4]);
        double amax = 0;
        for (int64_t i = 0; i < n; i++)
            if (isfinite(x[i]) && fabs((double)x[i]) > amax) amax = fabs((double)x[i]);
        assert_true(st.amax == amax);
        free(x);
    }
}

/* Log-uniform magnitudes over the whole float32 range: every value's class
 * agrees with the conversion's. */
static void test_random_against_conversion(void **state)
{
    (void)state;
    test_rng r = {11};
    const int64_t n = 200000;
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = bits_f32(test_rng_u32(&r) & 0xFFFFFFFFu);
    const mp_dtype types[] = {MP_F16, MP_BF16};
    for (int ti = 0; ti < 2; ti++) {
        int64_t want[5] = {0}, zeros = 0;
        for (int64_t i = 0; i < n; i++) {
            want[classify(x[i], types[ti])]++;
            zeros += x[i] == 0;
        }
        mp_numerics st;
        mp_numerics_compute(x, MP_F32, n, types[ti], NULL, MP_F32, NULL, &st);
        assert_int_equal(st.flush, want[1]);
        assert_int_equal(st.subnormal, want[2]);
        assert_int_equal(st.overflow, want[3]);
        assert_int_equal(st.nonfinite, want[4]);
        assert_int_equal(st.zeros, zeros);
        assert_true(want[1] > 0 && want[2] > 0 && want[3] > 0);
    }
    free(x);
}

/* A master, its compute copy and an earlier master: the copy's relative
 * error and the update, against float64 sums in the test; values already in
 * float16 count their own subnormals. E4M3's overflow tie stays at max. */
static void test_copy_error_update_and_fp8(void **state)
{
    (void)state;
    const int64_t n = 50001;
    float *w = malloc((size_t)n * sizeof *w), *b = malloc((size_t)n * sizeof *b);
    uint16_t *c = malloc((size_t)n * sizeof *c);
    test_rng r = {3};
    for (int64_t i = 0; i < n; i++) {
        w[i] = (float)test_rng_uniform(&r, -1, 1);
        b[i] = w[i] - (float)test_rng_uniform(&r, -1e-3, 1e-3);
    }
    mp_convert(c, MP_BF16, w, MP_F32, (size_t)n);
    double err = 0, ww = 0, dd = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)mp_bf16_to_f32(c[i]) - w[i], u = (double)w[i] - b[i];
        err += d * d;
        ww += (double)w[i] * w[i];
        dd += u * u;
    }
    mp_numerics st;
    mp_numerics_compute(w, MP_F32, n, MP_BF16, c, MP_BF16, b, &st);
    assert_true(fabs(sqrt(st.err_sumsq / st.sumsq) - sqrt(err / ww)) < 1e-12);
    assert_true(fabs(sqrt(st.upd_sumsq / st.sumsq) - sqrt(dd / ww)) < 1e-12);
    assert_true(sqrt(err / ww) > 1e-4 && sqrt(err / ww) < 4e-3); /* about bf16's 2^-9 */

    uint16_t h[6];
    const float hv[6] = {1e-7f, 3e-6f, 1.0f, 0.0f, 6e-5f, 7e-5f}; /* 3 subnormals in f16 */
    mp_convert(h, MP_F16, hv, MP_F32, 6);
    mp_numerics_compute(h, MP_F16, 6, MP_F16, NULL, MP_F32, NULL, &st);
    assert_int_equal(st.subnormal, 3);
    assert_int_equal(st.flush, 0);
    assert_int_equal(st.zeros, 1);

    const float f8[4] = {448.0f, 464.0f, 464.5f, 1e6f};
    mp_numerics_compute(f8, MP_F32, 4, MP_F8E4M3, NULL, MP_F32, NULL, &st);
    assert_int_equal(st.overflow, 2);
    free(w);
    free(b);
    free(c);
}

/* Every figure against a plain float64 loop over the same values, at
 * lengths around the pass's blocks (one value, a partial lane group, a
 * partial chunk, several chunks): master, copy and earlier values with
 * inf and NaN sprinkled in each (a pair with a non-finite side counts no
 * error and no update), amax and the largest update exact, sums to 1e-12;
 * the same bits on every ISA path. */
static void test_all_figures_against_a_plain_loop(void **state)
{
    (void)state;
    const int64_t lengths[] = {1, 7, 13, 2047, 2049, 3 * 2048 + 5, 20011};
    test_rng r = {17};
    for (int li = 0; li < 7; li++) {
        const int64_t n = lengths[li];
        float *w = malloc((size_t)n * sizeof *w), *b = malloc((size_t)n * sizeof *b);
        float *cf = malloc((size_t)n * sizeof *cf);
        uint16_t *c = malloc((size_t)n * sizeof *c);
        for (int64_t i = 0; i < n; i++) {
            w[i] = (float)(test_rng_uniform(&r, -2, 2) * pow(10, test_rng_uniform(&r, -9, 6)));
            b[i] = w[i] * (float)test_rng_uniform(&r, 0.9, 1.1);
            uint32_t k = test_rng_u32(&r) % 97;
            if (k == 0) w[i] = INFINITY;
            if (k == 1) w[i] = NAN;
            if (k == 2) b[i] = -INFINITY;
        }
        mp_convert(c, MP_F16, w, MP_F32, (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            if (test_rng_u32(&r) % 89 == 0) c[i] = 0x7E00; /* a NaN in the copy alone */
            cf[i] = mp_f16_to_f32(c[i]);
        }
        double amax = 0, uamax = 0, sumsq = 0, err = 0, usumsq = 0;
        int64_t nonfinite = 0, zeros = 0, flush = 0, sub = 0, ovf = 0;
        for (int64_t i = 0; i < n; i++) {
            int k = classify(w[i], MP_F16);
            nonfinite += k == 4, flush += k == 1, sub += k == 2, ovf += k == 3;
            zeros += w[i] == 0;
            if (!isfinite(w[i])) continue;
            double a = fabs((double)w[i]);
            amax = a > amax ? a : amax;
            sumsq += a * a;
            if (isfinite(cf[i])) {
                double d = (double)cf[i] - w[i];
                err += d * d;
            }
            if (isfinite(b[i])) {
                double u = fabs((double)(w[i] - b[i])); /* the float32 difference */
                uamax = u > uamax ? u : uamax;
                usumsq += u * u;
            }
        }
        mp_numerics st;
        mp_numerics_compute(w, MP_F32, n, MP_F16, c, MP_F16, b, &st);
        assert_int_equal(st.n, n);
        assert_int_equal(st.nonfinite, nonfinite);
        assert_int_equal(st.zeros, zeros);
        assert_int_equal(st.flush, flush);
        assert_int_equal(st.subnormal, sub);
        assert_int_equal(st.overflow, ovf);
        assert_true(st.amax == amax);
        assert_true(st.upd_amax == uamax);
        assert_true(fabs(st.sumsq - sumsq) <= 1e-12 * sumsq);
        assert_true(fabs(st.err_sumsq - err) <= 1e-12 * err);
        assert_true(fabs(st.upd_sumsq - usumsq) <= 1e-12 * usumsq);
        /* every ISA path gives the same figures to the last bit (one
         * thread: the threads' partial sums add up in no fixed order) */
        mp_isa isas[MP_ISA_COUNT], saved = mp_isa_active();
        int nisa = test_isas(isas), threads = mp_num_threads();
        mp_set_num_threads(1);
        mp_numerics ref, other;
        mp_isa_set(MP_ISA_SCALAR);
        mp_numerics_compute(w, MP_F32, n, MP_F16, c, MP_F16, b, &ref);
        for (int a = 0; a < nisa; a++) {
            mp_isa_set(isas[a]);
            mp_numerics_compute(w, MP_F32, n, MP_F16, c, MP_F16, b, &other);
            assert_memory_equal(&ref, &other, sizeof ref);
        }
        mp_isa_set(saved);
        mp_set_num_threads(threads);
        assert_int_equal(ref.flush, flush);
        /* without a copy or a before: the same counts, no error, no update */
        mp_numerics plain;
        mp_numerics_compute(w, MP_F32, n, MP_F16, NULL, MP_F32, NULL, &plain);
        assert_int_equal(plain.flush, flush);
        assert_int_equal(plain.overflow, ovf);
        assert_true(plain.sumsq == st.sumsq && plain.amax == st.amax);
        assert_true(plain.err_sumsq == 0 && plain.upd_sumsq == 0 && plain.upd_amax == 0);
        free(w);
        free(b);
        free(cf);
        free(c);
    }
}

/* in -> hidden (relu) -> 3 (float32 softmax) under policy, built for batch
 * 16 and compiled with the defaults (Adam) */
static mp_model *small_model(const char *policy, int64_t in, int64_t hidden, uint64_t seed)
{
    mp_set_global_policy(policy);
    mp_model *m = mp_model_new(seed);
    mp_node h = mp_dense(m, mp_input(m, 1, (int64_t[]){in}, NULL), hidden, MP_ACT_RELU, NULL);
    h = mp_dense(m, h, 3, MP_ACT_NONE, NULL);
    h = mp_activation_layer(m, h, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    mp_set_global_policy("float32");
    assert_int_equal(mp_model_build(m, h, 16), MP_OK);
    assert_int_equal(mp_model_compile(m, NULL), MP_OK);
    return m;
}

/* The optimizer's update pass gathers, when asked, every tensor's figures
 * as mp_numerics_compute finds them on the master after the step, its copy,
 * the master before it and the gradient (the 300x300 kernel spans several
 * threads' chunks); the step itself is the same to the last bit as one not
 * asked; the request holds for one step only. */
static void test_update_pass_gathers_the_figures(void **state)
{
    (void)state;
    const char *policies[] = {"mixed_bfloat16", "mixed_float16", "float32"};
    for (int pi = 0; pi < 3; pi++) {
        mp_model *a = small_model(policies[pi], 300, 300, 9);
        mp_model *b = small_model(policies[pi], 300, 300, 9);
        mp_tensor x;
        mp_tensor_init(&x, MP_F32, 2, (int64_t[]){16, 300}, MP_MEM_OTHER);
        int32_t y[16];
        test_rng r = {21};
        for (int64_t i = 0; i < 16 * 300; i++)
            ((float *)x.data)[i] = (float)test_rng_uniform(&r, -1, 1);
        for (int i = 0; i < 16; i++) y[i] = i % 3;
        mp_step_result res;
        /* a first step so that the moments are not zero */
        assert_int_equal(mp_model_train_step(a, &x, y, NULL, &res), MP_OK);
        assert_int_equal(mp_model_train_step(b, &x, y, NULL, &res), MP_OK);
        mp_optimizer *opt = mp_model_optimizer(a);
        int np = mp_optimizer_num_params(opt);
        mp_numerics *wn = calloc((size_t)np * 2, sizeof *wn), *gn = wn + np;
        float **before = calloc((size_t)np, sizeof *before);
        for (int i = 0; i < np; i++) {
            const mp_param *p = mp_optimizer_param(opt, i);
            before[i] = malloc((size_t)p->n * sizeof(float));
            memcpy(before[i], p->master, (size_t)p->n * sizeof(float));
        }
        mp_optimizer_collect_numerics(opt, wn, gn);
        assert_int_equal(mp_model_train_step(a, &x, y, NULL, &res), MP_OK);
        assert_true(res.applied);
        assert_int_equal(mp_model_train_step(b, &x, y, NULL, &res), MP_OK);
        for (int i = 0; i < np; i++) {
            const mp_param *p = mp_optimizer_param(opt, i);
            const mp_param *q = mp_optimizer_param(mp_model_optimizer(b), i);
            assert_memory_equal(p->master, q->master, (size_t)p->n * sizeof(float));
            if (p->weight && q->weight)
                assert_memory_equal(p->weight, q->weight,
                                    (size_t)p->n * mp_dtype_size(p->weight_dtype));
            mp_numerics want, wantg;
            const void *copy = p->weight ? p->weight : (const void *)p->master;
            mp_numerics_compute(p->master, MP_F32, p->n, p->weight_dtype, copy,
                                p->weight ? p->weight_dtype : MP_F32, before[i], &want);
            mp_numerics_compute(p->grad, MP_F32, p->n, p->weight_dtype, NULL, MP_F32, NULL, &wantg);
            const mp_numerics *got[2] = {&wn[i], &gn[i]}, *ref[2] = {&want, &wantg};
            for (int k = 0; k < 2; k++) {
                assert_int_equal(got[k]->n, p->n);
                assert_int_equal(got[k]->zeros, ref[k]->zeros);
                assert_int_equal(got[k]->flush, ref[k]->flush);
                assert_int_equal(got[k]->subnormal, ref[k]->subnormal);
                assert_int_equal(got[k]->overflow, ref[k]->overflow);
                assert_int_equal(got[k]->nonfinite, ref[k]->nonfinite);
                assert_true(got[k]->amax == ref[k]->amax);
                assert_true(got[k]->upd_amax == ref[k]->upd_amax);
                assert_true(fabs(got[k]->sumsq - ref[k]->sumsq) <= 1e-12 * ref[k]->sumsq);
                assert_true(fabs(got[k]->err_sumsq - ref[k]->err_sumsq) <=
                            1e-12 * ref[k]->err_sumsq);
                assert_true(fabs(got[k]->upd_sumsq - ref[k]->upd_sumsq) <=
                            1e-12 * ref[k]->upd_sumsq);
            }
            assert_true(wn[i].upd_sumsq > 0 && gn[i].sumsq > 0);
            if (pi < 2) assert_true(wn[i].err_sumsq > 0); /* a rounded copy */
            free(before[i]);
        }
        /* one step only */
        wn[0].n = -1;
        assert_int_equal(mp_model_train_step(a, &x, y, NULL, &res), MP_OK);
        assert_int_equal(wn[0].n, -1);
        free(wn);
        free(before);
        mp_tensor_release(&x);
        mp_model_free(a);
        mp_model_free(b);
    }
}

static json_t *read_lines(const char *path, int *count)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    json_t *all = json_array();
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t e;
        json_t *j = json_loads(line, 0, &e);
        assert_non_null(j);
        json_array_append_new(all, j);
    }
    free(line);
    fclose(f);
    *count = (int)json_array_size(all);
    return all;
}

/* A short fit with a run directory: config, plan, history and the log, with
 * diagnostics at step 1 and every 4 steps. */
static void test_fit_writes_run_dir(void **state)
{
    (void)state;
    char dir[256], path[512];
    assert_int_equal(test_scratch_dir(dir, sizeof dir, "mp_diag"), 0);
    int64_t n = 160;
    float *x = malloc((size_t)n * 8 * sizeof *x);
    int32_t *y = malloc((size_t)n * sizeof *y);
    test_rng r = {5};
    for (int64_t i = 0; i < n; i++) {
        y[i] = (int32_t)(i % 3);
        for (int j = 0; j < 8; j++) x[i * 8 + j] = (float)test_rng_uniform(&r, -1, 1) + (j == y[i]);
    }
    mp_dataset *ds;
    assert_int_equal(mp_dataset_from_arrays(x, y, n, 8, 3, &ds), MP_OK);
    mp_model *m = small_model("mixed_bfloat16", 8, 16, 3);
    mp_fit_options fo = mp_fit_options_default();
    fo.batch_size = 16;
    fo.epochs = 2;
    fo.verbose = 0;
    fo.validation_split = 0.2;
    fo.run_dir = dir;
    fo.diagnostics_every = 4;
    assert_int_equal(mp_model_fit(m, ds, &fo, NULL), MP_OK);
    const char *files[] = {"config.json", "plan.json", "history.csv"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/diagnostics.jsonl", dir);
    int count;
    json_t *recs = read_lines(path, &count);
    /* run, steps 1 4 8 (epoch 1: 8 steps), epoch, steps 12 16, epoch */
    assert_int_equal(count, 8);
    const char *types[] = {"run", "step", "step", "step", "epoch", "step", "step", "epoch"};
    const int steps[] = {0, 1, 4, 8, 0, 12, 16, 0};
    for (int i = 0; i < count; i++) {
        json_t *rec = json_array_get(recs, (size_t)i);
        assert_string_equal(json_string_value(json_object_get(rec, "type")), types[i]);
        if (strcmp(types[i], "step")) continue;
        assert_int_equal(json_integer_value(json_object_get(rec, "step")), steps[i]);
        assert_true(json_real_value(json_object_get(rec, "grad_norm")) > 0);
        json_t *layers = json_object_get(rec, "layers");
        assert_int_equal(json_array_size(layers), 3); /* dense, dense_1, activation */
        json_t *t0 = json_object_get(json_array_get(layers, 0), "tensors");
        /* activation, kernel: weight update gradient, bias: the same, output_grad */
        assert_int_equal(json_array_size(t0), 8);
        json_t *w = json_array_get(t0, 1), *u = json_array_get(t0, 2);
        assert_string_equal(json_string_value(json_object_get(w, "kind")), "weight");
        assert_string_equal(json_string_value(json_object_get(w, "target")), "bfloat16");
        double re = json_real_value(json_object_get(w, "rel_error"));
        assert_true(re > 0 && re < 4e-3);
        assert_string_equal(json_string_value(json_object_get(u, "kind")), "update");
        assert_true(json_real_value(json_object_get(u, "ratio")) > 0);
    }
    json_decref(recs);
    mp_model_free(m);
    mp_dataset_free(ds);
    free(x);
    free(y);
    test_remove_tree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scripted_counts),
        cmocka_unit_test(test_random_against_conversion),
        cmocka_unit_test(test_copy_error_update_and_fp8),
        cmocka_unit_test(test_all_figures_against_a_plain_loop),
        cmocka_unit_test(test_update_pass_gathers_the_figures),
        cmocka_unit_test(test_fit_writes_run_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
