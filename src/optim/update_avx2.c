/* update_avx2.c - AVX2 versions of the optimizer's per-element rules, eight
 * floats at a time. Like update_avx512.c, each vector operation is the
 * scalar one in the same order without fused multiply-adds, and the last
 * n % 8 elements go through the scalar loops, so the results equal
 * optimizer.c's bit for bit (tests/test_optim.c, tests/test_kernel_choice.c). */
#include "optim_internal.h"

#if MP_X86
#include <immintrin.h>

/* Clamp to [-cv, cv] with ordered compares: NaN fails both and stays NaN,
 * as in the scalar if/else. */
MP_TARGET_AVX2 static inline __m256 clamp(__m256 g, __m256 cv, __m256 ncv)
{
    g = _mm256_blendv_ps(g, cv, _mm256_cmp_ps(g, cv, _CMP_GT_OQ));
    return _mm256_blendv_ps(g, ncv, _mm256_cmp_ps(g, ncv, _CMP_LT_OQ));
}

MP_TARGET_AVX2 void mp_update_sgd_avx2(const mp_step_coefs *c, float *w, const float *g, float *buf,
                                       int64_t n)
{
    const __m256 gf = _mm256_set1_ps(c->gfactor), cv = _mm256_set1_ps(c->clip_value),
                 ncv = _mm256_set1_ps(-c->clip_value), wd = _mm256_set1_ps(c->weight_decay),
                 mom = _mm256_set1_ps(c->momentum), lr = _mm256_set1_ps(c->lr);
    const bool clip = c->clip_value > 0.0f, decay = c->weight_decay != 0.0f;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 wj = _mm256_loadu_ps(w + j);
        __m256 gj = _mm256_mul_ps(_mm256_loadu_ps(g + j), gf);
        if (clip) gj = clamp(gj, cv, ncv);
        if (decay) gj = _mm256_add_ps(gj, _mm256_mul_ps(wd, wj));
        if (buf) {
            __m256 b = _mm256_add_ps(_mm256_mul_ps(mom, _mm256_loadu_ps(buf + j)), gj);
            _mm256_storeu_ps(buf + j, b);
            gj = c->nesterov ? _mm256_add_ps(gj, _mm256_mul_ps(mom, b)) : b;
        }
        _mm256_storeu_ps(w + j, _mm256_sub_ps(wj, _mm256_mul_ps(lr, gj)));
    }
    if (j < n) mp_update_sgd_scalar(c, w + j, g + j, buf ? buf + j : NULL, n - j);
}

MP_TARGET_AVX2 void mp_update_adam_avx2(const mp_step_coefs *c, bool decoupled, float *w,
                                        const float *g, float *m, float *v, int64_t n)
{
    const __m256 gf = _mm256_set1_ps(c->gfactor), cv = _mm256_set1_ps(c->clip_value),
                 ncv = _mm256_set1_ps(-c->clip_value), wd = _mm256_set1_ps(c->weight_decay),
                 dd = _mm256_set1_ps(c->decoupled_decay), b1 = _mm256_set1_ps(c->beta1),
                 omb1 = _mm256_set1_ps(c->one_minus_beta1), b2 = _mm256_set1_ps(c->beta2),
                 omb2 = _mm256_set1_ps(c->one_minus_beta2), sbc2 = _mm256_set1_ps(c->sqrt_bc2),
                 eps = _mm256_set1_ps(c->eps), ss = _mm256_set1_ps(c->step_size);
    const bool clip = c->clip_value > 0.0f, l2 = !decoupled && c->weight_decay != 0.0f;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 wj = _mm256_loadu_ps(w + j);
        __m256 gj = _mm256_mul_ps(_mm256_loadu_ps(g + j), gf);
        if (clip) gj = clamp(gj, cv, ncv);
        if (decoupled)
            wj = _mm256_mul_ps(wj, dd);
        else if (l2)
            gj = _mm256_add_ps(gj, _mm256_mul_ps(wd, wj));
        __m256 mj =
            _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + j)), _mm256_mul_ps(omb1, gj));
        /* (1 - beta2) * g * g groups left to right, as in C */
        __m256 vj = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + j)),
                                  _mm256_mul_ps(_mm256_mul_ps(omb2, gj), gj));
        _mm256_storeu_ps(m + j, mj);
        _mm256_storeu_ps(v + j, vj);
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vj), sbc2), eps);
        __m256 upd = _mm256_mul_ps(ss, _mm256_div_ps(mj, denom));
        _mm256_storeu_ps(w + j, _mm256_sub_ps(wj, upd));
    }
    if (j < n) mp_update_adam_scalar(c, decoupled, w + j, g + j, m + j, v + j, n - j);
}
#endif
