/* test_attention.c - the fused causal attention kernel against the plain
 * formula softmax(Q K^T / sqrt(d) + mask) V evaluated in float64 here, for
 * T in {1, 7, 64, 130} (130: a partial tile after two full ones), d in
 * {8, 16, 64}, 1, 2 and 4 heads, batch 1 and 2, float32/bfloat16/float16
 * inputs and outputs; backward against the analytic float64 gradient and
 * against central differences of the float64 loss sum(R * O); bit-identical
 * results for 1 and 2 threads and for the portable and AVX-512 product loops; a future key or value
 * never changes an earlier output; and the scratch it asks for does not grow with T.
 *
 * Forward tolerance (u = 2^-24, gamma_n = n u / (1 - n u)). Inputs are
 * rounded to their dtype first and the reference uses the rounded values,
 * so they are exact in float32. For query row i:
 *   - each score s_ij = (q_i . k_j) / sqrt(d) is a float32 dot product of d
 *     terms times a rounded scale: |s^ - s| <= e_ij = gamma_d * scale *
 *     sum |q k| + 3u |s| (sqrtf, the division and the product);
 *   - exp(s^ - m^) is taken after a rounded subtraction with expf (< 2u
 *     relative); the shift m^ is common to the row and cancels, so each
 *     weight p_ij carries a relative error of at most
 *     eps = expm1(E) (1 + 2u) + 2u, E = max_j e_ij + u (|s_ij - m| + 2 max e),
 *     plus, per tile boundary (nt of them), the rescale exp(m_old - m_new)
 *     of the earlier terms (2u + u * 2 max|s|): a perturbation of the
 *     weights of a convex combination by relative eps moves it by at most
 *     2 eps / (1 - eps) * max_j |v_j|;
 *   - the sums of the weights and of weights times values run over T terms
 *     and nt rescales: relative gamma_(T+nt) each, and the division 2u:
 *     together (2 gamma_(T+nt) + 2u) max |v|;
 *   - a low-precision output adds its unit roundoff times |o|.
 * So |o^ - o| <= max|v| (2 eps / (1 - eps) + 2 gamma_(T+nt) + 2u) + u_out |o|,
 * i.e. a small multiple of u (T + d) max|v|, plus the output rounding.
 *
 * Backward tolerance, built the same way per element: p_ij is recomputed
 * from the saved float32 log-sum-exp (relative error eps_p = the forward's
 * eps plus u (|s| + |lse|) + 3u); dP_ij = dO_i . v_j and D_i = dO_i . O_i
 * are d-term float32 dot products (gamma_d times the sums of |terms|);
 * dS_ij = p_ij (dP_ij - D_i) then carries e_dS = p (|dP - D| (eps_p + 2u) +
 * gamma_d (sum|dO v| + sum|dO O|)); dV_j = sum_i p_ij dO_i is within
 * (eps_p + gamma_T) sum_i p |dO|, dK_j = scale sum_i dS_ij q_i within
 * scale sum_i (e_dS + gamma_(T+1) |dS|) |q_i| + 3u |dK| (dQ likewise with
 * k_j). Each bound is doubled for the second-order terms it drops. The
 * reference takes D_i from the kernel's stored output O (rounded to the
 * output dtype), as the kernel does; the finite-difference test checks that
 * this is the true gradient in float32. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/attention.h"

static const double U = 0x1p-24;

static double gam(double n) { return n * U / (1 - n * U); }

static double unit_of(mp_dtype t) { return t == MP_F32 ? 0 : t == MP_BF16 ? 0x1p-8 : 0x1p-11; }
/* absolute rounding error of the smallest numbers (subnormal spacing / 2) */
static double tiny_of(mp_dtype t) { return t == MP_F16 ? 0x1p-25 : t == MP_BF16 ? 0x1p-134 : 0; }

/* Random values in [-a, a) rounded to dtype t: the typed array and its float64 copy. */
static void *random_in(mp_dtype t, int64_t n, uint64_t seed, double a, double **exact)
{
    test_rng r = {seed};
    float *f = calloc((size_t)n, sizeof *f);
    void *typed = malloc((size_t)n * 4 + 4);
    *exact = malloc((size_t)n * sizeof **exact);
    for (int64_t i = 0; i < n; i++) f[i] = (float)test_rng_uniform(&r, -a, a);
    mp_convert(typed, t, f, MP_F32, (size_t)n);
    mp_convert(f, MP_F32, typed, t, (size_t)n);
    for (int64_t i = 0; i < n; i++) (*exact)[i] = f[i];
    free(f);
    return typed;
}

static double *decode(const void *x, mp_dtype t, int64_t n)
{
    float *f = malloc((size_t)n * sizeof *f);
    double *e = malloc((size_t)n * sizeof *e);
    mp_convert(f, MP_F32, x, t, (size_t)n);
    for (int64_t i = 0; i < n; i++) e[i] = f[i];
    free(f);
    return e;
}

static int64_t at(const mp_attn_geom *g, int64_t b, int64_t h, int64_t i)
{
    return ((b * g->t + i) * g->heads + h) * g->d;
}

static double dot(const double *a, const double *b, int64_t d)
{
    double s = 0;
    for (int64_t k = 0; k < d; k++) s += a[k] * b[k];
    return s;
}
static double adot(const double *a, const double *b, int64_t d)
{
    double s = 0;
    for (int64_t k = 0; k < d; k++) s += fabs(a[k] * b[k]);
    return s;
}

/* Plain float64 formula: o (and, if tol, the forward bound per element). */
static void ref_forward(const mp_attn_geom *g, const double *q, const double *k, const double *v,
                        double *o, double *tol, double out_u)
{
    const int64_t T = g->t, d = g->d, nt = (T + MP_ATTN_TILE - 1) / MP_ATTN_TILE;
    const double scale = 1 / sqrt((double)d);
    double *s = malloc((size_t)T * sizeof *s), *e = malloc((size_t)T * sizeof *e);
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t h = 0; h < g->heads; h++)
            for (int64_t i = 0; i < T; i++) {
                const double *qi = q + at(g, b, h, i);
                double m = -INFINITY, emax = 0, smax = 0, vmax = 0, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    s[j] = scale * dot(qi, k + at(g, b, h, j), d);
                    e[j] = gam((double)d) * scale * adot(qi, k + at(g, b, h, j), d) +
                           3 * U * fabs(s[j]);
                    m = fmax(m, s[j]);
                    emax = fmax(emax, e[j]);
                    smax = fmax(smax, fabs(s[j]));
                    for (int64_t c = 0; c < d; c++) vmax = fmax(vmax, fabs(v[at(g, b, h, j) + c]));
                }
                double E = 0;
                for (int64_t j = 0; j <= i; j++)
                    E = fmax(E, e[j] + U * (fabs(s[j] - m) + 2 * emax));
                double eps = expm1(E) * (1 + 2 * U) + 2 * U + (double)nt * U * (2 + 2 * smax);
                double bound = vmax * (2 * eps / (1 - eps) + 2 * gam((double)(T + nt)) + 2 * U);
                double *oi = o + at(g, b, h, i);
                for (int64_t c = 0; c < d; c++) oi[c] = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double p = exp(s[j] - m);
                    sum += p;
                    for (int64_t c = 0; c < d; c++) oi[c] += p * v[at(g, b, h, j) + c];
                }
                for (int64_t c = 0; c < d; c++) {
                    oi[c] /= sum;
                    if (tol) tol[at(g, b, h, i) + c] = 2 * bound + out_u * (fabs(oi[c]) + bound);
                }
            }
    free(s);
    free(e);
}

/* Analytic float64 backward with D_i = dO_i . O_i from `o` (the kernel's
 * stored output), and the bounds described at the top. */
static void ref_backward(const mp_attn_geom *g, const double *q, const double *k, const double *v,
                         const double *o, const double *dout, double *dq, double *dk, double *dv,
                         double *tq, double *tk, double *tv)
{
    const int64_t T = g->t, d = g->d, n = g->batch * T * g->heads * d;
    const int64_t nt = (T + MP_ATTN_TILE - 1) / MP_ATTN_TILE;
    const double scale = 1 / sqrt((double)d);
    memset(dq, 0, (size_t)n * 8), memset(dk, 0, (size_t)n * 8), memset(dv, 0, (size_t)n * 8);
    memset(tq, 0, (size_t)n * 8), memset(tk, 0, (size_t)n * 8), memset(tv, 0, (size_t)n * 8);
    double *s = malloc((size_t)T * 8), *p = malloc((size_t)T * 8);
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t h = 0; h < g->heads; h++)
            for (int64_t i = 0; i < T; i++) {
                const double *qi = q + at(g, b, h, i), *doi = dout + at(g, b, h, i);
                double m = -INFINITY, sum = 0, emax = 0, smax = 0;
                for (int64_t j = 0; j <= i; j++) {
                    s[j] = scale * dot(qi, k + at(g, b, h, j), d);
                    emax = fmax(emax, gam((double)d) * scale * adot(qi, k + at(g, b, h, j), d) +
                                          3 * U * fabs(s[j]));
                    m = fmax(m, s[j]);
                    smax = fmax(smax, fabs(s[j]));
                }
                for (int64_t j = 0; j <= i; j++) sum += exp(s[j] - m);
                double lse = m + log(sum);
                double E = emax + U * (2 * smax + 2 * emax);
                double eps = expm1(E) * (1 + 2 * U) + 2 * U + (double)nt * U * (2 + 2 * smax);
                eps += gam((double)(T + nt)) + U * (smax + fabs(lse)) + 3 * U;
                double D = dot(doi, o + at(g, b, h, i), d), aD = adot(doi, o + at(g, b, h, i), d);
                for (int64_t j = 0; j <= i; j++) p[j] = exp(s[j] - lse);
                for (int64_t j = 0; j <= i; j++) {
                    const double *kj = k + at(g, b, h, j), *vj = v + at(g, b, h, j);
                    double dp = dot(doi, vj, d), ds = p[j] * (dp - D);
                    double eds = p[j] * (fabs(dp - D) * (eps + 2 * U) +
                                         gam((double)d) * (adot(doi, vj, d) + aD));
                    double wds = eds + gam((double)(T + 1)) * fabs(ds);
                    for (int64_t c = 0; c < d; c++) {
                        dv[at(g, b, h, j) + c] += p[j] * doi[c];
                        tv[at(g, b, h, j) + c] += (eps + gam((double)T)) * p[j] * fabs(doi[c]);
                        dk[at(g, b, h, j) + c] += scale * ds * qi[c];
                        tk[at(g, b, h, j) + c] += scale * wds * fabs(qi[c]);
                        dq[at(g, b, h, i) + c] += scale * ds * kj[c];
                        tq[at(g, b, h, i) + c] += scale * wds * fabs(kj[c]);
                    }
                }
            }
    for (int64_t i = 0; i < n; i++) {
        tq[i] = 2 * (tq[i] + 3 * U * fabs(dq[i])) + 1e-300;
        tk[i] = 2 * (tk[i] + 3 * U * fabs(dk[i])) + 1e-300;
        tv[i] = 2 * tv[i] + 1e-300;
    }
    free(s);
    free(p);
}

/* the largest error / tolerance seen, per check name, for the log */
static double worst_fwd[2], worst_bwd[2];

static void check(const void *got, mp_dtype t, const double *ref, const double *tol, int64_t n,
                  const char *what, const mp_attn_geom *g)
{
    double *e = decode(got, t, n), worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double lim = tol[i] + unit_of(t) * fabs(ref[i]) * 1.0000001 + tiny_of(t);
        if (!(fabs(e[i] - ref[i]) <= lim))
            fail_msg("%s (batch %d, T %d, heads %d, d %d, %s): element %lld is %.9g, want %.9g "
                     "(tolerance %.3g)",
                     what, (int)g->batch, (int)g->t, (int)g->heads, (int)g->d, mp_dtype_name(t),
                     (long long)i, e[i], ref[i], lim);
        worst = fmax(worst, fabs(e[i] - ref[i]) / lim);
    }
    free(e);
    double *w = strcmp(what, "forward") ? worst_bwd : worst_fwd;
    w[t != MP_F32] = fmax(w[t != MP_F32], worst);
}

typedef struct {
    mp_attn_geom g;
    int64_t n;
    void *q, *k, *v, *dout;
    double *qe, *ke, *ve, *doe;
} attn_case;

static attn_case make_case(int64_t batch, int64_t t, int64_t heads, int64_t d, mp_dtype ty,
                           uint64_t seed)
{
    attn_case c = {.g = {batch, t, heads, d}};
    c.n = batch * t * heads * d;
    /* q and k in [-2, 2) so that the softmax is far from uniform */
    c.q = random_in(ty, c.n, seed, 2, &c.qe);
    c.k = random_in(ty, c.n, seed + 1, 2, &c.ke);
    c.v = random_in(ty, c.n, seed + 2, 1, &c.ve);
    c.dout = random_in(ty, c.n, seed + 3, 1, &c.doe);
    return c;
}

static void free_case(attn_case *c)
{
    free(c->q), free(c->k), free(c->v), free(c->dout);
    free(c->qe), free(c->ke), free(c->ve), free(c->doe);
}

static void run_case(int64_t batch, int64_t t, int64_t heads, int64_t d, mp_dtype ty, bool grads)
{
    attn_case c = make_case(batch, t, heads, d, ty, (uint64_t)(batch * 1000 + t * 10 + d));
    const mp_attn_geom *g = &c.g;
    const int64_t n = c.n;
    void *o = malloc((size_t)n * 4);
    float *lse = malloc((size_t)(batch * heads * t) * sizeof *lse);
    double *ref = malloc((size_t)n * 8), *tol = malloc((size_t)n * 8);
    assert_int_equal(mp_attention_forward(g, c.q, ty, c.k, ty, c.v, ty, o, ty, lse), MP_OK);
    ref_forward(g, c.qe, c.ke, c.ve, ref, tol, 0);
    check(o, ty, ref, tol, n, "forward", g);
    if (grads) {
        double *oe = decode(o, ty, n);
        double *r[6];
        for (int i = 0; i < 6; i++) r[i] = malloc((size_t)n * 8);
        ref_backward(g, c.qe, c.ke, c.ve, oe, c.doe, r[0], r[1], r[2], r[3], r[4], r[5]);
        const mp_dtype outs[2] = {MP_F32, ty};
        for (int oi = 0; oi < (ty == MP_F32 ? 1 : 2); oi++) {
            mp_dtype gt = outs[oi];
            void *dq = malloc((size_t)n * 4), *dk = malloc((size_t)n * 4),
                 *dv = malloc((size_t)n * 4);
            assert_int_equal(mp_attention_backward(g, c.q, ty, c.k, ty, c.v, ty, o, ty, lse, c.dout,
                                                   ty, dq, dk, dv, gt),
                             MP_OK);
            check(dq, gt, r[0], r[3], n, "dq", g);
            check(dk, gt, r[1], r[4], n, "dk", g);
            check(dv, gt, r[2], r[5], n, "dv", g);
            free(dq), free(dk), free(dv);
        }
        for (int i = 0; i < 6; i++) free(r[i]);
        free(oe);
    }
    free(o), free(lse), free(ref), free(tol);
    free_case(&c);
}

static const int64_t Ts[] = {1, 7, 64, 130}, Ds[] = {8, 16, 64};

static void test_forward(void **state)
{
    (void)state;
    const mp_dtype types[] = {MP_F32, MP_BF16, MP_F16};
    for (int ty = 0; ty < 3; ty++)
        for (int ti = 0; ti < 4; ti++)
            for (int di = 0; di < 3; di++)
                for (int64_t heads = 1; heads <= 4; heads *= 2)
                    for (int64_t batch = 1; batch <= 2; batch++)
                        run_case(batch, Ts[ti], heads, Ds[di], types[ty], false);
    print_message("largest error / tolerance: float32 %.3g, bfloat16/float16 %.3g\n", worst_fwd[0],
                  worst_fwd[1]);
}

static void test_backward_analytic(void **state)
{
    (void)state;
    const mp_dtype types[] = {MP_F32, MP_BF16, MP_F16};
    for (int ty = 0; ty < 3; ty++)
        for (int ti = 0; ti < 4; ti++)
            for (int di = 0; di < 3; di++) {
                run_case(1, Ts[ti], 1, Ds[di], types[ty], true);
                if (types[ty] == MP_F32 || Ds[di] == 16)
                    run_case(2, Ts[ti], 4, Ds[di], types[ty], true);
            }
    print_message("largest error / tolerance: float32 %.3g, bfloat16/float16 %.3g\n", worst_bwd[0],
                  worst_bwd[1]);
}

/* The directional derivative of L = sum(R * O) along random (dq, dk, dv),
 * by central differences of the float64 formula (step 1e-4: truncation
 * about 1e-8 relative), against the kernel's float32 gradients with R as dO. */
static void test_backward_finite_differences(void **state)
{
    (void)state;
    const int64_t shapes[][4] = {{1, 7, 1, 8}, {2, 130, 2, 16}, {1, 64, 4, 64}, {1, 1, 2, 8}};
    for (int si = 0; si < 4; si++) {
        attn_case c = make_case(shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3], MP_F32,
                                77 + (uint64_t)si);
        const mp_attn_geom *g = &c.g;
        const int64_t n = c.n;
        float *o = malloc((size_t)n * 4), *lse = malloc((size_t)(g->batch * g->heads * g->t) * 4);
        float *dq = malloc((size_t)n * 4), *dk = malloc((size_t)n * 4), *dv = malloc((size_t)n * 4);
        assert_int_equal(
            mp_attention_forward(g, c.q, MP_F32, c.k, MP_F32, c.v, MP_F32, o, MP_F32, lse), MP_OK);
        assert_int_equal(mp_attention_backward(g, c.q, MP_F32, c.k, MP_F32, c.v, MP_F32, o, MP_F32,
                                               lse, c.dout, MP_F32, dq, dk, dv, MP_F32),
                         MP_OK);
        double *dir[3], *x[3] = {c.qe, c.ke, c.ve}, *xp[3];
        float *grad[3] = {dq, dk, dv};
        double analytic = 0, mag = 0;
        for (int a = 0; a < 3; a++) {
            void *unused = random_in(MP_F32, n, 500 + (uint64_t)a, 1, &dir[a]);
            free(unused);
            xp[a] = malloc((size_t)n * 8);
            for (int64_t i = 0; i < n; i++) {
                analytic += grad[a][i] * dir[a][i];
                mag += fabs(grad[a][i] * dir[a][i]);
            }
        }
        double *oo = malloc((size_t)n * 8), loss[2];
        const double step = 1e-4;
        for (int sgn = 0; sgn < 2; sgn++) {
            for (int a = 0; a < 3; a++)
                for (int64_t i = 0; i < n; i++)
                    xp[a][i] = x[a][i] + (sgn ? -step : step) * dir[a][i];
            ref_forward(g, xp[0], xp[1], xp[2], oo, NULL, 0);
            loss[sgn] = 0;
            for (int64_t i = 0; i < n; i++) loss[sgn] += c.doe[i] * oo[i];
        }
        double fd = (loss[0] - loss[1]) / (2 * step);
        if (!(fabs(fd - analytic) <= 1e-5 * mag + 1e-9))
            fail_msg("shape %d: finite differences %.9g, kernel %.9g (magnitude %.3g)", si, fd,
                     analytic, mag);
        for (int a = 0; a < 3; a++) free(dir[a]), free(xp[a]);
        free(oo), free(o), free(lse), free(dq), free(dk), free(dv);
        free_case(&c);
    }
}

/* A change to key/value rows after position i never changes outputs <= i. */
static void test_causal(void **state)
{
    (void)state;
    attn_case c = make_case(2, 130, 2, 16, MP_BF16, 9);
    const mp_attn_geom *g = &c.g;
    uint16_t *o1 = malloc((size_t)c.n * 2), *o2 = malloc((size_t)c.n * 2);
    assert_int_equal(
        mp_attention_forward(g, c.q, MP_BF16, c.k, MP_BF16, c.v, MP_BF16, o1, MP_BF16, NULL),
        MP_OK);
    const int64_t cut = 70; /* rows >= cut of k, v and q changed */
    for (int64_t b = 0; b < 2; b++)
        for (int64_t i = cut; i < g->t; i++)
            for (int64_t j = 0; j < g->heads * g->d; j++) {
                int64_t e = (b * g->t + i) * g->heads * g->d + j;
                ((uint16_t *)c.k)[e] ^= 0x4000, ((uint16_t *)c.v)[e] ^= 0x4000;
                ((uint16_t *)c.q)[e] ^= 0x8000;
            }
    assert_int_equal(
        mp_attention_forward(g, c.q, MP_BF16, c.k, MP_BF16, c.v, MP_BF16, o2, MP_BF16, NULL),
        MP_OK);
    for (int64_t b = 0; b < 2; b++) {
        size_t row = (size_t)(g->heads * g->d), off = (size_t)(b * g->t) * row;
        assert_memory_equal(o1 + off, o2 + off, (size_t)cut * row * 2);
        assert_memory_not_equal(o1 + off + cut * row, o2 + off + cut * row, row * 2);
    }
    free(o1), free(o2);
    free_case(&c);
}

/* threads 0: the library's default; scalar: the portable product loops
 * instead of the AVX-512 or AVX2 forms (mp_isa_set), which must give the
 * same bits. */
/* Each output is rounded once: o, dq, dk and dv written in bfloat16 or
 * float16 equal, bit for bit, mp_convert of the same call's float32
 * outputs (the kernel's own row rounding against the conversion kernels);
 * with a NaN in v, whose rows must come out quiet NaNs. */
static void test_outputs_rounded_once(void **state)
{
    (void)state;
    const mp_dtype types[] = {MP_BF16, MP_F16};
    for (int ty = 0; ty < 2; ty++) {
        const mp_dtype t = types[ty];
        attn_case c = make_case(2, 130, 2, 64, t, 41);
        const mp_attn_geom *g = &c.g;
        const int64_t n = c.n;
        const size_t es = mp_dtype_size(t);
        ((uint16_t *)c.v)[n - 5] = 0x7FC1; /* a NaN in the last key row (both types) */
        float *o32 = malloc((size_t)n * 4), *lse = malloc((size_t)(2 * 2 * 130) * 4);
        float *g32[3];
        void *o16 = malloc((size_t)n * es), *g16[3], *want = malloc((size_t)n * es);
        for (int i = 0; i < 3; i++) g32[i] = malloc((size_t)n * 4), g16[i] = malloc((size_t)n * es);
        assert_int_equal(mp_attention_forward(g, c.q, t, c.k, t, c.v, t, o32, MP_F32, lse), MP_OK);
        assert_int_equal(mp_attention_forward(g, c.q, t, c.k, t, c.v, t, o16, t, lse), MP_OK);
        mp_convert(want, t, o32, MP_F32, (size_t)n);
        assert_memory_equal(o16, want, (size_t)n * es);
        assert_int_equal(mp_attention_backward(g, c.q, t, c.k, t, c.v, t, o16, t, lse, c.dout, t,
                                               g32[0], g32[1], g32[2], MP_F32),
                         MP_OK);
        assert_int_equal(mp_attention_backward(g, c.q, t, c.k, t, c.v, t, o16, t, lse, c.dout, t,
                                               g16[0], g16[1], g16[2], t),
                         MP_OK);
        for (int i = 0; i < 3; i++) {
            mp_convert(want, t, g32[i], MP_F32, (size_t)n);
            if (memcmp(g16[i], want, (size_t)n * es))
                fail_msg("%s: %s rounded otherwise than its float32 result", mp_dtype_name(t),
                         i == 0   ? "dq"
                         : i == 1 ? "dk"
                                  : "dv");
            free(g32[i]), free(g16[i]);
        }
        free(o32), free(lse), free(o16), free(want);
        free_case(&c);
    }
}

static void run_config(int threads, bool scalar, const attn_case *c, mp_dtype ty, void *o,
                       float *lse, void *dq, void *dk, void *dv)
{
    mp_set_num_threads(threads);
    if (scalar) assert_int_equal(mp_isa_set(MP_ISA_SCALAR), MP_OK);
    assert_int_equal(mp_attention_forward(&c->g, c->q, ty, c->k, ty, c->v, ty, o, ty, lse), MP_OK);
    assert_int_equal(mp_attention_backward(&c->g, c->q, ty, c->k, ty, c->v, ty, o, ty, lse, c->dout,
                                           ty, dq, dk, dv, MP_F32),
                     MP_OK);
    mp_isa_reset();
    mp_set_num_threads(0);
}

/* The same bits on 1 and 2 threads, and with the portable product loops
 * on 2 threads, for head widths 16 (a tile's score rows 16 to 64 wide) and
 * 64. */
static void test_thread_count_and_isa_independent(void **state)
{
    (void)state;
    const mp_dtype types[] = {MP_F32, MP_BF16};
    const int64_t widths[] = {16, 64};
    for (int ty = 0; ty < 2; ty++)
        for (int wi = 0; wi < 2; wi++) {
            attn_case c = make_case(2, 200, 3, widths[wi], types[ty], 31);
            const int64_t n = c.n, nl = 2 * 3 * 200;
            void *buf[3][4];
            float *lse[3];
            for (int r = 0; r < 3; r++) {
                for (int i = 0; i < 4; i++) buf[r][i] = malloc((size_t)n * 4);
                lse[r] = malloc((size_t)nl * 4);
                run_config(r == 0 ? 1 : 2, r == 2, &c, types[ty], buf[r][0], lse[r], buf[r][1],
                           buf[r][2], buf[r][3]);
            }
            for (int r = 1; r < 3; r++) {
                assert_memory_equal(buf[0][0], buf[r][0], (size_t)n * mp_dtype_size(types[ty]));
                assert_memory_equal(lse[0], lse[r], (size_t)nl * 4);
                for (int i = 1; i < 4; i++)
                    assert_memory_equal(buf[0][i], buf[r][i], (size_t)n * 4);
            }
            for (int r = 0; r < 3; r++) {
                for (int i = 0; i < 4; i++) free(buf[r][i]);
                free(lse[r]);
            }
            free_case(&c);
        }
}

/* The kernel asks mp_scratch for mp_attention_forward_scratch_bytes(T, d)
 * per thread in forward (the tiles' and a head's key tiles) and
 * mp_attention_backward_scratch_bytes(T, d) (the tiles' and the head's dQ,
 * Q and dO rows, lse and D) in backward, and nothing else: with every larger
 * request failing it still runs at T = 4096 (a [T, T] float32 matrix per
 * head would be 64 MiB); with the limit one page below its request it
 * fails cleanly. */
static void test_scratch_linear(void **state)
{
    (void)state;
    const int64_t d = 16;
    const size_t bytes = mp_attention_scratch_bytes(d), page = 4096;
    const size_t fwd = mp_attention_forward_scratch_bytes(4096, d);
    const size_t limit = (fwd + page - 1) / page * page;
    const size_t bwd = mp_attention_backward_scratch_bytes(4096, d);
    /* linear in T: a head's key tiles, K^T and V (T x 16 floats each) */
    assert_true(fwd == bytes + (size_t)(2 * 4096 * d) * 4);
    /* 5 tiles of 64 x 16 floats, the P and dS tiles (64 x 64) and a row */
    assert_true(bytes < (size_t)64 * 1024);
    assert_true(mp_attention_scratch_bytes(64) < (size_t)160 * 1024);
    /* linear in T: the head's dQ, Q and dO rows (T x 16 floats each), its
     * lse and D (T floats each) and a row */
    assert_true(bwd == bytes + (size_t)(3 * 4096 * d + 2 * 4096 + d) * 4);
    attn_case c = make_case(1, 4096, 1, d, MP_BF16, 5);
    uint16_t *o = malloc((size_t)c.n * 2), *dq = malloc((size_t)c.n * 2),
             *dk = malloc((size_t)c.n * 2), *dv = malloc((size_t)c.n * 2);
    float *lse = malloc(4096 * 4);
    mp_scratch_fail_above = limit;
    mp_status s1 =
        mp_attention_forward(&c.g, c.q, MP_BF16, c.k, MP_BF16, c.v, MP_BF16, o, MP_BF16, lse);
    mp_scratch_fail_above = (bwd + page - 1) / page * page;
    mp_status s2 = mp_attention_backward(&c.g, c.q, MP_BF16, c.k, MP_BF16, c.v, MP_BF16, o, MP_BF16,
                                         lse, c.dout, MP_BF16, dq, dk, dv, MP_BF16);
    mp_scratch_fail_above = limit - page;
    mp_status s3 =
        mp_attention_forward(&c.g, c.q, MP_BF16, c.k, MP_BF16, c.v, MP_BF16, o, MP_BF16, lse);
    mp_scratch_fail_above = SIZE_MAX;
    assert_int_equal(s1, MP_OK);
    assert_int_equal(s2, MP_OK);
    assert_int_equal(s3, MP_ERR_NOMEM);
    assert_non_null(strstr(mp_last_error(), "attention forward"));
    free(o), free(dq), free(dk), free(dv), free(lse);
    free_case(&c);
}

/* A prefill's rows against the cache (mp_attention_decode_rows, the
 * forward's query tiles starting anywhere) are the forward's rows o, bit
 * for bit: the sequence in chunks of 1, 3, 37 (crossing tile edges at
 * other offsets than the forward's) and whole. */
static void check_decode_rows(const attn_case *c, mp_dtype it, mp_dtype ot, const char *o, int cfg)
{
    const int64_t t = c->g.t, heads = c->g.heads, d = c->g.d, row = heads * d;
    const size_t ie = mp_dtype_size(it), oe = mp_dtype_size(ot);
    char *got = malloc((size_t)(t * row) * oe);
    const int64_t chunks[] = {1, 3, 37, t};
    for (int ci = 0; ci < 4; ci++) {
        memset(got, 0xA5, (size_t)(t * row) * oe);
        for (int64_t first = 0; first < t; first += chunks[ci]) {
            const int64_t n = t - first < chunks[ci] ? t - first : chunks[ci];
            assert_int_equal(mp_attention_decode_rows(heads, d, (char *)c->q + first * row * ie,
                                                      c->k, c->v, it, first, n,
                                                      got + first * row * oe, ot),
                             MP_OK);
        }
        for (int64_t i = 0; i < t; i++)
            if (memcmp(got + i * row * oe, o + i * row * oe, row * oe))
                fail_msg("decode rows T %lld heads %lld d %lld %s -> %s, config %d, chunks of "
                         "%lld: position %lld differs from the forward's row",
                         (long long)t, (long long)heads, (long long)d, mp_dtype_name(it),
                         mp_dtype_name(ot), cfg, (long long)chunks[ci], (long long)i);
    }
    free(got);
}

/* Decoding one row against the cache (mp_attention_decode_row) gives, bit
 * for bit, the forward's row at that position: for every position of
 * sequences that end inside a key tile and cross two tile edges, head
 * widths 8 to 64, float32 and bfloat16, outputs in the inputs' dtype and in
 * float32; on 1 and 2 threads (a cache of 300 x 64 splits the heads between
 * threads) and with the portable loops on both sides. */
static void test_decode_matches_forward(void **state)
{
    (void)state;
    const int64_t shapes[][3] = {{5, 1, 8}, {70, 2, 16}, {130, 3, 64}, {300, 4, 64}};
    const mp_dtype types[] = {MP_F32, MP_BF16};
    for (int ty = 0; ty < 2; ty++)
        for (int si = 0; si < 4; si++)
            for (int cfg = 0; cfg < 3; cfg++) {
                const int64_t t = shapes[si][0], heads = shapes[si][1], d = shapes[si][2];
                const mp_dtype it = types[ty], ot = cfg == 2 ? MP_F32 : it;
                attn_case c = make_case(1, t, heads, d, it, (uint64_t)(77 + si + 10 * ty));
                const size_t ie = mp_dtype_size(it), oe = mp_dtype_size(ot), row = heads * d;
                char *o = malloc((size_t)c.n * oe), *got = malloc(row * oe);
                mp_set_num_threads(cfg == 1 ? 1 : 0);
                if (cfg == 2) assert_int_equal(mp_isa_set(MP_ISA_SCALAR), MP_OK);
                assert_int_equal(mp_attention_forward(&c.g, c.q, it, c.k, it, c.v, it, o, ot, NULL),
                                 MP_OK);
                for (int64_t i = 0; i < t; i++) {
                    assert_int_equal(mp_attention_decode_row(heads, d, (char *)c.q + i * row * ie,
                                                             c.k, c.v, it, i + 1, got, ot),
                                     MP_OK);
                    if (memcmp(got, o + i * row * oe, row * oe))
                        fail_msg("decode T %lld heads %lld d %lld %s -> %s, config %d: position "
                                 "%lld differs from the forward's row",
                                 (long long)t, (long long)heads, (long long)d, mp_dtype_name(it),
                                 mp_dtype_name(ot), cfg, (long long)i);
                }
                check_decode_rows(&c, it, ot, o, cfg);
                mp_isa_reset();
                mp_set_num_threads(0);
                free(o), free(got);
                free_case(&c);
            }
}

static void test_bad_arguments(void **state)
{
    (void)state;
    float x[8] = {0}, y[8], lse[1];
    mp_attn_geom bad[] = {{0, 1, 1, 8}, {1, 0, 1, 8}, {1, 1, 0, 8}, {1, 1, 1, 0}};
    for (int i = 0; i < 4; i++)
        assert_int_equal(
            mp_attention_forward(&bad[i], x, MP_F32, x, MP_F32, x, MP_F32, y, MP_F32, lse),
            MP_ERR_INVALID);
    mp_attn_geom g = {1, 1, 1, 8};
    assert_int_equal(mp_attention_forward(&g, NULL, MP_F32, x, MP_F32, x, MP_F32, y, MP_F32, lse),
                     MP_ERR_INVALID);
    assert_int_equal(mp_attention_backward(&g, x, MP_F32, x, MP_F32, x, MP_F32, x, MP_F32, NULL, x,
                                           MP_F32, y, y, y, MP_F32),
                     MP_ERR_INVALID);
    assert_int_equal(mp_attention_decode_row(1, 8, x, x, x, MP_F32, 0, y, MP_F32), MP_ERR_INVALID);
    assert_int_equal(mp_attention_decode_row(1, 8, x, NULL, x, MP_F32, 1, y, MP_F32),
                     MP_ERR_INVALID);
    assert_int_equal(mp_attention_decode_rows(1, 8, x, x, x, MP_F32, -1, 1, y, MP_F32),
                     MP_ERR_INVALID);
    assert_int_equal(mp_attention_decode_rows(1, 8, x, x, x, MP_F32, 0, 0, y, MP_F32),
                     MP_ERR_INVALID);
    mp_scratch_fail_above = 0;
    assert_int_equal(mp_attention_decode_row(1, 8, x, x, x, MP_F32, 1, y, MP_F32), MP_ERR_NOMEM);
    mp_scratch_fail_above = SIZE_MAX;
    assert_non_null(strstr(mp_last_error(), "attention decode"));
    /* T = 1: the output is v itself */
    for (int i = 0; i < 8; i++) x[i] = (float)i - 3.5f;
    assert_int_equal(mp_attention_forward(&g, x, MP_F32, x, MP_F32, x, MP_F32, y, MP_F32, lse),
                     MP_OK);
    assert_memory_equal(x, y, sizeof x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_forward),
        cmocka_unit_test(test_backward_analytic),
        cmocka_unit_test(test_backward_finite_differences),
        cmocka_unit_test(test_causal),
        cmocka_unit_test(test_outputs_rounded_once),
        cmocka_unit_test(test_thread_count_and_isa_independent),
        cmocka_unit_test(test_scratch_linear),
        cmocka_unit_test(test_decode_matches_forward),
    };
    return cmocka_run_group_tests_name("attention", tests, NULL, NULL);
}
