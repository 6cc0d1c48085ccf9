/* test_conv_layers.c - the image layers (Conv2D, DepthwiseConv2D,
 * MaxPooling2D, AveragePooling2D, GlobalAveragePooling2D, ZeroPadding2D)
 * against float64 references written here with direct loops: forward,
 * and the input and parameter gradients from analytic float64 formulas,
 * themselves checked by directional central differences of the float64
 * loss L = sum r * y. Shapes cover strides 1 and 2, both paddings (Keras's
 * asymmetric `same`), kernels 1/3/5 and even ones, dilation, odd sizes and
 * batch 1. Then: mixed_bfloat16 / mixed_float16 against float32 within
 * bounds derived from the compute dtype's unit roundoff, exact activation
 * memory plans, results independent of the thread count, the config round
 * trip and its refusals (naming the field), shape refusals at creation
 * (naming the layer, allocating nothing), out-of-scratch failures, a small
 * CNN that learns, and its checkpoint resumed bit for bit.
 *
 * Tolerances (u = 2^-24, gamma_K = K u / (1 - K u), Higham 3.1): a sum of K
 * float32-rounded products or terms in any order is within gamma_K times
 * the sum of their absolute values of the exact sum. Each check below says
 * which K; inputs and parameters are float32 values that the float64
 * reference uses exactly, so only the layer's arithmetic enters. */
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

#define U32 0x1p-24

static double gam(double k) { return k * U32 / (1 - k * U32); }

/* ------------------------------------------------------------ cases */

enum { CONV, DW, MAXP, AVGP, GAP, PAD };
static const char *const kind_name[] = {
    "Conv2D",           "DepthwiseConv2D",        "MaxPooling2D",
    "AveragePooling2D", "GlobalAveragePooling2D", "ZeroPadding2D"};

typedef struct {
    int kind;
    int64_t n, h, w, c;
    int64_t kh, kw, o; /* window; o: Conv2D's filters */
    int64_t sh, sw, dh, dw;
    bool same, bias;
    mp_activation act;
    int64_t pad[4]; /* ZeroPadding2D: top, bottom, left, right */
} lcase;

/* Output geometry as Keras documents it: valid, out = (in - span) / s + 1;
 * same, out = ceil(in / s) with max((out - 1) s + span - in, 0) padding, the
 * smaller half before. */
typedef struct {
    int64_t oh, ow, oc, pt, pl;
} rgeom;

static int64_t ref_size(int64_t in, int64_t k, int64_t s, int64_t d, bool same, int64_t *before)
{
    const int64_t span = (k - 1) * d + 1;
    if (!same) {
        *before = 0;
        return (in - span) / s + 1;
    }
    const int64_t out = (in + s - 1) / s, total = (out - 1) * s + span - in;
    *before = total > 0 ? total / 2 : 0;
    return out;
}

static rgeom geom_of(const lcase *k)
{
    rgeom g = {1, 1, k->c, 0, 0};
    if (k->kind == PAD) {
        g = (rgeom){k->h + k->pad[0] + k->pad[1], k->w + k->pad[2] + k->pad[3], k->c, k->pad[0],
                    k->pad[2]};
    } else if (k->kind != GAP) {
        g.oh = ref_size(k->h, k->kh, k->sh, k->dh, k->same, &g.pt);
        g.ow = ref_size(k->w, k->kw, k->sw, k->dw, k->same, &g.pl);
        g.oc = k->kind == CONV ? k->o : k->c;
    }
    return g;
}

static int64_t n_in(const lcase *k) { return k->n * k->h * k->w * k->c; }
static int64_t n_out(const lcase *k, const rgeom *g) { return k->n * g->oh * g->ow * g->oc; }
static int64_t n_kernel(const lcase *k)
{
    return k->kind == CONV ? k->kh * k->kw * k->c * k->o : k->kind == DW ? k->kh * k->kw * k->c : 0;
}
static int64_t n_bias(const lcase *k)
{
    return (k->kind == CONV || k->kind == DW) && k->bias ? (k->kind == CONV ? k->o : k->c) : 0;
}

static const char *describe(const lcase *k)
{
    static char buf[160];
    snprintf(buf, sizeof buf, "%s %lldx%lldx%lldx%lld k%lldx%lld s%lldx%lld d%lldx%lld %s %s",
             kind_name[k->kind], (long long)k->n, (long long)k->h, (long long)k->w, (long long)k->c,
             (long long)k->kh, (long long)k->kw, (long long)k->sh, (long long)k->sw,
             (long long)k->dh, (long long)k->dw, k->same ? "same" : "valid",
             mp_activation_name(k->act));
    return buf;
}

/* ------------------------------------------------------ the reference */

static double act64(mp_activation a, double z)
{
    switch (a) {
    case MP_ACT_RELU:
        return z > 0 ? z : 0;
    case MP_ACT_GELU:
        return 0.5 * z * (1 + erf(z / sqrt(2.0)));
    default:
        return z;
    }
}

static double act64_d(mp_activation a, double z)
{
    switch (a) {
    case MP_ACT_RELU:
        return z > 0 ? 1 : 0;
    case MP_ACT_GELU:
        return 0.5 * (1 + erf(z / sqrt(2.0))) + z * exp(-0.5 * z * z) / sqrt(2 * M_PI);
    default:
        return 1;
    }
}

/* Visit the window entries (a, e) of output pixel (i, j) that lie inside
 * the image, as (ih, iw). */
#define FOR_WINDOW(k, g, i, j)                                                                     \
    for (int64_t a = 0; a < (k)->kh; a++)                                                          \
        for (int64_t e = 0; e < (k)->kw; e++)                                                      \
            for (int64_t ih = (i) * (k)->sh - (g)->pt + a * (k)->dh,                               \
                         iw = (j) * (k)->sw - (g)->pl + e * (k)->dw, once = 1;                     \
                 once; once = 0)                                                                   \
                if (ih >= 0 && ih < (k)->h && iw >= 0 && iw < (k)->w)

static int64_t xidx(const lcase *k, int64_t n, int64_t i, int64_t j, int64_t c)
{
    return ((n * k->h + i) * k->w + j) * k->c + c;
}

/* One float64 forward: z (pre-activation), y, and per output the sum of
 * the absolute values of its terms (mag) and how many there are (terms);
 * for max pooling the input index of the first maximum. */
typedef struct {
    double *z, *y, *mag;
    int64_t *terms, *arg;
} ref_out;

static void ref_forward(const lcase *k, const double *x, const double *w, const double *b,
                        ref_out *r)
{
    const rgeom g = geom_of(k);
    for (int64_t n = 0; n < k->n; n++)
        for (int64_t i = 0; i < g.oh; i++)
            for (int64_t j = 0; j < g.ow; j++)
                for (int64_t o = 0; o < g.oc; o++) {
                    const int64_t yi = ((n * g.oh + i) * g.ow + j) * g.oc + o;
                    double s = 0, mag = 0;
                    int64_t cnt = 0, arg = -1;
                    if (k->kind == CONV || k->kind == DW) {
                        s = b ? b[o] : 0;
                        mag = fabs(s);
                        FOR_WINDOW(k, &g, i, j)
                        {
                            for (int64_t c = 0; c < k->c; c++) {
                                if (k->kind == DW && c != o) continue;
                                double t =
                                    k->kind == CONV
                                        ? x[xidx(k, n, ih, iw, c)] *
                                              w[((a * k->kw + e) * k->c + c) * k->o + o]
                                        : x[xidx(k, n, ih, iw, c)] * w[(a * k->kw + e) * k->c + c];
                                s += t;
                                mag += fabs(t);
                            }
                        }
                        cnt = k->kind == CONV ? k->kh * k->kw * k->c : k->kh * k->kw;
                    } else if (k->kind == MAXP || k->kind == AVGP) {
                        FOR_WINDOW(k, &g, i, j)
                        {
                            const int64_t xi = xidx(k, n, ih, iw, o);
                            if (arg < 0 || x[xi] > x[arg]) arg = xi;
                            s += x[xi];
                            mag += fabs(x[xi]);
                            cnt++;
                        }
                        if (k->kind == MAXP) {
                            s = x[arg];
                            mag = 0;
                        } else {
                            s /= (double)cnt;
                            mag /= (double)cnt;
                        }
                    } else if (k->kind == GAP) {
                        for (int64_t ih = 0; ih < k->h; ih++)
                            for (int64_t iw = 0; iw < k->w; iw++) {
                                s += x[xidx(k, n, ih, iw, o)];
                                mag += fabs(x[xidx(k, n, ih, iw, o)]);
                            }
                        cnt = k->h * k->w;
                        s /= (double)cnt;
                        mag /= (double)cnt;
                    } else { /* PAD */
                        const int64_t ih = i - g.pt, iw = j - g.pl;
                        if (ih >= 0 && ih < k->h && iw >= 0 && iw < k->w)
                            s = x[xidx(k, n, ih, iw, o)];
                    }
                    r->z[yi] = s;
                    r->y[yi] = act64(k->act, s);
                    r->mag[yi] = mag;
                    r->terms[yi] = cnt;
                    if (r->arg) r->arg[yi] = arg;
                }
}

/* Forward tolerance of element yi of a float32 layer:
 *   Conv2D        gamma_{K+1} mag, K = kh kw c products (the GEMM's depth),
 *                 plus the bias added in the epilogue;
 *   Depthwise     gamma_{kh kw + 1} mag, the same in the direct loops;
 *   AveragePool   gamma_{count} mag: count - 1 additions and the division;
 *   GlobalAverage float64 sums (count 2^-53 relative) and one rounding to
 *                 float32: u |y| + count 2^-52 mag;
 *   MaxPool, ZeroPadding: exact.
 * Relu is 1-Lipschitz and exact in float32. For gelu the layer rounds the
 * pre-activation (ztol), then computes 0.5 z (1 + erff(z / sqrt 2)) in
 * float32: the argument z * fl(1/sqrt 2) carries 2u relative, which moves
 * erf by at most 2/sqrt(pi) 2u |z| / sqrt 2 < 1.6 u |z|, erff errs by at
 * most one ulp (2u), the sum with 1 by u |1 + erf| <= 2u, so 0.5 |z| (4u +
 * 1.6u |z|) before the product's own u |y|; gelu' <= 1.13 carries ztol. We
 * allow twice that (second-order terms). */
static double ztol_of(const lcase *k, const ref_out *r, int64_t yi)
{
    switch (k->kind) {
    case CONV:
    case DW:
        return gam((double)r->terms[yi] + 1) * r->mag[yi];
    case AVGP:
        return gam((double)r->terms[yi]) * r->mag[yi];
    case GAP:
        return U32 * fabs(r->z[yi]) + (double)r->terms[yi] * 0x1p-52 * r->mag[yi];
    default:
        return 0;
    }
}

static double ytol_of(const lcase *k, const ref_out *r, int64_t yi)
{
    const double zt = ztol_of(k, r, yi), z = fabs(r->z[yi]);
    if (k->act != MP_ACT_GELU) return zt;
    return 2 * (1.13 * zt + 0.5 * z * (4 * U32 + 1.6 * U32 * z) + U32 * fabs(r->y[yi]));
}

/* Analytic float64 gradients of L = sum dy * y for the layer's inputs, with
 * per element the sum of absolute values of the terms (m*) and the bound
 * on what the layer's dz = dy act'(z) may differ from the reference's (e*):
 *   linear: dz = dy exactly;
 *   relu:   dz is dy or 0 by the sign of z; where |z| is within the forward
 *           tolerance the layer may see either sign, so the reference takes
 *           dy / 2 with uncertainty |dy| / 2;
 *   gelu:   the layer evaluates act' in float32 at its rounded z: |gelu''|
 *           <= 0.8 carries ztol, and erff, expf and the five roundings of
 *           0.5 (1 + erf) + z phi(z) add at most (8 + |z|) u; the product
 *           with dy one more u |dz|. */
typedef struct {
    double *dx, *dw, *db;
    double *mdx, *mdw, *mdb; /* sums of |terms| */
    double *edx, *edw, *edb; /* propagated uncertainty of dz */
} ref_grad;

static void ref_backward(const lcase *k, const double *x, const double *w, const ref_out *r,
                         const double *dy, ref_grad *gr)
{
    const rgeom g = geom_of(k);
    const int64_t nx = n_in(k), nw = n_kernel(k), nb = n_bias(k);
    double *arrays[3][3] = {
        {gr->dx, gr->mdx, gr->edx}, {gr->dw, gr->mdw, gr->edw}, {gr->db, gr->mdb, gr->edb}};
    const int64_t lens[3] = {nx, nw, nb};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            if (arrays[a][b]) memset(arrays[a][b], 0, (size_t)lens[a] * sizeof(double));
    for (int64_t n = 0; n < k->n; n++)
        for (int64_t i = 0; i < g.oh; i++)
            for (int64_t j = 0; j < g.ow; j++)
                for (int64_t o = 0; o < g.oc; o++) {
                    const int64_t yi = ((n * g.oh + i) * g.ow + j) * g.oc + o;
                    const double d = dy[yi], z = r->z[yi], zt = ztol_of(k, r, yi);
                    double dz = d * act64_d(k->act, z), dzt = 0;
                    if (k->act == MP_ACT_RELU && fabs(z) <= zt) {
                        dz = d / 2;
                        dzt = fabs(d) / 2;
                    } else if (k->act == MP_ACT_GELU) {
                        dzt = fabs(d) * (0.8 * zt + (8 + fabs(z)) * U32) + U32 * fabs(dz);
                    }
                    if (k->kind == CONV || k->kind == DW) {
                        if (nb) {
                            gr->db[o] += dz;
                            gr->mdb[o] += fabs(dz);
                            gr->edb[o] += dzt;
                        }
                        FOR_WINDOW(k, &g, i, j)
                        {
                            for (int64_t c = 0; c < k->c; c++) {
                                if (k->kind == DW && c != o) continue;
                                const int64_t xi = xidx(k, n, ih, iw, c);
                                const int64_t wi = k->kind == CONV
                                                       ? ((a * k->kw + e) * k->c + c) * k->o + o
                                                       : (a * k->kw + e) * k->c + c;
                                gr->dx[xi] += dz * w[wi];
                                gr->mdx[xi] += fabs(dz * w[wi]);
                                gr->edx[xi] += dzt * fabs(w[wi]);
                                gr->dw[wi] += dz * x[xi];
                                gr->mdw[wi] += fabs(dz * x[xi]);
                                gr->edw[wi] += dzt * fabs(x[xi]);
                            }
                        }
                    } else if (k->kind == MAXP) {
                        gr->dx[r->arg[yi]] += d;
                        gr->mdx[r->arg[yi]] += fabs(d);
                    } else if (k->kind == AVGP) {
                        const double cnt = (double)r->terms[yi];
                        FOR_WINDOW(k, &g, i, j)
                        {
                            gr->dx[xidx(k, n, ih, iw, o)] += d / cnt;
                            gr->mdx[xidx(k, n, ih, iw, o)] += fabs(d) / cnt;
                        }
                    } else if (k->kind == GAP) {
                        const double hw = (double)(k->h * k->w);
                        for (int64_t ih = 0; ih < k->h; ih++)
                            for (int64_t iw = 0; iw < k->w; iw++) {
                                gr->dx[xidx(k, n, ih, iw, o)] += d / hw;
                                gr->mdx[xidx(k, n, ih, iw, o)] += fabs(d) / hw;
                            }
                    } else { /* PAD */
                        const int64_t ih = i - g.pt, iw = j - g.pl;
                        if (ih >= 0 && ih < k->h && iw >= 0 && iw < k->w) {
                            gr->dx[xidx(k, n, ih, iw, o)] = d;
                            gr->mdx[xidx(k, n, ih, iw, o)] = fabs(d);
                        }
                    }
                }
}

/* L = sum r * y of the float64 layer. */
static double ref_loss(const lcase *k, const double *x, const double *w, const double *b,
                       const double *r)
{
    const rgeom g = geom_of(k);
    const int64_t ny = n_out(k, &g);
    ref_out o = {malloc((size_t)ny * sizeof(double)), malloc((size_t)ny * sizeof(double)),
                 malloc((size_t)ny * sizeof(double)), malloc((size_t)ny * sizeof(int64_t)),
                 k->kind == MAXP ? malloc((size_t)ny * sizeof(int64_t)) : NULL};
    ref_forward(k, x, w, b, &o);
    double loss = 0;
    for (int64_t i = 0; i < ny; i++) loss += r[i] * o.y[i];
    free(o.z);
    free(o.y);
    free(o.mag);
    free(o.terms);
    free(o.arg);
    return loss;
}

/* The analytic gradient g of L with respect to v (n values) along a random
 * direction against the central difference (L(v + h d) - L(v - h d)) / 2h,
 * h = 1e-6. L is piecewise linear here (or smooth, gelu) so truncation is
 * nil or ~h^2 |L'''|; rounding is ~2^-53 sum |r y| / h ~ 1e-9 for these
 * sizes. Agreement to 1e-6 (1 + sum |g d|) checks the formulas, not the
 * arithmetic. */
static void fd_check(const lcase *k, double *x, double *w, double *b, const double *r, double *v,
                     const double *g, int64_t n, uint64_t seed, const char *what)
{
    test_rng rng = {seed};
    double *v0 = malloc((size_t)n * sizeof *v0), *dir = malloc((size_t)n * sizeof *dir);
    memcpy(v0, v, (size_t)n * sizeof *v0);
    double want = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        dir[i] = test_rng_uniform(&rng, -1, 1);
        want += g[i] * dir[i];
        scale += fabs(g[i] * dir[i]);
    }
    const double h = 1e-6;
    for (int64_t i = 0; i < n; i++) v[i] = v0[i] + h * dir[i];
    double lp = ref_loss(k, x, w, b, r);
    for (int64_t i = 0; i < n; i++) v[i] = v0[i] - h * dir[i];
    double lm = ref_loss(k, x, w, b, r);
    memcpy(v, v0, (size_t)n * sizeof *v0);
    double fd = (lp - lm) / (2 * h);
    if (!(fabs(fd - want) <= 1e-6 * (1 + scale)))
        fail_msg("%s: analytic %s along a direction %.12g, central difference %.12g", describe(k),
                 what, want, fd);
    free(v0);
    free(dir);
}

/* -------------------------------------------------------- the layers */

static mp_model_param *param(mp_model *m, const char *name)
{
    for (int i = 0; i < mp_model_num_params(m); i++)
        if (!strcmp(mp_model_get_param(m, i)->name, name)) return mp_model_get_param(m, i);
    return NULL;
}

static float *random_f32(int64_t n, uint64_t seed, double lo, double hi)
{
    test_rng r = {seed};
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = (float)test_rng_uniform(&r, lo, hi);
    return p;
}

static float *copy_f32(const float *p, int64_t n)
{
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    memcpy(f, p, (size_t)n * sizeof *f);
    return f;
}

static double *widen(const float *p, int64_t n)
{
    double *d = malloc((size_t)(n ? n : 1) * sizeof *d);
    for (int64_t i = 0; i < n; i++) d[i] = p[i];
    return d;
}

/* All of a tensor as float32. */
static float *decode(const mp_tensor *t)
{
    int64_t n = mp_tensor_numel(t);
    float *f = malloc((size_t)n * sizeof *f);
    mp_convert(f, MP_F32, t->data, t->dtype, (size_t)n);
    return f;
}

/* v rounded to dtype t and back. */
static double round_to(mp_dtype t, double v)
{
    float f = (float)v, r;
    uint8_t buf[4];
    mp_convert(buf, t, &f, MP_F32, 1);
    mp_convert(&r, MP_F32, buf, t, 1);
    return r;
}

static mp_padding padding_of(const lcase *k)
{
    return k->same ? MP_PADDING_SAME : MP_PADDING_VALID;
}

/* Layer k named `name` reading x, through the public constructors. */
static mp_node add_layer(mp_model *m, mp_node x, const lcase *k, const char *name)
{
    const mp_layer_options o = {.name = name};
    switch (k->kind) {
    case CONV: {
        mp_conv2d_options c = mp_conv2d_options_default(k->o, k->kh, k->kw);
        c.strides[0] = k->sh, c.strides[1] = k->sw;
        c.dilation_rate[0] = k->dh, c.dilation_rate[1] = k->dw;
        c.padding = padding_of(k), c.use_bias = k->bias, c.activation = k->act;
        return mp_conv2d(m, x, &c, &o);
    }
    case DW: {
        mp_depthwise_conv2d_options c = mp_depthwise_conv2d_options_default(k->kh, k->kw);
        c.strides[0] = k->sh, c.strides[1] = k->sw;
        c.dilation_rate[0] = k->dh, c.dilation_rate[1] = k->dw;
        c.padding = padding_of(k), c.use_bias = k->bias, c.activation = k->act;
        return mp_depthwise_conv2d(m, x, &c, &o);
    }
    case MAXP:
    case AVGP: {
        mp_pooling2d_options p = {{k->kh, k->kw}, {k->sh, k->sw}, padding_of(k)};
        return k->kind == MAXP ? mp_max_pooling2d(m, x, &p, &o)
                               : mp_average_pooling2d(m, x, &p, &o);
    }
    case GAP:
        return mp_global_average_pooling2d(m, x, &o);
    default:
        return mp_zero_padding2d(m, x, k->pad[0], k->pad[1], k->pad[2], k->pad[3], &o);
    }
}

/* Input [h, w, c] -> Activation linear "pre" (its gradient is the layer's
 * input gradient) -> the layer "L". */
static mp_model *case_model(const lcase *k, const char *policy, mp_node *pre)
{
    mp_model *m = mp_model_new_with_policy(11, policy);
    mp_node x = mp_input(m, 3, (int64_t[]){k->h, k->w, k->c}, NULL);
    *pre = mp_activation_layer(m, x, MP_ACT_NONE, &(mp_layer_options){.name = "pre"});
    mp_node y = add_layer(m, *pre, k, "L");
    if (y < 0) fail_msg("%s: %s", describe(k), mp_last_error());
    assert_int_equal(mp_model_build(m, y, k->n), MP_OK);
    return m;
}

/* One case's data (float32, and the same values in float64) and its float64
 * reference forward and gradients. */
typedef struct {
    float *x, *w, *b, *dy;
    double *xd, *wd, *bd, *dyd;
    ref_out r;
    ref_grad g;
} case_data;

static double *zeros(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(double)); }

static void reference(const lcase *k, case_data *d)
{
    const rgeom g = geom_of(k);
    const int64_t nx = n_in(k), ny = n_out(k, &g), nw = n_kernel(k), nb = n_bias(k);
    d->r = (ref_out){malloc((size_t)ny * 8), malloc((size_t)ny * 8), malloc((size_t)ny * 8),
                     malloc((size_t)ny * 8), k->kind == MAXP ? malloc((size_t)ny * 8) : NULL};
    d->g = (ref_grad){zeros(nx), zeros(nw), zeros(nb), zeros(nx), zeros(nw),
                      zeros(nb), zeros(nx), zeros(nw), zeros(nb)};
    ref_forward(k, d->xd, d->wd, nb ? d->bd : NULL, &d->r);
    ref_backward(k, d->xd, d->wd, &d->r, d->dyd, &d->g);
}

static void case_data_init(const lcase *k, uint64_t seed, case_data *d)
{
    const rgeom g = geom_of(k);
    const int64_t nx = n_in(k), ny = n_out(k, &g), nw = n_kernel(k), nb = n_bias(k);
    d->x = random_f32(nx, seed, -1, 1);
    d->w = random_f32(nw, seed + 1, -0.5, 0.5);
    d->b = random_f32(nb, seed + 2, -0.5, 0.5);
    d->dy = random_f32(ny, seed + 3, -1, 1);
    d->xd = widen(d->x, nx), d->wd = widen(d->w, nw), d->bd = widen(d->b, nb);
    d->dyd = widen(d->dy, ny);
    reference(k, d);
}

static void case_data_free(case_data *d)
{
    free(d->x), free(d->w), free(d->b), free(d->dy);
    free(d->xd), free(d->wd), free(d->bd), free(d->dyd);
    free(d->r.z), free(d->r.y), free(d->r.mag), free(d->r.terms), free(d->r.arg);
    double *g[] = {d->g.dx,  d->g.dw,  d->g.db,  d->g.mdx, d->g.mdw,
                   d->g.mdb, d->g.edx, d->g.edw, d->g.edb};
    for (int i = 0; i < 9; i++) free(g[i]);
}

/* What the library computed for a case under a policy, as float32. */
typedef struct {
    float *y, *dx, *dw, *db; /* dw/db: NULL without parameters */
    float *dw2, *db2;        /* after a second backward with accumulate */
} layer_run;

static void layer_run_free(layer_run *r)
{
    free(r->y), free(r->dx), free(r->dw), free(r->db), free(r->dw2), free(r->db2);
}

/* The activation arena holds exactly what the plan (saved_bytes) says. */
static void assert_plan_exact(const mp_model *m, int64_t batch, const char *what)
{
    size_t planned = 0;
    for (int i = 0; i < mp_model_num_layers(m); i++) {
        mp_layer_info li;
        assert_int_equal(mp_model_layer_info(m, i, batch, &li), MP_OK);
        planned += li.saved_bytes;
    }
    if (planned != mp_model_activation_bytes(m))
        fail_msg("%s: planned %zu activation bytes, used %zu", what, planned,
                 mp_model_activation_bytes(m));
}

static void run_layer(const lcase *k, const char *policy, const case_data *d, layer_run *out)
{
    const rgeom g = geom_of(k);
    const int64_t nw = n_kernel(k), nb = n_bias(k);
    mp_node pre;
    mp_model *m = case_model(k, policy, &pre);
    mp_model_param *w = param(m, "L.kernel"), *b = param(m, "L.bias");
    assert_true((w != NULL) == (nw > 0) && (b != NULL) == (nb > 0));
    if (w) {
        const int64_t want[4] = {k->kh, k->kw, k->c, k->kind == CONV ? k->o : 1};
        assert_int_equal(w->ndim, 4);
        assert_memory_equal(w->shape, want, sizeof want);
        assert_int_equal(w->role, MP_ROLE_KERNEL);
        memcpy(w->master, d->w, (size_t)nw * sizeof(float));
    }
    if (b) memcpy(b->master, d->b, (size_t)nb * sizeof(float));
    mp_model_mark_masters_changed(m);
    mp_tensor in, dyt;
    mp_tensor_wrap(&in, MP_F32, 4, (int64_t[]){k->n, k->h, k->w, k->c}, d->x);
    if (k->kind == GAP)
        mp_tensor_wrap(&dyt, MP_F32, 2, (int64_t[]){k->n, k->c}, d->dy);
    else
        mp_tensor_wrap(&dyt, MP_F32, 4, (int64_t[]){k->n, g.oh, g.ow, g.oc}, d->dy);
    const mp_tensor *y;
    if (mp_model_forward(m, &in, true, &y)) fail_msg("%s: %s", describe(k), mp_last_error());
    assert_int_equal(mp_tensor_numel(y), n_out(k, &g));
    assert_plan_exact(m, k->n, describe(k));
    out->y = decode(y);
    if (w) w->grad[0] = 1e6f; /* backward(accumulate = false) overwrites */
    if (b) b->grad[0] = 1e6f;
    assert_int_equal(mp_model_backward(m, &dyt, false), MP_OK);
    out->dx = decode(mp_model_node_grad(m, pre));
    out->dw = w ? copy_f32(w->grad, nw) : NULL;
    out->db = b ? copy_f32(b->grad, nb) : NULL;
    out->dw2 = out->db2 = NULL;
    if (w) {
        assert_int_equal(mp_model_backward(m, &dyt, true), MP_OK);
        out->dw2 = copy_f32(w->grad, nw);
        out->db2 = b ? copy_f32(b->grad, nb) : NULL;
    }
    mp_model_free(m);
}

/* ------------------------------------------------ (1) float32 numerics */

static void check(const lcase *k, const char *what, int64_t i, double got, double want, double tol)
{
    if (!(fabs(got - want) <= tol))
        fail_msg("%s: %s[%lld] = %.9g, reference %.9g (tolerance %.3g)", describe(k), what,
                 (long long)i, got, want, tol);
}

/* Terms of one input-gradient element: Conv2D's data-gradient GEMM has
 * depth kh kw filters; the depthwise and pooling gathers add at most one
 * term per window entry (average pooling also rounds each dy / count);
 * global average pooling rounds one quotient; padding copies. */
static double dx_terms(const lcase *k)
{
    switch (k->kind) {
    case CONV:
        return (double)(k->kh * k->kw * k->o);
    case DW:
    case MAXP:
        return (double)(k->kh * k->kw);
    case AVGP:
        return (double)(k->kh * k->kw + 1);
    case GAP:
        return 1;
    default:
        return 0;
    }
}

static void float32_case(const lcase *k, uint64_t seed)
{
    const rgeom g = geom_of(k);
    const int64_t nx = n_in(k), ny = n_out(k, &g), nw = n_kernel(k), nb = n_bias(k);
    const int64_t pixels = k->n * g.oh * g.ow; /* terms of a kernel-gradient element */
    case_data d;
    case_data_init(k, seed, &d);
    layer_run lr;
    run_layer(k, "float32", &d, &lr);
    const ref_grad *G = &d.g;
    for (int64_t i = 0; i < ny; i++) check(k, "y", i, lr.y[i], d.r.y[i], ytol_of(k, &d.r, i));
    for (int64_t i = 0; i < nx; i++)
        check(k, "dx", i, lr.dx[i], G->dx[i],
              gam(dx_terms(k)) * (G->mdx[i] + G->edx[i]) + G->edx[i]);
    /* the kernel gradient: pixels products per element (the GEMM's depth,
     * or the depthwise blocks summed in order: any order has gamma_K); the
     * second backward adds the same sum to the first result, one more term */
    for (int64_t i = 0; i < nw; i++) {
        check(k, "dkernel", i, lr.dw[i], G->dw[i],
              gam((double)pixels) * (G->mdw[i] + G->edw[i]) + G->edw[i]);
        check(k, "accumulated dkernel", i, lr.dw2[i], lr.dw[i] + G->dw[i],
              gam((double)pixels + 1) * (fabs(lr.dw[i]) + G->mdw[i] + G->edw[i]) + G->edw[i]);
    }
    /* the bias gradient: float64 column sums (pixels 2^-53 relative to the
     * sum of |dz|), rounded once to float32 */
    for (int64_t i = 0; i < nb; i++) {
        const double f64 = (double)pixels * 0x1p-52 * (G->mdb[i] + G->edb[i]);
        check(k, "dbias", i, lr.db[i], G->db[i],
              G->edb[i] + f64 + U32 * (fabs(G->db[i]) + G->edb[i]));
        check(k, "accumulated dbias", i, lr.db2[i], lr.db[i] + G->db[i],
              G->edb[i] + f64 + U32 * (fabs(lr.db[i]) + fabs(G->db[i]) + G->edb[i]));
    }
    /* the analytic reference against central differences */
    double *r = d.dyd;
    fd_check(k, d.xd, d.wd, nb ? d.bd : NULL, r, d.xd, G->dx, nx, seed + 10, "dx");
    fd_check(k, d.xd, d.wd, nb ? d.bd : NULL, r, d.xd, G->dx, nx, seed + 11, "dx");
    if (nw) fd_check(k, d.xd, d.wd, nb ? d.bd : NULL, r, d.wd, G->dw, nw, seed + 12, "dkernel");
    if (nb) fd_check(k, d.xd, d.wd, d.bd, r, d.bd, G->db, nb, seed + 13, "dbias");
    layer_run_free(&lr);
    case_data_free(&d);
}

#define C_(n, h, w, c, kh, kw, o, sh, sw, dh, dw, same, bias, act)                                 \
    {                                                                                              \
        CONV, n, h, w, c, kh, kw, o, sh, sw, dh, dw, same, bias, act, { 0 }                        \
    }
#define D_(n, h, w, c, kh, kw, sh, sw, dh, dw, same, bias, act)                                    \
    {                                                                                              \
        DW, n, h, w, c, kh, kw, 0, sh, sw, dh, dw, same, bias, act, { 0 }                          \
    }
#define P_(kind, n, h, w, c, kh, kw, sh, sw, same)                                                 \
    {                                                                                              \
        kind, n, h, w, c, kh, kw, 0, sh, sw, 1, 1, same, false, MP_ACT_NONE, { 0 }                 \
    }

static const lcase conv_cases[] = {
    C_(2, 7, 7, 3, 3, 3, 5, 1, 1, 1, 1, true, true, MP_ACT_RELU),
    C_(2, 7, 7, 3, 3, 3, 5, 1, 1, 1, 1, false, true, MP_ACT_NONE),
    C_(1, 9, 8, 4, 3, 3, 6, 2, 2, 1, 1, true, true, MP_ACT_NONE),
    C_(3, 9, 8, 4, 3, 3, 6, 2, 2, 1, 1, false, false, MP_ACT_RELU),
    C_(2, 6, 6, 2, 1, 1, 7, 1, 1, 1, 1, false, true, MP_ACT_NONE),
    C_(2, 6, 6, 2, 1, 1, 7, 2, 2, 1, 1, true, true, MP_ACT_RELU),
    C_(1, 11, 10, 3, 5, 5, 4, 1, 1, 1, 1, true, true, MP_ACT_GELU),
    C_(2, 11, 10, 3, 5, 5, 4, 2, 2, 1, 1, false, true, MP_ACT_NONE),
    C_(2, 8, 8, 3, 2, 2, 4, 1, 1, 1, 1, true, true, MP_ACT_NONE), /* even: pad after */
    C_(2, 9, 9, 3, 4, 4, 4, 2, 2, 1, 1, true, false, MP_ACT_NONE),
    C_(1, 9, 9, 2, 3, 3, 3, 1, 1, 2, 2, true, true, MP_ACT_RELU), /* dilation */
    C_(2, 10, 9, 2, 3, 3, 3, 1, 1, 2, 1, false, true, MP_ACT_NONE),
    C_(1, 5, 7, 3, 3, 1, 4, 2, 1, 1, 1, true, true, MP_ACT_NONE), /* 3x1, strides 2x1 */
    C_(1, 3, 3, 2, 5, 5, 3, 2, 2, 1, 1, true, true, MP_ACT_NONE), /* kernel > image, same */
};

static void test_conv2d(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof conv_cases / sizeof *conv_cases; i++)
        float32_case(&conv_cases[i], 100 + 10 * i);
}

static const lcase dw_cases[] = {
    D_(2, 7, 7, 3, 3, 3, 1, 1, 1, 1, true, true, MP_ACT_RELU),
    D_(2, 7, 7, 5, 3, 3, 1, 1, 1, 1, false, true, MP_ACT_NONE),
    D_(1, 9, 8, 4, 3, 3, 2, 2, 1, 1, true, false, MP_ACT_NONE),
    D_(3, 9, 8, 4, 3, 3, 2, 2, 1, 1, false, true, MP_ACT_RELU),
    D_(2, 6, 6, 2, 1, 1, 1, 1, 1, 1, false, true, MP_ACT_NONE),
    D_(2, 6, 6, 2, 1, 1, 2, 2, 1, 1, true, true, MP_ACT_NONE),
    D_(1, 11, 10, 3, 5, 5, 1, 1, 1, 1, true, true, MP_ACT_GELU),
    D_(2, 11, 10, 3, 5, 5, 2, 2, 1, 1, false, true, MP_ACT_NONE),
    D_(2, 8, 8, 3, 2, 2, 1, 1, 1, 1, true, true, MP_ACT_NONE),
    D_(1, 9, 9, 2, 3, 3, 1, 1, 2, 2, true, true, MP_ACT_RELU),
    D_(1, 5, 7, 6, 1, 3, 1, 2, 1, 1, true, true, MP_ACT_NONE),
    D_(4, 12, 12, 16, 3, 3, 1, 1, 1, 1, true, true, MP_ACT_NONE), /* several row blocks */
};

static void test_depthwise_conv2d(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof dw_cases / sizeof *dw_cases; i++)
        float32_case(&dw_cases[i], 300 + 10 * i);
}

static const lcase pool_cases[] = {
    P_(MAXP, 2, 8, 8, 3, 2, 2, 2, 2, false),  P_(AVGP, 2, 8, 8, 3, 2, 2, 2, 2, false),
    P_(MAXP, 2, 7, 9, 3, 2, 2, 2, 2, true),   P_(AVGP, 2, 7, 9, 3, 2, 2, 2, 2, true),
    P_(MAXP, 1, 9, 9, 2, 3, 3, 2, 2, true),   P_(AVGP, 1, 9, 9, 2, 3, 3, 2, 2, true),
    P_(MAXP, 2, 9, 8, 4, 3, 3, 1, 1, false),  P_(AVGP, 2, 9, 8, 4, 3, 3, 1, 1, true),
    P_(MAXP, 1, 11, 10, 3, 5, 5, 2, 2, true), P_(AVGP, 3, 11, 10, 3, 5, 5, 2, 2, false),
    P_(MAXP, 2, 6, 6, 2, 1, 1, 2, 2, true),   P_(AVGP, 2, 5, 7, 3, 3, 1, 1, 2, true),
    P_(MAXP, 1, 3, 3, 1, 5, 5, 1, 1, true),   P_(AVGP, 1, 3, 3, 1, 5, 5, 1, 1, true),
};

static void test_pooling2d(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof pool_cases / sizeof *pool_cases; i++)
        float32_case(&pool_cases[i], 500 + 10 * i);
}

/* Max pooling's choices: of equal elements the first in window order takes
 * the gradient, a NaN anywhere wins (an overflow must reach the loss
 * scaler), -inf is an ordinary value; in float32 and bfloat16 compute. */
static void test_max_pooling_ties_and_nan(void **state)
{
    (void)state;
    const float inf = INFINITY, nan = NAN;
    float x[16] = {1, 1, 2, nan, 1, 1, 3, 1, -inf, -inf, 0, 5, -inf, -inf, 5, 0};
    float dy[4] = {1, 2, 3, 4};
    /* where each window's gradient goes: (0, 0), the NaN at (0, 3), the
     * first -inf at (2, 0), the first 5 at (2, 3) */
    const float want_dx[16] = {1, 0, 0, 2, 0, 0, 0, 0, 3, 0, 0, 4, 0, 0, 0, 0};
    const char *policies[] = {"float32", "mixed_bfloat16"};
    for (int pi = 0; pi < 2; pi++) {
        const lcase k = P_(MAXP, 1, 4, 4, 1, 2, 2, 2, 2, false);
        mp_node pre;
        mp_model *m = case_model(&k, policies[pi], &pre);
        mp_tensor in, dyt;
        mp_tensor_wrap(&in, MP_F32, 4, (int64_t[]){1, 4, 4, 1}, x);
        mp_tensor_wrap(&dyt, MP_F32, 4, (int64_t[]){1, 2, 2, 1}, dy);
        const mp_tensor *y;
        assert_int_equal(mp_model_forward(m, &in, true, &y), MP_OK);
        float *yf = decode(y);
        assert_true(yf[0] == 1 && isnan(yf[1]) && yf[2] == -inf && yf[3] == 5);
        assert_int_equal(mp_model_backward(m, &dyt, false), MP_OK);
        float *dx = decode(mp_model_node_grad(m, pre));
        assert_memory_equal(dx, want_dx, sizeof want_dx);
        free(yf);
        free(dx);
        mp_model_free(m);
    }
}

static const lcase gap_pad_cases[] = {
    {GAP, 2, 7, 5, 3, 0, 0, 0, 1, 1, 1, 1, false, false, MP_ACT_NONE, {0}},
    {GAP, 1, 1, 1, 4, 0, 0, 0, 1, 1, 1, 1, false, false, MP_ACT_NONE, {0}},
    {GAP, 3, 16, 16, 8, 0, 0, 0, 1, 1, 1, 1, false, false, MP_ACT_NONE, {0}},
    {PAD, 2, 5, 4, 3, 0, 0, 0, 1, 1, 1, 1, false, false, MP_ACT_NONE, {1, 2, 0, 3}},
    {PAD, 1, 3, 3, 2, 0, 0, 0, 1, 1, 1, 1, false, false, MP_ACT_NONE, {2, 2, 2, 2}},
    {PAD, 2, 4, 6, 1, 0, 0, 0, 1, 1, 1, 1, false, false, MP_ACT_NONE, {0, 0, 0, 0}},
};

static void test_global_pooling_and_padding(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof gap_pad_cases / sizeof *gap_pad_cases; i++)
        float32_case(&gap_pad_cases[i], 700 + 10 * i);
}

/* ------------------------------------ (2) mixed policies vs float32 */

/* Under mixed_bfloat16 / mixed_float16 (compute unit roundoff uc = 2^-8 /
 * 2^-11) a layer sees its input and kernel rounded to the compute dtype
 * (each relative change <= uc), multiplies them exactly in float32 (8- and
 * 11-bit significands make products of at most 22 bits), sums in float32
 * in the same way as the float32 layer (the bias and parameter gradients
 * stay float32) and rounds its output to the compute dtype. The output
 * gradient reaches it rounded to the compute dtype too. With S the exact
 * result of the float32 data, S_c that of the rounded data, tol32 the
 * float32 layer's bound (above) and `in` >= |S_c - S|:
 *   |y_m - S| <= in + (1 + uc)^2 tol32 + uc |fl32(S_c)|,   |y_32 - S| <= tol32,
 * so |y_m - y_32| <= (1 + uc) (in + 2.01 tol32) + uc |y_32|, the last term
 * only for outputs rounded to the compute dtype (not parameter gradients);
 *   in = (2 uc + uc^2) sum |a b| for sums of products of two rounded
 *        factors (Conv2D and depthwise: y, dx, dkernel),
 *   in = uc sum |a|              for sums of one rounded factor (average
 *        pooling, global average, dbias).
 * Max pooling and padding select values, and rounding is monotone: their
 * outputs are the float32 ones rounded, exactly, as is padding's gradient.
 * Max pooling's gradient follows the maxima of the rounded input, which
 * ties more often: it is checked against the float64 reference of the
 * rounded input and output gradient (sums of at most kh kw values, then
 * one rounding to the compute dtype). */
static void mixed_case(const lcase *k, const char *policy, mp_dtype ct, double uc, uint64_t seed)
{
    const rgeom g = geom_of(k);
    const int64_t nx = n_in(k), ny = n_out(k, &g), nw = n_kernel(k), nb = n_bias(k);
    const double pixels = (double)(k->n * g.oh * g.ow), two = 2 * uc + uc * uc;
    const bool products = k->kind == CONV || k->kind == DW;
    case_data d;
    case_data_init(k, seed, &d);
    layer_run a, b;
    run_layer(k, "float32", &d, &a);
    run_layer(k, policy, &d, &b);
    char what[64];
    snprintf(what, sizeof what, "%s y", policy);
    for (int64_t i = 0; i < ny; i++) {
        if (k->kind == MAXP || k->kind == PAD) {
            check(k, what, i, b.y[i], round_to(ct, a.y[i]), 0);
            continue;
        }
        const double in = (products ? two : uc) * d.r.mag[i];
        check(k, what, i, b.y[i], a.y[i],
              (1 + uc) * (in + 2.01 * ytol_of(k, &d.r, i)) + uc * fabs(a.y[i]));
    }
    if (k->act != MP_ACT_NONE) goto done; /* a relu's kinks may move */
    snprintf(what, sizeof what, "%s dx", policy);
    if (k->kind == MAXP) {
        case_data c = d; /* the reference of the rounded data */
        c.xd = malloc((size_t)nx * sizeof *c.xd), c.dyd = malloc((size_t)ny * sizeof *c.dyd);
        for (int64_t i = 0; i < nx; i++) c.xd[i] = round_to(ct, d.x[i]);
        for (int64_t i = 0; i < ny; i++) c.dyd[i] = round_to(ct, d.dy[i]);
        reference(k, &c);
        for (int64_t i = 0; i < nx; i++)
            check(k, what, i, b.dx[i], c.g.dx[i],
                  (1 + uc) * gam((double)(k->kh * k->kw)) * c.g.mdx[i] + uc * fabs(c.g.dx[i]));
        free(c.xd), free(c.dyd);
        free(c.r.z), free(c.r.y), free(c.r.mag), free(c.r.terms), free(c.r.arg);
        double *gs[] = {c.g.dx,  c.g.dw,  c.g.db,  c.g.mdx, c.g.mdw,
                        c.g.mdb, c.g.edx, c.g.edw, c.g.edb};
        for (int i = 0; i < 9; i++) free(gs[i]);
    } else {
        for (int64_t i = 0; i < nx; i++) {
            if (k->kind == PAD) {
                check(k, what, i, b.dx[i], round_to(ct, a.dx[i]), 0);
                continue;
            }
            const double in = (products ? two : uc) * d.g.mdx[i];
            check(k, what, i, b.dx[i], a.dx[i],
                  (1 + uc) * (in + 2.01 * gam(dx_terms(k)) * d.g.mdx[i]) + uc * fabs(a.dx[i]));
        }
    }
    snprintf(what, sizeof what, "%s dkernel", policy);
    for (int64_t i = 0; i < nw; i++)
        check(k, what, i, b.dw[i], a.dw[i],
              (1 + uc) * (two * d.g.mdw[i] + 2.01 * gam(pixels) * d.g.mdw[i]));
    snprintf(what, sizeof what, "%s dbias", policy);
    for (int64_t i = 0; i < nb; i++)
        check(k, what, i, b.db[i], a.db[i],
              (1 + uc) * (uc * d.g.mdb[i] +
                          2.01 * (U32 * fabs(d.g.db[i]) + pixels * 0x1p-52 * d.g.mdb[i])));
done:
    layer_run_free(&a);
    layer_run_free(&b);
    case_data_free(&d);
}

static const lcase mixed_cases[] = {
    C_(2, 7, 7, 3, 3, 3, 5, 1, 1, 1, 1, true, true, MP_ACT_NONE),
    C_(1, 9, 8, 4, 3, 3, 6, 2, 2, 1, 1, false, true, MP_ACT_NONE),
    C_(2, 11, 10, 3, 5, 5, 4, 2, 2, 1, 1, true, false, MP_ACT_NONE),
    C_(2, 8, 8, 3, 2, 2, 4, 1, 1, 1, 1, true, true, MP_ACT_RELU),
    D_(2, 7, 7, 5, 3, 3, 1, 1, 1, 1, true, true, MP_ACT_NONE),
    D_(1, 9, 8, 4, 3, 3, 2, 2, 1, 1, false, true, MP_ACT_NONE),
    D_(1, 9, 9, 2, 3, 3, 1, 1, 2, 2, true, true, MP_ACT_RELU),
    P_(MAXP, 2, 7, 9, 3, 2, 2, 2, 2, true),
    P_(MAXP, 1, 9, 9, 2, 3, 3, 1, 1, false),
    P_(AVGP, 2, 7, 9, 3, 3, 3, 2, 2, true),
    {GAP, 2, 7, 5, 3, 0, 0, 0, 1, 1, 1, 1, false, false, MP_ACT_NONE, {0}},
    {PAD, 2, 5, 4, 3, 0, 0, 0, 1, 1, 1, 1, false, false, MP_ACT_NONE, {1, 2, 0, 3}},
};

static void test_mixed_policies(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof mixed_cases / sizeof *mixed_cases; i++) {
        mixed_case(&mixed_cases[i], "mixed_bfloat16", MP_BF16, 0x1p-8, 900 + 10 * i);
        mixed_case(&mixed_cases[i], "mixed_float16", MP_F16, 0x1p-11, 900 + 10 * i);
    }
}

/* ------------------------------------------- (3) threads, scratch */

/* A chain of every image layer, large enough that each loop runs in
 * parallel (and the depthwise kernel gradient over several row blocks). */
static mp_model *chain_model(const char *policy, int64_t batch, mp_node *pre)
{
    mp_model *m = mp_model_new_with_policy(5, policy);
    mp_node x = mp_input(m, 3, (int64_t[]){16, 16, 8}, NULL);
    x = *pre = mp_activation_layer(m, x, MP_ACT_NONE, NULL);
    mp_depthwise_conv2d_options d = mp_depthwise_conv2d_options_default(3, 3);
    d.padding = MP_PADDING_SAME, d.activation = MP_ACT_RELU;
    x = mp_depthwise_conv2d(m, x, &d, NULL);
    x = mp_max_pooling2d(m, x, &(mp_pooling2d_options){{3, 3}, {1, 1}, MP_PADDING_SAME}, NULL);
    x = mp_zero_padding2d(m, x, 1, 0, 2, 1, NULL);
    x = mp_average_pooling2d(m, x, &(mp_pooling2d_options){{3, 3}, {1, 1}, MP_PADDING_SAME}, NULL);
    mp_conv2d_options c = mp_conv2d_options_default(8, 3, 3);
    c.strides[0] = c.strides[1] = 2;
    x = mp_conv2d(m, x, &c, NULL);
    x = mp_global_average_pooling2d(m, x, NULL);
    assert_int_equal(mp_model_build(m, x, batch), MP_OK);
    return m;
}

/* Output, input gradient and parameter gradients, bit for bit, with one
 * thread and with several. */
static void test_thread_count_independent(void **state)
{
    (void)state;
#ifdef _OPENMP
    const int64_t batch = 8, n = batch * 16 * 16 * 8;
    float *x = random_f32(n, 1, -1, 1), *dy = random_f32(batch * 8, 2, -1, 1);
    mp_tensor in, dyt;
    mp_tensor_wrap(&in, MP_F32, 4, (int64_t[]){batch, 16, 16, 8}, x);
    mp_tensor_wrap(&dyt, MP_F32, 2, (int64_t[]){batch, 8}, dy);
    float *out[2], *dx[2], *grads[2];
    const int saved = omp_get_max_threads();
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(k == 0 ? 1 : (saved > 1 ? saved : 2));
        mp_node pre;
        mp_model *m = chain_model("float32", batch, &pre);
        const mp_tensor *y;
        assert_int_equal(mp_model_forward(m, &in, true, &y), MP_OK);
        out[k] = decode(y);
        assert_int_equal(mp_model_backward(m, &dyt, false), MP_OK);
        dx[k] = decode(mp_model_node_grad(m, pre));
        int64_t total = 0;
        for (int i = 0; i < mp_model_num_params(m); i++) total += mp_model_get_param(m, i)->n;
        grads[k] = malloc((size_t)total * sizeof(float));
        for (int i = 0, at = 0; i < mp_model_num_params(m); i++) {
            const mp_model_param *p = mp_model_get_param(m, i);
            memcpy(grads[k] + at, p->grad, (size_t)p->n * sizeof(float));
            at += (int)p->n;
        }
        if (k) assert_memory_equal(grads[0], grads[1], (size_t)total * sizeof(float));
        mp_model_free(m);
    }
    omp_set_num_threads(saved);
    assert_memory_equal(out[0], out[1], (size_t)(batch * 8) * sizeof(float));
    assert_memory_equal(dx[0], dx[1], (size_t)n * sizeof(float));
    for (int k = 0; k < 2; k++) free(out[k]), free(dx[k]), free(grads[k]);
    free(x);
    free(dy);
#endif
}

/* Scratch (the per-thread row buffers) that cannot grow: the forward and
 * the backward fail with MP_ERR_NOMEM naming the layer, and once memory is
 * back the same step gives the undisturbed results. */
static void test_out_of_scratch(void **state)
{
    (void)state;
    const lcase cases[] = {
        D_(2, 9, 16, 4, 3, 3, 1, 1, 1, 1, true, true, MP_ACT_NONE),
        P_(MAXP, 2, 9, 16, 4, 3, 3, 2, 2, true),
        P_(AVGP, 2, 9, 16, 4, 3, 3, 1, 1, true),
        {GAP, 2, 9, 16, 4, 0, 0, 0, 1, 1, 1, 1, false, false, MP_ACT_NONE, {0}},
        C_(2, 9, 16, 4, 3, 3, 5, 1, 1, 1, 1, true, true, MP_ACT_NONE),
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const lcase *k = &cases[ci];
        const rgeom g = geom_of(k);
        case_data d;
        case_data_init(k, 40 + ci, &d);
        mp_node pre;
        mp_model *m = case_model(k, "float32", &pre);
        mp_tensor in, dyt;
        mp_tensor_wrap(&in, MP_F32, 4, (int64_t[]){k->n, k->h, k->w, k->c}, d.x);
        if (k->kind == GAP)
            mp_tensor_wrap(&dyt, MP_F32, 2, (int64_t[]){k->n, k->c}, d.dy);
        else
            mp_tensor_wrap(&dyt, MP_F32, 4, (int64_t[]){k->n, g.oh, g.ow, g.oc}, d.dy);
        /* a row is 16 * 4 floats (256 bytes); the bias column sums need 4
         * doubles */
        mp_scratch_fail_above = 128;
        mp_status s = mp_model_forward(m, &in, true, NULL);
        mp_scratch_fail_above = SIZE_MAX;
        if (s != MP_ERR_NOMEM || !strstr(mp_last_error(), "'L'"))
            fail_msg("%s: forward gave %d: %s", describe(k), (int)s, mp_last_error());
        assert_int_equal(mp_model_backward(m, &dyt, false), MP_ERR_INVALID); /* no forward */
        assert_int_equal(mp_model_forward(m, &in, true, NULL), MP_OK);
        assert_int_equal(mp_model_backward(m, &dyt, false), MP_OK);
        float *dx = decode(mp_model_node_grad(m, pre));
        mp_model_param *w = param(m, "L.kernel");
        float *dw = w ? copy_f32(w->grad, w->n) : NULL;
        mp_scratch_fail_above = 128;
        s = mp_model_backward(m, &dyt, false);
        mp_scratch_fail_above = SIZE_MAX;
        if (s != MP_ERR_NOMEM || !strstr(mp_last_error(), "'L'"))
            fail_msg("%s: backward gave %d: %s", describe(k), (int)s, mp_last_error());
        assert_int_equal(mp_model_backward(m, &dyt, false), MP_OK);
        float *dx2 = decode(mp_model_node_grad(m, pre));
        assert_memory_equal(dx, dx2, (size_t)n_in(k) * sizeof(float));
        if (w) assert_memory_equal(dw, w->grad, (size_t)w->n * sizeof(float));
        free(dx), free(dx2), free(dw);
        mp_model_free(m);
        case_data_free(&d);
    }
}

/* Under a pure low-precision policy the weights themselves are in the
 * compute dtype (no master) and the bias is widened for the kernels; a
 * fresh model's weights are the mixed policy's compute copies (both round
 * the same float32 draw) and its biases are zeros in both, so outputs and
 * gradients agree bit for bit with the mixed policy's. */
static void test_pure_policies(void **state)
{
    (void)state;
    const char *pairs[][2] = {{"bfloat16", "mixed_bfloat16"}, {"float16", "mixed_float16"}};
    const int64_t batch = 2, n = batch * 16 * 16 * 8;
    float *x = random_f32(n, 5, -1, 1), *dy = random_f32(batch * 8, 6, -1, 1);
    mp_tensor in, dyt;
    mp_tensor_wrap(&in, MP_F32, 4, (int64_t[]){batch, 16, 16, 8}, x);
    mp_tensor_wrap(&dyt, MP_F32, 2, (int64_t[]){batch, 8}, dy);
    for (int pi = 0; pi < 2; pi++) {
        float *out[2], *dx[2];
        mp_model *m[2];
        for (int k = 0; k < 2; k++) {
            mp_node pre;
            m[k] = chain_model(pairs[pi][k], batch, &pre);
            const mp_tensor *y;
            assert_int_equal(mp_model_forward(m[k], &in, true, &y), MP_OK);
            assert_plan_exact(m[k], batch, pairs[pi][k]);
            out[k] = decode(y);
            assert_int_equal(mp_model_backward(m[k], &dyt, false), MP_OK);
            dx[k] = decode(mp_model_node_grad(m[k], pre));
        }
        for (int i = 0; i < mp_model_num_params(m[0]); i++) {
            mp_model_param *p = mp_model_get_param(m[0], i), *q = mp_model_get_param(m[1], i);
            assert_null(p->master);
            assert_int_equal(p->weight_dtype, q->weight_dtype);
            assert_memory_equal(p->weight, q->weight,
                                (size_t)p->n * mp_dtype_size(p->weight_dtype));
            assert_memory_equal(p->grad, q->grad, (size_t)p->n * sizeof(float));
        }
        assert_memory_equal(out[0], out[1], (size_t)(batch * 8) * sizeof(float));
        assert_memory_equal(dx[0], dx[1], (size_t)n * sizeof(float));
        for (int k = 0; k < 2; k++) free(out[k]), free(dx[k]), mp_model_free(m[k]);
    }
    free(x);
    free(dy);
}

/* Kernels start glorot_uniform with Keras's fans: Conv2D [3, 3, 16, 32]
 * has fan_in 144 and fan_out 288; DepthwiseConv2D [3, 3, 64, 1] has 576
 * and 9. Every |w| is within the limit sqrt(6 / (fan_in + fan_out)) and
 * the largest within 5% of it (n draws all miss the top 5% with
 * probability 0.95^n < 1e-13 here); biases start at zero. */
static void test_initial_kernels(void **state)
{
    (void)state;
    mp_model *m = mp_model_new(17);
    mp_node x = mp_input(m, 3, (int64_t[]){6, 6, 16}, NULL);
    x = mp_conv2d(
        m, x, &(mp_conv2d_options){32, {3, 3}, {1, 1}, MP_PADDING_SAME, {1, 1}, true, MP_ACT_NONE},
        &(mp_layer_options){.name = "c"});
    x = mp_zero_padding2d(m, x, 0, 0, 0, 0, NULL);
    mp_node y = mp_conv2d(
        m, x,
        &(mp_conv2d_options){64, {1, 1}, {1, 1}, MP_PADDING_VALID, {1, 1}, false, MP_ACT_NONE},
        NULL);
    y = mp_depthwise_conv2d(m, y,
                            &(mp_depthwise_conv2d_options){
                                {3, 3}, {1, 1}, MP_PADDING_SAME, 1, {1, 1}, true, MP_ACT_NONE},
                            &(mp_layer_options){.name = "d"});
    assert_int_equal(mp_model_build(m, y, 1), MP_OK);
    const struct {
        const char *name;
        double limit;
    } k[] = {{"c.kernel", sqrt(6.0 / (144 + 288))}, {"d.kernel", sqrt(6.0 / (576 + 9))}};
    for (int i = 0; i < 2; i++) {
        mp_model_param *p = param(m, k[i].name);
        double big = 0;
        for (int64_t j = 0; j < p->n; j++) big = fmax(big, fabs(p->master[j]));
        if (!(big <= k[i].limit * (1 + U32) && big >= 0.95 * k[i].limit))
            fail_msg("%s: largest |w| %.6g, limit %.6g", k[i].name, big, k[i].limit);
    }
    const float *b = param(m, "d.bias")->master;
    for (int j = 0; j < 64; j++) assert_true(b[j] == 0.0f);
    mp_model_free(m);
}

/* -------------------------------------------------- (4) configuration */

#define CONFIG_HEAD                                                                                \
    "{\"format\": \"mixprec.model\", \"version\": 2, \"seed\": \"0x5\", \"layers\": ["

/* Every image layer with settings away from the defaults. */
static mp_model *config_model(void)
{
    mp_model *m = mp_model_new(9);
    mp_node x = mp_input(m, 3, (int64_t[]){9, 8, 3}, NULL);
    x = mp_zero_padding2d(m, x, 1, 2, 0, 1, &(mp_layer_options){.name = "zp"});
    mp_conv2d_options c = mp_conv2d_options_default(4, 3, 3);
    c.strides[0] = c.strides[1] = 2, c.padding = MP_PADDING_SAME, c.activation = MP_ACT_RELU;
    x = mp_conv2d(m, x, &c, &(mp_layer_options){.name = "c1"});
    c = mp_conv2d_options_default(5, 3, 3);
    c.dilation_rate[0] = c.dilation_rate[1] = 2, c.padding = MP_PADDING_SAME;
    c.use_bias = false, c.activation = MP_ACT_GELU;
    x = mp_conv2d(m, x, &c, &(mp_layer_options){.name = "c2"});
    mp_depthwise_conv2d_options d = mp_depthwise_conv2d_options_default(3, 3);
    x = mp_depthwise_conv2d(m, x, &d, &(mp_layer_options){.name = "dw"});
    x = mp_max_pooling2d(m, x, &(mp_pooling2d_options){{2, 2}, {0, 0}, MP_PADDING_SAME},
                         &(mp_layer_options){.name = "mp"});
    x = mp_average_pooling2d(m, x, &(mp_pooling2d_options){{2, 1}, {1, 1}, MP_PADDING_VALID},
                             &(mp_layer_options){.name = "ap"});
    x = mp_global_average_pooling2d(m, x, &(mp_layer_options){.name = "gap"});
    x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
    assert_int_equal(mp_model_build(m, x, 4), MP_OK);
    return m;
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

static json_t *layer_json(json_t *root, const char *name)
{
    json_t *layers = json_object_get(root, "layers");
    for (size_t i = 0; i < json_array_size(layers); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(layers, i), "name")), name))
            return json_array_get(layers, i);
    fail_msg("no layer '%s'", name);
    return NULL;
}

/* The setting `key` of layer `name` as compact JSON. */
static char *setting(json_t *root, const char *name, const char *key)
{
    return json_dumps(json_object_get(layer_json(root, name), key), JSON_ENCODE_ANY | JSON_COMPACT);
}

static void assert_setting(json_t *root, const char *name, const char *key, const char *want)
{
    char *got = setting(root, name, key);
    if (!got || strcmp(got, want))
        fail_msg("layer '%s': %s is %s, want %s", name, key, got ? got : "(none)", want);
    free(got);
}

static void test_config_round_trip(void **state)
{
    (void)state;
    mp_model *a = config_model();
    char *json = mp_model_config_json(a);
    assert_non_null(json);
    mp_model *b = NULL;
    if (mp_model_from_config(json, 4, 1 << 20, &b)) fail_msg("%s", mp_last_error());
    char *again = mp_model_config_json(b);
    assert_string_equal(json, again);
    assert_same_params(a, b, "config round trip");
    json_t *root = json_loads(json, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(layer_json(root, "c1"), "class_name")),
                        "Conv2D");
    assert_setting(root, "c1", "filters", "4");
    assert_setting(root, "c1", "kernel_size", "[3,3]");
    assert_setting(root, "c1", "strides", "[2,2]");
    assert_setting(root, "c1", "padding", "\"same\"");
    assert_setting(root, "c1", "dilation_rate", "[1,1]");
    assert_setting(root, "c1", "use_bias", "true");
    assert_setting(root, "c1", "activation", "\"relu\"");
    assert_setting(root, "c2", "dilation_rate", "[2,2]");
    assert_setting(root, "c2", "use_bias", "false");
    assert_setting(root, "c2", "activation", "\"gelu\"");
    assert_setting(root, "dw", "depth_multiplier", "1");
    assert_setting(root, "dw", "padding", "\"valid\"");
    assert_setting(root, "mp", "pool_size", "[2,2]");
    assert_setting(root, "mp", "strides", "[2,2]");
    assert_setting(root, "ap", "pool_size", "[2,1]");
    assert_setting(root, "ap", "strides", "[1,1]");
    assert_setting(root, "zp", "padding", "[[1,2],[0,1]]");
    assert_string_equal(json_string_value(json_object_get(layer_json(root, "gap"), "class_name")),
                        "GlobalAveragePooling2D");
    json_decref(root);
    /* the same outputs, bit for bit, in training and inference */
    float *x = random_f32(4 * 9 * 8 * 3, 3, -1, 1);
    mp_tensor in;
    mp_tensor_wrap(&in, MP_F32, 4, (int64_t[]){4, 9, 8, 3}, x);
    for (int train = 0; train <= 1; train++) {
        const mp_tensor *ya, *yb;
        float out[12];
        assert_int_equal(mp_model_forward(a, &in, train, &ya), MP_OK);
        memcpy(out, ya->data, sizeof out);
        assert_int_equal(mp_model_forward(b, &in, train, &yb), MP_OK);
        assert_memory_equal(out, yb->data, sizeof out);
    }
    free(x);
    free(json);
    free(again);
    mp_model_free(a);
    mp_model_free(b);
}

/* Keras's defaults and its short forms (an int for a pair, strides null,
 * ZeroPadding2D's three forms), as a hand-written file may have them. */
static void test_config_defaults_and_forms(void **state)
{
    (void)state;
    const char *text = CONFIG_HEAD
        "{\"class_name\": \"InputLayer\", \"name\": \"x\", \"inputs\": [], \"shape\": [8, 8, 2]},"
        "{\"class_name\": \"Conv2D\", \"name\": \"c\", \"inputs\": [\"x\"], \"filters\": 3, "
        "\"kernel_size\": 3},"
        "{\"class_name\": \"DepthwiseConv2D\", \"name\": \"d\", \"inputs\": [\"c\"], "
        "\"kernel_size\": [1, 3], \"strides\": 1},"
        "{\"class_name\": \"MaxPooling2D\", \"name\": \"m\", \"inputs\": [\"d\"]},"
        "{\"class_name\": \"AveragePooling2D\", \"name\": \"a\", \"inputs\": [\"m\"], "
        "\"pool_size\": 3, \"strides\": null, \"padding\": \"same\"},"
        "{\"class_name\": \"ZeroPadding2D\", \"name\": \"z1\", \"inputs\": [\"a\"], \"padding\": "
        "2},"
        "{\"class_name\": \"ZeroPadding2D\", \"name\": \"z2\", \"inputs\": [\"z1\"], "
        "\"padding\": [1, 3]},"
        "{\"class_name\": \"ZeroPadding2D\", \"name\": \"z3\", \"inputs\": [\"z2\"], "
        "\"padding\": [1, [2, 3]]},"
        "{\"class_name\": \"ZeroPadding2D\", \"name\": \"z4\", \"inputs\": [\"z3\"]},"
        "{\"class_name\": \"GlobalAveragePooling2D\", \"name\": \"g\", \"inputs\": [\"z4\"]}]}";
    mp_model *m = NULL;
    if (mp_model_from_config(text, 2, 1 << 20, &m)) fail_msg("%s", mp_last_error());
    /* [8, 8, 2] -> valid 3x3: [6, 6, 3] -> 1x3: [6, 4, 3] -> pool 2: [3, 2, 3]
     * -> pool 3 same, strides 3: [1, 1, 3] -> +4: [5, 5, 3] -> +2, +6: [7, 11, 3]
     * -> +2, +5: [9, 16, 3] -> +2, +2: [11, 18, 3] -> [3] */
    const int64_t shapes[][3] = {{8, 8, 2}, {6, 6, 3},  {6, 4, 3},  {3, 2, 3},  {1, 1, 3},
                                 {5, 5, 3}, {7, 11, 3}, {9, 16, 3}, {11, 18, 3}};
    for (int i = 0; i < 9; i++) {
        mp_layer_info li;
        assert_int_equal(mp_model_layer_info(m, i, 2, &li), MP_OK);
        assert_int_equal(li.ndim, 3);
        if (memcmp(li.shape, shapes[i], sizeof shapes[i]))
            fail_msg("layer %s: shape (%lld, %lld, %lld)", li.name, (long long)li.shape[0],
                     (long long)li.shape[1], (long long)li.shape[2]);
    }
    mp_layer_info li;
    assert_int_equal(mp_model_layer_info(m, 1, 2, &li), MP_OK);
    assert_int_equal(li.params, 3 * 3 * 2 * 3 + 3);
    assert_int_equal(mp_model_layer_info(m, 2, 2, &li), MP_OK);
    assert_int_equal(li.params, 1 * 3 * 3 + 3);
    char *json = mp_model_config_json(m);
    json_t *root = json_loads(json, 0, NULL);
    assert_setting(root, "c", "kernel_size", "[3,3]");
    assert_setting(root, "c", "strides", "[1,1]");
    assert_setting(root, "c", "padding", "\"valid\"");
    assert_setting(root, "c", "dilation_rate", "[1,1]");
    assert_setting(root, "c", "use_bias", "true");
    assert_setting(root, "c", "activation", "\"linear\"");
    assert_setting(root, "d", "strides", "[1,1]");
    assert_setting(root, "m", "pool_size", "[2,2]");
    assert_setting(root, "m", "strides", "[2,2]");
    assert_setting(root, "m", "padding", "\"valid\"");
    assert_setting(root, "a", "strides", "[3,3]");
    assert_setting(root, "z1", "padding", "[[2,2],[2,2]]");
    assert_setting(root, "z2", "padding", "[[1,1],[3,3]]");
    assert_setting(root, "z3", "padding", "[[1,1],[2,3]]");
    assert_setting(root, "z4", "padding", "[[1,1],[1,1]]");
    json_decref(root);
    free(json);
    mp_model_free(m);
}

/* The round-trip config with layer `name`'s `key` set to the JSON `value`
 * (NULL: removed) is refused, the message containing `want`. */
static void refused(const char *json, const char *name, const char *key, const char *value,
                    const char *want)
{
    json_t *root = json_loads(json, 0, NULL), *l = layer_json(root, name);
    if (value) {
        json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
        assert_non_null(v);
        json_object_set_new(l, key, v);
    } else {
        json_object_del(l, key);
    }
    char *bad = json_dumps(root, 0);
    json_decref(root);
    mp_model *b = NULL;
    if (mp_model_from_config(bad, 4, 1 << 20, &b) == MP_OK)
        fail_msg("layer '%s' with %s = %s was accepted", name, key, value ? value : "(none)");
    assert_null(b);
    if (!strstr(mp_last_error(), want))
        fail_msg("%s = %s: '%s' not in: %s", key, value ? value : "(none)", want, mp_last_error());
    free(bad);
}

static void test_config_refusals(void **state)
{
    (void)state;
    mp_model *a = config_model();
    char *json = mp_model_config_json(a);
    static const char *const bad[][4] = {
        {"c1", "filters", "0", "filters"},
        {"c1", "filters", "\"8\"", "filters"},
        {"c1", "filters", NULL, "filters"},
        {"c1", "kernel_size", "[3]", "kernel_size"},
        {"c1", "kernel_size", "[0, 3]", "kernel_size"},
        {"c1", "kernel_size", "3.5", "kernel_size"},
        {"c1", "kernel_size", NULL, "kernel_size"},
        {"c1", "strides", "[1, 2, 3]", "strides"},
        {"c1", "strides", "0", "strides"},
        {"c1", "padding", "\"full\"", "padding"},
        {"c1", "padding", "\"SAME\"", "padding"},
        {"c1", "dilation_rate", "0", "dilation_rate"},
        {"c1", "dilation_rate", "[2, 2]", "dilation_rate"}, /* with strides 2 */
        {"c1", "use_bias", "\"yes\"", "use_bias"},
        {"c1", "activation", "\"swish\"", "activation"},
        {"c1", "activation", "\"softmax\"", "activation"},
        {"c1", "groups", "1", "groups"},
        {"c1", "data_format", "\"channels_first\"", "data_format"},
        {"dw", "depth_multiplier", "2", "depth_multiplier"},
        {"dw", "kernel_size", NULL, "kernel_size"},
        {"dw", "kernel_size", "[9, 9]", "'dw'"}, /* larger than its [6, 5] input */
        {"mp", "pool_size", "[2, 2, 2]", "pool_size"},
        {"mp", "strides", "-1", "strides"},
        {"mp", "padding", "1", "padding"},
        {"ap", "pool_size", "[2, 9]", "'ap'"}, /* larger than its [2, 2] input */
        {"zp", "padding", "-1", "padding"},
        {"zp", "padding", "[[1, 2]]", "padding"},
        {"zp", "padding", "[[1, 2], [3]]", "padding"},
        {"zp", "padding", "\"1\"", "padding"},
        {"zp", "padding", "[1, 2, 3]", "padding"},
        {"gap", "keepdims", "false", "keepdims"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        refused(json, bad[i][0], bad[i][1], bad[i][2], bad[i][3]);
    free(json);
    mp_model_free(a);
}

/* Shapes that do not fit are refused when the layer is created, naming the
 * layer (and the setting), before anything is allocated. */
static void refused_at_creation(int ndim, const int64_t *shape, const lcase *k, const char *want)
{
    mp_model *m = mp_model_new(1);
    mp_node x = mp_input(m, ndim, shape, NULL);
    mp_mem_stats before, after;
    mp_mem_get_stats(&before);
    int nparams = mp_model_num_params(m);
    mp_node y = add_layer(m, x, k, "bad");
    mp_mem_get_stats(&after);
    if (y != -1) fail_msg("%s on %d-D input was accepted", describe(k), ndim);
    if (!strstr(mp_last_error(), "'bad'") || !strstr(mp_last_error(), want))
        fail_msg("%s: '%s' not named in: %s", describe(k), want, mp_last_error());
    assert_int_equal(mp_model_num_params(m), nparams);
    assert_int_equal(before.total_current, after.total_current);
    assert_int_equal(mp_model_build(m, x, 1), MP_ERR_INVALID); /* the error is sticky */
    mp_model_free(m);
}

static void test_shape_refusals(void **state)
{
    (void)state;
    const int64_t img[] = {3, 3, 2}, flat[] = {8}, plane[] = {4, 4};
    const lcase big = C_(1, 3, 3, 2, 5, 5, 4, 1, 1, 1, 1, false, true, MP_ACT_NONE);
    refused_at_creation(3, img, &big, "5x5"); /* kernel larger than the input */
    const lcase dil = C_(1, 3, 3, 2, 3, 3, 4, 1, 1, 2, 2, false, true, MP_ACT_NONE);
    refused_at_creation(3, img, &dil, "dilation 2x2"); /* span 5 > 3 */
    refused_at_creation(1, flat, &big, "4-D");
    lcase k = C_(1, 3, 3, 2, 3, 3, 0, 1, 1, 1, 1, true, true, MP_ACT_NONE);
    refused_at_creation(3, img, &k, "filters");
    k.o = 4, k.kh = 0;
    refused_at_creation(3, img, &k, "kernel_size");
    k.kh = 3, k.sw = -1;
    refused_at_creation(3, img, &k, "strides");
    k.sw = k.sh = 2, k.dh = 2;
    refused_at_creation(3, img, &k, "dilation_rate");
    k.sw = k.sh = k.dh = 1, k.act = MP_ACT_SOFTMAX;
    refused_at_creation(3, img, &k, "activation");
    lcase d = D_(1, 3, 3, 2, 3, 3, 1, 1, 1, 1, false, true, MP_ACT_NONE);
    refused_at_creation(2, plane, &d, "4-D");
    d.kh = 4;
    refused_at_creation(3, img, &d, "4x3");
    lcase p = P_(MAXP, 1, 3, 3, 2, 4, 4, 4, 4, false);
    refused_at_creation(3, img, &p, "4x4");
    p.kind = AVGP;
    refused_at_creation(2, plane, &p, "4-D");
    p.kh = 2, p.sh = 0;
    refused_at_creation(3, img, &p, "strides");
    const lcase g = {GAP, 1, 3, 3, 2, 0, 0, 0, 1, 1, 1, 1, false, false, MP_ACT_NONE, {0}};
    refused_at_creation(1, flat, &g, "4-D");
    const lcase z = {PAD, 1, 3, 3, 2,     0,     0,           0,
                     1,   1, 1, 1, false, false, MP_ACT_NONE, {1, 1, -1, 0}};
    refused_at_creation(3, img, &z, "padding");
    refused_at_creation(2, plane, &z, "4-D");
    /* depth_multiplier through the constructor */
    mp_model *m = mp_model_new(1);
    mp_node x = mp_input(m, 3, img, NULL);
    mp_depthwise_conv2d_options o = mp_depthwise_conv2d_options_default(3, 3);
    o.depth_multiplier = 2;
    assert_int_equal(mp_depthwise_conv2d(m, x, &o, &(mp_layer_options){.name = "bad"}), -1);
    assert_non_null(strstr(mp_last_error(), "depth_multiplier"));
    mp_model_free(m);
}

/* ------------------------------------------------- (5) a small CNN */

enum { CNN_BATCH = 32 };

/* 8x8 images of three classes: a horizontal bar (0), a vertical bar (1) or
 * a diagonal (2), 4 to 6 pixels long at a random place, on noise
 * U(-0.2, 0.2): learnable by small filters and a global pooling. */
static void cnn_batch(uint64_t step, float *x, int32_t *labels)
{
    test_rng r = {0xC0FFEEull + 7919 * step};
    for (int i = 0; i < CNN_BATCH; i++) {
        float *img = x + i * 64;
        for (int p = 0; p < 64; p++) img[p] = (float)test_rng_uniform(&r, -0.2, 0.2);
        const int cls = (int)(test_rng_u32(&r) % 3), len = 4 + (int)(test_rng_u32(&r) % 3);
        const int rows = cls == 0 ? 1 : len, cols = cls == 1 ? 1 : len;
        const int r0 = (int)(test_rng_u32(&r) % (uint32_t)(9 - rows));
        const int c0 = (int)(test_rng_u32(&r) % (uint32_t)(9 - cols));
        for (int t = 0; t < len; t++)
            img[(r0 + (cls == 0 ? 0 : t)) * 8 + c0 + (cls == 1 ? 0 : t)] += 1.0f;
        labels[i] = cls;
    }
}

/* Input [8, 8, 1] -> Conv2D 8 3x3 same relu -> BatchNormalization ->
 * MaxPooling2D -> Conv2D 16 3x3 stride 2 same -> GlobalAveragePooling2D ->
 * Dense 3 -> Activation softmax (float32). */
static mp_model *cnn_model(const char *policy, uint64_t seed, bool compile)
{
    mp_model *m = mp_model_new_with_policy(seed, policy);
    mp_node x = mp_input(m, 3, (int64_t[]){8, 8, 1}, NULL);
    mp_conv2d_options c = mp_conv2d_options_default(8, 3, 3);
    c.padding = MP_PADDING_SAME, c.activation = MP_ACT_RELU;
    x = mp_conv2d(m, x, &c, NULL);
    x = mp_batch_norm(m, x, NULL, NULL);
    x = mp_max_pooling2d(m, x, NULL, NULL);
    c = mp_conv2d_options_default(16, 3, 3);
    c.strides[0] = c.strides[1] = 2, c.padding = MP_PADDING_SAME;
    x = mp_conv2d(m, x, &c, NULL);
    x = mp_global_average_pooling2d(m, x, NULL);
    x = mp_dense(m, x, 3, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    if (mp_model_build(m, x, CNN_BATCH)) fail_msg("%s", mp_last_error());
    if (compile) {
        mp_compile_options co = mp_compile_options_default();
        co.optimizer.learning_rate = 1e-2f;
        assert_int_equal(mp_model_compile(m, &co), MP_OK);
    }
    return m;
}

/* Train steps from..to-1 (batch i is cnn_batch(i)); the mean loss. */
static double cnn_train(mp_model *m, uint64_t from, uint64_t to)
{
    float x[CNN_BATCH * 64];
    int32_t labels[CNN_BATCH];
    double sum = 0;
    for (uint64_t s = from; s < to; s++) {
        cnn_batch(s, x, labels);
        mp_tensor in;
        mp_tensor_wrap(&in, MP_F32, 4, (int64_t[]){CNN_BATCH, 8, 8, 1}, x);
        mp_step_result r;
        if (mp_model_train_step(m, &in, labels, NULL, &r)) fail_msg("%s", mp_last_error());
        sum += r.loss;
    }
    return sum / (double)(to - from);
}

/* The loss falls to less than half its start in 60 steps (chance is ln 3
 * = 1.1), and a held-out batch is mostly right, under every policy. */
static void test_cnn_learns(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_bfloat16", "mixed_float16"};
    for (int pi = 0; pi < 3; pi++) {
        mp_model *m = cnn_model(policies[pi], 21, true);
        double first = cnn_train(m, 0, 5);
        cnn_train(m, 5, 55);
        double last = cnn_train(m, 55, 60);
        float x[CNN_BATCH * 64];
        int32_t labels[CNN_BATCH];
        cnn_batch(1000000, x, labels);
        mp_tensor in;
        mp_tensor_wrap(&in, MP_F32, 4, (int64_t[]){CNN_BATCH, 8, 8, 1}, x);
        mp_step_result r;
        assert_int_equal(mp_model_test_step(m, &in, labels, NULL, &r), MP_OK);
        assert_plan_exact(m, CNN_BATCH, policies[pi]); /* Conv2D keeps a copy of the data */
        if (!(last < 0.5 * first) || r.correct < CNN_BATCH * 3 / 4)
            fail_msg("%s: loss %.4f in the first 5 steps, %.4f in the last 5; held out %lld/%d "
                     "right",
                     policies[pi], first, last, (long long)r.correct, CNN_BATCH);
        mp_model_free(m);
    }
}

/* Outputs, parameters (the moving statistics too), optimizer state and
 * step counts of two models, bit for bit. A load refreshes compute copies
 * at the next forward: one inference forward each brings them up to date. */
static void assert_same_training(mp_model *a, mp_model *b, const char *what)
{
    float x[CNN_BATCH * 64];
    int32_t labels[CNN_BATCH];
    cnn_batch(777, x, labels);
    mp_tensor in;
    mp_tensor_wrap(&in, MP_F32, 4, (int64_t[]){CNN_BATCH, 8, 8, 1}, x);
    const mp_tensor *ya, *yb;
    float out[CNN_BATCH * 3];
    assert_int_equal(mp_model_forward(a, &in, false, &ya), MP_OK);
    memcpy(out, ya->data, sizeof out);
    assert_int_equal(mp_model_forward(b, &in, false, &yb), MP_OK);
    if (memcmp(out, yb->data, sizeof out)) fail_msg("%s: outputs differ", what);
    assert_same_params(a, b, what);
    mp_optimizer *oa = mp_model_optimizer(a), *ob = mp_model_optimizer(b);
    assert_int_equal(mp_optimizer_step_count(oa), mp_optimizer_step_count(ob));
    assert_int_equal(mp_optimizer_num_slots(oa), mp_optimizer_num_slots(ob));
    for (int i = 0; i < mp_model_num_params(a); i++)
        for (int k = 0; k < mp_optimizer_num_slots(oa); k++) {
            int64_t n;
            float *u = mp_optimizer_slot(oa, i, k, &n), *v = mp_optimizer_slot(ob, i, k, NULL);
            if (u && memcmp(u, v, (size_t)n * sizeof *u))
                fail_msg("%s: optimizer slot %d of parameter %d differs", what, k, i);
        }
    assert_int_equal(mp_model_steps_applied(a), mp_model_steps_applied(b));
    assert_int_equal(mp_model_steps_skipped(a), mp_model_steps_skipped(b));
    mp_loss_scaler *sa = mp_model_loss_scaler(a), *sb = mp_model_loss_scaler(b);
    assert_true((sa == NULL) == (sb == NULL));
    if (sa) assert_true(mp_loss_scaler_scale(sa) == mp_loss_scaler_scale(sb));
}

/* 16 steps straight = 8 steps, a checkpoint, a fresh model loading it (and
 * one rebuilt from the file alone), 8 more. */
static void test_cnn_checkpoint_resumes_exactly(void **state)
{
    (void)state;
    const char *policies[] = {"float32", "mixed_bfloat16", "mixed_float16"};
    for (int pi = 0; pi < 3; pi++) {
        char dir[64], path[128];
        assert_int_equal(test_scratch_dir(dir, sizeof dir, "mp_cnn"), 0);
        snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
        mp_model *straight = cnn_model(policies[pi], 3, true);
        cnn_train(straight, 0, 16);
        mp_model *first = cnn_model(policies[pi], 3, true);
        cnn_train(first, 0, 8);
        assert_int_equal(mp_model_save_checkpoint(first, path, NULL), MP_OK);
        mp_model *loaded = cnn_model(policies[pi], 99, false); /* other weights */
        if (mp_model_load_checkpoint(loaded, path, NULL)) fail_msg("%s", mp_last_error());
        assert_same_training(first, loaded, "after load");
        mp_model *rebuilt;
        if (mp_model_from_checkpoint(path, CNN_BATCH, &rebuilt, NULL))
            fail_msg("%s", mp_last_error());
        assert_same_training(first, rebuilt, "after rebuild");
        cnn_train(loaded, 8, 16);
        cnn_train(rebuilt, 8, 16);
        char what[64];
        snprintf(what, sizeof what, "%s, loaded", policies[pi]);
        assert_same_training(straight, loaded, what);
        snprintf(what, sizeof what, "%s, rebuilt", policies[pi]);
        assert_same_training(straight, rebuilt, what);
        mp_model_free(straight);
        mp_model_free(first);
        mp_model_free(loaded);
        mp_model_free(rebuilt);
        test_remove_tree(dir);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d),
        cmocka_unit_test(test_depthwise_conv2d),
        cmocka_unit_test(test_pooling2d),
        cmocka_unit_test(test_max_pooling_ties_and_nan),
        cmocka_unit_test(test_global_pooling_and_padding),
        cmocka_unit_test(test_mixed_policies),
        cmocka_unit_test(test_thread_count_independent),
        cmocka_unit_test(test_out_of_scratch),
        cmocka_unit_test(test_pure_policies),
        cmocka_unit_test(test_initial_kernels),
        cmocka_unit_test(test_config_round_trip),
        cmocka_unit_test(test_config_defaults_and_forms),
        cmocka_unit_test(test_config_refusals),
        cmocka_unit_test(test_shape_refusals),
        cmocka_unit_test(test_cnn_learns),
        cmocka_unit_test(test_cnn_checkpoint_resumes_exactly),
    };
    return cmocka_run_group_tests_name("conv_layers", tests, NULL, NULL);
}
