/* gemm_internal.h - the contract between the GEMM driver (gemm.c) and the
 * per-ISA microkernel files: packed panel layouts, the microkernel and packer
 * signatures, and the epilogue description. */
#ifndef MP_GEMM_INTERNAL_H
#define MP_GEMM_INTERNAL_H

#include <stdatomic.h>
#include <stdio.h>

#include "kernels/activation.h"
#include "kernels/conv.h"

/* Packed formats. Both operands are packed into panels of W rows (W = MR for
 * A, NR for B) along K, zero-padded to full width:
 *   GEMM_FMT_F32:  panel[k][w] as float;
 *   GEMM_FMT_BF16: panel[k/2][w][k%2] as bf16, K padded to even, so that one
 *                  32-bit lane holds the pair vdpbf16ps multiplies;
 *   GEMM_FMT_AMX:  B's panels as GEMM_FMT_BF16 (an AMX B tile's rows are
 *                  such pairs), A's row by row, panel[w][k] (an A tile's
 *                  rows run along k), K padded to a multiple of 32 (a
 *                  tile's depth) with zeros. */
typedef enum { GEMM_FMT_F32 = 0, GEMM_FMT_BF16 = 1, GEMM_FMT_AMX = 2 } gemm_fmt;

/* Bytes of one packed element in format f, and the packed depth of kb
 * (even for bf16, whose lanes hold pairs along k; whole tiles for AMX). */
static inline int64_t mp_gemm_fmt_bytes(gemm_fmt f) { return f == GEMM_FMT_F32 ? 4 : 2; }
static inline int64_t mp_gemm_kpad(gemm_fmt f, int64_t kb)
{
    return f == GEMM_FMT_BF16 ? kb + (kb & 1) : f == GEMM_FMT_AMX ? (kb + 31) / 32 * 32 : kb;
}

/* Whether a panel in format f lies depth after depth, each W wide, so that
 * a run of depths packs where its rows lie in the panel (not AMX's A rows
 * or B sub-panels). */
static inline bool mp_gemm_fmt_by_depth(gemm_fmt f) { return f != GEMM_FMT_AMX; }

/* Below this many flops a fork/join of the threads costs more than it
 * saves: the GEMM driver and the direct convolution kernels run such work
 * on the calling thread. */
#define MP_GEMM_FORK_FLOPS 4e6

/* The driver's and the kernels' integer helpers. */
static inline int64_t cdiv(int64_t x, int64_t y) { return (x + y - 1) / y; }
static inline int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }
static inline int64_t max64(int64_t x, int64_t y) { return x > y ? x : y; }

/* Implicit operands (gemm_gather.c): element (w, d) is found from a
 * convolution's geometry instead of strides; positions outside the image
 * read as 0. */
typedef enum {
    GATHER_PATCHES,    /* x's patches: width N*OH*OW, depth KH*KW*C */
    GATHER_PATCHES_T,  /* the same transposed: width KH*KW*C, depth N*OH*OW */
    GATHER_DY_PATCHES, /* dy at the outputs each input pixel fed: width N*H*W, depth KH*KW*O */
    GATHER_KERNEL_T,   /* w [kh, kw, c, o] seen as width C, depth KH*KW*O */
} gemm_gather_view;

typedef struct {
    gemm_gather_view view;
    const mp_conv_geom *g;
} gemm_gather;

/* One operand seen as a (width x depth) matrix: element (w, d) lives at
 * base + (w * sw + d * sd) elements, or where `gather` (when not NULL) says.
 * A: width = m, depth = k; B: width = n. */
typedef struct {
    const void *base;
    mp_dtype type;
    int64_t sw, sd;
    const gemm_gather *gather;
} gemm_operand;

/* Packs width rows [w0, w0+nw) and depth [d0, d0+nd) of op into
 * ceil(nw/W) panels of W x kpad (kpad = nd, rounded up to even for bf16). */
typedef void (*gemm_pack_fn)(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0, int64_t nd,
                             int W, void *dst);

/* c[MR x NR] (row stride ldc, floats) = (acc ? c : 0) + Apanel * Bpanel over
 * kc depth (kc already padded for the format). */
typedef void (*gemm_kernel_fn)(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                               int acc);

/* The microkernel on A read where it lies, in the kernel's own format
 * (float32, or bf16 for the bf16 format): element (i, k) of the MR-row
 * panel at a[i * si + k * sk], counted in elements, one of si, sk being 1
 * (bf16: sk = 1, so that the pairs along k lie in 32 bits as the packed
 * panel has them); writes the first 16 * nv columns of the tile (nv = NR /
 * 16: all of it). Spares packing A when it is already in the format with a
 * unit stride. */
typedef void (*gemm_kernel_a_fn)(int64_t kc, const void *a, int64_t si, int64_t sk, const void *b,
                                 float *c, int64_t ldc, int acc, int nv);

/* kernel_a with B read where it lies too (float32 format): row k of the
 * NR-wide panel at b + k * sb floats, its 16 * nv columns all inside B.
 * For a product with few rows of A (a thin C computed transposed, a small
 * batch), whose B would be packed for one or two panels' use. */
typedef void (*gemm_kernel_ab_fn)(int64_t kc, const void *a, int64_t si, int64_t sk, const void *b,
                                  int64_t sb, float *c, int64_t ldc, int acc, int nv);

/* What happens to a finished f32 tile on its way to C. */
typedef struct {
    float alpha, beta;
    void *c;
    mp_dtype c_type;
    int64_t ldc;
    const float *bias;
    mp_activation act;
    /* The driver computed C^T (a thin C is done as B^T A^T): tile (i, j) is
     * C(j, i) and the bias follows i. */
    bool trans;
    /* NULL, or set to 1 when a value written to a float32 C is NaN or
     * +-inf (mp_gemm_args.c_nonfinite): by the epilogue as it stores where
     * the impl's epilogue checks (gemm_impl.epilogue_checks), else by the
     * driver reading the tile back. */
    atomic_int *nonfinite;
} gemm_epilogue;

/* Writes rows [i0, i0+mr) x cols [j0, j0+nr) of C from the f32 tile t. */
typedef void (*gemm_epilogue_fn)(const gemm_epilogue *e, const float *t, int64_t ldt, int64_t i0,
                                 int64_t j0, int64_t mr, int64_t nr);

typedef struct gemm_impl_s {
    gemm_fmt fmt;
    int mr, nr;
    int64_t kc, mc, nc; /* cache blocks: kc in depth units, mc/nc multiples of mr/nr */
    /* Optional (0: none): on a CPU whose L1d holds an mr x kc_l1 A
     * micro-panel in two thirds of its size, the depth block is kc_l1
     * instead of kc and the packed B block is kept within half of L2
     * (nc lowered to fit): the A micro-panel then stays in L1 while the
     * block's B panels pass, and the B block stays in L2. A packed A block
     * is then capped at twice L2 (mp_gemm_row_block): it is read again for
     * every B block. */
    int64_t kc_l1;
    /* Optional: the packed B block is kept within half of L2 (nc lowered
     * to fit) whatever the depth block: its panels are read again for
     * every A panel, and from L3 they cannot feed the kernel (AMX). */
    bool b_block_l2;
    /* Optional (0: none): the depth block where B is read in place
     * (kernel_ab: a C of at most two panels of rows), so that the B
     * panel's rows the first A panel brought into L1 are still there for
     * the second. */
    int64_t kc_b;
    gemm_kernel_fn kernel;
    /* Optional: narrow[v] computes only the first 16 * (v + 1) columns of a
     * tile (reading the same NR-wide B panel), for panels that are mostly
     * padding; NULL: the full kernel serves. */
    gemm_kernel_fn narrow[2];
    /* Optional: half[v] computes only the first mr / 2 rows of the tile,
     * over 16, 32 or (v = 2) all of its columns, for a packed A panel of
     * at most that many rows (a thin C computed transposed: its few rows
     * in a tall tile); NULL: the kernels above serve. */
    gemm_kernel_fn half[3];
    gemm_kernel_a_fn kernel_a;   /* optional */
    gemm_kernel_ab_fn kernel_ab; /* optional, float32 format only */
    /* Optional, float32 format only: kernel_a on a bfloat16 A (sk = 1, any
     * kc), each element widened in the kernel, for a B at most two panels
     * wide, where each A element meets so few B columns that widening it
     * while packing costs more than its products. */
    gemm_kernel_a_fn kernel_a_bf16;
    /* Optional, float32 format only: kernel_ab on a bfloat16 B (its rows'
     * 16 elements widened in the kernel), for the products kernel_ab takes
     * (a C of at most two panels of rows): a batch of one through a layer
     * whose weights are bfloat16 then reads them once, as they lie. */
    gemm_kernel_ab_fn kernel_ab_bf16;
    /* Optional: one row of C for a product with few rows (gemm_rows.c):
     * c[0..n) = the sum over k < kc, in order, of a[k] times B's row k
     * (b + k * sb elements, read where they lie), each element the bits the
     * tile kernels give it, none of the work spent on a tile's padding
     * rows. A's row is in the impl's format: float32 (B of a type
     * mp_gemm_widens, one FMA per product from zero), bfloat16 pairs with
     * a zero past an odd kc (B of a type mp_gemm_bf16_like, one vdpbf16ps
     * per pair), or for AMX bfloat16 with zeros to whole tiles of depth
     * (one tdpbf16ps per tile). */
    void (*kernel_row)(int64_t kc, const void *a, const void *b, int64_t sb, mp_dtype bt, float *c,
                       int64_t n);
    int row_max; /* the most rows of C kernel_row takes: past them the tiles are faster */
    /* Optional: 16 rows of a C of n <= MP_GEMM_COLS_MAX columns
     * (gemm_cols.c): t[i * ldt + j] for i < rows (at most 16), j < n, from
     * A's rows where they lie (row i at a + i * lda elements of type at,
     * along k; any type mp_gemm_widens) and B packed as kc rows of
     * MP_GEMM_COLS_LDB floats; each element the bits the tiles give it. */
    void (*kernel_cols)(int64_t kc, const void *a, int64_t lda, mp_dtype at, int rows,
                        const float *b, int n, float *t, int64_t ldt);
    gemm_pack_fn pack; /* for both operands */
    /* Optional: A's packer where A's panels are laid out unlike B's
     * (GEMM_FMT_AMX); NULL: pack serves both. */
    gemm_pack_fn pack_a;
    /* Optional (0: nr): B's panels are nr / sub_nr panels of sub_nr
     * columns one after the other (AMX: a kernel's 32-column blocks, each
     * contiguous), a last panel's missing ones zero. */
    int sub_nr;
    gemm_epilogue_fn epilogue;
    /* whether the epilogue reports non-finite values through e->nonfinite
     * as it writes them; else the driver reads each tile back */
    bool epilogue_checks;
    /* Optional: whether any of rows x cols floats at c (rows ldc apart) is
     * NaN or +-inf; NULL: the driver's portable loop serves. */
    bool (*nonfinite)(const float *c, int64_t ldc, int64_t rows, int64_t cols);
    /* Optional: whether the kernel streams on this CPU: the driver packs A
     * rather than reading it in place unless B is narrow (narrow_panels)
     * (and the AVX-512 kernel asks for its packed panels' rows ahead):
     * timed once per process on the first call, thread-safe (gemm_ways.h).
     * The bits are the same either way. NULL: never. streams_report prints
     * the timing for mixprec info. */
    bool (*streams)(void);
    void (*streams_report)(FILE *out);
    /* Optional: how many panels wide B may be for an A laid along rows
     * (unit depth stride) to be read in place whatever streams says (0:
     * two). Each packed A element serves one kernel call per B panel; over
     * few panels the packing costs more than the packed panel saves. */
    int narrow_panels;
    /* Optional (0: none): a product less deep than shallow_k goes to the
     * impl `shallow` where the measured choice (not MP_ISA) took this one:
     * the AMX tiles pad the depth to 32, and a product of depth 10 (fc3's
     * input gradient, 1024x4096x10: each element one short sum) is the
     * store of C, which the FMA kernel does from its registers. */
    int64_t shallow_k;
    const struct gemm_impl_s *shallow;
} gemm_impl;

/* Portable pieces (gemm_scalar.c): widen any dtype to f32 / bf16 bits. */
float mp_gemm_load_f32(const void *base, mp_dtype t, int64_t idx);
uint16_t mp_gemm_load_bf16(const void *base, mp_dtype t, int64_t idx);
void mp_gemm_pack_generic(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0, int64_t nd,
                          int W, gemm_fmt fmt, void *dst);
void mp_gemm_epilogue_scalar(const gemm_epilogue *e, const float *t, int64_t ldt, int64_t i0,
                             int64_t j0, int64_t mr, int64_t nr);
/* A tile of C^T (e->trans: tile row i is C's column i0 + i, which the bias
 * follows) written as the plain tile of C it is: transposed into tt (nr
 * rows of w floats, w >= mr, zeros past mr, which a full-width load may
 * read and no store writes), then plain_epilogue on that. The vector
 * epilogues' way to C^T tiles. */
void mp_gemm_epilogue_transposed(const gemm_epilogue *e, const float *t, int64_t ldt, int64_t i0,
                                 int64_t j0, int64_t mr, int64_t nr, float *tt, int w,
                                 gemm_epilogue_fn plain_epilogue);
#if MP_X86
/* The AVX2 path's vector epilogue (gemm_epilogue_avx2.c), tiles up to 16
 * wide. */
void mp_gemm_epilogue_avx2(const gemm_epilogue *e, const float *t, int64_t ldt, int64_t i0,
                           int64_t j0, int64_t mr, int64_t nr);
#endif
/* Packs a gathered operand like mp_gemm_pack_generic packs a strided one;
 * false if out of memory. */
bool mp_gemm_pack_gather(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0, int64_t nd,
                         int W, gemm_fmt fmt, void *dst);
/* Whether any of the n floats at p is NaN or +-inf (gemm.c). */
bool mp_gemm_any_nonfinite(const float *p, int64_t n);
/* Whether a kernel may sum straight into C: float32 C = A B exactly, no
 * epilogue to apply (gemm.c). */
bool mp_gemm_accumulates_in_c(const gemm_epilogue *e);
/* The types the x86 packers and row kernel widen in registers
 * (gemm_simd.h's mp_widen8): every floating format. */
static inline bool mp_gemm_widens(mp_dtype t) { return (unsigned)t < MP_DTYPE_COUNT; }
/* The types the bfloat16 format holds exactly, which the vdpbf16ps path
 * takes (bfloat16 and both float8s). */
static inline bool mp_gemm_bf16_like(mp_dtype t)
{
    return t == MP_BF16 || t == MP_F8E4M3 || t == MP_F8E5M2;
}
/* How many of B's rows ahead a kernel reading them in place asks for
 * (they lie sbb bytes apart, a stride the hardware prefetcher may not
 * follow), at most `most`: as many as stay in L1 until they are read. An
 * x86 L1d is 64 sets of 64-byte lines (a 4 KiB page of them, so its ways
 * are its size / 4 KiB): rows sbb apart fall into only 4096 / gcd(sbb,
 * 4096) of them (all 64 where that gcd is under a line), and a stride of
 * 4 KiB puts every row's line of a column into one set, 8 rows on an 8-way L1, past which the lines
 * asked for evict those not yet read. A quarter of the rows that fit. AMD EPYC (Zen 3), 2 threads,
 * medians of 101-201 calls alternating in one process, GFLOP/s asking 16 rows ahead / none / this
 * rule: the row kernel (gemm_rows.c), float32 1x1024x256 (4 KiB apart, 8 fit) 25.7 / 35.2 / 34.1,
 * 1x2048x256 (8 KiB) 25.8 / 35.9 / 35.9, 1x512x512 (2 KiB, 16 fit) 30.2 / 33.5 / 39.0, 1x768x256 (3
 * KiB, 32 fit) 35.2 / 35.5 / 42.1, 1x256x1024 (1 KiB, 32 fit) 37.6 / 33.6 / 38.7, bfloat16
 * 1x1024x256 (2 KiB) 45.6 / 54.5 / 59.3, 2x256x1024 (512 B, 64 fit: 16 ahead) 67.8 / 47.9; the AVX2
 * tiles reading B in place (a C of at most 12 rows), 16 ahead / the rule: float32 6x1024x256 33.5
 * / 45.7, 12x1024x256 60.0 / 84.4, 12x512x512 67.1 / 79.4, 8x768x256 42.0 / 47.7, 6x256x1024 48.7
 * / 53.8, bfloat16 6x1024x256 64.4 / 80.3, 12x1024x256 106.8 / 128.2, 6x4096x1024 74.3 / 90.2. */
static inline int mp_gemm_rows_ahead(int64_t sbb, int most)
{
    const int64_t ways = (int64_t)(mp_cpu_cache_bytes(1) / 4096);
    const int64_t g = sbb % 4096 ? sbb & -sbb : 4096;                  /* gcd(sbb, 4096) */
    const int64_t sets = 4096 / (g > 64 ? g : 64);                     /* the rows' lines' sets */
    const int64_t fit = (ways < 4 ? 8 : ways > 32 ? 32 : ways) * sets; /* unknown: 8 ways */
    return (int)(fit / 4 < most ? fit / 4 : most);
}
/* A C of few rows (gemm_rows.c): whether mp_gemm_rows takes the product
 * on im, and the product itself (e->nonfinite as gemm_epilogue says;
 * nonfinite: the caller's flag, for an impl whose epilogue does not check). */
bool mp_gemm_rows_take(const gemm_impl *im, int64_t m, int64_t n, int64_t k, const gemm_operand *a,
                       const gemm_operand *b, const gemm_epilogue *e);
mp_status mp_gemm_rows(const gemm_impl *im, int64_t m, int64_t n, int64_t k, const gemm_operand *a,
                       const gemm_operand *b, const gemm_epilogue *e, atomic_int *nonfinite);
/* A C of few columns (gemm_cols.c), the same way, on an impl whose
 * epilogue reports non-finite values itself (gemm_impl.epilogue_checks). */
#define MP_GEMM_COLS_MAX 12
#define MP_GEMM_COLS_LDB 16 /* B packed for it: rows of 16 floats, zeros past n */
bool mp_gemm_cols_take(const gemm_impl *im, int64_t m, int64_t n, int64_t k, const gemm_operand *a,
                       const gemm_operand *b, const gemm_epilogue *e);
mp_status mp_gemm_cols(const gemm_impl *im, int64_t m, int64_t n, int64_t k, const gemm_operand *a,
                       const gemm_operand *b, const gemm_epilogue *e);
/* The driver on prepared operands: C[m x n] = epilogue(A B) with A width m,
 * B width n, both depth k (k == 0 or alpha == 0: A and B are not read);
 * e->nonfinite as gemm_epilogue says. Timed as the profile's GEMM leaf. */
mp_status mp_gemm_run(int64_t m, int64_t n, int64_t k, const gemm_operand *a, const gemm_operand *b,
                      const gemm_epilogue *e);
extern const gemm_impl mp_gemm_scalar_impl;

#if MP_X86
extern const gemm_impl mp_gemm_avx2_impl;       /* f32 FMA, 256-bit */
extern const gemm_impl mp_gemm_avx512_impl;     /* f32 FMA */
extern const gemm_impl mp_gemm_avx512bf16_impl; /* vdpbf16ps */
extern const gemm_impl mp_gemm_amx_impl;        /* AMX tiles, tdpbf16ps */
/* The vdpbf16ps path's packer (gemm_avx512bf16.c) into panels kpd pairs
 * deep (kpd >= ceil(nd / 2); the pairs past nd zero): GEMM_FMT_BF16 at
 * kpd = ceil(nd / 2), and B's panels of GEMM_FMT_AMX. */
void mp_gemm_pack_bf16_avx512(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0,
                              int64_t nd, int W, int64_t kpd, void *dst);
/* The AVX2 path's register tile (gemm_avx2.c) and the packer of the x86
 * float32 format (gemm_pack_avx2.c: gemm_impl.pack of the AVX2 and AVX-512
 * FMA paths, specialised for W of MP_GEMM_AVX2_MR or _NR). */
#define MP_GEMM_AVX2_MR 6
#define MP_GEMM_AVX2_NR 16
void mp_gemm_pack_avx2(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0, int64_t nd,
                       int W, void *dst);
/* The AVX2 row kernel (gemm_row_avx2.c), and the most rows of C it takes. */
void mp_gemm_row_avx2(int64_t kc, const void *a, const void *b, int64_t sb, mp_dtype bt, float *c,
                      int64_t n);
#define MP_GEMM_ROW_MAX_AVX2 2
/* The AVX-512 float32 row kernel (gemm_row_avx512.c: the same sums on
 * 512-bit vectors) and the vdpbf16ps one (gemm_row_avx512bf16.c). */
void mp_gemm_row_avx512(int64_t kc, const void *a, const void *b, int64_t sb, mp_dtype bt, float *c,
                        int64_t n);
void mp_gemm_row_avx512bf16(int64_t kc, const void *a, const void *b, int64_t sb, mp_dtype bt,
                            float *c, int64_t n);
/* The AVX-512 float32 column kernel (gemm_col_avx512.c). */
void mp_gemm_col_avx512(int64_t kc, const void *a, int64_t lda, mp_dtype at, int rows,
                        const float *b, int n, float *t, int64_t ldt);
/* Tests: 0 or 1 forces mp_gemm_avx512_impl's streaming, or
 * mp_gemm_avx2_impl's packing of A, off or on; -1: timed again on the next
 * call. */
void mp_gemm_avx512_stream_force(int on);
void mp_gemm_avx2_pack_force(int on);
#endif

/* Measured kernel choice (gemm_dispatch.c). */
/* The timing (gemm_dispatch_timing.c): per candidate the best of
 * MP_DISPATCH_TIMING_REPS runs of N^3 (values in [-1, 1) of the pair's
 * types) through the driver with `threads` threads into team (when threads
 * > 1), and of N1^3 on this thread alone into one, in GFLOP/s rounded as
 * the cache keeps them; false if the runs could not get memory. */
/* (N1 a multiple of every kernel's MR and NR: 6, 8, 16, 32, 48, 128) */
enum { MP_DISPATCH_TIMING_N = 384, MP_DISPATCH_TIMING_N1 = 384, MP_DISPATCH_TIMING_REPS = 5 };
bool mp_gemm_dispatch_time(const gemm_impl *const *cand, int n, mp_dtype at, mp_dtype bt,
                           int threads, double *team, double *one);
/* The kernel for bf16-like operands of types at x bt on an unforced
 * AVX512_BF16 path: the faster candidate on that pair, timed (or read from
 * the cache) on the pair's first call in the process; thread-safe, callable
 * inside OpenMP regions. */
const gemm_impl *mp_gemm_dispatch_bf16(mp_dtype at, mp_dtype bt);
/* The candidates for those operands this CPU supports, in order of
 * preference (FMA first); returns how many (at most max). */
int mp_gemm_dispatch_candidates(const gemm_impl **out, int max);
/* The kernel the driver must use on this thread instead of its own choice
 * (set during mp_gemm_ex_on); NULL otherwise. */
const gemm_impl *mp_gemm_dispatch_override(void);
/* mp_gemm_ex on kernel im, whatever the driver would choose (timing, tests). */
mp_status mp_gemm_ex_on(const gemm_impl *im, const mp_gemm_args *g);
/* Data parallel: the kernel chosen for every bf16-like pair (timed or read
 * from the cache now where not chosen yet) as candidate indices into
 * out[0..n), n returned; 0 on a forced path (nothing to agree). A rank that
 * adopts them (n as returned on rank 0) takes them instead of its own, so
 * that every rank multiplies alike; an index past its own candidates (a
 * different CPU) leaves that pair to its own choice. */
int mp_gemm_dispatch_choices(int8_t *out, int max);
void mp_gemm_dispatch_adopt(const int8_t *in, int n);
/* Tests: forget the process's choice; the next use reads the cache or times. */
void mp_gemm_dispatch_reset(void);
/* Tests: GFLOP/s that replace the timing, per round 2 x candidates of them
 * (with the caller's threads, then on one thread), `rounds` rounds, the
 * last repeated for later ones (NULL: time again). */
void mp_gemm_dispatch_test_rates(const double *gflops, int rounds);
/* Tests: n candidates that replace this CPU's (0: this CPU's again), for
 * the choice's logic on a CPU with a single kernel for bf16 operands; the
 * driver then asks the choice for such operands on any path. */
void mp_gemm_dispatch_test_candidates(const gemm_impl *const *list, int n);
bool mp_gemm_dispatch_testing(void);
/* Cache blocking (gemm_blocks.c). The depth block (*kcb) and column block
 * (*nc) the driver uses on im for depth k and n columns of C on this CPU,
 * A and B each read in place or packed. */
void mp_gemm_blocks(const gemm_impl *im, int64_t k, int64_t n, bool a_in_place, bool b_in_place,
                    int64_t *kcb, int64_t *nc);
/* The rows of a block of A for `rows` rows whose partial sums span nr_pad
 * columns at depth block kcb; multi: several depth blocks; direct: sums
 * kept in C; a_packed: A is packed (not read in place). */
int64_t mp_gemm_row_block(const gemm_impl *im, int64_t rows, int64_t nr_pad, int64_t kcb,
                          bool multi, bool direct, bool a_packed);
/* Whether a thread whose region has `rows` rows in blocks of mc packs its
 * whole B range (nr_pad columns, kpad deep) once for all row blocks,
 * rather than each B block again for each. */
bool mp_gemm_b_once(const gemm_impl *im, int64_t rows, int64_t mc, int64_t nr_pad, int64_t kpad,
                    bool multi);
/* The kernel the driver picks for an input-type pair (gemm.c), for a
 * product deep enough for any (gemm_impl.shallow_k). */
const gemm_impl *mp_gemm_impl_for(mp_dtype at, mp_dtype bt);

#endif
