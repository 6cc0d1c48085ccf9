/* gemm_blocks.c - the GEMM driver's cache blocking rules: the depth block
 * and B column block for a kernel on this CPU's caches, the row block of A,
 * and whether a thread packs its whole B range once. The driver (gemm.c)
 * runs the loops; these say how far each goes. */
#include "kernels/gemm_internal.h"

/* Whether im takes its L1 blocks on this CPU (gemm_impl's kc_l1): L1d
 * holds an mr x kc_l1 A micro-panel in two thirds of its size, and L2's
 * size is known. */
static bool l1_blocks(const gemm_impl *im)
{
    const int64_t esz = mp_gemm_fmt_bytes(im->fmt);
    const int64_t l1 = (int64_t)mp_cpu_cache_bytes(1), l2 = (int64_t)mp_cpu_cache_bytes(2);
    return im->kc_l1 > 0 && 3 * im->mr * im->kc_l1 * esz <= 2 * l1 && l2 > 0;
}

/* The rows of a block for `rows` rows whose partial sums span nr_pad
 * columns, kcb deep. The packed A block is reused across the whole n range,
 * so every element is packed once; a partial-sum buffer spanning that range
 * caps the block, and so does the A block's own size where A is packed
 * (a_packed): 16 MiB, or twice L2 with the L1 blocks (l1_blocks), where
 * each A micro-panel meets only the few B panels of an L2-sized B block
 * and the whole A block is read again for every B block, so it has to stay
 * in the caches. fc2 dW (4096x4096x1024, A^T packed, 2 threads, Zen 5 with
 * 1 MiB L2, medians of 21-31 calls alternating in one process) with the L1
 * blocks: float32 302-318 GFLOP/s under 16 MiB, 349-370 under 4, 364-386
 * under 2; bf16 under 2 MiB against 16: 737 against 713 and 796 against
 * 762. An Intel Xeon with 2 MiB L2 (family 6 model 207, float32, A packed
 * by the streaming kernel, gemm_avx512.c; 21 calls each) under 4 MiB
 * against 2: fc1 fwd 231 against 204, fc1 dW 238 / 228, fc2 fwd 225 /
 * 219, fc2 dX 238 / 229, fc2 dW 235 / 231, 2048^3 228 / 221, fc1 dX 212 /
 * 213 (fewer blocks of rows: B packed once per depth block, not twice).
 * Every further block of rows packs all of B again, so the rows are cut
 * into as few blocks as the caps allow, of equal size: 1024 rows under a
 * cap of 510 were 510 + 510 + 4, and the 4-row block packed the whole of B
 * for 4 rows of products.
 * With the whole depth in one block there are no partial sums to hold: rows
 * in blocks of 4 mc. fc2 dW (4096x4096x1024, 2 threads, Zen 4, medians of 40
 * calls alternating in one process): float32 188 -> 197 GFLOP/s, bf16 374 ->
 * 382. Several depth blocks keep mc: there the partial sums' buffer grows
 * with it (mc 4096 for every depth took the seed step's workspace at batch
 * 8192 from 223 to 274 MiB in mixed_bfloat16, from 428 to 549 in float32,
 * each from a fresh process). */
int64_t mp_gemm_row_block(const gemm_impl *im, int64_t rows, int64_t nr_pad, int64_t kcb,
                          bool multi, bool direct, bool a_packed)
{
    const int MR = im->mr;
    const int64_t esz = mp_gemm_fmt_bytes(im->fmt);
    const int64_t a_bytes = l1_blocks(im) ? 2 * (int64_t)mp_cpu_cache_bytes(2) : (int64_t)16 << 20;
    const int64_t a_cap = a_bytes / (kcb * esz) / MR * MR;
    int64_t mc = multi ? im->mc : 4 * im->mc;
    if (a_packed) mc = min64(mc, a_cap > MR ? a_cap : MR);
    if (multi && !direct) {
        int64_t cap = ((int64_t)1 << 22) / nr_pad / MR * MR; /* 16 MiB of floats */
        if (cap < MR) cap = MR;
        mc = min64(mc, cap);
    }
    return cdiv(cdiv(rows, cdiv(rows, mc)), MR) * MR;
}

/* Depth blocks of equal size rather than kc, kc, ..., remainder; kc_l1
 * and the B block's cap where the CPU's caches allow them (gemm_impl says
 * how).
 * A product whose B is a single panel (n <= nr) with A read in place uses
 * each element of A once: depth blocks would only cut A's rows into short
 * runs (kc elements, too short for the hardware prefetcher to follow) and
 * chain partial sums through a buffer. Its depth is one block where the
 * packed B panel, read again for every A panel, fits in half of L2. fc3's
 * forward (1024x10x4096 float32, x read in place; AMD EPYC family 25
 * model 1, Zen 3, AVX2, 2 threads, medians of 21 and 15 calls alternating
 * in one process): 55.0 -> 75.7 and 53.5 -> 69.8 GFLOP/s.
 * A short depth block makes a narrow B block: kc 10 by 128 columns is 5
 * KiB, and each A panel's C tiles are written 512 bytes a row, 16 KiB
 * apart, before the next block comes round. The B block is widened to a
 * quarter of L2 where that is more than nc (a full depth block's quarter
 * of L2 is less: 64 columns at the AVX2 kernel's 512): fc3's input gradient (1024x4096x10, C
 * written whole rows at a time; the same CPU) 48.1 -> 62.0 and 50.1 -> 60.4 GFLOP/s. The sums run
 * over k in the same order whatever the blocks, so the bits do not change. Where the kernel reads B
 * in place (a C of at most two panels of rows) the depth block is the impl's kc_b where it has one.
 */
void mp_gemm_blocks(const gemm_impl *im, int64_t k, int64_t n, bool a_in_place, bool b_in_place,
                    int64_t *kcb, int64_t *nc)
{
    const int64_t esz = mp_gemm_fmt_bytes(im->fmt);
    const int64_t l2 = (int64_t)mp_cpu_cache_bytes(2);
    const bool l1_fit = l1_blocks(im);
    int64_t kc = l1_fit ? im->kc_l1 : im->kc;
    if (b_in_place && im->kc_b > 0) kc = min64(kc, im->kc_b);
    const int64_t nkb = k > 0 ? cdiv(k, kc) : 1;
    *kcb = k > 0 ? cdiv(k, nkb) : 0;
    /* whole pairs (bf16) or tiles of depth (AMX): only the last block is
     * padded */
    if (*kcb < k) *kcb = min64(mp_gemm_kpad(im->fmt, *kcb), k);
    if (n <= im->nr && a_in_place && mp_gemm_kpad(im->fmt, k) * im->nr * esz <= l2 / 2) *kcb = k;
    *nc = im->nc;
    if (*kcb <= 0) return;
    const int64_t kpad = mp_gemm_kpad(im->fmt, *kcb);
    if (l1_fit || (im->b_block_l2 && l2 > 0)) {
        const int64_t fit = l2 / 2 / (kpad * esz) / im->nr * im->nr;
        *nc = min64(*nc, fit > im->nr ? fit : im->nr);
    }
    *nc = max64(*nc, l2 / 4 / (kpad * esz) / im->nr * im->nr);
}

/* The weight gradients (x^T dz: A transposed and packed, its block capped,
 * a single depth block) run several row blocks over the same B, and B was
 * packed again for each: 8 times for fc2's (4096 rows in blocks of 512).
 * Packed once, its panels are read back in order (from L3 where it fits)
 * instead of gathered again from B's rows. fc2 dW float32 (4096x4096x1024,
 * 2 threads, Zen 5, medians of 21 calls alternating in one process): 433
 * -> 447, 427 -> 442 and 427 -> 442 GFLOP/s; fc1 dW (784x4096x1024, two
 * row blocks) 432 -> 438 and 417 -> 424; bf16 fc2 dW 879 -> 893, fc1 dW
 * unchanged. The buffer is the thread's whole B range instead of one B
 * block: the seed step's float32 workspace at batch 1024 went from 67 to
 * 82 MiB (bench-step). Several depth blocks would need all of B's depth at
 * once (the rows' loop is outside the depth loop); beyond 12 MiB (fc2's
 * float32 range on one of 2 threads: 2064 x 1024 floats, 8.1 MiB) B is
 * packed per block again. A gathered B (a convolution's patches) is packed
 * once the same way where the rule holds. */
bool mp_gemm_b_once(const gemm_impl *im, int64_t rows, int64_t mc, int64_t nr_pad, int64_t kpad,
                    bool multi)
{
    const int64_t esz = mp_gemm_fmt_bytes(im->fmt);
    return !multi && rows > mc && nr_pad * kpad * esz <= ((int64_t)12 << 20);
}
