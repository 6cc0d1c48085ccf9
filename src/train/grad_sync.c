/* grad_sync.c - the data-parallel training step: this rank's shard of the
 * global batch, forward and backward, with each layer's float32 gradients
 * handed to the reduction over the ranks (mp_dist_reducer) as soon as its
 * backward is done, so the sums travel while the layers below still run.
 *
 * Sliced (mp_shard_options.slices = S > 1): the global batch is S fixed
 * slices; this rank runs forward and backward on each of its S / N slices
 * alone and adds their gradients pairwise in slice order with a binary
 * counter (a stack of log2(S / N) partial sums: after slice j, the partials
 * of j's trailing one bits fold in), the ranks' sums then meet in the same
 * pairwise order (MP_REDUCE_ORDERED). The sum is the balanced tree over the
 * S slices whatever N is, so 1, 2 or 4 ranks give the same bits. Random
 * layers draw by global row and every slice of a step has the same forward
 * count, so each slice draws what one process draws for its rows.
 *
 * Optimizer sharding (ZeRO stage 1): each rank updates its part of every
 * tensor (mp_optimizer_shard) and the parts are all-gathered after the
 * step; a checkpoint and the end of a fit make the state whole again. */
#include <stdlib.h>
#include <string.h>

#include "train/train_internal.h"

struct mp_grad_sync {
    mp_model *m;
    const mp_param *p; /* the optimizer's parameters */
    int np;
    int *model_index; /* p[j] is model parameter model_index[j] */
    size_t *offset;   /* p[j]'s place in a flat gradient (for the stack) */
    size_t total;
    mp_dist_reducer *red;
    mp_reduce_mode mode;
    size_t bucket_bytes;
    float *stack; /* levels x total: the binary counter's partial sums */
    int levels;
    int depth;  /* on the last slice: stack levels each gradient folds in before it leaves */
    int next;   /* p[next..np) have been handed over this step */
    bool local; /* this step: no other ranks */
};

void mp_grad_sync_free(mp_grad_sync *g)
{
    if (!g) return;
    mp_dist_reducer_free(g->red);
    mp_free(g->stack);
    free(g->model_index);
    free(g->offset);
    free(g);
}

/* (Re)made when the mode or bucket size changes. */
static mp_status sync_for(mp_grad_sync **gp, mp_model *m, mp_optimizer *opt,
                          const mp_shard_options *o)
{
    size_t bucket = o->bucket_bytes ? o->bucket_bytes : ((size_t)4 << 20);
    mp_grad_sync *g = *gp;
    if (g && g->mode == o->reduce && g->bucket_bytes == bucket) return MP_OK;
    mp_grad_sync_free(g);
    *gp = NULL;
    g = calloc(1, sizeof *g);
    if (!g) return mp_set_error(MP_ERR_NOMEM, "data parallel: out of memory");
    g->m = m;
    g->p = mp_optimizer_params(opt);
    g->np = mp_optimizer_num_params(opt);
    g->mode = o->reduce;
    g->bucket_bytes = bucket;
    g->model_index = calloc((size_t)g->np + 1, sizeof *g->model_index);
    g->offset = calloc((size_t)g->np + 1, sizeof *g->offset);
    g->red = mp_dist_reducer_new(o->reduce, bucket);
    if (!g->model_index || !g->offset || !g->red) {
        bool no_reducer = !g->red; /* the reducer left its message */
        mp_grad_sync_free(g);
        return no_reducer ? MP_ERR_INVALID
                          : mp_set_error(MP_ERR_NOMEM, "data parallel: out of memory");
    }
    /* the optimizer's parameters are the trainable ones in model order */
    for (int i = 0, j = 0; i < mp_model_num_params(m) && j < g->np; i++)
        if (mp_model_get_param(m, i)->trainable) g->model_index[j++] = i;
    for (int j = 0; j < g->np; j++) {
        g->offset[j] = g->total;
        g->total += g->p[j].grad ? (size_t)g->p[j].n : 0;
    }
    *gp = g;
    return MP_OK;
}

static mp_status stack_levels(mp_grad_sync *g, int levels)
{
    if (levels <= g->levels) return MP_OK;
    mp_free(g->stack);
    g->levels = 0;
    g->stack = mp_alloc((size_t)levels * g->total * sizeof(float), MP_MEM_GRADS);
    if (!g->stack && g->total)
        return mp_set_error(MP_ERR_NOMEM,
                            "data parallel: out of memory for %d partial gradient "
                            "sums (deterministic slices)",
                            levels);
    g->levels = levels;
    return MP_OK;
}

static float *level(mp_grad_sync *g, int l, int j)
{
    return g->stack + (size_t)l * g->total + g->offset[j];
}

/* grad = partial + grad: the partial is the left subtree */
static void fold(float *restrict grad, const float *restrict partial, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) grad[i] = partial[i] + grad[i];
}

static mp_status hand(mp_grad_sync *g, int j)
{
    const mp_param *p = &g->p[j];
    if (!p->grad) return MP_OK;
    for (int l = 0; l < g->depth; l++) fold(p->grad, level(g, l, j), (size_t)p->n);
    return g->local ? MP_OK : mp_dist_reducer_add(g->red, p->grad, (size_t)p->n);
}

/* The backward hook: parameters whose gradients are final leave now. */
static mp_status after_layer(void *user, int node)
{
    mp_grad_sync *g = user;
    int first = mp_model_params_final_after(g->m, node);
    while (g->next > 0 && g->model_index[g->next - 1] >= first) {
        mp_status s = hand(g, --g->next);
        if (s) return s;
    }
    return g->local ? MP_OK : mp_dist_reducer_progress(g->red);
}

/* After slice j of k (not the last): fold j's trailing one bits, push. */
static void push_slice(mp_grad_sync *g, int j)
{
    int l = 0;
    while ((j >> l) & 1) l++;
    for (int q = 0; q < g->np; q++) {
        const mp_param *p = &g->p[q];
        if (!p->grad) continue;
        for (int t = 0; t < l; t++) fold(p->grad, level(g, t, q), (size_t)p->n);
        memcpy(level(g, l, q), p->grad, (size_t)p->n * sizeof(float));
    }
}

static void zero_grads(mp_grad_sync *g)
{
    for (int q = 0; q < g->np; q++)
        if (g->p[q].grad) memset(g->p[q].grad, 0, (size_t)g->p[q].n * sizeof(float));
}

/* Sparse labels a sample has: one per output position. */
static int64_t labels_per_row(const mp_model *m)
{
    int64_t shape[8], n = 1;
    int nd = mp_model_output_shape(m, shape);
    for (int d = 0; d + 1 < nd; d++) n *= shape[d];
    return n;
}

static bool power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

mp_status mp_train_shard_step(mp_model *m, mp_optimizer *opt, mp_grad_sync **gp, const mp_tensor *x,
                              const int32_t *labels, const mp_tensor *target,
                              const mp_shard_options *o, float scale, float *loss, int64_t *correct)
{
    int rank = o->local ? 0 : mp_dist_rank(), size = o->local ? 1 : mp_dist_size();
    int64_t rows = x->shape[0], c = o->global_batch;
    int S = o->slices > 1 ? o->slices : size;
    if (o->slices > 1 &&
        (!power_of_two(S) || S % size || !power_of_two(S / size) || o->reduce == MP_REDUCE_FLOAT32))
        return mp_set_error(MP_ERR_INVALID,
                            "data parallel: %d slices on %d ranks: the slices must be a power of "
                            "two that the ranks divide, summed with the ordered reduction",
                            S, size);
    int64_t lo, hi; /* the shard must be this rank's whole slices */
    mp_dist_shard(c, rank, size, &lo, &hi);
    if (o->first_row != lo || rows != hi - lo)
        return mp_set_error(MP_ERR_INVALID,
                            "data parallel: rank %d of %d holds rows %lld..%lld of a batch of "
                            "%lld, not %lld..%lld",
                            rank, size, (long long)o->first_row, (long long)(o->first_row + rows),
                            (long long)c, (long long)lo, (long long)hi);
    mp_status s = sync_for(gp, m, opt, o);
    if (s) return s;
    mp_grad_sync *g = *gp;
    int k = S / size; /* this rank's slices */
    int levels = 0;
    while ((1 << levels) < k) levels++;
    if ((s = stack_levels(g, levels))) return s;
    uint64_t count = mp_model_forward_count(m);
    *loss = 0;
    *correct = 0;
    g->next = g->np;
    g->local = size == 1;
    for (int j = 0; j < k && !s; j++) {
        int64_t a = c * (rank * k + j) / S - lo, b = c * (rank * k + j + 1) / S - lo;
        bool last = j == k - 1;
        g->depth = last ? levels : 0;
        if (a == b) { /* an empty slice adds zeros */
            zero_grads(g);
        } else {
            mp_tensor xs = *x;
            xs.shape[0] = b - a;
            xs.data =
                (char *)x->data + (size_t)(mp_tensor_numel(x) / rows * a) * mp_dtype_size(x->dtype);
            mp_tensor ts;
            if (target) {
                ts = *target;
                ts.shape[0] = b - a;
                ts.data = (char *)target->data + (size_t)(mp_tensor_numel(target) / rows * a) *
                                                     mp_dtype_size(target->dtype);
            }
            int64_t per_row = labels ? labels_per_row(m) : 0;
            mp_model_set_row_offset(m, lo + a);
            mp_model_set_forward_count(m, count);
            if (last && !o->no_overlap) mp_model_set_backward_hook(m, after_layer, g);
            float part = 0;
            int64_t right = 0;
            s = mp_train_forward_backward(m, &xs, labels ? labels + per_row * a : NULL,
                                          target ? &ts : NULL, c, scale, &part, &right);
            mp_model_set_backward_hook(m, NULL, NULL);
            mp_model_set_row_offset(m, 0);
            *loss += part;
            *correct += right;
        }
        if (!s && !last) push_slice(g, j);
    }
    mp_model_set_forward_count(m, count + 1); /* one training forward a step, on every rank */
    while (!s && g->next > 0) s = hand(g, --g->next); /* what the hook did not hand over */
    mp_status f = g->local ? MP_OK : mp_dist_reducer_finish(g->red);
    return s ? s : f;
}

void mp_grad_sync_last(const mp_grad_sync *g, mp_dist_reducer_stats *out)
{
    if (g)
        mp_dist_reducer_last(g->red, out);
    else
        memset(out, 0, sizeof *out);
}

/* ------------------------------------------------ optimizer sharding */

mp_status mp_train_gather_update(mp_optimizer *opt)
{
    int size = mp_optimizer_shards(opt), rank = mp_dist_rank();
    for (int i = 0; i < mp_optimizer_num_params(opt); i++) {
        const mp_param *p = mp_optimizer_param(opt, i);
        if (!p->grad || !p->n) continue;
        size_t n = (size_t)p->n, ws = mp_dtype_size(p->weight_dtype);
        mp_status s = p->master ? mp_dist_allgather_parts(p->master, n, sizeof(float))
                                : mp_dist_allgather_parts(p->weight, n, ws);
        if (s) return s;
        if (!p->master || !p->weight || p->weight == (void *)p->master) continue;
        for (int r = 0; r < size; r++) { /* the other parts' compute copies */
            if (r == rank) continue;
            size_t lo = n * (size_t)r / (size_t)size, hi = n * (size_t)(r + 1) / (size_t)size;
            mp_convert((char *)p->weight + lo * ws, p->weight_dtype, p->master + lo, MP_F32,
                       hi - lo);
        }
    }
    return MP_OK;
}

mp_status mp_train_unshard(mp_optimizer *opt)
{
    if (!opt || mp_optimizer_shards(opt) == 1) return MP_OK;
    mp_status s = mp_optimizer_shard(opt, 0, 1); /* whole, this rank's part in place */
    for (int i = 0; i < mp_optimizer_num_params(opt) && !s; i++)
        for (int k = 0; k < mp_optimizer_num_slots(opt) && !s; k++) {
            int64_t n;
            float *slot = mp_optimizer_slot(opt, i, k, &n);
            s = mp_dist_allgather_parts(slot, (size_t)n, sizeof(float));
        }
    return s;
}
