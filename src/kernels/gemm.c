/* gemm.c - the GEMM driver: choice of microkernel, cache blocking, packing
 * (which widens every input type to the kernel's format), OpenMP threading
 * over blocks of C, and the epilogue. The public entry points and their
 * argument checks are in gemm_api.c, the cache blocking rules in
 * gemm_blocks.c.
 *
 * Kernel choice (documented rule for mixed input types):
 *   - both operands bf16 or fp8 and the CPU has AVX512_BF16: the vdpbf16ps
 *     kernel (fp8 decoded to bf16 while packing, which is exact) or the FMA
 *     kernel (bf16/fp8 widened exactly to f32), or AMX tiles (tdpbf16ps)
 *     where the CPU and OS allow them, whichever was measured fastest on
 *     this pair of types on this machine (gemm_dispatch.c), except that
 *     a product shallower than the chosen kernel's shallow_k goes to the
 *     kernel it names (AMX: FMA below a tile's depth of 32);
 *     MP_ISA=avx512bf16 forces vdpbf16ps, MP_ISA=amx the tiles;
 *   - anything else (an f32 or f16 operand, or no AVX512_BF16): the f32 FMA
 *     kernel with every operand widened exactly to f32. An f32 input is never
 *     rounded to bf16, and f16 x f16 gives exact products accumulated in f32.
 * Each element of C is summed in one fixed order along k (blocks of depth are
 * chained through the stored partial sum), so results do not depend on the
 * thread count or on how C is split. */
#include <stdatomic.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/profile.h"
#include "kernels/gemm_internal.h"
#include "kernels/gemm_pack.h"

/* The measured choice for a bf16-like pair, for a product k deep. */
static const gemm_impl *measured(mp_dtype at, mp_dtype bt, int64_t k)
{
    const gemm_impl *im = mp_gemm_dispatch_bf16(at, bt);
    return k < im->shallow_k ? im->shallow : im;
}

static const gemm_impl *choose_impl(mp_dtype at, mp_dtype bt, int64_t k)
{
    const gemm_impl *timing = mp_gemm_dispatch_override();
    if (timing) return timing;
    mp_isa isa = mp_isa_active();
    if (mp_gemm_bf16_like(at) && mp_gemm_bf16_like(bt) && !mp_isa_forced() &&
        mp_gemm_dispatch_testing())
        return measured(at, bt, k);
#if MP_X86
    if (isa >= MP_ISA_AVX512BF16 && mp_gemm_bf16_like(at) && mp_gemm_bf16_like(bt)) {
        if (!mp_isa_forced()) return measured(at, bt, k);
        return isa == MP_ISA_AMX ? &mp_gemm_amx_impl : &mp_gemm_avx512bf16_impl;
    }
    if (isa >= MP_ISA_AVX512) return &mp_gemm_avx512_impl;
    if (isa == MP_ISA_AVX2) return &mp_gemm_avx2_impl;
#else
    (void)isa;
    (void)at;
    (void)bt;
#endif
    return &mp_gemm_scalar_impl;
}

const gemm_impl *mp_gemm_impl_for(mp_dtype at, mp_dtype bt)
{
    return choose_impl(at, bt, INT64_MAX);
}

/* ------------------------------------------------------------ the driver */

typedef struct {
    const gemm_impl *im;
    gemm_operand a, b; /* a: width m, depth k; b: width n, depth k */
    int64_t m, n, k;
    int64_t kcb;                 /* depth block, the same for every thread */
    int64_t nc;                  /* column block */
    bool in_place;               /* the kernel reads A where it lies (a_in_place) */
    gemm_kernel_a_fn kernel_a;   /* the kernel that does (A's type picks it) */
    bool b_in_place;             /* and B's full panels (b_in_place) */
    gemm_kernel_ab_fn kernel_ab; /* the kernel that reads both (B's type picks it) */
    gemm_epilogue e;
    atomic_int *nonfinite; /* NULL, or set to 1 when a value written to C is not finite */
} gemm_plan;

/* The kernel for a packed A panel with mr valid rows and a B panel with nr
 * valid columns, and how many columns it writes (*kw): a narrow one where
 * the impl has it and the panel is mostly padding, one of half the rows
 * (gemm_impl.half) where A's panel is. */
static gemm_kernel_fn kernel_for(const gemm_impl *im, int64_t mr, int64_t nr, int *kw)
{
    const int64_t v = (nr + 15) / 16 - 1;
    const bool narrow = nr < im->nr && v < 2 && im->narrow[v];
    *kw = narrow ? 16 * (int)(v + 1) : im->nr;
    if (mr <= im->mr / 2 && im->half[narrow ? v : 2]) return im->half[narrow ? v : 2];
    return narrow ? im->narrow[v] : im->kernel;
}

/* Where a microkernel call finds its A panel: packed (si == 0) or in place
 * (see gemm_kernel_a_fn). */
typedef struct {
    const void *p;
    int64_t si, sk;
} a_panel;

/* kab: NULL where B is packed, else the kernel reading both A and B (B's
 * depth stride sb); ka: the kernel for A in place */
static void micro(const gemm_impl *im, gemm_kernel_fn kern, gemm_kernel_a_fn ka,
                  gemm_kernel_ab_fn kab, int kw, int64_t kc, a_panel a, const void *b, int64_t sb,
                  float *c, int64_t ldc, int acc)
{
    if (kab)
        kab(kc, a.p, a.si ? a.si : 1, a.si ? a.sk : im->mr, b, sb, c, ldc, acc, kw / 16);
    else if (a.si)
        ka(kc, a.p, a.si, a.sk, b, c, ldc, acc, kw / 16);
    else
        kern(kc, a.p, b, c, ldc, acc);
}

/* Whether A can be read in place by a kernel that takes it so. float32:
 * along rows (unit depth stride: 8 sequential streams), or along columns
 * when the depth stride is short. A panel column is then 8 floats of a
 * row; with rows 4 KiB or more apart, the kc rows a kernel call walks land
 * in a few L1 sets and evict each other (measured slower than packing for
 * 1024- and 4096-wide rows, faster for 256). bf16: along rows, where each
 * pair along k is a 32-bit word of the row as the packed panel has it,
 * when k is even (every depth block then is: the last pair never reaches
 * past a row); on a float32-format kernel with kernel_a_bf16, along
 * rows where B is at most two panels wide. */
static bool a_in_place(const gemm_impl *im, const gemm_operand *a, int64_t k, int64_t n)
{
    enum { MAX_COLUMN_STRIDE = 256 };
    if (!im->kernel_a || a->gather) return false;
    /* a kernel that streams reads a packed A faster (gemm_impl.streams),
     * unless B is so narrow that packing A costs more than its products */
    const int64_t narrow = (a->sd == 1 && im->narrow_panels ? im->narrow_panels : 2) * im->nr;
    if (im->streams && n > narrow && im->streams()) return false;
    /* bf16 pairs, or AMX's 32-deep tile rows, along A's rows: where k is
     * whole pairs or tiles, the last never reaches past a row */
    if (im->fmt != GEMM_FMT_F32)
        return a->type == MP_BF16 && a->sd == 1 && mp_gemm_kpad(im->fmt, k) == k;
    if (a->type == MP_BF16) return im->kernel_a_bf16 && a->sd == 1 && n <= 2 * (int64_t)im->nr;
    return a->type == MP_F32 && (a->sd == 1 || (a->sw == 1 && a->sd <= MAX_COLUMN_STRIDE));
}

/* Whether the kernel reads B's full panels where they lie: float32 (or
 * bfloat16, on a kernel with kernel_ab_bf16) laid out along n (a panel row
 * is NR consecutive elements), when C has at most
 * two panels of rows. Each B element then takes part in at most 2 MR
 * products, and packing it (a read and a write of all of B, then a read
 * of the copy) costs more than the products: fc3's weight gradient,
 * 4096x10x1024 f32 done as C^T = dz^T x, packed x 16 MiB for 84 MFLOP. */
static bool b_in_place(const gemm_impl *im, const gemm_operand *b, int64_t m)
{
    const bool kernel = b->type == MP_F32    ? im->kernel_ab != NULL
                        : b->type == MP_BF16 ? im->kernel_ab_bf16 != NULL
                                             : false;
    return kernel && im->fmt == GEMM_FMT_F32 && b->sw == 1 && !b->gather && m <= 2 * im->mr;
}

/* Every line of `rows` runs of `bytes` bytes, ld_bytes apart, asked for
 * with write intent (a run across a line boundary included). */
static inline void prefetch_rows(const char *p, int64_t ld_bytes, int64_t rows, int64_t bytes)
{
    for (int64_t i = 0; i < rows; i++, p += ld_bytes) {
        for (int64_t x = 0; x < bytes; x += 64) __builtin_prefetch(p + x, 1, 3);
        __builtin_prefetch(p + bytes - 1, 1, 3);
    }
}

/* The partial sums the kernel call after tile (ir, jr) of a block starts
 * from (C itself, or the buffer cw) are loaded at its top and every FMA
 * chain waits for them: asked for one call ahead, they arrive while this
 * call computes. */
static inline void prefetch_tile(const gemm_plan *pl, int64_t ir, int64_t jr, int64_t mb,
                                 int64_t nb, int64_t ic, int64_t jc, int64_t n0, const float *cw,
                                 int64_t ldw)
{
    const int MR = pl->im->mr, NR = pl->im->nr;
    jr += NR;
    if (jr >= nb) {
        jr = 0;
        ir += MR;
        if (ir >= mb) return;
    }
    const float *row;
    int64_t ld;
    if (cw) {
        row = cw + ir * ldw + (jc - n0) + jr;
        ld = ldw;
    } else {
        row = (const float *)pl->e.c + (ic + ir) * pl->e.ldc + jc + jr;
        ld = pl->e.ldc;
    }
    prefetch_rows((const char *)row, ld * (int64_t)sizeof(float), min64(MR, mb - ir),
                  NR * (int64_t)sizeof(float));
}

/* A tile that goes to C through the epilogue (from the tile buffer or the
 * partial sums) is stored after the kernel call that computes it: its C
 * lines are asked for, to be written, before the call, which takes long
 * enough for them to arrive. fc1's forward with bias and relu
 * (1024x4096x784, 2 threads, Zen 5, medians of 15-21 calls alternating
 * in one process): bf16 inputs and C 8.54 -> 8.11 and 8.62 -> 8.23 ms,
 * float32 19.76 -> 18.70 ms; the same product with nothing to apply,
 * stored from the kernel's registers, 7.72 and 17.67 ms. */
static inline void prefetch_out(const gemm_epilogue *e, int64_t i0, int64_t j0, int64_t mr,
                                int64_t nr)
{
    if (e->trans) return; /* a thin C^T: its few columns are rows of C */
    const int64_t cs = (int64_t)mp_dtype_size(e->c_type);
    prefetch_rows((const char *)e->c + (i0 * e->ldc + j0) * cs, e->ldc * cs, mr, nr * cs);
}

/* With nothing to apply on the way out, full tiles accumulate in C itself
 * and skip the round trip through a buffer. */
bool mp_gemm_accumulates_in_c(const gemm_epilogue *e)
{
    return e->c_type == MP_F32 && e->alpha == 1.0f && e->beta == 0.0f && !e->bias &&
           e->act == MP_ACT_NONE && !e->trans;
}

/* All exponent bits set. */
MP_SIMD_CLONES bool mp_gemm_any_nonfinite(const float *p, int64_t n)
{
    uint32_t bad = 0;
#pragma omp simd reduction(| : bad)
    for (int64_t j = 0; j < n; j++) bad |= (mp_f32_bits(p[j]) & 0x7F800000u) == 0x7F800000u;
    return bad != 0;
}

/* After the final values of tile rows [i0, i0+mr) x cols [j0, j0+nr) went
 * to C (float32), read them back from L1 for pl->nonfinite. */
static void check_tile(const gemm_plan *pl, int64_t i0, int64_t j0, int64_t mr, int64_t nr)
{
    const gemm_epilogue *e = &pl->e;
    if (atomic_load_explicit(pl->nonfinite, memory_order_relaxed)) return;
    const float *c = e->c;
    /* as stored: C^T's rows are the tile's columns */
    const int64_t rows = e->trans ? nr : mr, cols = e->trans ? mr : nr;
    const int64_t r0 = e->trans ? j0 : i0, c0 = e->trans ? i0 : j0;
    const float *at = c + r0 * e->ldc + c0;
    bool bad = false;
    if (pl->im->nonfinite)
        bad = pl->im->nonfinite(at, e->ldc, rows, cols);
    else
        for (int64_t r = 0; r < rows && !bad; r++)
            bad = mp_gemm_any_nonfinite(at + r * e->ldc, cols);
    if (bad) atomic_store_explicit(pl->nonfinite, 1, memory_order_relaxed);
}

/* Computes rows [m0, m1) x cols [n0, n1) of C; false if out of memory.
 * share: NULL, or the team's shared A or B packing (thread t of
 * share->nt). */
static bool run_region(const gemm_plan *pl, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                       gemm_share *share, int tid)
{
    const gemm_impl *im = pl->im;
    const int MR = im->mr, NR = im->nr;
    const size_t esz = (size_t)mp_gemm_fmt_bytes(im->fmt);
    _Alignas(64) float tile[64 * 128]; /* the largest tile: AMX's */
    if (m0 >= m1 || n0 >= n1) return true;

    if (pl->k == 0) {
        memset(tile, 0, sizeof tile);
        for (int64_t i = m0; i < m1; i += MR)
            for (int64_t j = n0; j < n1; j += NR) {
                im->epilogue(&pl->e, tile, NR, i, j, min64(MR, m1 - i), min64(NR, n1 - j));
                if (pl->nonfinite && !im->epilogue_checks)
                    check_tile(pl, i, j, min64(MR, m1 - i), min64(NR, n1 - j));
            }
        return true;
    }

    const int64_t kcb = pl->kcb;
    const int64_t kpad_max = mp_gemm_kpad(im->fmt, kcb);
    const int64_t nr_pad = cdiv(n1 - n0, NR) * NR;
    const int64_t nc = min64(pl->nc, nr_pad);
    const bool multi = kcb < pl->k;
    const gemm_epilogue *e = &pl->e;
    const bool direct = mp_gemm_accumulates_in_c(e);
    const bool in_place = pl->in_place;
    const int64_t mc =
        share ? share->mc : mp_gemm_row_block(im, m1 - m0, nr_pad, kcb, multi, direct, !in_place);
    gemm_share *const ashare = share && !share->b ? share : NULL;
    gemm_share *const bshare = share && share->b ? share : NULL;
    /* read in place, A needs a buffer only for a last, partial panel */
    const int64_t a_rows = in_place ? MR : mc;
    char *ap = ashare && tid ? NULL : mp_scratch(0, (size_t)a_rows * (size_t)kpad_max * esz);
    /* B packed once for all row blocks (a thread's own range only) */
    const bool b_once =
        !bshare && !pl->b_in_place && mp_gemm_b_once(im, m1 - m0, mc, nr_pad, kpad_max, multi);
    char *bp = bshare && tid
                   ? NULL
                   : mp_scratch(1, (size_t)(b_once ? nr_pad : nc) * (size_t)kpad_max * esz);
    float *cw = multi ? mp_scratch(2, (size_t)mc * (size_t)nr_pad * sizeof(float)) : NULL;
    const bool mine_ok = (ap || (ashare && tid)) && (bp || (bshare && tid)) && (!multi || cw);
    if (share) {
        if (!mine_ok) atomic_store(&share->failed, 1);
        if (tid == 0) atomic_store(&share->p, ashare ? ap : bp);
#pragma omp barrier
        if (atomic_load(&share->failed)) return false;
        if (ashare) ap = atomic_load(&share->p);
        if (bshare) bp = atomic_load(&share->p);
    } else if (!mine_ok) {
        return false;
    }
    const int64_t ldw = nr_pad;

    const int64_t a_size = (int64_t)mp_dtype_size(pl->a.type);
    const int64_t b_size = (int64_t)mp_dtype_size(pl->b.type);
    const int64_t m_end = bshare ? m0 + bshare->nblk * mc : m1;
    for (int64_t ic = m0; ic < m_end; ic += mc) {
        const int64_t mb = ic < m1 ? min64(mc, m1 - ic) : 0; /* B shared: maybe none */
        for (int64_t pc = 0; pc < pl->k; pc += kcb) {
            const int64_t kb = min64(kcb, pl->k - pc);
            const int64_t kpad = mp_gemm_kpad(im->fmt, kb);
            const bool first = pc == 0, last = pc + kb >= pl->k;
            if (ashare) {
                mp_gemm_pack_share(im, true, &pl->a, MR, ic, mb, pc, kb, kpad, ap, ashare, tid);
            } else if (mb > 0 && !in_place &&
                       !mp_gemm_pack_op(im, true, &pl->a, ic, mb, pc, kb, MR, ap)) {
                return false;
            }
            for (int64_t jc = n0; jc < n1; jc += nc) {
                const int64_t nb = min64(nc, n1 - jc);
                /* read in place, B needs packing only for a last, partial panel */
                const int64_t nfull = pl->b_in_place ? nb / NR * NR : 0;
                char *bblk = bp;
                if (b_once) {
                    bblk = bp + (size_t)((jc - n0) / NR) * (size_t)(NR * kpad) * esz;
                    if (ic == m0 && !mp_gemm_pack_op(im, false, &pl->b, jc, nb, pc, kb, NR, bblk))
                        return false;
                } else if (bshare) {
                    mp_gemm_pack_share(im, false, &pl->b, NR, jc, nb, pc, kb, kpad, bp, bshare,
                                       tid);
                } else if (nfull < nb && !mp_gemm_pack_op(im, false, &pl->b, jc + nfull, nb - nfull,
                                                          pc, kb, NR, bp)) {
                    return false;
                }
                for (int64_t ir = 0; ir < mb; ir += MR) {
                    const int64_t mr = min64(MR, mb - ir);
                    a_panel apan = {ap + (size_t)(ir / MR) * (size_t)(MR * kpad) * esz, 0, 0};
                    if (in_place && mr == MR) {
                        apan.p = (const char *)pl->a.base +
                                 ((ic + ir) * pl->a.sw + pc * pl->a.sd) * a_size;
                        apan.si = pl->a.sw;
                        apan.sk = pl->a.sd;
                    } else if (in_place && jc == n0) { /* a last, partial panel: packed */
                        if (!mp_gemm_pack_op(im, true, &pl->a, ic + ir, mr, pc, kb, MR, ap))
                            return false;
                        apan.p = ap;
                    } else if (in_place) {
                        apan.p = ap;
                    }
                    for (int64_t jr = 0; jr < nb; jr += NR) {
                        if (!first && (direct || multi))
                            prefetch_tile(pl, ir, jr, mb, nb, ic, jc, n0, cw, ldw);
                        /* B's full panels read in place, the others packed (from
                         * the first past them: an offset counted from a panel
                         * read in place would point before the buffer) */
                        const char *bpan;
                        int64_t sb = NR;
                        gemm_kernel_ab_fn kab = NULL;
                        if (jr < nfull) {
                            bpan = (const char *)pl->b.base +
                                   ((jc + jr) * pl->b.sw + pc * pl->b.sd) * b_size;
                            sb = pl->b.sd;
                            kab = pl->kernel_ab;
                        } else {
                            bpan = bblk + (size_t)((jr - nfull) / NR) * (size_t)(NR * kpad) * esz;
                        }
                        const int64_t nr = min64(NR, nb - jr);
                        int kw;
                        const gemm_kernel_fn kern = kernel_for(im, mr, nr, &kw);
                        const bool in_c = direct && mr == MR && nr == kw;
                        if (!in_c && last) prefetch_out(e, ic + ir, jc + jr, mr, nr);
                        if (in_c) {
                            float *cp = (float *)e->c + (ic + ir) * e->ldc + jc + jr;
                            micro(im, kern, pl->kernel_a, kab, kw, kpad, apan, bpan, sb, cp, e->ldc,
                                  !first);
                        } else if (!multi) {
                            micro(im, kern, pl->kernel_a, kab, kw, kpad, apan, bpan, sb, tile, NR,
                                  0);
                            im->epilogue(e, tile, NR, ic + ir, jc + jr, mr, nr);
                        } else {
                            float *t = cw + ir * ldw + (jc - n0) + jr;
                            micro(im, kern, pl->kernel_a, kab, kw, kpad, apan, bpan, sb, t, ldw,
                                  !first);
                            if (last) im->epilogue(e, t, ldw, ic + ir, jc + jr, mr, nr);
                        }
                        /* a tile the epilogue wrote was checked there (C's lines,
                         * asked for before the kernel call, may have left L1 by
                         * then; reading them back cost bf16 dW 4096x4096x1024
                         * with alpha 0.37 1.7-4.2 ms of 41-45) */
                        if (pl->nonfinite && last && (in_c || !im->epilogue_checks))
                            check_tile(pl, ic + ir, jc + jr, mr, nr);
                    }
                }
            }
        }
    }
    return true;
}

/* Splits C into a tm x tn grid of thread regions (tm * tn = nt) that
 * minimises the largest region in tiles. Every thread packs the whole of
 * the side it shares: A (m x k) when n is split, B (k x n) when m is; ties
 * go to splitting the longer side, so the smaller operand is the one packed
 * twice. */
static void split_grid(int64_t m, int64_t n, int64_t mt, int64_t ntl, int nt, int *tm, int *tn)
{
    int64_t best = -1;
    const bool prefer_n = n >= m;
    for (int a = 1; a <= nt; a++) {
        if (nt % a) continue;
        int b = nt / a;
        int64_t cost = cdiv(mt, a) * cdiv(ntl, b);
        if (best < 0 || cost < best || (cost == best && (prefer_n ? b > *tn : a > *tm))) {
            best = cost;
            *tm = a;
            *tn = b;
        }
    }
}

static int64_t part(int64_t tiles, int parts, int idx, int unit, int64_t total)
{
    int64_t t = tiles * idx / parts * unit;
    return t < total ? t : total;
}

static mp_status gemm_run(int64_t m, int64_t n, int64_t kk, const gemm_operand *a,
                          const gemm_operand *b, const gemm_epilogue *e)
{
    atomic_int *const nonfinite = e->nonfinite;
    gemm_plan pl;
    /* alpha == 0 reads neither A nor B, as in BLAS. */
    const int64_t k = e->alpha == 0.0f ? 0 : kk;
    pl.im = choose_impl(a->type, b->type, k);
    pl.m = m;
    pl.n = n;
    pl.k = k;
    pl.a = *a;
    pl.b = *b;
    pl.e = *e;
    pl.nonfinite = nonfinite;
    pl.e.nonfinite = pl.im->epilogue_checks ? nonfinite : NULL;
    if (mp_gemm_rows_take(pl.im, m, n, k, a, b, &pl.e))
        return mp_gemm_rows(pl.im, m, n, k, a, b, &pl.e, nonfinite);
    if (mp_gemm_cols_take(pl.im, m, n, k, a, b, &pl.e))
        return mp_gemm_cols(pl.im, m, n, k, a, b, &pl.e);
    /* A thin C (n well below the kernel's NR) wastes most of each register
     * tile; as C^T = op(B)^T op(A)^T the thin side meets the short MR, where
     * it fills more of the tiles it needs (n = 10: 10 of 16 columns on the
     * AVX2 kernel, 10 of 12 rows after the swap), and A is laid out along m
     * (it then packs as B by plain copies; an A laid out along k would need
     * a transposing pack as B where it is read in place or packed as cheaply
     * as A: measured slower). An A the kernel reads in place stays: the swap
     * would pack all of it, transposed, as B for the few products each
     * element takes part in (fc3 forward, 1024x10x4096 f32 on Zen 4: 23 ->
     * 60 GFLOP/s on one thread unswapped). Each element is the same sum in
     * the same order either way. A kernel whose A panels lie row by row
     * (pack_a: AMX) packs an A laid along k by plain copies and would pack
     * it as B with a transpose: there only an A laid along m swaps (fc3 forward, 1024x10x4096 bf16,
     * 2 threads, Intel Xeon family 6 model 167: 565 -> 406 us unswapped; its weight gradient, A =
     * x^T, 498 swapped against 968). */
    const int64_t MR0 = pl.im->mr, NR0 = pl.im->nr;
    const bool fuller =
        n < NR0 && cdiv(n, MR0) * MR0 < NR0 && pl.a.sw == 1 && !pl.a.gather && !pl.b.gather;
    if (k > 0 && (!pl.im->pack_a || pl.a.sd != 1) && m >= 4 * n &&
        ((n * 2 <= NR0 && !a_in_place(pl.im, &pl.a, k, n)) || fuller)) {
        gemm_operand t = pl.a;
        pl.a = pl.b;
        pl.b = t;
        pl.m = n;
        pl.n = m;
        pl.e.trans = true;
    }
    pl.in_place = a_in_place(pl.im, &pl.a, k, pl.n);
    pl.kernel_a =
        pl.a.type == MP_BF16 && pl.im->fmt == GEMM_FMT_F32 ? pl.im->kernel_a_bf16 : pl.im->kernel_a;
    /* kernel_ab reads A in float32, packed or in place. (A bfloat16 A read
     * in place also keeps a thin C from the swap above: AMD EPYC, Zen 3,
     * bf16 1024x8x4096 26-36 -> 54-55 GFLOP/s, 1024x4x4096 15-21 -> 26-28,
     * 2 threads, medians of 31 calls, two runs.) */
    pl.b_in_place = b_in_place(pl.im, &pl.b, pl.m) && !(pl.in_place && pl.a.type != MP_F32);
    pl.kernel_ab = pl.b.type == MP_BF16 ? pl.im->kernel_ab_bf16 : pl.im->kernel_ab;
    mp_gemm_blocks(pl.im, k, pl.n, pl.in_place, pl.b_in_place, &pl.kcb, &pl.nc);

    const int MR = pl.im->mr, NR = pl.im->nr;
    const int64_t mt = cdiv(pl.m, MR), ntl = cdiv(pl.n, NR);
    int nt = mp_num_threads();
    double flops = 2.0 * (double)pl.m * (double)pl.n * (double)(k > 0 ? k : 1);
    if (flops < MP_GEMM_FORK_FLOPS) nt = 1;
    if ((int64_t)nt > mt * ntl) nt = (int)(mt * ntl);
    int tm = 1, tn = 1;
    /* A gathered operand (a convolution's patches) costs more to pack than
     * its products: split the other side's range so that no two threads
     * gather the same panels, unless that leaves a thread without work. */
    if (pl.b.gather && !pl.a.gather && ntl >= nt)
        tn = nt;
    else if (pl.a.gather && !pl.b.gather && mt >= nt)
        tm = nt;
    else
        split_grid(pl.m, pl.n, mt, ntl, nt, &tm, &tn);

    bool ok = true;
    /* Shared A packing where every thread has the same rows and some n, and
     * A is packed from strides (a gathered one can fail alone; one read in
     * place needs no packing). The row block is the one the widest thread
     * would choose, so that all run the same blocks. */
    gemm_share share = {.nt = nt};
    atomic_init(&share.p, NULL);
    atomic_init(&share.failed, 0);
    const bool plain = nt > 1 && !pl.a.gather && !pl.b.gather && k > 0;
    bool sharing = plain && tm == 1 && ntl >= nt && !pl.in_place;
    if (sharing)
        share.mc = mp_gemm_row_block(pl.im, pl.m, cdiv(ntl, nt) * NR, pl.kcb, pl.kcb < k,
                                     mp_gemm_accumulates_in_c(&pl.e), true);
    /* Shared B packing, the mirror image: every thread has all of n and
     * some rows, B packed from strides (read in place, it needs none). Each
     * runs the row blocks of the tallest region. 2 threads, Zen 5, medians
     * of 21-31 calls alternating with unshared packing in one process, the
     * same bits: 1024x784x4096 f32 (fc1 dX) 18.6 -> 17.9 and 18.2 -> 17.6
     * ms; gpt_mini's bf16 forward and input-gradient products (4096 rows)
     * x0.976-0.997; its MLP weight gradient (1024x256x4096, packing
     * dominated by A's) and bf16 fc1 dX unchanged. */
    if (plain && !sharing && tn == 1 && mt >= nt && !pl.b_in_place) {
        int64_t rows = 0; /* the tallest region's */
        for (int ti = 0; ti < tm; ti++)
            rows = max64(rows, part(mt, tm, ti + 1, MR, pl.m) - part(mt, tm, ti, MR, pl.m));
        share.b = sharing = true;
        share.mc = mp_gemm_row_block(pl.im, rows, ntl * NR, pl.kcb, pl.kcb < k,
                                     mp_gemm_accumulates_in_c(&pl.e), !pl.in_place);
        share.nblk = cdiv(rows, share.mc);
    }
    if (nt <= 1) {
        ok = run_region(&pl, 0, pl.m, 0, pl.n, NULL, 0);
    } else {
#pragma omp parallel num_threads(nt) reduction(&& : ok)
        {
#ifdef _OPENMP
            const int t = omp_get_thread_num(), team = omp_get_num_threads();
#else
            const int t = 0, team = 1;
#endif
            /* A team smaller than asked for (a call from inside a parallel
             * region, a thread limit) runs the grid's regions in turn,
             * without sharing. */
            gemm_share *sh = sharing && team == nt ? &share : NULL;
            for (int c = t; c < nt; c += team) {
                const int ti = c / tn, tj = c % tn;
                ok = run_region(&pl, part(mt, tm, ti, MR, pl.m), part(mt, tm, ti + 1, MR, pl.m),
                                part(ntl, tn, tj, NR, pl.n), part(ntl, tn, tj + 1, NR, pl.n), sh,
                                c) &&
                     ok;
            }
        }
    }
    if (!ok) return mp_set_error(MP_ERR_NOMEM, "mp_gemm: cannot allocate packing buffers");
    return MP_OK;
}

mp_status mp_gemm_run(int64_t m, int64_t n, int64_t kk, const gemm_operand *a,
                      const gemm_operand *b, const gemm_epilogue *e)
{
    if (m == 0 || n == 0) return MP_OK;
    double t0 = mp_prof_leaf_enter();
    mp_status s = gemm_run(m, n, kk, a, b, e);
    mp_prof_leaf_leave(MP_PROF_GEMM, t0);
    return s;
}
