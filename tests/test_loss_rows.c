/* test_loss_rows.c - the categorical cross-entropies over many rows, which
 * mp_loss_compute runs in parallel (a row's loss is one term of the total,
 * the terms added in row order). On a language model's shape (1024 rows of
 * 300 logits, some of them extreme): the loss within one float32 rounding
 * of a float64 reference that sums the same float64 terms in the same
 * order, each gradient element within one float32 rounding of the
 * reference's (softmax minus the one-hot target, over the row count 2^10:
 * the float64 value rounded once, the scale exact; 2^-24 relative, or, for
 * results in the subnormal range, two roundings of 2^-150 each), and loss
 * and gradients equal bit for bit with one thread and with two; sparse
 * labels and dense targets, from logits and from probabilities. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum { ROWS = 1024, COLS = 300 };

static void compute(const mp_loss_spec *s, const mp_tensor *p, int threads, float *loss,
                    float *grad)
{
    mp_tensor g;
    mp_tensor_wrap(&g, MP_F32, 2, (int64_t[]){ROWS, COLS}, grad);
    const int saved = mp_num_threads();
    mp_set_num_threads(threads);
    assert_int_equal(mp_loss_compute(s, p, 1.0f, loss, &g), MP_OK);
    mp_set_num_threads(saved);
}

static void test_many_rows(void **state)
{
    (void)state;
    float *z = malloc(ROWS * COLS * 4), *t = malloc(ROWS * COLS * 4), *q = malloc(ROWS * COLS * 4);
    int32_t *y = malloc(ROWS * 4);
    test_fill(z, ROWS * COLS, 51, -8, 8);
    for (int r = 0; r < ROWS; r += 97)
        z[r * COLS + r % COLS] = 80.0f; /* exp overflows in float32 */
    for (int r = 0; r < ROWS; r++) {
        y[r] = (int32_t)((r * 37) % COLS);
        double s = 0;
        for (int c = 0; c < COLS; c++) s += exp((double)z[r * COLS + c]);
        for (int c = 0; c < COLS; c++) {
            t[r * COLS + c] = c == y[r] ? 1.0f : 0.0f;
            q[r * COLS + c] = (float)(exp((double)z[r * COLS + c]) / s);
        }
    }
    mp_tensor pz, pq, tt;
    mp_tensor_wrap(&pz, MP_F32, 2, (int64_t[]){ROWS, COLS}, z);
    mp_tensor_wrap(&pq, MP_F32, 2, (int64_t[]){ROWS, COLS}, q);
    mp_tensor_wrap(&tt, MP_F32, 2, (int64_t[]){ROWS, COLS}, t);
    const mp_loss_spec specs[] = {
        {.kind = MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, .from_logits = true, .labels = y},
        {.kind = MP_LOSS_CATEGORICAL_CROSSENTROPY, .from_logits = true, .target = &tt},
        {.kind = MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, .from_logits = false, .labels = y},
    };
    float *g1 = malloc(ROWS * COLS * 4), *g2 = malloc(ROWS * COLS * 4);
    for (int si = 0; si < 3; si++) {
        const mp_tensor *p = specs[si].from_logits ? &pz : &pq;
        float l1, l2;
        compute(&specs[si], p, 1, &l1, g1);
        compute(&specs[si], p, 2, &l2, g2);
        assert_int_equal(f32_bits(l1), f32_bits(l2));
        assert_memory_equal(g1, g2, ROWS * COLS * 4);
        if (!specs[si].from_logits) continue; /* probabilities: clipped, renormalised (Keras) */
        double want = 0;
        for (int r = 0; r < ROWS; r++) {
            const float *zr = z + r * COLS;
            double mx = -INFINITY, se = 0;
            for (int c = 0; c < COLS; c++) mx = fmax(mx, zr[c]);
            for (int c = 0; c < COLS; c++) se += exp(zr[c] - mx);
            const double lse = log(se) + mx;
            want += lse - zr[y[r]];
            for (int c = 0; c < COLS; c++) {
                const double gw = (exp(zr[c] - lse) - (c == y[r])) / ROWS;
                const double got = g1[r * COLS + c];
                if (fabs(got - gw) > 0x1p-24 * fabs(gw) + 0x1p-149)
                    fail_msg("spec %d: grad[%d][%d] %.9g, float64 %.9g", si, r, c, got, gw);
            }
        }
        want /= ROWS;
        if (fabs(l1 - want) > 0x1p-24 * want)
            fail_msg("spec %d: loss %.9g, float64 %.12g", si, (double)l1, want);
    }
    free(z);
    free(t);
    free(q);
    free(y);
    free(g1);
    free(g2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_many_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
