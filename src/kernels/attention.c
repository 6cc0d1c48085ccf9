/* attention.c - the fused causal attention kernel (see attention.h): tiles
 * of TILE query rows against tiles of TILE key rows, widened to float32 in
 * per-thread scratch, with the running max and sum of the online softmax
 * per query row. Dot products are written as row updates over the key
 * columns (s[c] += q[k] * kT[k][c]) and the value sums as updates over the
 * channels, in blocks of CH lanes of constant length (rows padded with
 * zeros to a multiple of CH), so -O2 vectorizes them without reassociating
 * any sum: each sum runs in one fixed order, whatever the vector width. Forward and backward
 * recompute s_ij with the same operations in the same order, so backward's p_ij = exp(s_ij - lse_i)
 * matches the forward's softmax. */
#include <math.h>
#include <string.h>

#include "kernels/attention.h"

#define TILE MP_ATTN_TILE
#define SLOT 3
#define CH 16 /* lanes of the vectorizable blocks */

/* The tile loops for each vector width the CPU may have (chosen once at
 * load): the arithmetic, and so every bit of the results, is the same in
 * each (no contraction to FMA in ISO C mode, the same order of operations). */
#if MP_X86 && defined(__GNUC__) && !defined(__clang__)
#define TILE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TILE_CLONES
#endif

static size_t pad16(size_t n) { return (n + CH - 1) & ~(size_t)(CH - 1); }

/* y[0..n) = (add ? y : 0) + sum over k < m, in order, of x[k * incx] *
 * a[k * lda + 0..n): each block of CH sums stays in registers over k */
static inline void gemv_t(float *restrict y, const float *restrict x, int64_t incx,
                          const float *restrict a, int64_t lda, int64_t m, int64_t n, bool add)
{
    for (int64_t i0 = 0; i0 < n; i0 += CH) {
        float acc[CH];
        for (int i = 0; i < CH; i++) acc[i] = add ? y[i0 + i] : 0.0f;
        for (int64_t k = 0; k < m; k++) {
            const float xk = x[k * incx], *ar = a + k * lda + i0;
            for (int i = 0; i < CH; i++) acc[i] += xk * ar[i];
        }
        for (int i = 0; i < CH; i++) y[i0 + i] = acc[i];
    }
}

static inline void scal(float *y, float a, int64_t n)
{
    for (int64_t i0 = 0; i0 < n; i0 += CH)
        for (int i = 0; i < CH; i++) y[i0 + i] *= a;
}

/* The largest of the three tasks: dK/dV (kT, vT, dK, dV, Q, dO, the P and
 * dS tiles, lse and D, one channel row); rows of d channels padded to dp. */
size_t mp_attention_scratch_bytes(int64_t d)
{
    size_t td = (size_t)TILE * pad16((size_t)d);
    return (6 * td + 2 * TILE * TILE + 2 * pad16(TILE) + pad16((size_t)d)) * sizeof(float);
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

static void load_row(float *dst, const void *src, mp_dtype t, size_t off, int64_t d)
{
    const char *p = (const char *)src + off * mp_dtype_size(t);
    if (t == MP_F32)
        memcpy(dst, p, (size_t)d * sizeof(float));
    else
        mp_convert(dst, MP_F32, p, t, (size_t)d);
    memset(dst + d, 0, (pad16((size_t)d) - (size_t)d) * sizeof(float));
}

static void store_row(void *dst, mp_dtype t, size_t off, const float *src, int64_t d)
{
    mp_convert((char *)dst + off * mp_dtype_size(t), t, src, MP_F32, (size_t)d);
}

/* n rows from row0 into dst [n][dp], dp = d padded to CH. */
static void load_rows(float *dst, const mp_attn_geom *g, const void *src, mp_dtype t, int64_t b,
                      int64_t h, int64_t row0, int64_t n)
{
    const int64_t dp = (int64_t)pad16((size_t)g->d);
    for (int64_t r = 0; r < n; r++)
        load_row(dst + r * dp, src, t, row_off(g, b, h, row0 + r), g->d);
}

/* n rows from row0 transposed into dst [d][TILE], through one row of tmp. */
static void load_rows_t(float *dst, float *tmp, const mp_attn_geom *g, const void *src, mp_dtype t,
                        int64_t b, int64_t h, int64_t row0, int64_t n)
{
    for (int64_t r = 0; r < n; r++) {
        load_row(tmp, src, t, row_off(g, b, h, row0 + r), g->d);
        for (int64_t k = 0; k < g->d; k++) dst[k * TILE + r] = tmp[k];
    }
    if (n < TILE) /* the columns a block may read past the last row */
        for (int64_t k = 0; k < g->d; k++)
            memset(dst + k * TILE + n, 0, (size_t)(TILE - n) * sizeof(float));
}

/* s[c] = (q . kT[:, c]) * scale for c < nc (and the block's padding). */
static inline void scores(float *s, const float *q, const float *kt, int64_t d, int64_t nc,
                          float scale)
{
    const int64_t n = (int64_t)pad16((size_t)nc);
    gemv_t(s, q, 1, kt, TILE, d, n, false);
    scal(s, scale, n);
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
                                     float *lse)
{
    const int64_t d = g->d, dp = (int64_t)pad16((size_t)d), td = TILE * dp;
    const int64_t nr = g->t - q0 < TILE ? g->t - q0 : TILE;
    const float scale = 1.0f / sqrtf((float)d);
    float *Q = ws, *KT = Q + td, *V = KT + td, *acc = V + td, *s = acc + td;
    float *mx = s + pad16(TILE), *sum = mx + pad16(TILE), *tmp = sum + pad16(TILE);
    load_rows(Q, g, q, qt, b, h, q0, nr);
    for (int64_t r = 0; r < nr; r++) {
        mx[r] = -INFINITY;
        sum[r] = 0.0f;
    }
    memset(acc, 0, (size_t)(nr * dp) * sizeof(float));
    for (int64_t k0 = 0; k0 <= q0 + nr - 1; k0 += TILE) {
        const int64_t nk = g->t - k0 < TILE ? g->t - k0 : TILE;
        load_rows_t(KT, tmp, g, k, kt, b, h, k0, nk);
        load_rows(V, g, v, vt, b, h, k0, nk);
        for (int64_t r = 0; r < nr; r++) {
            const int64_t nc = visible(q0 + r, k0, nk);
            if (nc == 0) continue;
            scores(s, Q + r * dp, KT, d, nc, scale);
            float m = mx[r];
            for (int64_t c = 0; c < nc; c++) m = s[c] > m ? s[c] : m;
            const float corr = expf(mx[r] - m); /* 0 on the first tile: acc and sum are 0 */
            float add = 0.0f;
            for (int64_t c = 0; c < nc; c++) {
                s[c] = expf(s[c] - m);
                add += s[c];
            }
            sum[r] = sum[r] * corr + add;
            mx[r] = m;
            float *a = acc + r * dp;
            scal(a, corr, dp);
            gemv_t(a, s, 1, V, dp, nc, dp, true);
        }
    }
    for (int64_t r = 0; r < nr; r++) {
        float *a = acc + r * dp;
        scal(a, 1.0f / sum[r], dp);
        store_row(o, ot, row_off(g, b, h, q0 + r), a, d);
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
                         lse);
        }
    }
    if (fail)
        return mp_set_error(MP_ERR_NOMEM, "attention forward: %zu bytes of scratch per thread",
                            bytes);
    return MP_OK;
}

/* --------------------------------------------------------------- backward */

/* Query rows' float32 inputs of backward: Q, dO, lse and D = dO . O. */
static void load_query_side(const mp_attn_geom *g, float *Q, float *dO, float *ls, float *D,
                            float *tmp, int64_t b, int64_t h, int64_t q0, int64_t nr, const void *q,
                            mp_dtype qt, const void *o, mp_dtype ot, const float *lse,
                            const void *dout, mp_dtype dot)
{
    const int64_t d = g->d, dp = (int64_t)pad16((size_t)d);
    load_rows(Q, g, q, qt, b, h, q0, nr);
    load_rows(dO, g, dout, dot, b, h, q0, nr);
    for (int64_t r = 0; r < nr; r++) {
        load_row(tmp, o, ot, row_off(g, b, h, q0 + r), d);
        float acc = 0.0f;
        for (int64_t j = 0; j < d; j++) acc += dO[r * dp + j] * tmp[j];
        D[r] = acc;
        ls[r] = lse[(b * g->heads + h) * g->t + q0 + r];
    }
}

/* One query row against nc key columns: p = exp(s - lse) into p, and
 * ds = p (dO . v - D) into ds. */
static inline void row_grads(float *p, float *ds, const float *q, const float *dor, const float *KT,
                             const float *VT, int64_t d, int64_t nc, float scale, float ls, float D)
{
    scores(p, q, KT, d, nc, scale);
    for (int64_t c = 0; c < nc; c++) p[c] = expf(p[c] - ls);
    gemv_t(ds, dor, 1, VT, TILE, d, (int64_t)pad16((size_t)nc), false);
    for (int64_t c = 0; c < nc; c++) ds[c] = p[c] * (ds[c] - D);
}

/* dK and dV of one key tile, all later query tiles looped inside. */
TILE_CLONES static void backward_kv_tile(const mp_attn_geom *g, float *ws, int64_t b, int64_t h,
                                         int64_t k0, const void *q, mp_dtype qt, const void *k,
                                         mp_dtype kt, const void *v, mp_dtype vt, const void *o,
                                         mp_dtype ot, const float *lse, const void *dout,
                                         mp_dtype dot, void *dk, void *dv, mp_dtype gt)
{
    const int64_t d = g->d, dp = (int64_t)pad16((size_t)d), td = TILE * dp;
    const int64_t nk = g->t - k0 < TILE ? g->t - k0 : TILE;
    const float scale = 1.0f / sqrtf((float)d);
    float *KT = ws, *VT = KT + td, *dK = VT + td, *dV = dK + td, *Q = dV + td, *dO = Q + td;
    float *P = dO + td, *dS = P + TILE * TILE, *ls = dS + TILE * TILE, *D = ls + pad16(TILE);
    float *tmp = D + pad16(TILE);
    load_rows_t(KT, tmp, g, k, kt, b, h, k0, nk);
    load_rows_t(VT, tmp, g, v, vt, b, h, k0, nk);
    memset(dK, 0, (size_t)(nk * dp) * sizeof(float));
    memset(dV, 0, (size_t)(nk * dp) * sizeof(float));
    for (int64_t q0 = k0; q0 < g->t; q0 += TILE) {
        const int64_t nr = g->t - q0 < TILE ? g->t - q0 : TILE;
        load_query_side(g, Q, dO, ls, D, tmp, b, h, q0, nr, q, qt, o, ot, lse, dout, dot);
        for (int64_t r = 0; r < nr; r++)
            row_grads(P + r * TILE, dS + r * TILE, Q + r * dp, dO + r * dp, KT, VT, d,
                      visible(q0 + r, k0, nk), scale, ls[r], D[r]);
        /* key c is seen by the rows from k0 + c on: its sums over them in
         * row order, as one row at a time would add them */
        for (int64_t c = 0; c < nk; c++) {
            const int64_t r0 = k0 + c > q0 ? k0 + c - q0 : 0;
            if (r0 >= nr) continue;
            gemv_t(dV + c * dp, P + r0 * TILE + c, TILE, dO + r0 * dp, dp, nr - r0, dp, true);
            gemv_t(dK + c * dp, dS + r0 * TILE + c, TILE, Q + r0 * dp, dp, nr - r0, dp, true);
        }
    }
    for (int64_t c = 0; c < nk; c++) {
        float *dkr = dK + c * dp;
        scal(dkr, scale, dp);
        store_row(dk, gt, row_off(g, b, h, k0 + c), dkr, d);
        store_row(dv, gt, row_off(g, b, h, k0 + c), dV + c * dp, d);
    }
}

/* dQ of one query tile, the key tiles it sees looped inside. */
TILE_CLONES static void backward_q_tile(const mp_attn_geom *g, float *ws, int64_t b, int64_t h,
                                        int64_t q0, const void *q, mp_dtype qt, const void *k,
                                        mp_dtype kt, const void *v, mp_dtype vt, const void *o,
                                        mp_dtype ot, const float *lse, const void *dout,
                                        mp_dtype dot, void *dq, mp_dtype gt)
{
    const int64_t d = g->d, dp = (int64_t)pad16((size_t)d), td = TILE * dp;
    const int64_t nr = g->t - q0 < TILE ? g->t - q0 : TILE;
    const float scale = 1.0f / sqrtf((float)d);
    float *KT = ws, *VT = KT + td, *K = VT + td, *dQ = K + td, *Q = dQ + td, *dO = Q + td;
    float *p = dO + td, *ds = p + pad16(TILE), *ls = ds + pad16(TILE), *D = ls + pad16(TILE);
    float *tmp = D + pad16(TILE);
    load_query_side(g, Q, dO, ls, D, tmp, b, h, q0, nr, q, qt, o, ot, lse, dout, dot);
    memset(dQ, 0, (size_t)(nr * dp) * sizeof(float));
    for (int64_t k0 = 0; k0 <= q0 + nr - 1; k0 += TILE) {
        const int64_t nk = g->t - k0 < TILE ? g->t - k0 : TILE;
        load_rows(K, g, k, kt, b, h, k0, nk);
        for (int64_t j = 0; j < d; j++) {
            for (int64_t c = 0; c < nk; c++) KT[j * TILE + c] = K[c * dp + j];
            for (int64_t c = nk; c < TILE; c++) KT[j * TILE + c] = 0.0f;
        }
        load_rows_t(VT, tmp, g, v, vt, b, h, k0, nk);
        for (int64_t r = 0; r < nr; r++) {
            const int64_t nc = visible(q0 + r, k0, nk);
            if (nc == 0) continue;
            row_grads(p, ds, Q + r * dp, dO + r * dp, KT, VT, d, nc, scale, ls[r], D[r]);
            gemv_t(dQ + r * dp, ds, 1, K, dp, nc, dp, true);
        }
    }
    for (int64_t r = 0; r < nr; r++) {
        float *dqr = dQ + r * dp;
        scal(dqr, scale, dp);
        store_row(dq, gt, row_off(g, b, h, q0 + r), dqr, d);
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
    const long long nt = (g->t + TILE - 1) / TILE, tasks = g->batch * g->heads * nt;
    const size_t bytes = mp_attention_scratch_bytes(g->d);
    int fail = 0;
#pragma omp parallel num_threads(threads_for(tasks))
    {
        float *ws = mp_scratch(SLOT, bytes);
        if (!ws) {
#pragma omp atomic write
            fail = 1;
        }
        /* first dK/dV per key tile, then dQ per query tile (the implicit
         * barrier between the loops is not needed: they write apart) */
#pragma omp for schedule(dynamic, 1) nowait
        for (long long task = 0; task < tasks; task++) {
            if (!ws) continue;
            const int64_t ti = task % nt, bh = task / nt;
            backward_kv_tile(g, ws, bh / g->heads, bh % g->heads, ti * TILE, q, qt, k, kt, v, vt, o,
                             ot, lse, dout, dot, dk, dv, gt);
        }
#pragma omp for schedule(dynamic, 1)
        for (long long task = 0; task < tasks; task++) {
            if (!ws) continue;
            const int64_t ti = task % nt, bh = task / nt;
            backward_q_tile(g, ws, bh / g->heads, bh % g->heads, ti * TILE, q, qt, k, kt, v, vt, o,
                            ot, lse, dout, dot, dq, gt);
        }
    }
    if (fail)
        return mp_set_error(MP_ERR_NOMEM, "attention backward: %zu bytes of scratch per thread",
                            bytes);
    return MP_OK;
}

/* ------------------------------------------------------------- decoding */

void mp_attention_decode_row(int64_t heads, int64_t d, const void *q, const void *kc,
                             const void *vc, mp_dtype ct, int64_t len, void *o, mp_dtype ot,
                             float *scratch)
{
    const int64_t hd = heads * d;
    const size_t cs = mp_dtype_size(ct);
    const float scale = 1.0f / sqrtf((float)d);
    float qh[MP_ATTN_DECODE_MAX_D], row[MP_ATTN_DECODE_MAX_D], acc[MP_ATTN_DECODE_MAX_D];
    float *p = scratch;
    for (int64_t h = 0; h < heads; h++) {
        mp_convert(qh, MP_F32, (const char *)q + (size_t)(h * d) * cs, ct, (size_t)d);
        float mx = -INFINITY;
        for (int64_t j = 0; j < len; j++) {
            mp_convert(row, MP_F32, (const char *)kc + (size_t)(j * hd + h * d) * cs, ct,
                       (size_t)d);
            float s = 0.0f;
            for (int64_t c = 0; c < d; c++) s += qh[c] * row[c];
            p[j] = s * scale;
            mx = p[j] > mx ? p[j] : mx;
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < len; j++) sum += (p[j] = expf(p[j] - mx));
        for (int64_t c = 0; c < d; c++) acc[c] = 0.0f;
        for (int64_t j = 0; j < len; j++) {
            mp_convert(row, MP_F32, (const char *)vc + (size_t)(j * hd + h * d) * cs, ct,
                       (size_t)d);
            for (int64_t c = 0; c < d; c++) acc[c] += p[j] * row[c];
        }
        for (int64_t c = 0; c < d; c++) acc[c] /= sum;
        mp_convert((char *)o + (size_t)(h * d) * mp_dtype_size(ot), ot, acc, MP_F32, (size_t)d);
    }
}
