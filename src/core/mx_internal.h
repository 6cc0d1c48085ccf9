/* mx_internal.h - the MX element formats as constants shared by the scalar
 * definition (mx.c) and the SIMD paths (mx_avx2.c, mx_avx512.c), and the
 * kernel table that mx_convert.c dispatches through. Not part of the API. */
#ifndef MP_MX_INTERNAL_H
#define MP_MX_INTERNAL_H

#include "internal.h"

/* An element format as the rounding sees it. MXINT8 is the magnitude grid
 * of a format with 6 fraction bits and bias 1 (its normals are [1, 2), its
 * "subnormals" the multiples of 2^-6 below 1: together exactly c / 64), with
 * the sign applied as two's complement instead of a sign bit. */
typedef struct {
    int mbits, bias;
    int emax;          /* exponent of the largest normal (emax_elem, spec section 6.3) */
    uint32_t max_mag;  /* largest finite magnitude code */
    uint32_t sign_bit; /* sign bit of an FP code; 0 for MXINT8 (two's complement) */
    mp_dtype fp8;      /* MP_F8E4M3 / MP_F8E5M2 for MXFP8 (their inf/NaN codes), else MP_F32 */
} mp_mx_elem;

/* Indexed by mp_mx_format; constants the SIMD code folds into immediates. */
static const mp_mx_elem mp_mx_elems[MP_MX_FORMAT_COUNT] = {
    [MP_MXFP8_E4M3] = {3, 7, 8, 0x7E, 0x80, MP_F8E4M3},
    [MP_MXFP8_E5M2] = {2, 15, 15, 0x7B, 0x80, MP_F8E5M2},
    [MP_MXFP6_E2M3] = {3, 1, 2, 0x1F, 0x20, MP_F32},
    [MP_MXFP6_E3M2] = {2, 3, 4, 0x1F, 0x20, MP_F32},
    [MP_MXFP4_E2M1] = {1, 1, 2, 0x07, 0x08, MP_F32},
    [MP_MXINT8] = {6, 1, 0, 0x7F, 0x00, MP_F32},
};

static inline bool mp_mx_format_valid(mp_mx_format f) { return (unsigned)f < MP_MX_FORMAT_COUNT; }

/* E8M0 code of the block scale for a block whose largest magnitude has the
 * float32 bits amax (NaN ordered above inf above every finite value, as the
 * bits of non-negative floats are): the biased exponent minus emax, at least
 * 0; 255 for inf or NaN. The same number as mp_mx_scale_code() in mx.c,
 * which spells the rule out; the SIMD paths use this form. */
static inline uint32_t mp_mx_scale_fast(uint32_t amax, int emax)
{
    if (amax >= 0x7F800000u) return MP_E8M0_NAN;
    uint32_t e = amax >> 23;
    return e > (uint32_t)emax ? e - (uint32_t)emax : 0;
}

/* float32 bits of 2^(c - 127) for a scale code c < 255 (code 0 is the
 * subnormal 2^-127), and of its reciprocal 2^(127 - c). */
static inline uint32_t mp_e8m0_bits(uint32_t c) { return c ? c << 23 : 0x00400000u; }
static inline uint32_t mp_e8m0_recip_bits(uint32_t c)
{
    return c < 254 ? (254 - c) << 23 : 0x00400000u;
}

/* Scalar definitions, in mx.c. */
/* Scale code of a block by the spec's rule, written out (floor(log2(amax))
 * of subnormals included). */
uint8_t mp_mx_scale_code(mp_mx_format f, uint32_t amax_bits);
/* Code of one finite element x of a block whose scale code is c (< 255). */
uint8_t mp_mx_encode_element(mp_mx_format f, float x, uint32_t c);
/* scale * element for a code and a scale code, as mp_mx_unpack defines it. */
float mp_mx_decode(mp_mx_format f, uint8_t code, uint8_t scale);

/* Kernels of one ISA. n counts elements; blocks are MP_MX_BLOCK long, the
 * last one n % MP_MX_BLOCK when that is not 0. dst types: MP_F32, MP_BF16. */
typedef struct {
    void (*pack)(mp_mx_format f, const float *src, size_t n, uint8_t *codes, uint8_t *scales);
    void (*unpack)(mp_mx_format f, const uint8_t *codes, const uint8_t *scales, size_t n, void *dst,
                   mp_dtype t);
    /* Fake quantization of `rows` rows of `cols` each, blocks along rows. */
    void (*quantize_rows)(mp_mx_format f, const float *src, size_t rows, size_t cols, void *dst,
                          mp_dtype t);
    /* The same with blocks down the columns. */
    void (*quantize_cols)(mp_mx_format f, const float *src, size_t rows, size_t cols, void *dst,
                          mp_dtype t);
} mp_mx_kernels;

extern const mp_mx_kernels mp_mx_scalar_kernels;
#if MP_X86
extern const mp_mx_kernels mp_mx_avx2_kernels;
extern const mp_mx_kernels mp_mx_avx512_kernels;
#endif

/* The kernels of a path (the scalar ones where it has none). */
const mp_mx_kernels *mp_mx_kernels_for(mp_isa isa);

/* The path each MX operation runs on: measured once per process and cached
 * (mx_dispatch.c, core/measured.h), the active path when forced. */
typedef enum { MP_MX_OP_PACK, MP_MX_OP_UNPACK, MP_MX_OP_ROWS, MP_MX_OP_COLS, MP_MX_OPS } mp_mx_op;
mp_isa mp_mx_path(mp_mx_op op);
/* The choice as text (mixprec info); forget it (tests). */
void mp_mx_dispatch_print(FILE *out);
void mp_mx_dispatch_reset(void);

/* The public calls on an explicit ISA (tests and benchmarks): the same
 * checks, the same results on every path this CPU supports. */
mp_status mp_mx_pack_isa(mp_isa isa, mp_mx_format f, int block_size, const float *src, size_t n,
                         void *codes, uint8_t *scales);
mp_status mp_mx_unpack_isa(mp_isa isa, mp_mx_format f, int block_size, const void *codes,
                           const uint8_t *scales, size_t n, void *dst, mp_dtype dst_type);
mp_status mp_mx_quantize_2d_isa(mp_isa isa, mp_mx_format f, int block_size, int64_t rows,
                                int64_t cols, int axis, const float *src, void *dst,
                                mp_dtype dst_type);

#endif
