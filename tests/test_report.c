/* test_report.c - `mixprec train --run-dir --diagnostics` and `mixprec
 * report` end to end on small generated CSV data: the run directory's files,
 * a page with an <svg> per chart, axis labels and legends and nothing
 * fetched, and damaged runs (a malformed middle line, a truncated last line,
 * no history, an empty log; together and each alone) giving a page with
 * notes and exit status 1.
 * The CLI under test is $MP_CLI (tests/run.sh sets it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
    if (test_scratch_dir(dir, sizeof dir, "mp_report")) return -1;
    char p[128];
    snprintf(p, sizeof p, "%s/train.csv", dir);
    FILE *fp = fopen(p, "w");
    if (!fp) return -1;
    fprintf(fp, "a,b,c,d,label\n");
    test_rng r = {2};
    for (int i = 0; i < 240; i++) {
        int c = (int)(test_rng_u32(&r) % 3);
        for (int j = 0; j < 4; j++)
            fprintf(fp, "%.4f,", (j == c ? 1.5 : 0.0) + test_rng_uniform(&r, -0.5, 0.5));
        fprintf(fp, "%d\n", c);
    }
    fclose(fp);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return test_remove_tree(dir);
}

/* args with every %s the scratch directory; output to dir/out.txt */
static int run(const char *args)
{
    char a[1024], cmd[1400];
    snprintf(a, sizeof a, args, dir, dir, dir, dir, dir, dir);
    snprintf(cmd, sizeof cmd, "%s %s > %s/out.txt 2>&1", cli, a, dir);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *name)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "r");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = 0;
    fclose(f);
    return buf;
}

static int count(const char *hay, const char *needle)
{
    int k = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) k++;
    return k;
}

/* Each needle occurs in text exactly n times. */
typedef struct {
    const char *needle;
    int n;
} want_count;

static void expect_counts(const char *text, const want_count *e, int ne)
{
    for (int i = 0; i < ne; i++)
        if (count(text, e[i].needle) != e[i].n)
            fail_msg("'%s' %d times, want %d", e[i].needle, count(text, e[i].needle), e[i].n);
}

static void train_mlp(const char *name, const char *policy, const char *hidden)
{
    char args[512];
    snprintf(args, sizeof args,
             "train --data %%s/train.csv --hidden %s --policy %s --epochs 2 --batch-size 32 "
             "--validation-split 0.2 --quiet --run-dir %%s/%s --diagnostics 2",
             hidden, policy, name);
    assert_int_equal(run(args), 0);
}

static void train(const char *name, const char *policy) { train_mlp(name, policy, "16"); }

static void test_run_dir_files(void **state)
{
    (void)state;
    train("f16", "mixed_float16");
    const char *files[] = {"f16/config.json", "f16/plan.json", "f16/history.csv",
                           "f16/diagnostics.jsonl"};
    for (int i = 0; i < 4; i++) {
        char *s = slurp(files[i]);
        assert_non_null(s);
        assert_true(strlen(s) > 10);
        free(s);
    }
    char *log = slurp("f16/diagnostics.jsonl");
    /* 192 training rows, batch 32: 6 steps per epoch; steps 1 2 4 ... 12 */
    assert_int_equal(count(log, "\"type\":\"step\""), 7);
    assert_int_equal(count(log, "\"type\":\"epoch\""), 2);
    assert_true(strstr(log, "\"underflow_frac\"") != NULL);
    free(log);
    assert_int_equal(run("train --data %s/train.csv --diagnostics 5 --quiet"), 2);
    assert_int_equal(run("train --data %s/train.csv --run-dir %s/x --diagnostics 0 --quiet"), 2);
}

static void test_report_page(void **state)
{
    (void)state;
    train("p16", "mixed_float16");
    train("pbf16", "mixed_bfloat16");
    assert_int_equal(run("report %s/p16 %s/pbf16 -o %s/report.html"), 0);
    char *html = slurp("report.html");
    assert_non_null(html);
    /* loss, accuracy, loss scale, per run 2 heatmaps and 2 weight charts,
     * memory, time; a line per weight (2 Dense layers: 4) in each run's two
     * weight charts */
    const want_count e[] = {{"<svg", 13},
                            {"</svg>", 13},
                            {"data-chart=\"line\"", 8},
                            {"data-chart=\"heatmap\"", 4},
                            {"class=\"xlabel\"", 13},
                            {"class=\"ylabel\"", 13},
                            {">dense.kernel</text>", 4},
                            {">dense_1.bias</text>", 4},
                            {"p16 (mixed_float16): compute copy against float32 master", 2},
                            {"pbf16 (mixed_bfloat16): update-to-weight ratio", 2}};
    expect_counts(html, e, 10);
    assert_true(strstr(html, "relative error ‖w_copy − w‖ / ‖w‖") != NULL);
    assert_true(strstr(html, "‖Δw‖ / ‖w‖ per step (ratio)") != NULL);
    assert_true(strstr(html, "training step") != NULL);
    assert_true(strstr(html, "loss (cross-entropy, nats)") != NULL);
    assert_true(strstr(html, "memory (MiB)") != NULL);
    assert_true(strstr(html, "time per step (ms)") != NULL);
    /* legends name the runs */
    assert_true(strstr(html, "class=\"legend\"") != NULL);
    assert_true(strstr(html, "p16 (mixed_float16) train") != NULL);
    assert_true(strstr(html, "pbf16 (mixed_bfloat16) validation") != NULL);
    /* self-contained */
    assert_null(strstr(html, "<script"));
    assert_null(strstr(html, "http:"));
    assert_null(strstr(html, "https:"));
    assert_null(strstr(html, "src="));
    assert_null(strstr(html, "class=\"note\">Note"));
    /* the precision plan */
    assert_true(strstr(html, "<td>dense</td><td>Dense</td><td>mixed_float16</td>") != NULL);
    free(html);
}

static void write_file(const char *name, const char *text)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A killed run (last line cut), a line damaged in the middle, no history,
 * an empty log: a page for what is readable, notes, exit status 1. */
static void test_damaged_runs(void **state)
{
    (void)state;
    train("dmg", "mixed_float16");
    char *log = slurp("dmg/diagnostics.jsonl");
    assert_non_null(log);
    /* line 3 broken, the last line cut in half */
    char *l2 = strchr(strchr(log, '\n') + 1, '\n') + 1;
    l2[5] = '#';
    size_t len = strlen(log);
    char *last = log + len - 2;
    while (*last != '\n') last--;
    last[(log + len - last) / 2] = 0;
    write_file("dmg/diagnostics.jsonl", log);
    free(log);
    char p[256];
    snprintf(p, sizeof p, "%s/dmg/history.csv", dir);
    assert_int_equal(unlink(p), 0);
    snprintf(p, sizeof p, "%s/empty", dir);
    assert_int_equal(mkdir(p, 0777), 0);
    write_file("empty/diagnostics.jsonl", "");
    assert_int_equal(run("report %s/dmg %s/empty -o %s/bad.html"), 1);
    char *out = slurp("out.txt");
    assert_true(strstr(out, "diagnostics.jsonl line 3: malformed") != NULL);
    assert_true(strstr(out, "truncated last line") != NULL);
    assert_true(strstr(out, "no history.csv") != NULL);
    assert_true(strstr(out, "diagnostics.jsonl is empty") != NULL);
    free(out);
    char *html = slurp("bad.html");
    assert_non_null(html);
    /* per-layer charts of the damaged run only */
    assert_int_equal(count(html, "<svg"), 9);
    assert_true(strstr(html, "line 3: malformed") != NULL);
    assert_true(strstr(html, "diagnostics.jsonl is empty") != NULL);
    /* the readable lines still gave curves: the epoch records stand in for the history */
    assert_true(strstr(html, "dmg (mixed_float16) validation") != NULL);
    free(html);
    assert_int_equal(run("report -o %s/x.html"), 2);
    assert_int_equal(run("report %s/dmg"), 2);
}

/* Steps the loss scaler skips (a static scale of 1e30 overflows every
 * float16 gradient): the optimizer never runs, so the weights' figures come
 * from a pass after the step and every update is exactly 0. */
static void test_skipped_steps(void **state)
{
    (void)state;
    assert_int_equal(run("train --data %s/train.csv --hidden 16 --policy mixed_float16 "
                         "--loss-scale static:1e30 --epochs 1 --batch-size 48 --quiet "
                         "--run-dir %s/skip --diagnostics 1"),
                     0);
    char *log = slurp("skip/diagnostics.jsonl");
    assert_non_null(log);
    /* 240 rows, batch 48: 5 steps, all skipped; 4 weights each */
    const want_count e[] = {{"\"type\":\"step\"", 5},    {"\"skipped\":true", 5},
                            {"\"kind\":\"weight\"", 20}, {"\"kind\":\"gradient\"", 20},
                            {"\"kind\":\"update\"", 20}, {"\"ratio\":0.0}", 20}};
    expect_counts(log, e, 6);
    free(log);
}

/* More weights than a line chart's legend holds (5 Dense layers: 10): the
 * copy error and update ratio become heatmaps, a row per weight. */
static void test_many_weights(void **state)
{
    (void)state;
    train_mlp("deep", "mixed_bfloat16", "8,8,8,8");
    assert_int_equal(run("report %s/deep -o %s/deep.html"), 0);
    char *html = slurp("deep.html");
    assert_non_null(html);
    assert_int_equal(count(html, "data-chart=\"heatmap\""), 4);
    assert_int_equal(count(html, "data-chart=\"line\""), 4); /* loss, accuracy, scale, time */
    /* each weight a row (right-aligned text before its cells) of both charts */
    assert_int_equal(count(html, ">dense_4.kernel</text>"), 2);
    assert_int_equal(count(html, ">dense.bias</text>"), 2);
    free(html);
}

/* The page's count of a run's step and event records ("N records") */
static int page_records(const char *html, const char *run)
{
    char key[128];
    snprintf(key, sizeof key, "%s/%s (compute dtype", dir, run);
    const char *p = strstr(html, key);
    if (!p) return -1;
    p = strstr(p, "epochs, ");
    int n = -1;
    return p && sscanf(p, "epochs, %d records", &n) == 1 ? n : -1;
}

/* Each damage alone, on copies of one whole run: the note names it (the
 * line number where there is one), the page keeps what is readable, and
 * the exit status is 1 for a partial report, 0 for the whole one. */
static void test_each_damage_alone(void **state)
{
    (void)state;
    train("whole", "mixed_float16");
    assert_int_equal(run("report %s/whole -o %s/whole.html"), 0);
    char *html = slurp("whole.html");
    char *log = slurp("whole/diagnostics.jsonl");
    assert_non_null(html);
    assert_non_null(log);
    /* every step and event line is a record of the page */
    int records = count(log, "{\"type\":\"step\"") + count(log, "{\"type\":\"event\"");
    int lines = count(log, "\n");
    assert_int_equal(page_records(html, "whole"), records);
    free(html);
    const char *names[] = {"nohist", "emptylog", "cut", "bad"};
    for (int i = 0; i < 4; i++) {
        char a[160];
        snprintf(a, sizeof a, "cp -r %%s/whole %%s/%s", names[i]);
        char cmd[512];
        snprintf(cmd, sizeof cmd, a, dir, dir);
        assert_int_equal(system(cmd), 0);
    }
    char p[256];
    snprintf(p, sizeof p, "%s/nohist/history.csv", dir);
    assert_int_equal(unlink(p), 0);
    write_file("emptylog/diagnostics.jsonl", "");
    /* the last line (an epoch record) cut short, without its newline */
    char *cut = strdup(log);
    size_t len = strlen(cut);
    char *last = cut + len - 2;
    while (*last != '\n') last--;
    last[20] = 0;
    write_file("cut/diagnostics.jsonl", cut);
    free(cut);
    /* the second step record (line 3) broken in the middle */
    char *bad = strdup(log);
    char *l3 = strchr(strchr(bad, '\n') + 1, '\n') + 1;
    assert_true(!strncmp(l3, "{\"type\":\"step\"", strlen("{\"type\":\"step\"")));
    l3[40] = ']';
    write_file("bad/diagnostics.jsonl", bad);
    free(bad);
    free(log);
    char cut_note[64];
    struct {
        const char *name, *note;
        int records; /* -1: not checked */
    } cases[] = {
        {"nohist", "no history.csv", records},
        {"emptylog", "diagnostics.jsonl is empty", 0},
        {"cut", cut_note, records},
        {"bad", "diagnostics.jsonl line 3: malformed", records - 1},
    };
    for (int i = 0; i < 4; i++) {
        if (i == 2)
            snprintf(cut_note, sizeof cut_note, "diagnostics.jsonl line %d: truncated last line",
                     lines);
        char a[160];
        snprintf(a, sizeof a, "report %%s/%s -o %%s/%s.html", cases[i].name, cases[i].name);
        assert_int_equal(run(a), 1);
        char *out = slurp("out.txt");
        assert_non_null(out);
        assert_non_null(strstr(out, cases[i].note));
        free(out);
        char page_name[64];
        snprintf(page_name, sizeof page_name, "%s.html", cases[i].name);
        html = slurp(page_name);
        assert_non_null(html);
        assert_non_null(strstr(html, cases[i].note));
        assert_int_equal(page_records(html, cases[i].name), cases[i].records);
        /* the loss curves still come out: from the history or the epoch records */
        char series[96];
        snprintf(series, sizeof series, "%s (mixed_float16) validation", cases[i].name);
        assert_non_null(strstr(html, series));
        free(html);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_dir_files), cmocka_unit_test(test_report_page),
        cmocka_unit_test(test_many_weights),  cmocka_unit_test(test_skipped_steps),
        cmocka_unit_test(test_damaged_runs),  cmocka_unit_test(test_each_damage_alone),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
