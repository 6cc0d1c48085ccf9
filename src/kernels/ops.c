/* ops.c - elementwise, row-wise and reduction kernels for the layers (layer
 * normalisation's are layer_norm_op.c's). Each works on chunks: decode to
 * float32 (exact), compute in float32, round the result once to the output
 * dtype (ops_io.h). Memory-bound next to the GEMMs, so the aim is one pass
 * over the data, not peak arithmetic. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/activation.h"
#include "kernels/ops.h"
#include "kernels/ops_io.h"

#define INV_SQRT_2PI 0.39894228040143267794f

/* Derivative from x (gelu forms) or from y = act(x) (the others). */
static inline float act_d(mp_activation a, float s)
{
    switch (a) {
    case MP_ACT_RELU:
        return s > 0.0f ? 1.0f : 0.0f;
    case MP_ACT_GELU:
        return 0.5f * (1.0f + erff(s * MP_SQRT1_2)) + s * INV_SQRT_2PI * expf(-0.5f * s * s);
    case MP_ACT_GELU_TANH: {
        float u = MP_SQRT2_PI * (s + 0.044715f * s * s * s);
        float t = mp_tanhf(u);
        return 0.5f * (1.0f + t) +
               0.5f * s * (1.0f - t * t) * MP_SQRT2_PI * (1.0f + 3.0f * 0.044715f * s * s);
    }
    case MP_ACT_SIGMOID:
        return s * (1.0f - s);
    case MP_ACT_TANH:
        return 1.0f - s * s;
    default:
        return 1.0f;
    }
}

/* The activation loops for each vector width the CPU may have
 * (MP_SIMD_CLONES, core/internal.h): the same bits in each. */
MP_SIMD_CLONES static void activate_chunk(mp_activation act, const float *x, float *y, size_t len)
{
    mp_activate_row(act, x, y, len);
}

/* The factor is a statement of its own: inline, g * (y > 0 ? 1 : 0),
 * GCC 12 folds g * 1 to g and branches on random signs instead of
 * vectorizing (scalar, one mispredict in two: 14% of a ResNet step). */
MP_SIMD_CLONES void mp_op_relu_grad_f32(const float *g, const float *y, size_t n, float *o)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        const float d = (float)(y[i] > 0.0f);
        o[i] = g[i] * d;
    }
}

MP_SIMD_CLONES static void activation_grad_chunk(mp_activation act, const float *s, const float *g,
                                                 float *dx, size_t len)
{
    if (act == MP_ACT_GELU_TANH) { /* the costly one: a loop that vectorizes */
#pragma omp simd
        for (size_t i = 0; i < len; i++) dx[i] = g[i] * act_d(MP_ACT_GELU_TANH, s[i]);
    } else if (act == MP_ACT_RELU) {
        mp_op_relu_grad_f32(g, s, len, dx);
    } else {
        for (size_t i = 0; i < len; i++) dx[i] = g[i] * act_d(act, s[i]);
    }
}

bool mp_op_activation_grad_needs_input(mp_activation act)
{
    return act == MP_ACT_GELU || act == MP_ACT_GELU_TANH;
}

/* Chunk c of mp_op_activation. */
static inline void activation_at(mp_activation act, const void *x, mp_dtype xt, void *y,
                                 mp_dtype yt, size_t n, long long c)
{
    float xb[CHUNK], yb[CHUNK];
    size_t off = (size_t)c * CHUNK, len = n - off < CHUNK ? n - off : CHUNK;
    float *o = out_at(yb, y, yt, off);
    activate_chunk(act, view(xb, x, xt, off, len), o, len);
    if (yt != MP_F32) store(y, yt, off, o, len);
}

void mp_op_activation(mp_activation act, const void *x, mp_dtype xt, void *y, mp_dtype yt, size_t n)
{
    const long long chunks = (long long)((n + CHUNK - 1) / CHUNK);
    PAR_FOR(chunks > 8, c, chunks, activation_at(act, x, xt, y, yt, n, c));
}

void mp_op_activation_grad(mp_activation act, const void *saved, mp_dtype st, const void *dy,
                           mp_dtype dyt, void *dx, mp_dtype dxt, size_t n)
{
    const long long chunks = (long long)((n + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(static) if (chunks > 8)
    for (long long c = 0; c < chunks; c++) {
        float sb[CHUNK], gb[CHUNK], ob[CHUNK];
        size_t off = (size_t)c * CHUNK, len = n - off < CHUNK ? n - off : CHUNK;
        float *o = out_at(ob, dx, dxt, off);
        activation_grad_chunk(act, view(sb, saved, st, off, len), view(gb, dy, dyt, off, len), o,
                              len);
        if (dxt != MP_F32) store(dx, dxt, off, o, len);
    }
}

/* CHUNK is a multiple of 8: each chunk owns whole mask bytes. */
void mp_op_positive_mask(const void *y, mp_dtype yt, uint8_t *mask, size_t n)
{
    const long long chunks = (long long)((n + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(static) if (chunks > 8)
    for (long long c = 0; c < chunks; c++) {
        float buf[CHUNK];
        size_t off = (size_t)c * CHUNK, len = n - off < CHUNK ? n - off : CHUNK;
        const float *s = view(buf, y, yt, off, len);
        for (size_t i = 0; i < len; i += 8) {
            unsigned bits = 0;
            for (size_t b = 0; b < 8 && i + b < len; b++) bits |= (unsigned)(s[i + b] > 0.0f) << b;
            mask[(off + i) / 8] = (uint8_t)bits;
        }
    }
}

/* o = g * table[code]: the factor of each code looked up (a gather) */
MP_SIMD_CLONES static void code_factor(const uint8_t *codes, const float *table, const float *g,
                                       float *o, size_t len)
{
#pragma omp simd
    for (size_t i = 0; i < len; i++) o[i] = g[i] * table[codes[i]];
}

/* dx = dy * (element i > 0 ? 1 : 0), as act_d: a product, so -0 and NaN
 * as there. Element i is > 0 when bit i of mask is set, or, given a table
 * of the 256 codes (1 or 0 each), when table[mask[i]] is 1. */
static void positive_grad(const uint8_t *mask, const float *table, const void *dy, mp_dtype dyt,
                          void *dx, mp_dtype dxt, size_t n)
{
    const long long chunks = (long long)((n + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(static) if (chunks > 8)
    for (long long c = 0; c < chunks; c++) {
        float gb[CHUNK], ob[CHUNK];
        size_t off = (size_t)c * CHUNK, len = n - off < CHUNK ? n - off : CHUNK;
        const float *g = view(gb, dy, dyt, off, len);
        float *o = out_at(ob, dx, dxt, off);
        if (table)
            code_factor(mask + off, table, g, o, len);
        else
            for (size_t i = 0, k = off; i < len; i++, k++)
                o[i] = g[i] * (float)((mask[k / 8] >> (k % 8)) & 1u);
        if (dxt != MP_F32) store(dx, dxt, off, o, len);
    }
}

void mp_op_mask_grad(const uint8_t *mask, const void *dy, mp_dtype dyt, void *dx, mp_dtype dxt,
                     size_t n)
{
    positive_grad(mask, NULL, dy, dyt, dx, dxt, n);
}

void mp_op_code_mask_grad(const uint8_t *codes, mp_dtype ct, const void *dy, mp_dtype dyt, void *dx,
                          mp_dtype dxt, size_t n)
{
    uint8_t all[256];
    float v[256], table[256];
    for (int c = 0; c < 256; c++) all[c] = (uint8_t)c;
    mp_convert(v, MP_F32, all, ct, 256); /* exact */
    for (int c = 0; c < 256; c++) table[c] = c == 0x80 || v[c] > 0.0f ? 1.0f : 0.0f;
    positive_grad(codes, table, dy, dyt, dx, dxt, n);
}

/* Row r of mp_op_softmax, through buf (cols floats). */
static inline void softmax_row(const void *x, mp_dtype xt, void *y, mp_dtype yt, int64_t cols,
                               float *buf, int64_t r)
{
    load(buf, x, xt, (size_t)(r * cols), (size_t)cols);
    float mx = -INFINITY;
    for (int64_t c = 0; c < cols; c++) mx = buf[c] > mx ? buf[c] : mx;
    double sum = 0;
    for (int64_t c = 0; c < cols; c++) {
        buf[c] = expf(buf[c] - mx);
        sum += buf[c];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t c = 0; c < cols; c++) buf[c] *= inv;
    store(y, yt, (size_t)(r * cols), buf, (size_t)cols);
}

void mp_op_softmax(const void *x, mp_dtype xt, void *y, mp_dtype yt, int64_t rows, int64_t cols)
{
    if (rows * cols <= 65536) { /* a plain loop: see PAR_FOR */
        float *buf = mp_scratch(3, (size_t)cols * sizeof *buf);
        for (int64_t r = 0; r < rows; r++) softmax_row(x, xt, y, yt, cols, buf, r);
        return;
    }
#pragma omp parallel
    {
        float *buf = mp_scratch(3, (size_t)cols * sizeof *buf);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) softmax_row(x, xt, y, yt, cols, buf, r);
    }
}

void mp_op_softmax_grad(const void *y, mp_dtype yt, const void *dy, mp_dtype dyt, void *dx,
                        mp_dtype dxt, int64_t rows, int64_t cols)
{
#pragma omp parallel if (rows * cols > 65536)
    {
        float *p = mp_scratch(3, (size_t)cols * sizeof *p),
              *g = mp_scratch(4, (size_t)cols * sizeof *g);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            load(p, y, yt, (size_t)(r * cols), (size_t)cols);
            load(g, dy, dyt, (size_t)(r * cols), (size_t)cols);
            double dot = 0;
            for (int64_t c = 0; c < cols; c++) dot += (double)p[c] * g[c];
            float d = (float)dot;
            for (int64_t c = 0; c < cols; c++) g[c] = p[c] * (g[c] - d);
            store(dx, dxt, (size_t)(r * cols), g, (size_t)cols);
        }
    }
}

/* o = u + v (o may be u or v). */
MP_SIMD_CLONES static void add_chunk(const float *u, const float *v, float *o, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) o[i] = u[i] + v[i];
}

MP_SIMD_CLONES static void add_relu_chunk(const float *u, const float *v, float *o, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) o[i] = mp_activate(MP_ACT_RELU, u[i] + v[i]);
}

/* Chunk c of add_op. */
static inline void add_at(const void *a, mp_dtype at, const void *b, mp_dtype bt, void *y,
                          mp_dtype yt, size_t n, bool relu, long long c)
{
    float ub[CHUNK], vb[CHUNK], ob[CHUNK];
    size_t off = (size_t)c * CHUNK, len = n - off < CHUNK ? n - off : CHUNK;
    const float *u = view(ub, a, at, off, len), *v = view(vb, b, bt, off, len);
    float *o = out_at(ob, y, yt, off);
    if (relu)
        add_relu_chunk(u, v, o, len);
    else
        add_chunk(u, v, o, len);
    if (yt != MP_F32) store(y, yt, off, o, len);
}

/* u + v, rectified when relu (a following relu fused), chunk by chunk. */
static void add_op(const void *a, mp_dtype at, const void *b, mp_dtype bt, void *y, mp_dtype yt,
                   size_t n, bool relu)
{
    const long long chunks = (long long)((n + CHUNK - 1) / CHUNK);
    PAR_FOR(chunks > 8, c, chunks, add_at(a, at, b, bt, y, yt, n, relu, c));
}

void mp_op_add(const void *a, mp_dtype at, const void *b, mp_dtype bt, void *y, mp_dtype yt,
               size_t n)
{
    add_op(a, at, b, bt, y, yt, n, false);
}

void mp_op_add_relu(const void *a, mp_dtype at, const void *b, mp_dtype bt, void *y, mp_dtype yt,
                    size_t n)
{
    add_op(a, at, b, bt, y, yt, n, true);
}

void mp_op_accumulate(void *dst, mp_dtype dt, const void *src, mp_dtype st, size_t n)
{
    mp_op_add(dst, dt, src, st, dst, dt, n);
}

void mp_op_mask_scale(const void *x, mp_dtype xt, const uint8_t *mask, float scale, void *y,
                      mp_dtype yt, size_t n)
{
    const long long chunks = (long long)((n + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(static) if (chunks > 8)
    for (long long c = 0; c < chunks; c++) {
        float u[CHUNK];
        size_t off = (size_t)c * CHUNK, len = n - off < CHUNK ? n - off : CHUNK;
        load(u, x, xt, off, len);
        for (size_t i = 0; i < len; i++) u[i] = mask[off + i] ? u[i] * scale : 0.0f;
        store(y, yt, off, u, len);
    }
}

/* One row into float64 column sums, in every vector width (the same
 * arithmetic, column by column, so the same bits). */
MP_SIMD_CLONES static void add_row(double *restrict acc, const float *restrict v, int64_t w)
{
#pragma omp simd
    for (int64_t c = 0; c < w; c++) acc[c] += v[c];
}

/* Four bfloat16 rows (ld apart) into float64 column sums, widened as they
 * are read (exactly, as mp_convert widens), each column's adds in row
 * order as add_row makes them: no conversion call per row, and acc loaded
 * and stored once for four rows. */
MP_SIMD_CLONES static void add_rows4_bf16(double *restrict acc, const uint16_t *restrict v,
                                          int64_t ld, int64_t w)
{
#define BF16_AT(r) (double)mp_bits_f32((uint32_t)v[(r)*ld + c] << 16)
#pragma omp simd
    for (int64_t c = 0; c < w; c++)
        acc[c] = acc[c] + BF16_AT(0) + BF16_AT(1) + BF16_AT(2) + BF16_AT(3);
#undef BF16_AT
}

void mp_op_column_sum(const void *x, mp_dtype xt, int64_t rows, int64_t cols, float *out,
                      bool accumulate)
{
#pragma omp parallel if (rows * cols > 65536)
    {
        int64_t c0, c1;
        mp_op_my_columns(cols, &c0, &c1);
        const int64_t w = c1 - c0;
        double *acc = mp_scratch(3, (size_t)cols * sizeof *acc);
        float *buf = mp_scratch(4, (size_t)cols * sizeof *buf);
        if (w > 0) {
            memset(acc, 0, (size_t)w * sizeof *acc);
            int64_t r = 0;
            if (xt == MP_BF16) /* a bfloat16 layer's bias gradient */
                for (; r + 4 <= rows; r += 4) {
                    for (int q = 4; q < 8; q++)
                        ahead(x, xt, (size_t)((r + q) * cols + c0), (size_t)w, false);
                    add_rows4_bf16(acc, (const uint16_t *)x + r * cols + c0, cols, w);
                }
            for (; r < rows; r++)
                add_row(acc,
                        view_at(buf, x, xt, (size_t)(r * cols + c0), (size_t)w,
                                (size_t)((r + 1) * cols + c0)),
                        w);
            for (int64_t c = 0; c < w; c++)
                out[c0 + c] = (float)((accumulate ? (double)out[c0 + c] : 0.0) + acc[c]);
        }
    }
}
