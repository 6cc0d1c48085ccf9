/* attention_backward.c - the fused causal attention kernel's backward (see
 * attention.h): one task per (batch, head), its key tiles in order, each
 * against the query tiles that see it; P and dS recomputed from the
 * forward's lse with the forward's operations in its order, so p_ij =
 * exp(s_ij - lse_i) is the forward's softmax; dK and dV summed in the tile,
 * dQ in the head's float32 rows. */
#include "kernels/attention_io.h"

/* The tiles' scratch, then the head's float32 rows: dQ [T][dp], Q and dO
 * [tile_rows(T)][dp], lse and D [T] (padded), one channel row. */
size_t mp_attention_backward_scratch_bytes(int64_t t, int64_t d)
{
    const size_t dp = pad16((size_t)d);
    return mp_attention_scratch_bytes(d) +
           ((size_t)t * dp + 2 * tile_rows(t) * dp + 2 * pad16((size_t)t) + dp) * sizeof(float);
}

/* --------------------------------------------------------------- backward */

/* A head's query rows as backward reads them, loaded once for all its key
 * tiles (per key tile, they were widened again for each: 11% of
 * backward_kv_tile's time at T = 128, two tiles). */
typedef struct {
    float *Q, *dO; /* [tile_rows(T)][dp], zeros past T */
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
    qs.dO = qs.Q + tile_rows(g->t) * (size_t)dp;
    qs.ls = qs.dO + tile_rows(g->t) * (size_t)dp;
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
        float *ws = region_scratch(bytes, &fail);
#pragma omp for schedule(dynamic, 1)
        for (long long task = 0; task < tasks; task++) {
            if (!ws) continue;
            backward_head(g, ws, task / g->heads, task % g->heads, q, qt, k, kt, v, vt, o, ot, lse,
                          dout, dot, dq, dk, dv, gt);
        }
    }
    if (fail) return scratch_error("backward", bytes);
    return MP_OK;
}
