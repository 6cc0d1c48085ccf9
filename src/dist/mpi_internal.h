/* mpi_internal.h - what the MPI files of src/dist/ share: MPI's error as
 * our one-line error, and waiting for a request with the job's timeout.
 * Only files compiled with MPI's flags include it. */
#ifndef MP_DIST_MPI_INTERNAL_H
#define MP_DIST_MPI_INTERNAL_H

#include <mpi.h>

#include "core/internal.h"

/* MP_ERR_IO naming the call, this rank and MPI's message. */
mp_status mp_dist_mpi_error(int rc, const char *what);
/* Wait for req: MP_OK when it completes; past mp_dist_timeout() seconds the
 * rank prints one line naming `what` and aborts the job (MPI_Abort). */
mp_status mp_dist_wait(MPI_Request *req, const char *what);

#endif
