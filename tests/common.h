/* common.h - helpers shared by the cmocka test programs. */
#ifndef MP_TEST_COMMON_H
#define MP_TEST_COMMON_H

#include <setjmp.h> /* cmocka needs these before its header */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "mixprec.h"

/* Small deterministic generator for test data (xoshiro-style). */
typedef struct {
    uint64_t s;
} test_rng;
uint64_t test_rng_next(test_rng *r);
/* Uniform in [lo, hi). */
double test_rng_uniform(test_rng *r, double lo, double hi);
uint32_t test_rng_u32(test_rng *r);
/* x[0..n) uniform in [lo, hi) from the generator seeded with seed. */
void test_fill(float *x, size_t n, uint64_t seed, double lo, double hi);
/* Training batch i of a seeded set: rows x width inputs uniform in [-1, 1)
 * (seed 100 + i) and labels (row + i) % 3. */
void test_batch(float *x, int32_t *y, int rows, int width, int i);
/* One training step on a rows x width float32 batch with labels y; asserts
 * it ran and returns its result. */
mp_step_result test_train_rows(mp_model *m, float *x, const int32_t *y, int rows, int width);
/* Each config head + cases[i][0] is refused by mp_model_from_config (batch
 * 4) with nothing built and a one-line error containing cases[i][1]. */
void test_configs_refused(const char *head, const char *const cases[][2], size_t n);

static inline uint32_t f32_bits(float x)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = x};
    return v.u;
}
static inline float bits_f32(uint32_t u)
{
    union {
        uint32_t u;
        float f;
    } v = {.u = u};
    return v.f;
}

/* A fresh scratch directory /tmp/<prefix>_XXXXXX, written into buf;
 * 0 on success. */
int test_scratch_dir(char *buf, size_t len, const char *prefix);
/* Remove a scratch directory and all it holds; 0 on success. */
int test_remove_tree(const char *dir);
/* The whole file at path (malloc'ed, one spare byte), its size in *len;
 * fails the test when it cannot be read. */
uint8_t *test_read_file(const char *path, size_t *len);

/* Float32 and bfloat16 unit roundoffs. */
#define U32 0x1p-24
#define UBF 0x1p-8
/* gamma_k = k u / (1 - k u): the float32 summation bound over k terms. */
double test_gamma(int64_t k);

/* A GEMM result against float64: ref = alpha sum_k a[i,k] b[k,j] (+ bias[j])
 * over exactly representable products (fp8 and MX values have at most 8
 * significant bits: their products are exact in float32), the library
 * summing in float32 in any order: |err| <= gamma_{k+1+extra} (sum_k |a b|
 * + |bias|) (k - 1 additions, the bias, a possible FMA's rounding counted
 * once more, and `extra` roundings of the factor alpha: per-tensor fp8
 * scales the float32 sum by 1/s_a * 1/s_b, three roundings; the bound
 * takes |alpha| sum_k |a b|), then, for a bfloat16
 * output, one more rounding: E + UBF (|ref| + E). a is [m, k] row-major, b
 * is [k, n] read at b[kk * bs_k + j * bs_n]. */
typedef struct {
    const float *a, *b, *bias;
    int64_t m, n, k, bs_k, bs_n;
    bool bf16_out;
    int extra;
    double alpha;
} test_gemm_ref;
/* The largest |got - ref| / bound over the result (<= 1 passes); got is
 * [m, n] float32 or bfloat16. */
double test_gemm_worst(const test_gemm_ref *g, const void *got, mp_dtype got_type);

/* x [rows, cols] transposed into a new array (the caller frees it). */
float *test_transpose_copy(const float *x, int64_t rows, int64_t cols);

/* The ISA paths this CPU can run, for looping tests over every path. */
int test_isas(mp_isa out[MP_ISA_COUNT]);

#endif
