/* conv_direct_avx512.h - what the AVX-512 direct convolution's files share:
 * a convolution as the kernels see it (conv_spec), the padded image, and
 * the two families of forward microkernels, float32 FMA
 * (conv_direct_avx512.c) and vdpbf16ps on bfloat16 channel pairs
 * (conv_direct_avx512bf16.c). The filter gradient is
 * conv_direct_filter_avx512.c. */
#ifndef MP_CONV_DIRECT_AVX512_H
#define MP_CONV_DIRECT_AVX512_H

#include "kernels/conv_direct.h"
#include "kernels/gemm_avx512_common.h"

#if MP_X86

/* Scratch slots (see mp_scratch): per thread the padded image and a
 * widened row; on the calling thread the packed weights and tap offsets, and
 * the filter gradient's partial sums. */
enum { SLOT_IMAGE = 9, SLOT_ROW = 10, SLOT_W = 11, SLOT_TAPS = 12, SLOT_PART = 13 };

static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline float alpha_of(const mp_conv_geom *g) { return g->alpha != 0.0f ? g->alpha : 1.0f; }

/* Output channels in chunks of at most 4 vectors of 16: chunk q starts at
 * 64*q and has nv vectors. */
static inline int chunk_nv(int64_t o, int64_t q) { return (int)min64(4, o / 16 - 4 * q); }

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

/* Image n of s->x as buf[c/16][hp][wp][16] with buf row r, column q
 * holding source pixel (r - pt, q - pl), zero outside the image and in the
 * channels past c: widened to float32 (bf16 false; row: w*c floats of
 * scratch for a widened source row), or as bfloat16 (bf16 true; s->xt must
 * be MP_BF16; row unused). */
void mp_conv_pad_image(const conv_spec *s, int64_t n, int64_t hp, int64_t wp, float *row, void *buf,
                       bool bf16);

/* A forward microkernel: t[MR][NV*16] (row stride ldt) = the sum over ntap
 * taps and steps channel steps (one channel in float32, a pair in
 * bfloat16) of x[tap][i][c] * w[tap][c][:], x[tap] at x + xoff[tap]
 * (elements of the padded image), pixel i SW*16 elements after pixel 0;
 * w the packed weights, [tap][step][NV*16 (x2 in bfloat16)]. */
typedef void (*conv_fwd_fn)(int64_t ntap, int steps, const int64_t *xoff, const void *x,
                            const void *w, float *t, int64_t ldt);

/* The widest tile per NV: MR*NV accumulators plus NV weight vectors fit the
 * 32 zmm registers (the input is a broadcast memory operand). */
enum { MR1 = 28, MR2 = 14, MR3 = 9, MR4 = 7 };

/* Instantiates F(SW, NV, MR) for every tile height of every NV. */
#define MRS_7(F, S, N) F(S, N, 1) F(S, N, 2) F(S, N, 3) F(S, N, 4) F(S, N, 5) F(S, N, 6) F(S, N, 7)
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
#define CONV_ALL_KERNELS(F, S) MRS_28(F, S, 1) MRS_14(F, S, 2) MRS_9(F, S, 3) MRS_7(F, S, 4)

/* The tables of a family, [stride - 1][NV - 1][MR - 1]. */
#define CONV_FWD_TABLES(PREFIX, NAME)                                                              \
    static const conv_fwd_fn PREFIX##s1_1[MR1] = {MRS_28(PREFIX##ENTRY, 1, 1)};                    \
    static const conv_fwd_fn PREFIX##s1_2[MR2] = {MRS_14(PREFIX##ENTRY, 1, 2)};                    \
    static const conv_fwd_fn PREFIX##s1_3[MR3] = {MRS_9(PREFIX##ENTRY, 1, 3)};                     \
    static const conv_fwd_fn PREFIX##s1_4[MR4] = {MRS_7(PREFIX##ENTRY, 1, 4)};                     \
    static const conv_fwd_fn PREFIX##s2_1[MR1] = {MRS_28(PREFIX##ENTRY, 2, 1)};                    \
    static const conv_fwd_fn PREFIX##s2_2[MR2] = {MRS_14(PREFIX##ENTRY, 2, 2)};                    \
    static const conv_fwd_fn PREFIX##s2_3[MR3] = {MRS_9(PREFIX##ENTRY, 2, 3)};                     \
    static const conv_fwd_fn PREFIX##s2_4[MR4] = {MRS_7(PREFIX##ENTRY, 2, 4)};                     \
    const conv_fwd_fn *const NAME[2][4] = {                                                        \
        {PREFIX##s1_1, PREFIX##s1_2, PREFIX##s1_3, PREFIX##s1_4},                                  \
        {PREFIX##s2_1, PREFIX##s2_2, PREFIX##s2_3, PREFIX##s2_4}};

extern const conv_fwd_fn *const mp_conv_fwd_f32[2][4];  /* float32 FMA */
extern const conv_fwd_fn *const mp_conv_fwd_bf16[2][4]; /* vdpbf16ps */

/* Whether bfloat16 operands a and b take the vdpbf16ps kernels: both
 * MP_BF16, and the GEMM's measured (or forced) choice for bf16 x bf16 is
 * vdpbf16ps. */
bool mp_conv_bf16_family(mp_dtype a, mp_dtype b);

/* A filter-gradient microkernel on bfloat16 pairs of output pixels:
 * p[r][j] (row stride ldp; first: =, else +=) gets the sum over oh rows
 * and np pixel pairs of x[pair][r] * dy[pair][j], r < CR, j < NV*16, each
 * a 32-bit lane of two bfloat16 (pixels 2z and 2z+1 of a row): x of pair
 * (y, z) at x + y*xrs + z*2*SW*16 (r the lane after it), dy's vector of
 * 16 pairs at dy + y*dyrs + z*dps (then 16 lanes a vector). */
typedef void (*conv_filt_bf16_fn)(int64_t oh, int64_t np, const uint32_t *x, int64_t xrs,
                                  const uint32_t *dy, int64_t dyrs, int64_t dps, float *p,
                                  int64_t ldp, int first);
/* [stride - 1][NV - 1], CR = mp_conv_filt_cr[NV - 1]. */
extern const conv_filt_bf16_fn mp_conv_filt_bf16[2][4];
/* Input channels per filter-kernel call, so that CR*NV accumulators stay
 * in registers with enough independent chains. */
extern const int mp_conv_filt_cr[4];

#endif
#endif
