/* update_avx512.c - AVX-512 versions of the optimizer's per-element rules.
 * Each vector operation is the scalar one (mul, add, sub, div, sqrt are
 * correctly rounded in both), in the same order and without fusing
 * multiply-adds, so the results equal optimizer.c's scalar loops bit for
 * bit; tests/test_optim.c checks this on every ISA the CPU has. */
#include "optim_internal.h"

#if MP_X86
#include <immintrin.h>

static inline __mmask16 lanes(int64_t r)
{
    return r >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << r) - 1u);
}

/* Clamp to [-cv, cv] with ordered compares: NaN fails both and stays NaN,
 * as in the scalar if/else. */
MP_TARGET_AVX512 static inline __m512 clamp(__m512 g, __m512 cv, __m512 ncv)
{
    g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(g, cv, _CMP_GT_OQ), cv);
    return _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(g, ncv, _CMP_LT_OQ), ncv);
}

MP_TARGET_AVX512 void mp_update_sgd_avx512(const mp_step_coefs *c, float *w, const float *g,
                                           float *buf, int64_t n)
{
    const __m512 gf = _mm512_set1_ps(c->gfactor), cv = _mm512_set1_ps(c->clip_value),
                 ncv = _mm512_set1_ps(-c->clip_value), wd = _mm512_set1_ps(c->weight_decay),
                 mom = _mm512_set1_ps(c->momentum), lr = _mm512_set1_ps(c->lr);
    const bool clip = c->clip_value > 0.0f, decay = c->weight_decay != 0.0f;
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = lanes(n - j);
        __m512 wj = _mm512_maskz_loadu_ps(k, w + j);
        __m512 gj = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, g + j), gf);
        if (clip) gj = clamp(gj, cv, ncv);
        if (decay) gj = _mm512_add_ps(gj, _mm512_mul_ps(wd, wj));
        if (buf) {
            __m512 b = _mm512_add_ps(_mm512_mul_ps(mom, _mm512_maskz_loadu_ps(k, buf + j)), gj);
            _mm512_mask_storeu_ps(buf + j, k, b);
            gj = c->nesterov ? _mm512_add_ps(gj, _mm512_mul_ps(mom, b)) : b;
        }
        _mm512_mask_storeu_ps(w + j, k, _mm512_sub_ps(wj, _mm512_mul_ps(lr, gj)));
    }
}

MP_TARGET_AVX512 void mp_update_adam_avx512(const mp_step_coefs *c, bool decoupled, float *w,
                                            const float *g, float *m, float *v, int64_t n)
{
    const __m512 gf = _mm512_set1_ps(c->gfactor), cv = _mm512_set1_ps(c->clip_value),
                 ncv = _mm512_set1_ps(-c->clip_value), wd = _mm512_set1_ps(c->weight_decay),
                 dd = _mm512_set1_ps(c->decoupled_decay), b1 = _mm512_set1_ps(c->beta1),
                 omb1 = _mm512_set1_ps(c->one_minus_beta1), b2 = _mm512_set1_ps(c->beta2),
                 omb2 = _mm512_set1_ps(c->one_minus_beta2), sbc2 = _mm512_set1_ps(c->sqrt_bc2),
                 eps = _mm512_set1_ps(c->eps), ss = _mm512_set1_ps(c->step_size);
    const bool clip = c->clip_value > 0.0f, l2 = !decoupled && c->weight_decay != 0.0f;
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = lanes(n - j);
        __m512 wj = _mm512_maskz_loadu_ps(k, w + j);
        __m512 gj = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, g + j), gf);
        if (clip) gj = clamp(gj, cv, ncv);
        if (decoupled)
            wj = _mm512_mul_ps(wj, dd);
        else if (l2)
            gj = _mm512_add_ps(gj, _mm512_mul_ps(wd, wj));
        __m512 mj = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_maskz_loadu_ps(k, m + j)),
                                  _mm512_mul_ps(omb1, gj));
        /* (1 - beta2) * g * g groups left to right, as in C */
        __m512 vj = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_maskz_loadu_ps(k, v + j)),
                                  _mm512_mul_ps(_mm512_mul_ps(omb2, gj), gj));
        _mm512_mask_storeu_ps(m + j, k, mj);
        _mm512_mask_storeu_ps(v + j, k, vj);
        __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vj), sbc2), eps);
        __m512 upd = _mm512_mul_ps(ss, _mm512_div_ps(mj, denom));
        _mm512_mask_storeu_ps(w + j, k, _mm512_sub_ps(wj, upd));
    }
}
#endif
