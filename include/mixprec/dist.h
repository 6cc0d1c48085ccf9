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
 * MPI) with the program's arguments (either may be NULL). Without MPI in
 * this build: MP_ERR_UNSUPPORTED. Calling it twice is harmless. */
mp_status mp_dist_init(int *argc, char ***argv);
/* Whether mp_dist_init succeeded and mp_dist_finalize has not run. */
bool mp_dist_initialized(void);
/* This process's rank and the number of ranks (0 and 1 when MPI is not
 * started or not built). */
int mp_dist_rank(void);
int mp_dist_size(void);
/* Stop MPI (after every rank is done with it); harmless when not started. */
void mp_dist_finalize(void);
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
/* Every rank must pass the same value (e.g. a data fingerprint or a batch
 * size); MP_ERR_INVALID naming `what` and both values when one differs. */
mp_status mp_dist_check_same(uint64_t value, const char *what);
/* Wait for every rank. */
mp_status mp_dist_barrier(void);

/* Rows [begin, end) of a global batch of `batch` rows that `rank` of `size`
 * takes: [rank*batch/size, (rank+1)*batch/size). */
void mp_dist_shard(int64_t batch, int rank, int size, int64_t *begin, int64_t *end);

#ifdef __cplusplus
}
#endif
#endif
