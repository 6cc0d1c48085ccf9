/* common.h - helpers shared by the cmocka test programs. */
#ifndef MP_TEST_COMMON_H
#define MP_TEST_COMMON_H

#include <setjmp.h> /* cmocka needs these before its header */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "mixprec.h"

/* Small deterministic generator for test data (xoshiro-style). */
typedef struct {
    uint64_t s;
} test_rng;
uint64_t test_rng_next(test_rng *r);
/* Uniform in [lo, hi). */
double test_rng_uniform(test_rng *r, double lo, double hi);
uint32_t test_rng_u32(test_rng *r);

static inline uint32_t f32_bits(float x)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = x};
    return v.u;
}
static inline float bits_f32(uint32_t u)
{
    union {
        uint32_t u;
        float f;
    } v = {.u = u};
    return v.f;
}

/* A fresh scratch directory /tmp/<prefix>_XXXXXX, written into buf;
 * 0 on success. */
int test_scratch_dir(char *buf, size_t len, const char *prefix);
/* Remove a scratch directory and all it holds; 0 on success. */
int test_remove_tree(const char *dir);

/* The ISA paths this CPU can run, for looping tests over every path. */
int test_isas(mp_isa out[MP_ISA_COUNT]);

#endif
