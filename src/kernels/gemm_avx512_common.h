/* gemm_avx512_common.h - what the AVX-512 GEMM files share: the 8x8
 * transpose of gemm_simd.h (used by the packers of both formats) and the
 * vector epilogue (defined in gemm_epilogue_avx512.c). */
#ifndef MP_GEMM_AVX512_COMMON_H
#define MP_GEMM_AVX512_COMMON_H

#include "kernels/gemm_simd.h"

#if MP_X86
#include <immintrin.h>

void mp_gemm_epilogue_avx512(const gemm_epilogue *e, const float *t, int64_t ldt, int64_t i0,
                             int64_t j0, int64_t mr, int64_t nr);
#endif

#endif
