/* data_parallel.c - the data-parallel part of a training step: the float32
 * gradients of every rank's shard summed over the ranks in one buffer (the
 * per-rank losses were already divided by the global batch, so the sum is
 * the gradient of the global mean), with the loss and the correct count.
 * Every rank then holds the same gradients and takes the same step or skip.
 * One buffer after the whole backward: bucketed, overlapped reduction is
 * the next step. Then the float8 recipe's amaxes, maxed over the ranks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/model_internal.h"
#include "nn/quant.h"
#include "train/train_internal.h"

mp_status mp_train_reduce_shard(mp_optimizer *opt, float **buf, size_t *cap, bool deterministic,
                                bool empty, float *loss, int64_t *correct)
{
    const mp_param *p = mp_optimizer_params(opt);
    int np = mp_optimizer_num_params(opt);
    size_t total = 0;
    for (int i = 0; i < np; i++)
        if (p[i].grad) total += (size_t)p[i].n;
    if (total > *cap) {
        float *b = realloc(*buf, total * sizeof *b);
        if (!b) return mp_set_error(MP_ERR_NOMEM, "data parallel: out of memory for gradients");
        *buf = b;
        *cap = total;
    }
    float *b = *buf;
    size_t off = 0;
    for (int i = 0; i < np; i++) {
        if (!p[i].grad) continue;
        if (empty)
            memset(b + off, 0, (size_t)p[i].n * sizeof *b);
        else
            memcpy(b + off, p[i].grad, (size_t)p[i].n * sizeof *b);
        off += (size_t)p[i].n;
    }
    mp_status s = mp_dist_allreduce_f32(b, total, deterministic);
    if (s) return s;
    off = 0;
    for (int i = 0; i < np; i++) {
        if (!p[i].grad) continue;
        memcpy(p[i].grad, b + off, (size_t)p[i].n * sizeof *b);
        off += (size_t)p[i].n;
    }
    double figures[2] = {empty ? 0.0 : (double)*loss, empty ? 0.0 : (double)*correct};
    if ((s = mp_dist_allreduce_f64(figures, 2))) return s;
    *loss = (float)figures[0];
    *correct = (int64_t)figures[1];
    return MP_OK;
}

mp_status mp_train_reduce_amax(mp_model *m, uint32_t **buf, size_t *cap)
{
    size_t n = (size_t)m->nfp8;
    if (!n) return MP_OK;
    if (2 * n > *cap) {
        uint32_t *b = realloc(*buf, 2 * n * sizeof *b);
        if (!b) return mp_set_error(MP_ERR_NOMEM, "data parallel: out of memory for amaxes");
        *buf = b;
        *cap = 2 * n;
    }
    uint32_t *v = *buf; /* the amaxes' bits (never negative), then whether pending */
    for (size_t i = 0; i < n; i++) {
        v[i] = m->fp8[i].has_pending ? mp_f32_bits(m->fp8[i].pending) : 0;
        v[n + i] = m->fp8[i].has_pending;
    }
    mp_status s = mp_dist_allreduce_max_u32(v, 2 * n);
    if (s) return s;
    for (size_t i = 0; i < n; i++) {
        m->fp8[i].has_pending = v[n + i] != 0;
        m->fp8[i].pending = m->fp8[i].has_pending ? mp_bits_f32(v[i]) : 0.0f;
    }
    return MP_OK;
}

mp_status mp_fit_dist_begin(int64_t batch_size, int *rank, int *nranks)
{
    *rank = mp_dist_rank();
    *nranks = mp_dist_size();
    if (batch_size % *nranks)
        return mp_set_error(MP_ERR_INVALID,
                            "data parallel: batch size %lld does not divide by %d ranks (each "
                            "rank takes an equal shard of every global batch)",
                            (long long)batch_size, *nranks);
    return MP_OK;
}

mp_status mp_fit_dist_check_data(const mp_fit_state *fs)
{
    mp_status s = mp_dist_check_same(fs->data_hash, "the training data's fingerprint");
    if (!s) s = mp_dist_check_same((uint64_t)fs->data_count, "the number of training samples");
    if (!s) s = mp_dist_check_same((uint64_t)fs->batch_size, "the batch size");
    if (!s) s = mp_dist_check_same(fs->seed ^ (uint64_t)fs->shuffle, "the seed and shuffle");
    return s;
}

mp_status mp_dist_agree(mp_status s, const char *what)
{
    int64_t failed = s != MP_OK;
    mp_status r = mp_dist_allreduce_i64(&failed, 1);
    if (r) return r;
    if (s) return s; /* this rank's own message */
    if (failed)
        return mp_set_error(MP_ERR_IO, "data parallel: %s failed on another rank (see its message)",
                            what);
    return MP_OK;
}

bool mp_dist_any(bool flag)
{
    int64_t v = flag;
    if (mp_dist_allreduce_i64(&v, 1)) return true; /* a broken job stops */
    return v != 0;
}
