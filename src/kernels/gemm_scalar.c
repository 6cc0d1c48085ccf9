/* gemm_scalar.c - the portable GEMM path: element widening, a generic packer
 * for any dtype/stride, the reference epilogue and a plain-C microkernel.
 * It is the reference the SIMD paths are checked against and runs anywhere. */
#include <math.h>

#include "kernels/gemm_internal.h"

float mp_gemm_load_f32(const void *base, mp_dtype t, int64_t idx)
{
    switch (t) {
    case MP_F32:
        return ((const float *)base)[idx];
    case MP_F16:
        return mp_f16_to_f32(((const uint16_t *)base)[idx]);
    case MP_BF16:
        return mp_bf16_to_f32(((const uint16_t *)base)[idx]);
    case MP_F8E4M3:
        return mp_e4m3_to_f32(((const uint8_t *)base)[idx]);
    case MP_F8E5M2:
        return mp_e5m2_to_f32(((const uint8_t *)base)[idx]);
    case MP_I32: /* not a GEMM operand: mp_gemm_ex refuses it */
        break;
    }
    return 0.0f;
}

/* Only called for bf16 and fp8, whose values all fit bf16 exactly, so
 * truncating the f32 bits loses nothing. */
uint16_t mp_gemm_load_bf16(const void *base, mp_dtype t, int64_t idx)
{
    if (t == MP_BF16) return ((const uint16_t *)base)[idx];
    return (uint16_t)(mp_f32_bits(mp_gemm_load_f32(base, t, idx)) >> 16);
}

void mp_gemm_pack_generic(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0, int64_t nd,
                          int W, gemm_fmt fmt, void *dst)
{
    const int64_t es = (int64_t)mp_dtype_size(op->type);
    const char *base = (const char *)op->base;
    if (fmt == GEMM_FMT_F32) {
        float *p = dst;
        for (int64_t w = 0; w < nw; w += W) {
            int64_t nv = nw - w < W ? nw - w : W;
            for (int64_t d = 0; d < nd; d++) {
                const char *row = base + ((w0 + w) * op->sw + (d0 + d) * op->sd) * es;
                for (int64_t i = 0; i < nv; i++)
                    p[d * W + i] = mp_gemm_load_f32(row, op->type, i * op->sw);
                for (int64_t i = nv; i < W; i++) p[d * W + i] = 0.0f;
            }
            p += nd * W;
        }
    } else {
        uint16_t *p = dst;
        int64_t kp = (nd + 1) / 2;
        for (int64_t w = 0; w < nw; w += W) {
            int64_t nv = nw - w < W ? nw - w : W;
            for (int64_t d = 0; d < 2 * kp; d++) {
                uint16_t *q = p + (d / 2) * 2 * W + (d & 1);
                if (d >= nd) {
                    for (int64_t i = 0; i < W; i++) q[2 * i] = 0;
                    continue;
                }
                const char *row = base + ((w0 + w) * op->sw + (d0 + d) * op->sd) * es;
                for (int64_t i = 0; i < nv; i++)
                    q[2 * i] = mp_gemm_load_bf16(row, op->type, i * op->sw);
                for (int64_t i = nv; i < W; i++) q[2 * i] = 0;
            }
            p += kp * 2 * W;
        }
    }
}

/* The order alpha*acc, beta*c, sum, + bias is the one every epilogue uses
 * (without contraction), so all ISA paths round the same way here. */
void mp_gemm_epilogue_scalar(const gemm_epilogue *e, const float *t, int64_t ldt, int64_t i0,
                             int64_t j0, int64_t mr, int64_t nr)
{
    const int64_t rs = e->trans ? 1 : e->ldc, cs = e->trans ? e->ldc : 1;
    for (int64_t i = 0; i < mr; i++) {
        for (int64_t j = 0; j < nr; j++) {
            const int64_t ci = (i0 + i) * rs + (j0 + j) * cs;
            float v = e->alpha * t[i * ldt + j];
            if (e->beta != 0.0f) {
                float cb = e->beta * mp_gemm_load_f32(e->c, e->c_type, ci);
                v = v + cb;
            }
            if (e->bias) v = v + e->bias[e->trans ? i0 + i : j0 + j];
            v = mp_activate(e->act, v);
            switch (e->c_type) {
            case MP_BF16:
                ((uint16_t *)e->c)[ci] = mp_f32_to_bf16(v);
                break;
            case MP_F16:
                ((uint16_t *)e->c)[ci] = mp_f32_to_f16(v);
                break;
            default:
                ((float *)e->c)[ci] = v;
                break;
            }
        }
    }
}

void mp_gemm_epilogue_transposed(const gemm_epilogue *e, const float *t, int64_t ldt, int64_t i0,
                                 int64_t j0, int64_t mr, int64_t nr, float *tt, int w,
                                 gemm_epilogue_fn plain_epilogue)
{
    gemm_epilogue plain = *e;
    plain.trans = false;
    for (int64_t i = 0; i < w; i++)
        for (int64_t j = 0; j < nr; j++) tt[j * w + i] = i < mr ? t[i * ldt + j] : 0.0f;
    plain_epilogue(&plain, tt, w, j0, i0, nr, mr);
}

enum { SMR = 4, SNR = 16 };

/* Plain loops over a small tile: simple enough for any compiler to keep the
 * accumulators in registers or vectorise them. */
static void kernel_scalar(int64_t kc, const void *a, const void *b, float *c, int64_t ldc, int acc)
{
    const float *ap = a, *bp = b;
    float t[SMR][SNR];
    /* Starting from the stored partial sum keeps the summation order that of
     * one long loop, whatever the depth blocking. */
    for (int i = 0; i < SMR; i++)
        for (int j = 0; j < SNR; j++) t[i][j] = acc ? c[i * ldc + j] : 0.0f;
    for (int64_t k = 0; k < kc; k++) {
        for (int i = 0; i < SMR; i++) {
            float av = ap[k * SMR + i];
            for (int j = 0; j < SNR; j++) t[i][j] += av * bp[k * SNR + j];
        }
    }
    for (int i = 0; i < SMR; i++)
        for (int j = 0; j < SNR; j++) c[i * ldc + j] = t[i][j];
}

static void pack_scalar(const gemm_operand *op, int64_t w0, int64_t nw, int64_t d0, int64_t nd,
                        int W, void *dst)
{
    mp_gemm_pack_generic(op, w0, nw, d0, nd, W, GEMM_FMT_F32, dst);
}

const gemm_impl mp_gemm_scalar_impl = {
    .fmt = GEMM_FMT_F32,
    .mr = SMR,
    .nr = SNR,
    .kc = 256,
    .mc = 128,
    .nc = 512,
    .kernel = kernel_scalar,
    .pack = pack_scalar,
    .epilogue = mp_gemm_epilogue_scalar,
};
