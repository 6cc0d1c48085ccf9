/* common.c - helpers shared by the cmocka test programs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

uint64_t test_rng_next(test_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double test_rng_uniform(test_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * (double)(test_rng_next(r) >> 11) * 0x1p-53;
}

uint32_t test_rng_u32(test_rng *r) { return (uint32_t)(test_rng_next(r) >> 32); }

int test_isas(mp_isa out[MP_ISA_COUNT])
{
    int n = 0;
    for (int i = 0; i < MP_ISA_COUNT; i++)
        if (mp_isa_supported((mp_isa)i)) out[n++] = (mp_isa)i;
    return n;
}

uint8_t *test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    uint8_t *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

int test_scratch_dir(char *buf, size_t len, const char *prefix)
{
    snprintf(buf, len, "/tmp/%s_XXXXXX", prefix);
    return mkdtemp(buf) ? 0 : -1;
}

int test_remove_tree(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

double test_gamma(int64_t k) { return (double)k * U32 / (1 - (double)k * U32); }

double test_gemm_worst(const test_gemm_ref *g, const void *got, mp_dtype got_type)
{
    double worst = 0;
    for (int64_t i = 0; i < g->m; i++)
        for (int64_t j = 0; j < g->n; j++) {
            double acc = 0, mag = 0;
            for (int64_t kk = 0; kk < g->k; kk++) {
                double t = g->alpha * g->a[i * g->k + kk] * g->b[kk * g->bs_k + j * g->bs_n];
                acc += t;
                mag += fabs(t);
            }
            if (g->bias) {
                acc += g->bias[j];
                mag += fabs(g->bias[j]);
            }
            double e = test_gamma(g->k + 1 + g->extra) * mag;
            if (g->bf16_out) e += UBF * (fabs(acc) + e);
            float v = got_type == MP_BF16 ? mp_bf16_to_f32(((const uint16_t *)got)[i * g->n + j])
                                          : ((const float *)got)[i * g->n + j];
            double r = fabs(v - acc) / (e > 0 ? e : 1e-300);
            worst = r > worst ? r : worst;
        }
    return worst;
}

float *test_transpose_copy(const float *x, int64_t rows, int64_t cols)
{
    float *t = malloc((size_t)(rows * cols) * sizeof *t);
    if (!t) abort();
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) t[c * rows + r] = x[r * cols + c];
    return t;
}

void test_fill(float *x, size_t n, uint64_t seed, double lo, double hi)
{
    test_rng r = {seed};
    for (size_t i = 0; i < n; i++) x[i] = (float)test_rng_uniform(&r, lo, hi);
}

void test_batch(float *x, int32_t *y, int rows, int width, int i)
{
    test_fill(x, (size_t)rows * (size_t)width, 100 + (uint64_t)i, -1, 1);
    for (int r = 0; r < rows; r++) y[r] = (r + i) % 3;
}

mp_step_result test_train_rows(mp_model *m, float *x, const int32_t *y, int rows, int width)
{
    mp_tensor tx;
    mp_tensor_wrap(&tx, MP_F32, 2, (int64_t[]){rows, width}, x);
    mp_step_result r;
    assert_int_equal(mp_model_train_step(m, &tx, y, NULL, &r), MP_OK);
    return r;
}

void test_configs_refused(const char *head, const char *const cases[][2], size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s%s", head, cases[i][0]);
        mp_model *r = NULL;
        assert_int_not_equal(mp_model_from_config(text, 4, INT64_MAX, &r), MP_OK);
        assert_null(r);
        if (!strstr(mp_last_error(), cases[i][1]))
            fail_msg("case %zu: '%s' lacks '%s'", i, mp_last_error(), cases[i][1]);
        assert_null(strchr(mp_last_error(), '\n'));
    }
}
