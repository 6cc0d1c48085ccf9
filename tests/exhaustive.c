/* exhaustive.c - every one of the 2^32 float32 bit patterns converted to
 * bfloat16, float16, E4M3 and E5M2 (saturating and not): the scalar path is
 * checked against the independent double-precision reference in
 * reference.h, and every SIMD path this CPU has against the scalar path,
 * bit for bit. And the float8 recipe's scaled cast asked for values alone
 * (mp_fp8_scaled_cast without codes, scale 1, on the active path where it
 * has one), which rounds without codes: against the scalar path's codes
 * decoded, and its amax. Run by `make test-exhaustive` (minutes, all
 * cores). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "reference.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define CHUNK (1u << 16)

typedef struct {
    mp_dtype t;
    mp_overflow ov;
    const ref_format *ref;
    int ovf_rule, inf_rule;
    const char *name;
} target;

static const target targets[] = {
    {MP_BF16, MP_OVERFLOW_SATURATE, &REF_BF16, REF_OVF_INF, REF_OVF_INF, "bfloat16"},
    {MP_F16, MP_OVERFLOW_SATURATE, &REF_F16, REF_OVF_INF, REF_OVF_INF, "float16"},
    {MP_F8E4M3, MP_OVERFLOW_SATURATE, &REF_E4M3, REF_OVF_SATURATE, REF_OVF_NAN, "e4m3 saturating"},
    {MP_F8E4M3, MP_OVERFLOW_NONSAT, &REF_E4M3, REF_OVF_NAN, REF_OVF_NAN, "e4m3 non-saturating"},
    {MP_F8E5M2, MP_OVERFLOW_SATURATE, &REF_E5M2, REF_OVF_SATURATE, REF_OVF_INF, "e5m2 saturating"},
    {MP_F8E5M2, MP_OVERFLOW_NONSAT, &REF_E5M2, REF_OVF_INF, REF_OVF_INF, "e5m2 non-saturating"},
};
#define NT (sizeof targets / sizeof targets[0])

static unsigned long long failures[NT][MP_ISA_COUNT + 1];
static bool is_quiet_nan16(const target *tg, uint32_t bits)
{
    if (tg->t == MP_BF16) return (bits & 0x7FC0) == 0x7FC0;
    if (tg->t == MP_F16) return (bits & 0x7E00) == 0x7E00;
    return true;
}

static void report(const target *tg, const char *what, uint32_t in, uint32_t got, uint32_t want)
{
#pragma omp critical
    {
        static int shown = 0;
        if (shown++ < 20)
            fprintf(stderr, "MISMATCH %s %s: input 0x%08x gave 0x%x, expected 0x%x\n", tg->name,
                    what, in, got, want);
    }
}

/* the scaled cast's values: [e4m3, e5m2], and whether the path has it */
static unsigned long long value_failures[2];
static bool have_values;

/* The scaled cast's values of x[0..CHUNK) (scale 1) against the scalar
 * path's saturating codes decoded and rounded to bfloat16 (exact). */
static void check_values(const float *x, uint32_t base, uint16_t *got, uint16_t *want, float *tmp)
{
    static const target names[2] = {{MP_F8E4M3, MP_OVERFLOW_SATURATE, NULL, 0, 0, "e4m3 values"},
                                    {MP_F8E5M2, MP_OVERFLOW_SATURATE, NULL, 0, 0, "e5m2 values"}};
    for (int f = 0; f < 2; f++) {
        const mp_dtype t = names[f].t;
        uint32_t amax = 0, want_amax = 0;
        if (!mp_fp8_scaled_cast(NULL, got, t, x, MP_F32, CHUNK, 1.0f, false, &amax)) return;
        mp_convert_isa(MP_ISA_SCALAR, want, t, x, MP_F32, CHUNK, MP_OVERFLOW_SATURATE);
        mp_convert_isa(MP_ISA_SCALAR, tmp, MP_F32, want, t, CHUNK, MP_OVERFLOW_SATURATE);
        mp_convert_isa(MP_ISA_SCALAR, want, MP_BF16, tmp, MP_F32, CHUNK, MP_OVERFLOW_SATURATE);
        for (uint32_t i = 0; i < CHUNK; i++) {
            const uint32_t a = (base + i) & 0x7FFFFFFFu;
            want_amax = a > want_amax ? a : want_amax;
            if (got[i] != want[i]) {
#pragma omp atomic
                value_failures[f]++;
                report(&names[f], "scaled cast", base + i, got[i], want[i]);
            }
        }
        if (amax != want_amax) {
#pragma omp atomic
            value_failures[f]++;
            report(&names[f], "scaled cast amax", base, amax, want_amax);
        }
    }
}

int main(int argc, char **argv)
{
    /* optional arguments: number of 2^16-input chunks (default all 65536) and
     * the first chunk, for spot checks of a range */
    long chunks = argc > 1 ? strtol(argv[1], NULL, 0) : 65536;
    long first = argc > 2 ? strtol(argv[2], NULL, 0) : 0;
    if (chunks < 0 || first < 0 || first + chunks > 65536) {
        fprintf(stderr, "usage: exhaustive [CHUNKS [FIRST]] with FIRST + CHUNKS <= 65536\n");
        return 2;
    }
    mp_isa isas[MP_ISA_COUNT];
    int nisa = 0;
    for (int i = 1; i < MP_ISA_COUNT; i++) /* amx's conversions are avx512bf16's */
        if (mp_isa_supported((mp_isa)i) && i != MP_ISA_AMX) isas[nisa++] = (mp_isa)i;
    printf("exhaustive: %ld x 2^16 float32 inputs, %zu targets, scalar vs reference; SIMD paths:",
           chunks, NT);
    for (int i = 0; i < nisa; i++) printf(" %s", mp_isa_name(isas[i]));
    {
        uint32_t unused;
        float one = 1.0f;
        uint16_t v;
        have_values =
            mp_fp8_scaled_cast(NULL, &v, MP_F8E4M3, &one, MP_F32, 1, 1.0f, false, &unused);
    }
    printf("%s\n", have_values ? "; the scaled cast's values" : "");
    fflush(stdout);

#pragma omp parallel
    {
        float *x = malloc(CHUNK * sizeof *x), *tmp = malloc(CHUNK * sizeof *tmp);
        uint16_t *ref = malloc(CHUNK * 2), *got = malloc(CHUNK * 2);
#pragma omp for schedule(dynamic, 16)
        for (long c = first; c < first + chunks; c++) {
            uint32_t base = (uint32_t)c << 16;
            for (uint32_t i = 0; i < CHUNK; i++) x[i] = mp_bits_f32(base + i);
            if (have_values) check_values(x, base, got, ref, tmp);
            for (size_t t = 0; t < NT; t++) {
                const target *tg = &targets[t];
                size_t es = mp_dtype_size(tg->t);
                mp_convert_isa(MP_ISA_SCALAR, ref, tg->t, x, MP_F32, CHUNK, tg->ov);
                for (uint32_t i = 0; i < CHUNK; i++) {
                    uint32_t bits = es == 2 ? ref[i] : ((uint8_t *)ref)[i];
                    double want = ref_cast(tg->ref, x[i], tg->ovf_rule, tg->inf_rule);
                    bool ok = ref_matches(tg->ref, bits, want, x[i]);
                    if (ok && isnan(want)) ok = is_quiet_nan16(tg, bits);
                    if (!ok) {
#pragma omp atomic
                        failures[t][0]++;
                        report(tg, "scalar vs reference", base + i, bits, 0);
                    }
                }
                for (int k = 0; k < nisa; k++) {
                    mp_convert_isa(isas[k], got, tg->t, x, MP_F32, CHUNK, tg->ov);
                    if (memcmp(got, ref, CHUNK * es) != 0) {
                        for (uint32_t i = 0; i < CHUNK; i++) {
                            uint32_t g = es == 2 ? got[i] : ((uint8_t *)got)[i];
                            uint32_t w = es == 2 ? ref[i] : ((uint8_t *)ref)[i];
                            if (g != w) {
#pragma omp atomic
                                failures[t][k + 1]++;
                                report(tg, mp_isa_name(isas[k]), base + i, g, w);
                            }
                        }
                    }
                }
            }
        }
        free(x);
        free(tmp);
        free(ref);
        free(got);
    }

    unsigned long long checks = 0, bad = 0;
    for (size_t t = 0; t < NT; t++) {
        printf("  %-20s scalar/reference: %llu mismatches", targets[t].name, failures[t][0]);
        bad += failures[t][0];
        for (int k = 0; k < nisa; k++) {
            printf(", %s/scalar: %llu", mp_isa_name(isas[k]), failures[t][k + 1]);
            bad += failures[t][k + 1];
        }
        printf("\n");
        checks += (unsigned long long)(1 + nisa);
    }
    unsigned long long failed_checks = 0;
    for (size_t t = 0; t < NT; t++)
        for (int k = 0; k <= nisa; k++) failed_checks += failures[t][k] != 0;
    for (int f = 0; have_values && f < 2; f++) {
        printf("  %-20s scaled cast/scalar codes decoded: %llu mismatches\n",
               f ? "e5m2 values" : "e4m3 values", value_failures[f]);
        bad += value_failures[f];
        failed_checks += value_failures[f] != 0;
        checks++;
    }
    printf("exhaustive: %llu passed, %llu failed\n", checks - failed_checks, failed_checks);
    return bad ? 1 : 0;
}
