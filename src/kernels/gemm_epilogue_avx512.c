/* gemm_epilogue_avx512.c - the vector GEMM epilogue: alpha, beta*C, bias and
 * relu on 16 lanes, in the same operation order as the scalar epilogue (no
 * contraction), and the final rounding: in registers for a float32, bfloat16
 * or float16 C under at most relu, else through the bit-exact conversion
 * kernels. GELU calls the scalar activation: its erf/tanh cost is small next
 * to the products that produced the tile. Also the check of a tile just
 * written for non-finite values (mp_gemm_args.c_nonfinite). */
#include "core/convert_simd.h"
#include "kernels/gemm_avx512_common.h"

#if MP_X86

MP_TARGET_AVX512 static inline __m512 load_c(const void *c, mp_dtype t, int64_t idx, __mmask16 m)
{
    switch (t) {
    case MP_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)c + idx));
    case MP_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)c + idx)), 16));
    default:
        return _mm512_maskz_loadu_ps(m, (const float *)c + idx);
    }
}

MP_TARGET_AVX512 void mp_gemm_epilogue_avx512(const gemm_epilogue *e, const float *t, int64_t ldt,
                                              int64_t i0, int64_t j0, int64_t mr, int64_t nr)
{
    const __m512 alpha = _mm512_set1_ps(e->alpha), beta = _mm512_set1_ps(e->beta);
    const __m512 zero = _mm512_setzero_ps();
    _Alignas(64) float row[64];
    if (e->trans && mr <= 16 && nr <= 64) {
        _Alignas(64) float tt[64 * 16];
        mp_gemm_epilogue_transposed(e, t, ldt, i0, j0, mr, nr, tt, 16, mp_gemm_epilogue_avx512);
        return;
    }
    if (nr > 64 || e->trans) {
        mp_gemm_epilogue_scalar(e, t, ldt, i0, j0, mr, nr);
        return;
    }
    /* f32, bf16 or f16 out with at most relu: stored straight from the
     * vectors, rounded there as the conversion kernels round (bf16: the
     * integer round-to-nearest-even that quiets NaNs; f16: vcvtps2ph) */
    const bool plain = e->act == MP_ACT_NONE || e->act == MP_ACT_RELU;
    const bool direct = e->c_type == MP_F32 && plain;
    const bool half = (e->c_type == MP_BF16 || e->c_type == MP_F16) && plain;
    const size_t csz = mp_dtype_size(e->c_type);
    for (int64_t i = 0; i < mr; i++) {
        const int64_t ci = (i0 + i) * e->ldc + j0;
        for (int64_t j = 0; j < nr; j += 16) {
            const int64_t cnt = nr - j < 16 ? nr - j : 16;
            const __mmask16 m = (__mmask16)((1u << cnt) - 1u);
            __m512 v = _mm512_mul_ps(alpha, _mm512_maskz_loadu_ps(m, t + i * ldt + j));
            if (e->beta != 0.0f)
                v = _mm512_add_ps(v, _mm512_mul_ps(beta, load_c(e->c, e->c_type, ci + j, m)));
            if (e->bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, e->bias + j0 + j));
            if (e->act == MP_ACT_RELU)
                v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, zero, _CMP_NLE_UQ), v);
            if (direct)
                _mm512_mask_storeu_ps((float *)e->c + ci + j, m, v);
            else if (half)
                _mm256_mask_storeu_epi16(
                    (uint16_t *)e->c + ci + j, m,
                    e->c_type == MP_F16
                        ? _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                        : _mm512_cvtepi32_epi16(mp_bf16_round16(_mm512_castps_si512(v))));
            else
                _mm512_store_ps(row + j, v);
        }
        if (direct || half) continue;
        if (e->act == MP_ACT_GELU || e->act == MP_ACT_GELU_TANH)
            mp_activate_row(e->act, row, row, (size_t)nr);
        mp_convert_isa(MP_ISA_AVX512, (char *)e->c + (size_t)ci * csz, e->c_type, row, MP_F32,
                       (size_t)nr, MP_OVERFLOW_SATURATE);
    }
}

/* A tile's rows read back from L1, 16 lanes at a time: about 50
 * instructions for an 8 x 48 tile that took thousands of cycles to compute
 * (a call per row through the portable loop cost 1.1% of a mixed_bfloat16
 * seed step). */
MP_TARGET_AVX512 bool mp_gemm_nonfinite_avx512(const float *c, int64_t ldc, int64_t rows,
                                               int64_t cols)
{
    const __m512i exp = _mm512_set1_epi32(0x7F800000);
    __mmask16 bad = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j += 16) {
            const __mmask16 m =
                cols - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (cols - j)) - 1u);
            const __m512i v = _mm512_maskz_loadu_epi32(m, c + r * ldc + j);
            bad |= _mm512_mask_cmpeq_epi32_mask(m, _mm512_and_si512(v, exp), exp);
        }
    return bad != 0;
}

#endif
