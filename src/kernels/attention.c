/* attention.c - the fused causal attention kernel (see attention.h): tiles
 * of TILE query rows against tiles of TILE key rows, widened to float32 in
 * per-thread scratch, with the running max and sum of the online softmax
 * per query row. Dot products are written as row updates over the key
 * columns (s[c] += q[k] * kT[k][c]) and the value sums as updates over the
 * channels, in blocks of CH lanes of constant length (rows padded with
 * zeros to a multiple of CH), so -O2 vectorizes them without reassociating
 * any sum: each sum runs in one fixed order of fused multiply-adds (fmaf,
 * one rounding per term), whatever the vector width. Forward and backward
 * recompute s_ij with the same operations in the same order, so backward's
 * p_ij = exp(s_ij - lse_i) matches the forward's softmax. */
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

/* The larger of the two tile tasks: backward's (kT, vT, K, dK, dV, the P
 * and dS tiles, one channel row); forward's (Q, kT, V, the sums, four
 * score rows, the running max and sum) is less. Rows of d channels padded
 * to dp. */
size_t mp_attention_scratch_bytes(int64_t d)
{
    size_t td = (size_t)TILE * pad16((size_t)d);
    return (5 * td + 2 * TILE * TILE + pad16((size_t)d)) * sizeof(float);
}

/* Rows of a head's query side (Q, dO) kept for backward: whole tiles, so a
 * last group of four reads zeros past T. */
static size_t query_rows(int64_t t) { return (size_t)((t + TILE - 1) / TILE * TILE); }

/* The tiles' scratch, then the head's float32 rows: dQ [T][dp], Q and dO
 * [query_rows(T)][dp], lse and D [T] (padded), one channel row. */
size_t mp_attention_backward_scratch_bytes(int64_t t, int64_t d)
{
    const size_t dp = pad16((size_t)d);
    return mp_attention_scratch_bytes(d) +
           ((size_t)t * dp + 2 * query_rows(t) * dp + 2 * pad16((size_t)t) + dp) * sizeof(float);
}

static mp_status check_geom(const mp_attn_geom *g, const char *what)
{
    if (!g || g->batch < 1 || g->t < 1 || g->heads < 1 || g->d < 1 || g->d > 4096)
        return mp_set_error(MP_ERR_INVALID, "attention %s: bad geometry", what);
    return MP_OK;
}

/* Element offset of row i, head h, batch b. */
static size_t row_off(const mp_attn_geom *g, int64_t b, int64_t h, int64_t i)
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
static int64_t visible(int64_t i, int64_t k0, int64_t nk)
{
    int64_t n = i - k0 + 1;
    return n < 0 ? 0 : n > nk ? nk : n;
}

static int threads_for(long long tasks)
{
    int n = mp_num_threads();
    return tasks < n ? (int)tasks : n;
}

/* ---------------------------------------------------------------- forward */

TILE_CLONES static void forward_tile(const mp_attn_geom *g, float *ws, int64_t b, int64_t h,
                                     int64_t q0, const void *q, mp_dtype qt, const void *k,
                                     mp_dtype kt, const void *v, mp_dtype vt, void *o, mp_dtype ot,
                                     float *lse, int64_t qoff)
{
    const int64_t d = g->d, dp = (int64_t)pad16((size_t)d), td = TILE * dp;
    const int64_t nr = g->t - q0 < TILE ? g->t - q0 : TILE;
    const float scale = 1.0f / sqrtf((float)d);
    const int64_t sp = (int64_t)pad16(TILE); /* a score row */
    float *Q = ws, *KT = Q + td, *V = KT + td, *acc = V + td, *s = acc + td;
    float *mx = s + 4 * sp, *sum = mx + sp, *tmp = sum + sp;
    load_rows(Q, g, q, qt, b, h, q0 - qoff, nr);
    memset(Q + nr * dp, 0, (size_t)((TILE - nr) * dp) * sizeof(float)); /* rows of a last group */
    for (int64_t r = 0; r < nr; r++) {
        mx[r] = -INFINITY;
        sum[r] = 0.0f;
    }
    memset(acc, 0, (size_t)(nr * dp) * sizeof(float));
    for (int64_t k0 = 0; k0 <= q0 + nr - 1; k0 += TILE) {
        const int64_t nk = g->t - k0 < TILE ? g->t - k0 : TILE;
        load_rows_t(KT, tmp, g, k, kt, b, h, k0, nk);
        load_rows(V, g, v, vt, b, h, k0, nk);
        for (int64_t r = 0; r < nr; r += 4) { /* four query rows share each key load */
            const int64_t nmax = visible(q0 + (r + 3 < nr ? r + 3 : nr - 1), k0, nk);
            if (nmax == 0) continue;
            const int64_t n = (int64_t)pad16((size_t)nmax);
            gemv_t4(s, sp, Q + r * dp, 1, dp, KT, TILE, d, n, false);
            int64_t ncs[4] = {0, 0, 0, 0};
            for (int64_t j = 0; j < 4 && r + j < nr; j++) {
                const int64_t nc = ncs[j] = visible(q0 + r + j, k0, nk);
                if (nc == 0) continue;
                float *sj = s + j * sp, *a = acc + (r + j) * dp;
                scal(sj, scale, n); /* as scores() does */
                const float m = row_max(sj, nc, mx[r + j]);
                const float corr = mp_expf(mx[r + j] - m); /* 0 on the first tile: acc, sum 0 */
#pragma omp simd
                for (int64_t c = 0; c < nc; c++) sj[c] = mp_expf(sj[c] - m);
                sum[r + j] = sum[r + j] * corr + row_total(sj, nc);
                mx[r + j] = m;
                scal(a, corr, dp);
                if (r + 3 >= nr) gemv_t(a, sj, 1, V, dp, nc, dp, true); /* a last group */
            }
            /* four rows share the loads of V over the keys they all see */
            if (r + 3 < nr) gemv_t4_ragged(acc + r * dp, dp, s, 1, sp, V, dp, ncs, dp, true);
        }
    }
    for (int64_t r = 0; r < nr; r++) {
        float *a = acc + r * dp;
        scal(a, 1.0f / sum[r], dp);
        store_row(o, ot, row_off(g, b, h, q0 + r - qoff), a, d);
        if (lse) lse[(b * g->heads + h) * g->t + q0 + r] = mx[r] + logf(sum[r]);
    }
}

mp_status mp_attention_forward(const mp_attn_geom *g, const void *q, mp_dtype qt, const void *k,
                               mp_dtype kt, const void *v, mp_dtype vt, void *o, mp_dtype ot,
                               float *lse)
{
    mp_status s = check_geom(g, "forward");
    if (s) return s;
    if (!q || !k || !v || !o) return mp_set_error(MP_ERR_INVALID, "attention forward: NULL tensor");
    choose_gemv();
    const long long nq = (g->t + TILE - 1) / TILE, tasks = g->batch * g->heads * nq;
    const size_t bytes = mp_attention_scratch_bytes(g->d);
    int fail = 0;
#pragma omp parallel num_threads(threads_for(tasks))
    {
        float *ws = mp_scratch(SLOT, bytes);
        if (!ws) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (long long task = 0; task < tasks; task++) {
            if (!ws) continue;
            const int64_t qi = task % nq, bh = task / nq;
            forward_tile(g, ws, bh / g->heads, bh % g->heads, qi * TILE, q, qt, k, kt, v, vt, o, ot,
                         lse, 0);
        }
    }
    if (fail)
        return mp_set_error(MP_ERR_NOMEM, "attention forward: %zu bytes of scratch per thread",
                            bytes);
    return MP_OK;
}

/* --------------------------------------------------------------- backward */

/* A head's query rows as backward reads them, loaded once for all its key
 * tiles (per key tile, they were widened again for each: 11% of
 * backward_kv_tile's time at T = 128, two tiles). */
typedef struct {
    float *Q, *dO; /* [query_rows(T)][dp], zeros past T */
    float *ls, *D; /* [T]: lse, dO . O */
} query_side;

/* Query rows' float32 inputs of backward: Q, dO, lse and D = dO . O. */
INLINE void load_query_side(const mp_attn_geom *g, float *Q, float *dO, float *ls, float *D,
                            float *tmp, int64_t b, int64_t h, int64_t q0, int64_t nr, const void *q,
                            mp_dtype qt, const void *o, mp_dtype ot, const float *lse,
                            const void *dout, mp_dtype dot)
{
    const int64_t d = g->d, dp = (int64_t)pad16((size_t)d);
    load_rows(Q, g, q, qt, b, h, q0, nr);
    load_rows(dO, g, dout, dot, b, h, q0, nr);
    /* the rows a last group of four reads past nr */
    memset(Q + nr * dp, 0, (size_t)((TILE - nr) * dp) * sizeof(float));
    memset(dO + nr * dp, 0, (size_t)((TILE - nr) * dp) * sizeof(float));
    ask_rows(g, o, ot, b, h, q0, nr);
    for (int64_t r = 0; r < nr; r++) {
        if (r + ROWS_AHEAD < nr) ask_row(g, o, ot, b, h, q0 + r + ROWS_AHEAD);
        load_row(tmp, o, ot, row_off(g, b, h, q0 + r), d);
        D[r] = row_dot(dO + r * dp, tmp, d);
        ls[r] = lse[(b * g->heads + h) * g->t + q0 + r];
    }
}

/* Four query rows r..r+3 (rows past nr are zeros) against the key columns
 * of a tile: for row j seeing nc_j columns, p = exp(s - lse) and ds = p (dO
 * . v - D) into rows j of p and ds (stride ld); the score and dO . v sums
 * computed four rows at a time over the columns the last row sees, each in
 * row_grads's order of old. */
INLINE void row_grads4(float *p, float *ds, int64_t ld, const float *q, const float *dor,
                       int64_t dp, const float *KT, const float *VT, int64_t d, const int64_t *nc,
                       int rows, float scale, const float *ls, const float *D)
{
    const int64_t n = (int64_t)pad16((size_t)nc[rows - 1]);
    gemv_t4(p, ld, q, 1, dp, KT, TILE, d, n, false);
    gemv_t4(ds, ld, dor, 1, dp, VT, TILE, d, n, false);
    for (int j = 0; j < rows; j++) {
        float *pj = p + j * ld, *dsj = ds + j * ld;
        scal(pj, scale, n);
#pragma omp simd
        for (int64_t c = 0; c < nc[j]; c++) pj[c] = mp_expf(pj[c] - ls[j]);
#pragma omp simd
        for (int64_t c = 0; c < nc[j]; c++) dsj[c] = pj[c] * (dsj[c] - D[j]);
    }
}

/* The visible columns of rows q0 + r .. + 3 (at most nr) of key tile k0. */
static int group_visible(int64_t q0, int64_t r, int64_t nr, int64_t k0, int64_t nk, int64_t *nc)
{
    int rows = 0;
    for (; rows < 4 && r + rows < nr; rows++) nc[rows] = visible(q0 + r + rows, k0, nk);
    return rows;
}

/* dK and dV of one key tile, all later query tiles looped inside, and
 * their part of dQ (float32 rows of the head, dQ [T][dp]): P and dS are
 * computed once per pair of tiles. */
TILE_CLONES static void backward_kv_tile(const mp_attn_geom *g, float *ws, float *dQ,
                                         const query_side *qs, int64_t b, int64_t h, int64_t k0,
                                         const void *k, mp_dtype kt, const void *v, mp_dtype vt,
                                         void *dk, void *dv, mp_dtype gt)
{
    const int64_t d = g->d, dp = (int64_t)pad16((size_t)d), td = TILE * dp;
    const int64_t nk = g->t - k0 < TILE ? g->t - k0 : TILE;
    const float scale = 1.0f / sqrtf((float)d);
    float *KT = ws, *VT = KT + td, *K = VT + td, *dK = K + td, *dV = dK + td, *P = dV + td;
    float *dS = P + TILE * TILE, *tmp = dS + TILE * TILE;
    load_rows(K, g, k, kt, b, h, k0, nk);
    /* K^T from the source again, transposed in registers: the same exact
     * widening (the element-by-element copy from K, strided, was 7% of
     * this function's time in gpt_mini's bf16 backward) */
    load_rows_t(KT, tmp, g, k, kt, b, h, k0, nk);
    load_rows_t(VT, tmp, g, v, vt, b, h, k0, nk);
    memset(dK, 0, (size_t)(nk * dp) * sizeof(float));
    memset(dV, 0, (size_t)(nk * dp) * sizeof(float));
    for (int64_t q0 = k0; q0 < g->t; q0 += TILE) {
        const int64_t nr = g->t - q0 < TILE ? g->t - q0 : TILE;
        const float *Q = qs->Q + q0 * dp, *dO = qs->dO + q0 * dp, *ls = qs->ls + q0,
                    *D = qs->D + q0;
        for (int64_t r = 0; r < nr; r += 4) {
            int64_t nc[4];
            int rows = group_visible(q0, r, nr, k0, nk, nc);
            if (nc[rows - 1] == 0) continue;
            row_grads4(P + r * TILE, dS + r * TILE, TILE, Q + r * dp, dO + r * dp, dp, KT, VT, d,
                       nc, rows, scale, ls + r, D + r);
            /* dQ rows += dS K over the keys each sees (key tiles in order) */
            float *dq = dQ + (q0 + r) * dp;
            if (rows == 4)
                gemv_t4_ragged(dq, dp, dS + r * TILE, 1, TILE, K, dp, nc, dp, true);
            else
                for (int j = 0; j < rows; j++)
                    if (nc[j] > 0)
                        gemv_t(dq + j * dp, dS + (r + j) * TILE, 1, K, dp, nc[j], dp, true);
        }
        /* key c is seen by the rows from k0 + c on: its sums over them in
         * row order, as one key at a time would add them. Four keys share
         * the loads over the rows all of them see; the first rows of the
         * later keys' sums, which only the earlier keys see, go first on
         * their own. */
        for (int64_t c = 0; c < nk;) {
            int64_t r0[4];
            for (int j = 0; j < 4; j++) r0[j] = k0 + c + j > q0 ? k0 + c + j - q0 : 0;
            if (r0[0] >= nr) break; /* later keys start later still */
            if (c + 3 < nk && r0[3] < nr) {
                for (int j = 0; j < 3; j++)
                    if (r0[j] < r0[3]) {
                        const int64_t cj = c + j, m = r0[3] - r0[j];
                        gemv_t(dV + cj * dp, P + r0[j] * TILE + cj, TILE, dO + r0[j] * dp, dp, m,
                               dp, true);
                        gemv_t(dK + cj * dp, dS + r0[j] * TILE + cj, TILE, Q + r0[j] * dp, dp, m,
                               dp, true);
                    }
                const int64_t top = r0[3];
                gemv_t4(dV + c * dp, dp, P + top * TILE + c, TILE, 1, dO + top * dp, dp, nr - top,
                        dp, true);
                gemv_t4(dK + c * dp, dp, dS + top * TILE + c, TILE, 1, Q + top * dp, dp, nr - top,
                        dp, true);
                c += 4;
                continue;
            }
            gemv_t(dV + c * dp, P + r0[0] * TILE + c, TILE, dO + r0[0] * dp, dp, nr - r0[0], dp,
                   true);
            gemv_t(dK + c * dp, dS + r0[0] * TILE + c, TILE, Q + r0[0] * dp, dp, nr - r0[0], dp,
                   true);
            c++;
        }
    }
    for (int64_t c = 0; c < nk; c++) {
        float *dkr = dK + c * dp;
        scal(dkr, scale, dp);
        store_row(dk, gt, row_off(g, b, h, k0 + c), dkr, d);
        store_row(dv, gt, row_off(g, b, h, k0 + c), dV + c * dp, d);
    }
}

/* One (batch, head): its key tiles in order, then dQ scaled and stored,
 * those loops too in the CPU's vector width (compiled for the baseline they
 * were 7% of gpt_mini's bf16 attention forward+backward, 3.5% now: 4.93-5.05
 * -> 4.89-4.99 ms a layer, Zen 5, old/new processes alternating). */
TILE_CLONES static void backward_head(const mp_attn_geom *g, float *ws, int64_t b, int64_t h,
                                      const void *q, mp_dtype qt, const void *k, mp_dtype kt,
                                      const void *v, mp_dtype vt, const void *o, mp_dtype ot,
                                      const float *lse, const void *dout, mp_dtype dot, void *dq,
                                      void *dk, void *dv, mp_dtype gt)
{
    const int64_t dp = (int64_t)pad16((size_t)g->d);
    float *dQ = ws + mp_attention_scratch_bytes(g->d) / sizeof(float);
    query_side qs;
    qs.Q = dQ + g->t * dp;
    qs.dO = qs.Q + query_rows(g->t) * (size_t)dp;
    qs.ls = qs.dO + query_rows(g->t) * (size_t)dp;
    qs.D = qs.ls + pad16((size_t)g->t);
    float *tmp = qs.D + pad16((size_t)g->t);
    memset(dQ, 0, (size_t)(g->t * dp) * sizeof(float));
    for (int64_t q0 = 0; q0 < g->t; q0 += TILE)
        load_query_side(g, qs.Q + q0 * dp, qs.dO + q0 * dp, qs.ls + q0, qs.D + q0, tmp, b, h, q0,
                        g->t - q0 < TILE ? g->t - q0 : TILE, q, qt, o, ot, lse, dout, dot);
    for (int64_t k0 = 0; k0 < g->t; k0 += TILE)
        backward_kv_tile(g, ws, dQ, &qs, b, h, k0, k, kt, v, vt, dk, dv, gt);
    const float scale = 1.0f / sqrtf((float)g->d);
    for (int64_t r = 0; r < g->t; r++) {
        scal(dQ + r * dp, scale, dp);
        store_row(dq, gt, row_off(g, b, h, r), dQ + r * dp, g->d);
    }
}

mp_status mp_attention_backward(const mp_attn_geom *g, const void *q, mp_dtype qt, const void *k,
                                mp_dtype kt, const void *v, mp_dtype vt, const void *o, mp_dtype ot,
                                const float *lse, const void *dout, mp_dtype dot, void *dq,
                                void *dk, void *dv, mp_dtype gt)
{
    mp_status s = check_geom(g, "backward");
    if (s) return s;
    if (!q || !k || !v || !o || !lse || !dout || !dq || !dk || !dv)
        return mp_set_error(MP_ERR_INVALID, "attention backward: NULL tensor");
    choose_gemv();
    /* one task per (batch, head): the tiles' scratch and the head's dQ */
    const long long tasks = g->batch * g->heads;
    const size_t bytes = mp_attention_backward_scratch_bytes(g->t, g->d);
    int fail = 0;
#pragma omp parallel num_threads(threads_for(tasks))
    {
        float *ws = mp_scratch(SLOT, bytes);
        if (!ws) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (long long task = 0; task < tasks; task++) {
            if (!ws) continue;
            backward_head(g, ws, task / g->heads, task % g->heads, q, qt, k, kt, v, vt, o, ot, lse,
                          dout, dot, dq, dk, dv, gt);
        }
    }
    if (fail)
        return mp_set_error(MP_ERR_NOMEM, "attention backward: %zu bytes of scratch per thread",
                            bytes);
    return MP_OK;
}

/* ------------------------------------------------------------- decoding */

/* Head h of one query row (position len - 1) against the cache's first len
 * rows: forward_tile's operations for that row, in its order (the key
 * tiles from 0, the scores as gemv_t over KT, the online softmax's max,
 * correction and sum, the value sums as gemv_t over V), so the row gets
 * the bits the full forward gives it; gemv_t4's rows are gemv_t's bits.
 * Where AVX2 runs, the scores and value sums read the cache's rows in
 * place (scores_rows_avx2, values_rows_avx2: gemv_t's FMAs in its order)
 * instead of a transposed copy of the keys and a copy of the values: the
 * copies had taken two thirds of the decoder's attention (the widening
 * loads and stores, in perf). gpt_mini decoding with a bfloat16 cache
 * (AMD EPYC Zen 3, 2 threads, float32 weights, 64 steps after a prompt,
 * medians of 30, the old and the new library in alternating processes,
 * three pairs): after 16 tokens 315-370 -> 232-324 us a token, after 512
 * 416-643 -> 354-374. */
TILE_CLONES static void decode_head(const mp_attn_geom *g, float *ws, int64_t h, const void *q,
                                    const void *kc, const void *vc, mp_dtype ct, void *o,
                                    mp_dtype ot)
{
    const int64_t d = g->d, dp = (int64_t)pad16((size_t)d), td = TILE * dp, i = g->t - 1;
    const float scale = 1.0f / sqrtf((float)d);
    float *Q = ws, *KT = Q + td, *V = KT + td, *acc = V + td, *s = acc + td, *tmp = s + pad16(TILE);
    load_row(Q, q, ct, (size_t)(h * d), d);
    float mx = -INFINITY, sum = 0.0f;
    memset(acc, 0, (size_t)dp * sizeof(float));
#if MP_X86
    /* the products straight from the cache's rows where AVX2 runs */
    const bool direct = avx2_gemv && d % 16 == 0 && (ct == MP_F32 || ct == MP_BF16);
    const int64_t ld = g->heads * d * (int64_t)mp_dtype_size(ct); /* a head's rows, bytes */
    const char *kh = (const char *)kc + row_off(g, 0, h, 0) * mp_dtype_size(ct);
    const char *vh = (const char *)vc + row_off(g, 0, h, 0) * mp_dtype_size(ct);
#else
    const bool direct = false;
#endif
    for (int64_t k0 = 0; k0 <= i; k0 += TILE) {
        const int64_t nc = g->t - k0 < TILE ? g->t - k0 : TILE, n = (int64_t)pad16((size_t)nc);
        if (direct) {
#if MP_X86
            scores_rows_avx2(s, Q, kh + k0 * ld, ld, ct, d, nc);
            for (int64_t c = (nc + 7) / 8 * 8; c < n; c++) s[c] = 0.0f;
#endif
        } else {
            load_rows_t(KT, tmp, g, kc, ct, 0, h, k0, nc);
            load_rows(V, g, vc, ct, 0, h, k0, nc);
            gemv_t(s, Q, 1, KT, TILE, d, n, false);
        }
        scal(s, scale, n);
        const float m = row_max(s, nc, mx);
        const float corr = mp_expf(mx - m);
#pragma omp simd
        for (int64_t c = 0; c < nc; c++) s[c] = mp_expf(s[c] - m);
        sum = sum * corr + row_total(s, nc);
        mx = m;
        scal(acc, corr, dp);
#if MP_X86
        if (direct)
            values_rows_avx2(acc, s, vh + k0 * ld, ld, ct, d, nc);
        else
#endif
            gemv_t(acc, s, 1, V, dp, nc, dp, true);
    }
    scal(acc, 1.0f / sum, dp);
    store_row(o, ot, (size_t)(h * d), acc, d);
}

/* Task j of mp_attention_decode_rows: a head of the one row (n == 1), or
 * a head of a tile of rows, the last tiles first. */
static void decode_task(const mp_attn_geom *g, float *ws, int64_t j, int64_t nq, int64_t first,
                        int64_t n, const void *q, const void *kc, const void *vc, mp_dtype ct,
                        void *o, mp_dtype ot)
{
    const int64_t qi = nq - 1 - j / g->heads, h = j % g->heads;
    if (n == 1)
        decode_head(g, ws, h, q, kc, vc, ct, o, ot);
    else
        forward_tile(g, ws, 0, h, first + qi * TILE, q, ct, kc, ct, vc, ct, o, ot, NULL, first);
}

mp_status mp_attention_decode_rows(int64_t heads, int64_t d, const void *q, const void *kc,
                                   const void *vc, mp_dtype ct, int64_t first, int64_t n, void *o,
                                   mp_dtype ot)
{
    const mp_attn_geom g = {1, first + n, heads, d}; /* the cache's rows */
    mp_status s = check_geom(&g, "decode");
    if (s) return s;
    if (first < 0 || n < 1)
        return mp_set_error(MP_ERR_INVALID, "attention decode: rows %lld..%lld", (long long)first,
                            (long long)(first + n - 1));
    if (!q || !kc || !vc || !o)
        return mp_set_error(MP_ERR_INVALID, "attention decode: NULL tensor");
    choose_gemv();
    const size_t bytes = mp_attention_scratch_bytes(d);
    /* one row: a head's work is about len * d FMAs and a transpose of its
     * key rows. Several: the forward's tiles of TILE query rows, which
     * share each key tile's transpose and loads (the same arithmetic per
     * row as one row's). A parallel region (a few microseconds) only where
     * the work is larger; the longest tiles first, each taken by the next
     * free thread (their lengths differ). */
    const int64_t nq = (n + TILE - 1) / TILE, tasks = n > 1 ? nq * heads : heads;
    const int nt = n * (first + n) * d >= 16384 ? threads_for(tasks) : 1;
    int fail = 0;
    if (nt == 1) { /* a plain loop: no region of one thread (ops.c's PAR_FOR says why) */
        float *ws = mp_scratch(SLOT, bytes);
        for (int64_t j = 0; j < tasks && ws; j++)
            decode_task(&g, ws, j, nq, first, n, q, kc, vc, ct, o, ot);
        fail = !ws;
    } else {
#pragma omp parallel num_threads(nt)
        {
            float *ws = mp_scratch(SLOT, bytes);
            if (!ws) {
#pragma omp atomic write
                fail = 1;
            }
#pragma omp for schedule(dynamic)
            for (int64_t j = 0; j < tasks; j++)
                if (ws) decode_task(&g, ws, j, nq, first, n, q, kc, vc, ct, o, ot);
        }
    }
    if (fail)
        return mp_set_error(MP_ERR_NOMEM, "attention decode: %zu bytes of scratch per thread",
                            bytes);
    return MP_OK;
}

mp_status mp_attention_decode_row(int64_t heads, int64_t d, const void *q, const void *kc,
                                  const void *vc, mp_dtype ct, int64_t len, void *o, mp_dtype ot)
{
    return mp_attention_decode_rows(heads, d, q, kc, vc, ct, len - 1, 1, o, ot);
}
