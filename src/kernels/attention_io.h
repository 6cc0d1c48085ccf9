/* attention_io.h - what the fused attention kernel's files (attention.c:
 * forward and decoding; attention_backward.c) share: the tile size and
 * scratch slot, the per-vector-width clones, and the rows' I/O: a row of a
 * (batch, head) widened to float32 in scratch (transposed in 8 x 8 register
 * blocks for K^T and V^T), rounded once on the way out, the next rows
 * asked for ahead. Internal to the kernel. */
#ifndef MP_KERNELS_ATTENTION_IO_H
#define MP_KERNELS_ATTENTION_IO_H

#include <math.h>
#include <string.h>

#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/attention_rows.h"

#define TILE MP_ATTN_TILE
#define SLOT 3

/* The tile loops for each vector width the CPU may have (chosen once at
 * load): the arithmetic, and so every bit of the results, is the same in
 * each (explicit fmaf, exactly rounded everywhere: an FMA instruction in the
 * AVX-512 and x86-64-v3 clones, the C library's in the default one, slow but
 * the same bits; no other contraction in ISO C mode). The middle clone is
 * chosen by features (AVX2, FMA, ...): "arch=haswell", as it was, is chosen
 * only on a CPU GCC's runtime names Haswell, so AMD's AVX2 cores (Zen 1-3)
 * ran the default clone and its fmaf calls: on a Zen 3 (family 25 model 1)
 * gpt_mini's attention ran at 0.03-0.06x of the plain formula's GEMMs. */
#if MP_X86 && defined(__GNUC__) && !defined(__clang__)
#define TILE_CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#else
#define TILE_CLONES
#endif

/* T rows rounded up to whole tiles: the rows a head's tiles kept in scratch
 * take (the forward's key tiles, the backward's query side, whose last
 * group of four reads zeros past T). */
static inline size_t tile_rows(int64_t t) { return (size_t)((t + TILE - 1) / TILE * TILE); }

/* A thread's scratch for a parallel region of the kernel, or NULL with
 * *fail set (the region's threads skip their tasks). */
static inline float *region_scratch(size_t bytes, int *fail)
{
    float *ws = mp_scratch(SLOT, bytes);
    if (!ws) {
#pragma omp atomic write
        *fail = 1;
    }
    return ws;
}

/* The error of a region that could not have its scratch. */
static inline mp_status scratch_error(const char *what, size_t bytes)
{
    return mp_set_error(MP_ERR_NOMEM, "attention %s: %zu bytes of scratch per thread", what, bytes);
}

static inline mp_status check_geom(const mp_attn_geom *g, const char *what)
{
    if (!g || g->batch < 1 || g->t < 1 || g->heads < 1 || g->d < 1 || g->d > 4096)
        return mp_set_error(MP_ERR_INVALID, "attention %s: bad geometry", what);
    return MP_OK;
}

/* Element offset of row i, head h, batch b. */
static inline size_t row_off(const mp_attn_geom *g, int64_t b, int64_t h, int64_t i)
{
    return (size_t)(((b * g->t + i) * g->heads + h) * g->d);
}

/* Bytes of an element, inline for the types attention sees (mp_dtype_size
 * is a call, and it ran per row: 1.3% of gpt_mini's attention). */
static inline size_t elem_size(mp_dtype t)
{
    return t == MP_F32 ? 4 : t == MP_BF16 || t == MP_F16 ? 2 : mp_dtype_size(t);
}

/* One row widened to float32 and padded with zeros to a multiple of CH.
 * bfloat16 (every mixed_bfloat16 step) is widened here, by the shift that
 * is the exact conversion: the kernel loads hundreds of thousands of rows
 * of 64 a training step of gpt_mini, and mp_convert's dispatch per call
 * cost more than the conversion. */
INLINE void load_row(float *dst, const void *src, mp_dtype t, size_t off, int64_t d)
{
    const char *p = (const char *)src + off * elem_size(t);
    if (t == MP_F32) {
        memcpy(dst, p, (size_t)d * sizeof(float));
    } else if (t == MP_BF16) {
        const uint16_t *h = (const uint16_t *)p;
#pragma omp simd
        for (int64_t i = 0; i < d; i++) dst[i] = mp_bits_f32((uint32_t)h[i] << 16);
    } else {
        mp_convert(dst, MP_F32, p, t, (size_t)d);
    }
    memset(dst + d, 0, (pad16((size_t)d) - (size_t)d) * sizeof(float));
}

/* One row rounded once to t. bfloat16 here, by mp_f32_to_bf16's
 * definition (mp_bf16_from_bits) in a loop that vectorizes: an mp_convert
 * call per 64-element row took a seventh of the kernel's time in
 * gpt_mini's bf16 steps. */
INLINE void store_row(void *dst, mp_dtype t, size_t off, const float *src, int64_t d)
{
    if (t != MP_BF16) {
        mp_convert((char *)dst + off * elem_size(t), t, src, MP_F32, (size_t)d);
        return;
    }
    uint16_t *h = (uint16_t *)dst + off;
#pragma omp simd
    for (int64_t i = 0; i < d; i++) h[i] = mp_bf16_from_bits(mp_f32_bits(src[i]));
}

/* Rows of a head are heads * d apart: a tile's 64 loads each waited for
 * memory (the hardware prefetchers stop at page boundaries and take time
 * to lock on to a stride). Row row0 + r is asked for ROWS_AHEAD rows
 * before it is loaded. gpt_mini's attention in bf16 (batch 32 x 128, 4
 * heads, d 64, 2 threads, Zen 5, medians of 31 calls alternating in one
 * process): forward 5.0 -> 3.5 ms, backward 8.1 -> 5.4 ms; 8 rows ahead
 * 4-5% faster than 4, the same as 16; float32 rows unchanged. */
enum { ROWS_AHEAD = 8 };
INLINE void ask_row(const mp_attn_geom *g, const void *src, mp_dtype t, int64_t b, int64_t h,
                    int64_t row)
{
    const size_t es = elem_size(t);
    const char *p = (const char *)src + row_off(g, b, h, row) * es;
    for (size_t x = 0; x < (size_t)g->d * es; x += 64) __builtin_prefetch(p + x);
    __builtin_prefetch(p + (size_t)g->d * es - 1);
}
INLINE void ask_rows(const mp_attn_geom *g, const void *src, mp_dtype t, int64_t b, int64_t h,
                     int64_t row0, int64_t n)
{
    for (int64_t r = 0; r < n && r < ROWS_AHEAD; r++) ask_row(g, src, t, b, h, row0 + r);
}

/* n rows from row0 into dst [n][dp], dp = d padded to CH. */
INLINE void load_rows(float *dst, const mp_attn_geom *g, const void *src, mp_dtype t, int64_t b,
                      int64_t h, int64_t row0, int64_t n)
{
    const int64_t dp = (int64_t)pad16((size_t)g->d);
    ask_rows(g, src, t, b, h, row0, n);
    for (int64_t r = 0; r < n; r++) {
        if (r + ROWS_AHEAD < n) ask_row(g, src, t, b, h, row0 + r + ROWS_AHEAD);
        load_row(dst + r * dp, src, t, row_off(g, b, h, row0 + r), g->d);
    }
}

/* n rows from row0 transposed into dst [d][TILE]: where AVX2 runs, eight
 * rows at a time, 64 of their columns widened into a block, transposed in
 * 8 x 8 register blocks (the store of each element to its column took 28%
 * of the decoder's attention); the rest one row at a time through tmp. */
INLINE void load_rows_t(float *dst, float *tmp, const mp_attn_geom *g, const void *src, mp_dtype t,
                        int64_t b, int64_t h, int64_t row0, int64_t n)
{
    enum { BW = 64 }; /* the block's columns */
    ask_rows(g, src, t, b, h, row0, n);
    int64_t r = 0;
#if MP_X86
    for (; avx2_gemv && r + 8 <= n; r += 8) {
        for (int64_t j = r + ROWS_AHEAD; j < r + 8 + ROWS_AHEAD && j < n; j++)
            ask_row(g, src, t, b, h, row0 + j);
        for (int64_t k0 = 0; k0 < g->d; k0 += BW) {
            const int64_t len = g->d - k0 < BW ? g->d - k0 : BW;
            _Alignas(32) float blk[8 * BW];
            for (int64_t j = 0; j < 8; j++) /* padded with zeros to a multiple of CH */
                load_row(blk + j * BW, src, t, row_off(g, b, h, row0 + r + j) + (size_t)k0, len);
            transpose8_avx2(dst + k0 * TILE + r, TILE, blk, BW, len);
        }
    }
#endif
    for (; r < n; r++) {
        if (r + ROWS_AHEAD < n) ask_row(g, src, t, b, h, row0 + r + ROWS_AHEAD);
        load_row(tmp, src, t, row_off(g, b, h, row0 + r), g->d);
        for (int64_t k = 0; k < g->d; k++) dst[k * TILE + r] = tmp[k];
    }
    if (n < TILE) /* the columns a block may read past the last row */
        for (int64_t k = 0; k < g->d; k++)
            memset(dst + k * TILE + n, 0, (size_t)(TILE - n) * sizeof(float));
}

/* Key columns of the tile at k0 (nk rows) that query i may see. */
static inline int64_t visible(int64_t i, int64_t k0, int64_t nk)
{
    int64_t n = i - k0 + 1;
    return n < 0 ? 0 : n > nk ? nk : n;
}

static inline int threads_for(long long tasks)
{
    int n = mp_num_threads();
    return tasks < n ? (int)tasks : n;
}

#endif
