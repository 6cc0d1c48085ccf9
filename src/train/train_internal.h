/* train_internal.h - what checkpoint.c needs of the compiled state in
 * step.c, not part of the API. */
#ifndef MP_TRAIN_INTERNAL_H
#define MP_TRAIN_INTERNAL_H

#include "io/io_internal.h"

/* Restore the applied/skipped step counts of a compiled model. */
void mp_model_set_step_counts(mp_model *m, int64_t applied, int64_t skipped);

/* Checkpoints in a directory: ckpt-<steps>.safetensors, ascending steps. */
typedef struct {
    int64_t steps;
    char name[256];
} mp_checkpoint_entry;
/* The entries (malloc'd, free()); -1 if the directory cannot be read. */
int mp_checkpoint_list(const char *dir, mp_checkpoint_entry **out);
/* Delete all but the newest keep_last (0: keep all), and temporaries a
 * killed writer left behind. */
void mp_checkpoint_prune(const char *dir, int keep_last);

#endif
