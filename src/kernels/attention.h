/* attention.h - fused causal scaled-dot-product attention in the
 * flash-attention style: tiles of queries against tiles of keys with an
 * online softmax in float32 (running max and sum per query row), so no
 * [T, T] matrix is ever stored; backward recomputes the tiles.
 *
 * Layout: q, k, v, o and their gradients are [batch, T, heads, d], row-major
 * (the channels of a head contiguous, a head's rows heads * d apart): what a
 * projection GEMM writes from [batch * T, model] rows, so no transposes. The
 * per-row log-sum-exp is float32 [batch, heads, T].
 *
 *   forward   s_ij = (q_i . k_j) / sqrt(d) for j <= i (the causal mask),
 *             o_i = sum_j softmax_j(s_i) v_j, lse_i = log sum_j exp(s_ij)
 *   backward  p_ij = exp(s_ij - lse_i), D_i = dO_i . O_i,
 *             dV_j = sum_i p_ij dO_i, dS_ij = p_ij (dO_i . v_j - D_i),
 *             dQ_i = sum_j dS_ij k_j / sqrt(d), dK_j = sum_i dS_ij q_i / sqrt(d)
 *
 * Inputs may be in any float dtype (widened exactly to float32); all
 * arithmetic is float32 and each output is rounded once to its dtype.
 * Forward runs one task per (batch, head, query tile); backward one per
 * (batch, head): its key tiles in order, each against the query tiles that
 * see it, P and dS computed once per pair of tiles, dK and dV summed in the
 * tile, dQ in a float32 row block of the head (key tiles in order). Every
 * output element is summed by one task in a fixed order, so results are
 * bit-identical for any thread count, with no atomics. Each thread takes
 * from its mp_scratch slot 3 mp_attention_forward_scratch_bytes(t, d) in
 * forward (the tiles' mp_attention_scratch_bytes(d) and a head's key tiles,
 * loaded once for its query tiles) and
 * mp_attention_backward_scratch_bytes(t, d) (the tiles' and the head's float32
 * dQ, Q and dO rows, lse and D: the query side loaded once for all its key
 * tiles) in backward, and nothing else: memory is linear in T, never
 * [T, T]. */
#ifndef MP_ATTENTION_H
#define MP_ATTENTION_H

#include "core/internal.h"

enum { MP_ATTN_TILE = 64 }; /* query and key rows per tile */

typedef struct {
    int64_t batch, t, heads, d;
} mp_attn_geom;

/* Per-thread scratch (bytes) the forward asks for at head size d, and the
 * backward at sequence length t. */
size_t mp_attention_scratch_bytes(int64_t d);
size_t mp_attention_forward_scratch_bytes(int64_t t, int64_t d);
size_t mp_attention_backward_scratch_bytes(int64_t t, int64_t d);

/* o [batch, T, heads, d] in ot, lse [batch, heads, T] float32 (may be NULL
 * when no backward follows). q, k, v in their own dtypes. */
mp_status mp_attention_forward(const mp_attn_geom *g, const void *q, mp_dtype qt, const void *k,
                               mp_dtype kt, const void *v, mp_dtype vt, void *o, mp_dtype ot,
                               float *lse);

/* dq, dk, dv (each [batch, T, heads, d], written, in gt) from do (in dot),
 * the forward's inputs, its output o (in ot) and lse. */
mp_status mp_attention_backward(const mp_attn_geom *g, const void *q, mp_dtype qt, const void *k,
                                mp_dtype kt, const void *v, mp_dtype vt, const void *o, mp_dtype ot,
                                const float *lse, const void *dout, mp_dtype dot, void *dq,
                                void *dk, void *dv, mp_dtype gt);

/* One query row against a key/value cache (incremental decoding): for each
 * head, o = sum_j softmax_j(q . k_j / sqrt(d)) v_j over the cache's first
 * len rows (the positions up to and including the query's own). q and o
 * are one [heads, d] row; kc and vc [len, heads, d] rows in ct. The
 * forward's arithmetic for the query at position len - 1, in its order: o
 * is, bit for bit, that row of mp_attention_forward over the same rows.
 * Heads run on the library's threads where the cache is long; each takes
 * mp_attention_scratch_bytes(d) from its mp_scratch slot 3. */
mp_status mp_attention_decode_row(int64_t heads, int64_t d, const void *q, const void *kc,
                                  const void *vc, mp_dtype ct, int64_t len, void *o, mp_dtype ot);
/* n query rows at consecutive positions first .. first + n - 1 (a
 * prefill): q and o [n, heads, d], row r attending over the cache's first
 * first + r + 1 rows, each row's bits those of mp_attention_decode_row and
 * of the forward's row. Several rows run as the forward's tiles of
 * MP_ATTN_TILE query rows (starting at first), which share each key tile's
 * loads; the tiles and heads share the library's threads. */
mp_status mp_attention_decode_rows(int64_t heads, int64_t d, const void *q, const void *kc,
                                   const void *vc, mp_dtype ct, int64_t first, int64_t n, void *o,
                                   mp_dtype ot);

#endif
