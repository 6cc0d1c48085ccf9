/* mx.c - the OCP Microscaling (MX) formats (OCP MX specification v1.0):
 * names and facts, the scale rule and the element rounding written out in
 * integer arithmetic, and the scalar kernels built from them, which define
 * the bits every other path must reproduce. Argument checks and dispatch
 * are in mx_convert.c, the AVX2 and AVX-512 kernels in mx_avx2.c and
 * mx_avx512.c.
 *
 * The specification's sections as cited here: 5 (the concrete formats with
 * their block size 32, the E8M0 scale: bias 127, 0xFF NaN, no sign, zero or
 * inf; the element formats: OCP FP8, FP6 E2M3/E3M2, FP4 E2M1, INT8 with its
 * 2^-6 scale) and 6.3 (the conversion: shared_exp = floor(log2(amax)) -
 * emax_elem, elements quantized with normals beyond the element format's
 * range clamped to max with their sign, inf and NaN not clamped). The PDF
 * itself was not at hand when this was written: the rule was taken from
 * Algorithm 1 of arXiv:2310.10537 (the paper that accompanies the
 * specification) and Microsoft's microxcaling reference, and the element
 * formats are checked against ml_dtypes (tests/interop/mx_ml_dtypes.py). */
#include <string.h>

#include "mx_internal.h"

/* ---------------------------------------------------------------- names */

static const struct {
    const char *name;
    int element_bits, ebits;
    float max, min_normal, min_subnormal;
} facts[MP_MX_FORMAT_COUNT] = {
    [MP_MXFP8_E4M3] = {"mxfp8_e4m3", 8, 4, 448.0f, 0x1p-6f, 0x1p-9f},
    [MP_MXFP8_E5M2] = {"mxfp8_e5m2", 8, 5, 57344.0f, 0x1p-14f, 0x1p-16f},
    [MP_MXFP6_E2M3] = {"mxfp6_e2m3", 6, 2, 7.5f, 1.0f, 0x1p-3f},
    [MP_MXFP6_E3M2] = {"mxfp6_e3m2", 6, 3, 28.0f, 0x1p-2f, 0x1p-4f},
    [MP_MXFP4_E2M1] = {"mxfp4_e2m1", 4, 2, 6.0f, 1.0f, 0.5f},
    [MP_MXINT8] = {"mxint8", 8, 0, 127.0f / 64.0f, 0x1p-6f, 0x1p-6f},
};

const char *mp_mx_format_name(mp_mx_format f)
{
    return mp_mx_format_valid(f) ? facts[f].name : "unknown";
}

mp_status mp_mx_format_from_name(const char *name, mp_mx_format *out)
{
    if (name) {
        for (int i = 0; i < MP_MX_FORMAT_COUNT; i++)
            if (strcmp(name, facts[i].name) == 0) {
                *out = (mp_mx_format)i;
                return MP_OK;
            }
        if (strcmp(name, "mxfp4") == 0) {
            *out = MP_MXFP4_E2M1;
            return MP_OK;
        }
    }
    return mp_set_error(MP_ERR_INVALID,
                        "unknown MX format '%s' (expected mxfp8_e4m3, mxfp8_e5m2, mxfp6_e2m3, "
                        "mxfp6_e3m2, mxfp4_e2m1 or mxint8)",
                        name ? name : "(null)");
}

mp_status mp_mx_get_info(mp_mx_format f, mp_mx_format_info *info)
{
    if (!mp_mx_format_valid(f)) return mp_set_error(MP_ERR_INVALID, "unknown MX format %d", (int)f);
    if (!info) return mp_set_error(MP_ERR_INVALID, "mp_mx_get_info: info is NULL");
    const mp_mx_elem *e = &mp_mx_elems[f];
    *info = (mp_mx_format_info){
        .name = facts[f].name,
        .element_bits = facts[f].element_bits,
        .code_bits = f == MP_MXFP4_E2M1 ? 4 : 8,
        .exponent_bits = facts[f].ebits,
        .mantissa_bits = e->mbits,
        .exponent_bias = f == MP_MXINT8 ? 0 : e->bias,
        .emax = e->emax,
        .has_inf = f == MP_MXFP8_E5M2,
        .has_nan = e->fp8 != MP_F32,
        .max = facts[f].max,
        .min_normal = facts[f].min_normal,
        .min_subnormal = facts[f].min_subnormal,
        .block_size = MP_MX_BLOCK,
    };
    return MP_OK;
}

size_t mp_mx_scale_count(size_t n) { return n / MP_MX_BLOCK + (n % MP_MX_BLOCK != 0); }

size_t mp_mx_code_bytes(mp_mx_format f, size_t n)
{
    if (!mp_mx_format_valid(f)) return 0;
    return f == MP_MXFP4_E2M1 ? n / 2 + n % 2 : n;
}

/* ------------------------------------------------------------ the rules */

float mp_e8m0_to_f32(uint8_t c)
{
    return mp_bits_f32(c == MP_E8M0_NAN ? 0x7FC00000u : mp_e8m0_bits(c));
}

/* Section 6.3: shared_exp = floor(log2(amax)) - emax_elem, clamped to E8M0's
 * exponents [-127, 127]; a non-finite amax gives the NaN scale (see
 * mixprec/mx.h for why inf does too). */
uint8_t mp_mx_scale_code(mp_mx_format f, uint32_t amax_bits)
{
    if (amax_bits >= 0x7F800000u) return MP_E8M0_NAN;
    if (amax_bits == 0) return 0; /* log2(0) = -inf: the lowest scale */
    int lg;                       /* floor(log2(amax)), exactly */
    if (amax_bits >> 23)
        lg = (int)(amax_bits >> 23) - 127;
    else /* a float32 subnormal: m * 2^-149 */
        lg = 31 - __builtin_clz(amax_bits) - 149;
    int shared_exp = lg - mp_mx_elems[f].emax;
    if (shared_exp < -127) shared_exp = -127;
    if (shared_exp > 127) shared_exp = 127; /* unreachable for finite float32 */
    return (uint8_t)(shared_exp + 127);
}

/* Section 6.3, line 4: x / 2^shared_exp rounded to nearest even onto the
 * element grid (mp_round_magnitude does the division exactly, as an exponent
 * shift), magnitudes beyond max clamped to max with the sign kept. */
uint8_t mp_mx_encode_element(mp_mx_format f, float x, uint32_t c)
{
    const mp_mx_elem *e = &mp_mx_elems[f];
    uint32_t u = mp_f32_bits(x);
    uint32_t r = mp_round_magnitude(u & 0x7FFFFFFFu, (int)c - 127, e->mbits, e->bias);
    if (r > e->max_mag) r = e->max_mag;
    if (f == MP_MXINT8) return (uint8_t)(u >> 31 ? 0u - r : r);
    return (uint8_t)(r | (u >> 31 ? e->sign_bit : 0u));
}

float mp_mx_element_to_f32(mp_mx_format f, uint8_t code)
{
    if (!mp_mx_format_valid(f)) return mp_bits_f32(0x7FC00000u);
    const mp_mx_elem *e = &mp_mx_elems[f];
    if (e->fp8 == MP_F8E4M3) return mp_e4m3_to_f32(code);
    if (e->fp8 == MP_F8E5M2) return mp_e5m2_to_f32(code);
    if (f == MP_MXINT8) return (float)(int8_t)code * 0x1p-6f;
    /* FP6 / FP4: S.E.M with the sign bit at sign_bit, no inf or NaN */
    uint32_t mag = code & (e->sign_bit - 1u), m = mag & ((1u << e->mbits) - 1u);
    uint32_t ef = mag >> e->mbits;
    uint32_t sign = code & e->sign_bit ? 0x80000000u : 0u;
    uint32_t bits;
    if (ef == 0) /* subnormal: m * 2^(1 - bias - mbits), exact */
        bits = mp_f32_bits((float)m * mp_bits_f32((uint32_t)(128 - e->bias - e->mbits) << 23));
    else
        bits = ((ef - (uint32_t)e->bias + 127u) << 23) | (m << (23 - e->mbits));
    return mp_bits_f32(sign | bits);
}

/* The product is exact unless it passes float32's range (then +-inf, the
 * IEEE rounding); a NaN element times a finite scale is that NaN. */
float mp_mx_decode(mp_mx_format f, uint8_t code, uint8_t scale)
{
    if (scale == MP_E8M0_NAN) return mp_bits_f32(0x7FC00000u);
    return mp_mx_element_to_f32(f, code) * mp_bits_f32(mp_e8m0_bits(scale));
}

/* ------------------------------------------------------ scalar kernels */

/* One block of len <= 32 elements read with a stride: its scale, and one
 * code per element into codes[]. */
static uint8_t encode_block(mp_mx_format f, const float *x, size_t stride, size_t len,
                            uint8_t codes[MP_MX_BLOCK])
{
    uint32_t amax = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t a = mp_f32_bits(x[i * stride]) & 0x7FFFFFFFu;
        if (a > amax) amax = a; /* bits of non-negative floats order as their values */
    }
    uint8_t c = mp_mx_scale_code(f, amax);
    for (size_t i = 0; i < len; i++)
        codes[i] = c == MP_E8M0_NAN ? 0 : mp_mx_encode_element(f, x[i * stride], c);
    return c;
}

static void put_value(void *dst, size_t i, mp_dtype t, float v)
{
    if (t == MP_BF16)
        ((uint16_t *)dst)[i] = mp_f32_to_bf16(v);
    else
        ((float *)dst)[i] = v;
}

static void s_pack(mp_mx_format f, const float *src, size_t n, uint8_t *codes, uint8_t *scales)
{
    uint8_t c[MP_MX_BLOCK];
    for (size_t b = 0; b * MP_MX_BLOCK < n; b++) {
        size_t i0 = b * MP_MX_BLOCK, len = n - i0 < MP_MX_BLOCK ? n - i0 : MP_MX_BLOCK;
        scales[b] = encode_block(f, src + i0, 1, len, c);
        for (size_t i = 0; i < len; i++) {
            if (f != MP_MXFP4_E2M1)
                codes[i0 + i] = c[i];
            else if ((i0 + i) % 2 == 0)
                codes[(i0 + i) / 2] = c[i]; /* high nibble zero until the odd element */
            else
                codes[(i0 + i) / 2] |= (uint8_t)(c[i] << 4);
        }
    }
}

static void s_unpack(mp_mx_format f, const uint8_t *codes, const uint8_t *scales, size_t n,
                     void *dst, mp_dtype t)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t code =
            f == MP_MXFP4_E2M1 ? (uint8_t)(codes[i / 2] >> (4 * (i % 2)) & 0xF) : codes[i];
        put_value(dst, i, t, mp_mx_decode(f, code, scales[i / MP_MX_BLOCK]));
    }
}

/* Fake quantization of the blocks of one line (a row, or a column read with
 * a stride) into dst at the same positions. */
static void quantize_line(mp_mx_format f, const float *src, size_t len, size_t stride, void *dst,
                          mp_dtype t)
{
    uint8_t c[MP_MX_BLOCK];
    for (size_t i0 = 0; i0 < len; i0 += MP_MX_BLOCK) {
        size_t bl = len - i0 < MP_MX_BLOCK ? len - i0 : MP_MX_BLOCK;
        uint8_t s = encode_block(f, src + i0 * stride, stride, bl, c);
        for (size_t i = 0; i < bl; i++)
            put_value(dst, (i0 + i) * stride, t, mp_mx_decode(f, c[i], s));
    }
}

static void s_quantize_rows(mp_mx_format f, const float *src, size_t rows, size_t cols, void *dst,
                            mp_dtype t)
{
    size_t es = mp_dtype_size(t);
    for (size_t r = 0; r < rows; r++)
        quantize_line(f, src + r * cols, cols, 1, (char *)dst + r * cols * es, t);
}

static void s_quantize_cols(mp_mx_format f, const float *src, size_t rows, size_t cols, void *dst,
                            mp_dtype t)
{
    size_t es = mp_dtype_size(t);
    for (size_t j = 0; j < cols; j++)
        quantize_line(f, src + j, rows, cols, (char *)dst + j * es, t);
}

const mp_mx_kernels mp_mx_scalar_kernels = {s_pack, s_unpack, s_quantize_rows, s_quantize_cols};
