/* ops.c - elementwise, row-wise and reduction kernels for the layers. Each
 * works on chunks: decode to float32 (exact), compute in float32, round the
 * result once to the output dtype. Memory-bound next to the GEMMs, so the
 * aim is one pass over the data, not peak arithmetic. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/activation.h"
#include "kernels/ops.h"

#define CHUNK 2048

/* for (long long c = 0; c < n; c++) call; as a parallel loop only where
 * par. A region whose if clause is false still enters the OpenMP runtime,
 * which sets up and frees a team of one: 0.28 us a region (AMD Zen 5), and
 * a decoded token of gpt_mini ran 27 of them (its adds, layer norms,
 * activation, softmax: 8% of its time). Here the serial case is a loop. */
#define PAR_FOR(par, c, n, call)                                                                   \
    do {                                                                                           \
        if (par) {                                                                                 \
            _Pragma("omp parallel for schedule(static)") for (long long c = 0; c < (n); c++) call; \
        } else {                                                                                   \
            for (long long c = 0; c < (n); c++) call;                                              \
        }                                                                                          \
    } while (0)

/* The lines of the n elements from element `next` asked for, for reading
 * or for writing, while the chunk before them is worked on. A chunk is a
 * page or two, and the hardware prefetchers stop at page boundaries: each
 * chunk used to begin by waiting for every one of its lines (the relu
 * gradient of 1024 x 4096 bfloat16 values, 2 threads, Zen 5: 1.6 -> 0.83
 * ms; their column sums 0.49 -> 0.34 ms). The addresses are computed as
 * integers: past an array's end they are never dereferenced, and a
 * prefetch does not fault. */
static inline void ahead(const void *base, mp_dtype t, size_t next, size_t n, bool write)
{
    const size_t es = mp_dtype_size(t);
    const uintptr_t p = (uintptr_t)base + next * es;
    if (write)
        for (size_t b = 0; b < n * es; b += 64) __builtin_prefetch((const void *)(p + b), 1);
    else
        for (size_t b = 0; b < n * es; b += 64) __builtin_prefetch((const void *)(p + b), 0);
}

/* n elements from off decoded into dst; those from `next` asked for. */
static inline void load_at(float *dst, const void *src, mp_dtype t, size_t off, size_t n,
                           size_t next)
{
    mp_convert(dst, MP_F32, (const char *)src + off * mp_dtype_size(t), t, n);
    ahead(src, t, next, n, false);
}
/* The same where the next n elements follow: chunks and rows in order. */
static inline void load(float *dst, const void *src, mp_dtype t, size_t off, size_t n)
{
    load_at(dst, src, t, off, n, off + n);
}
static inline void store(void *dst, mp_dtype t, size_t off, const float *src, size_t n)
{
    mp_convert((char *)dst + off * mp_dtype_size(t), t, src, MP_F32, n);
    ahead(dst, t, off + n, n, true);
}
/* n elements from off, read in place when they are float32 already,
 * decoded into buf otherwise; those from `next` asked for. */
static inline const float *view_at(float *buf, const void *src, mp_dtype t, size_t off, size_t n,
                                   size_t next)
{
    if (t != MP_F32) {
        load_at(buf, src, t, off, n, next);
        return buf;
    }
    ahead(src, t, next, n, false);
    return (const float *)src + off;
}
static inline const float *view(float *buf, const void *src, mp_dtype t, size_t off, size_t n)
{
    return view_at(buf, src, t, off, n, off + n);
}
/* Where a result of n elements at off is computed: straight into dst when it
 * is float32, else into buf for store() to round. */
static inline float *out_at(float *buf, void *dst, mp_dtype t, size_t off)
{
    return t == MP_F32 ? (float *)dst + off : buf;
}

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

/* Column reductions give each thread a contiguous range of columns (in
 * steps of 16) and sum every column over the rows in order: the same bits
 * for any thread count, and each row read in one piece. */
static void my_columns(int64_t cols, int64_t *c0, int64_t *c1)
{
#ifdef _OPENMP
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
    const int64_t t = 0, nt = 1;
#endif
    const int64_t units = (cols + 15) / 16;
    *c0 = units * t / nt * 16;
    *c1 = units * (t + 1) / nt * 16;
    if (*c0 > cols) *c0 = cols;
    if (*c1 > cols) *c1 = cols;
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

/* One row into layer norm's parameter gradients: dg += dy * x_hat, db += dy. */
MP_SIMD_CLONES static void add_norm_row(double *restrict dg, double *restrict db,
                                        const float *restrict x, const float *restrict dy,
                                        float mean, float rstd, int64_t w)
{
#pragma omp simd
    for (int64_t c = 0; c < w; c++) {
        float h = (x[c] - mean) * rstd;
        dg[c] += (double)dy[c] * h;
        db[c] += dy[c];
    }
}

void mp_op_column_sum(const void *x, mp_dtype xt, int64_t rows, int64_t cols, float *out,
                      bool accumulate)
{
#pragma omp parallel if (rows * cols > 65536)
    {
        int64_t c0, c1;
        my_columns(cols, &c0, &c1);
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

/* Row statistics in float64, in LANES interleaved partial sums (element c
 * goes to lane c % LANES) added up in lane order at the end: a fixed order,
 * so the same bits on every run and thread count, and loops the compiler
 * vectorizes (one running sum would chain every add on the last). */
#define LANES 8

/* The body of a row statistic: eight named lanes (so they stay in
 * registers and the adds vectorize), element i to lane i % 8, the tail
 * too, then the lanes added in order. */
#define LANE_SUM(n, T)                                                                             \
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;                         \
    int64_t c = 0;                                                                                 \
    for (; c + LANES <= (n); c += LANES) {                                                         \
        a0 += T(c);                                                                                \
        a1 += T(c + 1);                                                                            \
        a2 += T(c + 2);                                                                            \
        a3 += T(c + 3);                                                                            \
        a4 += T(c + 4);                                                                            \
        a5 += T(c + 5);                                                                            \
        a6 += T(c + 6);                                                                            \
        a7 += T(c + 7);                                                                            \
    }                                                                                              \
    double *lane[LANES] = {&a0, &a1, &a2, &a3, &a4, &a5, &a6, &a7};                                \
    for (int j = 0; c + j < (n); j++) *lane[j] += T(c + j);                                        \
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7

MP_SIMD_CLONES static double row_sum(const float *x, int64_t n)
{
#define T(i) (double)x[i]
    LANE_SUM(n, T);
#undef T
}

MP_SIMD_CLONES static double row_dot(const float *x, const float *y, int64_t n)
{
#define T(i) (double)x[i] * y[i]
    LANE_SUM(n, T);
#undef T
}

MP_SIMD_CLONES static double row_sq_dev(const float *x, double mu, int64_t n)
{
#define T(i) ((double)x[i] - mu) * ((double)x[i] - mu)
    LANE_SUM(n, T);
#undef T
}

/* The elementwise parts of layer norm, in every vector width (the same
 * arithmetic element by element, so the same bits). o may be x. */
MP_SIMD_CLONES static void norm_row(const float *x, float m, float rs, const float *gamma,
                                    const float *beta, float *o, int64_t n)
{
#pragma omp simd
    for (int64_t c = 0; c < n; c++) o[c] = (x[c] - m) * rs * gamma[c] + beta[c];
}

/* x_hat and the gradient w.r.t. the normalised value, gamma * dy. */
MP_SIMD_CLONES static void norm_grad_in(const float *restrict x, const float *restrict dy, float m,
                                        float rs, const float *restrict gamma, float *restrict xh,
                                        float *restrict g, int64_t n)
{
#pragma omp simd
    for (int64_t c = 0; c < n; c++) {
        xh[c] = (x[c] - m) * rs;
        g[c] = dy[c] * gamma[c];
    }
}

/* dx = rstd (g - mean(g) - x_hat mean(g x_hat)); o may be g. */
MP_SIMD_CLONES static void norm_grad_out(const float *g, const float *xh, float rs, float md,
                                         float mdx, float *o, int64_t n)
{
#pragma omp simd
    for (int64_t c = 0; c < n; c++) o[c] = rs * (g[c] - md - xh[c] * mdx);
}

/* Row r of mp_op_layer_norm, through xb and yb (cols floats each). */
static inline void layer_norm_row(const void *x, mp_dtype xt, const float *gamma, const float *beta,
                                  float eps, void *y, mp_dtype yt, float *mean, float *rstd,
                                  int64_t cols, float *xb, float *yb, int64_t r)
{
    const size_t off = (size_t)(r * cols);
    const float *xv = view(xb, x, xt, off, (size_t)cols);
    double mu = row_sum(xv, cols) / (double)cols, s2 = row_sq_dev(xv, mu, cols);
    float m = (float)mu, rs = (float)(1.0 / sqrt(s2 / (double)cols + (double)eps));
    mean[r] = m;
    rstd[r] = rs;
    float *o = out_at(yb, y, yt, off);
    norm_row(xv, m, rs, gamma, beta, o, cols);
    if (yt != MP_F32) store(y, yt, off, o, (size_t)cols);
}

void mp_op_layer_norm(const void *x, mp_dtype xt, const float *gamma, const float *beta, float eps,
                      void *y, mp_dtype yt, float *mean, float *rstd, int64_t rows, int64_t cols)
{
    if (rows * cols <= 65536) { /* a plain loop: see PAR_FOR */
        float *xb = mp_scratch(3, (size_t)cols * sizeof *xb),
              *yb = mp_scratch(4, (size_t)cols * sizeof *yb);
        for (int64_t r = 0; r < rows; r++)
            layer_norm_row(x, xt, gamma, beta, eps, y, yt, mean, rstd, cols, xb, yb, r);
        return;
    }
#pragma omp parallel
    {
        float *xb = mp_scratch(3, (size_t)cols * sizeof *xb),
              *yb = mp_scratch(4, (size_t)cols * sizeof *yb);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            layer_norm_row(x, xt, gamma, beta, eps, y, yt, mean, rstd, cols, xb, yb, r);
    }
}

/* Two passes: rows in parallel for dx, then column strips in parallel for
 * dgamma and dbeta (x normalised again on the way, by the same formula). */
void mp_op_layer_norm_grad(const void *x, mp_dtype xt, const float *gamma, const float *mean,
                           const float *rstd, const void *dy, mp_dtype dyt, void *dx, mp_dtype dxt,
                           float *dgamma, float *dbeta, bool accumulate, int64_t rows, int64_t cols)
{
    const bool par = rows * cols > 65536;
#pragma omp parallel if (par)
    {
        float *xb = mp_scratch(3, (size_t)cols * sizeof *xb),
              *gb = mp_scratch(4, (size_t)cols * sizeof *gb),
              *xh = mp_scratch(5, (size_t)cols * sizeof *xh),
              *g = mp_scratch(6, (size_t)cols * sizeof *g);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const size_t off = (size_t)(r * cols);
            const float *xv = view(xb, x, xt, off, (size_t)cols),
                        *gv = view(gb, dy, dyt, off, (size_t)cols);
            norm_grad_in(xv, gv, mean[r], rstd[r], gamma, xh, g, cols);
            const double sum_d = row_sum(g, cols), sum_dx = row_dot(g, xh, cols);
            float md = (float)(sum_d / (double)cols), mdx = (float)(sum_dx / (double)cols);
            float *o = out_at(g, dx, dxt, off);
            norm_grad_out(g, xh, rstd[r], md, mdx, o, cols);
            if (dxt != MP_F32) store(dx, dxt, off, o, (size_t)cols);
        }
    }
#pragma omp parallel if (par)
    {
        int64_t c0, c1;
        my_columns(cols, &c0, &c1);
        const int64_t w = c1 - c0;
        double *dg = mp_scratch(3, (size_t)cols * sizeof *dg),
               *db = mp_scratch(4, (size_t)cols * sizeof *db);
        float *xb = mp_scratch(5, (size_t)cols * sizeof *xb),
              *gb = mp_scratch(6, (size_t)cols * sizeof *gb);
        if (w > 0) {
            memset(dg, 0, (size_t)w * sizeof *dg);
            memset(db, 0, (size_t)w * sizeof *db);
            for (int64_t r = 0; r < rows; r++) {
                const size_t off = (size_t)(r * cols + c0), next = off + (size_t)cols;
                add_norm_row(dg, db, view_at(xb, x, xt, off, (size_t)w, next),
                             view_at(gb, dy, dyt, off, (size_t)w, next), mean[r], rstd[r], w);
            }
            for (int64_t c = 0; c < w; c++) {
                dgamma[c0 + c] = (float)((accumulate ? (double)dgamma[c0 + c] : 0.0) + dg[c]);
                dbeta[c0 + c] = (float)((accumulate ? (double)dbeta[c0 + c] : 0.0) + db[c]);
            }
        }
    }
}
