/* gemm_amx.c - the AMX GEMM path for bf16 and fp8 inputs: 32x32 blocks of
 * C held in four tile registers while tdpbf16ps multiplies two 16x32 tiles
 * of A by two 32x16 tiles of B (bf16 pairs, as the vdpbf16ps path packs
 * them), 32 deep at a time, over a 64x128 tile of C; the packers (A row by
 * row along k, B by the vdpbf16ps path's packer, both padded to whole tiles
 * of depth with zeros) decode fp8 to bf16 exactly; a row kernel on the
 * tiles for a C of one or two rows. The tiles run at about fifteen times
 * the float32 FMA rate where the OS grants them (cpu.c asks). Like
 * vdpbf16ps they read subnormal bf16 inputs as zero and flush subnormal
 * sums; their sums of products are not the vdpbf16ps path's bits (the
 * hardware's order of the additions inside a tile is its own), but each
 * element's sum runs over the same tiles of depth in the same order
 * whatever the threads, blocks or rows, so the bits do not depend on them,
 * and they stay within the GEMM error bound. */
#include <string.h>

#include "kernels/gemm_avx512bf16_load.h"

#if MP_X86

#include <immintrin.h>

#define MP_TARGET_AMX                                                                              \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma,prfchw,"         \
                          "amx-tile,amx-bf16")))

/* A panel of 64 rows, a B panel of 128 columns (four sub-panels of 32, one
 * after the other), a tile's depth of 32, and the depth chunk whose A
 * stays in L1 (kernel_core). */
enum { AMR = 64, ANR = 128, SUB = 32, DEPTH = 32, CHUNK = 256 };

/* The tile configuration every kernel here runs with: palette 1, tiles
 * 0-7 of 16 rows of 64 bytes (C's four 16x16 float tiles, A's two 16x32
 * and B's two 16-pair x 16-column tiles). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static const tile_config config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

/* Loads the configuration unless this thread has it: a store of the
 * current one is about 13 cycles, a load about 180 (Intel Xeon, family 6
 * model 167). Checked on every call, not remembered, since other code in
 * the process (a library's AMX kernels) may release or change it. The
 * first load in a process follows the CPU's detection, which asks the OS
 * for the tile data (a kernel called directly, before any use of the
 * library that detects, would fault without it). */
MP_TARGET_AMX static inline void tiles_ready(void)
{
    _Alignas(64) tile_config now;
    _tile_storeconfig(&now);
    if (memcmp(&now, &config, sizeof now) != 0) {
        (void)mp_cpu(); /* the OS's grant, asked at detection (cpu.c) */
        _tile_loadconfig(&config);
    }
}

/* C (64 x 16 nv, row stride ldc floats) = (acc ? C : 0) + A B over kc (a
 * multiple of DEPTH). A's rows at a, sa bytes apart, each kc elements
 * along k; B's packed panel at b, its sub-panel s (columns SUB s ..) at b
 * + SUB s kc, pair row p of that at + 2 SUB p. The four tile registers of
 * C hold a 32 x 32 block at a time, while A and B pass through the other
 * four, each tile loaded for two tdpbf16ps: from L2 that is its whole
 * bandwidth. So the depth runs in chunks of CHUNK: each chunk's A (64 x
 * CHUNK, 32 KiB) stays in L1 while the panel's blocks pass, each block's B
 * chunk (16 KiB) meets both halves of A's rows (from L2, then again from
 * L1), and the partial sums go to a contiguous buffer and back between
 * chunks. Intel Xeon (family 6 model 167), one core, a 32x32 C with A and
 * B 32 x 256 in L1, loaded and stored per call: 2.0 TFLOP/s (of 2.98 for
 * tdpbf16ps alone); from L2 1.24-1.48. 2 threads, GFLOP/s, best of 15-30
 * calls, 32 rows a panel / 64: fc2 forward 1747-1805 / 1851-1898, fc2 dW
 * 1697-1759 / 1772-1812, fc1 dX 1679-1709 / 1824-1884, gpt_mini's MLP dW
 * 1.59-1.77 / 1.45-1.49 ms; chunks of 128 / 256 / 512 / 1024 at 32 rows:
 * fc2 forward 1587-1699 / 1747-1805 / 1658-1684 / 1667-1731. nv odd: the
 * last block is 16 wide (two tiles of C); the sums are the same whatever nv
 * and whatever the panel's height. */
MP_TARGET_AMX static inline __attribute__((always_inline)) void
kernel_core(int64_t kc, const uint16_t *a, int64_t sa, const uint16_t *b, float *c, int64_t ldc,
            int acc, int nv, int halves)
{
    tiles_ready();
    /* the partial sums between chunks: contiguous, where C's rows (ldc a
     * power of two: 16 KiB apart for 4096 columns) would share a few sets
     * of L1 and L2 */
    _Alignas(64) float part[AMR * ANR];
    const int64_t sc = ldc * (int64_t)sizeof(float), sb = 2 * SUB * (int64_t)sizeof(uint16_t);
    const int64_t sp = ANR * (int64_t)sizeof(float);
    for (int64_t kk = 0; kk < kc; kk += CHUNK) {
        const int64_t ke = kk + CHUNK < kc ? kk + CHUNK : kc;
        const bool first = kk == 0, last = ke == kc;
        for (int v = 0; v < nv; v += 2) {
            const bool two = v + 1 < nv;               /* 32 columns, else 16 */
            const uint16_t *bv = b + v / 2 * SUB * kc; /* sub-panel v / 2 */
            for (int h = 0; h < halves; h++) {         /* 32 rows at a time */
                const char *a0 = (const char *)a + 32 * h * sa, *a1 = a0 + 16 * sa;
                float *from = first ? c + 32 * h * ldc + 16 * v : part + 32 * h * ANR + 16 * v;
                const int64_t sf = first ? sc : sp;
                if (!first || acc) {
                    _tile_loadd(0, from, sf);
                    _tile_loadd(2, (const char *)from + 16 * sf, sf);
                    if (two) {
                        _tile_loadd(1, from + 16, sf);
                        _tile_loadd(3, (const char *)(from + 16) + 16 * sf, sf);
                    }
                } else {
                    _tile_zero(0);
                    _tile_zero(2);
                    if (two) {
                        _tile_zero(1);
                        _tile_zero(3);
                    }
                }
                for (int64_t k = kk; k < ke; k += DEPTH) {
                    const uint16_t *bk = bv + k * SUB; /* pair row k / 2 */
                    _tile_loadd(4, a0 + 2 * k, sa);
                    _tile_loadd(6, bk, sb);
                    _tile_loadd(5, a1 + 2 * k, sa);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(2, 5, 6);
                    if (two) {
                        _tile_loadd(7, bk + 32, sb);
                        _tile_dpbf16ps(1, 4, 7);
                        _tile_dpbf16ps(3, 5, 7);
                    }
                }
                float *to = last ? c + 32 * h * ldc + 16 * v : part + 32 * h * ANR + 16 * v;
                const int64_t st = last ? sc : sp;
                _tile_stored(0, to, st);
                _tile_stored(2, (char *)to + 16 * st, st);
                if (two) {
                    _tile_stored(1, to + 16, st);
                    _tile_stored(3, (char *)(to + 16) + 16 * st, st);
                }
            }
        }
    }
}

/* A packed (AMR rows of kc elements): the whole tile; its first 16 or 32
 * columns (a B panel mostly padding); and the same on its first 32 rows
 * only (an A panel of at most 32 rows: a thin C computed transposed, 10
 * rows for fc3's weight gradient). */
#define KERNEL_PACKED(name, nv, halves)                                                            \
    MP_TARGET_AMX static void name(int64_t kc, const void *a, const void *b, float *c,             \
                                   int64_t ldc, int acc)                                           \
    {                                                                                              \
        kernel_core(kc, a, kc *(int64_t)sizeof(uint16_t), b, c, ldc, acc, nv, halves);             \
    }
KERNEL_PACKED(kernel_amx, ANR / 16, 2)
KERNEL_PACKED(kernel_amx_n16, 1, 2)
KERNEL_PACKED(kernel_amx_n32, 2, 2)
KERNEL_PACKED(kernel_amx_h16, 1, 1)
KERNEL_PACKED(kernel_amx_h32, 2, 1)
KERNEL_PACKED(kernel_amx_h, ANR / 16, 1)
#undef KERNEL_PACKED

/* Whether the kernel reads A faster packed (gemm_impl.streams): always,
 * unless B is one panel (narrow_panels) and each element of A meets it
 * once: read in place for many panels, A's rows 8 KiB apart (x of a
 * 4096-wide layer) fall into the same few sets of L1 and evict each other
 * (fc2 forward 1447 GFLOP/s in place against 1791 packed, a 32-column
 * kernel; fc3 forward, B one panel, 406 -> 219-247 us in place). */
static bool packs_a(void) { return true; }

/* A bf16 read in place along its rows (sk = 1), si elements apart. */
MP_TARGET_AMX static void kernel_amx_a(int64_t kc, const void *a, int64_t si, int64_t sk,
                                       const void *b, float *c, int64_t ldc, int acc, int nv)
{
    (void)sk;
    kernel_core(kc, a, si * (int64_t)sizeof(uint16_t), b, c, ldc, acc, nv, 2);
}

/* The AVX-512 epilogue, which takes tiles up to 64 wide, on each 64
 * columns of the tile; a tile of C^T (e->trans, rows up to 64) transposed
 * first, 64 of its columns at a time, into a plain tile of C (the AVX-512
 * epilogue's own way for C^T takes 16 rows, else its scalar loop: a thin C
 * of 40 columns, 4096x40x1024 bf16 with A transposed, 664-673 -> 605-652
 * us, Intel Xeon family 6 model 167, 2 threads). */
static void epilogue_amx(const gemm_epilogue *e, const float *t, int64_t ldt, int64_t i0,
                         int64_t j0, int64_t mr, int64_t nr)
{
    _Alignas(64) float tt[64 * AMR];
    for (int64_t j = 0; j < nr; j += 64) {
        const int64_t w = nr - j < 64 ? nr - j : 64;
        if (e->trans) /* rows of tt: mr rounded up to whole vectors */
            mp_gemm_epilogue_transposed(e, t + j, ldt, i0, j0 + j, mr, w, tt,
                                        (int)((mr + 15) / 16 * 16), mp_gemm_epilogue_avx512);
        else
            mp_gemm_epilogue_avx512(e, t + j, ldt, i0, j0 + j, mr, w);
    }
}

/* One row of C over B's rows where they lie (gemm_rows.c: a decoder's
 * step): c[0..n) = a B, B's row d at b + d sb elements of type bt, A's row
 * of kc bf16 padded with zeros to whole tiles of depth. Up to 128 columns
 * at a time, ROW_STEPS tiles of depth (one) at a time: each row of B read 256
 * bytes at once and its pairs with the next row interleaved by
 * unpacklo/hi into the B tiles of four 32-column blocks in L1 (the columns
 * in the order 0-3, 8-11, 16-19, 24-27 and 4-7, ...: put back when C is
 * stored); then each block's two C tiles (every row of them row 0: A's
 * tile is its one row 16 times, stride 0) meet its tiles. The same
 * tdpbf16ps, over the same tiles of depth in the same order, as the
 * register tiles give every element: the same bits, so a decoder's steps
 * give the full forward's rows. The cost of that: B's tiles go through L1
 * (stored, then loaded as tiles) where vdpbf16ps's row kernel multiplies
 * B's rows as loaded. Intel Xeon (family 6 model 167), bf16, best of 200
 * calls, us, vdpbf16ps's rows / these: 1x1024x256 5.0 / 10.9-11.1 (2
 * threads), 8.2 / 16.7-17.5 (one), 1x4096x1024 191 / 263-276 (ROW_STEPS
 * 2: 11.1, 16.2, 310; 4: 12.8, 21.6, 290; two turns of the tiles' buffer
 * gained nothing); gpt_mini's generation at prompt
 * 16: 4272 / 3433 tokens/s, the cached steps agreeing with the windowed
 * forward on 23 / 32 of 32 greedy tokens at prompt 512. The tiles alone,
 * B's 32 columns at a time, took 20-22 us. */
MP_TARGET_AMX static void row_amx(int64_t kc, const void *a, const void *b, int64_t sb, mp_dtype bt,
                                  float *c, int64_t n)
{
    tiles_ready();
    enum { ROW_STEPS = 1, GROUP = ANR / SUB };
    const int64_t kpad = mp_gemm_kpad(GEMM_FMT_AMX, kc), es = (int64_t)mp_dtype_size(bt);
    const int64_t sbb = sb * es, ahead = mp_gemm_rows_ahead(sbb, 16) * sbb;
    const mp_gemm_fp8_lut l = mp_gemm_fp8_lut_for(bt);
    _Alignas(64) uint16_t tiles[GROUP][ROW_STEPS][DEPTH * SUB]; /* 8 KiB */
    _Alignas(64) float part[GROUP][2][16];                      /* C: row 0 of each tile */
    const __m512i lo_idx = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i hi_idx =
        _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
    for (int64_t j = 0; j < n; j += ANR) {
        const int64_t nj = n - j < ANR ? n - j : ANR;
        const int nsub = (int)cdiv(nj, SUB);
        for (int64_t kk = 0; kk < kpad; kk += ROW_STEPS * DEPTH) {
            const int steps = (int)min64(ROW_STEPS, (kpad - kk) / DEPTH);
            for (int st = 0; st < steps; st++)
                for (int p = 0; p < DEPTH / 2; p++) {
                    const int64_t d = kk + st * DEPTH + 2 * p;
                    const char *r0 = (const char *)b + (d * sb + j) * es;
                    if (nj == ANR && d + 1 < kc) { /* all in registers */
                        __m512i x0[GROUP], x1[GROUP];
                        for (int x = 0; x < GROUP * es; x += 2) { /* the group's lines */
                            _mm_prefetch(r0 + ahead + 32 * x, _MM_HINT_T0);
                            _mm_prefetch(r0 + sbb + ahead + 32 * x, _MM_HINT_T0);
                        }
                        for (int x = 0; x < GROUP; x++) {
                            x0[x] = bt == MP_BF16 ? _mm512_loadu_si512(r0 + 64 * x)
                                                  : mp_gemm_fp8_load32(r0 + 32 * x, 32, &l);
                            x1[x] = bt == MP_BF16 ? _mm512_loadu_si512(r0 + sbb + 64 * x)
                                                  : mp_gemm_fp8_load32(r0 + sbb + 32 * x, 32, &l);
                        }
                        for (int x = 0; x < GROUP; x++) {
                            uint16_t *o = tiles[x][st] + p * 2 * SUB;
                            _mm512_store_si512(o, _mm512_unpacklo_epi16(x0[x], x1[x]));
                            _mm512_store_si512(o + SUB, _mm512_unpackhi_epi16(x0[x], x1[x]));
                        }
                        continue;
                    }
                    for (int x = 0; x < nsub; x++) {
                        const int64_t left = nj - x * SUB;
                        const int c0 = left >= 16 ? 16 : (int)left;
                        const int c1 = left >= 32 ? 16 : left > 16 ? (int)(left - 16) : 0;
                        __m512i r[2];
                        for (int h = 0; h < 2; h++) {
                            const char *src = r0 + h * sbb + x * SUB * es;
                            if (d + h >= kc) {
                                r[h] = _mm512_setzero_si512();
                                continue;
                            }
                            _mm_prefetch(src + ahead, _MM_HINT_T0);
                            r[h] =
                                bt != MP_BF16 ? mp_gemm_fp8_load32(src, c0 + c1, &l)
                                : c1 == 16
                                    ? _mm512_loadu_si512(src)
                                    : _mm512_inserti64x4(
                                          _mm512_castsi256_si512(mp_gemm_bf16_load16(src, bt, c0)),
                                          mp_gemm_bf16_load16(src + 16 * es, bt, c1), 1);
                        }
                        uint16_t *o = tiles[x][st] + p * 2 * SUB;
                        _mm512_store_si512(o, _mm512_unpacklo_epi16(r[0], r[1]));
                        _mm512_store_si512(o + SUB, _mm512_unpackhi_epi16(r[0], r[1]));
                    }
                }
            for (int x = 0; x < nsub; x++) {
                if (kk) {
                    _tile_loadd(0, part[x][0], 0);
                    _tile_loadd(1, part[x][1], 0);
                } else {
                    _tile_zero(0);
                    _tile_zero(1);
                }
                for (int st = 0; st < steps; st++) {
                    _tile_loadd(4, (const uint16_t *)a + kk + st * DEPTH, 0);
                    _tile_loadd(6, tiles[x][st], 2 * SUB * (int64_t)sizeof(uint16_t));
                    _tile_loadd(7, tiles[x][st] + SUB, 2 * SUB * (int64_t)sizeof(uint16_t));
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                }
                _tile_stored(0, part[x][0], 0); /* every row is row 0 */
                _tile_stored(1, part[x][1], 0);
            }
        }
        for (int x = 0; x < nsub; x++) {
            const int64_t left = nj - x * SUB;
            const int c0 = left >= 16 ? 16 : (int)left;
            const int c1 = left >= 32 ? 16 : left > 16 ? (int)(left - 16) : 0;
            const __m512 t0 = _mm512_load_ps(part[x][0]), t1 = _mm512_load_ps(part[x][1]);
            float *cx = c + j + x * SUB;
            _mm512_mask_storeu_ps(cx, (__mmask16)((1u << c0) - 1),
                                  _mm512_permutex2var_ps(t0, lo_idx, t1));
            if (c1)
                _mm512_mask_storeu_ps(cx + 16, (__mmask16)((1u << c1) - 1),
                                      _mm512_permutex2var_ps(t0, hi_idx, t1));
        }
    }
}

/* ------------------------------------------------------------- packing */

/* B: the vdpbf16ps path's pairs in sub-panels of SUB columns (a block's
 * two B tiles side by side, its chunks contiguous), ANR / SUB of them to a
 * panel, padded to whole tiles of depth; a last panel's missing sub-panels
 * zero. */
MP_TARGET_AVX512BF16 static void pack_b(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0,
                                        int64_t nd, int W, void *dst)
{
    const int64_t kpad = mp_gemm_kpad(GEMM_FMT_AMX, nd), subs = cdiv(nw, SUB);
    mp_gemm_pack_bf16_avx512(op, w0, nw, d0, nd, SUB, kpad / 2, dst);
    const int64_t all = cdiv(nw, W) * (W / SUB);
    memset((uint16_t *)dst + subs * SUB * kpad, 0,
           (size_t)((all - subs) * SUB * kpad) * sizeof(uint16_t));
}

/* A, laid along its width (sw = 1: A^T stored, a weight gradient's x^T):
 * 32 widths x 32 depths at a time, each pair of depth rows interleaved
 * into pairs by unpacklo/hi (which take the widths in the order 0-3, 8-11,
 * 16-19, 24-27 and 4-7, 12-15, ...), then each half's 16 x 16 words (pair x
 * width) transposed into 16 rows' 16 pairs, stored as the rows they are.
 * bf16 and fp8 (decoded to bf16 as loaded); past nw and nd, zeros
 * (gpt_mini's MLP weight gradient, 1024x256x4096, Intel Xeon family 6
 * model 167, 2 threads, best of 100 calls: 1.59-1.77 ms, against 2.35
 * through the pairs packer and a buffer). The block of widths [w, w + 32)
 * at depths [d, d + 32); the source row dd + ahead asked for as each row dd
 * is loaded. */
MP_TARGET_AVX512BF16 static inline __attribute__((always_inline)) void
pack_a_t32(const gemm_operand *op, const mp_gemm_fp8_lut *l, int64_t w0, int64_t nw, int64_t d0,
           int64_t nd, int64_t kpad, int64_t w, int64_t d, int64_t ahead, uint16_t *out)
{
    const mp_dtype t = op->type;
    const int64_t es = (int64_t)mp_dtype_size(t), sd = op->sd * es;
    const int64_t nv = min64(32, nw - w);
    const int c0 = nv >= 16 ? 16 : (int)nv, c1 = nv > 16 ? (int)(nv - 16) : 0;
    const char *col = (const char *)op->base + (w0 + w + d0 * op->sd) * es;
    __m512i lo[16], hi[16];
    for (int p = 0; p < DEPTH / 2; p++) {
        __m512i r[2];
        for (int h = 0; h < 2; h++) {
            const int64_t dd = d + 2 * p + h;
            const char *src = col + dd * sd;
            if (dd + ahead < nd) _mm_prefetch(src + ahead * sd, _MM_HINT_T0);
            if (dd >= nd)
                r[h] = _mm512_setzero_si512();
            else if (t != MP_BF16)
                r[h] = mp_gemm_fp8_load32(src, c0 + c1, l);
            else if (nv == 32) /* a whole row of 32 */
                r[h] = _mm512_loadu_si512(src);
            else
                r[h] = _mm512_inserti64x4(_mm512_castsi256_si512(mp_gemm_bf16_load16(src, t, c0)),
                                          mp_gemm_bf16_load16(src + 16 * es, t, c1), 1);
        }
        lo[p] = _mm512_unpacklo_epi16(r[0], r[1]);
        hi[p] = _mm512_unpackhi_epi16(r[0], r[1]);
    }
    mp_transpose16x16_epi32(lo);
    mp_transpose16x16_epi32(hi);
    /* word lane j of lo is width 8 (j / 4) + j % 4, of hi 4 more */
    for (int j = 0; j < 16; j++) {
        const int64_t wl = 8 * (j / 4) + j % 4;
        _mm512_storeu_si512(out + (w + wl) * kpad + d, lo[j]);
        _mm512_storeu_si512(out + (w + wl + 4) * kpad + d, hi[j]);
    }
}

/* The blocks of pack_a_t32 in one of two orders. Wide (nw >= ROWS_FIRST):
 * 32 source rows at a time across all the widths, each row read as one run
 * (a weight gradient's x^T from memory: the hardware prefetcher follows
 * runs), the next 32 rows asked for meanwhile; narrower, a strip of 32
 * widths down the whole depth, a row 4 ahead asked for (a run of 64 bytes a
 * row is too short to follow). Intel Xeon family 6 model 167, bf16, 2
 * threads, A^T from memory (64 MiB written between calls), medians of 41
 * calls, six alternating runs, ms, strips / rows first: gpt_mini's MLP
 * weight gradient 1024x256x4096 (512 widths a thread) 2.22 / 1.94, fc1's
 * 784x4096x1024 (a share of 13 panels) 4.77 / 4.59, but 256x1024x4096 (128
 * widths a thread) 1.91 / 1.98 and 256x256x4096 0.78 / 0.82. With A cached
 * the orders tie (1024x256x4096 1.50 either way). */
MP_TARGET_AVX512BF16 static void pack_a_t(const gemm_operand *op, int64_t w0, int64_t nw,
                                          int64_t d0, int64_t nd, int64_t kpad, uint16_t *out)
{
    enum { ROWS_FIRST = 256 };
    const mp_gemm_fp8_lut l = mp_gemm_fp8_lut_for(op->type);
    if (nw >= ROWS_FIRST) {
        for (int64_t d = 0; d < kpad; d += DEPTH)
            for (int64_t w = 0; w < nw; w += 32)
                pack_a_t32(op, &l, w0, nw, d0, nd, kpad, w, d, DEPTH, out);
    } else {
        for (int64_t w = 0; w < nw; w += 32)
            for (int64_t d = 0; d < kpad; d += DEPTH)
                pack_a_t32(op, &l, w0, nw, d0, nd, kpad, w, d, 4, out);
    }
}

/* A: AMR rows of kpad elements per panel, each row along k, zeros past nd
 * and in the missing rows of a last panel. */
MP_TARGET_AVX512BF16 static void pack_a(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0,
                                        int64_t nd, int W, void *dst)
{
    const mp_dtype t = op->type;
    const int64_t kpad = mp_gemm_kpad(GEMM_FMT_AMX, nd), rows = cdiv(nw, W) * W;
    uint16_t *out = dst;
    const bool simd = t == MP_BF16 || t == MP_F8E4M3 || t == MP_F8E5M2;
    if (simd && op->sw == 1 && op->sd != 1) {
        pack_a_t(op, w0, nw, d0, nd, kpad, out);
    } else if (simd && op->sd == 1) {
        const int64_t es = (int64_t)mp_dtype_size(t);
        const mp_gemm_fp8_lut l = mp_gemm_fp8_lut_for(t);
        for (int64_t r = 0; r < nw; r++) {
            const char *src = (const char *)op->base + ((w0 + r) * op->sw + d0) * es;
            uint16_t *o = out + r * kpad;
            if (t != MP_BF16) { /* kpad: whole tiles of depth, 32 a vector */
                for (int64_t d = 0; d < kpad; d += 32)
                    _mm512_storeu_si512(o + d,
                                        mp_gemm_fp8_load32(src + d, (int)min64(nd - d, 32), &l));
                continue;
            }
            for (int64_t d = 0; d < kpad; d += 16) {
                const int cnt = d >= nd ? 0 : nd - d >= 16 ? 16 : (int)(nd - d);
                _mm256_storeu_si256((__m256i *)(o + d), mp_gemm_bf16_load16(src + d * es, t, cnt));
            }
        }
    } else {
        for (int64_t r = 0; r < nw; r++)
            for (int64_t d = 0; d < kpad; d++)
                out[r * kpad + d] =
                    d < nd ? mp_gemm_load_bf16(op->base, t, (w0 + r) * op->sw + (d0 + d) * op->sd)
                           : 0;
    }
    memset(out + nw * kpad, 0, (size_t)((rows - nw) * kpad) * sizeof *out);
}

/* Blocks: depth 1024, the B block within half of L2 (b_block_l2: each
 * panel, 128 columns x 1024 deep, 256 KiB, is read again for every A panel;
 * from L3 it could not feed the tiles), C's partial sums between depth
 * chunks in L1 (kernel_core) and between depth blocks in the driver's
 * buffer, A packed but for a B of one panel (packs_a).
 * Intel Xeon (family 6 model 167), 2 threads, bf16, GFLOP/s, the best of 7
 * runs at depth blocks 1024 / 2048 / 4096 with the B block within half of
 * L2: fc2 forward (1024x4096x4096) 1684-1819 / 1830-1844 / 1703-1784, fc1
 * dX (1024x784x4096) 1684-1771 / 1708-1777 / 1460-1522, gpt_mini's MLP
 * weight gradient (1024x256x4096, A transposed) 1222-1301 / 1062-1086 /
 * 801-976, fc2 dW (4096x4096x1024) 1618-1677 / 1658-1756 / 1650-1678;
 * before the cap (B blocks of 512 columns, 4096 deep: 4 MiB) fc2 forward
 * ran at 1054. */
const gemm_impl mp_gemm_amx_impl = {
    .fmt = GEMM_FMT_AMX,
    .mr = AMR,
    .nr = ANR,
    .kc = 1024,
    .mc = 1024,
    .nc = 512,
    .b_block_l2 = true,
    .kernel = kernel_amx,
    .narrow = {kernel_amx_n16, kernel_amx_n32},
    .half = {kernel_amx_h16, kernel_amx_h32, kernel_amx_h},
    .kernel_a = kernel_amx_a,
    .streams = packs_a,
    .narrow_panels = 1,
    .kernel_row = row_amx,
    .row_max = 2,
    .pack = pack_b,
    .pack_a = pack_a,
    .sub_nr = SUB,
    .epilogue = epilogue_amx,
    .epilogue_checks = true,
    .nonfinite = mp_gemm_nonfinite_avx512,
    /* fc3's input gradient, 1024x4096x10 bf16, 2 threads, Intel Xeon
     * family 6 model 167, medians of 41 calls: 1.06-1.14 ms on the tiles
     * (C stored from them: 16 MiB, about 15 GB/s), 0.55 widened to float32
     * (FMA); depth 24 1.05 / 0.81, 32 1.10 / 0.99, 48 1.16 / 1.34 */
    .shallow_k = DEPTH,
    .shallow = &mp_gemm_avx512_impl,
};

#endif
