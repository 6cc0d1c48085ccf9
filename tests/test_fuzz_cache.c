/* test_fuzz_cache.c - the kernel-choice cache fuzz target (fuzz/fuzz_cache.c): cache
 * file texts from tests/fuzz/cache/ in the normal test suite, with
 * the outcomes their names promise (tests/fuzz_seeds.h). A file lost from
 * the tree fails the test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#include "../fuzz/fuzz_cache.c"

#include "fuzz_seeds.h"

FUZZ_SEEDS_TEST_MAIN("fuzz_cache", "tests/fuzz/cache", mp_fuzz_cache_one, 3, 15)
