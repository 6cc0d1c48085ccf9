/* test_augment.c - the data-augmentation layers RandomFlip and
 * RandomTranslation: outside training the output is the input bit for bit
 * (a view, or the one cast copy); in training every sample is exactly one of
 * the allowed transforms of its input, against a reference written here (a
 * flip then a shift as an index map), under float32, mixed_bfloat16 and
 * mixed_float16 (exact copies, no rounding); the decisions follow the
 * forward counter (same count, same draws; next count, new draws; per sample
 * whatever the batch, and per global row in a data-parallel shard) and their frequencies are within
 * 5 sigma of the binomial expectations; backward is the transpose (the reference scatter bit for
 * bit, and <J v, w> == <v, J^T w> exactly in float64); the saved bytes are what the forward takes;
 * a model with both layers resumes from a checkpoint bit for bit (and would not without the
 * restored counter); the configuration round-trips, and bad settings and non-image inputs are
 * refused naming the layer and the field. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static const char *const policies[] = {"float32", "mixed_bfloat16", "mixed_float16"};
enum { NPOLICIES = 3 };

static mp_dtype compute_of(const char *policy)
{
    mp_policy p;
    assert_int_equal(mp_policy_from_name(policy, &p), MP_OK);
    return p.compute;
}

/* ------------------------------------------------------------- reference */

/* A flip then a shift: out[i][j] = flipped(in)[i - dy][j - dx], 0 outside;
 * flipped(in)[a][b] = in[fv ? h-1-a : a][fh ? w-1-b : b]. */
typedef struct {
    int fv, fh, dy, dx;
} xform;

/* The input pixel (si, sj) that output pixel (i, j) reads; false: fill. */
static bool xform_src(const xform *t, int64_t h, int64_t w, int64_t i, int64_t j, int64_t *si,
                      int64_t *sj)
{
    int64_t a = i - t->dy, b = j - t->dx;
    if (a < 0 || a >= h || b < 0 || b >= w) return false;
    *si = t->fv ? h - 1 - a : a;
    *sj = t->fh ? w - 1 - b : b;
    return true;
}

/* One sample, pixel by pixel (pix bytes each): a gather. */
static void ref_forward(char *y, const char *x, const xform *t, int64_t h, int64_t w, size_t pix)
{
    for (int64_t i = 0; i < h; i++)
        for (int64_t j = 0; j < w; j++) {
            int64_t si, sj;
            char *d = y + (size_t)(i * w + j) * pix;
            if (xform_src(t, h, w, i, j, &si, &sj))
                memcpy(d, x + (size_t)(si * w + sj) * pix, pix);
            else
                memset(d, 0, pix);
        }
}

/* The transpose of ref_forward, written as a scatter: every input pixel
 * gets the gradient of the output pixel that read it, or 0. */
static void ref_transpose(char *gx, const char *gy, const xform *t, int64_t h, int64_t w,
                          size_t pix)
{
    memset(gx, 0, (size_t)(h * w) * pix);
    for (int64_t i = 0; i < h; i++)
        for (int64_t j = 0; j < w; j++) {
            int64_t si, sj;
            if (xform_src(t, h, w, i, j, &si, &sj))
                memcpy(gx + (size_t)(si * w + sj) * pix, gy + (size_t)(i * w + j) * pix, pix);
        }
}

/* The largest shift a factor allows along `size` pixels: |round(u size)|
 * for |u| <= factor, rounding half away from zero. */
static int max_shift(float factor, int64_t size)
{
    return (int)floor((double)factor * (double)size + 0.5);
}

/* ------------------------------------------------------------- the rig */

/* Input [h*w*c] -> Reshape [h, w, c] -> RandomFlip (flip_mode > 0) ->
 * RandomTranslation (fy >= 0). The Reshape gives the augmentation a
 * producer in the compute dtype that takes a gradient. */
typedef struct {
    mp_model *m;
    mp_node pre, flip, shift, out;
    int64_t h, w, c;
    int flip_mode;
    float fy, fx;
    mp_dtype ct;
} rig;

static rig make_rig(const char *policy, int64_t h, int64_t w, int64_t c, int flip_mode, float fy,
                    float fx, int64_t max_batch, uint64_t seed)
{
    rig r = {.h = h, .w = w, .c = c, .flip_mode = flip_mode, .fy = fy, .fx = fx};
    r.ct = compute_of(policy);
    r.m = mp_model_new_with_policy(1, policy);
    assert_non_null(r.m);
    mp_node x = mp_input(r.m, 1, (int64_t[]){h * w * c}, NULL);
    r.out = r.pre = mp_reshape(r.m, x, 3, (int64_t[]){h, w, c}, NULL);
    r.flip = r.shift = -1;
    if (flip_mode > 0)
        r.out = r.flip =
            mp_random_flip(r.m, r.out, (mp_flip_mode)flip_mode, &(mp_layer_options){.seed = seed});
    if (fy >= 0)
        r.out = r.shift =
            mp_random_translation(r.m, r.out, fy, fx, &(mp_layer_options){.seed = seed + 1});
    assert_true(r.out >= 0);
    assert_int_equal(mp_model_build(r.m, r.out, max_batch), MP_OK);
    return r;
}

/* Pixel p of every sample holds p + 1: distinct and nonzero within a sample,
 * so different transforms give different outputs, and exact in every dtype
 * for images of up to 256 elements. */
static float *counting_input(const rig *r, int64_t batch)
{
    int64_t per = r->h * r->w * r->c;
    float *x = malloc((size_t)(batch * per) * sizeof *x);
    for (int64_t n = 0; n < batch; n++)
        for (int64_t p = 0; p < per; p++) x[n * per + p] = (float)(p + 1);
    return x;
}

/* Multiples of 1/64 in (-2, 2): exact in bfloat16 and float16, and their
 * products and sums exact in float64. */
static void fill_dyadic(float *x, int64_t n, uint64_t seed)
{
    test_rng g = {seed};
    for (int64_t i = 0; i < n; i++) x[i] = (float)((int)(test_rng_u32(&g) % 255) - 127) / 64.0f;
}

static const mp_tensor *forward(rig *r, const float *x, int64_t batch, bool training)
{
    mp_tensor t;
    mp_tensor_wrap(&t, MP_F32, 2, (int64_t[]){batch, r->h * r->w * r->c}, (void *)x);
    const mp_tensor *y;
    assert_int_equal(mp_model_forward(r->m, &t, training, &y), MP_OK);
    return y;
}

/* The allowed transforms of the rig, in a fixed order. */
static int candidates(const rig *r, xform *out)
{
    int nf = 0;
    int fvs = r->flip_mode & MP_FLIP_VERTICAL ? 2 : 1,
        fhs = r->flip_mode & MP_FLIP_HORIZONTAL ? 2 : 1;
    int ey = r->fy >= 0 ? max_shift(r->fy, r->h) : 0, ex = r->fy >= 0 ? max_shift(r->fx, r->w) : 0;
    for (int fv = 0; fv < fvs; fv++)
        for (int fh = 0; fh < fhs; fh++)
            for (int dy = -ey; dy <= ey; dy++)
                for (int dx = -ex; dx <= ex; dx++) out[nf++] = (xform){fv, fh, dy, dx};
    return nf;
}

/* After a training forward: which allowed transform each sample got, from
 * the input (the Reshape's output, compute dtype) and the output, bit for
 * bit; fails unless exactly one fits each sample. */
static void identify(const rig *r, int64_t batch, xform *got)
{
    const mp_tensor *in = mp_model_node_output(r->m, r->pre),
                    *out = mp_model_node_output(r->m, r->out);
    assert_int_equal(out->dtype, r->ct);
    assert_int_equal(in->dtype, r->ct);
    size_t pix = (size_t)r->c * mp_dtype_size(r->ct), img = (size_t)(r->h * r->w) * pix;
    xform cand[4 * 64 * 64];
    int nc = candidates(r, cand);
    char *ref = malloc(img);
    for (int64_t n = 0; n < batch; n++) {
        int found = -1;
        for (int k = 0; k < nc; k++) {
            ref_forward(ref, (const char *)in->data + n * img, &cand[k], r->h, r->w, pix);
            if (memcmp(ref, (const char *)out->data + n * img, img)) continue;
            if (found >= 0) fail_msg("sample %lld fits two transforms", (long long)n);
            found = k;
        }
        if (found < 0) fail_msg("sample %lld is none of the allowed transforms", (long long)n);
        got[n] = cand[found];
    }
    free(ref);
}

static bool same_xform(const xform *a, const xform *b)
{
    return a->fv == b->fv && a->fh == b->fh && a->dy == b->dy && a->dx == b->dx;
}

/* Backward with a dyadic dy after a training forward whose transforms are
 * `t`: the Reshape's gradient is the reference scatter of dy, bit for bit. */
static void check_backward(rig *r, int64_t batch, const xform *t, uint64_t seed)
{
    int64_t per = r->h * r->w * r->c;
    float *dy = malloc((size_t)(batch * per) * sizeof *dy);
    fill_dyadic(dy, batch * per, seed);
    mp_tensor tdy;
    mp_tensor_wrap(&tdy, MP_F32, 4, (int64_t[]){batch, r->h, r->w, r->c}, dy);
    assert_int_equal(mp_model_backward(r->m, &tdy, false), MP_OK);
    const mp_tensor *gx = mp_model_node_grad(r->m, r->pre);
    assert_non_null(gx);
    assert_int_equal(gx->dtype, r->ct);
    size_t es = mp_dtype_size(r->ct), pix = (size_t)r->c * es, img = (size_t)(r->h * r->w) * pix;
    char *dyc = malloc((size_t)(batch * per) * es), *want = malloc(img);
    mp_convert(dyc, r->ct, dy, MP_F32, (size_t)(batch * per)); /* exact: dyadic */
    for (int64_t n = 0; n < batch; n++) {
        ref_transpose(want, dyc + n * img, &t[n], r->h, r->w, pix);
        if (memcmp(want, (const char *)gx->data + n * img, img))
            fail_msg("sample %lld: the gradient is not the transpose", (long long)n);
    }
    free(dy);
    free(dyc);
    free(want);
}

/* ------------------------------------------------- outside training */

/* Outside training both layers are the identity: a view of a producer in
 * the compute dtype, a cast copy of user data; bits kept (-0, NaN payload);
 * the gradient passes through unchanged. */
static void test_identity_outside_training(void **state)
{
    (void)state;
    enum { H = 5, W = 4, C = 3, B = 6, PER = H * W * C };
    float x[B * PER], dy[B * PER];
    fill_dyadic(x, B * PER, 1);
    fill_dyadic(dy, B * PER, 2);
    x[3] = -0.0f;
    x[7] = bits_f32(0x7FC12345u);  /* a quiet NaN with a payload */
    x[11] = bits_f32(0x00000001u); /* the smallest subnormal */
    for (int pi = 0; pi < NPOLICIES; pi++)
        for (int kind = 0; kind < 3; kind++) {
            /* kind 0: flip, 1: translation, 2: both */
            rig r = make_rig(policies[pi], H, W, C, kind != 1 ? MP_FLIP_HORIZONTAL_AND_VERTICAL : 0,
                             kind != 0 ? 0.5f : -1.0f, 0.5f, B, 9);
            const mp_tensor *y = forward(&r, x, B, false);
            const mp_tensor *in = mp_model_node_output(r.m, r.pre);
            assert_int_equal(y->dtype, r.ct);
            assert_ptr_equal(y->data, in->data); /* a view */
            size_t es = mp_dtype_size(r.ct);
            char want[B * PER * 4];
            mp_convert(want, r.ct, x, MP_F32, B * PER);
            assert_memory_equal(y->data, want, B * PER * es);
            mp_tensor tdy;
            mp_tensor_wrap(&tdy, MP_F32, 4, (int64_t[]){B, H, W, C}, dy);
            assert_int_equal(mp_model_backward(r.m, &tdy, false), MP_OK);
            mp_convert(want, r.ct, dy, MP_F32, B * PER);
            assert_memory_equal(mp_model_node_grad(r.m, r.pre)->data, want, B * PER * es);
            mp_model_free(r.m);
            /* straight on user data: one copy in the compute dtype */
            mp_model *m = mp_model_new_with_policy(1, policies[pi]);
            mp_node n = mp_input(m, 3, (int64_t[]){H, W, C}, NULL);
            if (kind != 1) n = mp_random_flip(m, n, MP_FLIP_HORIZONTAL_AND_VERTICAL, NULL);
            if (kind != 0) n = mp_random_translation(m, n, 0.5f, 0.5f, NULL);
            assert_int_equal(mp_model_build(m, n, B), MP_OK);
            mp_tensor tx;
            mp_tensor_wrap(&tx, MP_F32, 4, (int64_t[]){B, H, W, C}, x);
            assert_int_equal(mp_model_forward(m, &tx, false, &y), MP_OK);
            assert_ptr_not_equal(y->data, x);
            mp_convert(want, r.ct, x, MP_F32, B * PER);
            assert_memory_equal(y->data, want, B * PER * es);
            /* an inference forward moves no counter */
            assert_int_equal(mp_model_forward_count(m), 0);
            mp_model_free(m);
        }
}

/* ------------------------------------------------------------ RandomFlip */

/* In training each sample is exactly one of the flips its mode allows, in
 * every policy (exact copies of the compute-dtype input), and the gradient
 * is flipped back. The draws follow the counter: the same count gives the
 * same flips, the next count new ones, and a sample's flip does not depend
 * on the batch it is in. */
static void test_flip_training(void **state)
{
    (void)state;
    enum { H = 5, W = 6, C = 2, B = 64 };
    const int modes[3] = {MP_FLIP_HORIZONTAL, MP_FLIP_VERTICAL, MP_FLIP_HORIZONTAL_AND_VERTICAL};
    for (int pi = 0; pi < NPOLICIES; pi++)
        for (int mi = 0; mi < 3; mi++) {
            rig r = make_rig(policies[pi], H, W, C, modes[mi], -1.0f, 0, B, 21);
            float x[B * H * W * C];
            fill_dyadic(x, B * H * W * C, 3);
            xform a[B], b[B], c[B];
            mp_model_set_forward_count(r.m, 5);
            forward(&r, x, B, true);
            assert_int_equal(mp_model_forward_count(r.m), 6);
            identify(&r, B, a);
            check_backward(&r, B, a, 4);
            int seen[2][2] = {{0}};
            for (int n = 0; n < B; n++) seen[a[n].fv][a[n].fh]++;
            if (modes[mi] == MP_FLIP_HORIZONTAL) assert_true(seen[0][0] && seen[0][1]);
            if (modes[mi] == MP_FLIP_VERTICAL) assert_true(seen[0][0] && seen[1][0]);
            if (modes[mi] == MP_FLIP_HORIZONTAL_AND_VERTICAL)
                assert_true(seen[0][0] && seen[0][1] && seen[1][0] && seen[1][1]);
            /* the same count: the same flips */
            mp_model_set_forward_count(r.m, 5);
            forward(&r, x, B, true);
            identify(&r, B, b);
            for (int n = 0; n < B; n++) assert_true(same_xform(&a[n], &b[n]));
            /* a smaller batch at that count: the same flips per sample */
            mp_model_set_forward_count(r.m, 5);
            forward(&r, x, 9, true);
            identify(&r, 9, b);
            for (int n = 0; n < 9; n++) assert_true(same_xform(&a[n], &b[n]));
            /* a data-parallel shard of rows 20..28 at that count: the flips
             * of those rows of the whole batch */
            mp_model_set_forward_count(r.m, 5);
            mp_model_set_row_offset(r.m, 20);
            forward(&r, x + 20 * H * W * C, 9, true);
            mp_model_set_row_offset(r.m, 0);
            identify(&r, 9, b);
            for (int n = 0; n < 9; n++) assert_true(same_xform(&a[20 + n], &b[n]));
            /* the next count: other flips for some samples */
            forward(&r, x, B, true);
            identify(&r, B, c);
            int differ = 0;
            for (int n = 0; n < B; n++) differ += !same_xform(&a[n], &c[n]);
            assert_true(differ > 0);
            mp_model_free(r.m);
        }
    /* another seed draws other flips at the same count */
    rig r1 = make_rig("float32", H, W, C, MP_FLIP_HORIZONTAL, -1.0f, 0, B, 21);
    rig r2 = make_rig("float32", H, W, C, MP_FLIP_HORIZONTAL, -1.0f, 0, B, 22);
    float *x = counting_input(&r1, B);
    xform a[B], b[B];
    forward(&r1, x, B, true);
    identify(&r1, B, a);
    forward(&r2, x, B, true);
    identify(&r2, B, b);
    int differ = 0;
    for (int n = 0; n < B; n++) differ += !same_xform(&a[n], &b[n]);
    assert_true(differ > 0);
    free(x);
    mp_model_free(r1.m);
    mp_model_free(r2.m);
}

/* Over N = 4 x 4096 samples (4 counts) each axis flips a Binomial(N, 1/2)
 * number of times: within 5 sigma = 5 sqrt(N / 4) of N / 2. Both axes flip
 * together Binomial(N, 1/4) times (the axes draw independently): within
 * 5 sqrt(N 3 / 16) of N / 4. A mode never flips the axis it leaves out. */
static void test_flip_frequencies(void **state)
{
    (void)state;
    enum { H = 4, W = 3, C = 1, B = 4096, STEPS = 4 };
    const double N = (double)B * STEPS;
    const int modes[3] = {MP_FLIP_HORIZONTAL, MP_FLIP_VERTICAL, MP_FLIP_HORIZONTAL_AND_VERTICAL};
    xform *t = malloc(B * sizeof *t);
    for (int mi = 0; mi < 3; mi++) {
        rig r = make_rig("float32", H, W, C, modes[mi], -1.0f, 0, B, 31 + (uint64_t)mi);
        float *x = counting_input(&r, B);
        double kv = 0, kh = 0, kboth = 0;
        for (int s = 0; s < STEPS; s++) {
            forward(&r, x, B, true);
            identify(&r, B, t);
            for (int n = 0; n < B; n++) {
                kv += t[n].fv;
                kh += t[n].fh;
                kboth += t[n].fv && t[n].fh;
            }
        }
        double bound = 5 * sqrt(N / 4);
        if (modes[mi] & MP_FLIP_VERTICAL) {
            if (fabs(kv - N / 2) > bound) fail_msg("vertical flips %g of %g", kv, N);
        } else {
            assert_true(kv == 0);
        }
        if (modes[mi] & MP_FLIP_HORIZONTAL) {
            if (fabs(kh - N / 2) > bound) fail_msg("horizontal flips %g of %g", kh, N);
        } else {
            assert_true(kh == 0);
        }
        if (modes[mi] == MP_FLIP_HORIZONTAL_AND_VERTICAL &&
            fabs(kboth - N / 4) > 5 * sqrt(N * 3 / 16))
            fail_msg("both flipped %g of %g", kboth, N);
        free(x);
        mp_model_free(r.m);
    }
    free(t);
}

/* ---------------------------------------------------- RandomTranslation */

/* In training each sample is exactly one shift within +-round(factor size)
 * (zeros coming in), in every policy; the gradient is shifted back with
 * zeros for pixels shifted out; draws follow the counter. Factor 0 on an
 * axis never shifts it. */
static void test_translation_training(void **state)
{
    (void)state;
    enum { H = 7, W = 6, C = 2, B = 64 };
    const float factors[3][2] = {{0.25f, 0.5f}, {0.0f, 0.375f}, {0.9f, 0.0f}};
    for (int pi = 0; pi < NPOLICIES; pi++)
        for (int fi = 0; fi < 3; fi++) {
            rig r = make_rig(policies[pi], H, W, C, 0, factors[fi][0], factors[fi][1], B, 41);
            float x[B * H * W * C];
            fill_dyadic(x, B * H * W * C, 5);
            for (int i = 0; i < B * H * W * C; i++)
                if (x[i] == 0) x[i] = 1; /* nonzero, so fill is told apart */
            xform a[B], b[B], c[B];
            mp_model_set_forward_count(r.m, 100);
            forward(&r, x, B, true);
            identify(&r, B, a);
            check_backward(&r, B, a, 6);
            int moved_y = 0, moved_x = 0;
            for (int n = 0; n < B; n++) {
                moved_y += a[n].dy != 0;
                moved_x += a[n].dx != 0;
            }
            assert_true(factors[fi][0] == 0 ? moved_y == 0 : moved_y > 0);
            assert_true(factors[fi][1] == 0 ? moved_x == 0 : moved_x > 0);
            mp_model_set_forward_count(r.m, 100);
            forward(&r, x, B, true);
            identify(&r, B, b);
            for (int n = 0; n < B; n++) assert_true(same_xform(&a[n], &b[n]));
            mp_model_set_forward_count(r.m, 100);
            forward(&r, x, 3, true);
            identify(&r, 3, b);
            for (int n = 0; n < 3; n++) assert_true(same_xform(&a[n], &b[n]));
            mp_model_set_forward_count(r.m, 100);
            mp_model_set_row_offset(r.m, 33); /* a shard: rows 33..39 of the batch */
            forward(&r, x + 33 * H * W * C, 7, true);
            mp_model_set_row_offset(r.m, 0);
            identify(&r, 7, b);
            for (int n = 0; n < 7; n++) assert_true(same_xform(&a[33 + n], &b[n]));
            forward(&r, x, B, true);
            identify(&r, B, c);
            int differ = 0;
            for (int n = 0; n < B; n++) differ += !same_xform(&a[n], &c[n]);
            assert_true(differ > 0);
            mp_model_free(r.m);
        }
}

/* P(shift = d) for a shift round(u size), u uniform in [-f, f): the length
 * of [d - 1/2, d + 1/2] inside [-f size, f size], over 2 f size. */
static double shift_probability(int d, float f, int64_t size)
{
    double e = (double)f * (double)size;
    double lo = fmax(d - 0.5, -e), hi = fmin(d + 0.5, e);
    return hi > lo ? (hi - lo) / (2 * e) : 0;
}

/* Over N = 4 x 4096 samples each shift value d turns up Binomial(N, p_d)
 * times: within 5 sqrt(N p_d (1 - p_d)) of N p_d, per axis, and never
 * outside the range. f size = 2 and 3 here: p = 1/8, 1/4, 1/4, 1/4, 1/8 and
 * 1/12, 1/6, ..., 1/12. */
static void test_translation_frequencies(void **state)
{
    (void)state;
    enum { H = 8, W = 6, C = 1, B = 4096, STEPS = 4 };
    const double N = (double)B * STEPS;
    const float fy = 0.25f, fx = 0.5f;
    rig r = make_rig("float32", H, W, C, 0, fy, fx, B, 51);
    float *x = counting_input(&r, B);
    xform *t = malloc(B * sizeof *t);
    double ky[2 * H + 1] = {0}, kx[2 * W + 1] = {0};
    for (int s = 0; s < STEPS; s++) {
        forward(&r, x, B, true);
        identify(&r, B, t);
        for (int n = 0; n < B; n++) {
            ky[t[n].dy + H]++;
            kx[t[n].dx + W]++;
        }
    }
    for (int d = -H; d <= H; d++) {
        double p = shift_probability(d, fy, H);
        if (fabs(ky[d + H] - N * p) > 5 * sqrt(N * p * (1 - p)))
            fail_msg("dy = %d: %g of %g, expected %g", d, ky[d + H], N, N * p);
    }
    for (int d = -W; d <= W; d++) {
        double p = shift_probability(d, fx, W);
        if (fabs(kx[d + W] - N * p) > 5 * sqrt(N * p * (1 - p)))
            fail_msg("dx = %d: %g of %g, expected %g", d, kx[d + W], N, N * p);
    }
    free(t);
    free(x);
    mp_model_free(r.m);
}

/* ------------------------------------------------------ both, transposes */

/* Flip then translation: the map J is a partial permutation, so
 * <J v, w> == <v, J^T w> holds exactly for dyadic v, w (every product and
 * partial sum is exact in float64), in every policy; J^T w is also the
 * reference scatter, bit for bit. */
static void test_adjoint(void **state)
{
    (void)state;
    enum { H = 9, W = 7, C = 3, B = 12, PER = H * W * C };
    for (int pi = 0; pi < NPOLICIES; pi++) {
        rig r =
            make_rig(policies[pi], H, W, C, MP_FLIP_HORIZONTAL_AND_VERTICAL, 0.375f, 0.25f, B, 61);
        float v[B * PER], w[B * PER];
        for (int rep = 0; rep < 3; rep++) {
            fill_dyadic(v, B * PER, 70 + (uint64_t)rep);
            fill_dyadic(w, B * PER, 80 + (uint64_t)rep);
            for (int i = 0; i < B * PER; i++)
                if (v[i] == 0) v[i] = 0.5f;
            const mp_tensor *y = forward(&r, v, B, true);
            xform t[B];
            identify(&r, B, t);
            float jv[B * PER], jtw[B * PER];
            mp_convert(jv, MP_F32, y->data, y->dtype, B * PER);
            mp_tensor tw;
            mp_tensor_wrap(&tw, MP_F32, 4, (int64_t[]){B, H, W, C}, w);
            assert_int_equal(mp_model_backward(r.m, &tw, false), MP_OK);
            const mp_tensor *g = mp_model_node_grad(r.m, r.pre);
            mp_convert(jtw, MP_F32, g->data, g->dtype, B * PER);
            double lhs = 0, rhs = 0;
            for (int i = 0; i < B * PER; i++) {
                lhs += (double)jv[i] * (double)w[i];
                rhs += (double)v[i] * (double)jtw[i];
            }
            if (lhs != rhs)
                fail_msg("%s: <Jv, w> = %.17g, <v, J^T w> = %.17g", policies[pi], lhs, rhs);
            /* and nonzero shifts happened (fill was involved) */
            int shifted = 0;
            for (int n = 0; n < B; n++) shifted += t[n].dy != 0 || t[n].dx != 0;
            assert_true(shifted > 0);
            /* a fresh forward at the same count, then the reference scatter */
            mp_model_set_forward_count(r.m, mp_model_forward_count(r.m) - 1);
            forward(&r, v, B, true);
            check_backward(&r, B, t, 90 + (uint64_t)rep);
        }
        mp_model_free(r.m);
    }
}

/* The plan's saved bytes are what a training forward takes: the output in
 * the compute dtype and 2 int32 per sample, each in 64-byte granules. */
static void test_saved_bytes(void **state)
{
    (void)state;
    enum { H = 5, W = 3, C = 3, MAXB = 37 };
    for (int pi = 0; pi < NPOLICIES; pi++) {
        mp_model *m = mp_model_new_with_policy(2, policies[pi]);
        mp_node x = mp_input(m, 3, (int64_t[]){H, W, C}, NULL);
        mp_node f = mp_random_flip(m, x, MP_FLIP_VERTICAL, NULL);
        mp_node t = mp_random_translation(m, f, 0.2f, 0.2f, NULL);
        mp_node o = mp_dense(m, mp_flatten(m, t, NULL), 4, MP_ACT_NONE, NULL);
        assert_int_equal(mp_model_build(m, o, MAXB), MP_OK);
        size_t es = mp_dtype_size(compute_of(policies[pi]));
        for (int64_t b = 1; b <= MAXB; b += 12) {
            float *in = calloc((size_t)(b * H * W * C), sizeof *in);
            mp_tensor tx;
            mp_tensor_wrap(&tx, MP_F32, 4, (int64_t[]){b, H, W, C}, in);
            for (int training = 0; training < 2; training++) {
                assert_int_equal(mp_model_forward(m, &tx, training, NULL), MP_OK);
                size_t planned = 0;
                for (int i = 0; i < mp_model_num_layers(m); i++) {
                    mp_layer_info li;
                    assert_int_equal(mp_model_layer_info(m, i, b, &li), MP_OK);
                    planned += li.saved_bytes;
                    if (i == f || i == t) {
                        size_t want = ((size_t)(b * H * W * C) * es + 63) / 64 * 64 +
                                      ((size_t)b * 8 + 63) / 64 * 64;
                        assert_int_equal(li.saved_bytes, want);
                        assert_string_equal(li.type, i == f ? "RandomFlip" : "RandomTranslation");
                    }
                }
                if (training)
                    assert_int_equal(planned, mp_model_activation_bytes(m));
                else
                    assert_true(mp_model_activation_bytes(m) <= planned);
            }
            free(in);
        }
        mp_model_free(m);
    }
}

/* ------------------------------------------------------------ resume */

enum { RH = 6, RW = 6, RC = 2, RB = 16, RCLASSES = 4 };

/* Input [6, 6, 2] -> RandomFlip(both) -> RandomTranslation(0.25, 0.25) ->
 * Flatten -> Dense(4) -> softmax (float32), Adam 1e-2. */
static mp_model *resume_model(const char *policy, bool compile)
{
    mp_model *m = mp_model_new_with_policy(23, policy);
    assert_non_null(m);
    mp_node x = mp_input(m, 3, (int64_t[]){RH, RW, RC}, NULL);
    x = mp_random_flip(m, x, MP_FLIP_HORIZONTAL_AND_VERTICAL, NULL);
    x = mp_random_translation(m, x, 0.25f, 0.25f, NULL);
    x = mp_dense(m, mp_flatten(m, x, NULL), RCLASSES, MP_ACT_NONE, NULL);
    x = mp_activation_layer(m, x, MP_ACT_SOFTMAX, &(mp_layer_options){.policy = "float32"});
    assert_true(x >= 0);
    assert_int_equal(mp_model_build(m, x, RB), MP_OK);
    if (compile) {
        mp_compile_options co = mp_compile_options_default();
        co.optimizer.learning_rate = 1e-2f;
        assert_int_equal(mp_model_compile(m, &co), MP_OK);
    }
    return m;
}

/* Batch `step`: the label is the quadrant of the brightest pixel, which the
 * augmentation moves, so it changes what the model learns. */
static void resume_batch(uint64_t step, float *x, int32_t *labels)
{
    test_rng g = {500 + step};
    for (int n = 0; n < RB; n++) {
        int best = 0;
        for (int p = 0; p < RH * RW * RC; p++) {
            x[n * RH * RW * RC + p] = (float)test_rng_uniform(&g, 0, 1);
            if (x[n * RH * RW * RC + p] > x[n * RH * RW * RC + best]) best = p;
        }
        int i = best / (RW * RC), j = best / RC % RW;
        labels[n] = (i >= RH / 2) * 2 + (j >= RW / 2);
    }
}

static void resume_steps(mp_model *m, uint64_t from, uint64_t to)
{
    float x[RB * RH * RW * RC];
    int32_t labels[RB];
    mp_tensor t;
    mp_tensor_wrap(&t, MP_F32, 4, (int64_t[]){RB, RH, RW, RC}, x);
    for (uint64_t s = from; s < to; s++) {
        resume_batch(s, x, labels);
        mp_step_result r;
        assert_int_equal(mp_model_train_step(m, &t, labels, NULL, &r), MP_OK);
    }
}

/* Parameters (masters and compute copies), optimizer slots and counters. */
static bool same_training(mp_model *a, mp_model *b)
{
    if (mp_model_forward_count(a) != mp_model_forward_count(b)) return false;
    if (mp_model_steps_applied(a) != mp_model_steps_applied(b)) return false;
    for (int i = 0; i < mp_model_num_params(a); i++) {
        mp_model_param *p = mp_model_get_param(a, i), *q = mp_model_get_param(b, i);
        if (memcmp(p->master, q->master, (size_t)p->n * sizeof(float))) return false;
    }
    mp_optimizer *oa = mp_model_optimizer(a), *ob = mp_model_optimizer(b);
    for (int i = 0; i < mp_model_num_params(a); i++)
        for (int k = 0; k < mp_optimizer_num_slots(oa); k++) {
            int64_t n;
            float *u = mp_optimizer_slot(oa, i, k, &n), *v = mp_optimizer_slot(ob, i, k, NULL);
            if (memcmp(u, v, (size_t)n * sizeof *u)) return false;
        }
    return true;
}

/* 12 steps straight = 6 steps, checkpoint, load (into a built model, and a
 * model rebuilt from the file alone), 6 more; bit for bit in every policy.
 * The same load with the forward count put back to 0 ends elsewhere: the
 * draws depend on the counter the checkpoint restores. */
static void test_checkpoint_resumes_exactly(void **state)
{
    (void)state;
    for (int pi = 0; pi < NPOLICIES; pi++) {
        char dir[64], path[128];
        assert_int_equal(test_scratch_dir(dir, sizeof dir, "mp_aug"), 0);
        snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
        mp_model *straight = resume_model(policies[pi], true);
        resume_steps(straight, 0, 12);
        mp_model *first = resume_model(policies[pi], true);
        resume_steps(first, 0, 6);
        assert_int_equal(mp_model_save_checkpoint(first, path, NULL), MP_OK);
        mp_model *loaded = resume_model(policies[pi], false);
        assert_int_equal(mp_model_load_checkpoint(loaded, path, NULL), MP_OK);
        assert_int_equal(mp_model_forward_count(loaded), 6);
        mp_model *rebuilt;
        assert_int_equal(mp_model_from_checkpoint(path, RB, &rebuilt, NULL), MP_OK);
        mp_model *reset = resume_model(policies[pi], false);
        assert_int_equal(mp_model_load_checkpoint(reset, path, NULL), MP_OK);
        mp_model_set_forward_count(reset, 0);
        resume_steps(loaded, 6, 12);
        resume_steps(rebuilt, 6, 12);
        resume_steps(reset, 6, 12);
        if (!same_training(straight, loaded)) fail_msg("%s: the loaded run differs", policies[pi]);
        if (!same_training(straight, rebuilt))
            fail_msg("%s: the rebuilt run differs", policies[pi]);
        mp_model_set_forward_count(reset, 12);
        if (same_training(straight, reset))
            fail_msg("%s: the counter made no difference", policies[pi]);
        mp_model_free(straight);
        mp_model_free(first);
        mp_model_free(loaded);
        mp_model_free(rebuilt);
        mp_model_free(reset);
        test_remove_tree(dir);
    }
}

/* ------------------------------------------------------------ config */

static mp_model *config_model(void)
{
    mp_model *m = mp_model_new_with_policy(5, "mixed_bfloat16");
    mp_node x = mp_input(m, 3, (int64_t[]){5, 6, 3}, NULL);
    x = mp_random_flip(m, x, MP_FLIP_VERTICAL, &(mp_layer_options){.name = "flip"});
    x = mp_random_translation(m, x, 0.25f, 0.125f, &(mp_layer_options){.name = "shift"});
    x = mp_dense(m, mp_flatten(m, x, NULL), 3, MP_ACT_NONE, NULL);
    assert_true(x >= 0);
    assert_int_equal(mp_model_build(m, x, 4), MP_OK);
    return m;
}

/* `json` with the first `from` replaced by `to`. */
static char *edited(const char *json, const char *from, const char *to)
{
    const char *at = strstr(json, from);
    if (!at) fail_msg("'%s' not in %s", from, json);
    size_t pre = (size_t)(at - json), len = strlen(json) + strlen(to) + 1;
    char *s = malloc(len);
    snprintf(s, len, "%.*s%s%s", (int)pre, json, to, at + strlen(from));
    return s;
}

/* The settings round-trip with their Keras names (and the seeds with them:
 * the rebuilt model draws the same); absent optional fields take the
 * defaults; bad ones are refused naming the layer and the field. */
static void test_config(void **state)
{
    (void)state;
    mp_model *m = config_model();
    char *json = mp_model_config_json(m);
    assert_non_null(json);
    const char *want[] = {"\"class_name\":\"RandomFlip\"",
                          "\"mode\":\"vertical\"",
                          "\"class_name\":\"RandomTranslation\"",
                          "\"height_factor\":0.25",
                          "\"width_factor\":0.125",
                          "\"fill_mode\":\"constant\"",
                          "\"fill_value\":0.0",
                          "\"interpolation\":\"nearest\""};
    for (int k = 0; k < 8; k++)
        if (!strstr(json, want[k])) fail_msg("'%s' not in %s", want[k], json);
    mp_model *b = NULL;
    assert_int_equal(mp_model_from_config(json, 4, 1 << 20, &b), MP_OK);
    char *again = mp_model_config_json(b);
    assert_string_equal(json, again);
    free(again);
    /* the same draws at the same count */
    float x[4 * 90];
    fill_dyadic(x, 4 * 90, 7);
    mp_tensor tx;
    mp_tensor_wrap(&tx, MP_F32, 4, (int64_t[]){4, 5, 6, 3}, x);
    const mp_tensor *ya, *yb;
    for (int s = 0; s < 3; s++) {
        assert_int_equal(mp_model_forward(m, &tx, true, &ya), MP_OK);
        assert_int_equal(mp_model_forward(b, &tx, true, &yb), MP_OK);
        assert_memory_equal(mp_model_node_output(m, 2)->data, mp_model_node_output(b, 2)->data,
                            4 * 90 * 2);
        assert_memory_equal(ya->data, yb->data, 4 * 3 * mp_dtype_size(ya->dtype));
    }
    mp_model_free(b);
    /* defaults: mode horizontal; fill constant, nearest */
    const char *defaults[][2] = {{",\"mode\":\"vertical\"", "\"mode\":\"horizontal\""},
                                 {",\"fill_mode\":\"constant\"", NULL},
                                 {",\"fill_value\":0.0", NULL},
                                 {",\"interpolation\":\"nearest\"", NULL}};
    for (int k = 0; k < 4; k++) {
        char *s = edited(json, defaults[k][0], "");
        b = NULL;
        assert_int_equal(mp_model_from_config(s, 4, 1 << 20, &b), MP_OK);
        char *out = mp_model_config_json(b);
        if (defaults[k][1])
            assert_non_null(strstr(out, defaults[k][1]));
        else
            assert_string_equal(out, json);
        free(out);
        free(s);
        mp_model_free(b);
    }
    /* refusals naming the layer and the field */
    const char *bad[][4] = {
        {"\"mode\":\"vertical\"", "\"mode\":\"diagonal\"", "'flip'", "mode"},
        {"\"mode\":\"vertical\"", "\"mode\":2", "'flip'", "mode"},
        {"\"height_factor\":0.25", "\"height_factor\":1.0", "'shift'", "height_factor"},
        {"\"height_factor\":0.25", "\"height_factor\":0.99999999999", "'shift'", "height_factor"},
        {"\"height_factor\":0.25", "\"height_factor\":[-0.1, 0.2]", "'shift'", "height_factor"},
        {",\"height_factor\":0.25", "", "'shift'", "height_factor"},
        {"\"width_factor\":0.125", "\"width_factor\":-0.125", "'shift'", "width_factor"},
        {"\"width_factor\":0.125", "\"width_factor\":\"0.1\"", "'shift'", "width_factor"},
        {"\"fill_mode\":\"constant\"", "\"fill_mode\":\"reflect\"", "'shift'", "fill_mode"},
        {"\"fill_mode\":\"constant\"", "\"fill_mode\":\"nearest\"", "'shift'", "fill_mode"},
        {"\"fill_value\":0.0", "\"fill_value\":1.0", "'shift'", "fill_value"},
        {"\"interpolation\":\"nearest\"", "\"interpolation\":\"bilinear\"", "'shift'",
         "interpolation"},
        {"\"interpolation\":\"nearest\"", "\"data_format\":\"channels_first\"", "'shift'",
         "data_format"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char *s = edited(json, bad[k][0], bad[k][1]);
        b = NULL;
        assert_int_not_equal(mp_model_from_config(s, 4, 1 << 20, &b), MP_OK);
        assert_null(b);
        const char *msg = mp_last_error();
        if (!strstr(msg, bad[k][2]) || !strstr(msg, bad[k][3]))
            fail_msg("edit %zu: message: %s", k, msg);
        free(s);
    }
    free(json);
    mp_model_free(m);
}

/* The constructors refuse bad settings and inputs that are not images
 * [batch, height, width, channels], naming the layer. */
static void test_refusals(void **state)
{
    (void)state;
    /* inputs of other ranks, also through a config */
    const int ranks[3] = {1, 2, 4};
    const int64_t shape[4] = {4, 4, 3, 2};
    for (int k = 0; k < 3; k++)
        for (int kind = 0; kind < 2; kind++) {
            mp_model *m = mp_model_new(1);
            mp_node x = mp_input(m, ranks[k], shape, NULL);
            mp_node y = kind ? mp_random_translation(m, x, 0.1f, 0.1f, NULL)
                             : mp_random_flip(m, x, MP_FLIP_HORIZONTAL, NULL);
            assert_int_equal(y, -1);
            const char *msg = mp_last_error();
            if (!strstr(msg, kind ? "random_translation 'random_translation'"
                                  : "random_flip 'random_flip'") ||
                !strstr(msg, "image"))
                fail_msg("message: %s", msg);
            assert_int_equal(mp_model_build(m, x, 1), MP_ERR_INVALID); /* sticky */
            mp_model_free(m);
        }
    const char *text =
        "{\"format\": \"mixprec.model\", \"version\": 2, \"layers\": ["
        "{\"class_name\": \"InputLayer\", \"name\": \"x\", \"inputs\": [], \"shape\": [8, 8]},"
        "{\"class_name\": \"RandomFlip\", \"name\": \"aug\", \"inputs\": [\"x\"]}]}";
    mp_model *b = NULL;
    assert_int_not_equal(mp_model_from_config(text, 4, 1 << 20, &b), MP_OK);
    assert_null(b);
    if (!strstr(mp_last_error(), "random_flip 'aug'")) fail_msg("message: %s", mp_last_error());
    /* bad settings from C */
    const int bad_modes[3] = {0, 4, -1};
    for (int k = 0; k < 3; k++) {
        mp_model *m = mp_model_new(1);
        mp_node x = mp_input(m, 3, shape, NULL);
        assert_int_equal(
            mp_random_flip(m, x, (mp_flip_mode)bad_modes[k], &(mp_layer_options){.name = "f"}), -1);
        if (!strstr(mp_last_error(), "random_flip 'f'") || !strstr(mp_last_error(), "mode"))
            fail_msg("message: %s", mp_last_error());
        mp_model_free(m);
    }
    const float bad_factors[5][2] = {{1.0f, 0}, {-0.1f, 0}, {NAN, 0}, {0, 1.5f}, {0, -0.0001f}};
    for (int k = 0; k < 5; k++) {
        mp_model *m = mp_model_new(1);
        mp_node x = mp_input(m, 3, shape, NULL);
        assert_int_equal(mp_random_translation(m, x, bad_factors[k][0], bad_factors[k][1],
                                               &(mp_layer_options){.name = "t"}),
                         -1);
        const char *field = k < 3 ? "height_factor" : "width_factor";
        if (!strstr(mp_last_error(), "random_translation 't'") || !strstr(mp_last_error(), field))
            fail_msg("message: %s", mp_last_error());
        mp_model_free(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity_outside_training),
        cmocka_unit_test(test_flip_training),
        cmocka_unit_test(test_flip_frequencies),
        cmocka_unit_test(test_translation_training),
        cmocka_unit_test(test_translation_frequencies),
        cmocka_unit_test(test_adjoint),
        cmocka_unit_test(test_saved_bytes),
        cmocka_unit_test(test_checkpoint_resumes_exactly),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests_name("augment", tests, NULL, NULL);
}
