/* data_parallel.c - what data parallelism adds around a step and a fit: the
 * loss and correct count summed over the ranks (the gradients travel in
 * grad_sync.c), non-trainable state (BatchNormalization's moving
 * statistics) averaged over the ranks, the float8 recipe's amaxes maxed
 * over the ranks, and the checks that every rank fits the same data the
 * same way. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/model_internal.h"
#include "nn/quant.h"
#include "train/train_internal.h"

mp_status mp_train_reduce_figures(float *loss, int64_t *correct)
{
    double figures[2] = {(double)*loss, (double)*correct};
    mp_status s = mp_dist_allreduce_f64(figures, 2);
    if (s) return s;
    *loss = (float)figures[0];
    *correct = (int64_t)figures[1];
    return MP_OK;
}

mp_status mp_train_average_state(mp_model *m, float **buf, size_t *cap)
{
    int n = mp_dist_size();
    size_t total = 0;
    for (int i = 0; i < mp_model_num_params(m); i++) {
        const mp_model_param *p = mp_model_get_param(m, i);
        if (!p->trainable && p->master) total += (size_t)p->n;
    }
    if (n == 1 || !total) return MP_OK;
    if (total > *cap) {
        float *b = realloc(*buf, total * sizeof *b);
        if (!b) return mp_set_error(MP_ERR_NOMEM, "data parallel: out of memory for state");
        *buf = b;
        *cap = total;
    }
    float *b = *buf;
    size_t off = 0;
    for (int i = 0; i < mp_model_num_params(m); i++) {
        const mp_model_param *p = mp_model_get_param(m, i);
        if (p->trainable || !p->master) continue;
        memcpy(b + off, p->master, (size_t)p->n * sizeof *b);
        off += (size_t)p->n;
    }
    mp_status s = mp_dist_allreduce_f32(b, total, true); /* rank order: the same bits every run */
    if (s) return s;
    const float inv = 1.0f / (float)n;
    off = 0;
    for (int i = 0; i < mp_model_num_params(m); i++) {
        mp_model_param *p = mp_model_get_param(m, i);
        if (p->trainable || !p->master) continue;
        for (int64_t k = 0; k < p->n; k++) p->master[k] = b[off + (size_t)k] * inv;
        off += (size_t)p->n;
    }
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
