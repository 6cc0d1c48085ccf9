/* fuzz_report.c - the run-directory reader of `mixprec report` under a
 * fuzzer, and the page made from what it read. One input is a run
 * directory's three files, in this order, separated by the byte 0xFF:
 *   history.csv        (Keras-style per-epoch figures)
 *   diagnostics.jsonl  (one JSON record per line: run, step, event, epoch)
 *   plan.json          (the precision plan)
 * A file whose section is missing (fewer separators) or is the one byte
 * 0xFE is not there. The files go into a scratch directory (fuzz_files.h)
 * and through what `mixprec report DIR -o OUT` runs:
 *   report_run_read       (src/cli/report_read.c) never fails: what it
 *                         cannot read becomes notes (and the run partial);
 *                         its counts, strings and step records must agree;
 *   mp_cli_report_write   (src/cli/report_cmd.c, report_svg.c,
 *                         report_layers.c) the whole page, of the run once
 *                         (an input of even length) or twice (odd): exit
 *                         status 0 or 1 (1 exactly when the run is partial)
 *                         and a whole page written.
 * Any input must come back without a crash, a leak or undefined behaviour;
 * a broken invariant aborts, so that the fuzzer reports it. The page goes
 * to the scratch directory; the reader's notes go nowhere (the page's own
 * run prints them on stderr: the libFuzzer run closes it, mk/fuzz.mk).
 *
 * Built two ways: with -DMP_LIBFUZZER as a libFuzzer target (make fuzz
 * FUZZ_TARGET=report, mk/fuzz.mk; it links the report's objects of the
 * CLI), and #included by tests/test_fuzz_report.c, which runs
 * tests/fuzz/report/ in make test. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/report.h"
#include "mixprec.h"

#define FUZZ_NAME "fuzz_report"
#include "fuzz_files.h"

/* Run one input; FUZZ_LOADED when every file was read in full (the run is
 * not partial), else FUZZ_REFUSED. */
int mp_fuzz_report_one(const uint8_t *data, size_t size);

static const char *const fuzz_report_files[3] = {"history.csv", "diagnostics.jsonl", "plan.json"};

/* What the reader hands the page. */
static void fuzz_check_run(const report_run *r, const char *dir)
{
    FUZZ_CHECK(r->dir == dir && json_is_array(r->records));
    FUZZ_CHECK(r->nnotes >= 0 && r->nnotes <= 16 && r->partial == (r->nnotes > 0));
    for (int i = 0; i < r->nnotes; i++)
        FUZZ_CHECK(r->notes[i][0] && memchr(r->notes[i], '\0', sizeof r->notes[i]));
    FUZZ_CHECK(memchr(r->policy, '\0', sizeof r->policy) && r->policy[0]);
    FUZZ_CHECK(memchr(r->compute, '\0', sizeof r->compute) && r->compute[0]);
    FUZZ_CHECK(memchr(r->label, '\0', sizeof r->label) && r->label[0]);
    FUZZ_CHECK(r->nepochs >= 0 && (r->nepochs == 0 || r->epochs));
    FUZZ_CHECK(r->nsteps >= 0 && (r->nsteps == 0 || r->steps));
    /* every step's layers live in a record the run keeps */
    for (int i = 0; i < r->nsteps; i++) {
        const report_step *s = &r->steps[i];
        FUZZ_CHECK(s->diag || s->layers == NULL);
        if (s->layers) FUZZ_CHECK(s->layers->refcount >= 1);
    }
    FUZZ_CHECK(r->plan == NULL || r->plan->refcount >= 1);
}

/* The page at path is whole, and what the run's files said reached it as
 * text: the page has no scripts, and a name like "<script>" in a run's
 * files must arrive escaped (regress: edge-compute-dtype-markup). */
static void fuzz_check_page(const char *path)
{
    FILE *f = fopen(path, "rb");
    FUZZ_CHECK(f != NULL);
    int c, m = 0;
    static const char tag[] = "<script";
    while ((c = fgetc(f)) != EOF && tag[m]) m = c == tag[m] ? m + 1 : c == tag[0];
    FUZZ_CHECK(tag[m] != '\0'); /* no "<script" anywhere */
    FUZZ_CHECK(fseek(f, 0, SEEK_END) == 0);
    long n = ftell(f);
    static const char tail[] = "</body></html>\n";
    char end[sizeof tail] = "";
    FUZZ_CHECK(n >= (long)sizeof tail - 1);
    FUZZ_CHECK(fseek(f, n - (long)(sizeof tail - 1), SEEK_SET) == 0);
    FUZZ_CHECK(fread(end, 1, sizeof tail - 1, f) == sizeof tail - 1);
    fclose(f);
    FUZZ_CHECK(!memcmp(end, tail, sizeof tail - 1));
}

int mp_fuzz_report_one(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_dir();
    /* the sections, and the files they make */
    const uint8_t *p = data, *end = data + size;
    for (int k = 0; k < 3; k++) {
        char path[128];
        fuzz_path(path, sizeof path, fuzz_report_files[k]);
        const uint8_t *sep = p ? memchr(p, 0xFF, (size_t)(end - p)) : NULL;
        const uint8_t *stop = sep ? sep : end;
        size_t n = p ? (size_t)(stop - p) : 0;
        if (!p || (n == 1 && p[0] == 0xFE))
            remove(path);
        else
            fuzz_write(path, p, n, false);
        p = p && sep ? sep + 1 : NULL;
    }

    report_run r;
    report_run_read(&r, dir, NULL);
    fuzz_check_run(&r, dir);
    bool partial = r.partial;
    report_run_free(&r);

    char out[128];
    fuzz_path(out, sizeof out, "report.html");
    const char *dirs[2] = {dir, dir};
    int rc = mp_cli_report_write(dirs, 1 + (int)(size & 1), out);
    FUZZ_CHECK(rc == (partial ? 1 : 0));
    fuzz_check_page(out);
    return partial ? FUZZ_REFUSED : FUZZ_LOADED;
}

#ifdef MP_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mp_fuzz_report_one(data, size);
    return 0;
}
#endif
