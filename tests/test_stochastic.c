/* test_stochastic.c - stochastic rounding: always a neighbour, unbiased
 * within a stated statistical bound, reproducible per seed, independent of
 * chunking and thread count. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "reference.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static const ref_format *ref_of(mp_dtype t)
{
    return t == MP_F16      ? &REF_F16
           : t == MP_BF16   ? &REF_BF16
           : t == MP_F8E4M3 ? &REF_E4M3
                            : &REF_E5M2;
}

static double decode(mp_dtype t, const void *buf, size_t i)
{
    uint32_t bits = mp_dtype_size(t) == 2 ? ((const uint16_t *)buf)[i] : ((const uint8_t *)buf)[i];
    return ref_decode(ref_of(t), bits);
}

/* The two grid points around x (equal when x is on the grid). */
static void neighbours(mp_dtype t, double x, double *lo, double *hi)
{
    const ref_format *f = ref_of(t);
    int e;
    frexp(fabs(x), &e);
    int lead = e - 1, emin = 1 - f->bias;
    if (lead < emin || x == 0) lead = emin;
    double q = ldexp(1.0, lead - f->mbits);
    *lo = floor(x / q) * q;
    *hi = ceil(x / q) * q;
}

static const mp_dtype types[] = {MP_BF16, MP_F16, MP_F8E4M3, MP_F8E5M2};

static void test_always_a_neighbour(void **state)
{
    (void)state;
    enum { N = 200000 };
    float *x = malloc(N * sizeof *x);
    uint8_t *out = malloc(N * 2);
    test_rng r = {7};
    for (int k = 0; k < 4; k++) {
        mp_dtype t = types[k];
        mp_dtype_info in;
        mp_dtype_get_info(t, &in);
        for (int i = 0; i < N; i++) {
            double mag = ldexp(test_rng_uniform(&r, 1, 2), (int)(test_rng_u32(&r) % 40) - 30);
            if (i % 5 == 0)
                mag = test_rng_uniform(&r, 0, (double)in.min_normal); /* subnormal range */
            if (mag > in.max) mag = in.max * test_rng_uniform(&r, 0, 1);
            x[i] = (float)(i % 2 ? -mag : mag);
        }
        mp_convert_stochastic(out, t, x, N, 42);
        for (int i = 0; i < N; i++) {
            double lo, hi, got = decode(t, out, (size_t)i);
            neighbours(t, x[i], &lo, &hi);
            if (got != lo && got != hi)
                fail_msg("%s: %a rounded to %a, not a neighbour of [%a, %a]", mp_dtype_name(t),
                         (double)x[i], got, lo, hi);
        }
    }
    free(x);
    free(out);
}

/* Each rounding of x is lo + step * Bernoulli(p), p = (x - lo) / step, so the
 * mean of N independent roundings has standard deviation
 * step * sqrt(p (1 - p) / N) <= step / (2 sqrt N). We accept |mean - x| up to
 * 6 such deviations (a false alarm about once in 5e8 runs), i.e.
 * 3 * step / sqrt(N), and check the up-rounding frequency the same way. */
static void test_unbiased(void **state)
{
    (void)state;
    enum { N = 1 << 20 };
    static const struct {
        mp_dtype t;
        float x;
    } cases[] = {
        {MP_BF16, 1.0f + 0.3f * 0x1p-7f},
        {MP_BF16, -3.7e-3f},
        {MP_BF16, 2.5f * 0x1p-133f},
        {MP_F16, 0.1f},
        {MP_F16, -1e-6f},
        {MP_F16, 60000.5f},
        {MP_F8E4M3, 0.3f},
        {MP_F8E4M3, -300.0f},
        {MP_F8E4M3, 0.0017f},
        {MP_F8E5M2, 1.3f},
        {MP_F8E5M2, 3e-5f},
        {MP_F8E5M2, -50000.0f},
    };
    float *x = malloc(N * sizeof *x);
    uint8_t *out = malloc(N * 2);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        mp_dtype t = cases[c].t;
        for (int i = 0; i < N; i++) x[i] = cases[c].x;
        mp_convert_stochastic(out, t, x, N, 1234 + c);
        double lo, hi, sum = 0;
        long ups = 0;
        neighbours(t, cases[c].x, &lo, &hi);
        assert_true(hi > lo);
        for (int i = 0; i < N; i++) {
            double v = decode(t, out, (size_t)i);
            sum += v;
            ups += v == hi;
        }
        double step = hi - lo, mean = sum / N, p = ((double)cases[c].x - lo) / step;
        double bound = 3.0 * step / sqrt((double)N);
        if (fabs(mean - (double)cases[c].x) > bound)
            fail_msg("%s: mean of %d roundings of %a is %a (bound %g)", mp_dtype_name(t), N,
                     (double)cases[c].x, mean, bound);
        assert_true(fabs((double)ups / N - p) <= 3.0 / sqrt((double)N));
    }
    free(x);
    free(out);
}

static void test_reproducible_and_chunking(void **state)
{
    (void)state;
    enum { N = 300001 };
    float *x = malloc(N * sizeof *x);
    uint16_t *a = malloc(N * 2), *b = malloc(N * 2);
    test_rng r = {3};
    for (int i = 0; i < N; i++) x[i] = (float)test_rng_uniform(&r, -10, 10);
    for (int k = 0; k < 4; k++) {
        mp_dtype t = types[k];
        size_t es = mp_dtype_size(t);
        mp_convert_stochastic(a, t, x, N, 99);
        mp_convert_stochastic(b, t, x, N, 99);
        assert_memory_equal(a, b, N * es);
        /* in odd-sized pieces */
        memset(b, 0, N * 2);
        size_t done = 0, piece = 1;
        while (done < N) {
            size_t c = N - done < piece ? N - done : piece;
            mp_convert_stochastic_at((char *)b + done * es, t, x + done, c, 99, done);
            done += c;
            piece = piece * 3 + 1;
        }
        assert_memory_equal(a, b, N * es);
#ifdef _OPENMP
        int saved = omp_get_max_threads();
        omp_set_num_threads(1);
        mp_convert_stochastic(b, t, x, N, 99);
        omp_set_num_threads(saved);
        assert_memory_equal(a, b, N * es);
#endif
        /* another seed gives other bits: about half the inexact elements move */
        mp_convert_stochastic(b, t, x, N, 100);
        size_t differ = 0;
        for (size_t i = 0; i < N * es; i++) differ += ((uint8_t *)a)[i] != ((uint8_t *)b)[i];
        assert_true(differ > N / 10);
    }
    free(x);
    free(a);
    free(b);
}

static void test_specials(void **state)
{
    (void)state;
    const float x[] = {NAN, -NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 0.0f, -0.0f};
    enum { N = sizeof x / sizeof x[0] };
    uint16_t s[N], d[N];
    for (int k = 0; k < 4; k++) {
        mp_dtype t = types[k];
        mp_convert_stochastic(s, t, x, N, 5);
        mp_convert(d, t, x, MP_F32, N); /* outside the range: the ordinary cast */
        assert_memory_equal(s, d, N * mp_dtype_size(t));
        assert_true(isnan(decode(t, s, 0)) && isnan(decode(t, s, 1)));
    }
    float y[N];
    mp_convert_stochastic(y, MP_F32, x, N, 5);
    assert_memory_equal(y, x, sizeof x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_always_a_neighbour),
        cmocka_unit_test(test_unbiased),
        cmocka_unit_test(test_reproducible_and_chunking),
        cmocka_unit_test(test_specials),
    };
    return cmocka_run_group_tests_name("stochastic rounding", tests, NULL, NULL);
}
