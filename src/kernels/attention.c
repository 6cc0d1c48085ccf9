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
 * p_ij = exp(s_ij - lse_i) matches the forward's softmax. This file: the
 * forward and decoding; the backward is attention_backward.c, the rows' I/O
 * attention_io.h. */
#include "kernels/attention_io.h"

/* The larger of the two tile tasks: backward's (kT, vT, K, dK, dV, the P
 * and dS tiles, one channel row); forward's (Q, kT, V, the sums, four
 * score rows, the running max and sum) is less. Rows of d channels padded
 * to dp. */
size_t mp_attention_scratch_bytes(int64_t d)
{
    size_t td = (size_t)TILE * pad16((size_t)d);
    return (5 * td + 2 * TILE * TILE + pad16((size_t)d)) * sizeof(float);
}

/* The tiles' scratch, then a head's key tiles, K^T and V (key_tiles). */
size_t mp_attention_forward_scratch_bytes(int64_t t, int64_t d)
{
    return mp_attention_scratch_bytes(d) + 2 * tile_rows(t) * pad16((size_t)d) * sizeof(float);
}

/* ---------------------------------------------------------------- forward */

/* A thread's key tiles of one head, kept while its tasks stay on that head
 * (a task is a query tile, and the tasks of a head come to each thread in
 * increasing order, each seeing the key tiles before it): each tile
 * widened and transposed once, not again for every query tile that sees
 * it. KT tile i at KT + i * TILE * dp ([d][TILE]), V tile i at V + i *
 * TILE * dp ([TILE][dp]). */
typedef struct {
    int64_t b, h, loaded; /* the head, and how many of its tiles are in */
    float *KT, *V;
} key_tiles;

TILE_CLONES static void forward_tile(const mp_attn_geom *g, float *ws, key_tiles *kc, int64_t b,
                                     int64_t h, int64_t q0, const void *q, mp_dtype qt,
                                     const void *k, mp_dtype kt, const void *v, mp_dtype vt,
                                     void *o, mp_dtype ot, float *lse, int64_t qoff)
{
    const int64_t d = g->d, dp = (int64_t)pad16((size_t)d), td = TILE * dp;
    const int64_t nr = g->t - q0 < TILE ? g->t - q0 : TILE;
    const float scale = 1.0f / sqrtf((float)d);
    const int64_t sp = (int64_t)pad16(TILE); /* a score row */
    float *Q = ws, *KTw = Q + td, *Vw = KTw + td, *acc = Vw + td, *s = acc + td;
    float *mx = s + 4 * sp, *sum = mx + sp, *tmp = sum + sp;
    load_rows(Q, g, q, qt, b, h, q0 - qoff, nr);
    memset(Q + nr * dp, 0, (size_t)((TILE - nr) * dp) * sizeof(float)); /* rows of a last group */
    for (int64_t r = 0; r < nr; r++) {
        mx[r] = -INFINITY;
        sum[r] = 0.0f;
    }
    memset(acc, 0, (size_t)(nr * dp) * sizeof(float));
    if (kc && (kc->b != b || kc->h != h)) *kc = (key_tiles){b, h, 0, kc->KT, kc->V};
    for (int64_t k0 = 0; k0 <= q0 + nr - 1; k0 += TILE) {
        const int64_t nk = g->t - k0 < TILE ? g->t - k0 : TILE;
        float *KT = KTw, *V = Vw;
        if (kc) {
            KT = kc->KT + k0 * dp;
            V = kc->V + k0 * dp;
        }
        if (!kc || kc->loaded * TILE <= k0) {
            load_rows_t(KT, tmp, g, k, kt, b, h, k0, nk);
            load_rows(V, g, v, vt, b, h, k0, nk);
            if (kc) kc->loaded = k0 / TILE + 1;
        }
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
    const size_t bytes = mp_attention_forward_scratch_bytes(g->t, g->d);
    int fail = 0;
#pragma omp parallel num_threads(threads_for(tasks))
    {
        float *ws = region_scratch(bytes, &fail);
        const size_t dp = pad16((size_t)g->d);
        float *tiles = ws ? ws + mp_attention_scratch_bytes(g->d) / sizeof(float) : NULL;
        key_tiles kc = {-1, -1, 0, tiles, tiles ? tiles + tile_rows(g->t) * dp : NULL};
#pragma omp for schedule(dynamic, 1)
        for (long long task = 0; task < tasks; task++) {
            if (!ws) continue;
            const int64_t qi = task % nq, bh = task / nq;
            forward_tile(g, ws, &kc, bh / g->heads, bh % g->heads, qi * TILE, q, qt, k, kt, v, vt,
                         o, ot, lse, 0);
        }
    }
    if (fail) return scratch_error("forward", bytes);
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
        forward_tile(g, ws, NULL, 0, h, first + qi * TILE, q, ct, kc, ct, vc, ct, o, ot, NULL,
                     first);
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
        float *ws = region_scratch(bytes, &fail);
        for (int64_t j = 0; j < tasks && ws; j++)
            decode_task(&g, ws, j, nq, first, n, q, kc, vc, ct, o, ot);
    } else {
#pragma omp parallel num_threads(nt)
        {
            float *ws = region_scratch(bytes, &fail);
#pragma omp for schedule(dynamic)
            for (int64_t j = 0; j < tasks; j++)
                if (ws) decode_task(&g, ws, j, nq, first, n, q, kc, vc, ct, o, ot);
        }
    }
    if (fail) return scratch_error("decode", bytes);
    return MP_OK;
}

mp_status mp_attention_decode_row(int64_t heads, int64_t d, const void *q, const void *kc,
                                  const void *vc, mp_dtype ct, int64_t len, void *o, mp_dtype ot)
{
    return mp_attention_decode_rows(heads, d, q, kc, vc, ct, len - 1, 1, o, ot);
}
