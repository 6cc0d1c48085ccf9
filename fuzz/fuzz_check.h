/* fuzz_check.h - what every fuzz target checks its inputs' outcomes with:
 * an invariant that must hold (a broken one aborts, so the fuzzer reports
 * it) and the form a refusal must take. The including target defines
 * FUZZ_NAME, which names it in the message. */
#ifndef MP_FUZZ_CHECK_H
#define MP_FUZZ_CHECK_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "mixprec.h"

#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s: invariant failed at %s:%d: %s (last error: %s)\n", FUZZ_NAME,     \
                    __FILE__, __LINE__, #cond, mp_last_error());                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* A failure must be one of the error statuses, with a message. */
static inline bool fuzz_refused_well(mp_status s)
{
    return s >= MP_ERR_INVALID && s <= MP_ERR_UNSUPPORTED && mp_last_error()[0] != '\0';
}

#endif
