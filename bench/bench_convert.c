/* bench_convert.c - conversion throughput on 64 MiB float32 arrays, scalar vs
 * SIMD paths, next to memcpy as the practical limit. Bandwidth counts bytes
 * read plus bytes written; figures are medians of repeated runs on one thread
 * (mp_convert is single-threaded). The MX rows pack float32 into element
 * codes and E8M0 scales and unpack them again, scalar against AVX-512. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/mx_internal.h"
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

static double median_mx(mp_isa isa, mp_mx_format f, int pack, uint8_t *scales)
{
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        double t0 = now();
        mp_status st = pack ? mp_mx_pack_isa(isa, f, MP_MX_BLOCK, src32, N, lowp, scales)
                            : mp_mx_unpack_isa(isa, f, MP_MX_BLOCK, lowp, scales, N, dst32, MP_F32);
        t[r] = now() - t0;
        if (st) {
            fprintf(stderr, "bench_convert: %s\n", mp_last_error());
            exit(1);
        }
    }
    return median(t, REPS);
}

/* MXFP8 (E4M3) and MXFP4: GB/s of pack and unpack on each path, and the
 * AVX-512 path's speed-up over scalar. */
static void mx_rows(double mem_gbs)
{
    uint8_t *scales = buffer(mp_mx_scale_count(N));
    const mp_mx_format fmts[] = {MP_MXFP8_E4M3, MP_MXFP4_E2M1};
    printf("\n%-22s %-11s %9s %8s %9s\n", "MX (blocks of 32)", "path", "GB/s", "ratio",
           "vs scalar");
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++)
        for (int pack = 1; pack >= 0; pack--) {
            double bytes = (double)N * 4.0 + (double)mp_mx_code_bytes(fmts[i], N) +
                           (double)mp_mx_scale_count(N);
            double scalar_gbs = 0;
            for (int isa = 0; isa < MP_ISA_COUNT; isa++) {
                /* the AVX-512 paths share the MX kernels */
                if (!mp_isa_supported((mp_isa)isa) || isa == MP_ISA_AVX512BF16) continue;
                double gbs = bytes / median_mx((mp_isa)isa, fmts[i], pack, scales) / 1e9;
                if (isa == MP_ISA_SCALAR) scalar_gbs = gbs;
                char name[32];
                snprintf(name, sizeof name, "%s %s", mp_mx_format_name(fmts[i]),
                         pack ? "pack" : "unpack");
                printf("%-22s %-11s %9.2f %8.2f %8.1fx\n", name, mp_isa_name((mp_isa)isa), gbs,
                       gbs / mem_gbs, gbs / scalar_gbs);
            }
        }
    mp_region_free(scales, mp_mx_scale_count(N));
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
    mx_rows(mem_gbs);
    printf("\nsummary: worst_simd_vs_memcpy=%.2f (target >= 0.70)\n", worst_simd);
    return 0;
}
