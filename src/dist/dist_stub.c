/* dist_stub.c - the dist API in a build without MPI: one rank, and every
 * request that needs MPI refused with MP_ERR_UNSUPPORTED and a message
 * saying how to get it. */
#include <stdlib.h>
#include <string.h>

#include "dist/dist_internal.h"

#define NO_MPI                                                                                     \
    "this build of mixprec has no MPI (install libopenmpi-dev and openmpi-bin, e.g. "              \
    "`sh scripts/deps.sh mpi`, then rebuild with `make MPI=1`)"

bool mp_dist_available(void) { return false; }
mp_status mp_dist_init(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return mp_set_error(MP_ERR_UNSUPPORTED, "dist: %s", NO_MPI);
}
bool mp_dist_initialized(void) { return false; }
int mp_dist_rank(void) { return 0; }
int mp_dist_size(void) { return 1; }
void mp_dist_finalize(void) {}
int mp_dist_exit(int status) { return status; }

mp_status mp_dist_allreduce_f32(float *values, size_t n, bool deterministic)
{
    (void)values;
    (void)n;
    (void)deterministic;
    return MP_OK; /* one rank: the sum is the values */
}
mp_status mp_dist_allreduce_f64(double *values, size_t n)
{
    (void)values;
    (void)n;
    return MP_OK;
}
mp_status mp_dist_allreduce_i64(int64_t *values, size_t n)
{
    (void)values;
    (void)n;
    return MP_OK;
}
mp_status mp_dist_allreduce_max_u32(uint32_t *values, size_t n)
{
    (void)values;
    (void)n;
    return MP_OK;
}
mp_status mp_dist_allgather_parts(void *values, size_t n, size_t es)
{
    (void)values;
    (void)n;
    (void)es;
    return MP_OK;
}
mp_status mp_dist_check_same(uint64_t value, const char *what)
{
    (void)value;
    (void)what;
    return MP_OK;
}
mp_status mp_dist_barrier(void) { return MP_OK; }

/* One rank: a reducer's sums are the values themselves. */
struct mp_dist_reducer {
    mp_reduce_mode mode;
};
mp_dist_reducer *mp_dist_reducer_new(mp_reduce_mode mode, size_t bucket_bytes)
{
    if (mp_dist_reducer_check(mode, bucket_bytes)) return NULL;
    mp_dist_reducer *r = calloc(1, sizeof *r);
    if (r)
        r->mode = mode;
    else
        mp_set_error(MP_ERR_NOMEM, "dist: out of memory for the reducer");
    return r;
}
void mp_dist_reducer_free(mp_dist_reducer *r) { free(r); }
mp_status mp_dist_reducer_add(mp_dist_reducer *r, float *values, size_t n)
{
    (void)r;
    (void)values;
    (void)n;
    return MP_OK;
}
mp_status mp_dist_reducer_progress(mp_dist_reducer *r)
{
    (void)r;
    return MP_OK;
}
mp_status mp_dist_reducer_finish(mp_dist_reducer *r)
{
    (void)r;
    return MP_OK;
}
void mp_dist_reducer_last(const mp_dist_reducer *r, mp_dist_reducer_stats *out)
{
    memset(out, 0, sizeof *out);
    out->bytes_exact = r->mode != MP_REDUCE_FLOAT32;
}
static double timeout_s = 300;
void mp_dist_set_timeout(double seconds) { timeout_s = seconds > 0 ? seconds : 300; }
double mp_dist_timeout(void) { return timeout_s; }
