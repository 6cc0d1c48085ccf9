/* gemm_avx2.c - AVX2 + FMA GEMM path for x86-64 CPUs without AVX-512 (AMD
 * Zen 2/3, Intel client cores): a 6x16 float32 FMA microkernel (12 ymm
 * accumulators: two FMA pipes of latency 4 need at least 8 independent
 * chains, and 12 + 2 B vectors + 1 broadcast fill the 16 registers) and
 * its variants reading A or B in place; the packers are gemm_pack_avx2.c,
 * the epilogue gemm_epilogue_avx2.c. The kernel reads a float32 A, and B for a C of at
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
enum { HMR = MP_GEMM_AVX2_MR, HNR = MP_GEMM_AVX2_NR, BPD = 16 };

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
 * wide, ran 2-5% slower with the depth cut to 128; on family 6 model 167
 * 48 rows were fastest, by up to 2x: gemm_avx512.c.) */
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
    .pack = mp_gemm_pack_avx2,
    .epilogue = mp_gemm_epilogue_avx2,
    .streams = packs_a,
    .streams_report = packs_a_report,
    .narrow_panels = NARROW_PANELS,
};

#endif
