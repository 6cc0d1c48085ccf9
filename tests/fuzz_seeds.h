/* fuzz_seeds.h - what the regression tests of the fuzz targets for path
 * loaders share (test_fuzz_dataset.c, test_fuzz_cache.c,
 * test_fuzz_report.c): every file of a seed directory through the target's
 * entry point, sorted by name, with the outcome its name promises:
 *   valid-*   must be accepted (FUZZ_LOADED),
 *   bad-*     must be refused (FUZZ_REFUSED),
 *   other     (found-*: inputs the fuzzer found, edge-*: corner cases)
 *             only have to come back.
 * The entry point aborts on a broken invariant, and under SANITIZE=1 a
 * leak or a read out of bounds fails the program. Paths are relative to
 * the repository root, where the tests run. Include after common.h and
 * the fuzz target. */
#ifndef MP_TEST_FUZZ_SEEDS_H
#define MP_TEST_FUZZ_SEEDS_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*fuzz_entry)(const uint8_t *data, size_t size);

static int seeds_by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Run every file of dir through entry; *valid and *bad count the files of
 * those names. Each file also goes through cut short at a few lengths,
 * where only coming back counts. */
static void seeds_run_dir(const char *dir, fuzz_entry entry, int *valid, int *bad)
{
    DIR *d = opendir(dir);
    if (!d) fail_msg("cannot open %s (run the test from the repository root)", dir);
    char **names = NULL;
    int n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            names = realloc(names, (size_t)cap * sizeof *names);
            assert_non_null(names);
        }
        names[n] = strdup(e->d_name);
        assert_non_null(names[n]);
        n++;
    }
    closedir(d);
    if (n) qsort(names, (size_t)n, sizeof *names, seeds_by_name);
    *valid = *bad = 0;
    for (int i = 0; i < n; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        size_t len;
        uint8_t *data = test_read_file(path, &len);
        int r = entry(data, len);
        if (!strncmp(names[i], "valid-", 6)) {
            if (r != FUZZ_LOADED)
                fail_msg("%s: refused (%s), expected to load", path, mp_last_error());
            (*valid)++;
        } else if (!strncmp(names[i], "bad-", 4)) {
            if (r != FUZZ_REFUSED) fail_msg("%s: accepted, expected to be refused", path);
            (*bad)++;
        }
        for (size_t cut = len / 3; cut < len; cut += len / 3 + 1) entry(data, cut);
        free(data);
        free(names[i]);
    }
    free(names);
}

/* The test program of a target: its seed directory dir through entry,
 * with at least min_valid valid-* and min_bad bad-* files in it (a file
 * lost from the tree fails the test). */
#define FUZZ_SEEDS_TEST_MAIN(group, dir, entry, min_valid, min_bad)                                \
    static void test_seeds(void **state)                                                           \
    {                                                                                              \
        (void)state;                                                                               \
        int valid, bad;                                                                            \
        seeds_run_dir(dir, entry, &valid, &bad);                                                   \
        if (valid < (min_valid) || bad < (min_bad))                                                \
            fail_msg("%s holds %d valid-* and %d bad-* files, expected at least %d and %d", dir,   \
                     valid, bad, min_valid, min_bad);                                              \
    }                                                                                              \
    int main(void)                                                                                 \
    {                                                                                              \
        const struct CMUnitTest tests[] = {cmocka_unit_test(test_seeds)};                          \
        return cmocka_run_group_tests_name(group, tests, NULL, NULL);                              \
    }

#endif
