/* reducer_mpi.c - float32 sums over the ranks in buckets that start while
 * backward still runs (mixprec/dist.h, mp_dist_reducer).
 *
 * Arrays handed to mp_dist_reducer_add become buckets of about bucket_bytes:
 * a large array is cut into pieces that are summed in place, small ones are
 * packed side by side into a bucket's own staging buffer. A bucket starts as
 * soon as it fills. Per mode:
 *   FLOAT32   one MPI_Iallreduce in place;
 *   ORDERED   MPI_Ialltoallv hands each rank its 1/N of the bucket from
 *             every rank; the owner adds the N pieces in a fixed pairwise
 *             order (level by level: row j += row j + s for s = 1, 2, 4...,
 *             i.e. ((r0 + r1) + (r2 + r3)) for four ranks); MPI_Iallgatherv
 *             hands the sums back. 2 (N - 1) / N x the bytes, the all-reduce
 *             lower bound, and the same bits on every run;
 *   BFLOAT16  as ORDERED with bfloat16 on the wire (nearest even), the
 *             owner's sum in float32, rounded to bfloat16 once.
 * The two-phase modes advance in mp_dist_reducer_progress and finish: a
 * rank's only thread computes, so MPI moves data only inside its calls.
 * Buckets and their buffers are kept and reused: every step adds the same
 * arrays in the same order, so after the first step nothing is allocated. */
#include <stdlib.h>
#include <string.h>

#include "dist/dist_internal.h"
#include "dist/mpi_internal.h"

/* FIRST done becomes READY; buckets start their SECOND in bucket order */
enum { IDLE, FIRST, READY, SECOND, DONE };

typedef struct {
    float *dst;     /* the sums' place: the array's span, or stage */
    size_t n;       /* floats */
    int seg0, nseg; /* packed: segments [seg0, seg0 + nseg) */
    float *stage;   /* packed: the segments side by side */
    size_t stage_cap;
    uint16_t *wire; /* BFLOAT16: the bucket in bfloat16 */
    size_t wire_cap;
    void *recv;  /* two-phase: N pieces of this rank's part */
    float *rows; /* BFLOAT16: those pieces widened */
    size_t recv_cap, rows_cap;
    int *counts; /* 4 x N: send counts and offsets, receive counts and offsets */
    int phase;
    MPI_Request req;
} bucket;

typedef struct {
    float *values;
    size_t n;
} segment;

struct mp_dist_reducer {
    mp_reduce_mode mode;
    size_t cap; /* floats a bucket */
    int rank, size;
    bucket *b;
    int nb, bcap; /* buckets in use this round, allocated */
    segment *seg;
    int nseg, segcap;
    int open;   /* the packed bucket being filled, or -1 */
    int second; /* the next bucket to start its second phase */
    /* MPI wants collectives started in one order on every rank; a bucket's
     * second phase starts when its first is seen done, at a moment that
     * differs between ranks. So first phases go on comm[0], second phases on
     * comm[1], each in bucket order. */
    MPI_Comm comm[2];
    mp_dist_reducer_stats now, last;
};

mp_dist_reducer *mp_dist_reducer_new(mp_reduce_mode mode, size_t bucket_bytes)
{
    if (mp_dist_reducer_check(mode, bucket_bytes)) return NULL;
    mp_dist_reducer *r = calloc(1, sizeof *r);
    if (!r) {
        mp_set_error(MP_ERR_NOMEM, "dist: out of memory for the reducer");
        return NULL;
    }
    r->mode = mode;
    r->cap = bucket_bytes / sizeof(float);
    r->rank = mp_dist_rank();
    r->size = mp_dist_size();
    r->open = -1;
    r->comm[0] = r->comm[1] = MPI_COMM_NULL;
    if (r->size > 1) {
        int rc = MPI_Comm_dup(MPI_COMM_WORLD, &r->comm[0]);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(MPI_COMM_WORLD, &r->comm[1]);
        if (rc != MPI_SUCCESS) {
            mp_dist_mpi_error(rc, "MPI_Comm_dup");
            mp_dist_reducer_free(r);
            return NULL;
        }
    }
    return r;
}

void mp_dist_reducer_free(mp_dist_reducer *r)
{
    if (!r) return;
    for (int i = 0; i < r->bcap; i++) {
        bucket *b = &r->b[i];
        /* a collective in flight cannot be freed (MPI 3.1, 5.12): only an
         * error path leaves one, and the job stops after it */
        free(b->stage);
        free(b->wire);
        free(b->recv);
        free(b->rows);
        free(b->counts);
    }
    free(r->b);
    free(r->seg);
    int fin = 0;
    MPI_Finalized(&fin);
    for (int c = 0; c < 2 && !fin; c++)
        if (r->comm[c] != MPI_COMM_NULL) MPI_Comm_free(&r->comm[c]);
    free(r);
}

static bool grow(void **p, size_t *cap, size_t bytes)
{
    if (bytes <= *cap) return true;
    void *q = realloc(*p, bytes);
    if (!q) return false;
    *p = q;
    *cap = bytes;
    return true;
}

static mp_status nomem(void)
{
    return mp_set_error(MP_ERR_NOMEM, "dist: out of memory for a bucket");
}

/* The next bucket of this round (kept from the last round if there was one). */
static bucket *next_bucket(mp_dist_reducer *r)
{
    if (r->nb == r->bcap) {
        int cap = r->bcap ? 2 * r->bcap : 16;
        bucket *b = realloc(r->b, (size_t)cap * sizeof *b);
        if (!b) return NULL;
        memset(b + r->bcap, 0, (size_t)(cap - r->bcap) * sizeof *b);
        r->b = b;
        r->bcap = cap;
    }
    bucket *b = &r->b[r->nb];
    if (!b->counts && !(b->counts = malloc(4 * (size_t)r->size * sizeof(int)))) return NULL;
    r->nb++;
    b->dst = NULL;
    b->n = 0;
    b->seg0 = b->nseg = 0;
    b->phase = IDLE;
    return b;
}

/* Rank j's part of n: [n j / N, n (j + 1) / N). */
static size_t part(size_t n, int j, int size) { return n * (size_t)j / (size_t)size; }

/* Rows row[0..N) of c floats, row j at rows + j c: rows[0..c) becomes their
 * pairwise sum in rank order. */
static void pairwise_sum(float *rows, size_t c, int size)
{
    for (int s = 1; s < size; s *= 2)
        for (int j = 0; j + s < size; j += 2 * s) {
            float *restrict a = rows + (size_t)j * c;
            const float *restrict b = rows + (size_t)(j + s) * c;
#pragma omp simd
            for (size_t i = 0; i < c; i++) a[i] += b[i];
        }
}

static mp_status start(mp_dist_reducer *r, bucket *b)
{
    double t0 = mp_seconds();
    if (b->nseg) { /* packed: copy the segments in */
        if (!grow((void **)&b->stage, &b->stage_cap, b->n * sizeof(float))) return nomem();
        size_t off = 0;
        for (int k = 0; k < b->nseg; k++) {
            const segment *sg = &r->seg[b->seg0 + k];
            memcpy(b->stage + off, sg->values, sg->n * sizeof(float));
            off += sg->n;
        }
        b->dst = b->stage;
    }
    int N = r->size, me = r->rank, rc;
    r->now.buckets++;
    r->now.values += (double)b->n;
    if (r->mode == MP_REDUCE_FLOAT32) {
        rc = MPI_Iallreduce(MPI_IN_PLACE, b->dst, (int)b->n, MPI_FLOAT, MPI_SUM, r->comm[0],
                            &b->req);
        r->now.bytes_sent += 2.0 * (N - 1) / N * (double)b->n * sizeof(float);
        b->phase = SECOND;
        r->now.work_seconds += mp_seconds() - t0;
        return rc == MPI_SUCCESS ? MP_OK : mp_dist_mpi_error(rc, "MPI_Iallreduce");
    }
    bool half = r->mode == MP_REDUCE_BFLOAT16;
    size_t es = half ? sizeof(uint16_t) : sizeof(float);
    size_t mine = part(b->n, me + 1, N) - part(b->n, me, N);
    int *sc = b->counts, *sd = sc + N, *rcnt = sd + N, *rd = rcnt + N;
    for (int j = 0; j < N; j++) {
        sd[j] = (int)part(b->n, j, N);
        sc[j] = (int)(part(b->n, j + 1, N) - part(b->n, j, N));
        rcnt[j] = (int)mine;
        rd[j] = (int)(mine * (size_t)j);
    }
    if (!grow(&b->recv, &b->recv_cap, (size_t)N * mine * es + 1)) return nomem();
    const void *send = b->dst;
    if (half) {
        if (!grow((void **)&b->wire, &b->wire_cap, b->n * es)) return nomem();
        mp_convert(b->wire, MP_BF16, b->dst, MP_F32, b->n);
        send = b->wire;
    }
    MPI_Datatype t = half ? MPI_UINT16_T : MPI_FLOAT;
    rc = MPI_Ialltoallv(send, sc, sd, t, b->recv, rcnt, rd, t, r->comm[0], &b->req);
    r->now.bytes_sent += (double)(b->n - mine) * (double)es;
    b->phase = FIRST;
    r->now.work_seconds += mp_seconds() - t0;
    return rc == MPI_SUCCESS ? MP_OK : mp_dist_mpi_error(rc, "MPI_Ialltoallv");
}

/* The first phase is done: this rank sums its part, the all-gather starts. */
static mp_status second_phase(mp_dist_reducer *r, bucket *b)
{
    int N = r->size, me = r->rank;
    size_t lo = part(b->n, me, N), mine = part(b->n, me + 1, N) - lo;
    bool half = r->mode == MP_REDUCE_BFLOAT16;
    float *rows = b->recv;
    if (half) {
        if (!grow((void **)&b->rows, &b->rows_cap, (size_t)N * mine * sizeof(float) + 1))
            return nomem();
        rows = b->rows;
        mp_convert(rows, MP_F32, b->recv, MP_BF16, (size_t)N * mine);
    }
    pairwise_sum(rows, mine, N);
    int *counts = b->counts, *offsets = counts + N; /* the send layout is the gather layout */
    int rc;
    if (half) {
        mp_convert(b->wire + lo, MP_BF16, rows, MP_F32, mine);
        rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b->wire, counts, offsets,
                             MPI_UINT16_T, r->comm[1], &b->req);
    } else {
        memcpy(b->dst + lo, rows, mine * sizeof(float));
        rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b->dst, counts, offsets, MPI_FLOAT,
                             r->comm[1], &b->req);
    }
    r->now.bytes_sent += (double)(N - 1) * (double)mine * (half ? 2.0 : 4.0);
    b->phase = SECOND;
    return rc == MPI_SUCCESS ? MP_OK : mp_dist_mpi_error(rc, "MPI_Iallgatherv");
}

/* The last phase is done: widen, unpack. */
static void complete(mp_dist_reducer *r, bucket *b)
{
    if (r->mode == MP_REDUCE_BFLOAT16) mp_convert(b->dst, MP_F32, b->wire, MP_BF16, b->n);
    size_t off = 0;
    for (int k = 0; k < b->nseg; k++) {
        const segment *sg = &r->seg[b->seg0 + k];
        memcpy(sg->values, b->stage + off, sg->n * sizeof(float));
        off += sg->n;
    }
    b->phase = DONE;
}

/* Bucket b's collective is done. */
static void done(mp_dist_reducer *r, bucket *b)
{
    if (b->phase == FIRST) {
        b->phase = READY;
        return;
    }
    double t0 = mp_seconds();
    complete(r, b);
    r->now.work_seconds += mp_seconds() - t0;
}

/* Start the second phases whose turn has come. */
static mp_status start_seconds(mp_dist_reducer *r)
{
    while (r->second < r->nb) {
        bucket *b = &r->b[r->second];
        if (b->phase == FIRST || b->phase == IDLE) return MP_OK; /* its turn, not yet ready */
        r->second++;
        if (b->phase != READY) continue; /* single-phase (FLOAT32) */
        double t0 = mp_seconds();
        mp_status s = second_phase(r, b);
        r->now.work_seconds += mp_seconds() - t0;
        if (s) return s;
    }
    return MP_OK;
}

mp_status mp_dist_reducer_progress(mp_dist_reducer *r)
{
    for (int i = 0; i < r->nb; i++) {
        bucket *b = &r->b[i];
        if (b->phase != FIRST && b->phase != SECOND) continue;
        int flag = 0;
        int rc = MPI_Test(&b->req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mp_dist_mpi_error(rc, "a gradient bucket's collective");
        if (flag) done(r, b);
    }
    return start_seconds(r);
}

static mp_status close_open(mp_dist_reducer *r)
{
    if (r->open < 0) return MP_OK;
    bucket *b = &r->b[r->open];
    r->open = -1;
    return start(r, b);
}

mp_status mp_dist_reducer_add(mp_dist_reducer *r, float *values, size_t n)
{
    if (!n || r->size == 1) return MP_OK;
    mp_status s;
    if (n >= r->cap / 2) { /* its own buckets, summed in place */
        if ((s = close_open(r))) return s;
        size_t pieces = (n + r->cap - 1) / r->cap;
        for (size_t k = 0; k < pieces; k++) {
            bucket *b = next_bucket(r);
            if (!b) return nomem();
            size_t lo = n * k / pieces, hi = n * (k + 1) / pieces;
            b->dst = values + lo;
            b->n = hi - lo;
            if ((s = start(r, b))) return s;
        }
        return mp_dist_reducer_progress(r);
    }
    if (r->open >= 0 && r->b[r->open].n + n > r->cap && (s = close_open(r))) return s;
    if (r->open < 0) {
        bucket *b = next_bucket(r);
        if (!b) return nomem();
        b->seg0 = r->nseg;
        r->open = (int)(b - r->b);
    }
    if (r->nseg == r->segcap) {
        int cap = r->segcap ? 2 * r->segcap : 64;
        segment *sg = realloc(r->seg, (size_t)cap * sizeof *sg);
        if (!sg) return nomem();
        r->seg = sg;
        r->segcap = cap;
    }
    r->seg[r->nseg++] = (segment){values, n};
    bucket *b = &r->b[r->open];
    b->nseg++;
    b->n += n;
    return b->n >= r->cap ? close_open(r) : MP_OK;
}

mp_status mp_dist_reducer_finish(mp_dist_reducer *r)
{
    mp_status s = close_open(r);
    if (!s) s = mp_dist_reducer_progress(r);
    for (int i = 0; i < r->nb && !s; i++) {
        bucket *b = &r->b[i];
        while (!s && b->phase != DONE) {
            /* earlier buckets are done, so b's second phase starts as soon
             * as its first is: wait for whichever b is in */
            if (b->phase != FIRST && b->phase != SECOND) {
                s = mp_set_error(MP_ERR_INVALID, "dist: bucket %d of %d idle in finish", i, r->nb);
                break;
            }
            double t0 = mp_seconds();
            s = mp_dist_wait(&b->req, "the gradient sum over the ranks");
            r->now.wait_seconds += mp_seconds() - t0;
            if (s) break;
            done(r, b);
            s = mp_dist_reducer_progress(r);
        }
    }
    r->now.bytes_exact = r->mode != MP_REDUCE_FLOAT32;
    r->last = r->now;
    memset(&r->now, 0, sizeof r->now);
    r->nb = 0;
    r->nseg = 0;
    r->open = -1;
    r->second = 0;
    return s;
}

void mp_dist_reducer_last(const mp_dist_reducer *r, mp_dist_reducer_stats *out) { *out = r->last; }
