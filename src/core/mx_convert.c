/* mx_convert.c - the MX calls of mixprec/mx.h: argument checks (one-line
 * errors naming the bad value), then the kernels of the measured path
 * (mx_dispatch.c; or of an explicit one, for tests and benchmarks). */
#include "mx_internal.h"

const mp_mx_kernels *mp_mx_kernels_for(mp_isa isa)
{
#if MP_X86
    if (isa >= MP_ISA_AVX512) return &mp_mx_avx512_kernels;
    if (isa == MP_ISA_AVX2) return &mp_mx_avx2_kernels;
#else
    (void)isa;
#endif
    return &mp_mx_scalar_kernels;
}

static mp_status check_common(const char *fn, mp_mx_format f, int block_size)
{
    if (!mp_mx_format_valid(f))
        return mp_set_error(MP_ERR_INVALID, "%s: unknown MX format %d", fn, (int)f);
    if (block_size != MP_MX_BLOCK)
        return mp_set_error(MP_ERR_INVALID,
                            "%s: MX block size %d is not supported (the OCP MX specification "
                            "defines %s with blocks of %d)",
                            fn, block_size, mp_mx_format_name(f), MP_MX_BLOCK);
    return MP_OK;
}

static mp_status check_dst_type(const char *fn, mp_dtype t)
{
    if (t == MP_F32 || t == MP_BF16) return MP_OK;
    return mp_set_error(MP_ERR_INVALID, "%s: MX values decode to float32 or bfloat16, not %s", fn,
                        mp_dtype_name(t));
}

mp_status mp_mx_pack_isa(mp_isa isa, mp_mx_format f, int block_size, const float *src, size_t n,
                         void *codes, uint8_t *scales)
{
    mp_status st = check_common("mp_mx_pack", f, block_size);
    if (st) return st;
    if (n == 0) return MP_OK;
    if (!src || !codes || !scales)
        return mp_set_error(MP_ERR_INVALID, "mp_mx_pack: NULL %s with n = %zu",
                            !src     ? "src"
                            : !codes ? "codes"
                                     : "scales",
                            n);
    mp_mx_kernels_for(isa)->pack(f, src, n, codes, scales);
    return MP_OK;
}

mp_status mp_mx_unpack_isa(mp_isa isa, mp_mx_format f, int block_size, const void *codes,
                           const uint8_t *scales, size_t n, void *dst, mp_dtype dst_type)
{
    mp_status st = check_common("mp_mx_unpack", f, block_size);
    if (!st) st = check_dst_type("mp_mx_unpack", dst_type);
    if (st) return st;
    if (n == 0) return MP_OK;
    if (!codes || !scales || !dst)
        return mp_set_error(MP_ERR_INVALID, "mp_mx_unpack: NULL %s with n = %zu",
                            !codes    ? "codes"
                            : !scales ? "scales"
                                      : "dst",
                            n);
    mp_mx_kernels_for(isa)->unpack(f, codes, scales, n, dst, dst_type);
    return MP_OK;
}

mp_status mp_mx_quantize_2d_isa(mp_isa isa, mp_mx_format f, int block_size, int64_t rows,
                                int64_t cols, int axis, const float *src, void *dst,
                                mp_dtype dst_type)
{
    static const char fn[] = "mp_mx_quantize_2d";
    mp_status st = check_common(fn, f, block_size);
    if (!st) st = check_dst_type(fn, dst_type);
    if (st) return st;
    if (axis != 0 && axis != 1)
        return mp_set_error(MP_ERR_INVALID, "%s: axis %d is not 0 (columns) or 1 (rows)", fn, axis);
    if (rows < 0 || cols < 0)
        return mp_set_error(MP_ERR_INVALID, "%s: negative shape [%lld, %lld]", fn, (long long)rows,
                            (long long)cols);
    if (rows == 0 || cols == 0) return MP_OK;
    if (!src || !dst) return mp_set_error(MP_ERR_INVALID, "%s: NULL %s", fn, !src ? "src" : "dst");
    if (dst == (const void *)src && dst_type != MP_F32)
        return mp_set_error(MP_ERR_INVALID, "%s: in place needs a float32 destination, not %s", fn,
                            mp_dtype_name(dst_type));
    const mp_mx_kernels *k = mp_mx_kernels_for(isa);
    if (axis == 1)
        k->quantize_rows(f, src, (size_t)rows, (size_t)cols, dst, dst_type);
    else
        k->quantize_cols(f, src, (size_t)rows, (size_t)cols, dst, dst_type);
    return MP_OK;
}

mp_status mp_mx_pack(mp_mx_format f, int block_size, const float *src, size_t n, void *codes,
                     uint8_t *scales)
{
    return mp_mx_pack_isa(mp_mx_path(MP_MX_OP_PACK), f, block_size, src, n, codes, scales);
}

mp_status mp_mx_unpack(mp_mx_format f, int block_size, const void *codes, const uint8_t *scales,
                       size_t n, void *dst, mp_dtype dst_type)
{
    return mp_mx_unpack_isa(mp_mx_path(MP_MX_OP_UNPACK), f, block_size, codes, scales, n, dst,
                            dst_type);
}

mp_status mp_mx_quantize_2d(mp_mx_format f, int block_size, int64_t rows, int64_t cols, int axis,
                            const float *src, void *dst, mp_dtype dst_type)
{
    return mp_mx_quantize_2d_isa(mp_mx_path(axis == 1 ? MP_MX_OP_ROWS : MP_MX_OP_COLS), f,
                                 block_size, rows, cols, axis, src, dst, dst_type);
}
