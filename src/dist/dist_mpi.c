/* dist_mpi.c - the dist API on MPI (MPI_COMM_WORLD): start and stop, rank
 * and size, and the sums the training step reduces gradients, losses and
 * counts with. The deterministic float32 sum gathers every rank's values and
 * adds them in rank order, so its bits depend on the number of ranks only,
 * never on MPI's choice of algorithm. Compiled with MPI's flags (mpicc
 * --showme:compile) only when the build has MPI. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/mpi_internal.h"
#include "kernels/gemm_internal.h"

static bool started;  /* by us */
static bool finished; /* MPI_Finalize ran */
/* The ranks meet here on the way out (mp_dist_exit), apart from whatever
 * collective a rank may still be in. */
static MPI_Comm exit_comm = MPI_COMM_NULL;

bool mp_dist_available(void) { return true; }

static bool running(void)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

/* Every rank takes rank 0's GEMM kernel choices (gemm_dispatch.c): each
 * rank timing its own can pick differently where two kernels are close or
 * the machine is loaded (ranks oversubscribing cores), and the ranks'
 * products would then differ in their last bits, which --deterministic
 * promises they do not. Rank 0 times what its cache does not hold (about
 * 15 ms a pair) while the others wait. */
static mp_status agree_kernels(void)
{
    int8_t msg[17] = {0}; /* how many, then the choices */
    if (mp_dist_rank() == 0) msg[0] = (int8_t)mp_gemm_dispatch_choices(msg + 1, 16);
    int rc = MPI_Bcast(msg, (int)sizeof msg, MPI_INT8_T, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS)
        return mp_set_error(MP_ERR_IO, "dist: sharing rank 0's GEMM kernel choice failed (%d)", rc);
    if (mp_dist_rank() != 0) mp_gemm_dispatch_adopt(msg + 1, msg[0]);
    return MP_OK;
}

mp_status mp_dist_init(int *argc, char ***argv)
{
    static bool agreed;
    if (finished && !running())
        return mp_set_error(MP_ERR_INVALID, "dist: MPI was already finalized");
    if (!running()) {
        int provided = 0;
        int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS)
            return mp_set_error(MP_ERR_IO, "dist: MPI_Init_thread failed (%d)", rc);
        /* a failed collective returns an error code instead of aborting the job */
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_dup(MPI_COMM_WORLD, &exit_comm);
        started = true;
    }
    if (agreed) return MP_OK;
    agreed = true;
    return mp_dist_size() > 1 ? agree_kernels() : MP_OK;
}

bool mp_dist_initialized(void) { return running(); }

int mp_dist_rank(void)
{
    int r = 0;
    if (running()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

int mp_dist_size(void)
{
    int n = 1;
    if (running()) MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

/* The ordered sum's gather buffer: kept between steps (a fresh one each
 * step would pay its first-touch page faults every step). */
static float *gather_buf;
static size_t gather_cap;
static int *parts_buf; /* mp_dist_allgather_parts's counts and offsets */
static size_t parts_cap;

void mp_dist_finalize(void)
{
    free(gather_buf);
    gather_buf = NULL;
    gather_cap = 0;
    free(parts_buf);
    parts_buf = NULL;
    parts_cap = 0;
    if (started && running()) {
        MPI_Finalize();
        finished = true;
    }
}

mp_status mp_dist_mpi_error(int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
    return mp_set_error(MP_ERR_IO, "dist: %s failed on rank %d: %s", what, mp_dist_rank(), msg);
}

static double timeout_s = -1; /* < 0: not read from the environment yet */

void mp_dist_set_timeout(double seconds) { timeout_s = seconds > 0 ? seconds : 300; }

double mp_dist_timeout(void)
{
    if (timeout_s < 0) {
        const char *e = getenv("MP_DIST_TIMEOUT");
        char *end = NULL;
        double v = e ? strtod(e, &end) : 0;
        timeout_s = e && end != e && *end == 0 && v > 0 ? v : 300;
    }
    return timeout_s;
}

/* req done within `limit` seconds: true; false once past it. */
static bool wait_within(MPI_Request *req, double limit, int *rc)
{
    double start = 0;
    for (long spins = 0;; spins++) {
        int done = 0;
        *rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (*rc != MPI_SUCCESS || done) return true;
        if (spins < 256) continue; /* a sum in flight on this machine: microseconds */
        if (spins == 256) start = mp_seconds();
        double waited = mp_seconds() - start;
        if (waited > limit) return false;
        /* let a rank that shares this core compute (mpirun --oversubscribe);
         * past a few milliseconds the other ranks are busy for longer, and
         * waking 50 000 times a second would take CPU time from them */
        nanosleep(&(struct timespec){0, waited < 0.005 ? 20000 : 500000}, NULL);
    }
}

mp_status mp_dist_wait(MPI_Request *req, const char *what)
{
    int rc = MPI_SUCCESS;
    if (!wait_within(req, mp_dist_timeout(), &rc)) {
        fprintf(stderr,
                "mixprec: rank %d: no answer from the other ranks for %.0f s in %s (a rank "
                "died or hangs): stopping the job\n",
                mp_dist_rank(), mp_dist_timeout(), what);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    return rc == MPI_SUCCESS ? MP_OK : mp_dist_mpi_error(rc, what);
}

int mp_dist_exit(int status)
{
    if (!running()) return status;
    int rc = MPI_SUCCESS;
    MPI_Request req;
    if (mp_dist_size() > 1 && exit_comm != MPI_COMM_NULL &&
        MPI_Ibarrier(exit_comm, &req) == MPI_SUCCESS &&
        !wait_within(&req, status ? 5.0 : mp_dist_timeout(), &rc)) {
        /* the others still run (or hang) while this rank ends */
        fprintf(stderr, "mixprec: rank %d %s while other ranks still run: stopping the job\n",
                mp_dist_rank(), status ? "failed" : "finished");
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, status ? status : 3);
    }
    if (exit_comm != MPI_COMM_NULL) MPI_Comm_free(&exit_comm);
    mp_dist_finalize();
    return status;
}

/* MPI counts are int: large buffers go in pieces. */
#define CHUNK ((size_t)1 << 28)

static mp_status allreduce(void *values, size_t n, size_t es, MPI_Datatype type, MPI_Op op)
{
    if (!running() || mp_dist_size() == 1) return MP_OK;
    for (size_t off = 0; off < n; off += CHUNK) {
        size_t c = n - off < CHUNK ? n - off : CHUNK;
        MPI_Request req;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)values + off * es, (int)c, type, op,
                                MPI_COMM_WORLD, &req);
        if (rc != MPI_SUCCESS) return mp_dist_mpi_error(rc, "MPI_Iallreduce");
        mp_status s = mp_dist_wait(&req, "MPI_Iallreduce");
        if (s) return s;
    }
    return MP_OK;
}

/* Every rank's values side by side, then summed in rank order: the same
 * bits on every rank and every run. Memory: size x the chunk. */
static mp_status allreduce_ordered(float *values, size_t n)
{
    int size = mp_dist_size();
    size_t chunk = n < ((size_t)1 << 22) ? n : ((size_t)1 << 22);
    size_t need = (size_t)size * (chunk ? chunk : 1);
    if (need > gather_cap) {
        float *b = realloc(gather_buf, need * sizeof *b);
        if (!b) return mp_set_error(MP_ERR_NOMEM, "dist: out of memory for the ordered sum");
        gather_buf = b;
        gather_cap = need;
    }
    float *all = gather_buf;
    for (size_t off = 0; off < n; off += chunk) {
        size_t c = n - off < chunk ? n - off : chunk;
        MPI_Request req;
        int rc = MPI_Iallgather(values + off, (int)c, MPI_FLOAT, all, (int)c, MPI_FLOAT,
                                MPI_COMM_WORLD, &req);
        if (rc != MPI_SUCCESS) return mp_dist_mpi_error(rc, "MPI_Iallgather");
        mp_status st = mp_dist_wait(&req, "MPI_Iallgather");
        if (st) return st;
        for (size_t i = 0; i < c; i++) {
            float s = all[i];
            for (int r = 1; r < size; r++) s += all[(size_t)r * c + i];
            values[off + i] = s;
        }
    }
    return MP_OK;
}

mp_status mp_dist_allreduce_f32(float *values, size_t n, bool deterministic)
{
    if (!running() || mp_dist_size() == 1) return MP_OK;
    return deterministic ? allreduce_ordered(values, n)
                         : allreduce(values, n, sizeof(float), MPI_FLOAT, MPI_SUM);
}

mp_status mp_dist_allreduce_f64(double *values, size_t n)
{
    return allreduce(values, n, sizeof(double), MPI_DOUBLE, MPI_SUM);
}

mp_status mp_dist_allreduce_i64(int64_t *values, size_t n)
{
    return allreduce(values, n, sizeof(int64_t), MPI_INT64_T, MPI_SUM);
}

mp_status mp_dist_allreduce_max_u32(uint32_t *values, size_t n)
{
    return allreduce(values, n, sizeof(uint32_t), MPI_UINT32_T, MPI_MAX);
}

mp_status mp_dist_allgather_parts(void *values, size_t n, size_t es)
{
    int size = mp_dist_size();
    if (!running() || size == 1) return MP_OK;
    if (n * es > (size_t)INT32_MAX)
        return mp_set_error(MP_ERR_INVALID, "dist: %zu bytes to gather at once", n * es);
    /* the counts and offsets, kept between calls (every tensor, every
     * sharded step) and freed by mp_dist_finalize */
    if (2 * (size_t)size > parts_cap) {
        int *c = realloc(parts_buf, 2 * (size_t)size * sizeof *c);
        if (!c) return mp_set_error(MP_ERR_NOMEM, "dist: out of memory");
        parts_buf = c;
        parts_cap = 2 * (size_t)size;
    }
    int *counts = parts_buf;
    for (int j = 0; j < size; j++) {
        size_t lo = n * (size_t)j / (size_t)size, hi = n * (size_t)(j + 1) / (size_t)size;
        counts[j] = (int)((hi - lo) * es);
        counts[size + j] = (int)(lo * es);
    }
    MPI_Request req;
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values, counts, counts + size,
                             MPI_BYTE, MPI_COMM_WORLD, &req);
    mp_status s = rc == MPI_SUCCESS ? mp_dist_wait(&req, "MPI_Iallgatherv")
                                    : mp_dist_mpi_error(rc, "MPI_Iallgatherv");
    return s;
}

mp_status mp_dist_check_same(uint64_t value, const char *what)
{
    if (!running() || mp_dist_size() == 1) return MP_OK;
    uint64_t lo = value, hi = value;
    mp_status s = allreduce(&lo, 1, sizeof lo, MPI_UINT64_T, MPI_MIN);
    if (!s) s = allreduce(&hi, 1, sizeof hi, MPI_UINT64_T, MPI_MAX);
    if (s) return s;
    if (lo != hi)
        return mp_set_error(MP_ERR_INVALID,
                            "dist: the ranks disagree on %s (rank %d has %llu; values range from "
                            "%llu to %llu)",
                            what, mp_dist_rank(), (unsigned long long)value, (unsigned long long)lo,
                            (unsigned long long)hi);
    return MP_OK;
}

mp_status mp_dist_barrier(void)
{
    if (!running()) return MP_OK;
    MPI_Request req;
    int rc = MPI_Ibarrier(MPI_COMM_WORLD, &req);
    return rc == MPI_SUCCESS ? mp_dist_wait(&req, "MPI_Ibarrier")
                             : mp_dist_mpi_error(rc, "MPI_Ibarrier");
}
