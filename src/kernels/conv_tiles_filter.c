/* conv_tiles_filter.c - the filter gradient of a stride-1 convolution of
 * bfloat16 operands on the AMX tiles (conv_tiles.c has the forward and the
 * data gradient, and the stacked copy F this file transposes).
 *
 * The sum runs over the output pixels, which the tiles want along the rows
 * of A: a copy G holds the input stacked as F does, transposed,
 *   G[j][ci][p] = x[n][y + j - pt][q - pl][ci]   for p = (n oh + y) wv + q,
 * (wv = ow + kw - 1 positions a row, the last kw - 1 virtual), and dy goes
 * to the same pixels, zero at the virtual ones: dYv[p][co]. Then
 *   dW[.][l][.][.] ((kh * ci) x co) = (G's rows from p + l) x dYv
 * for each kw = l, A read in place along its rows (the pixels, padded to
 * whole 32-deep tiles with zeros; rows ldg * 2 bytes apart, 64 past a
 * multiple of 4 KiB so that a chunk's 64 rows do not share a few sets of
 * L1). A virtual pixel's products are its G values times dy's zeros: exact
 * for a finite x; an x with a non-finite value would make them NaN where
 * the exact sum over the real pixels is not, so such an x is left to the
 * direct kernels (*taken false), which never form them.
 *
 * The images go in a fixed number of chunks (from the shape alone), each
 * chunk's products on one thread into its own partial sums, added in chunk
 * order at the end: the bits do not depend on the thread count, and two
 * threads share a product of few rows of C evenly.
 *
 * Taken where kh * c fills whole 64-row panels of the AMX kernel. Intel
 * Xeon (family 6 model 167), 2 threads, ResNet-20 at batch 128, medians of
 * 41 calls, direct FMA kernels (MP_ISA=avx512) / these: 7x7x64 1.60 /
 * 1.02-1.04 ms. 14x14x32 (96 rows: a panel of 64 and one of 32, packed and
 * padded to 64 rows on every call) ran 1.37-1.44 against 1.39-1.49, and
 * split by rows instead of chunks of images 2.18 (one thread twice the
 * other's work): it stays direct, as do 16 channels. */
#include <string.h>

#include "kernels/conv_tiles.h"
#include "kernels/gemm_avx512_common.h"

#if MP_X86

/* Scratch slots: per thread the transposed copy and dy at its pixels, on
 * the calling thread the chunks' partial sums (core/internal.h). */
enum { SLOT_G = 9, SLOT_DY = 11, SLOT_PARTS = 13, CHUNKS = 8 };

/* Whether every bfloat16 value of x[0..n) is finite (exponent not all ones). */
static bool bf16_all_finite(const uint16_t *x, int64_t n)
{
    uint32_t bad = 0;
#pragma omp simd reduction(| : bad)
    for (int64_t i = 0; i < n; i++) bad |= (x[i] & 0x7F80u) == 0x7F80u;
    return bad == 0;
}

/* G for images [n0, n0 + nn) of x (mp pixels, 16 at a time): each pixel's
 * 32 channels of a source row as 16 words (channel pairs), the 16 x 16
 * words transposed into a pair's 16 pixels, each pair split into its two
 * channels' rows; past the pixels, zero to ldg. */
MP_TARGET_AVX512 static void stack_columns(const mp_conv_geom *g, const uint16_t *x, int64_t n0,
                                           int64_t nn, int64_t mp, int64_t ldg, uint16_t *gb)
{
    const int64_t c = g->c, wv = g->ow + g->kw - 1, rows = nn * g->oh;
    /* words 0, 2, .. 30 of a vector, then 1, 3, .. 31 */
    const __m512i split =
        _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 30, 28, 26, 24,
                         22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    for (int64_t j = 0; j < g->kh; j++) {
        int64_t r = 0, q = 0; /* pixel p's output row (in the chunk) and column */
        for (int64_t p0 = 0; p0 < mp; p0 += 16) {
            const uint16_t *px[16]; /* each pixel's source; NULL: zero */
            for (int u = 0; u < 16; u++) {
                const int64_t y = r % g->oh, iy = y + j - g->pt, ix = q - g->pl;
                px[u] = r < rows && iy >= 0 && iy < g->h && ix >= 0 && ix < g->w
                            ? x + (((n0 + r / g->oh) * g->h + iy) * g->w + ix) * c
                            : NULL;
                if (++q == wv) q = 0, r++;
            }
            for (int64_t c0 = 0; c0 < c; c0 += 32) {
                __m512i w[16];
                for (int u = 0; u < 16; u++)
                    w[u] = px[u] ? _mm512_loadu_si512(px[u] + c0) : _mm512_setzero_si512();
                mp_transpose16x16_epi32(w); /* w[k]: channels c0 + 2k and 2k + 1 of the 16 */
                uint16_t *o = gb + (j * c + c0) * ldg + p0;
                for (int k = 0; k < 16; k++) {
                    const __m512i v = _mm512_permutexvar_epi16(split, w[k]);
                    _mm256_storeu_si256((__m256i *)(o + 2 * k * ldg), _mm512_castsi512_si256(v));
                    _mm256_storeu_si256((__m256i *)(o + (2 * k + 1) * ldg),
                                        _mm512_extracti64x4_epi64(v, 1));
                }
            }
        }
    }
    for (int64_t i = 0; i < g->kh * c; i++) /* what the shifts read past the pixels */
        memset(gb + i * ldg + mp, 0, (size_t)(ldg - mp) * sizeof *gb);
}

/* Chunk [n0, n0 + nn)'s sums into part ([kw][kh * c][o]), on this thread. */
static bool chunk_sums(const mp_conv_geom *g, const uint16_t *x, const uint16_t *dy, int64_t n0,
                       int64_t nn, float *part)
{
    const int64_t c = g->c, o = g->o, kh = g->kh, kw = g->kw;
    const int64_t wv = g->ow + kw - 1, rows = nn * g->oh, m = rows * wv;
    /* the depth: the pixels and the kw - 1 the last shift reads, whole tiles */
    const int64_t mp = cdiv(m + kw - 1, 32) * 32, ldg = cdiv(mp, 2048) * 2048 + 32;
    uint16_t *gb = mp_scratch(SLOT_G, (size_t)(kh * c * ldg) * sizeof *gb);
    uint16_t *dyv = mp_scratch(SLOT_DY, (size_t)(mp * o) * sizeof *dyv);
    if (!gb || !dyv) return false;
    stack_columns(g, x, n0, nn, mp, ldg, gb);
    for (int64_t r = 0, q = 0; r * wv + q < mp;) { /* dy at the chunk's pixels */
        uint16_t *d = dyv + (r * wv + q) * o;
        if (r < rows && q < g->ow)
            memcpy(d, dy + ((n0 * g->oh + r) * g->ow + q) * o, (size_t)o * sizeof *d);
        else
            memset(d, 0, (size_t)o * sizeof *d);
        if (++q == wv) q = 0, r++;
    }
    const gemm_operand b = {dyv, MP_BF16, 1, o, NULL};
    for (int64_t l = 0; l < kw; l++) {
        const gemm_operand a = {gb + l, MP_BF16, ldg, 1, NULL};
        const gemm_epilogue e = {1.0f,  0.0f, part + l * kh * c * o, MP_F32, o, NULL, MP_ACT_NONE,
                                 false, NULL};
        if (mp_gemm_run(kh * c, o, mp, &a, &b, &e)) return false;
    }
    return true;
}

bool mp_conv_tiles_filter_ok(const mp_conv_geom *g, mp_dtype a, mp_dtype b)
{
    return mp_conv_tiles_ok(g, a, b, false) && g->sh == 1 && g->sw == 1 && g->c % 32 == 0 &&
           g->kh * g->c % 64 == 0;
}

mp_status mp_conv_tiles_filter(const mp_conv_geom *g, const void *x, const void *dy, float *dw,
                               bool accumulate, bool *taken)
{
    const int64_t c = g->c, o = g->o, kh = g->kh, kw = g->kw, nw = kh * kw * c * o;
    *taken = false;
    if (!bf16_all_finite(x, g->n * g->h * g->w * c)) return MP_OK;
    const int64_t nch = g->n < CHUNKS ? g->n : CHUNKS;
    float *parts = mp_scratch(SLOT_PARTS, (size_t)(nch * nw) * sizeof *parts);
    if (!parts) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for the filter's partial sums");
    int bad = 0;
#pragma omp parallel for schedule(dynamic) reduction(| : bad)
    for (int64_t ch = 0; ch < nch; ch++) {
        const int64_t n0 = g->n * ch / nch, n1 = g->n * (ch + 1) / nch;
        bad |= !chunk_sums(g, x, dy, n0, n1 - n0, parts + ch * nw);
    }
    if (bad) return mp_set_error(MP_ERR_NOMEM, "conv: no memory for the filter's columns");
    for (int64_t ch = 1; ch < nch; ch++) /* in chunk order */
        for (int64_t i = 0; i < nw; i++) parts[i] += parts[ch * nw + i];
    /* dw's rows (j, l, ci) from part's (l, j, ci): alpha sum + (accumulate ? dw : 0) */
    const float alpha = mp_conv_alpha(g), beta = accumulate ? 1.0f : 0.0f;
    for (int64_t l = 0; l < kw; l++)
        for (int64_t j = 0; j < kh; j++) {
            float *to = dw + (j * kw + l) * c * o;
            const gemm_epilogue e = {alpha, beta, to, MP_F32, o, NULL, MP_ACT_NONE, false, NULL};
            for (int64_t i = 0; i < c; i += 64)
                for (int64_t jj = 0; jj < o; jj += 64)
                    mp_gemm_epilogue_avx512(&e, parts + ((l * kh + j) * c + i) * o + jj, o, i, jj,
                                            min64(64, c - i), min64(64, o - jj));
        }
    *taken = true;
    return MP_OK;
}

#else

bool mp_conv_tiles_filter_ok(const mp_conv_geom *g, mp_dtype a, mp_dtype b)
{
    (void)g, (void)a, (void)b;
    return false;
}
mp_status mp_conv_tiles_filter(const mp_conv_geom *g, const void *x, const void *dy, float *dw,
                               bool accumulate, bool *taken)
{
    (void)g, (void)x, (void)dy, (void)dw, (void)accumulate;
    *taken = false;
    return MP_OK;
}

#endif
