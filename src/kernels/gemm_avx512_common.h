/* gemm_avx512_common.h - what the AVX-512 GEMM files share: the 8x8
 * transpose of gemm_simd.h (used by the bfloat16 packer) and a 16x16 one
 * of 32-bit words (AMX's A packer, the convolution's transposed copy), the
 * vector epilogue (defined in gemm_epilogue_avx512.c) and the dispatch of a
 * run-time column-vector count to an inlined core compiled for each. */
#ifndef MP_GEMM_AVX512_COMMON_H
#define MP_GEMM_AVX512_COMMON_H

#include "kernels/gemm_simd.h"

#if MP_X86
#include <immintrin.h>

void mp_gemm_epilogue_avx512(const gemm_epilogue *e, const float *t, int64_t ldt, int64_t i0,
                             int64_t j0, int64_t mr, int64_t nr);
bool mp_gemm_nonfinite_avx512(const float *c, int64_t ldc, int64_t rows, int64_t cols);

/* The tile's C rows are asked for with write intent in the last depth
 * iterations of a kernel call, one row per iteration from row 0 at
 * MP_GEMM_C_AHEAD iterations before the end: the stores that end the call
 * then find their lines in L1. Stored cold, 24 lines at once, they held the
 * miss buffers the streaming B panel needs for the time of a round trip to
 * memory (an emulation of a depth block of fc2 forward, bf16, one thread:
 * stores alone to C rows 16 KiB apart cost about 7% against a C tile in L1).
 * 64 iterations move 12 KiB of B through L1: the lines asked for stay.
 * Calls shorter than that ask for nothing. */
enum { MP_GEMM_C_AHEAD = 64 };

static inline __attribute__((always_inline)) void
mp_gemm_prefetch_c(const float *c, int64_t ldc, int64_t it, int64_t end, int rows, int nv)
{
    const int64_t r = it - (end - MP_GEMM_C_AHEAD);
    if (r < 0 || r >= rows) return;
    for (int v = 0; v < nv; v++) _mm_prefetch((const char *)(c + r * ldc + 16 * v), _MM_HINT_ET0);
}

/* The 16 x 16 32-bit words r[0..16) transposed in place: r[i] lane j <-
 * r[j] lane i. Unrolled, so that r stays in registers (rolled loops index
 * r and t in memory: a store and a load per shuffle). */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) void
mp_transpose16x16_epi32(__m512i r[16])
{
    __m512i t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* 128-bit lane l of r[4 g + s] now holds rows 4 g .. 4 g + 3 of
     * column 4 l + s: the lanes regroup so that column j's four lanes (row
     * groups 0-3) meet in r[j] */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xDD);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
        r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD);
    }
}

/* core(..., nv) with nv (1..3 zmm columns of the tile) a constant in each
 * call, so that the always-inline core keeps its accumulators in registers */
#define MP_GEMM_BY_NV(nv, core, ...)                                                               \
    do {                                                                                           \
        if ((nv) == 3)                                                                             \
            core(__VA_ARGS__, 3);                                                                  \
        else if ((nv) == 2)                                                                        \
            core(__VA_ARGS__, 2);                                                                  \
        else                                                                                       \
            core(__VA_ARGS__, 1);                                                                  \
    } while (0)
#endif

#endif
