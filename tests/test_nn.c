/* test_nn.c - layers, models, policies and losses: finite-difference
 * gradients under float32, mixed-precision gradients against float32,
 * softmax/cross-entropy stability, Keras dtype behaviour, weight-copy
 * refresh, and the precision plan against the arena. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* ------------------------------------------------------------ helpers */

static void fill_uniform(mp_tensor *t, test_rng *r, double lo, double hi)
{
    int64_t n = mp_tensor_numel(t);
    float *tmp = malloc((size_t)n * sizeof *tmp);
    for (int64_t i = 0; i < n; i++) tmp[i] = (float)test_rng_uniform(r, lo, hi);
    mp_convert(t->data, t->dtype, tmp, MP_F32, (size_t)n);
    free(tmp);
}

static double to_double(const mp_tensor *t, int64_t i)
{
    float v;
    mp_convert(&v, MP_F32, (const char *)t->data + (size_t)i * mp_dtype_size(t->dtype), t->dtype,
               1);
    return v;
}

/* L = sum_i r_i y_i in float64 for the model's output y. */
static double weighted_output(mp_model *m, const mp_tensor *x, const mp_tensor *r)
{
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(m, x, false, &y), MP_OK);
    double s = 0;
    for (int64_t i = 0; i < mp_tensor_numel(y); i++) s += to_double(r, i) * to_double(y, i);
    return s;
}

/* Directional finite-difference check of every parameter gradient of a
 * float32 model for L = sum r*y: perturb all masters along a random
 * direction d by +-h (the rounded float32 steps are used exactly) and
 * compare (L+ - L-) with sum g . (theta+ - theta-).
 *
 * Tolerance: L is summed in float64 from float32 outputs, each with relative
 * error about k*u (u = 2^-24, k <= 64 the longest accumulation here), so L's
 * rounding error is about sqrt(N) * k * u * max|r y| ~ 1e-5 for our N <= 200;
 * divided by the step 2h = 2e-2 that is <= 5e-4 in the derivative. The
 * central difference's truncation error is h^2/6 * |L'''| ~ 2e-5 * |L'''|.
 * We accept 2e-3 * max(1, |derivative|). */
static void fd_check(mp_model *m, const mp_tensor *x, const mp_tensor *r, uint64_t seed, double h)
{
    test_rng rng = {seed};
    int np = mp_model_num_params(m);
    /* analytic gradients at theta */
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(m, x, false, &y), MP_OK);
    assert_int_equal(mp_model_backward(m, r, false), MP_OK);
    double analytic = 0;
    float **plus = calloc((size_t)np, sizeof *plus), **minus = calloc((size_t)np, sizeof *minus);
    float **orig = calloc((size_t)np, sizeof *orig);
    for (int i = 0; i < np; i++) {
        mp_model_param *p = mp_model_get_param(m, i);
        plus[i] = malloc((size_t)p->n * sizeof(float));
        minus[i] = malloc((size_t)p->n * sizeof(float));
        orig[i] = malloc((size_t)p->n * sizeof(float));
        memcpy(orig[i], p->master, (size_t)p->n * sizeof(float));
        for (int64_t j = 0; j < p->n; j++) {
            double d = test_rng_uniform(&rng, -1, 1);
            plus[i][j] = (float)(p->master[j] + h * d);
            minus[i][j] = (float)(p->master[j] - h * d);
            analytic += (double)p->grad[j] * ((double)plus[i][j] - minus[i][j]);
        }
    }
    for (int i = 0; i < np; i++)
        memcpy(mp_model_get_param(m, i)->master, plus[i],
               mp_model_get_param(m, i)->n * sizeof(float));
    mp_model_mark_masters_changed(m);
    double lp = weighted_output(m, x, r);
    for (int i = 0; i < np; i++)
        memcpy(mp_model_get_param(m, i)->master, minus[i],
               mp_model_get_param(m, i)->n * sizeof(float));
    mp_model_mark_masters_changed(m);
    double lm = weighted_output(m, x, r);
    for (int i = 0; i < np; i++) {
        memcpy(mp_model_get_param(m, i)->master, orig[i],
               mp_model_get_param(m, i)->n * sizeof(float));
        free(plus[i]), free(minus[i]), free(orig[i]);
    }
    mp_model_mark_masters_changed(m);
    free(plus), free(minus), free(orig);
    /* both sides are changes of L over a step of length 2h: compare the
     * implied derivatives */
    double fd = lp - lm, tol = 2e-3 * fmax(1.0, fabs(analytic) / (2 * h)) * 2 * h;
    if (fabs(fd - analytic) > tol)
        fail_msg("finite difference %.9g vs analytic %.9g (tolerance %.3g)", fd, analytic, tol);
}

static mp_tensor make_input(int64_t batch, int ndim, const int64_t *shape, mp_dtype t,
                            uint64_t seed)
{
    int64_t s[MP_MAX_DIMS];
    s[0] = batch;
    memcpy(s + 1, shape, (size_t)ndim * sizeof *shape);
    mp_tensor x;
    assert_int_equal(mp_tensor_init(&x, t, ndim + 1, s, MP_MEM_OTHER), MP_OK);
    test_rng r = {seed};
    fill_uniform(&x, &r, -1.5, 1.5);
    return x;
}

/* --------------------------------------------- finite differences (f32) */

enum { B = 5, D = 8 };

/* Input(D) -> Dense(6) -> [layer under test] -> Dense(4) -> output; the first
 * Dense's gradient checks the layer's input gradient, the last its output. */
static void check_layer(int which, mp_activation act)
{
    mp_set_global_policy("float32");
    mp_model *m = mp_model_new(11 + (uint64_t)which);
    mp_node x = mp_input(m, 1, (int64_t[]){D}, NULL);
    mp_node h = mp_dense(m, x, 6, MP_ACT_TANH, NULL);
    switch (which) {
    case 0:
        h = mp_dense(m, h, 7, act, NULL);
        break;
    case 1:
        h = mp_activation_layer(m, h, act, NULL);
        break;
    case 2:
        h = mp_layer_norm(m, h, 1e-3f, NULL);
        break;
    case 3:
        h = mp_add(m, h, mp_dense(m, h, 6, MP_ACT_SIGMOID, NULL), NULL);
        break; /* residual */
    case 4:
        h = mp_flatten(m, h, NULL);
        break;
    case 5:
        h = mp_dropout(m, h, 0.5f, NULL);
        break; /* identity when not training */
    }
    h = mp_dense(m, h, 4, MP_ACT_NONE, NULL);
    assert_int_equal(mp_model_build(m, h, B), MP_OK);
    mp_tensor in = make_input(B, 1, (int64_t[]){D}, MP_F32, 3);
    mp_tensor r = make_input(B, 1, (int64_t[]){4}, MP_F32, 4);
    /* LayerNorm: move gamma/beta away from 1/0 so their gradients matter */
    for (int i = 0; i < mp_model_num_params(m); i++) {
        mp_model_param *p = mp_model_get_param(m, i);
        if (strstr(p->name, "gamma") || strstr(p->name, "beta"))
            for (int64_t j = 0; j < p->n; j++) p->master[j] += 0.1f * (float)(j % 3) - 0.05f;
    }
    mp_model_mark_masters_changed(m);
    /* ReLU's kink: a step of 1e-2 moves some pre-activations across zero;
     * 1e-3 keeps these inputs clear of it (rounding then costs 10x more,
     * still inside the tolerance) */
    fd_check(m, &in, &r, 100 + (uint64_t)which, act == MP_ACT_RELU ? 1e-3 : 1e-2);
    mp_tensor_release(&in);
    mp_tensor_release(&r);
    mp_model_free(m);
}

static void test_fd_dense_all_activations(void **state)
{
    (void)state;
    for (int a = 0; a <= MP_ACT_TANH; a++) {
        print_message("dense activation %s\n", mp_activation_name((mp_activation)a));
        check_layer(0, (mp_activation)a);
    }
}

static void test_fd_activation_layers(void **state)
{
    (void)state;
    for (int a = 0; a <= MP_ACT_SOFTMAX; a++) check_layer(1, (mp_activation)a);
}

static void test_fd_layer_norm_add_flatten_dropout(void **state)
{
    (void)state;
    for (int w = 2; w <= 5; w++) check_layer(w, MP_ACT_NONE);
}

/* Loss gradients: d loss / d pred by central differences on the float32
 * loss. Steps: 1e-2 for logits, 1e-2 * min(p, 1 - p) for probabilities, so
 * the truncation error (step^2 / 6 times the third derivative, which for
 * -log p is 2 / p^3) stays below 1e-4 relative. The loss comes back rounded
 * to float32, adding up to 2 * 2^-24 * max(|L|, 1) / (2 step) absolute to
 * the quotient. Accept 1e-3 relative plus twice that rounding term. */
static void fd_loss(mp_loss_kind kind, bool logits, const int64_t *shape)
{
    mp_tensor p, t, g;
    int64_t n = shape[0] * shape[1];
    assert_int_equal(mp_tensor_init(&p, MP_F32, 2, shape, MP_MEM_OTHER), MP_OK);
    assert_int_equal(mp_tensor_init(&t, MP_F32, 2, shape, MP_MEM_OTHER), MP_OK);
    assert_int_equal(mp_tensor_init(&g, MP_F32, 2, shape, MP_MEM_OTHER), MP_OK);
    test_rng r = {kind * 10 + logits};
    float *pv = p.data, *tv = t.data;
    int32_t labels[16];
    for (int64_t i = 0; i < shape[0]; i++) labels[i] = (int32_t)(test_rng_u32(&r) % shape[1]);
    for (int64_t i = 0; i < n; i++) {
        pv[i] =
            logits ? (float)test_rng_uniform(&r, -3, 3) : (float)test_rng_uniform(&r, 0.05, 0.95);
        tv[i] = (float)test_rng_uniform(&r, 0, 1);
    }
    if (kind == MP_LOSS_CATEGORICAL_CROSSENTROPY) /* a distribution per row */
        for (int64_t i = 0; i < shape[0]; i++) {
            double s = 0;
            for (int64_t c = 0; c < shape[1]; c++) s += tv[i * shape[1] + c];
            for (int64_t c = 0; c < shape[1]; c++)
                tv[i * shape[1] + c] = (float)(tv[i * shape[1] + c] / s);
        }
    mp_loss_spec spec = {.kind = kind, .from_logits = logits, .labels = labels, .target = &t};
    float loss;
    assert_int_equal(mp_loss_compute(&spec, &p, 2.0f, &loss, &g), MP_OK);
    for (int64_t i = 0; i < n; i++) {
        float x0 = pv[i];
        float step = logits ? 1e-2f : 1e-2f * fminf(x0, 1.0f - x0);
        float hp = x0 + step, hm = x0 - step;
        float lp, lm;
        pv[i] = hp;
        mp_loss_compute(&spec, &p, 1.0f, &lp, NULL);
        pv[i] = hm;
        mp_loss_compute(&spec, &p, 1.0f, &lm, NULL);
        pv[i] = x0;
        double fd = ((double)lp - lm) / ((double)hp - hm), an = ((float *)g.data)[i] / 2.0;
        double rounding = 2 * 0x1p-24 * fmax(fmax(fabs(lp), fabs(lm)), 1.0) / ((double)hp - hm);
        if (fabs(fd - an) > 1e-3 * fabs(an) + 2 * rounding)
            fail_msg("%s%s: d/dp[%lld] fd %.7g analytic %.7g", mp_loss_name(kind),
                     logits ? " (logits)" : "", (long long)i, fd, an);
    }
    mp_tensor_release(&p);
    mp_tensor_release(&t);
    mp_tensor_release(&g);
}

static void test_fd_losses(void **state)
{
    (void)state;
    const int64_t shape[] = {4, 5};
    for (int k = 0; k < 4; k++) {
        fd_loss((mp_loss_kind)k, false, shape);
        if (k != MP_LOSS_MEAN_SQUARED_ERROR) fd_loss((mp_loss_kind)k, true, shape);
    }
}

/* Loss values against float64 formulas written out here. */
static void test_loss_values(void **state)
{
    (void)state;
    float z[2][3] = {{1.0f, 2.0f, 0.5f}, {-1.0f, 0.0f, 3.0f}};
    int32_t y[2] = {1, 2};
    mp_tensor p;
    mp_tensor_wrap(&p, MP_F32, 2, (int64_t[]){2, 3}, z);
    double want = 0;
    for (int i = 0; i < 2; i++) {
        double se = 0;
        for (int c = 0; c < 3; c++) se += exp(z[i][c]);
        want += log(se) - z[i][y[i]];
    }
    want /= 2;
    float loss;
    mp_loss_spec s = {
        .kind = MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, .from_logits = true, .labels = y};
    assert_int_equal(mp_loss_compute(&s, &p, 1.0f, &loss, NULL), MP_OK);
    assert_true(fabs(loss - want) < 1e-6 * want);
    /* MSE and BCE on probabilities */
    float t[2][3] = {{0, 1, 0}, {1, 0, 1}}, q[2][3] = {{0.1f, 0.8f, 0.3f}, {0.6f, 0.2f, 0.9f}};
    mp_tensor tt, qq;
    mp_tensor_wrap(&tt, MP_F32, 2, (int64_t[]){2, 3}, t);
    mp_tensor_wrap(&qq, MP_F32, 2, (int64_t[]){2, 3}, q);
    double mse = 0, bce = 0;
    for (int i = 0; i < 6; i++) {
        double a = (&q[0][0])[i], b = (&t[0][0])[i];
        mse += (a - b) * (a - b) / 6;
        bce -= (b * log(a) + (1 - b) * log(1 - a)) / 6;
    }
    s = (mp_loss_spec){.kind = MP_LOSS_MEAN_SQUARED_ERROR, .target = &tt};
    assert_int_equal(mp_loss_compute(&s, &qq, 1.0f, &loss, NULL), MP_OK);
    assert_true(fabs(loss - mse) < 1e-6);
    s.kind = MP_LOSS_BINARY_CROSSENTROPY;
    assert_int_equal(mp_loss_compute(&s, &qq, 1.0f, &loss, NULL), MP_OK);
    assert_true(fabs(loss - bce) < 1e-6 * bce);
    /* bad labels are reported, not read out of bounds */
    int32_t bad[2] = {0, 3};
    s = (mp_loss_spec){.kind = MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, .labels = bad};
    assert_int_equal(mp_loss_compute(&s, &p, 1.0f, &loss, NULL), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "label 3"));
    mp_loss_kind k;
    assert_int_equal(mp_loss_from_name("hinge", &k), MP_ERR_INVALID);
}

/* ---------------------------------------- mixed precision vs float32 */

static mp_model *deep_model(const char *policy, uint64_t seed, mp_node *out)
{
    mp_set_global_policy(policy);
    mp_model *m = mp_model_new(seed);
    mp_node x = mp_input(m, 1, (int64_t[]){32}, NULL);
    x = mp_dense(m, x, 64, MP_ACT_RELU, NULL);
    mp_node h = mp_dense(m, x, 64, MP_ACT_GELU, NULL);
    x = mp_add(m, x, h, NULL);
    x = mp_layer_norm(m, x, 1e-3f, NULL);
    x = mp_dense(m, x, 10, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    mp_set_global_policy("float32");
    *out = x;
    return m;
}

/* Gradients of a mixed model against the same model in float32 (same
 * initial masters, same data). Each weight layer rounds its input, weights
 * and output to the compute format (relative error <= u each) forward, and
 * its gradients likewise backward: about 3 * 2 * d = 24 roundings through the
 * d = 4 weight layers here. In the worst case they add up to 24 u; in the
 * 2-norm over a tensor they are independent and add in quadrature, about
 * sqrt(24) u = 4.9 u. We bound each parameter gradient's relative 2-norm
 * error by 6 u: 0.023 for bfloat16 (u = 2^-8), 0.0029 for float16 (2^-11).
 * (Measured: 1.1u - 2.2u.) */
static void compare_policy(const char *policy, double u)
{
    mp_node o32, olp;
    mp_model *ref = deep_model("float32", 5, &o32), *lp = deep_model(policy, 5, &olp);
    assert_int_equal(mp_model_build(ref, o32, 16), MP_OK);
    assert_int_equal(mp_model_build(lp, olp, 16), MP_OK);
    mp_tensor in = make_input(16, 1, (int64_t[]){32}, MP_F32, 9);
    int32_t labels[16];
    for (int i = 0; i < 16; i++) labels[i] = i % 10;
    mp_loss_spec spec = {.kind = MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, .labels = labels};
    float l32, llp;
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(ref, &in, true, &y), MP_OK);
    assert_int_equal(mp_model_loss_backward(ref, &spec, 1.0f, false, &l32), MP_OK);
    assert_int_equal(mp_model_forward(lp, &in, true, &y), MP_OK);
    assert_int_equal(mp_model_loss_backward(lp, &spec, 1.0f, false, &llp), MP_OK);
    assert_true(fabs(l32 - llp) <= 6 * u * fabs(l32));
    for (int i = 0; i < mp_model_num_params(ref); i++) {
        mp_model_param *a = mp_model_get_param(ref, i), *b = mp_model_get_param(lp, i);
        double num = 0, den = 0;
        for (int64_t j = 0; j < a->n; j++) {
            double d = (double)a->grad[j] - b->grad[j];
            num += d * d;
            den += (double)a->grad[j] * a->grad[j];
        }
        double rel = sqrt(num / fmax(den, 1e-30));
        if (rel > 6 * u)
            fail_msg("%s: %s gradient relative error %.4g > %.4g", policy, a->name, rel, 6 * u);
    }
    mp_tensor_release(&in);
    mp_model_free(ref);
    mp_model_free(lp);
}

static void test_mixed_gradients_vs_float32(void **state)
{
    (void)state;
    compare_policy("mixed_bfloat16", 0x1p-8);
    compare_policy("mixed_float16", 0x1p-11);
}

/* ------------------------------------------------- softmax stability */

static void test_softmax_extremes(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_float16", "mixed_bfloat16", "float16", "bfloat16"};
    for (int pi = 0; pi < 5; pi++) {
        mp_set_global_policy(policies[pi]);
        mp_model *m = mp_model_new(1);
        mp_node x = mp_input(m, 1, (int64_t[]){4}, NULL);
        x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, NULL); /* in the policy's own dtype */
        assert_int_equal(mp_model_build(m, x, 2), MP_OK);
        float logits[2][4] = {{1e4f, -1e4f, 0, 5e3f}, {-1e4f, -1e4f, -1e4f, -9999}};
        mp_tensor in;
        mp_tensor_wrap(&in, MP_F32, 2, (int64_t[]){2, 4}, logits);
        const mp_tensor *y;
        assert_int_equal(mp_model_forward(m, &in, true, &y), MP_OK);
        for (int i = 0; i < 8; i++) assert_true(isfinite(to_double(y, i)));
        int32_t labels[2] = {1, 3};
        float loss;
        mp_loss_spec spec = {.kind = MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, .labels = labels};
        assert_int_equal(mp_model_loss_backward(m, &spec, 1.0f, false, &loss), MP_OK);
        /* the fused path computes from logits: row 0 loses 2e4, row 1 ~0.3133 in float32 */
        assert_true(isfinite(loss) && loss > 9000.0f);
        spec.from_logits = true;
        assert_int_equal(mp_loss_compute(&spec, &in, 1.0f, &loss, NULL), MP_OK);
        assert_true(isfinite(loss));
        mp_model_free(m);
    }
    /* float16 inputs whose exp overflows float16 (e^12 > 65504) */
    mp_set_global_policy("mixed_float16");
    mp_model *m = mp_model_new(1);
    mp_node x = mp_input(m, 1, (int64_t[]){3}, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, NULL);
    assert_int_equal(mp_model_build(m, x, 1), MP_OK);
    uint16_t h[3] = {mp_f32_to_f16(12.0f), mp_f32_to_f16(0.0f), mp_f32_to_f16(-3.0f)};
    mp_tensor in;
    mp_tensor_wrap(&in, MP_F16, 2, (int64_t[]){1, 3}, h);
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(m, &in, false, &y), MP_OK);
    assert_int_equal(y->dtype, MP_F16);
    double se = exp(12.0) + 1 + exp(-3.0);
    double want[3] = {exp(12.0) / se, 1 / se, exp(-3.0) / se};
    for (int i = 0; i < 3; i++) /* one float16 rounding of the float32 result */
        assert_true(fabs(to_double(y, i) - want[i]) <= 0x1p-11 * want[i] * 1.01 + 1e-7);
    mp_model_free(m);
    mp_set_global_policy("float32");
}

/* -------------------------------------------------- policy behaviour */

static void test_policy_dtypes(void **state)
{
    (void)state;
    mp_policy p;
    assert_int_equal(mp_policy_from_name("mixed_float16", &p), MP_OK);
    assert_int_equal(p.compute, MP_F16);
    assert_int_equal(p.variable, MP_F32);
    assert_int_equal(mp_policy_from_name("bfloat16", &p), MP_OK);
    assert_int_equal(p.variable, MP_BF16);
    assert_int_equal(mp_set_global_policy("mixed_float4"), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "mixed_float4"));
    assert_string_equal(mp_global_policy().name, "float32");

    assert_int_equal(mp_set_global_policy("mixed_float16"), MP_OK);
    mp_model *m = mp_model_new(3);
    mp_node in = mp_input(m, 1, (int64_t[]){6}, NULL);
    mp_node d = mp_dense(m, in, 5, MP_ACT_RELU, NULL);
    mp_set_global_policy("float32"); /* layers keep the policy they were made with */
    mp_node d2 = mp_dense(m, d, 3, MP_ACT_NONE, &(mp_layer_options){.policy = "mixed_float16"});
    mp_node s = mp_activation_layer(m, d2, MP_ACT_SOFTMAX, NULL);
    assert_int_equal(mp_model_build(m, s, 4), MP_OK);
    mp_tensor x = make_input(4, 1, (int64_t[]){6}, MP_F32, 1);
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(m, &x, true, &y), MP_OK);
    assert_int_equal(mp_model_node_output(m, in)->dtype, MP_F32);
    assert_int_equal(mp_model_node_output(m, d)->dtype, MP_F16);
    assert_int_equal(mp_model_node_output(m, d2)->dtype, MP_F16);
    assert_int_equal(y->dtype, MP_F32);
    mp_layer_info li;
    mp_model_layer_info(m, d, 4, &li);
    assert_string_equal(li.name, "dense");
    assert_string_equal(li.policy.name, "mixed_float16");
    mp_model_layer_info(m, s, 4, &li);
    assert_string_equal(li.name, "activation");
    assert_string_equal(li.policy.name, "float32");
    mp_model_param *k = mp_model_get_param(m, 0);
    assert_string_equal(k->name, "dense.kernel");
    assert_int_equal(k->weight_dtype, MP_F16);
    assert_non_null(k->master);
    assert_int_equal(k->shape[0], 6);
    assert_int_equal(k->shape[1], 5);
    assert_string_equal(mp_model_get_param(m, 3)->name, "dense_1.bias");
    /* gradients keep each tensor's dtype; parameter gradients are float32 */
    mp_tensor dy = make_input(4, 1, (int64_t[]){3}, MP_F32, 2);
    assert_int_equal(mp_model_backward(m, &dy, false), MP_OK);
    assert_int_equal(mp_model_node_grad(m, d)->dtype, MP_F16);
    assert_int_equal(mp_model_node_grad(m, d2)->dtype, MP_F16);
    assert_int_equal(mp_model_node_grad(m, s)->dtype, MP_F32);

    /* the compute copy is refreshed when masters change, and only then */
    uint64_t r0 = mp_model_weight_refreshes(m);
    assert_int_equal(mp_model_forward(m, &x, false, &y), MP_OK);
    assert_int_equal(mp_model_weight_refreshes(m), r0);
    k->master[0] = 0.123456f;
    assert_int_equal(mp_model_forward(m, &x, false, &y), MP_OK);
    assert_int_not_equal(((uint16_t *)k->weight)[0], mp_f32_to_f16(0.123456f)); /* not told */
    mp_model_mark_masters_changed(m);
    assert_int_equal(mp_model_forward(m, &x, false, &y), MP_OK);
    assert_int_equal(mp_model_weight_refreshes(m), r0 + 1);
    for (int64_t j = 0; j < k->n; j++)
        assert_int_equal(((uint16_t *)k->weight)[j], mp_f32_to_f16(k->master[j]));
    assert_int_equal(mp_model_forward(m, &x, false, &y), MP_OK);
    assert_int_equal(mp_model_weight_refreshes(m), r0 + 1);
    mp_tensor_release(&x);
    mp_tensor_release(&dy);
    mp_model_free(m);

    /* pure policy: weights live in the compute dtype, no master */
    mp_set_global_policy("bfloat16");
    m = mp_model_new(3);
    d = mp_dense(m, mp_input(m, 1, (int64_t[]){6}, NULL), 5, MP_ACT_NONE, NULL);
    assert_int_equal(mp_model_build(m, d, 2), MP_OK);
    assert_null(mp_model_get_param(m, 0)->master);
    assert_int_equal(mp_model_get_param(m, 0)->weight_dtype, MP_BF16);
    mp_model_free(m);
    mp_set_global_policy("float32");
}

static void test_model_errors(void **state)
{
    (void)state;
    mp_model *m = mp_model_new(1);
    mp_node a = mp_input(m, 1, (int64_t[]){4}, NULL);
    mp_node b = mp_dense(m, a, 3, MP_ACT_NONE, NULL);
    assert_int_equal(mp_add(m, a, b, NULL), -1);
    assert_non_null(strstr(mp_last_error(), "(None, 4) and (None, 3)"));
    assert_int_equal(mp_dense(m, b, 2, MP_ACT_NONE, NULL), -1); /* sticky */
    mp_model_free(m);

    m = mp_model_new(1);
    a = mp_input(m, 1, (int64_t[]){4}, NULL);
    assert_int_equal(mp_dense(m, a, 3, MP_ACT_NONE, &(mp_layer_options){.policy = "float64"}), -1);
    assert_non_null(strstr(mp_last_error(), "float64"));
    mp_model_free(m);

    m = mp_model_new(1);
    a = mp_input(m, 1, (int64_t[]){4}, NULL);
    b = mp_dense(m, a, 3, MP_ACT_NONE, &(mp_layer_options){.name = "head"});
    assert_int_equal(mp_dense(m, b, 3, MP_ACT_NONE, &(mp_layer_options){.name = "head"}), -1);
    assert_non_null(strstr(mp_last_error(), "duplicate"));
    mp_model_free(m);

    m = mp_model_new(1);
    a = mp_input(m, 1, (int64_t[]){4}, NULL);
    b = mp_dense(m, a, 3, MP_ACT_NONE, NULL);
    assert_int_equal(mp_model_build(m, b, 8), MP_OK);
    mp_tensor x = make_input(2, 1, (int64_t[]){5}, MP_F32, 1);
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(m, &x, false, &y), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "float32[2, 5]"));
    mp_tensor_release(&x);
    x = make_input(9, 1, (int64_t[]){4}, MP_F32, 1);
    assert_int_equal(mp_model_forward(m, &x, false, &y), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "batch 9"));
    mp_tensor_release(&x);
    mp_tensor dy = make_input(2, 1, (int64_t[]){3}, MP_F32, 1);
    assert_int_equal(mp_model_backward(m, &dy, false), MP_ERR_INVALID); /* no forward yet */
    mp_tensor_release(&dy);
    mp_model_free(m);
}

/* ----------------------------------------------- plan equals the arena */

static void test_plan_matches_arena(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_float16", "mixed_bfloat16", "float16", "bfloat16"};
    for (int pi = 0; pi < 5; pi++) {
        mp_set_global_policy(policies[pi]);
        mp_model *m = mp_model_new(2);
        mp_node x = mp_input(m, 2, (int64_t[]){3, 4}, NULL);
        x = mp_flatten(m, x, NULL);
        x = mp_dense(m, x, 16, MP_ACT_GELU, NULL);
        mp_node h = mp_dropout(m, x, 0.25f, NULL);
        h = mp_dense(m, h, 16, MP_ACT_SIGMOID, NULL);
        x = mp_add(m, x, h, NULL);
        x = mp_layer_norm(m, x, 1e-5f, NULL);
        x = mp_activation_layer(m, x, MP_ACT_GELU_TANH, NULL);
        x = mp_dense(m, x, 5, MP_ACT_NONE, NULL);
        x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
        assert_int_equal(mp_model_build(m, x, 32), MP_OK);
        for (int64_t batch = 1; batch <= 32; batch += 31) {
            mp_tensor in = make_input(batch, 2, (int64_t[]){3, 4}, MP_F32, 5);
            const mp_tensor *y;
            assert_int_equal(mp_model_forward(m, &in, true, &y), MP_OK);
            size_t planned = 0;
            for (int i = 0; i < mp_model_num_layers(m); i++) {
                mp_layer_info li;
                mp_model_layer_info(m, i, batch, &li);
                planned += li.saved_bytes;
            }
            assert_int_equal(planned, mp_model_activation_bytes(m));
            mp_mem_stats st;
            mp_mem_get_stats(&st);
            assert_true(st.current[MP_MEM_ACTIVATIONS] >= planned);
            int32_t labels[32] = {0};
            float loss;
            mp_loss_spec spec = {.kind = MP_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, .labels = labels};
            assert_int_equal(mp_model_loss_backward(m, &spec, 1.0f, false, &loss), MP_OK);
            assert_true(isfinite(loss));
            mp_tensor_release(&in);
        }
        mp_model_free(m);
    }
    mp_set_global_policy("float32");
}

/* The seed MLP: saved activations under mixed_bfloat16 are half of float32's,
 * apart from the float32 softmax at the end. Per sample: float32 keeps the
 * input copy (784*4), two hidden outputs (2*4096*4), the logits (10*4) and the
 * probabilities (10*4) = 35984 bytes; mixed_bfloat16 keeps 784*2 + 2*4096*2 +
 * 10*2 + the logits cast to float32 for the fused loss (10*4) + 10*4 = 18052. */
static void test_seed_model_half_memory(void **state)
{
    (void)state;
    size_t saved[2];
    const char *pol[2] = {"float32", "mixed_bfloat16"};
    for (int i = 0; i < 2; i++) {
        mp_set_global_policy(pol[i]);
        mp_model *m = mp_model_new(42);
        mp_node x = mp_input(m, 1, (int64_t[]){784}, NULL);
        x = mp_dense(m, x, 4096, MP_ACT_RELU, NULL);
        x = mp_dense(m, x, 4096, MP_ACT_RELU, NULL);
        x = mp_dense(m, x, 10, MP_ACT_NONE, NULL);
        x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
        assert_int_equal(mp_model_build(m, x, 1024), MP_OK);
        saved[i] = 0;
        for (int l = 0; l < mp_model_num_layers(m); l++) {
            mp_layer_info li;
            mp_model_layer_info(m, l, 1024, &li);
            saved[i] += li.saved_bytes;
        }
        mp_model_free(m);
    }
    mp_set_global_policy("float32");
    assert_int_equal(saved[0], 35984u * 1024);
    assert_int_equal(saved[1], 18052u * 1024);
}

/* Dropout: seeded, about `rate` dropped, scaled by 1/(1-rate), identity at
 * inference, and its backward uses the same mask. */
static void test_dropout(void **state)
{
    (void)state;
    mp_model *m = mp_model_new(8);
    mp_node x = mp_input(m, 1, (int64_t[]){1000}, NULL);
    mp_node pre = mp_activation_layer(m, x, MP_ACT_NONE, NULL);
    mp_node d = mp_dropout(m, pre, 0.3f, NULL);
    assert_int_equal(mp_model_build(m, d, 10), MP_OK);
    mp_tensor in = make_input(10, 1, (int64_t[]){1000}, MP_F32, 3);
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(m, &in, true, &y), MP_OK);
    int dropped = 0;
    const float *xi = in.data, *yo = y->data;
    for (int i = 0; i < 10000; i++) {
        if (yo[i] == 0.0f)
            dropped++;
        else
            assert_true(yo[i] == xi[i] * (1.0f / 0.7f));
    }
    /* binomial(10000, 0.3): sd 45.8; accept 6 sd */
    assert_true(abs(dropped - 3000) < 275);
    mp_tensor ones;
    mp_tensor_init(&ones, MP_F32, 2, (int64_t[]){10, 1000}, MP_MEM_OTHER);
    for (int i = 0; i < 10000; i++) ((float *)ones.data)[i] = 1.0f;
    assert_int_equal(mp_model_backward(m, &ones, false), MP_OK);
    const float *g = mp_model_node_grad(m, pre)->data; /* what dropout passed back */
    for (int i = 0; i < 10000; i++) assert_true(g[i] == (yo[i] == 0.0f ? 0.0f : 1.0f / 0.7f));
    /* the same seed and step give the same mask; the next step another */
    mp_model *m2 = mp_model_new(8);
    mp_node d2 = mp_dropout(
        m2, mp_activation_layer(m2, mp_input(m2, 1, (int64_t[]){1000}, NULL), MP_ACT_NONE, NULL),
        0.3f, NULL);
    assert_int_equal(mp_model_build(m2, d2, 10), MP_OK);
    const mp_tensor *y2;
    assert_int_equal(mp_model_forward(m2, &in, true, &y2), MP_OK);
    assert_memory_equal(y2->data, y->data, 10000 * sizeof(float));
    assert_int_equal(mp_model_forward(m2, &in, true, &y2), MP_OK);
    assert_memory_not_equal(y2->data, y->data, 10000 * sizeof(float));
    assert_int_equal(mp_model_forward(m, &in, false, &y), MP_OK);
    assert_memory_equal(y->data, in.data, 10000 * sizeof(float));
    mp_tensor_release(&ones);
    mp_tensor_release(&in);
    mp_model_free(m);
    mp_model_free(m2);
}

/* NaN passes through relu whether it is fused into Dense (the GEMM
 * epilogue) or a separate Activation layer (the elementwise op): a relu
 * that turned NaN into 0 would hide an overflow from loss scaling. */
static void test_relu_passes_nan(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_bfloat16"};
    for (int p = 0; p < 2; p++) {
        mp_set_global_policy(policies[p]);
        mp_model *m = mp_model_new(2);
        mp_node in = mp_input(m, 1, (int64_t[]){2}, NULL);
        mp_node d = mp_dense(m, in, 3, MP_ACT_RELU, NULL);
        mp_node a = mp_activation_layer(m, in, MP_ACT_RELU, NULL);
        mp_node out = mp_add(m, mp_dense(m, a, 3, MP_ACT_NONE, NULL), d, NULL);
        mp_set_global_policy("float32");
        assert_int_equal(mp_model_build(m, out, 1), MP_OK);
        float xs[2] = {NAN, 1.0f};
        mp_tensor x;
        mp_tensor_wrap(&x, MP_F32, 2, (int64_t[]){1, 2}, xs);
        const mp_tensor *y;
        assert_int_equal(mp_model_forward(m, &x, false, &y), MP_OK);
        float v[3];
        const mp_tensor *ya = mp_model_node_output(m, a), *yd = mp_model_node_output(m, d);
        mp_convert(v, MP_F32, ya->data, ya->dtype, 2);
        assert_true(isnan(v[0]));
        assert_true(v[1] == 1.0f);
        mp_convert(v, MP_F32, yd->data, yd->dtype, 3);
        for (int j = 0; j < 3; j++) assert_true(isnan(v[j]));
        mp_model_free(m);
    }
}

static void test_summary_prints(void **state)
{
    (void)state;
    mp_set_global_policy("mixed_float16");
    mp_model *m = mp_model_new(1);
    mp_node x = mp_dense(m, mp_input(m, 1, (int64_t[]){8}, NULL), 4, MP_ACT_RELU, NULL);
    assert_int_equal(mp_model_build(m, x, 4), MP_OK);
    FILE *f = tmpfile();
    assert_int_equal(mp_model_summary(m, 4, f), MP_OK);
    rewind(f);
    char buf[4096];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    buf[len] = 0;
    fclose(f);
    assert_non_null(strstr(buf, "dense (Dense)"));
    assert_non_null(strstr(buf, "float16"));
    assert_non_null(strstr(buf, "Total params: 36"));
    assert_int_equal(mp_model_summary(m, 5, stdout), MP_ERR_INVALID);
    mp_model_free(m);
    mp_set_global_policy("float32");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fd_dense_all_activations),
        cmocka_unit_test(test_fd_activation_layers),
        cmocka_unit_test(test_fd_layer_norm_add_flatten_dropout),
        cmocka_unit_test(test_fd_losses),
        cmocka_unit_test(test_loss_values),
        cmocka_unit_test(test_mixed_gradients_vs_float32),
        cmocka_unit_test(test_softmax_extremes),
        cmocka_unit_test(test_policy_dtypes),
        cmocka_unit_test(test_model_errors),
        cmocka_unit_test(test_plan_matches_arena),
        cmocka_unit_test(test_seed_model_half_memory),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_relu_passes_nan),
        cmocka_unit_test(test_summary_prints),
    };
    return cmocka_run_group_tests_name("nn", tests, NULL, NULL);
}
