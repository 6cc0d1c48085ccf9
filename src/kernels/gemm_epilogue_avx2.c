/* gemm_epilogue_avx2.c - the AVX2 path's GEMM epilogue (gemm_impl.epilogue):
 * alpha, beta * C, bias and the activation on 8 lanes in the scalar
 * epilogue's operation order, and the final rounding to a float32,
 * bfloat16 or float16 C (whole 16-wide rows of a 16-bit C in registers). */
#include "kernels/gemm_avx2_lanes.h"

#if MP_X86

enum { HNR = MP_GEMM_AVX2_NR };

/* C's elements [idx, idx + cnt) widened to f32; the rest zero. */
MP_TARGET_AVX2 static inline __m256 load_c(const void *c, mp_dtype t, int64_t idx, int cnt)
{
    if (t == MP_F32)
        return cnt == 8 ? _mm256_loadu_ps((const float *)c + idx)
                        : _mm256_maskload_ps((const float *)c + idx, lanes(cnt));
    return load8((const char *)c + idx * 2, t, cnt, 0, cnt);
}

/* The first n (1..8) lanes of v rounded to the 16-bit type t (as
 * mp_convert rounds: RNE, NaN quieted) to o. */
MP_TARGET_AVX2 static inline void store_half_n(uint16_t *o, __m256 v, mp_dtype t, int n)
{
    const __m128i h = t == MP_F16
                          ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                          : mp_narrow16x8(mp_bf16_round8(_mm256_castps_si256(v)));
    if (n == 8) {
        _mm_storeu_si128((__m128i *)o, h);
        return;
    }
    _Alignas(16) uint16_t lane[8];
    _mm_store_si128((__m128i *)lane, h);
    memcpy(o, lane, (size_t)n * sizeof *o);
}

/* The epilogue's commonest case in a 16-bit step, whole 16-wide rows of a
 * bfloat16 or float16 C with beta 0 under at most bias and relu (the
 * convolutions' outputs): the same operations in the same order, each row's two halves
 * rounded, packed and stored as one 32-byte write, with nothing tested per
 * 8 lanes. AMD EPYC (Zen 3), ResNet-20's convolutions in bfloat16 (batch
 * 128, 3x3, 2 threads), medians of 41 calls alternating in one process,
 * three runs, ms: 16 channels at 28x28 forward with bias and relu 4.45 /
 * 3.81 / 4.39 -> 3.65 / 3.20 / 3.63 (the general loop took a fifth of it),
 * its data gradient 3.89 / 4.15 / 4.47 -> 3.20 / 3.30 / 3.65; 32 channels
 * at 14x14 4.96 -> 4.55, 64 at 7x7 5.84 -> 5.57; float16, the 16-channel
 * forward, 4.93-5.84 -> 3.87-4.36 (three runs, one process each). */
MP_TARGET_AVX2 static void half_rows(const gemm_epilogue *e, const float *t, int64_t ldt,
                                     int64_t i0, int64_t j0, int64_t mr, __m256 alpha)
{
    const __m256 b0 = e->bias ? _mm256_loadu_ps(e->bias + j0) : _mm256_setzero_ps();
    const __m256 b1 = e->bias ? _mm256_loadu_ps(e->bias + j0 + 8) : _mm256_setzero_ps();
    const bool relu = e->act == MP_ACT_RELU, bias = e->bias != NULL, f16 = e->c_type == MP_F16;
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t i = 0; i < mr; i++) {
        __m256 v0 = _mm256_mul_ps(alpha, _mm256_loadu_ps(t + i * ldt));
        __m256 v1 = _mm256_mul_ps(alpha, _mm256_loadu_ps(t + i * ldt + 8));
        if (bias) {
            v0 = _mm256_add_ps(v0, b0);
            v1 = _mm256_add_ps(v1, b1);
        }
        if (relu) {
            v0 = _mm256_and_ps(v0, _mm256_cmp_ps(v0, zero, _CMP_NLE_UQ));
            v1 = _mm256_and_ps(v1, _mm256_cmp_ps(v1, zero, _CMP_NLE_UQ));
        }
        __m256i h;
        if (f16) {
            enum { RNE = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }; /* an immediate */
            h = _mm256_set_m128i(_mm256_cvtps_ph(v1, RNE), _mm256_cvtps_ph(v0, RNE));
        } else {
            /* each lane's bfloat16 in its low 16 bits: packus keeps them, in
             * the order r0[0..3] r1[0..3] r0[4..7] r1[4..7], which the
             * permute mends */
            h = _mm256_permute4x64_epi64(
                _mm256_packus_epi32(mp_bf16_round8(_mm256_castps_si256(v0)),
                                    mp_bf16_round8(_mm256_castps_si256(v1))),
                0xD8);
        }
        _mm256_storeu_si256((__m256i *)((uint16_t *)e->c + (i0 + i) * e->ldc + j0), h);
    }
}

/* The scalar epilogue's operations in its order (alpha * acc, + beta * c,
 * + bias, activation, one rounding), 8 lanes at a time. A float32, bfloat16
 * or float16 C under at most relu is written from the registers; a gelu
 * row, or a float8 C, goes through the conversion kernels. */
MP_TARGET_AVX2 void mp_gemm_epilogue_avx2(const gemm_epilogue *e, const float *t, int64_t ldt,
                                          int64_t i0, int64_t j0, int64_t mr, int64_t nr)
{
    if (e->trans && mr <= 8 && nr <= 64) {
        _Alignas(32) float tt[64 * 8];
        mp_gemm_epilogue_transposed(e, t, ldt, i0, j0, mr, nr, tt, 8, mp_gemm_epilogue_avx2);
        return;
    }
    if (nr > HNR || e->trans) {
        mp_gemm_epilogue_scalar(e, t, ldt, i0, j0, mr, nr);
        return;
    }
    const __m256 alpha = _mm256_set1_ps(e->alpha), beta = _mm256_set1_ps(e->beta);
    const __m256 zero = _mm256_setzero_ps();
    if (nr == HNR && (e->c_type == MP_BF16 || e->c_type == MP_F16) && e->beta == 0.0f &&
        (e->act == MP_ACT_NONE || e->act == MP_ACT_RELU)) {
        half_rows(e, t, ldt, i0, j0, mr, alpha);
        return;
    }
    _Alignas(32) float row[HNR];
    const bool plain = e->act == MP_ACT_NONE || e->act == MP_ACT_RELU;
    const bool direct = e->c_type == MP_F32 && plain;
    const bool half = (e->c_type == MP_BF16 || e->c_type == MP_F16) && plain;
    const size_t csz = mp_dtype_size(e->c_type);
    for (int64_t i = 0; i < mr; i++) {
        const int64_t ci = (i0 + i) * e->ldc + j0;
        for (int64_t j = 0; j < nr; j += 8) {
            const int cnt = nr - j < 8 ? (int)(nr - j) : 8;
            /* the tile's rows are at least HNR wide: a full load stays inside */
            __m256 v = _mm256_mul_ps(alpha, _mm256_loadu_ps(t + i * ldt + j));
            if (e->beta != 0.0f)
                v = _mm256_add_ps(v, _mm256_mul_ps(beta, load_c(e->c, e->c_type, ci + j, cnt)));
            if (e->bias) v = _mm256_add_ps(v, _mm256_maskload_ps(e->bias + j0 + j, lanes(cnt)));
            if (e->act == MP_ACT_RELU) v = _mm256_and_ps(v, _mm256_cmp_ps(v, zero, _CMP_NLE_UQ));
            if (direct)
                store_n((float *)e->c + ci + j, v, cnt);
            else if (half)
                store_half_n((uint16_t *)e->c + ci + j, v, e->c_type, cnt);
            else
                _mm256_store_ps(row + j, v);
        }
        if (direct || half) continue;
        if (e->act == MP_ACT_GELU || e->act == MP_ACT_GELU_TANH)
            mp_activate_row(e->act, row, row, (size_t)nr);
        mp_convert_isa(MP_ISA_AVX2, (char *)e->c + (size_t)ci * csz, e->c_type, row, MP_F32,
                       (size_t)nr, MP_OVERFLOW_SATURATE);
    }
}

#endif
