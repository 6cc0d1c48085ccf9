/* common.c - the parts of data parallelism that need no MPI: how a global
 * batch is cut into per-rank shards, and whether a launcher started us. */
#include <stdlib.h>

#include "dist/dist_internal.h"

void mp_dist_shard(int64_t batch, int rank, int size, int64_t *begin, int64_t *end)
{
    if (size < 1) size = 1;
    *begin = batch * rank / size;
    *end = batch * (rank + 1) / size;
}

bool mp_dist_launched(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                       "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return true;
    return false;
}

const char *mp_reduce_mode_name(mp_reduce_mode mode)
{
    static const char *const names[] = {"float32", "ordered", "bfloat16"};
    return (unsigned)mode < 3 ? names[mode] : "?";
}

mp_status mp_dist_reducer_check(mp_reduce_mode mode, size_t bucket_bytes)
{
    if ((unsigned)mode > MP_REDUCE_BFLOAT16)
        return mp_set_error(MP_ERR_INVALID, "dist: unknown reduction mode %d", (int)mode);
    if (bucket_bytes < 1024 || bucket_bytes > ((size_t)1 << 30))
        return mp_set_error(MP_ERR_INVALID, "dist: bucket size %zu bytes outside 1 KiB..1 GiB",
                            bucket_bytes);
    return MP_OK;
}
