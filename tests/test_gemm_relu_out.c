/* test_gemm_relu_out.c - mp_gemm_args.relu_out: relu's derivative applied
 * by the GEMM epilogue. Each element must be, bit for bit, the value the
 * same GEMM stores without it (rounded to C's dtype), times (y > 0 ? 1 : 0)
 * and rounded again (exact): what relu's backward computes from that
 * stored value. The special cases are where a shortcut would differ: a
 * float16 C that overflows to inf where y <= 0 (inf * 0 is NaN, not 0), a
 * negative value where y <= 0 (-0, not +0), y = -0, NaN, +inf and a
 * subnormal. Covered: every ISA path, float32 / bfloat16 / float16 C and y,
 * float32 and bfloat16 inputs (the vdpbf16ps kernel), the epilogue with
 * alpha, beta, bias and relu, two depth blocks, a thin C computed as C^T,
 * k = 0, one thread and two. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static float load(const void *p, mp_dtype t, int64_t i)
{
    if (t == MP_BF16) return mp_bf16_to_f32(((const uint16_t *)p)[i]);
    if (t == MP_F16) return mp_f16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static uint32_t stored_bits(const void *p, mp_dtype t, int64_t i)
{
    if (t == MP_F32) return f32_bits(((const float *)p)[i]);
    return ((const uint16_t *)p)[i];
}

/* v rounded to t, as the bits t stores */
static uint32_t round_bits(float v, mp_dtype t)
{
    if (t == MP_BF16) return mp_f32_to_bf16(v);
    if (t == MP_F16) return mp_f32_to_f16(v);
    return f32_bits(v);
}

static void store(void *p, mp_dtype t, int64_t i, float v)
{
    if (t == MP_F32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = (uint16_t)round_bits(v, t);
}

typedef struct {
    int64_t m, n, k;
    bool trans_a;       /* A stored k x m: with small n, the driver computes C^T */
    bool epilogue;      /* alpha, beta, bias and relu besides */
    mp_dtype in;        /* A's and B's dtype */
    bool big_first_row; /* A's row 0 large: float16 C overflows there */
} shape;

static void check(const shape *s, mp_dtype ct, mp_dtype yt, int threads)
{
    const int64_t m = s->m, n = s->n, k = s->k;
    const size_t ie = mp_dtype_size(s->in), ce = mp_dtype_size(ct), ye = mp_dtype_size(yt);
    float *af = malloc((size_t)(m * k + 1) * 4), *bf = malloc((size_t)(k * n + 1) * 4);
    void *a = malloc((size_t)(m * k + 1) * ie), *b = malloc((size_t)(k * n + 1) * ie);
    float *bias = malloc((size_t)n * 4), *yf = malloc((size_t)(m * n) * 4);
    void *y = malloc((size_t)(m * n) * ye), *c0 = malloc((size_t)(m * n) * ce);
    void *c = malloc((size_t)(m * n) * ce);
    test_fill(af, (size_t)(m * k), 31, -1, 1);
    test_fill(bf, (size_t)(k * n), 32, -1, 1);
    test_fill(bias, (size_t)n, 33, -1, 1);
    test_fill(yf, (size_t)(m * n), 34, -1, 1);
    if (s->big_first_row)
        for (int64_t p = 0; p < k; p++) af[s->trans_a ? p * m : p] = 4096.0f;
    /* y: every special value somewhere, both signs elsewhere */
    const float special[] = {0.0f, -0.0f, NAN, INFINITY, -INFINITY, 1e-40f, -1e-40f, 1.0f};
    for (int64_t i = 0; i < m * n; i += 5) yf[i] = special[(i / 5) % 8];
    for (int64_t i = 0; i < m * k; i++) store(a, s->in, i, af[i]);
    for (int64_t i = 0; i < k * n; i++) store(b, s->in, i, bf[i]);
    for (int64_t i = 0; i < m * n; i++) {
        store(y, yt, i, yf[i]);
        store(c0, ct, i, 0.25f * yf[(i * 7) % (m * n)]); /* beta's C */
    }
    memcpy(c, c0, (size_t)(m * n) * ce);

    mp_gemm_args g = mp_gemm_args_default();
    g.trans_a = s->trans_a;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = a;
    g.a_type = s->in;
    g.lda = s->trans_a ? m : k > 0 ? k : 1;
    g.b = b;
    g.b_type = s->in;
    g.ldb = n;
    g.c = c0;
    g.c_type = ct;
    g.ldc = n;
    if (s->epilogue) {
        g.alpha = 0.75f;
        g.beta = -0.5f;
        g.bias = bias;
        g.activation = MP_ACT_RELU;
    }
    mp_set_num_threads(threads);
    assert_int_equal(mp_gemm_ex(&g), MP_OK); /* without: what relu's backward reads */
    g.c = c;
    g.relu_out = y;
    g.relu_out_type = yt;
    g.ld_relu_out = n;
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
    for (int64_t i = 0; i < m * n; i++) {
        const float d = (float)(load(y, yt, i) > 0.0f);
        const uint32_t want = round_bits(load(c0, ct, i) * d, ct), got = stored_bits(c, ct, i);
        if (got != want)
            fail_msg("%s %lldx%lldx%lld in %s, C %s, y %s, t%d: C[%lld] bits %#x, want %#x "
                     "(without relu_out %.9g, y %.9g)",
                     mp_isa_name(mp_isa_active()), (long long)m, (long long)n, (long long)k,
                     mp_dtype_name(s->in), mp_dtype_name(ct), mp_dtype_name(yt), threads,
                     (long long)i, got, want, (double)load(c0, ct, i), (double)load(y, yt, i));
    }
    free(af);
    free(bf);
    free(a);
    free(b);
    free(bias);
    free(yf);
    free(y);
    free(c0);
    free(c);
}

static void test_relu_out_is_relu_backward(void **state)
{
    (void)state;
    const shape shapes[] = {
        {37, 100, 70, false, false, MP_F32, true},  /* partial tiles both ways */
        {37, 100, 70, false, true, MP_F32, false},  /* with alpha, beta, bias, relu */
        {20, 50, 1100, false, false, MP_F32, true}, /* two float32 depth blocks */
        {33, 70, 64, false, false, MP_BF16, true},  /* bf16 inputs: vdpbf16ps */
        {600, 5, 40, true, false, MP_F32, true},    /* thin: computed as C^T */
        {600, 5, 40, true, true, MP_F32, false},
        {9, 17, 0, false, true, MP_F32, false}, /* k = 0: the epilogue alone */
    };
    const mp_dtype types[] = {MP_F32, MP_BF16, MP_F16};
    mp_isa isas[MP_ISA_COUNT];
    const int ni = test_isas(isas);
    const mp_isa saved = mp_isa_active();
    const int saved_threads = mp_num_threads();
    for (int ii = 0; ii < ni; ii++) {
        assert_int_equal(mp_isa_set(isas[ii]), MP_OK);
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
            for (int ci = 0; ci < 3; ci++)
                for (int yi = 0; yi < 3; yi++)
                    for (int t = 1; t <= 2; t++) check(&shapes[si], types[ci], types[yi], t);
    }
    mp_isa_set(saved);
    mp_set_num_threads(saved_threads);
}

static void test_relu_out_bad_arguments(void **state)
{
    (void)state;
    float a[6] = {0}, b[6] = {0}, c[4] = {0};
    int32_t y[4] = {0};
    mp_gemm_args g = mp_gemm_args_default();
    g.m = g.n = 2;
    g.k = 3;
    g.a = a;
    g.lda = 3;
    g.b = b;
    g.ldb = 2;
    g.c = c;
    g.ldc = 2;
    g.relu_out = y;
    g.relu_out_type = MP_I32;
    g.ld_relu_out = 2;
    assert_int_equal(mp_gemm_ex(&g), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "relu_out dtype"));
    g.relu_out_type = MP_F32;
    g.ld_relu_out = 1;
    assert_int_equal(mp_gemm_ex(&g), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "ld_relu_out=1"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_relu_out_is_relu_backward),
        cmocka_unit_test(test_relu_out_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
