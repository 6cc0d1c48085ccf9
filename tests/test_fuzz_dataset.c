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

#define SEED_DIR "tests/fuzz/dataset"
#define MIN_VALID 16
#define MIN_BAD 40

static void test_seeds(void **state)
{
    (void)state;
    int valid, bad;
    seeds_run_dir(SEED_DIR, mp_fuzz_dataset_one, &valid, &bad);
    if (valid < MIN_VALID || bad < MIN_BAD)
        fail_msg("%s holds %d valid-* and %d bad-* files, expected at least %d and %d", SEED_DIR,
                 valid, bad, MIN_VALID, MIN_BAD);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seeds),
    };
    return cmocka_run_group_tests_name("fuzz_dataset", tests, NULL, NULL);
}
