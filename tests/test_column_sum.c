/* test_column_sum.c - mp_op_column_sum (a Dense or projection's bias
 * gradient: the column sums of dz) against its definition: each column's
 * float64 sum of the decoded values taken in row order, then added to the
 * float32 value already there (accumulate) and rounded once. The kernel
 * performs exactly those operations (bfloat16 rows four at a time, their
 * adds still in row order), so the test asks for the same bits. The float64
 * roundings of a sum in another order would mostly vanish in the final
 * float32 rounding; so each column (bfloat16 and float32) opens with
 * +-2^60 and closes with its negation, the rows between of magnitude 2^5
 * .. 2^10: added to 2^60 (a float64 ulp of 256) each is rounded, the
 * column's result is what those roundings left, and a sum in any other
 * order gives other bits (float16 cannot span float64's 53 bits: its values
 * spread over 2^-10 .. 2^10). Row counts around multiples of four, column
 * counts around the 16-column units the threads split, one thread and two. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/ops.h"

/* rows x cols values of type t as the comment at the top says */
static void *spread_values(mp_dtype t, int64_t rows, int64_t cols, float *decoded, test_rng *r)
{
    const int64_t n = rows * cols;
    float *f = malloc((size_t)n * sizeof *f);
    void *x = malloc((size_t)n * mp_dtype_size(t));
    assert_non_null(f && x);
    const bool cancel = t != MP_F16 && rows >= 3;
    for (int64_t i = 0; i < n; i++) {
        const int e = cancel ? 5 + (int)(test_rng_u32(r) % 5) : (int)(test_rng_u32(r) % 21) - 10;
        const double m = test_rng_uniform(r, 1.0, 2.0) * (test_rng_u32(r) & 1 ? -1 : 1);
        f[i] = (float)ldexp(m, e);
    }
    if (cancel)
        for (int64_t c = 0; c < cols; c++) {
            f[c] = c & 1 ? 0x1p60f : -0x1p60f;
            f[(rows - 1) * cols + c] = -f[c];
        }
    mp_convert(x, t, f, MP_F32, (size_t)n);
    mp_convert(decoded, MP_F32, x, t, (size_t)n); /* the values the kernel sees */
    free(f);
    return x;
}

static void check(mp_dtype t, int64_t rows, int64_t cols, bool accumulate, int threads, test_rng *r)
{
    float *dec = malloc((size_t)(rows * cols) * sizeof *dec);
    float *out = malloc((size_t)cols * sizeof *out), *want = malloc((size_t)cols * sizeof *want);
    assert_non_null(dec && out && want);
    void *x = spread_values(t, rows, cols, dec, r);
    for (int64_t c = 0; c < cols; c++) {
        out[c] = (float)test_rng_uniform(r, -4.0, 4.0);
        double s = 0;
        for (int64_t i = 0; i < rows; i++) s += (double)dec[i * cols + c];
        want[c] = (float)((accumulate ? (double)out[c] : 0.0) + s);
    }
    const int saved = mp_num_threads();
    mp_set_num_threads(threads);
    mp_op_column_sum(x, t, rows, cols, out, accumulate);
    mp_set_num_threads(saved);
    for (int64_t c = 0; c < cols; c++)
        if (memcmp(&out[c], &want[c], sizeof(float)))
            fail_msg("%s %lld x %lld%s, %d threads: column %lld is %.9g, want %.9g",
                     mp_dtype_name(t), (long long)rows, (long long)cols,
                     accumulate ? " accumulated" : "", threads, (long long)c, (double)out[c],
                     (double)want[c]);
    free(x);
    free(dec);
    free(out);
    free(want);
}

static void test_row_order(void **state)
{
    (void)state;
    test_rng r = {77};
    const mp_dtype types[3] = {MP_BF16, MP_F16, MP_F32};
    const int64_t rows[] = {1, 3, 4, 5, 7, 64, 301, 1026};
    const int64_t cols[] = {1, 15, 16, 17, 256, 300};
    for (int ti = 0; ti < 3; ti++)
        for (size_t ri = 0; ri < sizeof rows / sizeof *rows; ri++)
            for (size_t ci = 0; ci < sizeof cols / sizeof *cols; ci++)
                for (int th = 1; th <= 2; th++)
                    check(types[ti], rows[ri], cols[ci], (ri + ci) & 1, th, &r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
