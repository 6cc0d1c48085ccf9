/* dist_mpi.c - the dist API on MPI (MPI_COMM_WORLD): start and stop, rank
 * and size, and the sums the training step reduces gradients, losses and
 * counts with. The deterministic float32 sum gathers every rank's values and
 * adds them in rank order, so its bits depend on the number of ranks only,
 * never on MPI's choice of algorithm. Compiled with MPI's flags (mpicc
 * --showme:compile) only when the build has MPI. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

static bool started;  /* by us */
static bool finished; /* MPI_Finalize ran */

bool mp_dist_available(void) { return true; }

static bool running(void)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

mp_status mp_dist_init(int *argc, char ***argv)
{
    if (running()) return MP_OK;
    if (finished) return mp_set_error(MP_ERR_INVALID, "dist: MPI was already finalized");
    int provided = 0;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return mp_set_error(MP_ERR_IO, "dist: MPI_Init_thread failed (%d)", rc);
    /* a failed collective returns an error code instead of aborting the job */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    started = true;
    return MP_OK;
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

void mp_dist_finalize(void)
{
    free(gather_buf);
    gather_buf = NULL;
    gather_cap = 0;
    if (started && running()) {
        MPI_Finalize();
        finished = true;
    }
}

static mp_status mpi_error(int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
    return mp_set_error(MP_ERR_IO, "dist: %s failed on rank %d: %s", what, mp_dist_rank(), msg);
}

/* MPI counts are int: large buffers go in pieces. */
#define CHUNK ((size_t)1 << 28)

static mp_status allreduce(void *values, size_t n, size_t es, MPI_Datatype type, MPI_Op op)
{
    if (!running() || mp_dist_size() == 1) return MP_OK;
    for (size_t off = 0; off < n; off += CHUNK) {
        size_t c = n - off < CHUNK ? n - off : CHUNK;
        int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)values + off * es, (int)c, type, op,
                               MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Allreduce");
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
        int rc =
            MPI_Allgather(values + off, (int)c, MPI_FLOAT, all, (int)c, MPI_FLOAT, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Allgather");
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

mp_status mp_dist_check_same(uint64_t value, const char *what)
{
    if (!running() || mp_dist_size() == 1) return MP_OK;
    uint64_t lo = value, hi = value;
    int rc = MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    if (rc == MPI_SUCCESS)
        rc = MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Allreduce");
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
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? MP_OK : mpi_error(rc, "MPI_Barrier");
}
