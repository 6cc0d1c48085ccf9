/* gemm_avx2.c - AVX2 + FMA GEMM path for x86-64 CPUs without AVX-512 (AMD
 * Zen 2/3, Intel client cores): a 6x16 float32 FMA microkernel (12 ymm
 * accumulators: two FMA pipes of latency 4 need at least 8 independent
 * chains, and 12 + 2 B vectors + 1 broadcast fill the 16 registers), packers
 * that widen f32/f16/bf16 to f32 with 8-lane loads and 8x8 transposes, and
 * the vector epilogue. The kernel reads a float32 A, and B for a C of at
 * most 12 rows, where they lie; whether A is packed all the same is timed
 * once per process (gemm_ways.h). Each element's sum runs over k in order
 * with one FMA per product, as on the AVX-512 path. Compiled with target
 * attributes and only reached after runtime CPU detection. */
#include <string.h>

#include "core/convert_simd.h"
#include "kernels/gemm_simd.h"
#include "kernels/gemm_ways.h"

#if MP_X86

/* BPD: at most how many depth rows ahead a B read in place (its rows far
 * apart, a stride the prefetcher may not follow) is asked for, as on the
 * AVX-512 kernel; fewer where its stride crowds L1's sets
 * (mp_gemm_rows_ahead). */
enum { HMR = 6, HNR = 16, BPD = 16 };

/* Half h of B's row at p as 8 floats: float32, or bfloat16 widened (a
 * shift: exact). */
MP_TARGET_AVX2 static inline __attribute__((always_inline)) __m256 b_half(const char *p, bool bf16,
                                                                          int h)
{
    if (!bf16) return _mm256_loadu_ps((const float *)p + 8 * h);
    const __m128i x = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + 8 * h));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
}

/* The microkernel, A's element (i, k) at ap[i * si + k * sk] (packed: si = 1,
 * sk = HMR), B's row k at bp + k * sb elements (packed: sb = HNR; in place:
 * B's row stride), float32 or (bf16: in place only) bfloat16 widened as it
 * is loaded, the same FMAs in the same order either way. */
MP_TARGET_AVX2 static inline __attribute__((always_inline)) void
kernel_core(int64_t kc, const float *ap, int64_t si, int64_t sk, const void *b, int64_t sb,
            bool bf16, float *c, int64_t ldc, int acc)
{
    const int64_t es = bf16 ? 2 : 4;
    const char *bp = b;
    const int64_t bpd = bf16 || sb != HNR ? mp_gemm_rows_ahead(sb * es, BPD) * sb * es : 0;
    __m256 lo[HMR], hi[HMR];
#pragma GCC unroll 6
    for (int i = 0; i < HMR; i++) {
        lo[i] = acc ? _mm256_loadu_ps(c + i * ldc) : _mm256_setzero_ps();
        hi[i] = acc ? _mm256_loadu_ps(c + i * ldc + 8) : _mm256_setzero_ps();
    }
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k++) {
        if (bf16 || sb != HNR) {
            _mm_prefetch(bp + bpd, _MM_HINT_T0);
            _mm_prefetch(bp + bpd + (HNR - 1) * es, _MM_HINT_T0);
        }
        const __m256 b0 = b_half(bp, bf16, 0), b1 = b_half(bp, bf16, 1);
#pragma GCC unroll 6
        for (int i = 0; i < HMR; i++) {
            const __m256 av = _mm256_broadcast_ss(ap + i * si);
            lo[i] = _mm256_fmadd_ps(av, b0, lo[i]);
            hi[i] = _mm256_fmadd_ps(av, b1, hi[i]);
        }
        ap += sk;
        bp += sb * es;
    }
#pragma GCC unroll 6
    for (int i = 0; i < HMR; i++) {
        _mm256_storeu_ps(c + i * ldc, lo[i]);
        _mm256_storeu_ps(c + i * ldc + 8, hi[i]);
    }
}

MP_TARGET_AVX2 static void kernel_f32(int64_t kc, const void *a, const void *b, float *c,
                                      int64_t ldc, int acc)
{
    kernel_core(kc, a, 1, HMR, b, HNR, false, c, ldc, acc);
}

/* A and B where they lie: A's rows (sk = 1: one stream per row) or a panel
 * column as HMR consecutive floats of a row (si = 1; packed: sk = HMR), B's
 * rows sb floats apart (packed: HNR). nv is always 1 (HNR = 16). */
MP_TARGET_AVX2 static void kernel_f32_ab(int64_t kc, const void *av, int64_t si, int64_t sk,
                                         const void *b, int64_t sb, float *c, int64_t ldc, int acc,
                                         int nv)
{
    const float *a = av;
    (void)nv;
    if (sk == 1)
        kernel_core(kc, a, si, 1, b, sb, false, c, ldc, acc);
    else
        kernel_core(kc, a, 1, sk, b, sb, false, c, ldc, acc);
}

/* A in place, B packed. */
MP_TARGET_AVX2 static void kernel_f32_a(int64_t kc, const void *av, int64_t si, int64_t sk,
                                        const void *b, float *c, int64_t ldc, int acc, int nv)
{
    const float *a = av;
    (void)nv;
    if (sk == 1)
        kernel_core(kc, a, si, 1, b, HNR, false, c, ldc, acc);
    else
        kernel_core(kc, a, 1, sk, b, HNR, false, c, ldc, acc);
}

/* Row i's 32-bit word at byte offset `off` from element k, broadcast. */
#define WORD(a, i, si, off)                                                                        \
    __extension__({                                                                                \
        int32_t w_;                                                                                \
        memcpy(&w_, (a) + (i) * (si)*2 + (off), 4);                                                \
        _mm256_set1_epi32(w_);                                                                     \
    })

/* One pair along k of kernel_bf16a: a at element k of row 0, bp at B's
 * row k. */
MP_TARGET_AVX2 static inline __attribute__((always_inline)) void
bf16a_pair(const char *a, int64_t si, const float *bp, __m256 *lo, __m256 *hi, bool last)
{
    __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
#pragma GCC unroll 6
    for (int i = 0; i < HMR; i++) {
        const __m256 av0 = _mm256_castsi256_ps(_mm256_slli_epi32(WORD(a, i, si, 0), 16));
        lo[i] = _mm256_fmadd_ps(av0, b0, lo[i]);
        hi[i] = _mm256_fmadd_ps(av0, b1, hi[i]);
    }
    b0 = _mm256_loadu_ps(bp + HNR);
    b1 = _mm256_loadu_ps(bp + HNR + 8);
#pragma GCC unroll 6
    for (int i = 0; i < HMR; i++) {
        const __m256i w = last ? _mm256_srli_epi32(WORD(a, i, si, 0), 16) : WORD(a, i, si, 2);
        const __m256 av1 = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
        lo[i] = _mm256_fmadd_ps(av1, b0, lo[i]);
        hi[i] = _mm256_fmadd_ps(av1, b1, hi[i]);
    }
}

/* The depth row of kernel_bf16a past its pairs, from 16-bit loads. */
MP_TARGET_AVX2 static inline __attribute__((always_inline)) void
bf16a_one(const char *a, int64_t si, const float *bp, __m256 *lo, __m256 *hi)
{
    const __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
#pragma GCC unroll 6
    for (int i = 0; i < HMR; i++) {
        uint16_t x;
        memcpy(&x, a + i * si * 2, 2);
        const __m256 av = _mm256_castsi256_ps(_mm256_set1_epi32((int32_t)((uint32_t)x << 16)));
        lo[i] = _mm256_fmadd_ps(av, b0, lo[i]);
        hi[i] = _mm256_fmadd_ps(av, b1, hi[i]);
    }
}

/* A in bfloat16 where it lies (sk = 1; B packed): row i's element k is
 * the 32-bit word at k shifted up 16 bits, k + 1 the word at k + 1 shifted
 * so (exact: the widening the packer does); the block's last element, whose
 * word would reach past it (and maybe past A), the word before it with its
 * low half cleared, or a 16-bit load where the depth is odd (a float32
 * kernel's depth blocks need not be even). Two loads per pair: the compiler
 * keeps a word loaded once in a register for its second use, six of them,
 * and spills accumulators. The same FMAs in the same order as on the
 * widened copy. For a B of one or two panels (gemm.c's a_in_place), where
 * packing A would widen each element for one or two kernel calls. AMD
 * EPYC (Zen 3, family 25 model 1), bf16 A and B, 2 threads, medians of 21-31
 * calls, two runs, GFLOP/s against A widened while packed: fc3 forward
 * (1024x10x4096) 44.1 / 44.8 -> 95.7 / 89.0 (float32: 106-111), 1024x32x4096
 * 98.7 / 101.3 -> 147.6 / 148.2, 1024x24x4096 75.5 / 73.6 -> 84.4 / 112.8;
 * at three panels (1024x48x4096) it gained nothing (122-123 either way). */
MP_TARGET_AVX2 static void kernel_bf16a(int64_t kc, const void *av, int64_t si, int64_t sk,
                                        const void *b, float *c, int64_t ldc, int acc, int nv)
{
    const char *a = av;
    const float *bp = b;
    (void)sk;
    (void)nv;
    __m256 lo[HMR], hi[HMR];
#pragma GCC unroll 6
    for (int i = 0; i < HMR; i++) {
        lo[i] = acc ? _mm256_loadu_ps(c + i * ldc) : _mm256_setzero_ps();
        hi[i] = acc ? _mm256_loadu_ps(c + i * ldc + 8) : _mm256_setzero_ps();
    }
    const int64_t pairs = kc / 2;
    for (int64_t p = 0; p + 1 < pairs; p++, a += 4, bp += 2 * HNR)
        bf16a_pair(a, si, bp, lo, hi, false);
    if (pairs > 0) { /* the last pair: its second word would reach past the block when kc is even */
        bf16a_pair(a, si, bp, lo, hi, !(kc & 1));
        a += 4;
        bp += 2 * HNR;
    }
    if (kc & 1) bf16a_one(a, si, bp, lo, hi);
#pragma GCC unroll 6
    for (int i = 0; i < HMR; i++) {
        _mm256_storeu_ps(c + i * ldc, lo[i]);
        _mm256_storeu_ps(c + i * ldc + 8, hi[i]);
    }
}
#undef WORD

/* kernel_f32_ab with B in bfloat16 (gemm_impl.kernel_ab_bf16): a batch of
 * one through a bfloat16 layer reads the weights once, where they lie,
 * instead of widening all of them into a packed copy first. AMD EPYC (Zen
 * 3), bf16, medians of 201 calls, two runs, GFLOP/s: 1x1024x256 3.8 ->
 * 10.1, 1x256x1024 3.7 -> 14.0 (float32: 5.3, 7.3), 8x4096x4096 45 -> 59,
 * fc3 dW (4096x10x1024 as C^T, x read in place) 55 -> 70; gpt_mini
 * generation in mixed_bfloat16 with the key/value cache (bench_gpt --only
 * generate, three runs each): prompt 16 531 -> 1399 tokens/s, prompt 512
 * 313-336 -> 500-604 tokens/s, its prefill 1.24-1.25 -> 0.57-0.59 s. */
MP_TARGET_AVX2 static void kernel_bf16b_ab(int64_t kc, const void *av, int64_t si, int64_t sk,
                                           const void *b, int64_t sb, float *c, int64_t ldc,
                                           int acc, int nv)
{
    const float *a = av;
    (void)nv;
    if (sk == 1)
        kernel_core(kc, a, si, 1, b, sb, true, c, ldc, acc);
    else
        kernel_core(kc, a, 1, sk, b, sb, true, c, ldc, acc);
}

/* Lanes [0, n) set, for maskload / maskstore. */
MP_TARGET_AVX2 static inline __m256i lanes(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* cnt (1..8) consecutive elements from p widened to f32, lanes past cnt
 * zero. Memory outside [p - before, p + after) elements is not touched
 * (after >= cnt); within it a short read is one whole 8-element load, from
 * p itself or ending at p + cnt and shifted down, and only where neither
 * fits (an operand narrower than 8) a copy through a buffer. */
MP_TARGET_AVX2 static inline __m256 load8(const char *p, mp_dtype t, int cnt, int64_t before,
                                          int64_t after)
{
    if (cnt == 8) return mp_widen8(p, t);
    const int64_t es = mp_widen_size(t);
    const __m256 keep = _mm256_castsi256_ps(lanes(cnt));
    if (after >= 8) return _mm256_and_ps(mp_widen8(p, t), keep);
    if (before >= 8 - cnt) {
        const __m256i idx =
            _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 - cnt));
        const __m256 v = mp_widen8(p - (8 - cnt) * es, t);
        return _mm256_and_ps(_mm256_permutevar8x32_ps(v, idx), keep);
    }
    _Alignas(32) char tmp[32];
    memset(tmp, 0, sizeof tmp);
    memcpy(tmp, p, (size_t)(cnt * es));
    return mp_widen8(tmp, t);
}

/* The first n (1..8) lanes of v to o, without a masked store (vmaskmovps
 * to memory is slow on AMD cores: it took 40% of a bf16 packing run). */
MP_TARGET_AVX2 static inline void store_n(float *o, __m256 v, int n)
{
    if (n == 8) {
        _mm256_storeu_ps(o, v);
        return;
    }
    _Alignas(32) float lane[8];
    _mm256_store_ps(lane, v);
    memcpy(o, lane, (size_t)n * sizeof *o);
}

/* Row d of a packed panel (W floats): a narrow panel's rows are written
 * with whole 8-lane stores, in increasing address order, each spilling into
 * the next row, which is written after it; the panel's last row, whose
 * spill would reach the next panel (written already, or past the buffer),
 * takes the exact-width store. */
MP_TARGET_AVX2 static inline void store_row(float *o, __m256 v, int width, bool last)
{
    if (width < 8 && !last)
        _mm256_storeu_ps(o, v);
    else
        store_n(o, v, width);
}

/* pack_f32 on an operand along its width (unit width stride) cut into at
 * most 16 whole panels of W (a multiple of 8, or under 8: a B block):
 * source row by source row, each read once from start to end (the rows 8
 * ahead asked for), its W-element pieces stored into the panels in turn;
 * each panel's rows are written in increasing order, as store_row needs.
 * The loop below (8 rows at a time across the panels) made its loads wait
 * on 8 interleaved streams; a wide block of narrow panels (an A block of
 * 170 panels of 6) keeps it: row by row it wrote 170 streams, 20-30%
 * slower. */
MP_TARGET_AVX2 static inline __attribute__((always_inline)) void
pack_rows(const char *base, int64_t sd, mp_dtype t, int64_t w0, int64_t nw, int64_t d0, int64_t nd,
          int W, float *out)
{
    enum { AHEAD = 8 };
    const int64_t es = mp_widen_size(t), np = nw / W, bytes = nw * es;
    for (int64_t d = 0; d < nd; d++) {
        const char *row = base + (w0 + (d0 + d) * sd) * es;
        if (d + AHEAD < nd) {
            for (int64_t x = 0; x < bytes; x += 64)
                _mm_prefetch(row + AHEAD * sd * es + x, _MM_HINT_T0);
            _mm_prefetch(row + AHEAD * sd * es + bytes - 1, _MM_HINT_T0);
        }
        float *o = out + d * W;
        const bool last = d == nd - 1;
        for (int64_t p = 0; p < np; p++, o += nd * W) {
            const char *src = row + p * W * es;
            if (W % 8 == 0)
                for (int g = 0; g < W; g += 8) _mm256_storeu_ps(o + g, mp_widen8(src + g * es, t));
            else
                store_row(o, load8(src, t, W, p * W, nw - p * W), W, last);
        }
    }
}

/* pack_f32 on an operand along its width (unit width stride) in general
 * (a wide block, a partial last panel): 8 depths (source rows) at a time
 * across the panels, so that each panel's piece is written whole. A panel
 * whose whole 8-lane loads stay within the block's nw columns (all but the
 * last one or two) is copied with plain loads and stores, a narrow panel's
 * rows spilling as store_row says; the rest through load8, lanes past the
 * operand zero. Specialised on W and the type (pack_f32): with both known
 * the copy is a load and a store per row and 8 columns, where load8's
 * masks and branches ran for every piece before. AMD EPYC (Zen 3), 2
 * threads, the old and the new library in alternating processes, medians
 * of 41 calls, three pairs, GFLOP/s: gpt_mini's weight gradients (A^T
 * packed in panels of 6 across 256-1024 columns) float32 256x256x4096
 * 76.2-79.7 -> 97.1-98.0, 1024x256x4096 85.8-95.8 -> 89.3-120.4,
 * 256x1024x4096 120.4-142.3 -> 131.2-148.1, bfloat16 1024x256x4096
 * 88.6-113.0 -> 117.9-159.9, 256x768x4096 112.0-124.9 -> 132.2-151.5; the
 * MLP's (784x4096x1024, 4096x4096x1024) within noise. The same packed
 * bytes. */
MP_TARGET_AVX2 static inline __attribute__((always_inline)) void
pack_groups(const char *base, int64_t sd, mp_dtype t, int64_t w0, int64_t nw, int64_t d0,
            int64_t nd, int W, float *out)
{
    enum { G = 8 };
    const int64_t es = mp_widen_size(t), W8 = (W + 7) / 8 * 8;
    /* the panels [0, nfast) read whole vectors within the block */
    const int64_t nfast = nw < W8 ? 0 : min64((nw - W8) / W + 1, nw / W);
    for (int64_t dg = 0; dg < nd; dg += G) {
        const int64_t gn = nd - dg < G ? nd - dg : G;
        for (int64_t p = 0; p * W < nw; p++) {
            const int64_t nv = nw - p * W < W ? nw - p * W : W;
            const char *col = base + (w0 + p * W + (d0 + dg) * sd) * es;
            float *o = out + p * nd * W + dg * W;
            for (int64_t d = 0; d < gn; d++) {
                const char *src = col + d * sd * es;
                const bool last = dg + d == nd - 1;
                for (int g = 0; g < W; g += 8) {
                    const int width = W - g < 8 ? W - g : 8;
                    if (p < nfast) {
                        store_row(o + d * W + g, mp_widen8(src + g * es, t), width, last);
                        continue;
                    }
                    const int64_t cnt = nv - g < width ? nv - g : width;
                    const int64_t at = p * W + g; /* within the packed width */
                    const __m256 v = cnt <= 0 ? _mm256_setzero_ps()
                                              : load8(src + g * es, t, (int)cnt, at, nw - at);
                    store_row(o + d * W + g, v, width, last);
                }
            }
        }
    }
}

MP_TARGET_AVX2 static void pack_f32(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0,
                                    int64_t nd, int W, void *dst)
{
    const mp_dtype t = op->type;
    if (!mp_gemm_widens(t) || (op->sw != 1 && op->sd != 1)) {
        mp_gemm_pack_generic(op, w0, nw, d0, nd, W, GEMM_FMT_F32, dst);
        return;
    }
    const int64_t es = mp_widen_size(t);
    const char *base = op->base;
    float *out = dst;
    if (op->sw == 1 && nw % W == 0 && (W % 8 == 0 || W < 8) && nw <= 16 * W) {
        /* the type folded into each copy of the loop */
#define PACK_ROWS_AS(T)                                                                            \
    case T:                                                                                        \
        pack_rows(base, op->sd, T, w0, nw, d0, nd, W, out);                                        \
        return;
        switch (t) {
            PACK_ROWS_AS(MP_F32)
            PACK_ROWS_AS(MP_BF16)
            PACK_ROWS_AS(MP_F16)
            PACK_ROWS_AS(MP_F8E4M3)
        default:
            pack_rows(base, op->sd, MP_F8E5M2, w0, nw, d0, nd, W, out);
        }
#undef PACK_ROWS_AS
        return;
    }
    if (op->sw == 1) {
        /* W and the type folded into each copy of the loop */
#define PACK_GROUPS_AS(T)                                                                          \
    case T:                                                                                        \
        if (W == HMR)                                                                              \
            pack_groups(base, op->sd, T, w0, nw, d0, nd, HMR, out);                                \
        else if (W == HNR)                                                                         \
            pack_groups(base, op->sd, T, w0, nw, d0, nd, HNR, out);                                \
        else                                                                                       \
            pack_groups(base, op->sd, T, w0, nw, d0, nd, W, out);                                  \
        return;
        switch (t) {
            PACK_GROUPS_AS(MP_F32)
            PACK_GROUPS_AS(MP_BF16)
            PACK_GROUPS_AS(MP_F16)
            PACK_GROUPS_AS(MP_F8E4M3)
        default:
            pack_groups(base, op->sd, MP_F8E5M2, w0, nw, d0, nd, W, out);
        }
#undef PACK_GROUPS_AS
        return;
    }
    for (int64_t w = 0; w < nw; w += W, out += nd * W) {
        const int64_t nv = nw - w < W ? nw - w : W;
        /* Depth is contiguous: transpose 8 rows x 8 depths at a time. */
        for (int g = 0; g < W; g += 8) {
            const int width = W - g < 8 ? W - g : 8;
            int64_t cnt = nv - g;
            if (cnt > width) cnt = width;
            const char *rows = base + ((w0 + w + g) * op->sw + d0) * es;
            for (int64_t d = 0; d < nd; d += 8) {
                const int dn = nd - d >= 8 ? 8 : (int)(nd - d);
                __m256 r[8];
                for (int q = 0; q < cnt; q++)
                    _mm_prefetch(rows + (q * op->sw + d + 64) * es, _MM_HINT_T0);
                for (int q = 0; q < 8; q++)
                    r[q] = q < cnt ? load8(rows + (q * op->sw + d) * es, t, dn, d, nd - d)
                                   : _mm256_setzero_ps();
                mp_gemm_tr8(r);
                for (int q = 0; q < dn; q++)
                    store_row(out + (d + q) * W + g, r[q], width, d + q == nd - 1);
            }
        }
    }
}

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

/* ----------------------------------------------- A packed or in place */

/* The driver reads a float32 A where it lies (gemm.c's a_in_place: 6 rows
 * far apart, each a run of kc floats a kernel call) or packs it; timed once
 * per process (gemm_ways.h), packed unless in place is PACK_MARGIN faster.
 * AMD EPYC (Zen 3, family 25 model 1): the timing's one thread 72-80
 * GFLOP/s in place, 84-88 packed (16 to 171 A panels, two runs each); in
 * the driver, 2 threads, medians of 15 calls alternating in one process,
 * two runs: fc1 fwd 137.8 / 136.7 -> 143.0 / 142.4, fc2 fwd 123.8 / 118.6
 * -> 125.8 / 124.2, fc2 dX 122.5 / 132.5 -> 138.4 / 138.8, 2048^3 120.5 /
 * 115.3 -> 129.7 / 126.7 GFLOP/s. The two ways are close in the timing
 * (the fastest of 9: 76-98 in place, 79-101 packed, three processes), so
 * one round under load once cached "in place" here; bench-gemm's float32
 * geometric mean went from 0.81 to 0.87 of peak with A packed again. */
#define PACK_MARGIN 1.03
/* The timing above runs a B block of 8 panels per A panel, as the big
 * products do; a product whose B is only a few panels wide uses each
 * packed A element in as few kernel calls. A float32 A along rows read in
 * place against packed (timed packed here), 4096 x n x 512, 2 threads,
 * medians of 15 calls alternating in one process, GFLOP/s: n 128 178.0 /
 * 150.7, 256 180.6 / 168.6, 384 168.1 / 160.4, 512 175.0 / 172.8, 768
 * 180.6 / 180.6, 1024 177.7 / 171.1 (another run: 170.7 / 174.9); gpt_mini's
 * 4096x256x1024 forward 176.7 / 159.5, its 4096x256x256 with B transposed
 * 173.1 / 158.6. So up to 24 panels A is read in place whatever the timing
 * says. A laid along columns (a weight gradient's x^T) keeps the timing's
 * choice: 256x256x4096 read in place 137.6 against 146.4 packed. */
#define NARROW_PANELS 24
static gemm_ways ways = GEMM_WAYS_INIT("avx2"); /* A packed: way 1 */

static bool packs_a(void) { return mp_gemm_ways_on(&ways, &mp_gemm_avx2_impl, PACK_MARGIN); }

static void packs_a_report(FILE *out)
{
    mp_gemm_ways_report(out, &ways, &mp_gemm_avx2_impl, PACK_MARGIN, "avx2", "A in place",
                        "A packed");
}

void mp_gemm_avx2_pack_force(int on) { mp_gemm_ways_force(&ways, on); }

/* Blocks for a core with 32 KiB L1d and 512 KiB L2 (Zen 3): an A panel
 * (6 x 512 floats, 12 KiB) stays in L1 while it meets every B panel of a
 * 512 x 128 block (256 KiB, half of L2). Against kc 256 (the depth in half
 * as many blocks: C's partial sums read and written half as often), on an
 * AMD EPYC (Zen 3, family 25 model 1), 2 threads, medians of 15 calls
 * alternating in one process, two runs each, GFLOP/s: float32 fc1 fwd
 * 144.5 / 161.8 -> 163.0 / 163.9, fc1 dX 158.3 / 159.0 -> 168.4 / 167.1,
 * fc2 fwd 156.8 / 160.1 -> 163.2 / 163.4, fc2 dW 161.5 / 157.2 -> 165.2 /
 * 162.5, fc2 dX 152.2 / 155.5 -> 163.0 / 161.0, 2048^3 137.4 / 138.0 ->
 * 148.9 / 144.1, fc1 dW 148.4 / 168.1 -> 159.4 / 161.6; bf16 inputs fc2
 * fwd 155.8 / 150.5 -> 158.7 / 157.8, fc2 dW 136.2 / 136.1 -> 142.4 /
 * 140.9, 2048^3 130.6 / 130.1 -> 139.4 / 136.7. nc 96 at kc 512, and kc
 * 768 at nc 64 or 96, measured no better. */
/* kc_b: a B panel read in place (B's rows far apart, 16 floats each) 256
 * deep, 16 KiB in its lines, stays in L1 for the second A panel of a C of
 * up to 12 rows; 512 deep it did not. Zen 3, float32, 2 threads, medians of
 * 15 calls alternating in one process, GFLOP/s: fc3 dW (C^T = dz^T x,
 * 10x4096x1024) 29.8 -> 41.8, a batch of 8 through fc2 (8x4096x4096) 21.5
 * -> 30.1, a batch of 4 through fc1 (4x4096x784) 34.8 -> 37.0; reading B
 * in place rather than packing it, fc3 dW 24.6 -> 32.1 at kc 512. (The
 * AVX-512 kernel on an Intel Xeon, family 6 model 207, its panel 48 floats
 * wide, ran 2-5% slower with the depth cut to 128: it has no kc_b.) */
const gemm_impl mp_gemm_avx2_impl = {
    .fmt = GEMM_FMT_F32,
    .mr = HMR,
    .nr = HNR,
    .kc = 512,
    .kc_b = 256,
    .mc = 1536,
    .nc = 128,
    .kernel = kernel_f32,
    .kernel_a = kernel_f32_a,
    .kernel_ab = kernel_f32_ab,
    .kernel_a_bf16 = kernel_bf16a,
    .kernel_ab_bf16 = kernel_bf16b_ab,
    .kernel_row = mp_gemm_row_avx2,
    .row_max = MP_GEMM_ROW_MAX_AVX2,
    .pack = pack_f32,
    .epilogue = mp_gemm_epilogue_avx2,
    .streams = packs_a,
    .streams_report = packs_a_report,
    .narrow_panels = NARROW_PANELS,
};

#endif
