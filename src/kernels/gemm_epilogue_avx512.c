/* gemm_epilogue_avx512.c - the vector GEMM epilogue: alpha, beta*C, bias and
 * relu on 16 lanes, in the same operation order as the scalar epilogue (no
 * contraction), and the final rounding: in registers for a float32, bfloat16
 * or float16 C under at most relu, else through the bit-exact conversion
 * kernels. GELU calls the scalar activation: its erf/tanh cost is small next
 * to the products that produced the tile. Also the check of a tile just
 * written for non-finite values (mp_gemm_args.c_nonfinite). */
#include "core/avx512_lanes.h"
#include "core/convert_simd.h"
#include "kernels/gemm_avx512_common.h"

#if MP_X86

/* Lanes m of C at idx as float32 (avx512_lanes.h: a whole vector plainly;
 * gpt_mini's step, whose attention projections' input gradients add into
 * dx with beta 1, Zen 5, alternating in one process: mixed_bfloat16 188.4
 * -> 185.4 and 200.1 -> 197.8 ms, float32 318.1 -> 315.3 and 331.7 ->
 * 326.3 ms against masked loads of C and the bias). */
MP_TARGET_AVX512 static inline __m512 load_c(const void *c, mp_dtype t, int64_t idx, __mmask16 m)
{
    switch (t) {
    case MP_F16:
        return _mm512_cvtph_ps(mp_load16_u16((const uint16_t *)c + idx, m));
    case MP_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(mp_load16_u16((const uint16_t *)c + idx, m)), 16));
    default:
        return mp_load16((const float *)c + idx, m);
    }
}

/* Lanes of v that are NaN or +-inf (all exponent bits set). */
MP_TARGET_AVX512 static inline __mmask16 nonfinite16(__m512 v)
{
    const __m512i exp = _mm512_set1_epi32(0x7F800000);
    return _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), exp), exp);
}

/* The commonest tiles on their way out: full rows of 16 lanes, no beta, at
 * most alpha, a bias and relu. The general loop below tests its flags and
 * rebuilds its constants for every vector (about 50 instructions a vector
 * as GCC compiles it, a fifth of a depth-256 product's time); here the type
 * is a constant of each copy and the rest is fixed outside the loops. The
 * same operations as the general loop, so the same bits. A float32 C's
 * non-finite lanes are gathered into *bad as they are stored. */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) void
plain_rows(mp_dtype ct, const float *t, int64_t ldt, void *c, int64_t ldc, float alpha,
           const float *bias, bool relu, int64_t mr, int64_t nr, __mmask16 *bad)
{
    const __m512 zero = _mm512_setzero_ps(), va = _mm512_set1_ps(alpha);
    const bool scaled = alpha != 1.0f; /* 1 * v is v, NaN and -0 included */
    const size_t cs = ct == MP_F32 ? 4 : 2;
    __mmask16 seen = 0;
    for (int64_t i = 0; i < mr; i++, t += ldt)
        for (int64_t j = 0; j < nr; j += 16) {
            __m512 v = _mm512_loadu_ps(t + j);
            if (scaled) v = _mm512_mul_ps(va, v);
            if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + j));
            if (relu) v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, zero, _CMP_NLE_UQ), v);
            char *p = (char *)c + (size_t)(i * ldc + j) * cs;
            if (ct == MP_F32) {
                _mm512_storeu_ps(p, v);
                seen |= nonfinite16(v);
            } else if (ct == MP_F16) {
                _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT |
                                                                         _MM_FROUND_NO_EXC));
            } else {
                _mm256_storeu_si256((__m256i *)p,
                                    _mm512_cvtepi32_epi16(mp_bf16_round16(_mm512_castps_si512(v))));
            }
        }
    *bad |= seen;
}

/* Reports what one call found to e->nonfinite (set only, never cleared). */
static void report(const gemm_epilogue *e, __mmask16 bad)
{
    if (bad && e->nonfinite) atomic_store_explicit(e->nonfinite, 1, memory_order_relaxed);
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
        if (e->nonfinite) { /* read back, as stored: C^T's rows are the tile's columns */
            const int64_t rows = e->trans ? nr : mr, cols = e->trans ? mr : nr;
            const int64_t at = e->trans ? j0 * e->ldc + i0 : i0 * e->ldc + j0;
            report(e, mp_gemm_nonfinite_avx512((const float *)e->c + at, e->ldc, rows, cols));
        }
        return;
    }
    /* f32, bf16 or f16 out with at most relu: stored straight from the
     * vectors, rounded there as the conversion kernels round (bf16: the
     * integer round-to-nearest-even that quiets NaNs; f16: vcvtps2ph).
     * The fields are read into locals first: C could alias *e for all the
     * compiler knows, and it would read them again after every store. A
     * full vector is loaded and stored unmasked (Zen 5, masked stores of
     * every vector: 4096x1024x256 bf16 with a bias, 4.26 -> 3.79 ms). */
    const mp_dtype ct = e->c_type;
    const mp_activation act = e->act;
    void *const c = e->c;
    const int64_t ldc = e->ldc;
    const float *const bias = e->bias;
    const bool has_beta = e->beta != 0.0f, relu = act == MP_ACT_RELU;
    const bool scaled = e->alpha != 1.0f; /* 1 * v is v, NaN and -0 included */
    const bool plain = act == MP_ACT_NONE || relu;
    const bool direct = ct == MP_F32 && plain;
    const bool half = (ct == MP_BF16 || ct == MP_F16) && plain;
    const size_t csz = mp_dtype_size(ct);
    __mmask16 bad = 0;
    if (plain && !has_beta && nr % 16 == 0) {
        const float *b = bias ? bias + j0 : NULL;
        char *c0 = (char *)c + (size_t)(i0 * ldc + j0) * csz;
        if (ct == MP_BF16)
            plain_rows(MP_BF16, t, ldt, c0, ldc, e->alpha, b, relu, mr, nr, &bad);
        else if (ct == MP_F16)
            plain_rows(MP_F16, t, ldt, c0, ldc, e->alpha, b, relu, mr, nr, &bad);
        else
            plain_rows(MP_F32, t, ldt, c0, ldc, e->alpha, b, relu, mr, nr, &bad);
        report(e, bad);
        return;
    }
    for (int64_t i = 0; i < mr; i++) {
        const int64_t ci = (i0 + i) * ldc + j0;
        for (int64_t j = 0; j < nr; j += 16) {
            const __mmask16 m = mp_lanes16(nr - j);
            __m512 v = mp_load16(t + i * ldt + j, m);
            if (scaled) v = _mm512_mul_ps(alpha, v);
            if (has_beta) v = _mm512_add_ps(v, _mm512_mul_ps(beta, load_c(c, ct, ci + j, m)));
            if (bias) v = _mm512_add_ps(v, mp_load16(bias + j0 + j, m));
            if (relu) v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, zero, _CMP_NLE_UQ), v);
            if (direct) {
                mp_store16((float *)c + ci + j, m, v);
                bad |= nonfinite16(v) & m;
            } else if (half) {
                const __m256i h =
                    ct == MP_F16 ? _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                                 : _mm512_cvtepi32_epi16(mp_bf16_round16(_mm512_castps_si512(v)));
                mp_store16_u16((uint16_t *)c + ci + j, m, h);
            } else {
                _mm512_store_ps(row + j, v);
            }
        }
        if (direct || half) continue;
        if (act == MP_ACT_GELU || act == MP_ACT_GELU_TANH)
            mp_activate_row(act, row, row, (size_t)nr);
        mp_convert_isa(MP_ISA_AVX512, (char *)c + (size_t)ci * csz, ct, row, MP_F32, (size_t)nr,
                       MP_OVERFLOW_SATURATE);
        if (ct == MP_F32) /* the row as stored, a copy */
            for (int64_t j = 0; j < nr; j += 16)
                bad |= nonfinite16(_mm512_load_ps(row + j)) & mp_lanes16(nr - j);
    }
    report(e, bad);
}

/* A tile's rows read back from L1, 16 lanes at a time: about 50
 * instructions for an 8 x 48 tile that took thousands of cycles to compute
 * (a call per row through the portable loop cost 1.1% of a mixed_bfloat16
 * seed step). */
MP_TARGET_AVX512 bool mp_gemm_nonfinite_avx512(const float *c, int64_t ldc, int64_t rows,
                                               int64_t cols)
{
    __mmask16 bad = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j += 16) {
            const __mmask16 m = mp_lanes16(cols - j);
            bad |= nonfinite16(mp_load16(c + r * ldc + j, m)) & m;
        }
    return bad != 0;
}

#endif
