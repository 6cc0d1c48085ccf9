/* test_fuzz_report.c - the run-directory fuzz target of `mixprec report` (fuzz/fuzz_report.c):
 * run directories from tests/fuzz/report/ in the normal test suite, with
 * the outcomes their names promise (tests/fuzz_seeds.h). A file lost from
 * the tree fails the test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#include "../fuzz/fuzz_report.c"

#include "fuzz_seeds.h"

FUZZ_SEEDS_TEST_MAIN("fuzz_report", "tests/fuzz/report", mp_fuzz_report_one, 3, 7)
