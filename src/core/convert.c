/* convert.c - mp_convert: bulk conversion between any two dtypes, dispatched
 * to the conversion kernels of the path convert_dispatch.c chose. Pairs that involve no float32
 * go through a small float32 buffer: decoding is exact, so the result is
 * still a single rounding. */
#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"
#include "profile.h"

const mp_convert_kernels *mp_convert_kernels_for(mp_isa isa)
{
#if MP_X86
    if (isa >= MP_ISA_AVX512BF16) return &mp_convert_avx512bf16_kernels; /* amx's too */
    if (isa == MP_ISA_AVX512) return &mp_convert_avx512_kernels;
    if (isa == MP_ISA_AVX2) return &mp_convert_avx2_kernels;
#else
    (void)isa;
#endif
    return &mp_convert_scalar_kernels;
}

static void encode(const mp_convert_kernels *k, void *dst, mp_dtype t, const float *src, size_t n,
                   mp_overflow ov)
{
    switch (t) {
    case MP_F32:
        memmove(dst, src, n * sizeof(float));
        break;
    case MP_BF16:
        k->f32_to_bf16(dst, src, n);
        break;
    case MP_F16:
        k->f32_to_f16(dst, src, n);
        break;
    case MP_F8E4M3:
    case MP_F8E5M2:
        k->f32_to_fp8(dst, src, n, t, ov);
        break;
    case MP_I32: /* integer data is never a rounding target */
        assert(!"mp_convert: int32 is not a conversion target");
        break;
    }
}

static void decode(const mp_convert_kernels *k, float *dst, const void *src, mp_dtype t, size_t n)
{
    switch (t) {
    case MP_F32:
        memmove(dst, src, n * sizeof(float));
        break;
    case MP_BF16:
        k->bf16_to_f32(dst, src, n);
        break;
    case MP_F16:
        k->f16_to_f32(dst, src, n);
        break;
    case MP_F8E4M3:
    case MP_F8E5M2:
        k->fp8_to_f32(dst, src, n, t);
        break;
    case MP_I32: /* exact below 2^24 in magnitude, else rounded to nearest even */
        for (size_t i = 0; i < n; i++) dst[i] = (float)((const int32_t *)src)[i];
        break;
    }
}

/* Sizes are powers of two: a mask, not a division (this runs on every
 * call, some of them a GEMM tile's row). */
static bool aligned_for(const void *p, mp_dtype t)
{
    return ((uintptr_t)p & (mp_dtype_size(t) - 1)) == 0;
}

void mp_convert_isa(mp_isa isa, void *dst, mp_dtype dst_type, const void *src, mp_dtype src_type,
                    size_t n, mp_overflow ov)
{
    if (n == 0) return;
    if (!aligned_for(src, src_type) || !aligned_for(dst, dst_type)) {
        /* The kernels take typed pointers; data at any byte offset (a
         * tensor inside a file, say) goes through aligned buffers. */
        float in[1024], out[1024];
        const size_t ss = mp_dtype_size(src_type), ds = mp_dtype_size(dst_type);
        for (size_t i = 0; i < n; i += 1024) {
            const size_t c = n - i < 1024 ? n - i : 1024;
            memcpy(in, (const char *)src + i * ss, c * ss);
            mp_convert_isa(isa, out, dst_type, in, src_type, c, ov);
            memcpy((char *)dst + i * ds, out, c * ds);
        }
        return;
    }
    double t0 = mp_prof_leaf_enter();
    const mp_convert_kernels *k = mp_convert_kernels_for(isa);
    if (dst_type == src_type) {
        if (dst != src) memmove(dst, src, n * mp_dtype_size(dst_type));
    } else if (src_type == MP_F32) {
        encode(k, dst, dst_type, src, n, ov);
    } else if (dst_type == MP_F32) {
        decode(k, dst, src, src_type, n);
    } else {
        float buf[1024];
        size_t ds = mp_dtype_size(dst_type), ss = mp_dtype_size(src_type);
        for (size_t i = 0; i < n; i += 1024) {
            size_t c = n - i < 1024 ? n - i : 1024;
            decode(k, buf, (const char *)src + i * ss, src_type, c);
            encode(k, (char *)dst + i * ds, dst_type, buf, c, ov);
        }
    }
    mp_prof_leaf_leave(MP_PROF_CONVERT, t0);
}

void mp_convert_ex(void *dst, mp_dtype dst_type, const void *src, mp_dtype src_type, size_t n,
                   mp_overflow ov)
{
    if (n == 0) return;
    mp_convert_isa(mp_convert_path(dst_type, src_type), dst, dst_type, src, src_type, n, ov);
}

void mp_convert(void *dst, mp_dtype dst_type, const void *src, mp_dtype src_type, size_t n)
{
    mp_convert_ex(dst, dst_type, src, src_type, n, MP_OVERFLOW_SATURATE);
}
