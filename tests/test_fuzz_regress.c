/* test_fuzz_regress.c - the checkpoint fuzz target (fuzz/fuzz_checkpoint.c)
 * in the normal test suite: every seed in tests/fuzz/corpus/ and every
 * regression input in tests/fuzz/regress/ goes through the loader, which
 * must return (never crash; under SANITIZE=1 never leak or read out of
 * bounds). Names carry the expected outcome: a valid-* file must load
 * completely, a bad-* file must be refused; other names only have to come
 * back (edge-*: hand-made corner cases either outcome is fine for;
 * found-*: inputs the fuzzer found that reach deep paths, such as odd
 * architectures that load and run a forward pass). Truncations and byte flips of the valid
 * seeds go through too. Paths are relative to the repository root, the
 * directory the tests run in. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#include "../fuzz/fuzz_checkpoint.c"

#define CORPUS_DIR "tests/fuzz/corpus"
#define REGRESS_DIR "tests/fuzz/regress"

/* fuzz/make_corpus.c writes 31 valid-* seeds and 174 bad-* inputs, next to
 * the 22 and 167 *-v1-* files the version-1 release wrote (kept: they must
 * still load, or be refused, as they were); a file lost from the tree fails
 * the test. */
#define MIN_VALID_SEEDS 55
#define MIN_BAD_INPUTS 341

typedef struct {
    char **names;
    int n;
} file_list;

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The regular files of a directory, sorted by name. */
static file_list list_dir(const char *dir)
{
    file_list l = {NULL, 0};
    DIR *d = opendir(dir);
    if (!d) fail_msg("cannot open %s (run the test from the repository root)", dir);
    struct dirent *e;
    int cap = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (l.n == cap) {
            cap = cap ? 2 * cap : 64;
            l.names = realloc(l.names, (size_t)cap * sizeof *l.names);
            assert_non_null(l.names);
        }
        l.names[l.n] = strdup(e->d_name);
        assert_non_null(l.names[l.n]);
        l.n++;
    }
    closedir(d);
    if (l.n) qsort(l.names, (size_t)l.n, sizeof *l.names, by_name);
    return l;
}

static void free_list(file_list *l)
{
    for (int i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
}

static bool has_prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

static const char *outcome_name(int r)
{
    return r == MP_FUZZ_LOADED ? "loaded" : r == MP_FUZZ_PARSED ? "parsed, not loaded" : "refused";
}

/* Run every file of dir; count the valid-* and bad-* ones. */
static void run_dir(const char *dir, int *valid, int *bad)
{
    file_list l = list_dir(dir);
    *valid = *bad = 0;
    for (int i = 0; i < l.n; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, l.names[i]);
        size_t len;
        uint8_t *data = test_read_file(path, &len);
        int r = mp_fuzz_checkpoint_one(data, len);
        free(data);
        if (has_prefix(l.names[i], "valid-")) {
            if (r != MP_FUZZ_LOADED)
                fail_msg("%s: %s, expected to load (%s)", path, outcome_name(r), mp_last_error());
            (*valid)++;
        } else if (has_prefix(l.names[i], "bad-")) {
            if (r == MP_FUZZ_LOADED) fail_msg("%s: loaded, expected to be refused", path);
            (*bad)++;
        }
    }
    free_list(&l);
}

static void test_seed_corpus(void **state)
{
    (void)state;
    int valid, bad;
    run_dir(CORPUS_DIR, &valid, &bad);
    if (valid < MIN_VALID_SEEDS)
        fail_msg("%s holds %d valid-* seeds, expected at least %d", CORPUS_DIR, valid,
                 MIN_VALID_SEEDS);
}

static void test_regressions(void **state)
{
    (void)state;
    int valid, bad;
    run_dir(REGRESS_DIR, &valid, &bad);
    if (bad < MIN_BAD_INPUTS)
        fail_msg("%s holds %d bad-* inputs, expected at least %d", REGRESS_DIR, bad,
                 MIN_BAD_INPUTS);
}

/* Every valid seed cut short, and with bytes flipped: the loader comes back
 * each time, and a cut file is never accepted. */
static void test_seed_mutations(void **state)
{
    (void)state;
    file_list l = list_dir(CORPUS_DIR);
    test_rng rng = {2024};
    int loaded = 0, runs = 0;
    for (int i = 0; i < l.n; i++) {
        if (!has_prefix(l.names[i], "valid-")) continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", CORPUS_DIR, l.names[i]);
        size_t len;
        uint8_t *data = test_read_file(path, &len);
        /* cuts: a few dozen lengths spread over the file */
        for (size_t cut = 0; cut < len; cut += len / 37 + 1) {
            if (mp_fuzz_checkpoint_one(data, cut) != MP_FUZZ_REFUSED)
                fail_msg("%s cut to %zu bytes was accepted", path, cut);
            runs++;
        }
        /* flips: one to three random bytes changed at a time */
        uint8_t *copy = malloc(len);
        assert_non_null(copy);
        for (int k = 0; k < 40; k++) {
            memcpy(copy, data, len);
            int nflip = 1 + (int)(test_rng_u32(&rng) % 3);
            for (int j = 0; j < nflip; j++)
                copy[test_rng_u32(&rng) % len] ^= (uint8_t)(1u + test_rng_u32(&rng) % 255);
            loaded += mp_fuzz_checkpoint_one(copy, len) == MP_FUZZ_LOADED;
            runs++;
        }
        free(copy);
        free(data);
    }
    free_list(&l);
    assert_true(runs > 0);
    /* some flips land in weights or padding and still load: the loader is
     * not refusing everything */
    assert_true(loaded > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_corpus),
        cmocka_unit_test(test_regressions),
        cmocka_unit_test(test_seed_mutations),
    };
    return cmocka_run_group_tests_name("fuzz_regress", tests, NULL, NULL);
}
