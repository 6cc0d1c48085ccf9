/* test_dtype.c - the number formats: named edge cases, decodes of every 8-
 * and 16-bit pattern, a random sample of inputs through every ISA path, and
 * format facts. The full 2^32 sweep is tests/exhaustive.c. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "core/internal.h"
#include "reference.h"

/* ------------------------------------------------------------ edge cases */

static void test_bf16_edges(void **state)
{
    (void)state;
    assert_int_equal(mp_f32_to_bf16(1.0f), 0x3F80);
    assert_int_equal(mp_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);            /* tie -> even (down) */
    assert_int_equal(mp_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);        /* tie -> even (up) */
    assert_int_equal(mp_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81); /* above tie */
    assert_int_equal(mp_f32_to_bf16(-0.0f), 0x8000);
    assert_int_equal(mp_f32_to_bf16(INFINITY), 0x7F80);
    assert_int_equal(mp_f32_to_bf16(-INFINITY), 0xFF80);
    assert_int_equal(mp_f32_to_bf16(FLT_MAX), 0x7F80); /* rounds past max */
    assert_int_equal(mp_f32_to_bf16(0x1.FEp127f), 0x7F7F);
    assert_int_equal(mp_f32_to_bf16(bits_f32(0x7F7F7FFF)), 0x7F7F); /* just below the tie */
    assert_int_equal(mp_f32_to_bf16(bits_f32(0x7F7F8000)), 0x7F80); /* tie -> even = inf */
    /* subnormals are kept, not flushed */
    assert_int_equal(mp_f32_to_bf16(bits_f32(0x00010000)), 0x0001);
    assert_int_equal(mp_f32_to_bf16(bits_f32(0x00008000)), 0x0000); /* tie -> even */
    assert_int_equal(mp_f32_to_bf16(bits_f32(0x00018000)), 0x0002); /* tie -> even */
    assert_int_equal(mp_f32_to_bf16(bits_f32(0x00008001)), 0x0001);
    assert_int_equal(mp_f32_to_bf16(bits_f32(0x007FFFFF)), 0x0080); /* to min normal */
    assert_int_equal(mp_f32_to_bf16(bits_f32(0x80000001)), 0x8000);
    /* NaN: quiet, same sign, top payload bits kept */
    assert_int_equal(mp_f32_to_bf16(bits_f32(0x7F800001)), 0x7FC0); /* sNaN, low payload */
    assert_int_equal(mp_f32_to_bf16(bits_f32(0xFF810000)), 0xFFC1);
    assert_int_equal(mp_f32_to_bf16(bits_f32(0x7FC00000)), 0x7FC0);
    assert_int_equal(mp_f32_to_bf16(bits_f32(0x7FFFFFFF)), 0x7FFF); /* must not carry into sign */
}

static void test_f16_edges(void **state)
{
    (void)state;
    assert_int_equal(mp_f32_to_f16(1.0f), 0x3C00);
    assert_int_equal(mp_f32_to_f16(1.0f + 0x1p-11f), 0x3C00); /* tie -> even */
    assert_int_equal(mp_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);
    assert_int_equal(mp_f32_to_f16(65504.0f), 0x7BFF);
    assert_int_equal(mp_f32_to_f16(65519.0f), 0x7BFF);
    assert_int_equal(mp_f32_to_f16(65520.0f), 0x7C00); /* tie -> even = inf */
    assert_int_equal(mp_f32_to_f16(-65520.0f), 0xFC00);
    assert_int_equal(mp_f32_to_f16(1e10f), 0x7C00);
    assert_int_equal(mp_f32_to_f16(0x1p-24f), 0x0001); /* min subnormal */
    assert_int_equal(mp_f32_to_f16(0x1p-25f), 0x0000); /* tie -> even = 0 */
    assert_int_equal(mp_f32_to_f16(-0x1p-25f), 0x8000);
    assert_int_equal(mp_f32_to_f16(0x1.8p-25f), 0x0001);
    assert_int_equal(mp_f32_to_f16(0x1.8p-24f), 0x0002);          /* tie -> even */
    assert_int_equal(mp_f32_to_f16(0x1p-14f), 0x0400);            /* min normal */
    assert_int_equal(mp_f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400); /* tie -> even: up */
    assert_int_equal(mp_f32_to_f16(0x1.ff8p-15f), 0x03FF);        /* max subnormal */
    assert_int_equal(mp_f32_to_f16(0x1.ff4p-15f), 0x03FE);        /* 1022.5 ulp: tie -> even */
    assert_int_equal(mp_f32_to_f16(0x1.ffcp-15f),
                     0x0400); /* 1023.5 ulp: tie -> even = min normal */
    assert_int_equal(mp_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(mp_f32_to_f16(INFINITY), 0x7C00);
    assert_int_equal(mp_f32_to_f16(bits_f32(0x7F800001)), 0x7E00); /* sNaN -> qNaN */
    assert_int_equal(mp_f32_to_f16(bits_f32(0xFFC02000)), 0xFE01); /* sign + payload */
    assert_int_equal(mp_f32_to_f16(FLT_MIN), 0x0000);
}

static void test_fp8_edges(void **state)
{
    (void)state;
    /* E4M3 */
    assert_int_equal(mp_f32_to_e4m3(448.0f), 0x7E);
    assert_int_equal(mp_f32_to_e4m3(464.0f), 0x7E); /* tie between 448 and (NaN-slot) 480 */
    assert_int_equal(mp_f32_to_e4m3(500.0f), 0x7E); /* saturates */
    assert_int_equal(mp_f32_to_e4m3(-1e30f), 0xFE);
    assert_int_equal(mp_f32_to_e4m3(INFINITY), 0x7F); /* no inf in E4M3: NaN, never hidden */
    assert_int_equal(mp_f32_to_e4m3(-INFINITY), 0xFF);
    assert_int_equal(mp_f32_to_e4m3(NAN), 0x7F);
    assert_int_equal(mp_f32_to_e4m3(-NAN), 0xFF);
    assert_int_equal(mp_f32_to_e4m3_ex(464.0f, MP_OVERFLOW_NONSAT), 0x7E);
    assert_int_equal(mp_f32_to_e4m3_ex(464.5f, MP_OVERFLOW_NONSAT), 0x7F);
    assert_int_equal(mp_f32_to_e4m3_ex(-480.0f, MP_OVERFLOW_NONSAT), 0xFF);
    assert_int_equal(mp_f32_to_e4m3(0x1p-9f), 0x01);  /* min subnormal */
    assert_int_equal(mp_f32_to_e4m3(0x1p-10f), 0x00); /* tie -> even */
    assert_int_equal(mp_f32_to_e4m3(0x1.8p-10f), 0x01);
    assert_int_equal(mp_f32_to_e4m3(0x1.8p-9f), 0x02);      /* tie -> even */
    assert_int_equal(mp_f32_to_e4m3(7 * 0x1p-9f), 0x07);    /* max subnormal */
    assert_int_equal(mp_f32_to_e4m3(7.5f * 0x1p-9f), 0x08); /* tie -> even: min normal */
    assert_int_equal(mp_f32_to_e4m3(0x1p-6f), 0x08);
    assert_int_equal(mp_f32_to_e4m3(1.0f), 0x38);
    assert_int_equal(mp_f32_to_e4m3(1.0625f), 0x38); /* tie -> even */
    assert_int_equal(mp_f32_to_e4m3(1.1875f), 0x3A); /* tie -> even (up) */
    assert_int_equal(mp_f32_to_e4m3(-0.0f), 0x80);
    /* E5M2 */
    assert_int_equal(mp_f32_to_e5m2(57344.0f), 0x7B);
    assert_int_equal(mp_f32_to_e5m2(61440.0f), 0x7B); /* saturates */
    assert_int_equal(mp_f32_to_e5m2(INFINITY), 0x7C); /* inf stays inf */
    assert_int_equal(mp_f32_to_e5m2(-INFINITY), 0xFC);
    assert_int_equal(mp_f32_to_e5m2_ex(61439.0f, MP_OVERFLOW_NONSAT), 0x7B);
    assert_int_equal(mp_f32_to_e5m2_ex(61440.0f, MP_OVERFLOW_NONSAT), 0x7C); /* tie -> even: inf */
    assert_int_equal(mp_f32_to_e5m2_ex(-1e6f, MP_OVERFLOW_NONSAT), 0xFC);
    assert_int_equal(mp_f32_to_e5m2(0x1p-16f), 0x01);
    assert_int_equal(mp_f32_to_e5m2(0x1p-17f), 0x00);
    assert_int_equal(mp_f32_to_e5m2(1.0f), 0x3C);
    assert_int_equal(mp_f32_to_e5m2(1.125f), 0x3C); /* tie -> even */
    assert_int_equal(mp_f32_to_e5m2(1.375f), 0x3E); /* tie -> even (up) */
    uint8_t nan = mp_f32_to_e5m2(-NAN);
    assert_true((nan & 0x7C) == 0x7C && (nan & 3) && (nan & 0x80));
}

/* ------------------------------------------------------------- decodes */

static void test_decode_all_8bit(void **state)
{
    (void)state;
    for (int b = 0; b < 256; b++) {
        double w4 = ref_decode(&REF_E4M3, (uint32_t)b), w5 = ref_decode(&REF_E5M2, (uint32_t)b);
        float g4 = mp_e4m3_to_f32((uint8_t)b), g5 = mp_e5m2_to_f32((uint8_t)b);
        if (isnan(w4))
            assert_true(isnan(g4) && !!signbit(g4) == !!(b & 0x80));
        else
            assert_true((double)g4 == w4 && !!signbit(g4) == !!(b & 0x80));
        if (isnan(w5))
            assert_true(isnan(g5) && !!signbit(g5) == !!(b & 0x80));
        else
            assert_true((double)g5 == w5 && !!signbit(g5) == !!(b & 0x80));
        /* re-encoding gives the pattern back (NaN: the canonical NaN) */
        if (!isnan(w4)) assert_int_equal(mp_f32_to_e4m3(g4), b);
        if (!isnan(w5)) assert_int_equal(mp_f32_to_e5m2(g5), b);
    }
    /* OCP spec values named one by one */
    assert_true(mp_e4m3_to_f32(0x7E) == 448.0f && mp_e4m3_to_f32(0x01) == 0x1p-9f);
    assert_true(isnan(mp_e4m3_to_f32(0x7F)) && mp_e4m3_to_f32(0x78) == 256.0f);
    assert_true(mp_e5m2_to_f32(0x7B) == 57344.0f && mp_e5m2_to_f32(0x7C) == INFINITY);
    assert_true(isnan(mp_e5m2_to_f32(0x7D)) && mp_e5m2_to_f32(0x01) == 0x1p-16f);
}

static void test_decode_all_16bit(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = mp_f16_to_f32((uint16_t)h), g = mp_bf16_to_f32((uint16_t)h);
        double wf = ref_decode(&REF_F16, h), wg = ref_decode(&REF_BF16, h);
        if (isnan(wf)) {
            assert_true(isnan(f));
            uint16_t back = mp_f32_to_f16(f);
            assert_int_equal(back, h | 0x200); /* NaN stays NaN: sign, payload kept, quiet */
        } else {
            assert_true((double)f == wf);
            assert_int_equal(mp_f32_to_f16(f), h);
        }
        if (isnan(wg)) {
            assert_true(isnan(g));
            assert_int_equal(mp_f32_to_bf16(g), h | 0x40);
        } else {
            assert_true((double)g == wg);
            assert_int_equal(mp_f32_to_bf16(g), h);
        }
    }
}

/* ---------------------------------------- random sample, every ISA path */

#define SAMPLE (1u << 22)

static float *sample_inputs(void)
{
    float *x = malloc(SAMPLE * sizeof *x);
    test_rng r = {12345};
    for (uint32_t i = 0; i < SAMPLE; i++) {
        switch (i % 4) {
        case 0:
            x[i] = bits_f32(test_rng_u32(&r));
            break; /* any pattern */
        case 1:
            x[i] = (float)test_rng_uniform(&r, -600, 600);
            break; /* fp8 range */
        case 2:
            x[i] = ldexpf((float)test_rng_uniform(&r, -2, 2), (int)(test_rng_u32(&r) % 60) - 40);
            break;
        default:
            x[i] = bits_f32((test_rng_u32(&r) & 0x807FFFFFu) |
                            (test_rng_u32(&r) % 2 ? 0 : 0x00800000));
            break; /* subnormal / near */
        }
    }
    return x;
}

static void check_against_reference(const float *x, size_t n, const void *out, mp_dtype t,
                                    mp_overflow ov)
{
    const ref_format *f = t == MP_F16      ? &REF_F16
                          : t == MP_BF16   ? &REF_BF16
                          : t == MP_F8E4M3 ? &REF_E4M3
                                           : &REF_E5M2;
    int ovf = REF_OVF_INF, inf = REF_OVF_INF;
    if (t == MP_F8E4M3) {
        ovf = ov == MP_OVERFLOW_SATURATE ? REF_OVF_SATURATE : REF_OVF_NAN;
        inf = REF_OVF_NAN;
    } else if (t == MP_F8E5M2) {
        ovf = ov == MP_OVERFLOW_SATURATE ? REF_OVF_SATURATE : REF_OVF_INF;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t bits =
            mp_dtype_size(t) == 2 ? ((const uint16_t *)out)[i] : ((const uint8_t *)out)[i];
        double want = ref_cast(f, x[i], ovf, inf);
        if (!ref_matches(f, bits, want, x[i]))
            fail_msg("%s: input %a (0x%08x) gave 0x%x, reference %a", mp_dtype_name(t),
                     (double)x[i], f32_bits(x[i]), bits, want);
    }
}

static void test_sample_all_paths(void **state)
{
    (void)state;
    float *x = sample_inputs();
    uint8_t *ref = malloc(SAMPLE * 2), *got = malloc(SAMPLE * 2);
    const mp_dtype targets[] = {MP_BF16, MP_F16, MP_F8E4M3, MP_F8E5M2};
    mp_isa isas[MP_ISA_COUNT];
    int nisa = test_isas(isas);
    for (int t = 0; t < 4; t++) {
        for (int ov = 0; ov < 2; ov++) {
            mp_convert_isa(MP_ISA_SCALAR, ref, targets[t], x, MP_F32, SAMPLE, (mp_overflow)ov);
            check_against_reference(x, SAMPLE, ref, targets[t], (mp_overflow)ov);
            for (int k = 0; k < nisa; k++) {
                /* odd length and offset exercise the masked tails */
                size_t n = SAMPLE - 13;
                mp_convert_isa(isas[k], got, targets[t], x + 3, MP_F32, n, (mp_overflow)ov);
                size_t es = mp_dtype_size(targets[t]);
                mp_convert_isa(MP_ISA_SCALAR, ref, targets[t], x + 3, MP_F32, n, (mp_overflow)ov);
                if (memcmp(got, ref, n * es) != 0)
                    fail_msg("%s path differs from scalar for %s", mp_isa_name(isas[k]),
                             mp_dtype_name(targets[t]));
            }
        }
        /* decode back through every path */
        float *dec_ref = malloc(SAMPLE * sizeof(float)), *dec = malloc(SAMPLE * sizeof(float));
        mp_convert_isa(MP_ISA_SCALAR, ref, targets[t], x, MP_F32, SAMPLE, MP_OVERFLOW_SATURATE);
        mp_convert_isa(MP_ISA_SCALAR, dec_ref, MP_F32, ref, targets[t], SAMPLE,
                       MP_OVERFLOW_SATURATE);
        for (int k = 0; k < nisa; k++) {
            mp_convert_isa(isas[k], dec, MP_F32, ref, targets[t], SAMPLE - 7, MP_OVERFLOW_SATURATE);
            assert_memory_equal(dec, dec_ref, (SAMPLE - 7) * sizeof(float));
        }
        free(dec_ref);
        free(dec);
    }
    free(x);
    free(ref);
    free(got);
}

/* Outputs of 8 MiB and more take the streaming-store route, with a head of
 * ordinary stores up to 64-byte alignment: check it against scalar at
 * several misalignments. */
static void test_streaming_paths(void **state)
{
    (void)state;
    const size_t n = (9u << 20) + 5;
    float *x = malloc((n + 16) * sizeof *x), *y = malloc((n + 16) * sizeof *y);
    uint8_t *ref = malloc((n + 16) * 4), *got = malloc((n + 16) * 4);
    test_rng r = {5};
    for (size_t i = 0; i < n + 16; i++) x[i] = (float)test_rng_uniform(&r, -500, 500);
    const mp_dtype targets[] = {MP_BF16, MP_F16, MP_F8E4M3, MP_F8E5M2};
    mp_isa isas[MP_ISA_COUNT];
    int nisa = test_isas(isas);
    for (int t = 0; t < 4; t++) {
        size_t es = mp_dtype_size(targets[t]);
        for (size_t off = 0; off < 3; off++) {
            mp_convert_isa(MP_ISA_SCALAR, ref, targets[t], x, MP_F32, n, MP_OVERFLOW_SATURATE);
            for (int k = 0; k < nisa; k++) {
                mp_convert_isa(isas[k], got + off * es, targets[t], x, MP_F32, n,
                               MP_OVERFLOW_SATURATE);
                assert_memory_equal(got + off * es, ref, n * es);
                mp_convert_isa(isas[k], y + off, MP_F32, ref, targets[t], n, MP_OVERFLOW_SATURATE);
                mp_convert_isa(MP_ISA_SCALAR, (float *)got, MP_F32, ref, targets[t], n,
                               MP_OVERFLOW_SATURATE);
                assert_memory_equal(y + off, got, n * sizeof(float));
            }
        }
    }
    free(x);
    free(y);
    free(ref);
    free(got);
}

/* Conversions between two low-precision types are one rounding of the exact
 * decoded value, whichever path runs. */
static void test_convert_any_pair(void **state)
{
    (void)state;
    enum { N = 5000 };
    static float x[N], mid[N];
    static uint8_t a[N * 4], b[N * 4], c[N * 4];
    test_rng r = {99};
    for (int i = 0; i < N; i++)
        x[i] = (float)test_rng_uniform(&r, -70000, 70000) * (i % 3 ? 1e-3f : 1.0f);
    mp_isa isas[MP_ISA_COUNT];
    int nisa = test_isas(isas);
    for (int s = 0; s < MP_DTYPE_COUNT; s++)
        for (int d = 0; d < MP_DTYPE_COUNT; d++) {
            mp_convert(a, (mp_dtype)s, x, MP_F32, N);
            mp_convert(mid, MP_F32, a, (mp_dtype)s, N);
            mp_convert(b, (mp_dtype)d, mid, MP_F32, N);
            for (int k = 0; k < nisa; k++) {
                memset(c, 0xAB, sizeof c);
                mp_convert_isa(isas[k], c, (mp_dtype)d, a, (mp_dtype)s, N, MP_OVERFLOW_SATURATE);
                assert_memory_equal(b, c, N * mp_dtype_size((mp_dtype)d));
            }
        }
    /* n == 0 writes nothing, between any pair of types */
    memset(c, 0x5A, sizeof c);
    memcpy(b, c, sizeof c);
    mp_convert(c, MP_BF16, x, MP_F32, 0);
    mp_convert(c, MP_F32, a, MP_F8E4M3, 0);
    assert_memory_equal(b, c, sizeof c);
}

/* --------------------------------------------------------------- facts */

static void test_facts_and_names(void **state)
{
    (void)state;
    const ref_format *refs[] = {NULL, &REF_F16, &REF_BF16, &REF_E4M3, &REF_E5M2};
    for (int t = 1; t < MP_DTYPE_COUNT; t++) {
        mp_dtype_info in;
        mp_dtype_get_info((mp_dtype)t, &in);
        assert_true((double)in.max == ref_max(refs[t]));
        assert_true((double)in.min_subnormal == ldexp(1.0, 1 - refs[t]->bias - refs[t]->mbits));
        assert_true((double)in.min_normal == ldexp(1.0, 1 - refs[t]->bias));
        assert_true((double)in.epsilon == ldexp(1.0, -refs[t]->mbits));
        assert_int_equal(in.bits, (int)mp_dtype_size((mp_dtype)t) * 8);
        mp_dtype back;
        assert_int_equal(mp_dtype_from_name(mp_dtype_name((mp_dtype)t), &back), MP_OK);
        assert_int_equal(back, t);
    }
    assert_string_equal(mp_dtype_name(MP_BF16), "bfloat16");
    assert_int_equal(mp_dtype_size(MP_F32), 4);
    mp_dtype d;
    assert_int_equal(mp_dtype_from_name("float12", &d), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "float12"));
    assert_int_equal(mp_dtype_from_name(NULL, &d), MP_ERR_INVALID);
}

static void test_isa_selection(void **state)
{
    (void)state;
    mp_isa isa;
    assert_int_equal(mp_isa_from_name("avx512bf16", &isa), MP_OK);
    assert_int_equal(isa, MP_ISA_AVX512BF16);
    assert_int_equal(mp_isa_from_name("sse9", &isa), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "sse9"));
    mp_isa before = mp_isa_active();
    assert_int_equal(mp_isa_set(MP_ISA_SCALAR), MP_OK);
    assert_int_equal(mp_isa_active(), MP_ISA_SCALAR);
    assert_int_equal(mp_isa_set((mp_isa)7), MP_ERR_INVALID);
    for (int i = 0; i < MP_ISA_COUNT; i++)
        if (!mp_isa_supported((mp_isa)i))
            assert_int_equal(mp_isa_set((mp_isa)i), MP_ERR_UNSUPPORTED);
    assert_int_equal(mp_isa_set(before), MP_OK);
}

/* Data at any byte offset (a tensor inside a file) converts to the bits of
 * the same data aligned, in every direction and on every path, with a
 * length that is not a multiple of any vector width or of the chunking. */
static void test_unaligned(void **state)
{
    (void)state;
    enum { N = 2500 };
    static float f[N];
    static unsigned char src[N * 4 + 8], dst[N * 4 + 8], ref[N * 4];
    test_rng r = {99};
    for (int i = 0; i < N; i++) f[i] = (float)test_rng_uniform(&r, -300, 300);
    const mp_dtype ts[] = {MP_F32, MP_BF16, MP_F16, MP_F8E4M3, MP_F8E5M2};
    mp_isa isas[MP_ISA_COUNT];
    const int ni = test_isas(isas);
    const mp_isa saved = mp_isa_active();
    for (int k = 0; k < ni; k++) {
        assert_int_equal(mp_isa_set(isas[k]), MP_OK);
        for (int a = 0; a < 5; a++)
            for (int b = 0; b < 5; b++) {
                const size_t sa = mp_dtype_size(ts[a]), sb = mp_dtype_size(ts[b]);
                mp_convert(src, ts[a], f, MP_F32, N);
                mp_convert(ref, ts[b], src, ts[a], N);
                memmove(src + 1, src, N * sa); /* the same data one byte on */
                mp_convert(dst + 3, ts[b], src + 1, ts[a], N);
                assert_memory_equal(dst + 3, ref, N * sb);
            }
    }
    assert_int_equal(mp_isa_set(saved), MP_OK);
}

/* The SIMD encoders' premise (convert_avx2.c): the overflow code without
 * saturation is the code after the largest finite one, so overflow in
 * either mode is a min against max_enc or max_enc + 1. */
static void test_fp8_overflow_codes(void **state)
{
    (void)state;
    const mp_dtype fp8[2] = {MP_F8E4M3, MP_F8E5M2};
    for (int i = 0; i < 2; i++) {
        const mp_fp8_format *f = mp_fp8_format_of(fp8[i]);
        assert_int_equal(f->ovf_nonsat, f->max_enc + 1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_edges),       cmocka_unit_test(test_f16_edges),
        cmocka_unit_test(test_fp8_edges),        cmocka_unit_test(test_decode_all_8bit),
        cmocka_unit_test(test_decode_all_16bit), cmocka_unit_test(test_sample_all_paths),
        cmocka_unit_test(test_convert_any_pair), cmocka_unit_test(test_streaming_paths),
        cmocka_unit_test(test_facts_and_names),  cmocka_unit_test(test_isa_selection),
        cmocka_unit_test(test_unaligned),        cmocka_unit_test(test_fp8_overflow_codes),
    };
    return cmocka_run_group_tests_name("dtype", tests, NULL, NULL);
}
