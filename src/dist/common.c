/* common.c - the parts of data parallelism that need no MPI: how a global
 * batch is cut into per-rank shards, and whether a launcher started us. */
#include <stdlib.h>

#include "core/internal.h"

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
