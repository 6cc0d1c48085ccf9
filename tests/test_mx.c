/* test_mx.c - the OCP MX block formats (mixprec/mx.h) against a reference
 * written from the specification in double arithmetic (tests/mx_reference.h:
 * element values from their sign, exponent and mantissa fields with ldexp;
 * the scale rule with frexp; rounding with nearbyint), no library code:
 * every element code and every scale decoded, pack over a large seeded
 * sample and the boundaries (ties in every binade, max, clamping, element
 * subnormals, zeros, float32 subnormals, inf, NaN, powers of two, partial
 * blocks), fake quantization along both axes, every ISA path bit-identical
 * to the scalar one, and the errors. No tolerances: exact bits. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common.h"
#include "core/mx_internal.h"
#include "mx_reference.h"

/* pack, unpack (float32 and bf16) and quantize_2d as one row and as one
 * column, on every ISA path, against the reference; every path must also
 * give the scalar path's bytes. */
static void check_pack(const tfmt *t, const float *x, size_t n)
{
    size_t nb = mp_mx_scale_count(n), cb = mp_mx_code_bytes(t->f, n);
    uint8_t *codes = malloc(cb + 1), *sc = malloc(nb + 1), *codes0 = malloc(cb + 1);
    uint8_t *sc0 = malloc(nb + 1);
    float *out = malloc((n + 1) * sizeof *out);
    uint16_t *out16 = malloc((n + 1) * sizeof *out16);
    double *want = malloc(n * sizeof *want);
    int *wscale = malloc(nb * sizeof *wscale);
    for (size_t b = 0; b < nb; b++) {
        size_t len = n - b * 32 < 32 ? n - b * 32 : 32;
        wscale[b] = ref_block(t, x + b * 32, 1, len, want + b * 32);
    }
    mp_isa isas[MP_ISA_COUNT];
    int nisa = test_isas(isas);
    for (int k = 0; k < nisa; k++) {
        memset(codes, 0xA5, cb + 1);
        memset(sc, 0xA5, nb + 1);
        assert_int_equal(mp_mx_pack_isa(isas[k], t->f, 32, x, n, codes, sc), MP_OK);
        assert_int_equal(codes[cb], 0xA5); /* nothing past the end */
        assert_int_equal(sc[nb], 0xA5);
        for (size_t i = 0; i < n; i++) {
            int s = wscale[i / 32];
            if (sc[i / 32] != s)
                fail_msg("%s %s: block %zu scale %d, reference %d", t->name, mp_isa_name(isas[k]),
                         i / 32, sc[i / 32], s);
            uint32_t c = code_at(t, codes, i);
            double got = ref_elem(t, c);
            bool ok = s == 255 ? c == 0 : got == want[i] && !!signbit(got) == !!signbit(want[i]);
            if (!ok)
                fail_msg("%s %s: x[%zu] = %a gave code 0x%x (%a), reference %a (scale %d)", t->name,
                         mp_isa_name(isas[k]), i, (double)x[i], c, got, want[i], s);
        }
        if (t->f == MP_MXFP4_E2M1 && n % 2) assert_int_equal(codes[cb - 1] >> 4, 0);
        if (k == 0) {
            memcpy(codes0, codes, cb);
            memcpy(sc0, sc, nb);
        } else {
            assert_memory_equal(codes, codes0, cb);
            assert_memory_equal(sc, sc0, nb);
        }
        /* unpack and the fake quantization in both orientations */
        for (int pass = 0; pass < 3; pass++) {
            for (int bf = 0; bf < 2; bf++) {
                mp_dtype dt = bf ? MP_BF16 : MP_F32;
                void *dst = bf ? (void *)out16 : (void *)out;
                memset(dst, 0x5A, (n + 1) * (bf ? 2 : 4));
                mp_status st =
                    pass == 0 ? mp_mx_unpack_isa(isas[k], t->f, 32, codes, sc, n, dst, dt)
                    : pass == 1
                        ? mp_mx_quantize_2d_isa(isas[k], t->f, 32, 1, (int64_t)n, 1, x, dst, dt)
                        : mp_mx_quantize_2d_isa(isas[k], t->f, 32, (int64_t)n, 1, 0, x, dst, dt);
                assert_int_equal(st, MP_OK);
                assert_int_equal(bf ? out16[n] : f32_bits(out[n]), bf ? 0x5A5A : 0x5A5A5A5Au);
                for (size_t i = 0; i < n; i++) {
                    bool ok = bf ? bf16_ok(out16[i], want[i], wscale[i / 32])
                                 : value_ok(out[i], want[i], wscale[i / 32]);
                    if (!ok)
                        fail_msg("%s %s pass %d %s: x[%zu] = %a decoded to %a (0x%x), want %a "
                                 "* 2^%d",
                                 t->name, mp_isa_name(isas[k]), pass, bf ? "bf16" : "f32", i,
                                 (double)x[i], bf ? (double)mp_bf16_to_f32(out16[i]) : out[i],
                                 bf ? out16[i] : f32_bits(out[i]), want[i], wscale[i / 32] - 127);
                }
            }
        }
    }
    free(codes), free(sc), free(codes0), free(sc0), free(out), free(out16), free(want);
    free(wscale);
}

/* ------------------------------------------------------------------ tests */

static void test_names_and_facts(void **state)
{
    (void)state;
    for (int i = 0; i < MP_MX_FORMAT_COUNT; i++) {
        const tfmt *t = &T[i];
        mp_mx_format f;
        assert_string_equal(mp_mx_format_name(t->f), t->name);
        assert_int_equal(mp_mx_format_from_name(t->name, &f), MP_OK);
        assert_int_equal(f, t->f);
        mp_mx_format_info in;
        assert_int_equal(mp_mx_get_info(t->f, &in), MP_OK);
        assert_true((double)in.max == t->max);
        assert_int_equal(in.emax, t->emax);
        assert_int_equal(in.element_bits, t->bits);
        assert_int_equal(in.block_size, 32);
        assert_int_equal(in.code_bits, t->bits == 4 ? 4 : 8);
        double minsub = t->kind == K_INT8 ? 1.0 / 64 : ldexp(1.0, 1 - t->bias - t->mbits);
        assert_true((double)in.min_subnormal == minsub);
        assert_int_equal(mp_mx_code_bytes(t->f, 33), t->bits == 4 ? 17 : 33);
    }
    /* the emax values the specification's table gives */
    assert_int_equal(T[MP_MXFP8_E4M3].emax, 8);
    assert_int_equal(T[MP_MXFP8_E5M2].emax, 15);
    assert_int_equal(T[MP_MXFP6_E2M3].emax, 2);
    assert_int_equal(T[MP_MXFP6_E3M2].emax, 4);
    assert_int_equal(T[MP_MXFP4_E2M1].emax, 2);
    assert_int_equal(T[MP_MXINT8].emax, 0);
    mp_mx_format f;
    assert_int_equal(mp_mx_format_from_name("mxfp4", &f), MP_OK);
    assert_int_equal(f, MP_MXFP4_E2M1);
    assert_int_equal(mp_mx_format_from_name("mxfp5_e2m2", &f), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "'mxfp5_e2m2'"));
    assert_null(strchr(mp_last_error(), '\n'));
    assert_int_equal(mp_mx_format_from_name(NULL, &f), MP_ERR_INVALID);
    mp_mx_format_info in;
    assert_int_equal(mp_mx_get_info((mp_mx_format)6, &in), MP_ERR_INVALID);
    assert_string_equal(mp_mx_format_name((mp_mx_format)-1), "unknown");
    assert_int_equal(mp_mx_scale_count(0), 0);
    assert_int_equal(mp_mx_scale_count(32), 1);
    assert_int_equal(mp_mx_scale_count(33), 2);
}

/* Every code of every element format and every E8M0 code. */
static void test_decode_every_code(void **state)
{
    (void)state;
    for (int c = 0; c < 256; c++) {
        float s = mp_e8m0_to_f32((uint8_t)c);
        if (c == 255)
            assert_true(f32_bits(s) == 0x7FC00000u);
        else
            assert_true((double)s == ldexp(1.0, c - 127));
    }
    for (int i = 0; i < MP_MX_FORMAT_COUNT; i++) {
        const tfmt *t = &T[i];
        for (uint32_t c = 0; c < 256; c++) {
            double want = ref_elem(t, c); /* high bits beyond the width ignored */
            float got = mp_mx_element_to_f32(t->f, (uint8_t)c);
            if (isnan(want))
                assert_true(isnan(got));
            else if ((double)got != want || !!signbit(got) != !!signbit(want))
                fail_msg("%s code 0x%02x: %a, definition %a", t->name, c, (double)got, want);
        }
    }
    /* values named by the specification's tables */
    assert_true(mp_mx_element_to_f32(MP_MXFP4_E2M1, 0x7) == 6.0f);
    assert_true(mp_mx_element_to_f32(MP_MXFP4_E2M1, 0x1) == 0.5f);
    assert_true(mp_mx_element_to_f32(MP_MXFP6_E2M3, 0x1F) == 7.5f);
    assert_true(mp_mx_element_to_f32(MP_MXFP6_E2M3, 0x01) == 0.125f);
    assert_true(mp_mx_element_to_f32(MP_MXFP6_E3M2, 0x1F) == 28.0f);
    assert_true(mp_mx_element_to_f32(MP_MXFP6_E3M2, 0x01) == 0.0625f);
    assert_true(mp_mx_element_to_f32(MP_MXINT8, 0x7F) == 127.0f / 64);
    assert_true(mp_mx_element_to_f32(MP_MXINT8, 0x80) == -2.0f);
}

/* Every code under every scale, through unpack on every path, to float32
 * and bf16; and the documented bf16 exactness. */
static void test_unpack_every_code_and_scale(void **state)
{
    (void)state;
    const size_t n = 256 * 256; /* element i: code i % 256, scale i / 256 */
    uint8_t *codes = malloc(n), *sc = malloc(n / 32);
    float *out = malloc(n * sizeof *out), *out0 = malloc(n * sizeof *out0);
    uint16_t *o16 = malloc(n * sizeof *o16), *o160 = malloc(n * sizeof *o160);
    mp_isa isas[MP_ISA_COUNT];
    int nisa = test_isas(isas);
    for (int fi = 0; fi < MP_MX_FORMAT_COUNT; fi++) {
        const tfmt *t = &T[fi];
        uint32_t ncodes = 1u << t->bits;
        memset(codes, 0, n);
        for (size_t i = 0; i < n; i++) {
            uint8_t c = (uint8_t)(i % ncodes);
            if (t->f == MP_MXFP4_E2M1)
                codes[i / 2] |= (uint8_t)(c << (4 * (i % 2)));
            else
                codes[i] = c;
        }
        for (size_t b = 0; b < n / 32; b++) sc[b] = (uint8_t)(b / 8);
        int inexact_high = -1; /* highest scale code with an inexact bf16 value */
        for (int k = 0; k < nisa; k++) {
            assert_int_equal(mp_mx_unpack_isa(isas[k], t->f, 32, codes, sc, n, out, MP_F32), MP_OK);
            assert_int_equal(mp_mx_unpack_isa(isas[k], t->f, 32, codes, sc, n, o16, MP_BF16),
                             MP_OK);
            if (k == 0) { /* the scalar path: every other one gives its bits, NaN payloads too */
                memcpy(out0, out, n * sizeof *out);
                memcpy(o160, o16, n * sizeof *o16);
            } else {
                assert_memory_equal(out, out0, n * sizeof *out);
                assert_memory_equal(o16, o160, n * sizeof *o16);
            }
            for (size_t i = 0; i < n; i++) {
                int s = sc[i / 32];
                uint32_t c = code_at(t, codes, i);
                double e = ref_elem(t, c);
                if (isnan(e) && s != 255) { /* E4M3 / E5M2 NaN codes stay NaN, sign kept */
                    assert_true(isnan(out[i]) && !!signbit(out[i]) == !!signbit(e));
                    assert_true(isnan(mp_bf16_to_f32(o16[i])));
                    continue;
                }
                if (!value_ok(out[i], e, s))
                    fail_msg("%s code 0x%x scale %d: %a, want %a * 2^%d", t->name, c, s,
                             (double)out[i], e, s - 127);
                if (!bf16_ok(o16[i], e, s))
                    fail_msg("%s code 0x%x scale %d: bf16 0x%04x, want %a * 2^%d", t->name, c, s,
                             o16[i], e, s - 127);
                double exact = ldexp(e, s - 127);
                if (s != 255 && fabs(exact) < 0x1p128 && ref_decode(&REF_BF16, o16[i]) != exact &&
                    s > inexact_high)
                    inexact_high = s;
            }
        }
        /* mixprec/mx.h: exact in bf16 for MXFP6/MXFP4/MXINT8 at every scale,
         * for MXFP8 from scale 2^-124 (E4M3) / 2^-117 (E5M2) up */
        assert_int_equal(inexact_high, t->kind == K_E4M3 ? 2 : t->kind == K_E5M2 ? 9 : -1);
    }
    free(codes), free(sc), free(out), free(o16), free(out0), free(o160);
}

/* ------------------------------------------------------------ boundaries */

static void check_cases(const tfmt *t, test_rng *r)
{
    float x[4096];
    /* zeros with both signs: scale code 0, signs kept (MXINT8: +0) */
    for (int i = 0; i < 32; i++) x[i] = i % 2 ? -0.0f : 0.0f;
    check_pack(t, x, 32);
    /* float32 subnormal amax: scale code 0, elements rounded, not flushed */
    for (int i = 0; i < 32; i++)
        x[i] = bits_f32((test_rng_u32(r) & 0x807FFFFFu) >> (i % 8 == 0 ? 0 : i % 8));
    x[3] = bits_f32(0x007FFFFF), x[5] = bits_f32(0x80000001), x[7] = FLT_MIN;
    check_pack(t, x, 32);
    /* inf and NaN anywhere make the scale NaN; partial blocks too */
    const float specials[][3] = {{INFINITY, 1, 2},
                                 {-INFINITY, 0, 0},
                                 {NAN, 1, 1e30f},
                                 {-NAN, INFINITY, 0},
                                 {0, 0, INFINITY}};
    for (size_t s = 0; s < sizeof specials / sizeof specials[0]; s++) {
        for (int i = 0; i < 40; i++) x[i] = (float)test_rng_uniform(r, -3, 3);
        x[s * 7] = specials[s][0], x[s * 7 + 1] = specials[s][1], x[33] = specials[s][2];
        check_pack(t, x, 40);
    }
    /* the largest float32: shared_exp 127 - emax, the top of E8M0's range */
    for (int i = 0; i < 32; i++) x[i] = (float)test_rng_uniform(r, -1, 1) * 0x1p127f;
    x[9] = -FLT_MAX;
    check_pack(t, x, 32);
    /* ties of every pair of neighbouring codes, values just off the ties,
     * max, just above max (clamped) and just below 2^(emax+1), with the
     * scale pinned by a power of two in each block, at several scales */
    uint32_t nmag = t->kind == K_INT8 ? 128 : 1u << (t->bits - 1);
    const int ses[] = {-127, -126, -120, -64, -1, 0, 1, 37, 100, 127 - t->emax};
    for (size_t si = 0; si < sizeof ses / sizeof ses[0]; si++) {
        int se = ses[si];
        size_t n = 0;
        double vals[1200];
        size_t nv = 0;
        for (uint32_t c = 0; c + 1 < nmag; c++) {
            double a = ref_elem(t, c), b = ref_elem(t, c + 1);
            if (!isfinite(a) || !isfinite(b) || b > t->max) continue;
            vals[nv++] = (a + b) / 2;
            vals[nv++] = -(a + b) / 2;
            vals[nv++] = a + (b - a) * 0.4999;
            vals[nv++] = -(a + (b - a) * 0.5001);
            vals[nv++] = b;
        }
        double top = ldexp(1.0, t->emax + 1);
        vals[nv++] = t->max, vals[nv++] = -t->max;
        vals[nv++] = (t->max + top) / 2, vals[nv++] = -(t->max + top) * 0.5;
        vals[nv++] = top * (1 - 0x1p-30), vals[nv++] = t->max * (1 + 0x1p-20);
        for (size_t v = 0; v < nv; v++) {
            if (n % 32 == 0) x[n++] = (float)ldexp(v % 2 ? -1.0 : 1.0, se + t->emax);
            x[n++] = (float)ldexp(vals[v], se);
        }
        check_pack(t, x, n);
    }
    /* an amax just below a power of two: the scale of the binade below, the
     * largest element rounds past max and is clamped */
    for (int i = 0; i < 32; i++) x[i] = (float)test_rng_uniform(r, -1, 1);
    x[0] = nextafterf(1.0f, 0.0f), x[31] = -nextafterf(0x1p-100f, 0.0f);
    check_pack(t, x, 32);
    /* partial blocks of many lengths (odd ones for MXFP4's last nibble) */
    const size_t lens[] = {1, 2, 3, 15, 16, 17, 31, 33, 47, 63, 65, 97};
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
        for (size_t i = 0; i < lens[l]; i++)
            x[i] = (float)ldexp(test_rng_uniform(r, -2, 2), (int)(test_rng_u32(r) % 40) - 20);
        check_pack(t, x, lens[l]);
    }
}

static void test_pack_boundaries(void **state)
{
    (void)state;
    test_rng r = {2023};
    for (int i = 0; i < MP_MX_FORMAT_COUNT; i++) check_cases(&T[i], &r);
}

/* --------------------------------------------------------- random sample */

/* Blocks of mixed kinds: any bit pattern (inf and NaN included), values
 * spread over many binades at a random scale, one large value over tiny
 * ones, float32 subnormals, near-ties at a random scale. */
static void fill_sample(float *x, size_t n, uint64_t seed)
{
    test_rng r = {seed};
    for (size_t b = 0; b < n; b += 32) {
        size_t len = n - b < 32 ? n - b : 32;
        int kind = (int)(test_rng_u32(&r) % 5), k = (int)(test_rng_u32(&r) % 278) - 150;
        for (size_t i = 0; i < len; i++) {
            float v;
            switch (kind) {
            case 0:
                v = bits_f32(test_rng_u32(&r));
                break;
            case 1:
                v = (float)ldexp(test_rng_uniform(&r, -2, 2), k - (int)(test_rng_u32(&r) % 24));
                break;
            case 2:
                v = (float)ldexp(test_rng_uniform(&r, -1, 1), i == 5 ? k : k - 30);
                break;
            case 3:
                v = bits_f32(test_rng_u32(&r) & 0x80FFFFFFu);
                break;
            default: /* k/64-ish grids: ties of many element formats */
                v = (float)ldexp((double)((int)(test_rng_u32(&r) % 2048) - 1024) / 16 + 1.0 / 32,
                                 k / 4);
                break;
            }
            x[b + i] = v;
        }
    }
}

static void test_pack_random_sample(void **state)
{
    (void)state;
    const size_t n = (1u << 17) + 13; /* the last block partial */
    float *x = malloc(n * sizeof *x);
    for (int i = 0; i < MP_MX_FORMAT_COUNT; i++) {
        fill_sample(x, n, 77 + (uint64_t)i);
        check_pack(&T[i], x, n);
    }
    free(x);
}

/* A larger sample on every path against the scalar one, byte for byte. */
static void test_paths_bit_identical(void **state)
{
    (void)state;
    mp_isa isas[MP_ISA_COUNT];
    int nisa = test_isas(isas);
    if (nisa == 1) print_message("test_mx: only the scalar path runs on this CPU\n");
    const size_t n = (1u << 21) + 21, rows = 2053, cols = n / rows;
    float *x = malloc(n * sizeof *x), *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    uint8_t *c0 = malloc(n), *c1 = malloc(n), *s0 = malloc(n / 32 + 1), *s1 = malloc(n / 32 + 1);
    fill_sample(x, n, 4242);
    for (int fi = 0; fi < MP_MX_FORMAT_COUNT; fi++) {
        mp_mx_format f = T[fi].f;
        size_t cb = mp_mx_code_bytes(f, n), nb = mp_mx_scale_count(n);
        assert_int_equal(mp_mx_pack_isa(MP_ISA_SCALAR, f, 32, x, n, c0, s0), MP_OK);
        for (int k = 1; k < nisa; k++) {
            assert_int_equal(mp_mx_pack_isa(isas[k], f, 32, x, n, c1, s1), MP_OK);
            assert_memory_equal(c0, c1, cb);
            assert_memory_equal(s0, s1, nb);
            for (int bf = 0; bf < 2; bf++) {
                mp_dtype dt = bf ? MP_BF16 : MP_F32;
                size_t bytes = (size_t)mp_dtype_size(dt);
                assert_int_equal(mp_mx_unpack_isa(MP_ISA_SCALAR, f, 32, c0, s0, n, a, dt), MP_OK);
                assert_int_equal(mp_mx_unpack_isa(isas[k], f, 32, c0, s0, n, b, dt), MP_OK);
                assert_memory_equal(a, b, n * bytes);
                for (int axis = 0; axis < 2; axis++) {
                    assert_int_equal(mp_mx_quantize_2d_isa(MP_ISA_SCALAR, f, 32, (int64_t)rows,
                                                           (int64_t)cols, axis, x, a, dt),
                                     MP_OK);
                    assert_int_equal(mp_mx_quantize_2d_isa(isas[k], f, 32, (int64_t)rows,
                                                           (int64_t)cols, axis, x, b, dt),
                                     MP_OK);
                    assert_memory_equal(a, b, rows * cols * bytes);
                }
            }
        }
        /* the public calls use the active path: the same bytes */
        assert_int_equal(mp_mx_pack(f, 32, x, n, c1, s1), MP_OK);
        assert_memory_equal(c0, c1, cb);
        assert_memory_equal(s0, s1, nb);
    }
    free(x), free(a), free(b), free(c0), free(c1), free(s0), free(s1);
}

/* ------------------------------------------------- fake quantization, 2-D */

static void test_quantize_2d(void **state)
{
    (void)state;
    const int64_t shapes[][2] = {{1, 1},   {1, 100}, {100, 1}, {37, 45},
                                 {64, 32}, {33, 67}, {130, 70}};
    mp_isa isas[MP_ISA_COUNT];
    int nisa = test_isas(isas);
    float *x = malloc(130 * 70 * sizeof *x), *out = malloc(130 * 70 * sizeof *out);
    uint16_t *o16 = malloc(130 * 70 * sizeof *o16);
    double *want = malloc(130 * 70 * sizeof *want);
    int *scale = malloc(130 * 70 * sizeof *scale);
    double w[32];
    for (int fi = 0; fi < MP_MX_FORMAT_COUNT; fi++) {
        const tfmt *t = &T[fi];
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            size_t rows = (size_t)shapes[s][0], cols = (size_t)shapes[s][1];
            fill_sample(x, rows * cols, 1000 * (uint64_t)fi + s);
            for (int axis = 0; axis < 2; axis++) {
                /* the reference, line by line along the axis */
                size_t lines = axis ? rows : cols, len = axis ? cols : rows;
                size_t stride = axis ? 1 : cols, step = axis ? cols : 1;
                for (size_t l = 0; l < lines; l++)
                    for (size_t i0 = 0; i0 < len; i0 += 32) {
                        size_t bl = len - i0 < 32 ? len - i0 : 32;
                        int sc = ref_block(t, x + l * step + i0 * stride, stride, bl, w);
                        for (size_t i = 0; i < bl; i++) {
                            want[l * step + (i0 + i) * stride] = w[i];
                            scale[l * step + (i0 + i) * stride] = sc;
                        }
                    }
                for (int k = 0; k < nisa; k++) {
                    assert_int_equal(mp_mx_quantize_2d_isa(isas[k], t->f, 32, (int64_t)rows,
                                                           (int64_t)cols, axis, x, out, MP_F32),
                                     MP_OK);
                    assert_int_equal(mp_mx_quantize_2d_isa(isas[k], t->f, 32, (int64_t)rows,
                                                           (int64_t)cols, axis, x, o16, MP_BF16),
                                     MP_OK);
                    for (size_t i = 0; i < rows * cols; i++)
                        if (!value_ok(out[i], want[i], scale[i]) ||
                            !bf16_ok(o16[i], want[i], scale[i]))
                            fail_msg("%s %s [%zu x %zu] axis %d: element %zu (%a) gave %a / "
                                     "bf16 0x%04x, want %a * 2^%d",
                                     t->name, mp_isa_name(isas[k]), rows, cols, axis, i,
                                     (double)x[i], (double)out[i], o16[i], want[i], scale[i] - 127);
                    /* in place gives the same */
                    float *y = malloc(rows * cols * sizeof *y);
                    memcpy(y, x, rows * cols * sizeof *y);
                    assert_int_equal(mp_mx_quantize_2d_isa(isas[k], t->f, 32, (int64_t)rows,
                                                           (int64_t)cols, axis, y, y, MP_F32),
                                     MP_OK);
                    assert_memory_equal(y, out, rows * cols * sizeof *y);
                    free(y);
                }
            }
        }
    }
    free(x), free(out), free(o16), free(want), free(scale);
}

/* MX does not commute with transposition: axis 0 of A is axis 1 of A^T,
 * and differs from axis 1 of A when rows and columns have other ranges. */
static void test_transpose(void **state)
{
    (void)state;
    enum { R = 32, C = 64 };
    static float a[R * C], at[C * R], q0[R * C], q1[R * C], qt[C * R];
    test_rng r = {7};
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) {
            a[i * C + j] = (float)test_rng_uniform(&r, -1, 1) * (i == 3 ? 1000.0f : 1.0f);
            at[j * R + i] = a[i * C + j];
        }
    for (int fi = 0; fi < MP_MX_FORMAT_COUNT; fi++) {
        mp_mx_format f = T[fi].f;
        assert_int_equal(mp_mx_quantize_2d(f, 32, R, C, 0, a, q0, MP_F32), MP_OK);
        assert_int_equal(mp_mx_quantize_2d(f, 32, R, C, 1, a, q1, MP_F32), MP_OK);
        assert_int_equal(mp_mx_quantize_2d(f, 32, C, R, 1, at, qt, MP_F32), MP_OK);
        for (int i = 0; i < R; i++)
            for (int j = 0; j < C; j++)
                assert_true(f32_bits(q0[i * C + j]) == f32_bits(qt[j * R + i]));
        assert_true(memcmp(q0, q1, sizeof q0) != 0);
    }
}

/* ---------------------------------------------------------------- errors */

static void test_bad_input(void **state)
{
    (void)state;
    float x[64] = {1};
    uint8_t codes[64], sc[2];
    float out[64];
    assert_int_equal(mp_mx_pack(MP_MXFP8_E4M3, 16, x, 64, codes, sc), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "block size 16"));
    assert_null(strchr(mp_last_error(), '\n'));
    assert_int_equal(mp_mx_unpack(MP_MXFP4_E2M1, 64, codes, sc, 64, out, MP_F32), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "block size 64"));
    assert_int_equal(mp_mx_quantize_2d(MP_MXINT8, 0, 2, 32, 1, x, out, MP_F32), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "block size 0"));
    assert_int_equal(mp_mx_pack((mp_mx_format)9, 32, x, 64, codes, sc), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "format 9"));
    assert_int_equal(mp_mx_unpack(MP_MXFP8_E5M2, 32, codes, sc, 64, out, MP_F16), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "float16"));
    assert_int_equal(mp_mx_quantize_2d(MP_MXFP8_E5M2, 32, 2, 32, 2, x, out, MP_F32),
                     MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "axis 2"));
    assert_int_equal(mp_mx_quantize_2d(MP_MXFP8_E5M2, 32, -2, 32, 1, x, out, MP_F32),
                     MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "-2"));
    assert_int_equal(mp_mx_quantize_2d(MP_MXFP8_E5M2, 32, 2, 32, 1, x, x, MP_BF16), MP_ERR_INVALID);
    assert_int_equal(mp_mx_pack(MP_MXFP6_E2M3, 32, NULL, 64, codes, sc), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "src"));
    assert_int_equal(mp_mx_unpack(MP_MXFP6_E2M3, 32, codes, NULL, 64, out, MP_F32), MP_ERR_INVALID);
    assert_non_null(strstr(mp_last_error(), "scales"));
    /* nothing to do is fine, with any pointers */
    assert_int_equal(mp_mx_pack(MP_MXFP6_E2M3, 32, NULL, 0, NULL, NULL), MP_OK);
    assert_int_equal(mp_mx_quantize_2d(MP_MXFP6_E2M3, 32, 0, 5, 0, NULL, NULL, MP_F32), MP_OK);
}

/* ---------------------------------------------- ml_dtypes, where present */

/* tests/interop/mx_ml_dtypes.py checks the shared library of this build
 * (next to $MP_CLI, which tests/run.sh sets) against ml_dtypes' types, with
 * $MP_PYTHON (run.sh picks build/venv-ref's, which `make ref-venv` and
 * .ci/run make, else python3). Skipped where that Python has no ml_dtypes,
 * outside run.sh, and under the sanitizers (a Python process cannot load an
 * ASan-built library). */
static int setup(void **state)
{
    (void)state;
    mx_ref_init();
    return 0;
}

static void test_ml_dtypes(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__)
    skip();
#endif
    const char *cli = getenv("MP_CLI"), *py = getenv("MP_PYTHON");
    if (!cli || !strrchr(cli, '/')) skip();
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' tests/interop/mx_ml_dtypes.py '%.*s/libmixprec.so'",
             py ? py : "python3", (int)(strrchr(cli, '/') - cli), cli);
    int rc = system(cmd);
    rc = rc == -1 || !WIFEXITED(rc) ? -1 : WEXITSTATUS(rc);
    if (rc == 77 || rc == 127) skip(); /* no ml_dtypes, or no such Python */
    if (rc != 0) fail_msg("%s: exit status %d (see its message above)", cmd, rc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_facts),
        cmocka_unit_test(test_decode_every_code),
        cmocka_unit_test(test_unpack_every_code_and_scale),
        cmocka_unit_test(test_pack_boundaries),
        cmocka_unit_test(test_pack_random_sample),
        cmocka_unit_test(test_paths_bit_identical),
        cmocka_unit_test(test_quantize_2d),
        cmocka_unit_test(test_transpose),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_ml_dtypes),
    };
    return cmocka_run_group_tests_name("mx", tests, setup, NULL);
}
