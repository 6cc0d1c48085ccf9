/* test_cli.c - the mixprec command line end to end on small generated CSV
 * data: train (with --save and --log), evaluate, predict, --init-from, and
 * bad flags, values and files giving one clear line and a non-zero exit.
 * The CLI under test is $MP_CLI (set by tests/run.sh to the build's binary,
 * so the sanitizer run checks it too). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

static char dir[64];
static const char *cli;

static int setup(void **state)
{
    (void)state;
    cli = getenv("MP_CLI");
    if (!cli) cli = "build/mixprec";
    snprintf(dir, sizeof dir, "/tmp/mp_cli_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    /* two separable classes in 4 features, train and test files */
    const char *names[2] = {"train.csv", "test.csv"};
    test_rng r = {1};
    for (int f = 0; f < 2; f++) {
        char p[128];
        snprintf(p, sizeof p, "%s/%s", dir, names[f]);
        FILE *fp = fopen(p, "w");
        fprintf(fp, "a,b,c,d,label\n");
        for (int i = 0; i < (f ? 60 : 200); i++) {
            int c = (int)(test_rng_u32(&r) % 2);
            for (int j = 0; j < 4; j++)
                fprintf(fp, "%.4f,", (c ? 1.0 : -1.0) + test_rng_uniform(&r, -0.5, 0.5));
            fprintf(fp, "%d\n", c);
        }
        fclose(fp);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Run the CLI with args (a format using %1$s for the directory); output to
 * dir/out.txt. Returns the exit status. */
static int run(const char *args)
{
    char a[1024], cmd[1400];
    snprintf(a, sizeof a, args, dir, dir, dir, dir, dir);
    snprintf(cmd, sizeof cmd, "%s %s > %s/out.txt 2>&1", cli, a, dir);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *output(void)
{
    static char buf[16384];
    char p[128];
    snprintf(p, sizeof p, "%s/out.txt", dir);
    FILE *f = fopen(p, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = 0;
    if (f) fclose(f);
    return buf;
}

static void test_train_save_evaluate_predict(void **state)
{
    (void)state;
    assert_int_equal(
        run("train --data %s/train.csv --test-data %s/test.csv --hidden 16 --epochs 5 --batch-size "
            "32 "
            "--policy mixed_bfloat16 --lr 0.01 --save %s/m.safetensors --log %s/h.csv --quiet"),
        0);
    const char *o = output();
    assert_non_null(strstr(o, "test: loss"));
    assert_non_null(strstr(o, "policy mixed_bfloat16"));
    assert_int_equal(run("evaluate %s/m.safetensors --data %s/test.csv"), 0);
    o = output();
    assert_non_null(strstr(o, "60 samples: loss"));
    double acc = atof(strstr(o, "accuracy ") + 9);
    assert_true(acc >= 0.95); /* the classes are 2 apart with noise of half-width 0.5 */
    assert_int_equal(run("predict %s/m.safetensors --data %s/test.csv --output %s/p.csv"), 0);
    char p[128];
    snprintf(p, sizeof p, "%s/p.csv", dir);
    FILE *f = fopen(p, "r");
    char line[256];
    int lines = 0;
    while (fgets(line, sizeof line, f)) lines++;
    fclose(f);
    assert_int_equal(lines, 61);
    snprintf(p, sizeof p, "%s/h.csv", dir);
    f = fopen(p, "r");
    lines = 0;
    while (fgets(line, sizeof line, f)) lines++;
    fclose(f);
    assert_int_equal(lines, 6); /* header + 5 epochs */
    /* continue from the saved weights, in another policy */
    assert_int_equal(run("train --data %s/train.csv --hidden 16 --epochs 1 --init-from "
                         "%s/m.safetensors --policy float32 --quiet"),
                     0);
    /* a file from another architecture: refused with the reason */
    assert_int_equal(
        run("train --data %s/train.csv --hidden 8 --epochs 1 --init-from %s/m.safetensors --quiet"),
        1);
    assert_non_null(strstr(output(), "dense.kernel"));
}

static void test_bad_input(void **state)
{
    (void)state;
    assert_int_equal(run("train --bogus"), 2);
    assert_non_null(strstr(output(), "unknown option '--bogus'"));
    assert_int_equal(run("train --policy mixed_float8"), 2);
    assert_non_null(strstr(output(), "mixed_float8"));
    assert_int_equal(run("train --batch-size 0"), 2);
    assert_int_equal(run("train --validation-split 1.5"), 2);
    assert_int_equal(run("train --loss-scale sometimes"), 2);
    assert_int_equal(run("train --epochs"), 2);
    assert_non_null(strstr(output(), "needs a value"));
    assert_int_equal(run("train --data %s/missing.csv --quiet"), 1);
    assert_non_null(strstr(output(), "missing.csv"));
    char p[128];
    snprintf(p, sizeof p, "%s/nan.csv", dir);
    FILE *f = fopen(p, "w");
    fprintf(f, "1,2,0\n3,nan,1\n");
    fclose(f);
    assert_int_equal(run("train --data %s/nan.csv --quiet"), 1);
    assert_non_null(strstr(output(), "line 2"));
    assert_int_equal(run("evaluate %s/missing.safetensors --data %s/test.csv"), 1);
    assert_non_null(strstr(output(), "missing.safetensors"));
    assert_int_equal(run("evaluate"), 2);
    assert_int_equal(run("frobnicate"), 2);
    assert_non_null(strstr(output(), "unknown command"));
    assert_int_equal(run("--help"), 0);
    assert_non_null(strstr(output(), "train"));
    assert_int_equal(run("train --help"), 0);
    assert_non_null(strstr(output(), "--loss-scale"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_save_evaluate_predict),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests_name("cli", tests, setup, teardown);
}
