/* dist_internal.h - what the MPI and the no-MPI builds of src/dist/ share. */
#ifndef MP_DIST_INTERNAL_H
#define MP_DIST_INTERNAL_H

#include "core/internal.h"

/* mp_dist_reducer_new's arguments: MP_ERR_INVALID naming the bad one. */
mp_status mp_dist_reducer_check(mp_reduce_mode mode, size_t bucket_bytes);

#endif
