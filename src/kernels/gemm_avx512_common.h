/* gemm_avx512_common.h - what the AVX-512 GEMM files share: the 8x8
 * transpose of gemm_simd.h (used by the packers of both formats), the
 * vector epilogue (defined in gemm_epilogue_avx512.c) and the dispatch of a
 * run-time column-vector count to an inlined core compiled for each. */
#ifndef MP_GEMM_AVX512_COMMON_H
#define MP_GEMM_AVX512_COMMON_H

#include "kernels/gemm_simd.h"

#if MP_X86
#include <immintrin.h>

void mp_gemm_epilogue_avx512(const gemm_epilogue *e, const float *t, int64_t ldt, int64_t i0,
                             int64_t j0, int64_t mr, int64_t nr);

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
