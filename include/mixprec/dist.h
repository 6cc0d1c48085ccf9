/* mixprec/dist.h - data-parallel training across processes on MPI: start
 * and stop the MPI runtime, this process's rank among the job's ranks, and
 * the float32 sums the training step reduces gradients with. Built when the
 * library is compiled with MPI (`make MPI=1`, the default where mpicc is
 * found); otherwise every call that needs MPI returns MP_ERR_UNSUPPORTED and
 * the job is one rank. Included by mixprec.h. */
/* The whole API, in order: this part compiles when included alone. */
#include "../mixprec.h"

#ifndef MIXPREC_DIST_H
#define MIXPREC_DIST_H

#ifdef __cplusplus
extern "C" {
#endif

/* True when this build of the library has MPI. */
bool mp_dist_available(void);
/* Start MPI (MPI_Init_thread, funneled: only the calling thread talks to
 * MPI) with the program's arguments (either may be NULL), unless the
 * program started it, and give every rank rank 0's measured GEMM kernel
 * choices (mixprec.h, MP_DISPATCH_AGREED) so that the ranks compute alike:
 * a collective every rank calls (before its first GEMM, so that all its
 * products use them). Without MPI in this build: MP_ERR_UNSUPPORTED.
 * Calling it twice is harmless. */
mp_status mp_dist_init(int *argc, char ***argv);
/* Whether mp_dist_init succeeded and mp_dist_finalize has not run. */
bool mp_dist_initialized(void);
/* This process's rank and the number of ranks (0 and 1 when MPI is not
 * started or not built). */
int mp_dist_rank(void);
int mp_dist_size(void);
/* Stop MPI (after every rank is done with it); harmless when not started. */
void mp_dist_finalize(void);
/* A program's way out under MPI: returns status. The ranks meet (apart from
 * any collective still in flight) and finalize together; a rank that ends
 * with a nonzero status while another has not come out within 5 s stops
 * the whole job (MPI_Abort) instead of waiting for ranks that may be
 * blocked on it (a finishing rank waits up to mp_dist_timeout()). */
int mp_dist_exit(int status);
/* True when this process was started by mpirun/mpiexec of Open MPI, MPICH or
 * Slurm (environment variables), whether or not this build has MPI. */
bool mp_dist_launched(void);

/* Sums over every rank, the result on every rank (identical bits on all).
 * deterministic: the sum is taken in rank order (rank 0 + rank 1 + ...) by
 * gathering every rank's values, so it is the same bits on every run for a
 * given number of ranks whatever MPI's algorithm choice; otherwise
 * MPI_Allreduce (MPI picks the order). One rank: the values stay as they
 * are. */
mp_status mp_dist_allreduce_f32(float *values, size_t n, bool deterministic);
mp_status mp_dist_allreduce_f64(double *values, size_t n);
mp_status mp_dist_allreduce_i64(int64_t *values, size_t n);
/* The largest of each element over every rank, on every rank (order-free:
 * the same bits on every rank and run). Non-negative floats compare as
 * their bits, a NaN above inf: the float8 recipe reduces its amaxes so. */
mp_status mp_dist_allreduce_max_u32(uint32_t *values, size_t n);
/* values[0, n) of es-byte elements: rank r holds the right part
 * [n r / N, n (r + 1) / N) (mp_dist_shard's split); on return every rank
 * holds every part. */
mp_status mp_dist_allgather_parts(void *values, size_t n, size_t es);
/* Every rank must pass the same value (e.g. a data fingerprint or a batch
 * size); MP_ERR_INVALID naming `what` and both values when one differs. */
mp_status mp_dist_check_same(uint64_t value, const char *what);
/* Wait for every rank. */
mp_status mp_dist_barrier(void);

/* ------------------------------------------------ gradient reduction */

/* How a reducer sums float32 values over the ranks. */
typedef enum {
    /* MPI_Iallreduce: float32 sums in the order MPI's algorithm picks */
    MP_REDUCE_FLOAT32 = 0,
    /* reduce-scatter then all-gather (MPI_Ialltoallv, MPI_Iallgatherv): each
     * element summed in float32 over the ranks in a fixed pairwise order,
     * ((r0 + r1) + (r2 + r3)), by the rank that owns it: the same bits on
     * every run for a given number of ranks */
    MP_REDUCE_ORDERED,
    /* as ORDERED with bfloat16 on the wire: each rank's values rounded to
     * bfloat16 (nearest even), summed in float32 in the fixed order, the
     * sum rounded to bfloat16 once and widened back. Half the bytes; each
     * result within (2 u + N eps/2) sum|v| of the float32 sum (u = 2^-8,
     * eps = 2^-23) */
    MP_REDUCE_BFLOAT16,
} mp_reduce_mode;

/* "float32", "ordered", "bfloat16". */
const char *mp_reduce_mode_name(mp_reduce_mode mode);

/* A reducer sums arrays over the ranks in place, in buckets of about
 * bucket_bytes that start as soon as they fill (non-blocking collectives),
 * so a step's backward can hand over each layer's gradients while the
 * layers below it still run. Every rank must add the same sizes in the
 * same order. Buffers are kept between steps: a step costs no allocation. */
typedef struct mp_dist_reducer mp_dist_reducer;
/* NULL with mp_last_error() when bucket_bytes < 1024 or memory is short. */
mp_dist_reducer *mp_dist_reducer_new(mp_reduce_mode mode, size_t bucket_bytes);
void mp_dist_reducer_free(mp_dist_reducer *r);
/* Queue values[0, n) (float32): summed over the ranks into values by the
 * time mp_dist_reducer_finish returns. The array must stay put until then. */
mp_status mp_dist_reducer_add(mp_dist_reducer *r, float *values, size_t n);
/* Let the collectives in flight move on (MPI moves them only inside its
 * calls on a rank whose one thread computes): call it between layers. */
mp_status mp_dist_reducer_progress(mp_dist_reducer *r);
/* Start what is queued, wait for every bucket: every array added since the
 * last finish holds its sum over the ranks. */
mp_status mp_dist_reducer_finish(mp_dist_reducer *r);
/* What the last finished round took. */
typedef struct {
    int buckets;
    double values;       /* floats summed */
    double bytes_sent;   /* bytes this rank handed MPI for other ranks */
    bool bytes_exact;    /* false: MPI_Iallreduce, whose algorithm MPI picks: the
                          * figure is its lower bound 2 (N - 1) / N x the bytes */
    double wait_seconds; /* in finish, waiting for collectives */
    double work_seconds; /* in add, progress and finish, not waiting: packing,
                          * the owner's sums, conversions, starting collectives */
} mp_dist_reducer_stats;
void mp_dist_reducer_last(const mp_dist_reducer *r, mp_dist_reducer_stats *out);

/* Seconds a rank waits for the others in any collective before it stops
 * the whole job (a rank that died or hangs): default 300, or the
 * environment's MP_DIST_TIMEOUT. The rank prints one line naming the
 * collective and calls MPI_Abort: a collective in flight cannot be taken
 * back, so no later MPI call could succeed. */
void mp_dist_set_timeout(double seconds);
double mp_dist_timeout(void);

/* Rows [begin, end) of a global batch of `batch` rows that `rank` of `size`
 * takes: [rank*batch/size, (rank+1)*batch/size). */
void mp_dist_shard(int64_t batch, int rank, int size, int64_t *begin, int64_t *end);

#ifdef __cplusplus
}
#endif
#endif
