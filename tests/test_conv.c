/* test_conv.c - the implicit-GEMM convolution kernels against direct float64
 * loops written here: forward, filter gradient and data gradient, for
 * strides 1 and 2, `same` and `valid` padding (Keras's asymmetric padding
 * for even sizes), kernels 1, 3, 5 and even 2/4, dilation 2, odd image sizes,
 * batch 1, and float32/bfloat16/float16/fp8 inputs.
 *
 * Tolerance: every output is a dot product of K terms summed in float32 in
 * some order, so |computed - exact| <= gamma_K * sum |terms| with gamma_K =
 * K u / (1 - K u), u = 2^-24 (Higham, Accuracy and Stability, 3.1). Inputs
 * are rounded to their dtype first and the reference uses the rounded
 * values, so the inputs' own precision does not enter. A low-precision
 * output adds its unit roundoff times |result|.
 *
 * Channel counts that are multiples of 16 (and inputs of fewer than 16
 * channels) take the direct kernels on AVX-512 (conv_direct_avx512.c),
 * which sum in another order: the forward and data gradient along the
 * taps as the GEMM does, the filter gradient per image, then per fixed
 * chunk of images, then over the chunks. Any order of summing K terms in
 * float32 is a binary tree of at most K-1 additions on each path, so the
 * error is again at most gamma_{K-1} sum |terms| <= gamma_K sum |terms|
 * (Higham, 4.2), and the bounds above hold for both paths. The direct
 * cases run once on the active ISA and once on the portable GEMM
 * (MP_ISA_SCALAR), so both paths meet the reference. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels/conv.h"

typedef struct {
    int64_t n, h, w, c, kh, kw, o, sh, sw, dh, dw;
    bool same;
} conv_case;

static const conv_case cases[] = {
    {2, 7, 7, 3, 3, 3, 5, 1, 1, 1, 1, true},   {2, 7, 7, 3, 3, 3, 5, 1, 1, 1, 1, false},
    {1, 9, 8, 4, 3, 3, 6, 2, 2, 1, 1, true},   {3, 9, 8, 4, 3, 3, 6, 2, 2, 1, 1, false},
    {2, 6, 6, 2, 1, 1, 7, 1, 1, 1, 1, true},   {2, 6, 6, 2, 1, 1, 7, 2, 2, 1, 1, true},
    {1, 11, 10, 3, 5, 5, 4, 1, 1, 1, 1, true}, {2, 11, 10, 3, 5, 5, 4, 2, 2, 1, 1, false},
    {2, 8, 8, 3, 2, 2, 4, 1, 1, 1, 1, true},   {2, 9, 9, 3, 4, 4, 4, 2, 2, 1, 1, true},
    {1, 9, 9, 2, 3, 3, 3, 1, 1, 2, 2, true},   {2, 10, 9, 2, 3, 3, 3, 1, 2, 2, 1, false},
    {1, 5, 5, 17, 3, 3, 33, 1, 1, 1, 1, true}, {4, 14, 14, 16, 3, 3, 16, 2, 2, 1, 1, true},
};

static mp_conv_geom geom(int64_t n, int64_t h, int64_t w, int64_t c, int64_t kh, int64_t kw,
                         int64_t o, int64_t sh, int64_t sw, int64_t dh, int64_t dw)
{
    return (mp_conv_geom){.n = n,
                          .h = h,
                          .w = w,
                          .c = c,
                          .kh = kh,
                          .kw = kw,
                          .o = o,
                          .sh = sh,
                          .sw = sw,
                          .dh = dh,
                          .dw = dw};
}

static mp_conv_geom geom_of(const conv_case *k)
{
    mp_conv_geom g = geom(k->n, k->h, k->w, k->c, k->kh, k->kw, k->o, k->sh, k->sw, k->dh, k->dw);
    assert_int_equal(mp_conv_geom_init(&g, k->same), MP_OK);
    return g;
}

/* Random values rounded to dtype t: the typed array and its float64 copy. */
static void *random_in(mp_dtype t, int64_t n, uint64_t seed, double **exact)
{
    test_rng r = {seed};
    float *f = calloc((size_t)n, sizeof *f);
    void *typed = malloc((size_t)n * 4);
    *exact = malloc((size_t)n * sizeof **exact);
    for (int64_t i = 0; i < n; i++) f[i] = (float)test_rng_uniform(&r, -1, 1);
    mp_convert(typed, t, f, MP_F32, (size_t)n);
    mp_convert(f, MP_F32, typed, t, (size_t)n);
    for (int64_t i = 0; i < n; i++) (*exact)[i] = f[i];
    free(f);
    return typed;
}

static int64_t xi(const mp_conv_geom *g, int64_t n, int64_t h, int64_t w, int64_t c)
{
    return ((n * g->h + h) * g->w + w) * g->c + c;
}
static int64_t yi(const mp_conv_geom *g, int64_t n, int64_t h, int64_t w, int64_t o)
{
    return ((n * g->oh + h) * g->ow + w) * g->o + o;
}
static int64_t wi(const mp_conv_geom *g, int64_t kh, int64_t kw, int64_t c, int64_t o)
{
    return ((kh * g->kw + kw) * g->c + c) * g->o + o;
}

/* Visit every (output pixel, kernel entry) pair that reads the image. */
#define FOR_TAPS(g)                                                                                \
    for (int64_t n = 0; n < (g)->n; n++)                                                           \
        for (int64_t oh = 0; oh < (g)->oh; oh++)                                                   \
            for (int64_t ow = 0; ow < (g)->ow; ow++)                                               \
                for (int64_t kh = 0; kh < (g)->kh; kh++)                                           \
                    for (int64_t kw = 0; kw < (g)->kw; kw++)                                       \
                        for (int64_t ih = oh * (g)->sh - (g)->pt + kh * (g)->dh,                   \
                                     iw = ow * (g)->sw - (g)->pl + kw * (g)->dw, once = 1;         \
                             once; once = 0)                                                       \
                            if (ih >= 0 && ih < (g)->h && iw >= 0 && iw < (g)->w)

static void check(const float *got, const double *ref, const double *mag, int64_t n, double terms,
                  double out_u, const char *what, const conv_case *k)
{
    const double u = 0x1p-24, gamma = terms * u / (1 - terms * u);
    for (int64_t i = 0; i < n; i++) {
        double tol = gamma * mag[i] + out_u * fabs(ref[i]) * 1.0000001 + 1e-300;
        if (!(fabs(got[i] - ref[i]) <= tol))
            fail_msg("%s case %dx%dx%dx%d k%dx%d s%d d%d %s: element %lld is %.9g, want %.9g "
                     "(tolerance %.3g)",
                     what, (int)k->n, (int)k->h, (int)k->w, (int)k->c, (int)k->kh, (int)k->kw,
                     (int)k->sh, (int)k->dh, k->same ? "same" : "valid", (long long)i, got[i],
                     ref[i], tol);
    }
}

static void run_case(const conv_case *k, mp_dtype t, mp_dtype yt)
{
    mp_conv_geom g = geom_of(k);
    int64_t nx = g.n * g.h * g.w * g.c, ny = g.n * g.oh * g.ow * g.o, nw = g.kh * g.kw * g.c * g.o;
    double *xe, *we, *dye;
    void *x = random_in(t, nx, 1, &xe), *w = random_in(t, nw, 2, &we),
         *dy = random_in(t, ny, 3, &dye);
    float bias[128];
    for (int i = 0; i < 128; i++) bias[i] = 0.125f * (float)(i % 5) - 0.25f;
    double *ref = calloc((size_t)(nx > ny ? (nx > nw ? nx : nw) : (ny > nw ? ny : nw)), 8),
           *mag = calloc((size_t)(nx > ny ? (nx > nw ? nx : nw) : (ny > nw ? ny : nw)), 8);
    float *got = malloc((size_t)(nx > ny ? (nx > nw ? nx : nw) : (ny > nw ? ny : nw)) * 4);
    void *yout = malloc((size_t)ny * 4);
    double out_u = yt == MP_F32 ? 0 : yt == MP_BF16 ? 0x1p-8 : 0x1p-11;

    /* forward, with the bias and a relu fused */
    FOR_TAPS(&g)
    for (int64_t c = 0; c < g.c; c++)
        for (int64_t o = 0; o < g.o; o++) {
            double p = xe[xi(&g, n, ih, iw, c)] * we[wi(&g, kh, kw, c, o)];
            ref[yi(&g, n, oh, ow, o)] += p;
            mag[yi(&g, n, oh, ow, o)] += fabs(p);
        }
    for (int64_t i = 0; i < ny; i++) {
        ref[i] += bias[i % g.o];
        mag[i] += fabs(bias[i % g.o]);
        if (ref[i] < 0) ref[i] = 0; /* relu moves a value by at most its error */
    }
    assert_int_equal(mp_conv2d_forward(&g, x, t, w, t, bias, MP_ACT_RELU, yout, yt), MP_OK);
    mp_convert(got, MP_F32, yout, yt, (size_t)ny);
    check(got, ref, mag, ny, (double)(g.kh * g.kw * g.c + 1), out_u, "forward", k);

    /* filter gradient, then accumulated onto itself */
    memset(ref, 0, (size_t)nw * 8);
    memset(mag, 0, (size_t)nw * 8);
    FOR_TAPS(&g)
    for (int64_t c = 0; c < g.c; c++)
        for (int64_t o = 0; o < g.o; o++) {
            double p = xe[xi(&g, n, ih, iw, c)] * dye[yi(&g, n, oh, ow, o)];
            ref[wi(&g, kh, kw, c, o)] += p;
            mag[wi(&g, kh, kw, c, o)] += fabs(p);
        }
    assert_int_equal(mp_conv2d_backward_filter(&g, x, t, dy, t, got, false), MP_OK);
    double terms = (double)(g.n * g.oh * g.ow);
    check(got, ref, mag, nw, terms, 0, "filter", k);
    assert_int_equal(mp_conv2d_backward_filter(&g, x, t, dy, t, got, true), MP_OK);
    for (int64_t i = 0; i < nw; i++) {
        ref[i] *= 2;
        mag[i] *= 2;
    }
    check(got, ref, mag, nw, terms + 1, 0, "filter accumulated", k);

    /* data gradient */
    memset(ref, 0, (size_t)nx * 8);
    memset(mag, 0, (size_t)nx * 8);
    FOR_TAPS(&g)
    for (int64_t c = 0; c < g.c; c++)
        for (int64_t o = 0; o < g.o; o++) {
            double p = dye[yi(&g, n, oh, ow, o)] * we[wi(&g, kh, kw, c, o)];
            ref[xi(&g, n, ih, iw, c)] += p;
            mag[xi(&g, n, ih, iw, c)] += fabs(p);
        }
    void *dx = malloc((size_t)nx * 4);
    assert_int_equal(mp_conv2d_backward_data(&g, dy, t, w, t, dx, yt), MP_OK);
    mp_convert(got, MP_F32, dx, yt, (size_t)nx);
    check(got, ref, mag, nx, (double)(g.kh * g.kw * g.o), out_u, "data", k);

    free(dx);
    free(yout);
    free(got);
    free(ref);
    free(mag);
    free(x);
    free(w);
    free(dy);
    free(xe);
    free(we);
    free(dye);
}

static void test_float32(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], MP_F32, MP_F32);
}

static void test_low_precision_inputs(void **state)
{
    (void)state;
    const mp_dtype types[] = {MP_BF16, MP_F16, MP_F8E4M3, MP_F8E5M2};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int t = 0; t < 4; t++) run_case(&cases[i], types[t], MP_F32);
}

static void test_low_precision_outputs(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_case(&cases[i], MP_BF16, MP_BF16);
        run_case(&cases[i], MP_F16, MP_F16);
    }
}

/* Shapes of the direct kernels: c and o multiples of 16 (o = 48 and 80: a
 * chunk of 3 vectors, and 64 + 16), c = 1 and 3 (an image), strides 1
 * and 2, both paddings, kernels 1/3/5 and even 4, odd sizes, rows wider
 * than one tile (ow > 28 for o = 16), batch 1. */
static const conv_case direct_cases[] = {
    {2, 9, 11, 16, 3, 3, 16, 1, 1, 1, 1, true},   {1, 9, 11, 16, 3, 3, 16, 1, 1, 1, 1, false},
    {2, 7, 31, 16, 3, 3, 16, 1, 1, 1, 1, true},   {3, 13, 9, 32, 3, 3, 32, 2, 2, 1, 1, true},
    {2, 13, 9, 32, 3, 3, 48, 2, 2, 1, 1, false},  {1, 8, 7, 16, 1, 1, 32, 2, 2, 1, 1, true},
    {2, 7, 7, 64, 3, 3, 64, 1, 1, 1, 1, true},    {2, 9, 9, 32, 5, 5, 80, 1, 1, 1, 1, true},
    {1, 11, 10, 16, 5, 5, 16, 2, 2, 1, 1, false}, {2, 9, 9, 16, 4, 4, 32, 1, 1, 1, 1, true},
    {2, 9, 10, 16, 3, 3, 16, 2, 1, 1, 1, true},   {2, 10, 9, 1, 3, 3, 16, 1, 1, 1, 1, true},
    {1, 9, 9, 3, 3, 3, 32, 2, 2, 1, 1, false},    {2, 6, 6, 16, 3, 3, 16, 1, 1, 2, 2, true},
};

static void test_direct_kernels(void **state)
{
    (void)state;
    /* the active path (its measured choice), then each path forced: float32
     * FMA on AVX2 and on AVX-512, vdpbf16ps for bfloat16 operands on
     * AVX512_BF16, the AMX tiles' route (conv_tiles.c: stride 1, c or o a
     * multiple of 16), and the portable GEMM */
    const mp_isa paths[] = {MP_ISA_COUNT,      MP_ISA_AVX2, MP_ISA_AVX512,
                            MP_ISA_AVX512BF16, MP_ISA_AMX,  MP_ISA_SCALAR};
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (paths[p] != MP_ISA_COUNT) {
            if (!mp_isa_supported(paths[p])) continue;
            assert_int_equal(mp_isa_set(paths[p]), MP_OK);
        }
        for (size_t i = 0; i < sizeof direct_cases / sizeof direct_cases[0]; i++) {
            run_case(&direct_cases[i], MP_F32, MP_F32);
            run_case(&direct_cases[i], MP_BF16, MP_BF16);
            run_case(&direct_cases[i], MP_BF16, MP_F32);
            run_case(&direct_cases[i], MP_F16, MP_F32);
            run_case(&direct_cases[i], MP_F8E4M3, MP_F32);
        }
        mp_isa_reset();
    }
}

/* The direct kernels give the same bits on 1 and 2 threads: every output
 * is summed in an order fixed by the shape (threads take whole images, or
 * whole chunks of images for the filter gradient); stride 1 and 2, float32
 * and bfloat16 inputs. */
static void direct_thread_count(const conv_case *k, mp_dtype t)
{
    mp_conv_geom g = geom_of(k);
    int64_t nx = g.n * g.h * g.w * g.c, ny = g.n * g.oh * g.ow * g.o, nw = g.kh * g.kw * g.c * g.o;
    double *xe, *we, *dye;
    void *x = random_in(t, nx, 1, &xe), *w = random_in(t, nw, 2, &we),
         *dy = random_in(t, ny, 3, &dye);
    float *out[2][3];
    for (int nt = 0; nt < 2; nt++) {
        mp_set_num_threads(nt + 1);
        out[nt][0] = malloc((size_t)ny * 4);
        out[nt][1] = malloc((size_t)nw * 4);
        out[nt][2] = malloc((size_t)nx * 4);
        assert_int_equal(mp_conv2d_forward(&g, x, t, w, t, NULL, MP_ACT_NONE, out[nt][0], MP_F32),
                         MP_OK);
        assert_int_equal(mp_conv2d_backward_filter(&g, x, t, dy, t, out[nt][1], false), MP_OK);
        assert_int_equal(mp_conv2d_backward_data(&g, dy, t, w, t, out[nt][2], MP_F32), MP_OK);
    }
    mp_set_num_threads(0);
    assert_memory_equal(out[0][0], out[1][0], (size_t)ny * 4);
    assert_memory_equal(out[0][1], out[1][1], (size_t)nw * 4);
    assert_memory_equal(out[0][2], out[1][2], (size_t)nx * 4);
    for (int nt = 0; nt < 2; nt++)
        for (int i = 0; i < 3; i++) free(out[nt][i]);
    free(x), free(w), free(dy), free(xe), free(we), free(dye);
}

static void test_direct_thread_count(void **state)
{
    (void)state;
    /* k3: the AMX route's filter gradient (3 x 64 rows of C), where it runs */
    const conv_case k1 = {5, 14, 14, 32, 3, 3, 32, 1, 1, 1, 1, true},
                    k2 = {5, 15, 14, 16, 3, 3, 32, 2, 2, 1, 1, true},
                    k3 = {11, 7, 7, 64, 3, 3, 64, 1, 1, 1, 1, true};
    for (int i = 0; i < 2; i++) { /* float32, and bfloat16 (vdpbf16ps where it is chosen) */
        direct_thread_count(&k1, i ? MP_BF16 : MP_F32);
        direct_thread_count(&k2, i ? MP_BF16 : MP_F32);
        direct_thread_count(&k3, i ? MP_BF16 : MP_F32);
    }
}

/* Keras's sizes: `same` is ceil(in / stride) with the odd pad after;
 * `valid` is floor((in - span) / stride) + 1. */
static void test_geometry(void **state)
{
    (void)state;
    mp_conv_geom g = geom(1, 8, 7, 1, 3, 2, 1, 2, 2, 1, 1);
    assert_int_equal(mp_conv_geom_init(&g, true), MP_OK);
    assert_true(g.oh == 4 && g.ow == 4);
    assert_true(g.pt == 0 && g.pl == 0); /* total pads 1 and 1: both after */
    g = geom(1, 9, 9, 1, 4, 4, 1, 1, 1, 1, 1);
    assert_int_equal(mp_conv_geom_init(&g, true), MP_OK);
    assert_true(g.oh == 9 && g.pt == 1); /* total pad 3: 1 before, 2 after */
    g = geom(1, 9, 9, 1, 3, 3, 1, 2, 2, 2, 2);
    assert_int_equal(mp_conv_geom_init(&g, false), MP_OK);
    assert_true(g.oh == 3 && g.pt == 0); /* span 5: (9 - 5) / 2 + 1 */
    g = geom(1, 4, 4, 1, 5, 5, 1, 1, 1, 1, 1);
    assert_int_equal(mp_conv_geom_init(&g, false), MP_ERR_INVALID);
    g = geom(1, 4, 4, 1, 3, 3, 1, 0, 1, 1, 1);
    assert_int_equal(mp_conv_geom_init(&g, true), MP_ERR_INVALID);
}

/* A non-finite input to the filter gradient: the AMX route
 * (conv_tiles_filter.c) would meet it in products the exact sum does not
 * have (its virtual pixels times dy's zeros: NaN), so it leaves such an x
 * to the direct kernels, whose bits the result must then be: +inf at the
 * last column of a 7x7 image reaches only taps kw 1 and 2 of rows kh 0 and
 * 1, and the other taps' channel-0 sums stay finite. */
static void test_filter_nonfinite_input(void **state)
{
    (void)state;
    const conv_case k = {1, 7, 7, 64, 3, 3, 64, 1, 1, 1, 1, true};
    mp_conv_geom g = geom_of(&k);
    const int64_t nx = g.n * g.h * g.w * g.c, ny = g.n * g.oh * g.ow * g.o,
                  nw = g.kh * g.kw * g.c * g.o;
    double *xe, *dye;
    uint16_t *x = random_in(MP_BF16, nx, 1, &xe), *dy = random_in(MP_BF16, ny, 3, &dye);
    x[6 * g.c] = 0x7F80; /* x[0][0][6][0] = +inf */
    float *dw[2] = {malloc((size_t)nw * 4), malloc((size_t)nw * 4)};
    const mp_isa paths[2] = {MP_ISA_AVX512, MP_ISA_AMX};
    for (int i = 0; i < 2; i++) {
        if (!mp_isa_supported(paths[i])) continue;
        assert_int_equal(mp_isa_set(paths[i]), MP_OK);
        assert_int_equal(mp_conv2d_backward_filter(&g, x, MP_BF16, dy, MP_BF16, dw[i], false),
                         MP_OK);
        for (int64_t kh = 0; kh < g.kh; kh++)
            for (int64_t kw = 0; kw < g.kw; kw++)
                for (int64_t o = 0; o < g.o; o++) {
                    const float v = dw[i][((kh * g.kw + kw) * g.c) * g.o + o];
                    if ((kh == 2 || kw == 0) && !isfinite(v))
                        fail_msg("%s: dW[%lld][%lld][0][%lld] = %g, the inf is not in its sum",
                                 mp_isa_name(paths[i]), (long long)kh, (long long)kw, (long long)o,
                                 (double)v);
                }
    }
    mp_isa_reset();
    if (mp_isa_supported(MP_ISA_AMX) && mp_isa_supported(MP_ISA_AVX512))
        assert_memory_equal(dw[0], dw[1], (size_t)nw * 4);
    free(dw[0]), free(dw[1]), free(x), free(dy), free(xe), free(dye);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometry),
        cmocka_unit_test(test_float32),
        cmocka_unit_test(test_low_precision_inputs),
        cmocka_unit_test(test_low_precision_outputs),
        cmocka_unit_test(test_direct_kernels),
        cmocka_unit_test(test_direct_thread_count),
        cmocka_unit_test(test_filter_nonfinite_input),
    };
    return cmocka_run_group_tests_name("conv", tests, NULL, NULL);
}
