/* update_avx512.c - AVX-512 versions of the optimizer's per-element rules.
 * Each vector operation is the scalar one (mul, add, sub, div, sqrt are
 * correctly rounded in both), in the same order and without fusing
 * multiply-adds, so the results equal optimizer.c's scalar loops bit for
 * bit; tests/test_optim.c checks this on every ISA the CPU has. */
#include "core/avx512_lanes.h"
#include "optim_internal.h"

#if MP_X86
#include <immintrin.h>

/* Clamp to [-cv, cv] with ordered compares: NaN fails both and stays NaN,
 * as in the scalar if/else. */
MP_TARGET_AVX512 static inline __m512 clamp(__m512 g, __m512 cv, __m512 ncv)
{
    g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(g, cv, _CMP_GT_OQ), cv);
    return _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(g, ncv, _CMP_LT_OQ), ncv);
}

/* The SGD rule on the lanes k of the 16 values at j (avx512_lanes.h). */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) void
sgd16(const mp_step_coefs *c, float *w, const float *g, float *buf, int64_t j, __mmask16 k)
{
    const __m512 cv = _mm512_set1_ps(c->clip_value), mom = _mm512_set1_ps(c->momentum);
    __m512 wj = mp_load16(w + j, k);
    __m512 gj = _mm512_mul_ps(mp_load16(g + j, k), _mm512_set1_ps(c->gfactor));
    if (c->clip_value > 0.0f) gj = clamp(gj, cv, _mm512_set1_ps(-c->clip_value));
    if (c->weight_decay != 0.0f)
        gj = _mm512_add_ps(gj, _mm512_mul_ps(_mm512_set1_ps(c->weight_decay), wj));
    if (buf) {
        __m512 b = _mm512_add_ps(_mm512_mul_ps(mom, mp_load16(buf + j, k)), gj);
        mp_store16(buf + j, k, b);
        gj = c->nesterov ? _mm512_add_ps(gj, _mm512_mul_ps(mom, b)) : b;
    }
    mp_store16(w + j, k, _mm512_sub_ps(wj, _mm512_mul_ps(_mm512_set1_ps(c->lr), gj)));
}

MP_TARGET_AVX512 void mp_update_sgd_avx512(const mp_step_coefs *c, float *w, const float *g,
                                           float *buf, int64_t n)
{
    const mp_step_coefs cc = *c; /* a copy the stores cannot alias (see adam) */
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) sgd16(&cc, w, g, buf, j, 0xFFFF);
    if (j < n) sgd16(&cc, w, g, buf, j, mp_lanes16(n - j));
}

/* The Adam rule on the 16 values at j. */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) void
adam16(const mp_step_coefs *c, bool decoupled, float *w, const float *g, float *m, float *v,
       int64_t j, __mmask16 k)
{
    __m512 wj = mp_load16(w + j, k);
    __m512 gj = _mm512_mul_ps(mp_load16(g + j, k), _mm512_set1_ps(c->gfactor));
    if (c->clip_value > 0.0f)
        gj = clamp(gj, _mm512_set1_ps(c->clip_value), _mm512_set1_ps(-c->clip_value));
    if (decoupled)
        wj = _mm512_mul_ps(wj, _mm512_set1_ps(c->decoupled_decay));
    else if (c->weight_decay != 0.0f)
        gj = _mm512_add_ps(gj, _mm512_mul_ps(_mm512_set1_ps(c->weight_decay), wj));
    __m512 mj = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(c->beta1), mp_load16(m + j, k)),
                              _mm512_mul_ps(_mm512_set1_ps(c->one_minus_beta1), gj));
    /* (1 - beta2) * g * g groups left to right, as in C */
    __m512 vj =
        _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(c->beta2), mp_load16(v + j, k)),
                      _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(c->one_minus_beta2), gj), gj));
    mp_store16(m + j, k, mj);
    mp_store16(v + j, k, vj);
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vj), _mm512_set1_ps(c->sqrt_bc2)),
                                 _mm512_set1_ps(c->eps));
    __m512 upd = _mm512_mul_ps(_mm512_set1_ps(c->step_size), _mm512_div_ps(mj, denom));
    mp_store16(w + j, k, _mm512_sub_ps(wj, upd));
}

MP_TARGET_AVX512 void mp_update_adam_avx512(const mp_step_coefs *c, bool decoupled, float *w,
                                            const float *g, float *m, float *v, int64_t n)
{
    /* a local copy of the coefficients: with c itself, every store to w, m
     * or v might have changed *c for all the compiler knows, and each vector
     * loaded and broadcast the coefficients and tested clip_value again */
    const mp_step_coefs cc = *c;
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) adam16(&cc, decoupled, w, g, m, v, j, 0xFFFF);
    if (j < n) adam16(&cc, decoupled, w, g, m, v, j, mp_lanes16(n - j));
}
#endif
