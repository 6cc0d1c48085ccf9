/* mixprec/mx.h - OCP Microscaling (MX) block formats, as the OCP Microscaling
 * Formats (MX) Specification v1.0 defines them: blocks of 32 elements that
 * share one power-of-two scale. Packing float32 into element codes and
 * scales, unpacking, and the fake quantization training uses (quantize and
 * decode again, along one axis of a matrix). Bit-exact: every ISA path gives
 * the same bits. Included by mixprec.h. */
/* The whole API, in order: this part compiles when included alone. */
#include "../mixprec.h"

#ifndef MIXPREC_MX_H
#define MIXPREC_MX_H

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- formats */

/* The concrete MX formats of the specification (section 5, table 1). The
 * element formats:
 *   MXFP8 E4M3  OCP FP8 E4M3: bias 7, max 448, S.1111.111 is NaN, no inf
 *   MXFP8 E5M2  OCP FP8 E5M2: bias 15, max 57344, IEEE-like inf and NaN
 *   MXFP6 E2M3  bias 1, max 7.5, subnormals, no inf or NaN
 *   MXFP6 E3M2  bias 3, max 28, subnormals, no inf or NaN
 *   MXFP4 E2M1  bias 1, max 6, subnormal 0.5, no inf or NaN
 *   MXINT8      8-bit two's complement with an implicit scale 2^-6:
 *               code c means c / 64 (-2 .. 127/64)
 * The shared scale is E8M0: an unsigned biased exponent (bias 127), code c
 * means 2^(c - 127) for c = 0 .. 254 (2^-127 .. 2^127), 255 is NaN; no sign,
 * no zero, no infinity. The value of element i of a block is
 * scale * element_i; a NaN scale makes the whole block NaN. */
typedef enum {
    MP_MXFP8_E4M3 = 0,
    MP_MXFP8_E5M2 = 1,
    MP_MXFP6_E2M3 = 2,
    MP_MXFP6_E3M2 = 3,
    MP_MXFP4_E2M1 = 4,
    MP_MXINT8 = 5,
} mp_mx_format;
#define MP_MX_FORMAT_COUNT 6

/* The block size: the only one the specification defines for these formats.
 * Every call below takes it explicitly and refuses any other value. */
#define MP_MX_BLOCK 32
/* The E8M0 scale code that means NaN. */
#define MP_E8M0_NAN 0xFF

/* "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4_e2m1",
 * "mxint8"; "unknown" for a value outside the enum. */
const char *mp_mx_format_name(mp_mx_format f);
/* Parse one of the names above ("mxfp4" is taken for "mxfp4_e2m1": it has a
 * single element format). MP_ERR_INVALID with a message naming the value. */
mp_status mp_mx_format_from_name(const char *name, mp_mx_format *out);

/* Facts of an element format (the values before the scale is applied). */
typedef struct {
    const char *name;
    int element_bits;  /* 8, 6 or 4: the width the specification gives */
    int code_bits;     /* bits per element in mp_mx_pack's codes: 8, or 4 for MXFP4 */
    int exponent_bits; /* 0 for MXINT8 */
    int mantissa_bits; /* explicit fraction bits; MXINT8: 6 (its 2^-6 step) */
    int exponent_bias; /* 0 for MXINT8 */
    int emax;          /* exponent of the largest normal: the scale rule's emax_elem */
    bool has_inf, has_nan;
    float max;           /* largest finite magnitude */
    float min_normal;    /* smallest positive normal (MXINT8: 2^-6) */
    float min_subnormal; /* smallest positive value */
    int block_size;      /* MP_MX_BLOCK */
} mp_mx_format_info;

/* MP_ERR_INVALID (info untouched) for a value outside the enum. */
mp_status mp_mx_get_info(mp_mx_format f, mp_mx_format_info *info);

/* Storage of n elements packed by mp_mx_pack: one E8M0 scale per block of
 * 32, the last block possibly shorter (ceil(n / 32) scales), and the codes:
 * one byte per element for MXFP8, MXFP6 (the low 6 bits: S.EE.MMM or
 * S.EEE.MM; the top two bits written as zero, ignored when read) and MXINT8,
 * and two elements per byte for MXFP4 (element 2i in the low nibble, 2i+1 in
 * the high one; a final odd element leaves the high nibble zero). */
size_t mp_mx_scale_count(size_t n);
size_t mp_mx_code_bytes(mp_mx_format f, size_t n); /* 0 for a bad format */

/* The value of a scale code: 2^(c - 127), NaN for 255. Exact in float32
 * (2^-127 is a float32 subnormal). */
float mp_e8m0_to_f32(uint8_t c);
/* The value of one element code before the scale, exact in float32 (the
 * unused high bits of an MXFP6 or MXFP4 code ignored); NaN for a bad format. */
float mp_mx_element_to_f32(mp_mx_format f, uint8_t code);

/* ------------------------------------------------------- packing, unpacking */

/* float32 -> MX. Each block of 32 consecutive elements (the last block has
 * n % 32 when that is not 0, and is treated as a block of that length) gets
 * its scale by the specification's conversion rule (section 6.3):
 *   shared_exp = floor(log2(amax)) - emax, amax the largest magnitude in the
 *   block, emax that of the element format (mp_mx_format_info.emax),
 *   clamped below to -127 (E8M0's smallest scale, code 0);
 *   element = v / 2^shared_exp rounded to nearest even onto the element
 *   format, subnormals kept, magnitudes beyond its max clamped to +-max.
 * The division is exact (it moves the exponent), so each element is rounded
 * once. The special cases:
 *   - amax 0 (the block holds only zeros): scale code 0 (2^-127), zeros kept
 *     with their sign (MXINT8 has no -0: its zeros are 0);
 *   - amax a float32 subnormal, or small enough that shared_exp < -127: scale
 *     code 0, and the elements are rounded as above (float32 subnormal inputs
 *     are not flushed to zero);
 *   - a NaN or an infinity anywhere in the block: scale NaN (code 255) and
 *     every element code 0. The specification makes the scale NaN for a NaN
 *     input; an infinity has floor(log2) = +inf, beyond E8M0's largest
 *     exponent, and MXFP6, MXFP4 and MXINT8 could not encode it: this library
 *     never turns an overflow into a finite number, and the decoded block
 *     (all NaN) shows it;
 *   - shared_exp never exceeds 127 for finite float32 input (127 - emax at
 *     most), so no upper clamp is needed.
 * A value that rounds to zero keeps its sign in the FP formats. pack never
 * writes E4M3's NaN code or E5M2's inf/NaN codes. codes holds
 * mp_mx_code_bytes(f, n) bytes, scales mp_mx_scale_count(n). block_size must
 * be MP_MX_BLOCK; MP_ERR_INVALID (nothing written) for any other, a bad
 * format or NULL pointers with n > 0. */
mp_status mp_mx_pack(mp_mx_format f, int block_size, const float *src, size_t n, void *codes,
                     uint8_t *scales);

/* MX -> float32 (dst_type MP_F32) or bfloat16 (MP_BF16), any codes and
 * scales (not only those mp_mx_pack writes). Each value is scale * element
 * rounded once to the destination, which makes float32 exact except past
 * float32's range (a scale near 2^127 times an element >= 2: +-inf). E4M3's
 * NaN code and E5M2's inf/NaN codes decode to NaN/inf; a NaN scale decodes
 * every element of its block to the quiet NaN 0x7FC00000 (bf16 0x7FC0).
 * bfloat16 (8 significant bits, subnormals down to 2^-133) holds every MXFP6,
 * MXFP4 and MXINT8 value exactly, and every MXFP8 value whose scale is at
 * least 2^-124 (E4M3, code >= 3) or 2^-117 (E5M2, code >= 10); below that,
 * the tiny values round to nearest even in bfloat16's subnormal range. */
mp_status mp_mx_unpack(mp_mx_format f, int block_size, const void *codes, const uint8_t *scales,
                       size_t n, void *dst, mp_dtype dst_type);

/* --------------------------------------------------- fake quantization (2-D) */

/* Quantize a row-major rows x cols float32 matrix to MX blocks along one
 * axis and decode it again into dst (MP_F32 or MP_BF16, the same shape): the
 * values an MX GEMM sees, bit for bit as mp_mx_pack followed by
 * mp_mx_unpack. axis 1: blocks of 32 consecutive elements of each row (the
 * last block of a row has cols % 32 when that is not 0); axis 0: blocks of 32
 * rows in each column (the last has rows % 32). For C = A B quantize A along
 * axis 1 and B along axis 0, the reduction dimension of both: MX
 * quantization does not commute with transposition, so a tensor used in the
 * forward and the backward GEMM is quantized once per pass. dst may be src
 * itself (MP_F32 only); other overlap is not allowed. MP_ERR_INVALID for a
 * bad format, block size, axis, dtype, negative shape or NULL pointer with
 * data. */
mp_status mp_mx_quantize_2d(mp_mx_format f, int block_size, int64_t rows, int64_t cols, int axis,
                            const float *src, void *dst, mp_dtype dst_type);

/* ------------------------------------------------------- training (nn) */

/* MX training (nn/mx_quant.c): a Dense, Conv2D or MultiHeadAttention (its
 * four projections) whose GEMMs read MX fake-quantized operands. In every
 * GEMM pass each operand is quantized in blocks of 32 along that pass's
 * reduction dimension and decoded exactly:
 *   forward  y  = x W:    x in blocks along its features, W down its rows
 *                         (both in `format`);
 *   backward dW = x^T dz: x and dz in blocks of 32 rows (samples), x in
 *                         `format`, dz in `grad_format`;
 *            dx = dz W^T: dz along its units (`grad_format`), W along its
 *                         rows (`format`).
 * A tensor used in two passes is quantized once for each (MX does not
 * commute with transposition). The decoded values go to the GEMM in
 * bfloat16 when every one of them is exact there (always for MXFP6, MXFP4
 * and MXINT8; for MXFP8 unless a block's scale is tiny, see mp_mx_unpack),
 * else in float32, with factor 1: the GEMM, accumulating in float32, gives
 * what MX hardware with float32 accumulation gives. x is quantized in the
 * compute dtype, W from its float32 master (it keeps no compute copy), dz
 * after the activation's derivative; the bias gradient is the float32 column
 * sum of dz. Conv2D sees its input as [pixels, channels] and its kernel as
 * [kh * kw * in, filters]: the input's blocks run along the channels of each
 * pixel (the implicit GEMM's reduction when in % 32 == 0) and down 32
 * pixels for dW. The recipe is stateless: checkpoints hold nothing for it.
 *
 * Which layers: policies mixed_mxfp8, mixed_mxfp6 and mixed_mxfp4
 * (mixed_bfloat16 plus MX GEMM inputs in MXFP8 E4M3, MXFP6 E2M3, MXFP4
 * E2M1) quantize every Dense, Conv2D and MultiHeadAttention except the
 * first and the last such layer of the model, as mixed_float8 does; a
 * layer's options (.mx, or "mx" in the model file) turn it on or off under
 * any policy. */
typedef struct mp_mx_params {
    mp_mx_format format;      /* forward GEMM inputs (x, W): MP_MXFP8_E4M3 */
    mp_mx_format grad_format; /* the output gradient dz: MP_MXFP8_E5M2 */
} mp_mx_params;

mp_mx_params mp_mx_params_default(void);
/* MP_ERR_INVALID (one line naming the value) for a format outside the enum. */
mp_status mp_mx_params_validate(const mp_mx_params *p);
/* The settings layers take when they are created (as the global policy is
 * read); the default is mp_mx_params_default(). An MX policy replaces
 * `format` by its own for the layers it quantizes. */
mp_status mp_set_global_mx_params(const mp_mx_params *p);
mp_mx_params mp_global_mx_params(void);

struct mp_model;
/* Whether layer `layer` of a built model computes its GEMMs on MX inputs,
 * and then (out non-NULL) the formats it uses. */
bool mp_model_layer_mx(const struct mp_model *m, int layer, mp_mx_params *out);

#ifdef __cplusplus
}
#endif

#endif /* MIXPREC_MX_H */
