/* conv_direct_internal.h - what the direct convolution's files share: a
 * convolution as the kernels see it (conv_spec), the padded image, and a
 * family of microkernels (conv_family), one per ISA and operand type:
 *   conv_direct_avx512.c      float32 FMA on AVX-512 (inputs widened exactly)
 *   conv_direct_avx512bf16.c  vdpbf16ps on bfloat16 pairs
 *   conv_direct_avx2.c        float32 FMA on AVX2
 * The drivers (conv_direct.c: forward and data gradient;
 * conv_direct_filter.c: filter gradient) are written once over a family. */
#ifndef MP_CONV_DIRECT_INTERNAL_H
#define MP_CONV_DIRECT_INTERNAL_H

#include "kernels/conv_direct.h"
#include "kernels/gemm_internal.h"

#if MP_X86

/* Scratch slots (see mp_scratch): per thread the padded image and a
 * widened row; on the calling thread the packed weights and tap offsets, and
 * the filter gradient's partial sums. */
enum { SLOT_IMAGE = 9, SLOT_ROW = 10, SLOT_W = 11, SLOT_TAPS = 12, SLOT_PART = 13 };

/* A forward convolution as the kernels see it: source image [n, h, w, c],
 * output [n, oh, ow, o], kernel kh x kw with strides sh, sw; padding pt, pl
 * (negative: the window starts inside the image). */
typedef struct {
    const void *x;
    mp_dtype xt;
    int64_t n, h, w, c, oh, ow, o, kh, kw, sh, sw, pt, pl;
    /* where output pixel (n, y, z) goes: pixel (y0 + y*ys, z0 + z*zs) of an
     * [n, yh, yw, o] tensor (a strided data gradient's phase; else the
     * output itself: yh = oh, yw = ow, y0 = z0 = 0, ys = zs = 1) */
    int64_t yh, yw, y0, z0, ys, zs;
} conv_spec;

/* A forward microkernel: t[MR][NV*16] (row stride ldt) = the sum over ntap
 * taps and steps channel steps (one channel in float32, a pair in
 * bfloat16) of x[tap][i][c] * w[tap][c][:], x[tap] at x + xoff[tap]
 * (elements of the padded image), pixel i SW*16 elements after pixel 0;
 * w the packed weights, [tap][step][NV*16 (x2 in bfloat16)]. */
typedef void (*conv_fwd_fn)(int64_t ntap, int steps, const int64_t *xoff, const void *x,
                            const void *w, float *t, int64_t ldt);

/* A filter-gradient microkernel: p[r][j] (row stride ldp; first: =, else
 * +=) gets the sum over oh rows of np steps of x[step][r] * dy[step][j],
 * r < CR, j < NV*16. float32: a step is an output pixel, x of pixel (y, z)
 * at x + y*xrs + z*SW*16, dy at dy + y*dyrs + z*dps. bfloat16: a step is a
 * pair of a row's consecutive pixels, each operand element a 32-bit lane
 * of two (see conv_direct_avx512bf16.c), x of pair (y, z) at x + y*xrs +
 * z*2*SW*16 and dy at dy + y*dyrs + z*dps, in lanes. */
typedef void (*conv_filt_fn)(int64_t oh, int64_t np, const void *x, int64_t xrs, const void *dy,
                             int64_t dyrs, int64_t dps, float *p, int64_t ldp, int first);

/* Image n of s->x as buf[c/16][hp][wp][16] with buf row r, column q
 * holding source pixel (r - pt, q - pl), zero outside the image and in the
 * channels past c, in the family's element type (row: w*c floats of
 * scratch for a widened source row). Rows and columns no tap reads (a
 * stride above the kernel's size) are left as they are. */
typedef void (*conv_pad_fn)(const conv_spec *s, int64_t n, int64_t hp, int64_t wp, float *row,
                            void *buf);
/* The padding in bfloat16 (s->xt must be MP_BF16; conv_direct_avx512.c). */
void mp_conv_pad_bf16(const conv_spec *s, int64_t n, int64_t hp, int64_t wp, float *row, void *buf);

/* A family of kernels. Output channels go in chunks of nvmax vectors of 16
 * (the last may be narrower); a forward tile is mr <= mr_max[nv - 1]
 * consecutive output pixels of a row. */
typedef struct {
    const char *name;
    bool bf16; /* image and weights in bfloat16 pairs; else float32 */
    int nvmax;
    int mr_max[4];
    const conv_fwd_fn *fwd[2][4]; /* [stride - 1][nv - 1][mr - 1] */
    /* [stride - 1][channels below 16][nv - 1], CR = filt_cr[nv - 1] (1
     * for channels below 16); NULL: the family has no filter kernels */
    conv_filt_fn filt[2][2][4];
    int filt_cr[4];
    conv_pad_fn pad;
    gemm_epilogue_fn epilogue;
} conv_family;

extern const conv_family mp_conv_avx512, mp_conv_avx512bf16, mp_conv_avx2;

/* Output channels of chunk q of family f: chunk q starts at 16*nvmax*q and
 * has nv vectors of 16. */
static inline int chunk_nv(const conv_family *f, int64_t o, int64_t q)
{
    return (int)min64(f->nvmax, o / 16 - f->nvmax * q);
}

/* The family for operands of types a and b: vdpbf16ps for two bfloat16
 * where the GEMM's measured (or forced) choice for bf16 x bf16 is
 * vdpbf16ps and pairs allows it, else float32 FMA on the active ISA. */
const conv_family *mp_conv_family(mp_dtype a, mp_dtype b, bool pairs);

/* The bfloat16 family's filter operands (conv_direct_avx512bf16.c):
 * columns q and q + sw of the padded image buf (width wp + sw) as one
 * 32-bit lane, out[c/16][hp][wp][16]; and dy [oh][ow][o] as pairs of a
 * row's consecutive pixels, out[oh][ceil(ow/2)][o] (the partner of an odd
 * row's last pixel is zero; o a multiple of 16). */
void mp_conv_pair_columns(const conv_spec *s, const uint16_t *buf, int64_t hp, int64_t wp,
                          uint32_t *out);
void mp_conv_pair_pixels(const uint16_t *dy, int64_t oh, int64_t ow, int64_t o, uint32_t *out);

/* Instantiates F(SW, NV, MR) for MR = 1..N. */
#define MRS_6(F, S, N) F(S, N, 1) F(S, N, 2) F(S, N, 3) F(S, N, 4) F(S, N, 5) F(S, N, 6)
#define MRS_7(F, S, N) MRS_6(F, S, N) F(S, N, 7)
#define MRS_9(F, S, N) MRS_7(F, S, N) F(S, N, 8) F(S, N, 9)
#define MRS_14(F, S, N) MRS_9(F, S, N) F(S, N, 10) F(S, N, 11) F(S, N, 12) F(S, N, 13) F(S, N, 14)
#define MRS_28(F, S, N)                                                                            \
    MRS_14(F, S, N)                                                                                \
    F(S, N, 15)                                                                                    \
    F(S, N, 16)                                                                                    \
    F(S, N, 17)                                                                                    \
    F(S, N, 18)                                                                                    \
    F(S, N, 19)                                                                                    \
    F(S, N, 20)                                                                                    \
    F(S, N, 21) F(S, N, 22) F(S, N, 23) F(S, N, 24) F(S, N, 25) F(S, N, 26) F(S, N, 27) F(S, N, 28)

/* The AVX-512 families' tiles: MR*NV accumulators plus NV weight vectors
 * fit the 32 zmm registers (the input is a broadcast memory operand). */
enum { MR1 = 28, MR2 = 14, MR3 = 9, MR4 = 7 };
#define CONV_ALL_KERNELS(F, S) MRS_28(F, S, 1) MRS_14(F, S, 2) MRS_9(F, S, 3) MRS_7(F, S, 4)

/* The AVX-512 tables of a kernel prefix, PREFIX##s1[4] and PREFIX##s2[4]
 * indexed by nv - 1 (PREFIX##ENTRY(S, N, M) names one kernel). */
#define CONV_FWD_TABLES(PREFIX)                                                                    \
    static const conv_fwd_fn PREFIX##s1_1[MR1] = {MRS_28(PREFIX##ENTRY, 1, 1)};                    \
    static const conv_fwd_fn PREFIX##s1_2[MR2] = {MRS_14(PREFIX##ENTRY, 1, 2)};                    \
    static const conv_fwd_fn PREFIX##s1_3[MR3] = {MRS_9(PREFIX##ENTRY, 1, 3)};                     \
    static const conv_fwd_fn PREFIX##s1_4[MR4] = {MRS_7(PREFIX##ENTRY, 1, 4)};                     \
    static const conv_fwd_fn PREFIX##s2_1[MR1] = {MRS_28(PREFIX##ENTRY, 2, 1)};                    \
    static const conv_fwd_fn PREFIX##s2_2[MR2] = {MRS_14(PREFIX##ENTRY, 2, 2)};                    \
    static const conv_fwd_fn PREFIX##s2_3[MR3] = {MRS_9(PREFIX##ENTRY, 2, 3)};                     \
    static const conv_fwd_fn PREFIX##s2_4[MR4] = {MRS_7(PREFIX##ENTRY, 2, 4)};

#define CONV_FWD_TABLE_INIT(PREFIX)                                                                \
    {                                                                                              \
        {PREFIX##s1_1, PREFIX##s1_2, PREFIX##s1_3, PREFIX##s1_4},                                  \
        {                                                                                          \
            PREFIX##s2_1, PREFIX##s2_2, PREFIX##s2_3, PREFIX##s2_4                                 \
        }                                                                                          \
    }

#endif
#endif
