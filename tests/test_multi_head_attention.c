/* test_multi_head_attention.c - the MultiHeadAttention layer (causal):
 * parameters named and shaped as Keras's, the forward against a float64
 * reference written here (float32, mixed_bfloat16, pure bfloat16 and
 * mixed_float16, each within a bound derived below, so the policies agree
 * within the sum of their bounds; pure bfloat16 keeps no float32 masters,
 * so its biases are widened for the GEMMs and its backward is run too),
 * gradients of every parameter and of the inputs (through Dense layers in
 * front) against central differences of the float64 reference, self- and
 * three-input attention, the causal mask directly (a change to later
 * positions never changes an earlier output), the plan's saved bytes, the
 * configuration round trip with refusals, and a checkpoint resumed bit for
 * bit.
 *
 * Forward bound, propagated stage by stage in float64 from the reference's
 * values (u = 2^-24 for float32 arithmetic, us = the storage unit roundoff:
 * 0 under float32, 2^-8 under (mixed_)bfloat16, 2^-11 under mixed_float16,
 * where the input and the weights are rounded to 16 bits and so are Q, K,
 * V, the attention output and the output; biases are used as float32):
 *   projection P = x W + b (n = model_dim terms): e_P = (gamma_n + 2.01 us)
 *     sum|x W| + sum e_x |W| (1 + us) + u |b| + us |P|;
 *   scores s_ij = q_i . k_j / sqrt(d): e_s = scale sum (e_q |k| + |q| e_k +
 *     e_q e_k) + gamma_d scale sum |q k| + 3u |s|;
 *   attention (a convex combination of the rows of V): perturbing each
 *     weight's exponent by at most E = max_j e_s (plus the kernel's own
 *     rounding of s - m, u (2 max|s| + 2), and expf's 2u) changes the weights
 *     by a relative eps <= expm1(2E) and the output by 2 eps / (1 - eps)
 *     max|v|; the tile rescales add nt u (2 + 2 max|s|) to eps; the value
 *     errors pass through at most max_j e_v; the float32 sums add
 *     (2 gamma_(T+nt) + 2u) max|v|; storage adds us |a|;
 *   output y = a Wo + bo (h*d terms): as a projection, with e_a for e_x.
 * The test allows twice the bound (the second-order terms dropped). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/attention.h"

static const double U = 0x1p-24;
static double gam(double n) { return n * U / (1 - n * U); }

/* Input [T, E0] -> npre Dense(E) -> MultiHeadAttention(H, D) (npre 0: on
 * the input itself; 1: self-attention on one Dense; 3: query, value, key
 * from three). */
typedef struct {
    int64_t b, t, e0, e, h, d;
    int npre;
    bool bias;
} cfg;

static mp_model *make_model(const cfg *c, const char *policy, uint64_t seed)
{
    mp_model *m = mp_model_new_with_policy(seed, policy);
    assert_non_null(m);
    mp_node x = mp_input(m, 2, (int64_t[]){c->t, c->npre ? c->e0 : c->e}, NULL), src[3] = {x, x, x};
    for (int i = 0; i < c->npre; i++) src[i] = mp_dense(m, x, c->e, MP_ACT_NONE, NULL);
    mp_multi_head_attention_options a = mp_multi_head_attention_options_default(c->h, c->d);
    a.use_bias = c->bias;
    mp_node y = mp_multi_head_attention_ex(m, c->npre == 3 ? 3 : 1, src, &a,
                                           &(mp_layer_options){.name = "mha"});
    assert_true(y >= 0);
    assert_int_equal(mp_model_build(m, y, c->b), MP_OK);
    /* biases start at zero (Keras's default): give them values to test */
    for (int i = 0; i < mp_model_num_params(m); i++) {
        mp_model_param *p = mp_model_get_param(m, i);
        if (p->role != MP_ROLE_BIAS) continue;
        test_rng r = {seed * 31 + (uint64_t)i};
        float *v = malloc((size_t)p->n * sizeof *v);
        for (int64_t j = 0; j < p->n; j++) v[j] = (float)test_rng_uniform(&r, -0.5, 0.5);
        if (p->master) memcpy(p->master, v, (size_t)p->n * sizeof *v);
        mp_convert(p->weight, p->weight_dtype, v, MP_F32, (size_t)p->n); /* pure: no master */
        free(v);
    }
    return m;
}

static double **params64(mp_model *m)
{
    int n = mp_model_num_params(m);
    double **P = calloc((size_t)n, sizeof *P);
    for (int i = 0; i < n; i++) {
        mp_model_param *p = mp_model_get_param(m, i);
        P[i] = malloc((size_t)p->n * sizeof **P);
        float *w = malloc((size_t)p->n * sizeof *w);
        mp_convert(w, MP_F32, p->master ? (const void *)p->master : p->weight,
                   p->master ? MP_F32 : p->weight_dtype, (size_t)p->n);
        for (int64_t j = 0; j < p->n; j++) P[i][j] = w[j];
        free(w);
    }
    return P;
}

static void free_params(double **P, int n)
{
    for (int i = 0; i < n; i++) free(P[i]);
    free(P);
}

/* y = x W + b over rows (W [n, k], b [k] or NULL), with the bound above
 * when ey (ex: the input's bound, or NULL for an exact input). */
static void proj(int64_t rows, int64_t n, int64_t k, const double *x, const double *ex,
                 const double *w, const double *b, double *y, double *ey, double us)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < k; c++) {
            double s = b ? b[c] : 0, mag = 0, prop = 0;
            for (int64_t i = 0; i < n; i++) {
                s += x[r * n + i] * w[i * k + c];
                mag += fabs(x[r * n + i] * w[i * k + c]);
                if (ex) prop += ex[r * n + i] * fabs(w[i * k + c]);
            }
            y[r * k + c] = s;
            if (ey)
                ey[r * k + c] = (gam((double)n) + 2.01 * us) * mag + prop * (1 + us) +
                                U * (b ? fabs(b[c]) : 0) + us * fabs(s);
        }
}

/* The whole model in float64 from parameters P (model order); tol (may be
 * NULL) gets twice the bound. */
static void ref_model(const cfg *c, double *const *P, const double *x, double *y, double *tol,
                      double us)
{
    const int64_t rows = c->b * c->t, E = c->e, H = c->h, D = c->d, HD = H * D, T = c->t;
    const int64_t nt = (T + MP_ATTN_TILE - 1) / MP_ATTN_TILE;
    const double scale = 1 / sqrt((double)D);
    double *src[3], *esrc[3];
    int nsrc = c->npre ? c->npre : 1;
    for (int i = 0; i < nsrc; i++) {
        src[i] = malloc((size_t)(rows * E) * 8);
        esrc[i] = malloc((size_t)(rows * E) * 8);
        if (c->npre) {
            proj(rows, c->e0, E, x, NULL, P[2 * i], P[2 * i + 1], src[i], esrc[i], us);
        } else {
            for (int64_t j = 0; j < rows * E; j++) src[i][j] = x[j], esrc[i][j] = us * fabs(x[j]);
        }
    }
    const int iq = 0, iv = nsrc == 3 ? 1 : 0, ik = nsrc == 3 ? 2 : 0;
    const int base = 2 * c->npre, step = c->bias ? 2 : 1;
    double *pr[3], *ep[3];
    const int from[3] = {iq, ik, iv}; /* Q, K, V in the layer's parameter order */
    for (int p = 0; p < 3; p++) {
        pr[p] = malloc((size_t)(rows * HD) * 8);
        ep[p] = malloc((size_t)(rows * HD) * 8);
        proj(rows, E, HD, src[from[p]], esrc[from[p]], P[base + step * p],
             c->bias ? P[base + step * p + 1] : NULL, pr[p], ep[p], us);
    }
    double *a = calloc((size_t)(rows * HD), 8), *ea = calloc((size_t)(rows * HD), 8);
    double *s = malloc((size_t)T * 8), *es = malloc((size_t)T * 8);
    for (int64_t b = 0; b < c->b; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                const int64_t qi = (b * T + i) * HD + h * D;
                double m = -INFINITY, smax = 0, emax = 0, vmax = 0, evmax = 0, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const int64_t kj = (b * T + j) * HD + h * D;
                    double dot = 0, mag = 0, prop = 0;
                    for (int64_t k = 0; k < D; k++) {
                        double q = pr[0][qi + k], kk = pr[1][kj + k];
                        double eq = ep[0][qi + k], ek = ep[1][kj + k];
                        dot += q * kk;
                        mag += fabs(q * kk);
                        prop += eq * fabs(kk) + fabs(q) * ek + eq * ek;
                        vmax = fmax(vmax, fabs(pr[2][kj + k]));
                        evmax = fmax(evmax, ep[2][kj + k]);
                    }
                    s[j] = scale * dot;
                    es[j] = scale * prop + gam((double)D) * scale * mag + 3 * U * fabs(s[j]);
                    m = fmax(m, s[j]);
                    smax = fmax(smax, fabs(s[j]));
                    emax = fmax(emax, es[j]);
                }
                double eps =
                    expm1(2 * emax + U * (2 * smax + 2)) + 2 * U + (double)nt * U * (2 + 2 * smax);
                double bound =
                    2 * eps / (1 - eps) * vmax + evmax + (2 * gam((double)(T + nt)) + 2 * U) * vmax;
                for (int64_t j = 0; j <= i; j++) sum += exp(s[j] - m);
                for (int64_t j = 0; j <= i; j++) {
                    double w = exp(s[j] - m) / sum;
                    for (int64_t k = 0; k < D; k++)
                        a[qi + k] += w * pr[2][(b * T + j) * HD + h * D + k];
                }
                for (int64_t k = 0; k < D; k++) ea[qi + k] = bound + us * (fabs(a[qi + k]) + bound);
            }
    double *ey = malloc((size_t)(rows * E) * 8);
    proj(rows, HD, E, a, ea, P[base + step * 3], c->bias ? P[base + step * 3 + 1] : NULL, y, ey,
         us);
    if (tol)
        for (int64_t j = 0; j < rows * E; j++) tol[j] = 2 * ey[j] + 1e-30;
    for (int i = 0; i < nsrc; i++) free(src[i]), free(esrc[i]);
    for (int p = 0; p < 3; p++) free(pr[p]), free(ep[p]);
    free(a), free(ea), free(s), free(es), free(ey);
}

/* Random float32 data [b, T, width] and its float64 copy. */
static void random_x(const cfg *c, uint64_t seed, mp_tensor *x, double **xe)
{
    const int64_t w = c->npre ? c->e0 : c->e, n = c->b * c->t * w;
    assert_int_equal(mp_tensor_init(x, MP_F32, 3, (int64_t[]){c->b, c->t, w}, MP_MEM_OTHER), MP_OK);
    *xe = malloc((size_t)n * 8);
    test_rng r = {seed};
    for (int64_t i = 0; i < n; i++) {
        ((float *)x->data)[i] = (float)test_rng_uniform(&r, -1.5, 1.5);
        (*xe)[i] = ((float *)x->data)[i];
    }
}

/* ------------------------------------------------------------ parameters */

static void test_parameters(void **state)
{
    (void)state;
    const cfg c = {2, 5, 0, 12, 3, 4, 0, true};
    mp_model *m = make_model(&c, "mixed_bfloat16", 1);
    static const char *names[8] = {"mha.query.kernel",
                                   "mha.query.bias",
                                   "mha.key.kernel",
                                   "mha.key.bias",
                                   "mha.value.kernel",
                                   "mha.value.bias",
                                   "mha.attention_output.kernel",
                                   "mha.attention_output.bias"};
    assert_int_equal(mp_model_num_params(m), 8);
    for (int i = 0; i < 8; i++) {
        mp_model_param *p = mp_model_get_param(m, i);
        assert_string_equal(p->name, names[i]);
        assert_int_equal(p->role, i % 2 ? MP_ROLE_BIAS : MP_ROLE_KERNEL);
        assert_int_equal(p->weight_dtype, MP_BF16);
        const int64_t want[4][3] = {{12, 3, 4}, {3, 4, 0}, {3, 4, 12}, {12, 0, 0}};
        const int64_t *w = want[i == 6 ? 2 : i == 7 ? 3 : i % 2];
        assert_int_equal(p->ndim, i == 7 ? 1 : i % 2 ? 2 : 3);
        for (int d = 0; d < p->ndim; d++) assert_int_equal(p->shape[d], w[d]);
    }
    /* Keras's glorot fans for [12, 3, 4]: fan_in 3 * 12, fan_out 4 * 12 */
    mp_model *f = mp_model_new_with_policy(1, "float32");
    mp_node x = mp_input(f, 2, (int64_t[]){5, 12}, NULL);
    x = mp_multi_head_attention(f, x, &(mp_multi_head_attention_options){3, 4, true, true}, NULL);
    assert_int_equal(mp_model_build(f, x, 2), MP_OK);
    mp_model_param *q = mp_model_get_param(f, 0);
    assert_string_equal(q->name, "multi_head_attention.query.kernel");
    double limit = sqrt(6.0 / (36 + 48)), mx = 0;
    for (int64_t j = 0; j < q->n; j++) mx = fmax(mx, fabs(q->master[j]));
    assert_true(mx <= limit && mx > 0.8 * limit);
    mp_model_free(f);
    /* without biases: the four kernels */
    const cfg nb = {2, 5, 0, 12, 3, 4, 0, false};
    mp_model *n = make_model(&nb, "float32", 1);
    assert_int_equal(mp_model_num_params(n), 4);
    assert_string_equal(mp_model_get_param(n, 3)->name, "mha.attention_output.kernel");
    mp_model_free(n);
    mp_model_free(m);
}

/* --------------------------------------------------------------- forward */

static double worst_ratio[2];

static void check_forward(const cfg *c, const char *policy, double us, float *out_f32)
{
    mp_model *m = make_model(c, policy, 7);
    mp_tensor x;
    double *xe;
    random_x(c, 11, &x, &xe);
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(m, &x, false, &y), MP_OK);
    const int64_t n = c->b * c->t * c->e;
    assert_int_equal(mp_tensor_numel(y), n);
    assert_int_equal(y->dtype, !us ? MP_F32 : strstr(policy, "bfloat16") ? MP_BF16 : MP_F16);
    if (!strcmp(policy, "bfloat16")) { /* pure: biases bfloat16, widened for the GEMMs */
        mp_tensor dy;
        assert_int_equal(
            mp_tensor_init(&dy, MP_F32, 3, (int64_t[]){c->b, c->t, c->e}, MP_MEM_OTHER), MP_OK);
        for (int64_t i = 0; i < mp_tensor_numel(&dy); i++) ((float *)dy.data)[i] = 0.25f;
        assert_int_equal(mp_model_forward(m, &x, true, &y), MP_OK);
        assert_int_equal(mp_model_backward(m, &dy, false), MP_OK);
        for (int i = 0; i < mp_model_num_params(m); i++) {
            mp_model_param *p = mp_model_get_param(m, i);
            for (int64_t j = 0; j < p->n; j++) assert_true(isfinite(p->grad[j]));
        }
        mp_tensor_release(&dy);
    }
    float *got = malloc((size_t)n * 4);
    mp_convert(got, MP_F32, y->data, y->dtype, (size_t)n);
    double **P = params64(m), *ref = malloc((size_t)n * 8), *tol = malloc((size_t)n * 8);
    ref_model(c, P, xe, ref, tol, us);
    for (int64_t i = 0; i < n; i++) {
        if (!(fabs(got[i] - ref[i]) <= tol[i]))
            fail_msg("%s T %d E %d H %d D %d: y[%lld] = %.9g, float64 %.9g (tolerance %.3g)",
                     policy, (int)c->t, (int)c->e, (int)c->h, (int)c->d, (long long)i,
                     (double)got[i], ref[i], tol[i]);
        double r = fabs(got[i] - ref[i]) / tol[i];
        worst_ratio[us != 0] = fmax(worst_ratio[us != 0], r);
    }
    if (out_f32) memcpy(out_f32, got, (size_t)n * 4);
    /* the precision plan's saved bytes are what the forward took */
    size_t planned = 0;
    for (int i = 0; i < mp_model_num_layers(m); i++) {
        mp_layer_info li;
        assert_int_equal(mp_model_layer_info(m, i, c->b, &li), MP_OK);
        planned += li.saved_bytes;
    }
    assert_int_equal(planned, mp_model_activation_bytes(m));
    free_params(P, mp_model_num_params(m));
    free(got), free(ref), free(tol), free(xe);
    mp_tensor_release(&x);
    mp_model_free(m);
}

static void test_forward(void **state)
{
    (void)state;
    const cfg cases[] = {{2, 7, 0, 16, 2, 8, 0, true},  {1, 1, 0, 8, 1, 8, 0, true},
                         {2, 70, 0, 16, 4, 4, 0, true}, {1, 130, 0, 24, 2, 16, 0, false},
                         {2, 9, 0, 12, 3, 4, 1, true},  {2, 65, 0, 8, 2, 4, 3, true},
                         {1, 64, 0, 32, 1, 32, 0, true}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cfg c = cases[i];
        if (c.npre) c.e0 = 5;
        const int64_t n = c.b * c.t * c.e;
        float *f32 = malloc((size_t)n * 4), *bf16 = malloc((size_t)n * 4);
        check_forward(&c, "float32", 0, f32);
        check_forward(&c, "mixed_bfloat16", 0x1p-8, bf16);
        check_forward(&c, "bfloat16", 0x1p-8, NULL);
        check_forward(&c, "mixed_float16", 0x1p-11, NULL);
        free(f32), free(bf16);
    }
    print_message("largest error / bound: float32 %.3g, 16-bit policies %.3g\n", worst_ratio[0],
                  worst_ratio[1]);
}

/* A change to positions >= cut changes no output before cut (bit for bit),
 * under both policies, through the three-input form too. */
static void test_causal(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_bfloat16"};
    for (int pi = 0; pi < 2; pi++)
        for (int npre = 0; npre <= 3; npre += 3) {
            cfg c = {2, 80, 6, 16, 2, 8, npre, true};
            mp_model *m = make_model(&c, policies[pi], 3);
            mp_tensor x;
            double *xe;
            random_x(&c, 5, &x, &xe);
            const mp_tensor *y;
            assert_int_equal(mp_model_forward(m, &x, false, &y), MP_OK);
            const size_t row = (size_t)c.e * mp_dtype_size(y->dtype), n = (size_t)(c.b * c.t) * row;
            char *before = malloc(n);
            memcpy(before, y->data, n);
            const int64_t cut = 66, w = npre ? c.e0 : c.e;
            for (int64_t b = 0; b < c.b; b++)
                for (int64_t i = cut; i < c.t * w; i++)
                    if (i / w >= cut) ((float *)x.data)[b * c.t * w + i] *= -3.0f;
            assert_int_equal(mp_model_forward(m, &x, false, &y), MP_OK);
            for (int64_t b = 0; b < c.b; b++) {
                const char *p = before + (size_t)(b * c.t) * row,
                           *q = (const char *)y->data + (size_t)(b * c.t) * row;
                assert_memory_equal(p, q, (size_t)cut * row);
                assert_memory_not_equal(p + cut * row, q + cut * row, row);
            }
            free(before), free(xe);
            mp_tensor_release(&x);
            mp_model_free(m);
        }
}

/* -------------------------------------------------------------- gradients */

static double loss64(const cfg *c, double *const *P, const double *x, const double *r)
{
    const int64_t n = c->b * c->t * c->e;
    double *y = malloc((size_t)n * 8), l = 0;
    ref_model(c, P, x, y, NULL, 0);
    for (int64_t i = 0; i < n; i++) l += r[i] * y[i];
    free(y);
    return l;
}

/* For each parameter tensor (the Dense layers' ones carry the layer's input
 * gradient), the directional derivative along a random direction by
 * central differences of the float64 model (step 1e-4: truncation about
 * 1e-8 relative) against the float32 gradient: within 1e-4 of the sum of
 * |gradient * direction| (float32 chains of about T + E + H D roundings,
 * each u, with a margin of more than 10). */
static void test_gradients(void **state)
{
    (void)state;
    const cfg cases[] = {
        {2, 7, 5, 8, 2, 4, 1, true}, {2, 70, 5, 8, 2, 4, 3, true}, {1, 66, 4, 8, 1, 8, 1, false}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const cfg *c = &cases[ci];
        mp_model *m = make_model(c, "float32", 21);
        mp_tensor x, dy;
        double *xe;
        random_x(c, 23, &x, &xe);
        const int64_t n = c->b * c->t * c->e;
        assert_int_equal(
            mp_tensor_init(&dy, MP_F32, 3, (int64_t[]){c->b, c->t, c->e}, MP_MEM_OTHER), MP_OK);
        double *r = malloc((size_t)n * 8);
        test_rng rr = {29};
        for (int64_t i = 0; i < n; i++)
            r[i] = ((float *)dy.data)[i] = (float)test_rng_uniform(&rr, -1, 1);
        assert_int_equal(mp_model_forward(m, &x, true, NULL), MP_OK);
        assert_int_equal(mp_model_backward(m, &dy, false), MP_OK);
        double **P = params64(m);
        const int np = mp_model_num_params(m);
        double kernel_mag = 0; /* of the parameter before */
        for (int pi = 0; pi < np; pi++) {
            mp_model_param *p = mp_model_get_param(m, pi);
            double *dir = malloc((size_t)p->n * 8), *orig = malloc((size_t)p->n * 8);
            double analytic = 0, mag = 0;
            test_rng dr = {100 + (uint64_t)pi};
            for (int64_t j = 0; j < p->n; j++) {
                dir[j] = test_rng_uniform(&dr, -1, 1);
                orig[j] = P[pi][j];
                analytic += p->grad[j] * dir[j];
                mag += fabs(p->grad[j] * dir[j]);
            }
            const double h = 1e-4;
            for (int64_t j = 0; j < p->n; j++) P[pi][j] = orig[j] + h * dir[j];
            double lp = loss64(c, P, xe, r);
            for (int64_t j = 0; j < p->n; j++) P[pi][j] = orig[j] - h * dir[j];
            double lm = loss64(c, P, xe, r);
            memcpy(P[pi], orig, (size_t)p->n * 8);
            double fd = (lp - lm) / (2 * h);
            /* a bias's gradient sums the same pre-activation gradient as
             * its kernel's, whose magnitude bounds its rounding; and the
             * key's biases (of the key projection and of the Dense feeding
             * the key) add a constant to every score of a row, which the
             * softmax does not see: their exact gradient is 0 */
            if (p->role == MP_ROLE_BIAS) mag = fmax(mag, kernel_mag);
            kernel_mag = mag;
            if (!(fabs(fd - analytic) <= 1e-4 * mag + 1e-9))
                fail_msg("case %d, %s: finite differences %.9g, backward %.9g (magnitude %.3g)",
                         (int)ci, p->name, fd, analytic, mag);
            free(dir), free(orig);
        }
        free_params(P, np);
        free(r), free(xe);
        mp_tensor_release(&x);
        mp_tensor_release(&dy);
        mp_model_free(m);
    }
}

/* -------------------------------------------------------- config, files */

enum { SEQ = 10, VOCAB = 12, WIDTH = 8, CLASSES = 3, TB = 16 };

/* Input(int32, [SEQ]) -> Embedding -> MultiHeadAttention(2, 4) -> Flatten
 * -> Dense(3) -> softmax (float32); Adam when compiled. */
static mp_model *token_model(const char *policy, bool compile)
{
    mp_model *m = mp_model_new_with_policy(17, policy);
    assert_non_null(m);
    mp_node x = mp_input_ex(m, 1, (int64_t[]){SEQ}, MP_I32, NULL);
    x = mp_embedding(m, x, VOCAB, WIDTH, NULL);
    mp_multi_head_attention_options a = mp_multi_head_attention_options_default(2, 4);
    x = mp_multi_head_attention(m, x, &a, NULL);
    x = mp_flatten(m, x, NULL);
    x = mp_dense(m, x, CLASSES, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    assert_true(x >= 0);
    assert_int_equal(mp_model_build(m, x, TB), MP_OK);
    if (compile) {
        mp_compile_options co = mp_compile_options_default();
        co.optimizer.learning_rate = 1e-2f;
        assert_int_equal(mp_model_compile(m, &co), MP_OK);
    }
    return m;
}

/* label: how many of the earlier tokens equal the last one, capped at 2 */
static void token_batch(uint64_t step, int32_t *ids, int32_t *labels)
{
    test_rng r = {1000 + step};
    for (int i = 0; i < TB; i++) {
        int count = 0;
        for (int t = 0; t < SEQ; t++) ids[i * SEQ + t] = (int32_t)(test_rng_u32(&r) % VOCAB);
        for (int t = 0; t < SEQ - 1; t++) count += ids[i * SEQ + t] == ids[i * SEQ + SEQ - 1];
        labels[i] = count > 2 ? 2 : count;
    }
}

static void train_steps(mp_model *m, uint64_t from, uint64_t to)
{
    int32_t ids[TB * SEQ], labels[TB];
    mp_tensor x;
    mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){TB, SEQ}, ids);
    for (uint64_t s = from; s < to; s++) {
        token_batch(s, ids, labels);
        mp_step_result r;
        assert_int_equal(mp_model_train_step(m, &x, labels, NULL, &r), MP_OK);
        assert_true(r.applied);
    }
}

static void assert_same(mp_model *a, mp_model *b, const char *what)
{
    int32_t ids[TB * SEQ], labels[TB];
    token_batch(7, ids, labels);
    mp_tensor x;
    mp_tensor_wrap(&x, MP_I32, 2, (int64_t[]){TB, SEQ}, ids);
    const mp_tensor *ya, *yb;
    assert_int_equal(mp_model_forward(a, &x, false, &ya), MP_OK);
    assert_int_equal(mp_model_forward(b, &x, false, &yb), MP_OK);
    if (memcmp(ya->data, yb->data, TB * CLASSES * sizeof(float)))
        fail_msg("%s: outputs differ", what);
    assert_int_equal(mp_model_num_params(a), mp_model_num_params(b));
    for (int i = 0; i < mp_model_num_params(a); i++) {
        mp_model_param *p = mp_model_get_param(a, i), *q = mp_model_get_param(b, i);
        assert_string_equal(p->name, q->name);
        if (memcmp(p->master, q->master, (size_t)p->n * sizeof(float)))
            fail_msg("%s: parameter %s differs", what, p->name);
    }
    mp_optimizer *oa = mp_model_optimizer(a), *ob = mp_model_optimizer(b);
    if (!oa || !ob) return;
    assert_int_equal(mp_optimizer_step_count(oa), mp_optimizer_step_count(ob));
    for (int i = 0; i < mp_model_num_params(a); i++)
        for (int k = 0; k < mp_optimizer_num_slots(oa); k++) {
            int64_t n;
            float *u = mp_optimizer_slot(oa, i, k, &n), *v = mp_optimizer_slot(ob, i, k, NULL);
            if (memcmp(u, v, (size_t)n * sizeof *u))
                fail_msg("%s: optimizer slot %d of parameter %d differs", what, k, i);
        }
}

static void test_config_round_trip(void **state)
{
    (void)state;
    mp_model *m = token_model("mixed_bfloat16", false);
    char *json = mp_model_config_json(m);
    assert_non_null(json);
    const char *want[] = {"\"class_name\":\"MultiHeadAttention\"",
                          "\"num_heads\":2",
                          "\"key_dim\":4",
                          "\"value_dim\":4",
                          "\"use_bias\":true",
                          "\"use_causal_mask\":true",
                          "\"dropout\":0"};
    for (int i = 0; i < 7; i++)
        if (!strstr(json, want[i])) fail_msg("%s not in %s", want[i], json);
    mp_model *b;
    assert_int_equal(mp_model_from_config(json, TB, 1 << 20, &b), MP_OK);
    char *again = mp_model_config_json(b);
    assert_string_equal(json, again);
    free(again);
    assert_same(m, b, "config round trip");
    mp_model_free(b);
    const char *edits[][3] = {
        {"\"use_causal_mask\":true", "\"use_causal_mask\":false", "causal"},
        {"\"num_heads\":2", "\"num_heads\":0", "num_heads"},
        {"\"key_dim\":4", "\"key_dim\":\"4\"", "key_dim"},
        {"\"value_dim\":4", "\"value_dim\":8", "value_dim"},
        {"\"dropout\":0.0", "\"dropout\":0.1", "dropout"},
        {"\"use_bias\":true", "\"use_bias\":1", "use_bias"},
        {"\"num_heads\":2", "\"num_heads\":2,\"attention_axes\":[1]", "attention_axes"},
        {"\"num_heads\":2", "\"num_heads\":2,\"heads\":2", "heads"},
    };
    for (size_t k = 0; k < sizeof edits / sizeof edits[0]; k++) {
        const char *at = strstr(json, edits[k][0]);
        if (!at) fail_msg("edit %d: %s not in %s", (int)k, edits[k][0], json);
        size_t pre = (size_t)(at - json), len = strlen(json) + 128;
        char *bad = malloc(len);
        snprintf(bad, len, "%.*s%s%s", (int)pre, json, edits[k][1], at + strlen(edits[k][0]));
        b = NULL;
        assert_int_not_equal(mp_model_from_config(bad, TB, 1 << 20, &b), MP_OK);
        assert_null(b);
        if (!strstr(mp_last_error(), edits[k][2]))
            fail_msg("edit %d: message: %s", (int)k, mp_last_error());
        free(bad);
    }
    /* null value_dim (Keras's default) is key_dim */
    const char *at = strstr(json, "\"value_dim\":4");
    size_t len = strlen(json) + 16;
    char *nul = malloc(len);
    snprintf(nul, len, "%.*s\"value_dim\":null%s", (int)(at - json), json,
             at + strlen("\"value_dim\":4"));
    assert_int_equal(mp_model_from_config(nul, TB, 1 << 20, &b), MP_OK);
    mp_model_free(b);
    free(nul);
    free(json);
    mp_model_free(m);
}

/* 30 steps straight = 15 steps, checkpoint, load (and rebuild from the file
 * alone), 15 more; the task needs attention, and it learns. */
static void test_checkpoint_resumes_exactly(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_bfloat16"};
    for (int pi = 0; pi < 2; pi++) {
        char dir[64], path[128];
        assert_int_equal(test_scratch_dir(dir, sizeof dir, "mp_mha"), 0);
        snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
        mp_model *straight = token_model(policies[pi], true);
        train_steps(straight, 0, 30);
        mp_model *first = token_model(policies[pi], true);
        train_steps(first, 0, 15);
        assert_int_equal(mp_model_save_checkpoint(first, path, NULL), MP_OK);
        mp_model *loaded = token_model(policies[pi], false);
        assert_int_equal(mp_model_load_checkpoint(loaded, path, NULL), MP_OK);
        mp_model *rebuilt;
        assert_int_equal(mp_model_from_checkpoint(path, TB, &rebuilt, NULL), MP_OK);
        assert_same(first, rebuilt, "after rebuild");
        train_steps(loaded, 15, 30);
        train_steps(rebuilt, 15, 30);
        assert_same(straight, loaded, policies[pi]);
        assert_same(straight, rebuilt, policies[pi]);
        mp_model_free(straight), mp_model_free(first), mp_model_free(loaded);
        mp_model_free(rebuilt);
        test_remove_tree(dir);
    }
}

static void test_refusals(void **state)
{
    (void)state;
    mp_model *m = mp_model_new(1);
    mp_node x = mp_input(m, 1, (int64_t[]){8}, NULL);
    mp_multi_head_attention_options a = mp_multi_head_attention_options_default(2, 4);
    assert_int_equal(mp_multi_head_attention(m, x, &a, NULL), -1); /* [8]: no time axis */
    if (!strstr(mp_last_error(), "(None, T, model_dim)")) fail_msg("%s", mp_last_error());
    mp_model_free(m);
    m = mp_model_new(1);
    x = mp_input(m, 2, (int64_t[]){5, 8}, NULL);
    a.use_causal_mask = false;
    assert_int_equal(mp_multi_head_attention(m, x, &a, NULL), -1);
    if (!strstr(mp_last_error(), "causal")) fail_msg("%s", mp_last_error());
    mp_model_free(m);
    m = mp_model_new(1);
    x = mp_input(m, 2, (int64_t[]){5, 8}, NULL);
    mp_node d = mp_dense(m, x, 6, MP_ACT_NONE, NULL);
    a.use_causal_mask = true;
    assert_int_equal(mp_multi_head_attention_ex(m, 2, (mp_node[]){x, d}, &a, NULL), -1);
    if (!strstr(mp_last_error(), "one shape")) fail_msg("%s", mp_last_error());
    mp_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parameters),
        cmocka_unit_test(test_forward),
        cmocka_unit_test(test_causal),
        cmocka_unit_test(test_gradients),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_config_round_trip),
        cmocka_unit_test(test_checkpoint_resumes_exactly),
    };
    return cmocka_run_group_tests_name("multi_head_attention", tests, NULL, NULL);
}
