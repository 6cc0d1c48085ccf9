/* dtype.c - the number formats: names, facts, and the scalar conversions that
 * define the bits every other path must reproduce. */
#include <float.h>
#include <string.h>

#include "internal.h"

/* ---------------------------------------------------------------- facts */

static const struct {
    const char *name;
    const char *short_name;
    size_t size;
} dtype_names[MP_DTYPE_COUNT] = {
    [MP_F32] = {"float32", "f32", 4},         [MP_F16] = {"float16", "f16", 2},
    [MP_BF16] = {"bfloat16", "bf16", 2},      [MP_F8E4M3] = {"float8_e4m3", "e4m3", 1},
    [MP_F8E5M2] = {"float8_e5m2", "e5m2", 1},
};

const char *mp_dtype_name(mp_dtype t)
{
    if (t == MP_I32) return "int32";
    return (unsigned)t < MP_DTYPE_COUNT ? dtype_names[t].name : "unknown";
}

size_t mp_dtype_size(mp_dtype t)
{
    if (t == MP_I32) return 4;
    return (unsigned)t < MP_DTYPE_COUNT ? dtype_names[t].size : 0;
}

mp_status mp_dtype_from_name(const char *name, mp_dtype *out)
{
    if (name) {
        for (int i = 0; i < MP_DTYPE_COUNT; i++)
            if (strcmp(name, dtype_names[i].name) == 0 ||
                strcmp(name, dtype_names[i].short_name) == 0) {
                *out = (mp_dtype)i;
                return MP_OK;
            }
        if (strcmp(name, "float8_e4m3fn") == 0) {
            *out = MP_F8E4M3;
            return MP_OK;
        }
        if (strcmp(name, "int32") == 0) {
            *out = MP_I32;
            return MP_OK;
        }
    }
    return mp_set_error(MP_ERR_INVALID,
                        "unknown dtype '%s' (expected float32, float16, bfloat16, float8_e4m3, "
                        "float8_e5m2 or int32)",
                        name ? name : "(null)");
}

void mp_dtype_get_info(mp_dtype t, mp_dtype_info *info)
{
    memset(info, 0, sizeof *info);
    switch (t) {
    case MP_F32:
        *info = (mp_dtype_info){32, 23, 8, 127, true, 0x1p-23f, FLT_MAX, 0x1p-126f, 0x1p-149f, 0};
        break;
    case MP_F16:
        *info = (mp_dtype_info){16, 10, 5, 15, true, 0x1p-10f, 65504.0f, 0x1p-14f, 0x1p-24f, 0};
        break;
    case MP_BF16:
        *info = (mp_dtype_info){16, 7, 8, 127, true, 0x1p-7f, 0x1.FEp127f, 0x1p-126f, 0x1p-133f, 0};
        break;
    case MP_F8E4M3:
        *info = (mp_dtype_info){8, 3, 4, 7, false, 0x1p-3f, 448.0f, 0x1p-6f, 0x1p-9f, 0};
        break;
    case MP_F8E5M2:
        *info = (mp_dtype_info){8, 2, 5, 15, true, 0x1p-2f, 57344.0f, 0x1p-14f, 0x1p-16f, 0};
        break;
    case MP_I32: /* not a floating format: all zero */
        break;
    }
    info->unit_roundoff = info->epsilon * 0.5f;
}

/* ------------------------------------------------------------- encoding */

uint16_t mp_f32_to_bf16(float x) { return mp_bf16_from_bits(mp_f32_bits(x)); }

uint16_t mp_f32_to_f16(float x)
{
    uint32_t u = mp_f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a == 0x7F800000u) return (uint16_t)(sign | 0x7C00u);
    uint32_t r = mp_round_magnitude(a, 0, 10, 15);
    if (r > 0x7BFFu) r = 0x7C00u;
    return (uint16_t)(sign | r);
}

const mp_fp8_format *mp_fp8_format_of(mp_dtype t)
{
    return t == MP_F8E4M3 ? &mp_fp8_e4m3 : t == MP_F8E5M2 ? &mp_fp8_e5m2 : NULL;
}

static inline uint8_t encode_fp8(float x, const mp_fp8_format *f, mp_overflow ov)
{
    uint32_t u = mp_f32_bits(x);
    uint32_t sign = (u >> 24) & 0x80u;
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint8_t)(sign | f->nan_enc);
    if (a == 0x7F800000u)
        return (uint8_t)(sign | (ov == MP_OVERFLOW_SATURATE ? f->inf_enc : f->ovf_nonsat));
    uint32_t r = mp_round_magnitude(a, 0, f->mbits, f->bias);
    if (r > f->max_enc) r = ov == MP_OVERFLOW_SATURATE ? f->max_enc : f->ovf_nonsat;
    return (uint8_t)(sign | r);
}

uint8_t mp_f32_to_e4m3_ex(float x, mp_overflow ov) { return encode_fp8(x, &mp_fp8_e4m3, ov); }
uint8_t mp_f32_to_e5m2_ex(float x, mp_overflow ov) { return encode_fp8(x, &mp_fp8_e5m2, ov); }
uint8_t mp_f32_to_e4m3(float x) { return encode_fp8(x, &mp_fp8_e4m3, MP_OVERFLOW_SATURATE); }
uint8_t mp_f32_to_e5m2(float x) { return encode_fp8(x, &mp_fp8_e5m2, MP_OVERFLOW_SATURATE); }

/* ------------------------------------------------------------- decoding */

/* bf16 is the top half of a float32: widening is a shift, NaN payloads kept. */
float mp_bf16_to_f32(uint16_t h) { return mp_bits_f32((uint32_t)h << 16); }

/* NaNs come out quiet (as F16C's vcvtph2ps makes them), payload kept. */
float mp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 31) return mp_bits_f32(sign | 0x7F800000u | (m ? 0x400000u | (m << 13) : 0));
    if (e == 0) {
        float v = (float)m * 0x1p-24f; /* exact: m < 2^10 */
        return mp_bits_f32(sign | mp_f32_bits(v));
    }
    return mp_bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

float mp_e4m3_to_f32(uint8_t b)
{
    uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    uint32_t e = (b >> 3) & 0xFu, m = b & 7u;
    if ((b & 0x7Fu) == 0x7Fu) return mp_bits_f32(sign | 0x7FC00000u);
    if (e == 0) return mp_bits_f32(sign | mp_f32_bits((float)m * 0x1p-9f));
    return mp_bits_f32(sign | ((e + 120) << 23) | (m << 20));
}

float mp_e5m2_to_f32(uint8_t b)
{
    uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    uint32_t e = (b >> 2) & 0x1Fu, m = b & 3u;
    if (e == 31) return mp_bits_f32(sign | 0x7F800000u | (m ? 0x400000u | (m << 21) : 0));
    if (e == 0) return mp_bits_f32(sign | mp_f32_bits((float)m * 0x1p-16f));
    return mp_bits_f32(sign | ((e + 112) << 23) | (m << 21));
}

/* ------------------------------------------------------- scalar kernels */

static void s_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = mp_f32_to_bf16(src[i]);
}
static void s_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = mp_f32_to_f16(src[i]);
}
static void s_f32_to_fp8(uint8_t *dst, const float *src, size_t n, mp_dtype t, mp_overflow ov)
{
    const mp_fp8_format *f = mp_fp8_format_of(t);
    for (size_t i = 0; i < n; i++) dst[i] = encode_fp8(src[i], f, ov);
}
static void s_bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = mp_bf16_to_f32(src[i]);
}
static void s_f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = mp_f16_to_f32(src[i]);
}
static void s_fp8_to_f32(float *dst, const uint8_t *src, size_t n, mp_dtype t)
{
    if (t == MP_F8E4M3)
        for (size_t i = 0; i < n; i++) dst[i] = mp_e4m3_to_f32(src[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = mp_e5m2_to_f32(src[i]);
}

const mp_convert_kernels mp_convert_scalar_kernels = {
    s_f32_to_bf16, s_f32_to_f16, s_f32_to_fp8, s_bf16_to_f32, s_f16_to_f32, s_fp8_to_f32,
};
