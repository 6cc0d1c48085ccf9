/* ops_io.h - how the op kernels (ops.c, layer_norm_op.c) read and write
 * tensors of any dtype: chunk by chunk (or row by row) through float32
 * buffers, decoded exactly and rounded once on the way out, the next
 * piece's lines asked for while one is worked on; parallel loops only where
 * they pay; each thread's share of the columns for column reductions.
 * Internal to the kernels. */
#ifndef MP_KERNELS_OPS_IO_H
#define MP_KERNELS_OPS_IO_H

#include <stdbool.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/internal.h"
#include "mixprec.h"

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

/* Column reductions give each thread a contiguous range of columns (in
 * steps of 16) and sum every column over the rows in order: the same bits
 * for any thread count, and each row read in one piece. */
static inline void mp_op_my_columns(int64_t cols, int64_t *c0, int64_t *c1)
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

#endif
