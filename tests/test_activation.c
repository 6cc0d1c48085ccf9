/* test_activation.c - the float32 exp of the attention kernel (mp_expf)
 * and the tanh the activations use (mp_tanhf:
 * arithmetic only, so its loops vectorize) against float64 tanh: within 3
 * ulp of the correctly rounded value on a stride through all 2^32 bit
 * patterns and on every input near its branch points (|u| = 0.5, where the
 * Taylor series hands over to the exponential form, and |u| = 10, where the
 * argument is capped), NaN passing through, +-inf giving +-1. Then the
 * gelu_tanh activation of the elementwise op and of the GEMM epilogue (a
 * Dense with the fused activation) against the float64 formula: both are
 * 0.5 x (1 + t) with t within 3 ulp, and three float32 operations around it
 * (x^3 term, scale, product) each within 2^-24 relative, so |err| <= (3 *
 * 2^-24 + 4 * 2^-24) * (|0.5 x| (1 + |t|)) plus the slope of gelu (< 1.13)
 * times the error of the argument; the test allows 12 * 2^-24 * 0.5 |x|
 * (1 + |t|) + 2^-126. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "common.h"
#include "kernels/activation.h"
#include "kernels/ops.h"

/* Distance of got from the exact value r in units of the last place of r
 * rounded to float32 (subnormal ulp below the normal range). */
static double ulps(float got, double r)
{
    float rf = (float)r;
    double a = fabs((double)rf), ulp = a < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ilogb(a) - 23);
    return fabs((double)got - r) / ulp;
}

static void check_range(uint32_t first, uint32_t last, uint32_t step, double *worst)
{
    for (uint64_t b = first; b <= last; b += step) {
        float x = bits_f32((uint32_t)b);
        float t = mp_tanhf(x);
        if (isnan(x)) {
            assert_true(isnan(t));
            continue;
        }
        double e = ulps(t, tanh((double)x));
        if (e > *worst) *worst = e;
        if (!(e <= 3.0))
            fail_msg("tanh(%a) = %a: %.2f ulp from %a", (double)x, (double)t, e, tanh(x));
    }
}

static void test_tanh(void **state)
{
    (void)state;
    double worst = 0;
    check_range(0, 0xFFFFFFFFu, 4099, &worst); /* ~1M inputs of every binade and sign */
    const float seams[] = {0.5f, 10.0f, 9.0f, 1.0f};
    for (int s = 0; s < 4; s++)
        for (int sign = 0; sign < 2; sign++) {
            uint32_t c = f32_bits(sign ? -seams[s] : seams[s]);
            check_range(c - 65536, c + 65536, 1, &worst);
        }
    print_message("mp_tanhf: worst %.3f ulp\n", worst);
    assert_true(mp_tanhf(INFINITY) == 1.0f && mp_tanhf(-INFINITY) == -1.0f);
    assert_true(isnan(mp_tanhf(NAN)));
    assert_true(mp_tanhf(0.0f) == 0.0f && signbit(mp_tanhf(-0.0f)));
}

/* mp_expf within 2 ulp of exp wherever exp(x) is a normal float, 0 below
 * (x < -87.34), +inf above (x > 88.73), NaN through: a stride through all
 * bit patterns and every input near the clamps and near 0. */
static void test_exp(void **state)
{
    (void)state;
    double worst = 0;
    const uint32_t centers[] = {0x42AEAC4Fu, 0xC2AEAC4Fu, 0x42B17217u, 0xC2B17217u,
                                0x00000000u, 0x80000000u, 0x3F800000u};
    for (int k = -1; k < 7; k++) {
        uint64_t first = k < 0 ? 0 : centers[k] - (centers[k] >= 65536 ? 65536 : 0);
        uint64_t last = k < 0 ? 0xFFFFFFFFu : centers[k] + 65536, step = k < 0 ? 4099 : 1;
        for (uint64_t b = first; b <= last; b += step) {
            float x = bits_f32((uint32_t)b), y = mp_expf(x);
            if (isnan(x)) {
                assert_true(isnan(y));
                continue;
            }
            double r = exp((double)x);
            if (r < 0x1p-126) {
                assert_true(y == 0.0f || fabs(y - r) <= 0x1p-126);
                continue;
            }
            if (r > FLT_MAX) {
                assert_true(isinf(y) && y > 0);
                continue;
            }
            double e = ulps(y, r);
            worst = e > worst ? e : worst;
            if (!(e <= 2.0)) fail_msg("exp(%a) = %a: %.2f ulp from %a", (double)x, (double)y, e, r);
        }
    }
    print_message("mp_expf: worst %.3f ulp\n", worst);
    assert_true(mp_expf(-INFINITY) == 0.0f && isinf(mp_expf(INFINITY)));
}

static double gelu_tanh64(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void check_gelu(const float *x, const float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double want = gelu_tanh64(x[i]),
               t = tanh(sqrt(2.0 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i]));
        double tol = 12 * 0x1p-24 * 0.5 * fabs(x[i]) * (1 + fabs(t)) + 0x1p-126;
        if (!(fabs(y[i] - want) <= tol))
            fail_msg("gelu_tanh(%a) = %a, want %a (tol %.3g)", (double)x[i], (double)y[i], want,
                     tol);
    }
}

static void test_gelu_tanh_paths(void **state)
{
    (void)state;
    enum { N = 4096 };
    static float x[N], y[N];
    test_rng r = {7};
    for (int i = 0; i < N; i++) x[i] = (float)test_rng_uniform(&r, -12, 12);
    mp_op_activation(MP_ACT_GELU_TANH, x, MP_F32, y, MP_F32, N);
    check_gelu(x, y, N);
    /* the GEMM epilogue: y = x * 1 (a 1x1 identity) with the fused activation */
    float one = 1.0f;
    mp_gemm_args g = mp_gemm_args_default();
    g.m = N, g.n = 1, g.k = 1;
    g.a = x, g.a_type = MP_F32, g.lda = 1;
    g.b = &one, g.b_type = MP_F32, g.ldb = 1;
    g.c = y, g.c_type = MP_F32, g.ldc = 1;
    g.activation = MP_ACT_GELU_TANH;
    memset(y, 0, sizeof y);
    assert_int_equal(mp_gemm_ex(&g), MP_OK);
    check_gelu(x, y, N);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tanh),
        cmocka_unit_test(test_exp),
        cmocka_unit_test(test_gelu_tanh_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
