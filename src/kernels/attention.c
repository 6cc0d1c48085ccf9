/* attention.c - the fused causal attention kernel (see attention.h): tiles
 * of TILE query rows against tiles of TILE key rows, widened to float32 in
 * per-thread scratch, with the running max and sum of the online softmax
 * per query row. Dot products are written as row updates over the key
 * columns (s[c] += q[k] * kT[k][c]) and the value sums as updates over the
 * channels, so -O2 vectorizes them without reassociating any sum: each sum
 * runs in one fixed order. Forward and backward recompute s_ij with the
 * same operations in the same order, so backward's p_ij = exp(s_ij - lse_i)
 * matches the forward's softmax. */
#include <math.h>
#include <string.h>

#include "kernels/attention.h"

#define TILE MP_ATTN_TILE
#define SLOT 3

static size_t pad16(size_t n) { return (n + 15) & ~(size_t)15; }

/* The largest of the three tasks: dK/dV (kT, vT, dK, dV, Q, dO, two rows of
 * TILE, lse and D, one channel row). */
size_t mp_attention_scratch_bytes(int64_t d)
{
    size_t td = pad16((size_t)TILE * (size_t)d);
    return (6 * td + 4 * pad16(TILE) + pad16((size_t)d)) * sizeof(float);
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
}

static void store_row(void *dst, mp_dtype t, size_t off, const float *src, int64_t d)
{
    mp_convert((char *)dst + off * mp_dtype_size(t), t, src, MP_F32, (size_t)d);
}

/* n rows from row0 into dst [n][d]. */
static void load_rows(float *dst, const mp_attn_geom *g, const void *src, mp_dtype t, int64_t b,
                      int64_t h, int64_t row0, int64_t n)
{
    for (int64_t r = 0; r < n; r++)
        load_row(dst + r * g->d, src, t, row_off(g, b, h, row0 + r), g->d);
}

/* n rows from row0 transposed into dst [d][TILE], through one row of tmp. */
static void load_rows_t(float *dst, float *tmp, const mp_attn_geom *g, const void *src, mp_dtype t,
                        int64_t b, int64_t h, int64_t row0, int64_t n)
{
    for (int64_t r = 0; r < n; r++) {
        load_row(tmp, src, t, row_off(g, b, h, row0 + r), g->d);
        for (int64_t k = 0; k < g->d; k++) dst[k * TILE + r] = tmp[k];
    }
}

/* s[c] = (q . kT[:, c]) * scale for c < nc. */
static void scores(float *s, const float *q, const float *kt, int64_t d, int64_t nc, float scale)
{
    for (int64_t c = 0; c < nc; c++) s[c] = 0.0f;
    for (int64_t k = 0; k < d; k++) {
        const float a = q[k], *kr = kt + k * TILE;
        for (int64_t c = 0; c < nc; c++) s[c] += a * kr[c];
    }
    for (int64_t c = 0; c < nc; c++) s[c] *= scale;
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

static void forward_tile(const mp_attn_geom *g, float *ws, int64_t b, int64_t h, int64_t q0,
                         const void *q, mp_dtype qt, const void *k, mp_dtype kt, const void *v,
                         mp_dtype vt, void *o, mp_dtype ot, float *lse)
{
    const int64_t d = g->d, td = (int64_t)pad16((size_t)(TILE * d));
    const int64_t nr = g->t - q0 < TILE ? g->t - q0 : TILE;
    const float scale = 1.0f / sqrtf((float)d);
    float *Q = ws, *KT = Q + td, *V = KT + td, *acc = V + td, *s = acc + td;
    float *mx = s + pad16(TILE), *sum = mx + pad16(TILE), *tmp = sum + pad16(TILE);
    load_rows(Q, g, q, qt, b, h, q0, nr);
    for (int64_t r = 0; r < nr; r++) {
        mx[r] = -INFINITY;
        sum[r] = 0.0f;
    }
    memset(acc, 0, (size_t)(nr * d) * sizeof(float));
    for (int64_t k0 = 0; k0 <= q0 + nr - 1; k0 += TILE) {
        const int64_t nk = g->t - k0 < TILE ? g->t - k0 : TILE;
        load_rows_t(KT, tmp, g, k, kt, b, h, k0, nk);
        load_rows(V, g, v, vt, b, h, k0, nk);
        for (int64_t r = 0; r < nr; r++) {
            const int64_t nc = visible(q0 + r, k0, nk);
            if (nc == 0) continue;
            scores(s, Q + r * d, KT, d, nc, scale);
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
            float *a = acc + r * d;
            for (int64_t j = 0; j < d; j++) a[j] *= corr;
            for (int64_t c = 0; c < nc; c++) {
                const float p = s[c], *vr = V + c * d;
                for (int64_t j = 0; j < d; j++) a[j] += p * vr[j];
            }
        }
    }
    for (int64_t r = 0; r < nr; r++) {
        float *a = acc + r * d, inv = 1.0f / sum[r];
        for (int64_t j = 0; j < d; j++) a[j] *= inv;
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
    const int64_t d = g->d;
    load_rows(Q, g, q, qt, b, h, q0, nr);
    load_rows(dO, g, dout, dot, b, h, q0, nr);
    for (int64_t r = 0; r < nr; r++) {
        load_row(tmp, o, ot, row_off(g, b, h, q0 + r), d);
        float acc = 0.0f;
        for (int64_t j = 0; j < d; j++) acc += dO[r * d + j] * tmp[j];
        D[r] = acc;
        ls[r] = lse[(b * g->heads + h) * g->t + q0 + r];
    }
}

/* One query row against nc key columns: p = exp(s - lse) into p, and
 * ds = p (dO . v - D) into ds. */
static void row_grads(float *p, float *ds, const float *q, const float *dor, const float *KT,
                      const float *VT, int64_t d, int64_t nc, float scale, float ls, float D)
{
    scores(p, q, KT, d, nc, scale);
    for (int64_t c = 0; c < nc; c++) p[c] = expf(p[c] - ls);
    for (int64_t c = 0; c < nc; c++) ds[c] = 0.0f;
    for (int64_t k = 0; k < d; k++) {
        const float a = dor[k], *vr = VT + k * TILE;
        for (int64_t c = 0; c < nc; c++) ds[c] += a * vr[c];
    }
    for (int64_t c = 0; c < nc; c++) ds[c] = p[c] * (ds[c] - D);
}

/* dK and dV of one key tile, all later query tiles looped inside. */
static void backward_kv_tile(const mp_attn_geom *g, float *ws, int64_t b, int64_t h, int64_t k0,
                             const void *q, mp_dtype qt, const void *k, mp_dtype kt, const void *v,
                             mp_dtype vt, const void *o, mp_dtype ot, const float *lse,
                             const void *dout, mp_dtype dot, void *dk, void *dv, mp_dtype gt)
{
    const int64_t d = g->d, td = (int64_t)pad16((size_t)(TILE * d));
    const int64_t nk = g->t - k0 < TILE ? g->t - k0 : TILE;
    const float scale = 1.0f / sqrtf((float)d);
    float *KT = ws, *VT = KT + td, *dK = VT + td, *dV = dK + td, *Q = dV + td, *dO = Q + td;
    float *p = dO + td, *ds = p + pad16(TILE), *ls = ds + pad16(TILE), *D = ls + pad16(TILE);
    float *tmp = D + pad16(TILE);
    load_rows_t(KT, tmp, g, k, kt, b, h, k0, nk);
    load_rows_t(VT, tmp, g, v, vt, b, h, k0, nk);
    memset(dK, 0, (size_t)(nk * d) * sizeof(float));
    memset(dV, 0, (size_t)(nk * d) * sizeof(float));
    for (int64_t q0 = k0; q0 < g->t; q0 += TILE) {
        const int64_t nr = g->t - q0 < TILE ? g->t - q0 : TILE;
        load_query_side(g, Q, dO, ls, D, tmp, b, h, q0, nr, q, qt, o, ot, lse, dout, dot);
        for (int64_t r = 0; r < nr; r++) {
            const int64_t nc = visible(q0 + r, k0, nk);
            const float *qr = Q + r * d, *dor = dO + r * d;
            row_grads(p, ds, qr, dor, KT, VT, d, nc, scale, ls[r], D[r]);
            for (int64_t c = 0; c < nc; c++) {
                float *dvr = dV + c * d, *dkr = dK + c * d;
                const float pc = p[c], sc = ds[c];
                for (int64_t j = 0; j < d; j++) dvr[j] += pc * dor[j];
                for (int64_t j = 0; j < d; j++) dkr[j] += sc * qr[j];
            }
        }
    }
    for (int64_t c = 0; c < nk; c++) {
        float *dkr = dK + c * d;
        for (int64_t j = 0; j < d; j++) dkr[j] *= scale;
        store_row(dk, gt, row_off(g, b, h, k0 + c), dkr, d);
        store_row(dv, gt, row_off(g, b, h, k0 + c), dV + c * d, d);
    }
}

/* dQ of one query tile, the key tiles it sees looped inside. */
static void backward_q_tile(const mp_attn_geom *g, float *ws, int64_t b, int64_t h, int64_t q0,
                            const void *q, mp_dtype qt, const void *k, mp_dtype kt, const void *v,
                            mp_dtype vt, const void *o, mp_dtype ot, const float *lse,
                            const void *dout, mp_dtype dot, void *dq, mp_dtype gt)
{
    const int64_t d = g->d, td = (int64_t)pad16((size_t)(TILE * d));
    const int64_t nr = g->t - q0 < TILE ? g->t - q0 : TILE;
    const float scale = 1.0f / sqrtf((float)d);
    float *KT = ws, *VT = KT + td, *K = VT + td, *dQ = K + td, *Q = dQ + td, *dO = Q + td;
    float *p = dO + td, *ds = p + pad16(TILE), *ls = ds + pad16(TILE), *D = ls + pad16(TILE);
    float *tmp = D + pad16(TILE);
    load_query_side(g, Q, dO, ls, D, tmp, b, h, q0, nr, q, qt, o, ot, lse, dout, dot);
    memset(dQ, 0, (size_t)(nr * d) * sizeof(float));
    for (int64_t k0 = 0; k0 <= q0 + nr - 1; k0 += TILE) {
        const int64_t nk = g->t - k0 < TILE ? g->t - k0 : TILE;
        load_rows(K, g, k, kt, b, h, k0, nk);
        for (int64_t c = 0; c < nk; c++)
            for (int64_t j = 0; j < d; j++) KT[j * TILE + c] = K[c * d + j];
        load_rows_t(VT, tmp, g, v, vt, b, h, k0, nk);
        for (int64_t r = 0; r < nr; r++) {
            const int64_t nc = visible(q0 + r, k0, nk);
            if (nc == 0) continue;
            row_grads(p, ds, Q + r * d, dO + r * d, KT, VT, d, nc, scale, ls[r], D[r]);
            float *dqr = dQ + r * d;
            for (int64_t c = 0; c < nc; c++) {
                const float sc = ds[c], *kr = K + c * d;
                for (int64_t j = 0; j < d; j++) dqr[j] += sc * kr[j];
            }
        }
    }
    for (int64_t r = 0; r < nr; r++) {
        float *dqr = dQ + r * d;
        for (int64_t j = 0; j < d; j++) dqr[j] *= scale;
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
