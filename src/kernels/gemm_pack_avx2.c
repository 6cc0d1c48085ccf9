/* gemm_pack_avx2.c - the float32 format's packer on x86 (gemm_impl.pack of
 * the AVX2 and the AVX-512 FMA paths): A and B cut into panels of W float32
 * (A's 6- or 8-row panels, B's 16- or 48-column panels),
 * every float type widened as loaded: along the width with plain copies
 * (row by row for a block of few whole panels, 8 rows at a time across a
 * wide one), along the depth with 8 x 8 register transposes; each form
 * specialised on W and the type. Data movement and exact widening only:
 * the packed bytes are the same whatever the form. */
#include "kernels/gemm_avx2_lanes.h"

#if MP_X86

enum { HMR = MP_GEMM_AVX2_MR, HNR = MP_GEMM_AVX2_NR };

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

/* The packer on an operand along its width (unit width stride) cut into at
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

/* The packer on an operand along its width (unit width stride) in general
 * (a wide block, a partial last panel): 8 depths (source rows) at a time
 * across the panels, so that each panel's piece is written whole. A panel
 * whose whole 8-lane loads stay within the block's nw columns (all but the
 * last one or two) is copied with plain loads and stores, a narrow panel's
 * rows spilling as store_row says; the rest through load8, lanes past the
 * operand zero. Specialised on W and the type (mp_gemm_pack_avx2): with both known
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
            /* The same piece of the next G rows, asked for now: each row's
             * piece is a run of W values far from the next, too short for
             * the hardware prefetcher. AMD EPYC (Zen 5), 2 threads, against
             * the AVX-512 packer this one replaced (which asked so) as the
             * control, medians of 15-21 calls alternating in one process:
             * gpt_mini's weight gradient 1024x256x4096 time x1.100 -> x1.003
             * in float32 and x1.075 -> x0.995 in float16; the rest within
             * noise. Not timed on Zen 3. */
            if (dg + G < nd) {
                const int64_t gn2 = min64(nd - dg - G, G);
                for (int64_t d = 0; d < gn2; d++) {
                    const char *src = col + (G + d) * sd * es;
                    for (int64_t x = 0; x < nv * es; x += 64) _mm_prefetch(src + x, _MM_HINT_T0);
                }
            }
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

/* The packer on an operand along its depth (unit depth stride: A's rows, a
 * transposed B's columns): 8 rows x 8 depths at a time, transposed in
 * registers. Specialised on W and the type (mp_gemm_pack_avx2): a whole block (8
 * depths inside the block, the panel's rows all there) is 8 plain loads,
 * the transpose and 8 stores, where load8's masks and branches ran for
 * every row. AMD EPYC (Zen 3), 2 threads, the old and the new library in
 * alternating processes, medians of 41 calls, three pairs, GFLOP/s: fc3's
 * forward (1024x10x4096, A packed in panels of 6 along its rows) float16
 * 14.0-14.2 -> 58.9-61.4, float8 e4m3 36.4-37.3 -> 54.7-58.4; fc1's input
 * gradient (1024x784x4096, B transposed) float32 167.7-177.6 ->
 * 178.2-181.5; bfloat16 4096x256x1024 (B transposed) 131.7-168.1 ->
 * 164.4-173.0. The same packed bytes. */
MP_TARGET_AVX2 static inline __attribute__((always_inline)) void
pack_cols(const char *base, int64_t sw, mp_dtype t, int64_t w0, int64_t nw, int64_t d0, int64_t nd,
          int W, float *out)
{
    const int64_t es = mp_widen_size(t);
    for (int64_t w = 0; w < nw; w += W, out += nd * W) {
        const int64_t nv = nw - w < W ? nw - w : W;
        for (int g = 0; g < W; g += 8) {
            const int width = W - g < 8 ? W - g : 8;
            int64_t cnt = nv - g;
            if (cnt > width) cnt = width;
            const char *rows = base + ((w0 + w + g) * sw + d0) * es;
            for (int64_t d = 0; d < nd; d += 8) {
                const int dn = nd - d >= 8 ? 8 : (int)(nd - d);
                __m256 r[8];
                for (int q = 0; q < cnt; q++)
                    _mm_prefetch(rows + (q * sw + d + 64) * es, _MM_HINT_T0);
                if (dn == 8 && cnt == width) {
#pragma GCC unroll 8
                    for (int q = 0; q < 8; q++)
                        r[q] = q < width ? mp_widen8(rows + (q * sw + d) * es, t)
                                         : _mm256_setzero_ps();
                } else {
                    for (int q = 0; q < 8; q++)
                        r[q] = q < cnt ? load8(rows + (q * sw + d) * es, t, dn, d, nd - d)
                                       : _mm256_setzero_ps();
                }
                mp_gemm_tr8(r);
                for (int q = 0; q < dn; q++)
                    store_row(out + (d + q) * W + g, r[q], width, d + q == nd - 1);
            }
        }
    }
}

/* fn(base, stride, T, w0, nw, d0, nd, W, out) with the type t and W (the
 * AVX2 tiles' HMR or HNR, the AVX-512 ones' 8 or 48, else as it comes)
 * folded into each copy, then return. AVX-512's W folded against taken as
 * it comes, AMD EPYC (Zen 5), 2 threads, medians of 15-21 calls
 * alternating in one process, time: gpt_mini's weight gradient
 * 1024x256x4096 x0.94 in float32 and x0.93 in float16, float16 fc3
 * forward x0.95, the rest within 1%. */
#define FOLD_W(fn, stride, T)                                                                      \
    do {                                                                                           \
        if (W == HMR)                                                                              \
            fn(base, stride, T, w0, nw, d0, nd, HMR, out);                                         \
        else if (W == HNR)                                                                         \
            fn(base, stride, T, w0, nw, d0, nd, HNR, out);                                         \
        else if (W == 8)                                                                           \
            fn(base, stride, T, w0, nw, d0, nd, 8, out);                                           \
        else if (W == 48)                                                                          \
            fn(base, stride, T, w0, nw, d0, nd, 48, out);                                          \
        else                                                                                       \
            fn(base, stride, T, w0, nw, d0, nd, W, out);                                           \
        return;                                                                                    \
    } while (0)
#define FOLD(fn, stride)                                                                           \
    switch (t) {                                                                                   \
    case MP_F32:                                                                                   \
        FOLD_W(fn, stride, MP_F32);                                                                \
    case MP_BF16:                                                                                  \
        FOLD_W(fn, stride, MP_BF16);                                                               \
    case MP_F16:                                                                                   \
        FOLD_W(fn, stride, MP_F16);                                                                \
    case MP_F8E4M3:                                                                                \
        FOLD_W(fn, stride, MP_F8E4M3);                                                             \
    default:                                                                                       \
        FOLD_W(fn, stride, MP_F8E5M2);                                                             \
    }

MP_TARGET_AVX2 void mp_gemm_pack_avx2(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0,
                                      int64_t nd, int W, void *dst)
{
    const mp_dtype t = op->type;
    if (!mp_gemm_widens(t) || (op->sw != 1 && op->sd != 1)) {
        mp_gemm_pack_generic(op, w0, nw, d0, nd, W, GEMM_FMT_F32, dst);
        return;
    }
    const char *base = op->base;
    float *out = dst;
    if (op->sw == 1 && nw % W == 0 && (W % 8 == 0 || W < 8) && nw <= 16 * W)
        FOLD(pack_rows, op->sd)
    else if (op->sw == 1)
        FOLD(pack_groups, op->sd)
    else
        FOLD(pack_cols, op->sw)
}
#undef FOLD
#undef FOLD_W

#endif
