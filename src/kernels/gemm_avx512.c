/* gemm_avx512.c - AVX-512 float32 GEMM path: an 8x48 FMA microkernel (24 zmm
 * accumulators, enough independent chains to cover FMA latency on two
 * pipes), in variants for thin panels and operands read in place, and the
 * impl that joins it to the packer it shares with the AVX2 path
 * (gemm_pack_avx2.c), the 512-bit row kernel (gemm_row_avx512.c) and the
 * vector epilogue. Compiled with target attributes and only reached after
 * runtime CPU detection. */
#include <stdio.h>

#include "kernels/gemm_avx512_common.h"
#include "kernels/gemm_ways.h"

#if MP_X86

/* BPD: at most how many depth rows ahead a B read in place is asked for. fc3's
 * weight gradient (4096x10x1024 f32, x from memory, 2 threads, Zen 5):
 * 0.95-1.31 ms asking for nothing ahead, 0.88-1.05 at 16 rows, 0.87-0.99
 * at 48, 0.88-1.20 at 96. SPD: the same for a packed B and A where this
 * CPU streams (below). */
enum { FMR = 8, FNR = 48, BPD = 16, SPD = 16 };

/* Streaming: a packed B panel (48 floats a depth row, 192 bytes) passes
 * through L1 from L2 at 16 bytes a cycle at the FMA rate. On an Intel Xeon
 * (family 6 model 207, 48 KiB L1d, 2 MiB L2) the kernel, given nothing
 * but its loads, fed the FMAs at 0.65-0.75 of the peak loop; asking for
 * B's row SPD ahead (and A's, packed) lifted it, and A read in place (8
 * rows far apart, one line each per 16 depths) then cost what that gained:
 * 2 threads, medians of 21 calls alternating in one process, GFLOP/s, fc2
 * forward 208 -> 228, dX 210 -> 221, fc1 forward 209 -> 219, dX 188 ->
 * 205, 2048^3 195 -> 221 with A packed and both asked ahead, fc2 dW (A
 * packed either way) 217 -> 240; the seed MLP's step x0.965 in float32
 * and x0.919 in mixed_bfloat16 (15 steps each, alternating). Whether it pays is
 * timed once per process (mp_gemm_avx512_impl.streams): other CPUs' L1
 * prefetchers keep up by themselves, and there A read in place saves its
 * packing. The arithmetic is the same either way, so are the bits. */
static gemm_ways ways = GEMM_WAYS_INIT("avx512"); /* streaming: way 1 */

/* The microkernel on the first nv (1..3) column vectors of the tile, A's
 * element (i, k) at ap[i * si + k * sk] (packed: si = 1, sk = FMR), B's row
 * k at bp + k * sb (packed: sb = FNR; in place: B's row stride). nv < 3
 * serves a panel whose last columns are padding (n = 256 leaves a 16-wide
 * panel), so no FMA is spent on zeros. Each element's sum runs over k in
 * the same order whatever the variant, so the bits do not depend on it. */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) void
kernel_f32_core(int64_t kc, const float *ap, int64_t si, int64_t sk, const float *bp, int64_t sb,
                float *c, int64_t ldc, int acc, int pfd, int nv)
{
    /* fewer rows ahead where B's stride crowds L1's sets (mp_gemm_rows_ahead:
     * the same rule as the AVX2 kernels; not timed on an AVX-512 CPU, and
     * the same 16 rows on fc3's weight gradient, whose rows are 40 bytes
     * apart) */
    const int64_t bpd = sb != FNR ? mp_gemm_rows_ahead(sb * 4, BPD) * sb : 0;
    __m512 cv[3][FMR];
#pragma GCC unroll 8
    for (int i = 0; i < FMR; i++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++)
            cv[v][i] = acc ? _mm512_loadu_ps(c + i * ldc + 16 * v) : _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        mp_gemm_prefetch_c(c, ldc, k, kc, FMR, nv);
        /* B read in place: rows far apart, a stride the prefetcher may not
         * follow; ask for the row bpd ahead */
        if (sb != FNR)
#pragma GCC unroll 3
            for (int v = 0; v < nv; v++)
                _mm_prefetch((const char *)(bp + bpd + 16 * v), _MM_HINT_T0);
        else if (pfd)
#pragma GCC unroll 3
            for (int v = 0; v < nv; v++)
                _mm_prefetch((const char *)(bp + pfd * FNR + 16 * v), _MM_HINT_T0);
        /* A's panel column (8 floats: packed, or a column read in place) */
        if (pfd && si == 1) _mm_prefetch((const char *)(ap + pfd * sk), _MM_HINT_T0);
        __m512 bv[3];
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) bv[v] = _mm512_loadu_ps(bp + 16 * v);
#pragma GCC unroll 8
        for (int i = 0; i < FMR; i++) {
            __m512 av = _mm512_set1_ps(ap[i * si]);
#pragma GCC unroll 3
            for (int v = 0; v < nv; v++) cv[v][i] = _mm512_fmadd_ps(av, bv[v], cv[v][i]);
        }
        ap += sk;
        bp += sb;
    }
#pragma GCC unroll 8
    for (int i = 0; i < FMR; i++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(c + i * ldc + 16 * v, cv[v][i]);
}

static inline bool streaming(void) { return mp_gemm_ways_get(&ways); }

/* The packed kernel on the first nv column vectors, streaming or not. */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) void
kernel_f32_nv(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int acc, int nv)
{
    if (streaming())
        kernel_f32_core(kc, a, 1, FMR, b, FNR, c, ldc, acc, SPD, nv);
    else
        kernel_f32_core(kc, a, 1, FMR, b, FNR, c, ldc, acc, 0, nv);
}

MP_TARGET_AVX512 static void kernel_f32(int64_t kc, const void *a, const void *b, float *c,
                                        int64_t ldc, int acc)
{
    kernel_f32_nv(kc, a, b, c, ldc, acc, 3);
}

MP_TARGET_AVX512 static void kernel_f32_n16(int64_t kc, const void *a, const void *b, float *c,
                                            int64_t ldc, int acc)
{
    kernel_f32_nv(kc, a, b, c, ldc, acc, 1);
}

MP_TARGET_AVX512 static void kernel_f32_n32(int64_t kc, const void *a, const void *b, float *c,
                                            int64_t ldc, int acc)
{
    kernel_f32_nv(kc, a, b, c, ldc, acc, 2);
}

/* A and B where they lie (A packed: si = 1, sk = FMR; B packed: sb = FNR). */
MP_TARGET_AVX512 static inline __attribute__((always_inline)) void
kernel_f32_ab(int64_t kc, const void *av, int64_t si, int64_t sk, const void *b, int64_t sb,
              float *c, int64_t ldc, int acc, int nv)
{
    const float *a = av;
    if (sk == 1)
        MP_GEMM_BY_NV(nv, kernel_f32_core, kc, a, si, 1, b, sb, c, ldc, acc, 0);
    else if (streaming())
        MP_GEMM_BY_NV(nv, kernel_f32_core, kc, a, 1, sk, b, sb, c, ldc, acc, SPD);
    else
        MP_GEMM_BY_NV(nv, kernel_f32_core, kc, a, 1, sk, b, sb, c, ldc, acc, 0);
}

/* A in place: its rows (sk = 1: one stream per row) or its columns (si = 1:
 * a panel column is 8 consecutive floats) stand in for the packed panel. */
MP_TARGET_AVX512 static void kernel_f32_a(int64_t kc, const void *a, int64_t si, int64_t sk,
                                          const void *b, float *c, int64_t ldc, int acc, int nv)
{
    kernel_f32_ab(kc, a, si, sk, b, FNR, c, ldc, acc, nv);
}

/* ------------------------------------------------------ whether to stream */

/* Timed once per process (gemm_ways.h): streaming is kept unless the way
 * as loaded is STREAM_MARGIN faster: on the Xeon above it was ahead in each
 * of 8 processes, by 4-8% in some and 13-50% in others (the machine's load
 * moving the way as loaded from 89 to 171 GFLOP/s), so a timing in a quiet
 * moment must not turn it off. */
#define STREAM_MARGIN 1.03

static bool streams(void) { return mp_gemm_ways_on(&ways, &mp_gemm_avx512_impl, STREAM_MARGIN); }

static void streams_report(FILE *out)
{
    char way1[64];
    snprintf(way1, sizeof way1, "streaming (rows asked %d ahead, A packed)", SPD);
    mp_gemm_ways_report(out, &ways, &mp_gemm_avx512_impl, STREAM_MARGIN, "avx512",
                        "as loaded with A in place", way1);
}

void mp_gemm_avx512_stream_force(int on) { mp_gemm_ways_force(&ways, on); }

const gemm_impl mp_gemm_avx512_impl = {
    .fmt = GEMM_FMT_F32,
    .mr = FMR,
    .nr = FNR,
    /* Zen 4: kc 256 -> 1024 lifted 2048^3 from 187 to 205 GFLOP/s. Row
     * blocks: mc, or 4 mc where the depth is one block (mp_gemm_row_block
     * says why). Where L1d holds the 8 x 1024 A micro-panel (32 KiB) in
     * two thirds (kc_l1), the B block is kept within half of L2 (96
     * columns at depth 1024) instead of 480 columns (1.9 MiB) that stream
     * from L3: a 48-column B panel is read at 16 bytes a cycle at the FMA
     * rate, from L2 rather than L3. Zen 5 (48 KiB L1d, 1 MiB L2), 2 threads, medians of 31 calls
     * alternating in one process, two runs, GFLOP/s: fc1 fwd 373 -> 385 and 373 -> 393, fc1 dX 348
     * -> 363 and 362 -> 379, fc2 fwd 373 -> 388 and 381 -> 399, fc2 dX 379 -> 397 and 388 -> 414,
     * 2048^3 387 -> 399 and 374 -> 388; the weight gradients, A packed (its block capped,
     * mp_gemm_row_block), fc1 dW 370 -> 364 and 376 -> 375, fc2 dW 379 -> 375 and 392 -> 386. The
     * seed MLP's float32 step: x0.954 and x0.971. */
    .kc = 1024,
    .mc = 1024,
    .nc = 480,
    .kc_l1 = 1024,
    /* B read in place (a C of at most two panels of rows: a small batch,
     * fc3's weight gradient as C^T), its rows far apart: depth blocks of
     * 48 rows, each swept across all of B's columns before the next, read
     * B's rows as runs the prefetchers follow, where 1024 rows a panel at a
     * time made each line a miss of its own page and a second panel of rows
     * found none of them cached (rows 16 KiB apart share a few sets of L1
     * and L2). Intel Xeon (family 6 model 167), 2 threads, medians of 40
     * calls, three runs, microseconds, kc_b none / 32 / 48 / 64: fc3 dW
     * (4096x10x1024, C^T = dz^T x) 1076-1110 / 726-807 / 722-744 / 802-838,
     * a batch of 8 through fc2 (8x4096x4096) 3373-3579 / 1954-2992 /
     * 1937-2712 / 3447-4442, of 16 6821-7007 / 3141-3368 / 3035-3529 /
     * 4722-6536, of 4 through fc1 (4x4096x784) 338-427 / 315-319 / 306-320 /
     * 362-390. */
    .kc_b = 48,
    .kernel = kernel_f32,
    .narrow = {kernel_f32_n16, kernel_f32_n32},
    .kernel_a = kernel_f32_a,
    .kernel_ab = kernel_f32_ab,
    /* A C of one or two rows: the row kernel (its sums are these tiles'
     * bits), rather than 8-row tiles of padding. The 512-bit one against
     * the AVX2 one, AMD EPYC (Zen 5, family 26 model 2), 2 threads, f32 A,
     * medians of 101 rounds alternating in one process, GFLOP/s: B float32
     * 1x1024x256 57 -> 68, 1x256x1024 85 -> 95, 1x4096x1024 46 -> 57,
     * 2x1024x256 69 -> 93; float16 1x1024x256 107 -> 112, 1x4096x1024 68
     * -> 105; bfloat16 1x1024x256 80 -> 114. */
    .kernel_row = mp_gemm_row_avx512,
    .row_max = MP_GEMM_ROW_MAX_AVX2,
    .kernel_cols = mp_gemm_col_avx512,
    /* The AVX2 path's packer: packing is moving and widening, which 256-bit
     * loads and stores do as fast (an AVX-512 packer of its own, its
     * forms not specialised on W and the type, against it, Zen 5, 2
     * threads, medians of 15-21 calls alternating in one process, time:
     * float32 fc2 forward x0.979, gpt_mini's input gradients x0.97-0.98,
     * the rest within 2%, fc3's weight gradient x1.05 (0.1 ms); float16
     * fc3 forward x0.90, fc3 weight gradient x0.71, fc2 forward x0.955). */
    .pack = mp_gemm_pack_avx2,
    .epilogue = mp_gemm_epilogue_avx512,
    .epilogue_checks = true,
    .nonfinite = mp_gemm_nonfinite_avx512,
    .streams = streams,
    .streams_report = streams_report,
};

#endif
