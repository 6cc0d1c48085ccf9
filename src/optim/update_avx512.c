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

/* Whole vectors load and store plainly, only the tail under a mask: with
 * masked loads and stores on every vector, Adam over 19.9 M values (2
 * threads, Zen 5, the state in memory) took 14.1 ms against 6.6-7.6 ms
 * (the rate of a plain 4-read 3-write stream). */
MP_TARGET_AVX512 static inline __m512 load(const float *p, __mmask16 k, bool whole)
{
    return whole ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(k, p);
}
MP_TARGET_AVX512 static inline void store(float *p, __mmask16 k, __m512 v, bool whole)
{
    if (whole)
        _mm512_storeu_ps(p, v);
    else
        _mm512_mask_storeu_ps(p, k, v);
}

/* Clamp to [-cv, cv] with ordered compares: NaN fails both and stays NaN,
 * as in the scalar if/else. */
MP_TARGET_AVX512 static inline __m512 clamp(__m512 g, __m512 cv, __m512 ncv)
{
    g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(g, cv, _CMP_GT_OQ), cv);
    return _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(g, ncv, _CMP_LT_OQ), ncv);
}

/* The SGD rule on the 16 values at j (k: the tail's lanes unless whole). */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) void sgd16(const mp_step_coefs *c,
                                                                         float *w, const float *g,
                                                                         float *buf, int64_t j,
                                                                         __mmask16 k, bool whole)
{
    const __m512 cv = _mm512_set1_ps(c->clip_value), mom = _mm512_set1_ps(c->momentum);
    __m512 wj = load(w + j, k, whole);
    __m512 gj = _mm512_mul_ps(load(g + j, k, whole), _mm512_set1_ps(c->gfactor));
    if (c->clip_value > 0.0f) gj = clamp(gj, cv, _mm512_set1_ps(-c->clip_value));
    if (c->weight_decay != 0.0f)
        gj = _mm512_add_ps(gj, _mm512_mul_ps(_mm512_set1_ps(c->weight_decay), wj));
    if (buf) {
        __m512 b = _mm512_add_ps(_mm512_mul_ps(mom, load(buf + j, k, whole)), gj);
        store(buf + j, k, b, whole);
        gj = c->nesterov ? _mm512_add_ps(gj, _mm512_mul_ps(mom, b)) : b;
    }
    store(w + j, k, _mm512_sub_ps(wj, _mm512_mul_ps(_mm512_set1_ps(c->lr), gj)), whole);
}

MP_TARGET_AVX512 void mp_update_sgd_avx512(const mp_step_coefs *c, float *w, const float *g,
                                           float *buf, int64_t n)
{
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) sgd16(c, w, g, buf, j, 0xFFFF, true);
    if (j < n) sgd16(c, w, g, buf, j, lanes(n - j), false);
}

/* The Adam rule on the 16 values at j. */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) void
adam16(const mp_step_coefs *c, bool decoupled, float *w, const float *g, float *m, float *v,
       int64_t j, __mmask16 k, bool whole)
{
    __m512 wj = load(w + j, k, whole);
    __m512 gj = _mm512_mul_ps(load(g + j, k, whole), _mm512_set1_ps(c->gfactor));
    if (c->clip_value > 0.0f)
        gj = clamp(gj, _mm512_set1_ps(c->clip_value), _mm512_set1_ps(-c->clip_value));
    if (decoupled)
        wj = _mm512_mul_ps(wj, _mm512_set1_ps(c->decoupled_decay));
    else if (c->weight_decay != 0.0f)
        gj = _mm512_add_ps(gj, _mm512_mul_ps(_mm512_set1_ps(c->weight_decay), wj));
    __m512 mj = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(c->beta1), load(m + j, k, whole)),
                              _mm512_mul_ps(_mm512_set1_ps(c->one_minus_beta1), gj));
    /* (1 - beta2) * g * g groups left to right, as in C */
    __m512 vj =
        _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(c->beta2), load(v + j, k, whole)),
                      _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(c->one_minus_beta2), gj), gj));
    store(m + j, k, mj, whole);
    store(v + j, k, vj, whole);
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vj), _mm512_set1_ps(c->sqrt_bc2)),
                                 _mm512_set1_ps(c->eps));
    __m512 upd = _mm512_mul_ps(_mm512_set1_ps(c->step_size), _mm512_div_ps(mj, denom));
    store(w + j, k, _mm512_sub_ps(wj, upd), whole);
}

MP_TARGET_AVX512 void mp_update_adam_avx512(const mp_step_coefs *c, bool decoupled, float *w,
                                            const float *g, float *m, float *v, int64_t n)
{
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) adam16(c, decoupled, w, g, m, v, j, 0xFFFF, true);
    if (j < n) adam16(c, decoupled, w, g, m, v, j, lanes(n - j), false);
}
#endif
