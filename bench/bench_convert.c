/* bench_convert.c - conversion throughput on 64 MiB float32 arrays, scalar vs
 * SIMD paths, next to memcpy as the practical limit. Bandwidth counts bytes
 * read plus bytes written; figures are medians of repeated runs on one thread
 * (mp_convert is single-threaded). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"
#include "bench_util.h"

#define N ((size_t)16 << 20) /* 16 Mi float32 = 64 MiB */
#define REPS 9

static void *buffer(size_t bytes)
{
    void *p = mp_region_alloc(bytes);
    if (!p) {
        fprintf(stderr, "bench_convert: cannot allocate %zu bytes\n", bytes);
        exit(1);
    }
    memset(p, 0, bytes); /* fault every page in before timing */
    return p;
}

static float *src32;
static void *lowp;
static float *dst32;

typedef struct {
    const char *name;
    mp_dtype from, to;
} conversion;

static double median_seconds(mp_isa isa, const conversion *c, int is_memcpy, size_t bytes)
{
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        double t0 = now();
        if (is_memcpy)
            memcpy(dst32, src32, bytes);
        else if (c->from == MP_F32)
            mp_convert_isa(isa, lowp, c->to, src32, MP_F32, N, MP_OVERFLOW_SATURATE);
        else
            mp_convert_isa(isa, dst32, MP_F32, lowp, c->from, N, MP_OVERFLOW_SATURATE);
        t[r] = now() - t0;
    }
    return median(t, REPS);
}

int main(void)
{
    src32 = buffer(N * 4);
    dst32 = buffer(N * 4);
    lowp = buffer(N * 2);
    for (size_t i = 0; i < N; i++) src32[i] = (float)((double)(i % 100003) * 1e-3 - 50.0);

    double mt = median_seconds(MP_ISA_SCALAR, NULL, 1, N * 4);
    double mem_gbs = 2.0 * (double)(N * 4) / mt / 1e9;
    printf("conversion of 64 MiB float32 arrays, 1 thread, median of %d runs\n", REPS);
    printf("GB/s = (bytes read + bytes written) / time; ratio = GB/s / memcpy GB/s\n\n");
    printf("%-16s %-11s %9s %8s\n", "operation", "path", "GB/s", "ratio");
    printf("%-16s %-11s %9.2f %8.2f\n", "memcpy 64 MiB", "libc", mem_gbs, 1.0);

    static const conversion convs[] = {
        {"f32 -> bf16", MP_F32, MP_BF16},   {"bf16 -> f32", MP_BF16, MP_F32},
        {"f32 -> f16", MP_F32, MP_F16},     {"f16 -> f32", MP_F16, MP_F32},
        {"f32 -> e4m3", MP_F32, MP_F8E4M3}, {"e4m3 -> f32", MP_F8E4M3, MP_F32},
        {"f32 -> e5m2", MP_F32, MP_F8E5M2},
    };
    double worst_simd = 1e9;
    for (size_t c = 0; c < sizeof convs / sizeof convs[0]; c++) {
        mp_dtype low = convs[c].from == MP_F32 ? convs[c].to : convs[c].from;
        /* inputs for the decoding direction: the encoded array */
        mp_convert_isa(MP_ISA_SCALAR, lowp, low, src32, MP_F32, N, MP_OVERFLOW_SATURATE);
        double bytes = (double)N * (4.0 + (double)mp_dtype_size(low));
        for (int isa = 0; isa < MP_ISA_COUNT; isa++) {
            if (!mp_isa_supported((mp_isa)isa)) continue;
            /* the two SIMD paths share every kernel except f32 -> bf16 */
            if (isa == MP_ISA_AVX512 && convs[c].to != MP_BF16) continue;
            double gbs = bytes / median_seconds((mp_isa)isa, &convs[c], 0, 0) / 1e9;
            printf("%-16s %-11s %9.2f %8.2f\n", convs[c].name, mp_isa_name((mp_isa)isa), gbs,
                   gbs / mem_gbs);
            if (isa != MP_ISA_SCALAR && gbs / mem_gbs < worst_simd) worst_simd = gbs / mem_gbs;
        }
    }
    printf("\nsummary: worst_simd_vs_memcpy=%.2f (target >= 0.70)\n", worst_simd);
    return 0;
}
