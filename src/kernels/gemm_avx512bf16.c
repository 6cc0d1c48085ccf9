/* gemm_avx512bf16.c - AVX512_BF16 GEMM path for bf16 and fp8 inputs: an 8x48
 * vdpbf16ps microkernel over K interleaved in pairs (one 32-bit lane holds
 * the two bf16 values it multiplies), in 16- and 32-wide variants for thin
 * panels and one that reads a bf16 A in place along its rows (the pairs are
 * already 32-bit words there), and packers that decode fp8 to bf16 exactly
 * with SIMD. vdpbf16ps reads subnormal bf16 inputs as zero and
 * flushes subnormal sums: a documented difference from the f32 paths that
 * only shows below 2^-126. */
#include <string.h>

#include "kernels/gemm_avx512bf16_load.h"

#if MP_X86

enum { BMR = 8, BNR = 48 };

/* The microkernel on the first nv (1..3) column vectors of the tile. Row
 * i's pair kp (two bf16 along k, one 32-bit lane) is at a + i * si + kp *
 * kstep, in bf16 elements: packed, si = 2 and kstep = 2 * BMR; A in place
 * with unit depth stride, si = the row stride and kstep = 2. nv < 3 serves
 * a mostly padded panel (a thin C); each element's sum runs over k in the
 * same order whatever the variant, so the bits do not depend on it. */
MP_TARGET_AVX512BF16 static inline __attribute__((always_inline)) void
kernel_bf16_core(int64_t kc, const uint16_t *ap, int64_t si, int64_t kstep, const uint16_t *bp,
                 float *c, int64_t ldc, int acc, int nv)
{
    __m512 cv[3][BMR];
#pragma GCC unroll 8
    for (int i = 0; i < BMR; i++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++)
            cv[v][i] = acc ? _mm512_loadu_ps(c + i * ldc + 16 * v) : _mm512_setzero_ps();
    for (int64_t kp = 0; kp < kc / 2; kp++) {
        mp_gemm_prefetch_c(c, ldc, kp, kc / 2, BMR, nv);
        __m512bh bv[3];
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) bv[v] = (__m512bh)_mm512_load_si512(bp + 32 * v);
#pragma GCC unroll 8
        for (int i = 0; i < BMR; i++) {
            uint32_t pair;
            memcpy(&pair, ap + i * si, sizeof pair);
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)pair);
#pragma GCC unroll 3
            for (int v = 0; v < nv; v++) cv[v][i] = _mm512_dpbf16_ps(cv[v][i], av, bv[v]);
        }
        ap += kstep;
        bp += 2 * BNR;
    }
#pragma GCC unroll 8
    for (int i = 0; i < BMR; i++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(c + i * ldc + 16 * v, cv[v][i]);
}

MP_TARGET_AVX512BF16 static void kernel_bf16(int64_t kc, const void *a, const void *b, float *c,
                                             int64_t ldc, int acc)
{
    kernel_bf16_core(kc, a, 2, 2 * BMR, b, c, ldc, acc, 3);
}

MP_TARGET_AVX512BF16 static void kernel_bf16_n16(int64_t kc, const void *a, const void *b, float *c,
                                                 int64_t ldc, int acc)
{
    kernel_bf16_core(kc, a, 2, 2 * BMR, b, c, ldc, acc, 1);
}

MP_TARGET_AVX512BF16 static void kernel_bf16_n32(int64_t kc, const void *a, const void *b, float *c,
                                                 int64_t ldc, int acc)
{
    kernel_bf16_core(kc, a, 2, 2 * BMR, b, c, ldc, acc, 2);
}

/* A in place along its rows (sk = 1): row i's pairs are 32-bit words of
 * the row itself, as packing would lay them out. */
MP_TARGET_AVX512BF16 static void kernel_bf16_a(int64_t kc, const void *a, int64_t si, int64_t sk,
                                               const void *b, float *c, int64_t ldc, int acc,
                                               int nv)
{
    (void)sk; /* 1: the driver reads bf16 in place only along rows */
    MP_GEMM_BY_NV(nv, kernel_bf16_core, kc, a, si, 2, b, c, ldc, acc);
}

/* Pair p (depths d0 + 2p and 2p + 1) of panels [q0, q1) of a block laid
 * along its width (unit width stride), nw values wide: the two source rows
 * interleave into pairs, read left to right. */
MP_TARGET_AVX512BF16 static inline void pack_pair(const gemm_operand *op, int64_t w0, int64_t nw,
                                                  int64_t d0, int64_t nd, int W, int64_t kpd,
                                                  int64_t p, int64_t q0, int64_t q1,
                                                  const mp_gemm_fp8_lut *l, uint16_t *out)
{
    const mp_dtype t = op->type;
    const int64_t es = t == MP_BF16 ? 2 : 1, kp = (nd + 1) / 2; /* bf16 or fp8 */
    const char *base = op->base;
    /* lane 2j takes x0[j], lane 2j + 1 takes x1[j] (x1 is lanes 32-63) */
    const __m512i zip = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40,
                                         8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i zip_hi = _mm512_add_epi16(zip, _mm512_set1_epi16(16)); /* x0[16..32), x1's */
    const char *r0 = base + (w0 + (d0 + 2 * p) * op->sd) * es;
    const bool two = 2 * p + 1 < nd;
    /* The rows are short runs (nw values) far apart, too short for
     * the hardware prefetcher: ask for the pair PD ahead. */
    enum { PD = 4 };
    if (p + PD < kp) {
        const char *f = r0 + 2 * PD * op->sd * es + q0 * W * es;
        const int64_t span = (q1 * W < nw ? q1 * W : nw) - q0 * W;
        for (int64_t x = 0; x < span * es; x += 64) {
            _mm_prefetch(f + x, _MM_HINT_T0);
            _mm_prefetch(f + op->sd * es + x, _MM_HINT_T0);
        }
    }
    /* 8-wide panels (A's) of bf16 take two pairs at a time, a
     * whole line: one pair's 32 bytes is half of one, and the
     * panels are kp * 32 bytes apart, so its other half came after
     * a store to every other panel, at a stride that maps them to
     * a few sets of L1 (the line evicted in between). x^T dz of
     * gpt_mini's MLP (1024x256x4096, 2 threads, Zen 5, medians of
     * 31 calls alternating in one process): 4.63 -> 3.99 ms; fc2's
     * weight gradient 50.2 -> 48.2 ms. */
    const bool pairs2 = t == MP_BF16 && W == 8;
    const bool both = pairs2 && !(p & 1) && 2 * p + 3 < nd; /* p and p + 1 whole */
    const bool done = pairs2 && (p & 1) && 2 * p + 1 < nd;  /* by p - 1 */
    for (int64_t q = q0; q < q1; q++) {
        uint16_t *o = out + q * kpd * 2 * W + p * W * 2;
        if ((both || done) && nw - q * W >= W) {
            if (done) continue;
            const char *s = r0 + q * W * es;
            const int64_t sd = op->sd * es;
            const __m128i x0 = _mm_loadu_si128((const __m128i *)s),
                          x1 = _mm_loadu_si128((const __m128i *)(s + sd)),
                          x2 = _mm_loadu_si128((const __m128i *)(s + 2 * sd)),
                          x3 = _mm_loadu_si128((const __m128i *)(s + 3 * sd));
            const __m256i a = _mm256_set_m128i(_mm_unpackhi_epi16(x0, x1),
                                               _mm_unpacklo_epi16(x0, x1)),
                          b = _mm256_set_m128i(_mm_unpackhi_epi16(x2, x3),
                                               _mm_unpacklo_epi16(x2, x3));
            _mm512_storeu_si512(o, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
            continue;
        }
        if (t != MP_BF16 && nw - q * W >= W && two && !(W & 31)) {
            /* a full panel of fp8: 32 of each row decoded by table, then
             * paired as bf16's */
            const char *s0 = r0 + q * W;
            for (int g = 0; g < W; g += 32) {
                const __m512i x0 = mp_gemm_fp8_load32(s0 + g, 32, l),
                              x1 = mp_gemm_fp8_load32(s0 + op->sd + g, 32, l);
                _mm512_storeu_si512(o + g * 2, _mm512_permutex2var_epi16(x0, zip, x1));
                _mm512_storeu_si512(o + g * 2 + 32, _mm512_permutex2var_epi16(x0, zip_hi, x1));
            }
            continue;
        }
        if (t == MP_BF16 && nw - q * W >= W && two && !(W & 15)) {
            /* a full panel of bf16: 16 pairs per permute */
            const char *s0 = r0 + q * W * es;
            for (int g = 0; g < W; g += 16) {
                __m512i x0 =
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(s0 + g * es)));
                __m512i x1 = _mm512_castsi256_si512(
                    _mm256_loadu_si256((const __m256i *)(s0 + (op->sd + g) * es)));
                _mm512_storeu_si512(o + g * 2, _mm512_permutex2var_epi16(x0, zip, x1));
            }
            continue;
        }
        for (int g = 0; g < W; g += 8) {
            int64_t cnt = nw - q * W - g;
            __m256i v = _mm256_setzero_si256();
            if (cnt > 0) {
                int c8 = cnt >= 8 ? 8 : (int)cnt;
                const char *s0 = r0 + (q * W + g) * es;
                __m256i lo =
                    _mm256_cvtepu16_epi32(_mm256_castsi256_si128(mp_gemm_bf16_load16(s0, t, c8)));
                __m256i hi = _mm256_setzero_si256();
                if (two)
                    hi = _mm256_cvtepu16_epi32(
                        _mm256_castsi256_si128(mp_gemm_bf16_load16(s0 + op->sd * es, t, c8)));
                v = _mm256_or_si256(lo, _mm256_slli_epi32(hi, 16));
            }
            _mm256_storeu_si256((__m256i *)(o + g * 2), v);
        }
    }
}

/* The pairs [kp, kpd) of each of the panels of nw columns at out: zero. */
static void zero_pairs(uint16_t *out, int64_t nw, int W, int64_t kp, int64_t kpd)
{
    if (kpd == kp) return;
    for (int64_t w = 0; w < nw; w += W, out += kpd * 2 * W)
        memset(out + kp * 2 * W, 0, (size_t)((kpd - kp) * 2 * W) * sizeof *out);
}

MP_TARGET_AVX512BF16 void mp_gemm_pack_bf16_avx512(const gemm_operand *op, int64_t w0, int64_t nw,
                                                   int64_t d0, int64_t nd, int W, int64_t kpd,
                                                   void *dst)
{
    const mp_dtype t = op->type;
    const int64_t es = (int64_t)mp_dtype_size(t);
    const int64_t kp = (nd + 1) / 2;
    if ((t != MP_BF16 && t != MP_F8E4M3 && t != MP_F8E5M2) || (W & 7) ||
        (op->sw != 1 && op->sd != 1)) {
        /* panel by panel where the panels are deeper than the pairs */
        for (int64_t w = 0; w < nw; w += kpd == kp ? nw : W)
            mp_gemm_pack_generic(op, w0 + w, kpd == kp ? nw : min64(W, nw - w), d0, nd, W,
                                 GEMM_FMT_BF16, (uint16_t *)dst + w / W * kpd * 2 * W);
        zero_pairs(dst, nw, W, kp, kpd);
        return;
    }
    const char *base = op->base;
    uint16_t *out = dst;
    if (op->sw == 1) {
        /* Two depth rows of contiguous values interleave into pairs. */
        const int64_t np = (nw + W - 1) / W;
        /* QB panels at a time down the whole depth: a pair's stores go to
         * QB panels, not to all of a wide block's (A^T's 128 panels of 8
         * across 1024 columns, kp * 32 bytes apart: one set of L1 for all).
         * gpt_mini's MLP weight gradient x^T dz (1024x256x4096, 2 threads,
         * Zen 5, medians of 31 calls alternating in one process), every
         * panel / 4 / 8 / 12 / 16 / 24 / 32 at a time: 2.69 / 2.48 / 2.49 /
         * 2.47 / 2.40-2.44 / 2.43-2.46 / 2.52 ms; 1024x768x4096 6.94 ->
         * 6.80; the MLP's weight gradients (depth 1024) x0.99-1.01. */
        enum { QB = 16 };
        const mp_gemm_fp8_lut lut = mp_gemm_fp8_lut_for(t);
        for (int64_t q0 = 0; q0 < np; q0 += QB)
            for (int64_t p = 0; p < kp; p++)
                pack_pair(op, w0, nw, d0, nd, W, kpd, p, q0, q0 + QB < np ? q0 + QB : np, &lut,
                          out);
        zero_pairs(dst, nw, W, kp, kpd);
        return;
    }
    for (int64_t w = 0; w < nw; w += W, out += kpd * 2 * W) {
        const int64_t nv = nw - w < W ? nw - w : W;
        /* Depth pairs are adjacent in memory: a 32-bit 8x8 transpose. */
        for (int g = 0; g < W; g += 8) {
            int64_t cnt = nv - g;
            if (cnt > 8) cnt = 8;
            const char *rows = base + ((w0 + w + g) * op->sw + d0) * es;
            for (int64_t d = 0; d < nd; d += 16) {
                int dn = nd - d >= 16 ? 16 : (int)(nd - d);
                __m256 r[8];
                for (int q = 0; q < cnt; q++)
                    _mm_prefetch(rows + (q * op->sw + d + 128) * es, _MM_HINT_T0);
                for (int q = 0; q < 8; q++)
                    r[q] = q < cnt ? _mm256_castsi256_ps(
                                         mp_gemm_bf16_load16(rows + (q * op->sw + d) * es, t, dn))
                                   : _mm256_setzero_ps();
                mp_gemm_tr8(r);
                for (int q = 0; q < (dn + 1) / 2; q++)
                    _mm256_storeu_ps((float *)(out + ((d / 2 + q) * W + g) * 2), r[q]);
            }
        }
    }
    zero_pairs(dst, nw, W, kp, kpd);
}

MP_TARGET_AVX512BF16 static void pack_bf16(const gemm_operand *op, int64_t w0, int64_t nw,
                                           int64_t d0, int64_t nd, int W, void *dst)
{
    mp_gemm_pack_bf16_avx512(op, w0, nw, d0, nd, W, (nd + 1) / 2, dst);
}

/* Blocks: a depth of 4096 (2048 pairs) takes the seed MLP's products in one
 * block, so C's partial sums never go to memory and back; a depth block of
 * bf16 takes half the time of float32's at the same depth, so those round
 * trips weigh twice as much here (float32 gained nothing from a deeper
 * block). The B micro-panel, 48 columns x 4096 deep, is 384 KiB: in L2, the
 * block of 240 columns streams from L3 (a block of 96 columns, all in L2,
 * was no faster). Measured on Zen 4 (2 threads, medians of 20-25 calls
 * alternating depths in one process, GFLOP/s for depth 1024 -> 4096): fc2
 * fwd 378 -> 396, fc2 dX 361 -> 385, 1024x4096x4096 with A packed 349 ->
 * 373, fc1 dW at batch 8192 (784x4096x8192) 366 -> 385; 2048^3 393 -> 405
 * at depth 2048. Zen 5 (48 KiB L1d, 1 MiB L2) prefers kc_l1 = 2048: the
 * 8 x 2048 A micro-panel (32 KiB) stays in L1 across the block's B panels
 * and the B block, kept within half of L2 (96-144 columns), in L2; 2
 * threads, bf16 inputs, f32 C, medians of 20-25 calls alternating with the
 * 4096 blocks in one process, three runs: fc2 fwd 1024x4096x4096 time
 * x0.965-0.976, fc2 dX x0.949-0.980, fc1 dX (1024x784x4096) x0.942-1.028,
 * 2048^3 x0.971-0.986, fc1 dW at batch 8192 x0.953-0.990, gpt_mini's MLP
 * weight gradient (1024x256x4096) x0.914-0.953; depths up to 1024 keep
 * their blocks. Each element's sum runs over k in the same order whatever
 * the depth block, so the bits do not change with it. Row blocks: mc, or 4
 * mc where the depth is one block (mp_gemm_row_block says why). */
const gemm_impl mp_gemm_avx512bf16_impl = {
    .fmt = GEMM_FMT_BF16,
    .mr = BMR,
    .nr = BNR,
    .kc = 4096,
    .mc = 1024,
    .nc = 240,
    .kc_l1 = 2048,
    .kernel = kernel_bf16,
    .narrow = {kernel_bf16_n16, kernel_bf16_n32},
    .kernel_a = kernel_bf16_a,
    /* A C of one or two rows: the row kernel, B read where it lies, rather
     * than B packed for 8-row tiles of padding. AMD EPYC (Zen 5, family 26
     * model 2), 2 threads, bf16 A and B, medians of 61 rounds alternating
     * in one process, us, tiles -> rows: 1x1024x256 19.8 -> 3.7, 2x1024x256
     * 19.9 -> 6.5, 1x256x1024 27.1 -> 3.6, 1x4096x1024 (8 MiB of B, from
     * L3) 192 -> 114, 2x4096x1024 187 -> 180, 3x4096x1024 186 -> 263: each
     * row passes over B once, so past two rows of a B out of L2 the tiles
     * win. */
    .kernel_row = mp_gemm_row_avx512bf16,
    .row_max = 2,
    .pack = pack_bf16,
    .epilogue = mp_gemm_epilogue_avx512,
    .epilogue_checks = true,
    .nonfinite = mp_gemm_nonfinite_avx512,
};

#endif
