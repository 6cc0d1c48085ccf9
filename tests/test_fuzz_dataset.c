/* test_fuzz_dataset.c - the dataset fuzz target (fuzz/fuzz_dataset.c): CSV, IDX (plain and gzip)
 * and text inputs from tests/fuzz/dataset/ in the normal test suite, with
 * the outcomes their names promise (tests/fuzz_seeds.h). A file lost from
 * the tree fails the test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#include "../fuzz/fuzz_dataset.c"

#include "fuzz_seeds.h"

FUZZ_SEEDS_TEST_MAIN("fuzz_dataset", "tests/fuzz/dataset", mp_fuzz_dataset_one, 16, 40)
