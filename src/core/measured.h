/* measured.h - a measured choice among kernels that give the same bits:
 * for an operation with versions on several paths (scalar, AVX-512, ...)
 * that tests prove bit-identical, time each once per process on first use,
 * keep the faster, and, once a second round of timing makes every choice
 * again, cache the rates per CPU model in a small file under the user's
 * cache directory (the directory and MP_DISPATCH_CACHE as for
 * the GEMM choice, gemm_dispatch.c). A file that is not exactly what this
 * version would write is ignored, measured again and replaced. A forced
 * path (MP_ISA, mp_isa_set) times nothing: the callers use it. Users:
 * convert_dispatch.c (conversions), optim/update_dispatch.c (optimizer
 * updates). Since the bits are the same, the choice changes only speed. */
#ifndef MP_MEASURED_H
#define MP_MEASURED_H

#include <stdatomic.h>
#include <stdio.h>

#include "core/internal.h"

enum { MP_MEASURED_MAX = 3, MP_MEASURED_MAX_OPS = 8 };

/* One operation: its candidates (distinct kernels, in order of preference:
 * the feature-flag choice first), their rates and the choice. */
typedef struct {
    const char *name; /* "adam", "f32->bf16": one word, the cache's label */
    int n;
    mp_isa isa[MP_MEASURED_MAX];
    double rate[MP_MEASURED_MAX]; /* million elements per second, one thread */
    int chosen;
} mp_measured_op;

/* A group of operations decided together (one cache file), filled in by
 * its spec's fill(). */
typedef struct {
    const char *file; /* the cache file's name part: "convert", "update" */
    /* Raised when a candidate kernel changes: rates cached for the kernels
     * of another revision are timed again (the file is not what this one
     * would write). */
    int revision;
    int nops;
    mp_measured_op op[MP_MEASURED_MAX_OPS];
    mp_dispatch_source source;
    char path[512];
    char note[160];
    double elements; /* per timed run */
} mp_measured_group;

/* fill() sets the group's ops, their candidates and elements; time(op,
 * isa) runs op's kernel of path isa once on the timing data setup() made
 * and returns its seconds (negative: failed). The timing calls kernels
 * directly, never mp_convert: a group's first use must not need itself. */
typedef struct {
    void (*fill)(mp_measured_group *g);
    bool (*setup)(void);    /* the timing data; false: out of memory */
    void (*teardown)(void); /* frees it */
    double (*time)(int op, mp_isa isa);
} mp_measured_spec;

/* One operation's candidates, for a fill(): the feature-flag path first,
 * then the other supported paths from the most specialised down, each
 * only where same(o, a, b) says its kernel differs from those before it;
 * no choice yet, no rates. */
void mp_measured_fill_op(mp_measured_op *op, const char *name, int o,
                         bool (*same)(int o, mp_isa a, mp_isa b));

/* The group, decided on the first call (thread-safe: others wait), or NULL
 * when a path is forced (then nothing is timed). */
const mp_measured_group *mp_measured_get(mp_measured_group *g, atomic_int *state,
                                         const mp_measured_spec *spec);
/* Forget the decision (tests): the next get decides again. */
void mp_measured_reset(atomic_int *state);
/* The group's lines for mixprec info. */
void mp_measured_print(FILE *out, const mp_measured_group *g, const char *what);

#endif
