/* test_batch_norm.c - BatchNormalization against float64 references written
 * here: the training forward and the batch statistics, the moving-statistics
 * recurrence, inference with the moving statistics, gradients (analytic
 * float64 formulas, themselves checked by central differences of a float64
 * loss) after a training and after an inference forward, float32 statistics
 * and state under the low-precision policies, exact save/restore of the
 * state through checkpoints and weight files, the config round trip and its
 * refusals, the summary's non-trainable count, results independent of the
 * number of threads, and out-of-memory failures that change nothing. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "common.h"
#include "core/internal.h" /* mp_scratch_fail_above */

#define U32 0x1p-24 /* float32 unit roundoff */

/* ------------------------------------------------------------ helpers */

/* Channel c of x [rows, ch] is offset_c + spread_c * U(-1, 1) with offsets
 * far from zero (up to ~60 and one at 1000), so the variance has to survive
 * the cancellation of a large mean. */
static float *make_data(int64_t rows, int64_t ch, uint64_t seed)
{
    float *x = malloc((size_t)(rows * ch) * sizeof *x);
    test_rng r = {seed};
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < ch; c++) {
            double off = c == 1 ? 1000.0 : 30.0 * (double)(c % 5) - 60.0 + 0.5 * (double)c;
            double spread = 0.25 + 0.4 * (double)(c % 4);
            x[i * ch + c] = (float)(off + spread * test_rng_uniform(&r, -1, 1));
        }
    return x;
}

static void fill(float *p, int64_t n, test_rng *r, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++) p[i] = (float)test_rng_uniform(r, lo, hi);
}

static mp_model_param *param(mp_model *m, const char *name)
{
    for (int i = 0; i < mp_model_num_params(m); i++)
        if (!strcmp(mp_model_get_param(m, i)->name, name)) return mp_model_get_param(m, i);
    return NULL;
}

static double value(const mp_tensor *t, int64_t i)
{
    float v;
    mp_convert(&v, MP_F32, (const char *)t->data + (size_t)i * mp_dtype_size(t->dtype), t->dtype,
               1);
    return v;
}

/* Float64 mean and biased variance per channel (two passes). */
static void ref_moments(const float *x, int64_t rows, int64_t ch, double *mean, double *var)
{
    for (int64_t c = 0; c < ch; c++) {
        double s = 0, s2 = 0;
        for (int64_t i = 0; i < rows; i++) s += x[i * ch + c];
        mean[c] = s / (double)rows;
        for (int64_t i = 0; i < rows; i++) {
            double d = x[i * ch + c] - mean[c];
            s2 += d * d;
        }
        var[c] = s2 / (double)rows;
    }
}

/* Forward tolerance. Per element the layer computes, in float32,
 *   m = fl(mu), r = fl(1/sqrt(var + eps)) (both from float64 sums whose own
 *   error is ~rows * 2^-53 relative: negligible), a = fl(gamma * r),
 *   d = fl(x - m), y = fl(fl(d * a) + beta), then rounds y to the output
 *   dtype (unit roundoff uo).
 * To first order in u = 2^-24: m carries u|mu|, d adds u|x - mu|, a 2u
 * relative (r, then the product), d * a u, the sum u|y|:
 *   |y~ - y| <= u (|y| + |gamma| rho (4 |x - mu| + |mu|)) + uo |y|.
 * We allow twice the float32 part (second-order terms and slack). */
static double fwd_tol(double y, double x, double mu, double gamma, double rho, double uo)
{
    return 2 * U32 * (fabs(y) + fabs(gamma) * rho * (4 * fabs(x - mu) + fabs(mu))) + uo * fabs(y) +
           1e-30;
}

/* Input(shape) -> [Activation(linear) when pre] -> BatchNormalization
 * ("bn"); the linear layer makes the normalization's input a layer output,
 * so its input gradient is observable at *pre_node. */
static mp_model *bn_model(int ndim, const int64_t *shape, const mp_batch_norm_options *bo,
                          int64_t max_batch, bool pre, mp_node *pre_node)
{
    mp_model *m = mp_model_new(3);
    mp_node x = mp_input(m, ndim, shape, NULL);
    if (pre) x = mp_activation_layer(m, x, MP_ACT_NONE, NULL);
    if (pre_node) *pre_node = x;
    mp_node y = mp_batch_norm(m, x, bo, &(mp_layer_options){.name = "bn"});
    assert_int_equal(mp_model_build(m, y, max_batch), MP_OK);
    return m;
}

/* gamma, beta and the moving statistics away from their initial values */
static void randomize(mp_model *m, uint64_t seed)
{
    test_rng r = {seed};
    mp_model_param *p;
    if ((p = param(m, "bn.gamma"))) fill(p->master, p->n, &r, -2, 2);
    if ((p = param(m, "bn.beta"))) fill(p->master, p->n, &r, -1, 1);
    fill(param(m, "bn.moving_mean")->master, param(m, "bn.moving_mean")->n, &r, -3, 3);
    fill(param(m, "bn.moving_variance")->master, param(m, "bn.moving_variance")->n, &r, 0.2, 4);
    mp_model_mark_masters_changed(m);
}

static double gamma_of(mp_model *m, int64_t c)
{
    mp_model_param *g = param(m, "bn.gamma");
    return g ? g->master[c] : 1.0;
}
static double beta_of(mp_model *m, int64_t c)
{
    mp_model_param *b = param(m, "bn.beta");
    return b ? b->master[c] : 0.0;
}

/* ------------------------------------------- (1) training forward, f64 */

static void forward_case(int ndim, const int64_t *shape, int64_t batch)
{
    mp_batch_norm_options bo = mp_batch_norm_options_default();
    bo.momentum = 0.0f; /* the moving statistics become the batch's, as float32 */
    mp_model *m = bn_model(ndim, shape, &bo, batch, false, NULL);
    randomize(m, 7);
    int64_t ch = shape[ndim - 1], n = batch;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    int64_t rows = n / ch, s[MP_MAX_DIMS] = {batch};
    memcpy(s + 1, shape, (size_t)ndim * sizeof *shape);
    float *x = make_data(rows, ch, 11 + (uint64_t)ndim);
    mp_tensor in;
    mp_tensor_wrap(&in, MP_F32, ndim + 1, s, x);
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(m, &in, true, &y), MP_OK);
    assert_int_equal(y->dtype, MP_F32);
    double *mu = malloc((size_t)ch * sizeof *mu), *var = malloc((size_t)ch * sizeof *var);
    ref_moments(x, rows, ch, mu, var);
    const double eps = (double)bo.epsilon;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < ch; c++) {
            double rho = 1 / sqrt(var[c] + eps), g = gamma_of(m, c);
            double want = g * (x[i * ch + c] - mu[c]) * rho + beta_of(m, c);
            double got = value(y, i * ch + c);
            double tol = fwd_tol(want, x[i * ch + c], mu[c], g, rho, 0);
            if (!(fabs(got - want) <= tol))
                fail_msg("y[%lld][%lld] = %.9g, float64 %.9g (tolerance %.3g)", (long long)i,
                         (long long)c, got, want, tol);
        }
    /* with momentum 0 the state is the batch statistics rounded once to
     * float32 (u relative). The layer's float64 sums of the shifted data
     * (shift: the first sample) add ~rows 2^-53 relative error times
     * (mu - shift)^2 / var, a few units here: far below u. A variance
     * divided by rows - 1 would be off by 1 / (rows - 1). */
    const float *mm = param(m, "bn.moving_mean")->master;
    const float *mv = param(m, "bn.moving_variance")->master;
    for (int64_t c = 0; c < ch; c++) {
        if (!(fabs(mm[c] - mu[c]) <= 2 * U32 * fabs(mu[c])))
            fail_msg("batch mean[%lld] = %.9g, float64 %.9g", (long long)c, mm[c], mu[c]);
        if (!(fabs(mv[c] - var[c]) <= 3 * U32 * var[c]))
            fail_msg("batch variance[%lld] = %.9g, float64 %.9g", (long long)c, mv[c], var[c]);
    }
    free(mu);
    free(var);
    free(x);
    mp_model_free(m);
}

static void test_forward_training(void **state)
{
    (void)state;
    forward_case(3, (int64_t[]){3, 4, 6}, 5); /* [batch, 3, 4, C] */
    forward_case(1, (int64_t[]){7}, 9);       /* [batch, C] */
    forward_case(1, (int64_t[]){3}, 1);       /* one sample: variance 0 */
}

/* A constant channel: variance 0, mean exactly the value, so x - mean is 0
 * and the output is beta exactly (no cancellation residue). */
static void test_constant_channel(void **state)
{
    (void)state;
    mp_model *m = bn_model(1, (int64_t[]){2}, NULL, 8, false, NULL);
    randomize(m, 3);
    float x[8][2];
    for (int i = 0; i < 8; i++) {
        x[i][0] = 3.7f;
        x[i][1] = (float)i;
    }
    mp_tensor in;
    mp_tensor_wrap(&in, MP_F32, 2, (int64_t[]){8, 2}, x);
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(m, &in, true, &y), MP_OK);
    for (int i = 0; i < 8; i++) assert_true(value(y, i * 2) == (float)beta_of(m, 0));
    mp_model_free(m);
}

/* --------------------------------------- (2) moving statistics, 3 steps */

/* Reference: moving = moving * momentum + batch * (1 - momentum) in float64
 * from zeros/ones, momentum the float32 the layer holds. The layer rounds
 * the state to float32 once a step (u relative); earlier errors are damped
 * by momentum < 1, so after k steps the error is at most k u max|moving|
 * plus the negligible float64 error of the batch statistics. */
static void test_moving_statistics(void **state)
{
    (void)state;
    const int64_t shape[] = {3, 4, 5}, ch = 5, batch = 6, rows = batch * 12;
    mp_batch_norm_options bo = mp_batch_norm_options_default();
    bo.momentum = 0.9f;
    mp_model *m = bn_model(3, shape, &bo, batch, false, NULL);
    const float *mm = param(m, "bn.moving_mean")->master;
    const float *mv = param(m, "bn.moving_variance")->master;
    for (int64_t c = 0; c < ch; c++) assert_true(mm[c] == 0.0f && mv[c] == 1.0f);
    double rm[5], rv[5], big_m[5] = {0}, big_v[5] = {1, 1, 1, 1, 1}, mu[5], var[5];
    for (int c = 0; c < ch; c++) rm[c] = 0, rv[c] = 1;
    const double mom = (double)bo.momentum;
    for (int step = 1; step <= 3; step++) {
        float *x = make_data(rows, ch, 100 + (uint64_t)step);
        mp_tensor in;
        mp_tensor_wrap(&in, MP_F32, 4, (int64_t[]){batch, 3, 4, 5}, x);
        assert_int_equal(mp_model_forward(m, &in, true, NULL), MP_OK);
        ref_moments(x, rows, ch, mu, var);
        for (int c = 0; c < ch; c++) {
            rm[c] = rm[c] * mom + mu[c] * (1 - mom);
            rv[c] = rv[c] * mom + var[c] * (1 - mom);
            big_m[c] = fmax(big_m[c], fabs(rm[c]));
            big_v[c] = fmax(big_v[c], rv[c]);
            if (!(fabs(mm[c] - rm[c]) <= (step + 1) * U32 * big_m[c]))
                fail_msg("step %d: moving_mean[%d] %.9g, float64 %.9g", step, c, mm[c], rm[c]);
            if (!(fabs(mv[c] - rv[c]) <= (step + 1) * U32 * big_v[c]))
                fail_msg("step %d: moving_variance[%d] %.9g, float64 %.9g", step, c, mv[c], rv[c]);
        }
        free(x);
    }
    mp_model_free(m);
}

/* ------------------------------------- (3) inference: moving statistics */

static void test_inference_uses_moving_statistics(void **state)
{
    (void)state;
    const int64_t shape[] = {3, 4, 4}, ch = 4, batch = 3, rows = batch * 12;
    mp_model *m = bn_model(3, shape, NULL, batch, false, NULL);
    randomize(m, 21);
    float *mm = param(m, "bn.moving_mean")->master, *mv = param(m, "bn.moving_variance")->master;
    float mm0[4], mv0[4];
    memcpy(mm0, mm, sizeof mm0);
    memcpy(mv0, mv, sizeof mv0);
    float *x = make_data(rows, ch, 5);
    mp_tensor in;
    mp_tensor_wrap(&in, MP_F32, 4, (int64_t[]){batch, 3, 4, 4}, x);
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(m, &in, false, &y), MP_OK);
    const double eps = 1e-3f;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < ch; c++) {
            double rho = 1 / sqrt((double)mv[c] + eps), g = gamma_of(m, c);
            double want = g * (x[i * ch + c] - mm[c]) * rho + beta_of(m, c);
            double got = value(y, i * ch + c);
            if (!(fabs(got - want) <= fwd_tol(want, x[i * ch + c], mm[c], g, rho, 0)))
                fail_msg("inference y[%lld][%lld] = %.9g, float64 %.9g", (long long)i, (long long)c,
                         got, want);
        }
    /* inference leaves the state alone */
    assert_memory_equal(mm, mm0, sizeof mm0);
    assert_memory_equal(mv, mv0, sizeof mv0);
    free(x);
    mp_model_free(m);
}

/* ----------------------------------------------------- (4) gradients */

/* L = sum r * y of the float64 layer: batch statistics when train, else
 * the constants mu/var given. */
static double ref_loss(const double *x, const double *g, const double *b, const double *r,
                       int64_t rows, int64_t ch, bool train, const float *mm, const float *mv,
                       double eps)
{
    double loss = 0;
    for (int64_t c = 0; c < ch; c++) {
        double mu = mm[c], var = mv[c];
        if (train) {
            double s = 0, s2 = 0;
            for (int64_t i = 0; i < rows; i++) s += x[i * ch + c];
            mu = s / (double)rows;
            for (int64_t i = 0; i < rows; i++) s2 += (x[i * ch + c] - mu) * (x[i * ch + c] - mu);
            var = s2 / (double)rows;
        }
        double rho = 1 / sqrt(var + eps);
        for (int64_t i = 0; i < rows; i++)
            loss += r[i * ch + c] * (g[c] * (x[i * ch + c] - mu) * rho + b[c]);
    }
    return loss;
}

/* Central difference of ref_loss in coordinate v (h = 1e-6 max(1, |v|)):
 * truncation h^2 |L'''| / 6 ~ 1e-12 and rounding ~1e-16 |L| / h ~ 1e-9 for
 * these sizes; the analytic reference must agree to 1e-6 (1 + |d|). */
static double fd(double *v, double *x, double *g, double *b, const double *r, int64_t rows,
                 int64_t ch, bool train, const float *mm, const float *mv, double eps)
{
    double v0 = *v, h = 1e-6 * fmax(1.0, fabs(v0));
    *v = v0 + h;
    double lp = ref_loss(x, g, b, r, rows, ch, train, mm, mv, eps);
    *v = v0 - h;
    double lm = ref_loss(x, g, b, r, rows, ch, train, mm, mv, eps);
    *v = v0;
    return (lp - lm) / (2 * h);
}

static void check(const char *what, int64_t i, double got, double want, double tol)
{
    if (!(fabs(got - want) <= tol))
        fail_msg("%s[%lld] = %.9g, reference %.9g (tolerance %.3g)", what, (long long)i, got, want,
                 tol);
}

/* Layer gradients against the analytic float64 ones, with
 *   xhat = (x - mu) rho, rho = 1 / sqrt(var + eps),
 *   dbeta = sum dy, dgamma = sum dy xhat,
 *   dx = gamma rho (dy - mean(dy) - xhat mean(dy xhat))   (batch statistics)
 *   dx = gamma rho dy                                       (constants).
 * Tolerances, to first order in u = 2^-24. The layer forms xhat in float32
 * from the mean and rho it kept: the mean rounded once (a shift common to
 * the channel, <= u |mu|) and rho rounded once, then x - m and the product
 * rounded: xhat~ = xhat - rho dmu + e, |dmu| <= u |mu|, |e| <= 3u |xhat|.
 * Its float64 sums are then rounded once. So, with m1 = mean(dy) and
 * B = mean(|dy| |xhat|):
 *   dbeta:  sum dy of exact float32 values: u |dbeta| (+ n 2^-53): 2u sum|dy|
 *   dgamma: rho |dmu| |sum dy| + 3u sum |dy| |xhat| + u |dgamma|
 *           <= u (rho |mu| |sum dy| + 4 rows B); we allow twice that;
 *   dx:     a = gamma rho to 2u relative (2u |dx|); in the bracket
 *           dy - m1 - xhat m2 the means carry u |m1| and (through xhat~)
 *           u (rho |mu| |m1| + 3B) + u |m2|, xhat_j carries u (rho |mu| +
 *           3 |xhat_j|), |m2| <= B, and three operations round once each:
 *           <= 4u (|dy| + |m1| + (1 + |xhat_j|) (rho |mu| (B + |m1|) + B)),
 *           times |gamma| rho; we allow twice that plus 8u |dx|.
 * After an inference forward the means are absent (m1 = m2 = 0 in the
 * layer) and the bound only gets looser. */
static void grad_case(bool scale, bool center, bool train)
{
    const int64_t shape[] = {3, 2, 5}, ch = 5, batch = 4, rows = batch * 6, n = rows * ch;
    mp_batch_norm_options bo = mp_batch_norm_options_default();
    bo.scale = scale;
    bo.center = center;
    mp_node pre;
    mp_model *m = bn_model(3, shape, &bo, batch, true, &pre);
    assert_int_equal(mp_model_num_params(m), 2 + scale + center);
    randomize(m, 31 + (uint64_t)train);
    float mm[5], mv[5];
    memcpy(mm, param(m, "bn.moving_mean")->master, sizeof mm);
    memcpy(mv, param(m, "bn.moving_variance")->master, sizeof mv);
    test_rng rng = {77};
    float *x = make_data(rows, ch, 9), *dy = malloc((size_t)n * sizeof *dy);
    fill(dy, n, &rng, -1, 1);
    mp_tensor in, dyt;
    mp_tensor_wrap(&in, MP_F32, 4, (int64_t[]){batch, 3, 2, 5}, x);
    mp_tensor_wrap(&dyt, MP_F32, 4, (int64_t[]){batch, 3, 2, 5}, dy);
    mp_model_param *pg = param(m, "bn.gamma"), *pb = param(m, "bn.beta");
    for (int64_t c = 0; c < ch; c++) { /* backward(accumulate = false) overwrites */
        if (pg) pg->grad[c] = 1e6f;
        if (pb) pb->grad[c] = 1e6f;
    }
    assert_int_equal(mp_model_forward(m, &in, train, NULL), MP_OK);
    assert_int_equal(mp_model_backward(m, &dyt, false), MP_OK);
    const mp_tensor *dx = mp_model_node_grad(m, pre);
    assert_non_null(dx);
    assert_null(param(m, "bn.moving_mean")->grad);
    assert_null(param(m, "bn.moving_variance")->grad);
    /* float64 reference */
    double *xd = malloc((size_t)n * sizeof *xd), *rd = malloc((size_t)n * sizeof *rd);
    double g[5], b[5], mu[5], var[5];
    for (int64_t i = 0; i < n; i++) xd[i] = x[i], rd[i] = dy[i];
    for (int64_t c = 0; c < ch; c++) g[c] = gamma_of(m, c), b[c] = beta_of(m, c);
    if (train) {
        ref_moments(x, rows, ch, mu, var);
    } else {
        for (int64_t c = 0; c < ch; c++) mu[c] = mm[c], var[c] = mv[c];
    }
    const double eps = (double)bo.epsilon;
    for (int64_t c = 0; c < ch; c++) {
        double rho = 1 / sqrt(var[c] + eps), sdy = 0, sdyx = 0, sabs = 0, B = 0;
        for (int64_t i = 0; i < rows; i++) {
            double xh = (x[i * ch + c] - mu[c]) * rho, d = dy[i * ch + c];
            sdy += d;
            sdyx += d * xh;
            sabs += fabs(d);
            B += fabs(d) * fabs(xh);
        }
        B /= (double)rows;
        const double rmu = rho * fabs(mu[c]), m1 = fabs(sdy) / (double)rows;
        double want_g = sdyx, want_b = sdy;
        /* the analytic reference against central differences of the loss */
        check("fd dgamma", c, want_g, fd(&g[c], xd, g, b, rd, rows, ch, train, mm, mv, eps),
              1e-6 * (1 + fabs(want_g)));
        check("fd dbeta", c, want_b, fd(&b[c], xd, g, b, rd, rows, ch, train, mm, mv, eps),
              1e-6 * (1 + fabs(want_b)));
        if (pg)
            check("dgamma", c, pg->grad[c], want_g,
                  2 * U32 * (rmu * fabs(sdy) + 4 * (double)rows * B) + 1e-30);
        if (pb) check("dbeta", c, pb->grad[c], want_b, 2 * U32 * sabs + 1e-30);
        for (int64_t i = 0; i < rows; i++) {
            int64_t k = i * ch + c;
            double xh = (x[k] - mu[c]) * rho;
            double want = g[c] * rho *
                          (train ? dy[k] - sdy / (double)rows - xh * sdyx / (double)rows : dy[k]);
            check("fd dx", k, want, fd(&xd[k], xd, g, b, rd, rows, ch, train, mm, mv, eps),
                  1e-6 * (1 + fabs(want)));
            double tol = 8 * U32 * fabs(g[c]) * rho *
                             (fabs(dy[k]) + m1 + (1 + fabs(xh)) * (rmu * (B + m1) + B)) +
                         8 * U32 * fabs(want) + 1e-30;
            check("dx", k, value(dx, k), want, tol);
        }
    }
    /* accumulate = true adds the same sums again (one rounding) */
    float g1[5] = {0}, b1[5] = {0};
    if (pg) memcpy(g1, pg->grad, sizeof g1);
    if (pb) memcpy(b1, pb->grad, sizeof b1);
    assert_int_equal(mp_model_backward(m, &dyt, true), MP_OK);
    for (int64_t c = 0; c < ch; c++) {
        if (pg) check("accumulated dgamma", c, pg->grad[c], 2.0 * g1[c], 2 * U32 * fabs(2 * g1[c]));
        if (pb) check("accumulated dbeta", c, pb->grad[c], 2.0 * b1[c], 2 * U32 * fabs(2 * b1[c]));
    }
    free(xd);
    free(rd);
    free(x);
    free(dy);
    mp_model_free(m);
}

static void test_gradients(void **state)
{
    (void)state;
    for (int train = 0; train <= 1; train++) {
        grad_case(true, true, train);
        grad_case(false, false, train);
        grad_case(true, false, train);
        grad_case(false, true, train);
    }
}

/* The input is user data: no input gradient, but gamma and beta still get
 * theirs (the same as through a linear layer). */
static void test_gradients_data_input(void **state)
{
    (void)state;
    const int64_t batch = 6;
    float *x = make_data(batch, 4, 8), dy[24];
    test_rng r = {4};
    fill(dy, 24, &r, -1, 1);
    mp_tensor in, dyt;
    mp_tensor_wrap(&in, MP_F32, 2, (int64_t[]){batch, 4}, x);
    mp_tensor_wrap(&dyt, MP_F32, 2, (int64_t[]){batch, 4}, dy);
    float grads[2][2][4];
    for (int pre = 0; pre <= 1; pre++) {
        mp_model *m = bn_model(1, (int64_t[]){4}, NULL, batch, pre, NULL);
        randomize(m, 5);
        assert_int_equal(mp_model_forward(m, &in, true, NULL), MP_OK);
        assert_int_equal(mp_model_backward(m, &dyt, false), MP_OK);
        memcpy(grads[pre][0], param(m, "bn.gamma")->grad, sizeof grads[pre][0]);
        memcpy(grads[pre][1], param(m, "bn.beta")->grad, sizeof grads[pre][1]);
        mp_model_free(m);
    }
    assert_memory_equal(grads[0], grads[1], sizeof grads[0]);
    free(x);
}

/* ------------------------------------------ (5) low-precision policies */

static void test_policies_keep_float32_state(void **state)
{
    (void)state;
    const char *policies[] = {"mixed_bfloat16", "mixed_float16", "bfloat16", "float16"};
    const int64_t shape[] = {3, 4, 6}, ch = 6, batch = 4, rows = batch * 12;
    for (int pi = 0; pi < 4; pi++) {
        mp_model *m = mp_model_new_with_policy(5, policies[pi]);
        mp_batch_norm_options bo = mp_batch_norm_options_default();
        bo.momentum = 0.0f;
        mp_node x = mp_input(m, 3, shape, NULL);
        mp_node h = mp_batch_norm(m, x, &bo, &(mp_layer_options){.name = "bn"});
        mp_node y = mp_dense(m, h, 3, MP_ACT_NONE, NULL);
        assert_int_equal(mp_model_build(m, y, batch), MP_OK);
        mp_policy pol;
        assert_int_equal(mp_policy_from_name(policies[pi], &pol), MP_OK);
        const mp_dtype ct = pol.compute;
        for (int j = 0; j < 4; j++) {
            static const char *const names[] = {"bn.gamma", "bn.beta", "bn.moving_mean",
                                                "bn.moving_variance"};
            mp_model_param *p = mp_model_get_param(m, j); /* Keras's order */
            assert_string_equal(p->name, names[j]);
            assert_int_equal(p->weight_dtype, MP_F32);
            assert_non_null(p->master);
            assert_ptr_equal(p->weight, p->master);
            assert_int_equal(p->trainable, j < 2);
            if (j < 2)
                assert_non_null(p->grad);
            else
                assert_null(p->grad);
        }
        assert_int_equal(param(m, "bn.moving_mean")->role, MP_ROLE_MOVING_MEAN);
        assert_int_equal(param(m, "bn.moving_variance")->role, MP_ROLE_MOVING_VARIANCE);
        mp_layer_info li;
        assert_int_equal(mp_model_layer_info(m, h, batch, &li), MP_OK);
        assert_int_equal(li.output_dtype, ct);
        assert_int_equal(li.params, 2 * ch);
        assert_int_equal(li.state, 2 * ch);
        randomize(m, 6);
        float *xf = make_data(rows, ch, 13);
        mp_tensor in;
        mp_tensor_wrap(&in, MP_F32, 4, (int64_t[]){batch, 3, 4, 6}, xf);
        const mp_tensor *out;
        assert_int_equal(mp_model_forward(m, &in, true, &out), MP_OK);
        const mp_tensor *bn_out = mp_model_node_output(m, h);
        assert_int_equal(bn_out->dtype, ct);
        /* the arena holds exactly what the plan says */
        size_t planned = 0;
        for (int i = 0; i < mp_model_num_layers(m); i++) {
            assert_int_equal(mp_model_layer_info(m, i, batch, &li), MP_OK);
            planned += li.saved_bytes;
        }
        assert_int_equal(planned, mp_model_activation_bytes(m));
        /* the layer sees the input rounded to the compute dtype; its
         * statistics are float32 (3u, far below the compute dtype's 2^-8 or
         * 2^-11), and so is the state that holds them (momentum 0). The
         * output is the float32 result rounded once more, to the compute
         * dtype: fwd_tol adds that dtype's unit roundoff times |y|. */
        float *xr = malloc((size_t)(rows * ch) * sizeof *xr);
        void *tmp = malloc((size_t)(rows * ch) * 4);
        mp_convert(tmp, ct, xf, MP_F32, (size_t)(rows * ch));
        mp_convert(xr, MP_F32, tmp, ct, (size_t)(rows * ch));
        double mu[6], var[6];
        ref_moments(xr, rows, ch, mu, var);
        const float *mm = param(m, "bn.moving_mean")->master;
        const float *mv = param(m, "bn.moving_variance")->master;
        const double uo = ct == MP_BF16 ? 0x1p-8 : 0x1p-11;
        for (int64_t c = 0; c < ch; c++) {
            check("moving_mean", c, mm[c], mu[c], 2 * U32 * fabs(mu[c]));
            check("moving_variance", c, mv[c], var[c], 3 * U32 * var[c]);
            double rho = 1 / sqrt(var[c] + (double)bo.epsilon), g = gamma_of(m, c);
            for (int64_t i = 0; i < rows; i++) {
                int64_t k = i * ch + c;
                double want = g * (xr[k] - mu[c]) * rho + beta_of(m, c);
                check("y", k, value(bn_out, k), want, fwd_tol(want, xr[k], mu[c], g, rho, uo));
            }
        }
        /* backward: float32 gradients for gamma/beta, none for the state */
        float dyv[4 * 12 * 3];
        test_rng r = {1};
        fill(dyv, batch * 36, &r, -1, 1);
        mp_tensor dy;
        mp_tensor_wrap(&dy, MP_F32, 4, (int64_t[]){batch, 3, 4, 3}, dyv);
        assert_int_equal(mp_model_backward(m, &dy, false), MP_OK);
        for (int64_t c = 0; c < ch; c++)
            assert_true(isfinite(param(m, "bn.gamma")->grad[c]) &&
                        isfinite(param(m, "bn.beta")->grad[c]) &&
                        param(m, "bn.beta")->grad[c] != 0.0f);
        assert_null(param(m, "bn.moving_mean")->grad);
        free(tmp);
        free(xr);
        free(xf);
        mp_model_free(m);
    }
}

/* ------------------------------------------ (6) checkpoints and weights */

static mp_model *mlp(const char *policy, uint64_t seed, bool compile)
{
    mp_set_global_policy(policy);
    mp_model *m = mp_model_new(seed);
    mp_batch_norm_options bo = mp_batch_norm_options_default();
    bo.momentum = 0.8f; /* moves visibly in a few steps */
    mp_node x = mp_input(m, 1, (int64_t[]){10}, NULL);
    x = mp_dense(m, x, 16, MP_ACT_RELU, NULL);
    x = mp_batch_norm(m, x, &bo, NULL);
    x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    mp_set_global_policy("float32");
    assert_int_equal(mp_model_build(m, x, 16), MP_OK);
    if (compile) {
        mp_compile_options co = mp_compile_options_default();
        co.optimizer.learning_rate = 1e-2f;
        assert_int_equal(mp_model_compile(m, &co), MP_OK);
    }
    return m;
}

static void train(mp_model *m, int steps, uint64_t seed)
{
    for (int s = 0; s < steps; s++) {
        float x[16 * 10];
        int32_t y[16];
        test_rng r = {seed + (uint64_t)s};
        for (int i = 0; i < 16; i++) {
            y[i] = (int32_t)(test_rng_u32(&r) % 3);
            for (int j = 0; j < 10; j++)
                x[i * 10 + j] = (float)((j == y[i] ? 2.0 : 0.0) + test_rng_uniform(&r, -1, 1));
        }
        mp_tensor in;
        mp_tensor_wrap(&in, MP_F32, 2, (int64_t[]){16, 10}, x);
        mp_step_result res;
        assert_int_equal(mp_model_train_step(m, &in, y, NULL, &res), MP_OK);
    }
}

static void assert_same_params(mp_model *a, mp_model *b, const char *what)
{
    assert_int_equal(mp_model_num_params(a), mp_model_num_params(b));
    for (int i = 0; i < mp_model_num_params(a); i++) {
        mp_model_param *p = mp_model_get_param(a, i), *q = mp_model_get_param(b, i);
        assert_string_equal(p->name, q->name);
        size_t bytes = (size_t)p->n * (p->master ? 4 : mp_dtype_size(p->weight_dtype));
        if (memcmp(p->master ? (void *)p->master : p->weight,
                   q->master ? (void *)q->master : q->weight, bytes))
            fail_msg("%s: %s differs", what, p->name);
    }
}

static void test_checkpoint_restores_state(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_bfloat16", "mixed_float16"};
    char dir[64], path[128], wpath[128];
    assert_int_equal(test_scratch_dir(dir, sizeof dir, "mp_bn"), 0);
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    snprintf(wpath, sizeof wpath, "%s/weights.safetensors", dir);
    for (int pi = 0; pi < 3; pi++) {
        mp_model *a = mlp(policies[pi], 17, true);
        train(a, 3, 1000);
        mp_model_param *mm = param(a, "batch_normalization.moving_mean");
        mp_model_param *mv = param(a, "batch_normalization.moving_variance");
        assert_non_null(mm);
        assert_false(mm->trainable || mv->trainable);
        int moved = 0;
        for (int64_t c = 0; c < mm->n; c++) moved += mm->master[c] != 0.0f && mv->master[c] != 1.0f;
        assert_true(moved > 0);
        float saved_mm[16];
        memcpy(saved_mm, mm->master, sizeof saved_mm);
        assert_int_equal(mp_model_save_checkpoint(a, path, NULL), MP_OK);
        mp_model *b = NULL;
        assert_int_equal(mp_model_from_checkpoint(path, 16, &b, NULL), MP_OK);
        assert_same_params(a, b, "after loading the checkpoint");
        train(a, 3, 2000);
        train(b, 3, 2000);
        assert_same_params(a, b, "3 steps after the checkpoint");
        assert_memory_not_equal(saved_mm, mm->master, sizeof saved_mm);
        /* loading into an existing model (another seed: other weights) */
        mp_model *c = mlp(policies[pi], 99, true);
        assert_int_equal(mp_model_load_checkpoint(c, path, NULL), MP_OK);
        train(c, 3, 2000);
        assert_same_params(a, c, "loaded into a fresh model, 3 steps on");
        /* a weights file keeps the moving statistics too */
        mp_model *d = mlp(policies[pi], 123, false);
        assert_int_equal(mp_model_save_weights(a, wpath), MP_OK);
        assert_int_equal(mp_model_load_weights(d, wpath), MP_OK);
        assert_same_params(a, d, "weights file");
        float x[4 * 10];
        test_rng r = {3};
        fill(x, 40, &r, -1, 2);
        mp_tensor in;
        mp_tensor_wrap(&in, MP_F32, 2, (int64_t[]){4, 10}, x);
        const mp_tensor *ya, *yd;
        float out_a[12];
        assert_int_equal(mp_model_forward(a, &in, false, &ya), MP_OK);
        memcpy(out_a, ya->data, sizeof out_a);
        assert_int_equal(mp_model_forward(d, &in, false, &yd), MP_OK);
        assert_memory_equal(out_a, yd->data, sizeof out_a);
        mp_model_free(a);
        mp_model_free(b);
        mp_model_free(c);
        mp_model_free(d);
    }
    test_remove_tree(dir);
}

/* ----------------------------------------- (7) config JSON round trip */

static mp_model *config_model(void)
{
    mp_model *m = mp_model_new(4);
    mp_batch_norm_options bo = {.momentum = 0.9f, .epsilon = 1e-2f, .center = false, .scale = true};
    mp_node x = mp_input(m, 2, (int64_t[]){4, 3}, NULL);
    x = mp_batch_norm(m, x, &bo, &(mp_layer_options){.name = "bn"});
    x = mp_dense(m, x, 2, MP_ACT_NONE, NULL);
    assert_int_equal(mp_model_build(m, x, 4), MP_OK);
    return m;
}

/* The config with the "bn" layer's `key` set to v (NULL: removed). */
static char *config_with(const char *json, const char *key, json_t *v)
{
    json_t *root = json_loads(json, 0, NULL);
    assert_non_null(root);
    json_t *layers = json_object_get(root, "layers"), *bn = NULL;
    for (size_t i = 0; i < json_array_size(layers); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(layers, i), "name")), "bn"))
            bn = json_array_get(layers, i);
    assert_non_null(bn);
    if (v)
        json_object_set_new(bn, key, v);
    else
        json_object_del(bn, key);
    char *s = json_dumps(root, 0);
    json_decref(root);
    return s;
}

static void refused(const char *json, const char *key, json_t *v)
{
    char *bad = config_with(json, key, v);
    mp_model *b = NULL;
    assert_int_not_equal(mp_model_from_config(bad, 4, 1 << 20, &b), MP_OK);
    assert_null(b);
    if (!strstr(mp_last_error(), key)) fail_msg("'%s' not named in: %s", key, mp_last_error());
    free(bad);
}

static void test_config_round_trip(void **state)
{
    (void)state;
    mp_model *a = config_model();
    char *json = mp_model_config_json(a);
    assert_non_null(json);
    mp_model *b = NULL;
    assert_int_equal(mp_model_from_config(json, 4, 1 << 20, &b), MP_OK);
    char *again = mp_model_config_json(b);
    assert_string_equal(json, again);
    /* the same settings and parameters: no beta (center false) */
    assert_int_equal(mp_model_num_params(b), mp_model_num_params(a));
    assert_null(param(b, "bn.beta"));
    assert_non_null(param(b, "bn.gamma"));
    json_t *root = json_loads(json, 0, NULL), *bn = NULL, *layers = json_object_get(root, "layers");
    for (size_t i = 0; i < json_array_size(layers); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(layers, i), "name")), "bn"))
            bn = json_array_get(layers, i);
    assert_string_equal(json_string_value(json_object_get(bn, "class_name")), "BatchNormalization");
    assert_true((float)json_number_value(json_object_get(bn, "momentum")) == 0.9f);
    assert_true((float)json_number_value(json_object_get(bn, "epsilon")) == 1e-2f);
    assert_true(json_is_false(json_object_get(bn, "center")));
    assert_true(json_is_true(json_object_get(bn, "scale")));
    json_decref(root);
    /* the rebuilt layer computes the same (epsilon 1e-2 and all) */
    float x[2 * 12];
    test_rng r = {8};
    fill(x, 24, &r, -2, 2);
    mp_tensor in;
    mp_tensor_wrap(&in, MP_F32, 3, (int64_t[]){2, 4, 3}, x);
    for (int train = 0; train <= 1; train++) {
        const mp_tensor *ya, *yb;
        float out[4];
        assert_int_equal(mp_model_forward(a, &in, train, &ya), MP_OK);
        memcpy(out, ya->data, sizeof out);
        assert_int_equal(mp_model_forward(b, &in, train, &yb), MP_OK);
        assert_memory_equal(out, yb->data, sizeof out);
    }
    /* absent fields take Keras's defaults */
    char *s = config_with(json, "momentum", NULL), *t = config_with(s, "center", NULL);
    mp_model *c = NULL;
    assert_int_equal(mp_model_from_config(t, 4, 1 << 20, &c), MP_OK);
    assert_non_null(param(c, "bn.beta"));
    char *cj = mp_model_config_json(c);
    root = json_loads(cj, 0, NULL);
    bn = json_array_get(json_object_get(root, "layers"), 1);
    assert_true((float)json_number_value(json_object_get(bn, "momentum")) == 0.99f);
    json_decref(root);
    free(cj);
    free(s);
    free(t);
    mp_model_free(c);
    /* refusals name the field */
    refused(json, "momentum", json_real(1.5));
    refused(json, "momentum", json_real(1.0));
    refused(json, "momentum", json_real(0.99999999999)); /* rounds to 1 in float32 */
    refused(json, "momentum", json_real(-0.1));
    refused(json, "momentum", json_string("0.9"));
    refused(json, "epsilon", json_real(0.0));
    refused(json, "epsilon", json_real(-1e-3));
    refused(json, "epsilon", json_real(1e-60)); /* 0 in float32 */
    refused(json, "center", json_string("yes"));
    refused(json, "scale", json_integer(1));
    refused(json, "axis", json_integer(-1)); /* not a setting of this layer */
    /* and the constructor */
    mp_model *d = mp_model_new(1);
    mp_node x0 = mp_input(d, 1, (int64_t[]){3}, NULL);
    mp_batch_norm_options bo = mp_batch_norm_options_default();
    bo.momentum = 1.0f;
    assert_int_equal(mp_batch_norm(d, x0, &bo, NULL), -1);
    assert_non_null(strstr(mp_last_error(), "momentum"));
    mp_model_free(d);
    d = mp_model_new(1);
    x0 = mp_input(d, 1, (int64_t[]){3}, NULL);
    bo = mp_batch_norm_options_default();
    bo.epsilon = 0.0f;
    assert_int_equal(mp_batch_norm(d, x0, &bo, NULL), -1);
    assert_non_null(strstr(mp_last_error(), "epsilon"));
    mp_model_free(d);
    free(json);
    free(again);
    mp_model_free(a);
    mp_model_free(b);
}

/* --------------------------------------------------------- (8) summary */

static void test_summary_counts_state(void **state)
{
    (void)state;
    mp_model *m = mp_model_new(2);
    mp_node x = mp_input(m, 1, (int64_t[]){5}, NULL);
    x = mp_dense(m, x, 8, MP_ACT_RELU, NULL);
    x = mp_batch_norm(m, x, NULL, NULL);
    assert_int_equal(mp_model_build(m, x, 4), MP_OK);
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(mp_model_summary(m, 4, f), MP_OK);
    rewind(f);
    char text[8192];
    size_t len = fread(text, 1, sizeof text - 1, f);
    text[len] = '\0';
    fclose(f);
    /* dense 5*8 + 8, gamma + beta 16: trainable; moving statistics 16 */
    if (!strstr(text, "Non-trainable params: 16\n") || !strstr(text, "Trainable params: 64\n") ||
        !strstr(text, "Total params: 80\n") ||
        !strstr(text, "batch_normalization (BatchNormalization)"))
        fail_msg("summary:\n%s", text);
    mp_model_free(m);
}

/* ------------------------------------------------------- determinism */

/* Large enough that both kernels run in parallel: the same bits with one
 * thread and with several (fixed row blocks, summed in order). */
static void test_thread_count_independent(void **state)
{
    (void)state;
#ifdef _OPENMP
    const int64_t shape[] = {4, 4, 32}, batch = 256, rows = batch * 16, n = rows * 32;
    float *x = make_data(rows, 32, 2), *dy = malloc((size_t)n * sizeof *dy);
    test_rng r = {9};
    fill(dy, n, &r, -1, 1);
    mp_tensor in, dyt;
    mp_tensor_wrap(&in, MP_F32, 4, (int64_t[]){batch, 4, 4, 32}, x);
    mp_tensor_wrap(&dyt, MP_F32, 4, (int64_t[]){batch, 4, 4, 32}, dy);
    float *out[2], *dx[2], grads[2][3][32];
    int saved = omp_get_max_threads();
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(k == 0 ? 1 : (saved > 1 ? saved : 2));
        mp_node pre;
        mp_model *m = bn_model(3, shape, NULL, batch, true, &pre);
        randomize(m, 1);
        const mp_tensor *y;
        assert_int_equal(mp_model_forward(m, &in, true, &y), MP_OK);
        out[k] = malloc((size_t)n * sizeof(float));
        memcpy(out[k], y->data, (size_t)n * sizeof(float));
        assert_int_equal(mp_model_backward(m, &dyt, false), MP_OK);
        dx[k] = malloc((size_t)n * sizeof(float));
        memcpy(dx[k], mp_model_node_grad(m, pre)->data, (size_t)n * sizeof(float));
        memcpy(grads[k][0], param(m, "bn.gamma")->grad, sizeof grads[k][0]);
        memcpy(grads[k][1], param(m, "bn.beta")->grad, sizeof grads[k][1]);
        memcpy(grads[k][2], param(m, "bn.moving_variance")->master, sizeof grads[k][2]);
        mp_model_free(m);
    }
    omp_set_num_threads(saved);
    assert_memory_equal(out[0], out[1], (size_t)n * sizeof(float));
    assert_memory_equal(dx[0], dx[1], (size_t)n * sizeof(float));
    assert_memory_equal(grads[0], grads[1], sizeof grads[0]);
    for (int k = 0; k < 2; k++) free(out[k]), free(dx[k]);
    free(x);
    free(dy);
#endif
}

/* ---------------------------------------------------------- relu fusion */

/* x -> identity -> bn -> relu, the relu fused into the batch norm
 * (mp_layer.relu_fused), or kept apart by a second identity between them:
 * the same output, input gradient, gamma/beta gradients and moving
 * statistics bit for bit, in training and inference, under each policy;
 * the fused batch norm reports no output or gradient of its own, and the activation
 * arena still holds exactly what the plan says. */
static mp_model *relu_model(const char *policy, bool apart, mp_node *pre, mp_node *bn)
{
    mp_model *m = mp_model_new_with_policy(3, policy);
    mp_batch_norm_options bo = mp_batch_norm_options_default();
    bo.momentum = 0.5f;
    mp_node x = mp_input(m, 3, (int64_t[]){4, 4, 32}, NULL);
    *pre = x = mp_activation_layer(m, x, MP_ACT_NONE, NULL);
    *bn = x = mp_batch_norm(m, x, &bo, &(mp_layer_options){.name = "bn"});
    if (apart) x = mp_activation_layer(m, x, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_RELU, NULL);
    assert_int_equal(mp_model_build(m, x, 64), MP_OK);
    return m;
}

static void test_relu_fusion(void **state)
{
    (void)state;
    const char *const policies[] = {"float32", "mixed_bfloat16", "mixed_float16"};
    const int64_t batch = 64, n = batch * 4 * 4 * 32;
    float *x = make_data(batch * 16, 32, 4), *dy = malloc((size_t)n * sizeof *dy);
    test_rng r = {11};
    fill(dy, n, &r, -1, 1);
    mp_tensor in, dyt;
    mp_tensor_wrap(&in, MP_F32, 4, (int64_t[]){batch, 4, 4, 32}, x);
    mp_tensor_wrap(&dyt, MP_F32, 4, (int64_t[]){batch, 4, 4, 32}, dy);
    for (int pi = 0; pi < 3; pi++) {
        void *out[2][2], *dx[2];
        float stats[2][4][32];
        size_t es = 0;
        for (int k = 0; k < 2; k++) {
            mp_node pre, bn;
            mp_model *m = relu_model(policies[pi], k == 1, &pre, &bn);
            randomize(m, 5);
            const mp_tensor *y;
            for (int train = 0; train < 2; train++) { /* inference, then a training step */
                assert_int_equal(mp_model_forward(m, &in, train, &y), MP_OK);
                es = mp_dtype_size(y->dtype);
                out[k][train] = malloc((size_t)n * es);
                memcpy(out[k][train], y->data, (size_t)n * es);
            }
            assert_true((mp_model_node_output(m, bn) == NULL) == (k == 0));
            size_t planned = 0;
            for (int i = 0; i < mp_model_num_layers(m); i++) {
                mp_layer_info li;
                assert_int_equal(mp_model_layer_info(m, i, batch, &li), MP_OK);
                planned += li.saved_bytes;
            }
            assert_int_equal(planned, mp_model_activation_bytes(m));
            assert_int_equal(mp_model_backward(m, &dyt, false), MP_OK);
            assert_true((mp_model_node_grad(m, bn) == NULL) == (k == 0));
            const mp_tensor *g = mp_model_node_grad(m, pre);
            dx[k] = malloc((size_t)n * es);
            memcpy(dx[k], g->data, (size_t)n * es);
            memcpy(stats[k][0], param(m, "bn.gamma")->grad, sizeof stats[k][0]);
            memcpy(stats[k][1], param(m, "bn.beta")->grad, sizeof stats[k][1]);
            memcpy(stats[k][2], param(m, "bn.moving_mean")->master, sizeof stats[k][2]);
            memcpy(stats[k][3], param(m, "bn.moving_variance")->master, sizeof stats[k][3]);
            mp_model_free(m);
        }
        for (int train = 0; train < 2; train++)
            if (memcmp(out[0][train], out[1][train], (size_t)n * es))
                fail_msg("%s: fused output differs (training %d)", policies[pi], train);
        if (memcmp(dx[0], dx[1], (size_t)n * es))
            fail_msg("%s: fused input gradient differs", policies[pi]);
        assert_memory_equal(stats[0], stats[1], sizeof stats[0]);
        for (int k = 0; k < 2; k++) free(out[k][0]), free(out[k][1]), free(dx[k]);
    }
    free(x);
    free(dy);
}

/* --------------------------------------------------- out of scratch */

/* With 4096 channels the per-channel buffers exceed a 64 KiB scratch limit:
 * the forward fails with MP_ERR_NOMEM and leaves the moving statistics as
 * they were (and no backward to run); a backward that fails the same way
 * gives, once memory is back, the gradients of an undisturbed run. */
static void test_out_of_scratch(void **state)
{
    (void)state;
    enum { C = 4096, N = 8 };
    mp_node pre;
    mp_model *m = bn_model(1, (int64_t[]){C}, NULL, N, true, &pre);
    randomize(m, 2);
    float *x = make_data(N, C, 6), *dy = malloc(N * C * sizeof *dy);
    test_rng r = {6};
    fill(dy, N * C, &r, -1, 1);
    mp_tensor in, dyt;
    mp_tensor_wrap(&in, MP_F32, 2, (int64_t[]){N, C}, x);
    mp_tensor_wrap(&dyt, MP_F32, 2, (int64_t[]){N, C}, dy);
    mp_model_param *mm = param(m, "bn.moving_mean"), *mv = param(m, "bn.moving_variance");
    float *before = malloc(2 * C * sizeof *before);
    memcpy(before, mm->master, C * sizeof *before);
    memcpy(before + C, mv->master, C * sizeof *before);
    mp_scratch_fail_above = 64 << 10;
    mp_status s = mp_model_forward(m, &in, true, NULL);
    mp_scratch_fail_above = SIZE_MAX;
    assert_int_equal(s, MP_ERR_NOMEM);
    assert_non_null(strstr(mp_last_error(), "bn"));
    assert_memory_equal(before, mm->master, C * sizeof *before);
    assert_memory_equal(before + C, mv->master, C * sizeof *before);
    assert_int_equal(mp_model_backward(m, &dyt, false), MP_ERR_INVALID);
    assert_int_equal(mp_model_forward(m, &in, true, NULL), MP_OK);
    assert_int_equal(mp_model_backward(m, &dyt, false), MP_OK);
    float *ref = malloc(3 * C * sizeof *ref), *dx = malloc(N * C * sizeof *dx);
    memcpy(ref, param(m, "bn.gamma")->grad, C * sizeof *ref);
    memcpy(ref + C, param(m, "bn.beta")->grad, C * sizeof *ref);
    memcpy(dx, mp_model_node_grad(m, pre)->data, N * C * sizeof *dx);
    mp_scratch_fail_above = 64 << 10;
    s = mp_model_backward(m, &dyt, false);
    mp_scratch_fail_above = SIZE_MAX;
    assert_int_equal(s, MP_ERR_NOMEM);
    assert_int_equal(mp_model_backward(m, &dyt, false), MP_OK);
    assert_memory_equal(ref, param(m, "bn.gamma")->grad, C * sizeof *ref);
    assert_memory_equal(ref + C, param(m, "bn.beta")->grad, C * sizeof *ref);
    assert_memory_equal(dx, mp_model_node_grad(m, pre)->data, N * C * sizeof *dx);
    free(before);
    free(ref);
    free(dx);
    free(x);
    free(dy);
    mp_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_training),
        cmocka_unit_test(test_constant_channel),
        cmocka_unit_test(test_moving_statistics),
        cmocka_unit_test(test_inference_uses_moving_statistics),
        cmocka_unit_test(test_gradients),
        cmocka_unit_test(test_gradients_data_input),
        cmocka_unit_test(test_policies_keep_float32_state),
        cmocka_unit_test(test_checkpoint_restores_state),
        cmocka_unit_test(test_config_round_trip),
        cmocka_unit_test(test_summary_counts_state),
        cmocka_unit_test(test_thread_count_independent),
        cmocka_unit_test(test_relu_fusion),
        cmocka_unit_test(test_out_of_scratch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
