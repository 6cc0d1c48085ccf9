/* dist_stub.c - the dist API in a build without MPI: one rank, and every
 * request that needs MPI refused with MP_ERR_UNSUPPORTED and a message
 * saying how to get it. */
#include "core/internal.h"

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
mp_status mp_dist_check_same(uint64_t value, const char *what)
{
    (void)value;
    (void)what;
    return MP_OK;
}
mp_status mp_dist_barrier(void) { return MP_OK; }
