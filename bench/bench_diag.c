/* bench_diag.c - what `--diagnostics N` costs a training step, in one run:
 * the seed MLP 784 -> 4096 -> 4096 -> 10 (Adam) at batch 256 under
 * mixed_bfloat16 (--policy, --batch, --steps change it), stepped with no
 * diagnostics, with diagnostics every step, and with diagnostics every 100
 * steps (a window of 100 steps holding one diagnostic step, as a long run
 * has), the modes interleaved step by step. Prints medians, the diagnostic
 * step's parts (the step, whose update pass gathers the weights' and
 * gradients' figures, and the statistics and record after it) and the
 * overheads against the step without diagnostics; the target is
 * under 5% at every 100 steps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mixprec.h"
#include "bench_util.h"

#define WARMUP 3
#define WINDOW 100 /* steps at --diagnostics 100 (and without) */

typedef struct {
    double *step, *after, *total; /* ms per step */
    int n;
} step_times;

static void times_init(step_times *t, int n)
{
    t->n = n;
    t->step = calloc((size_t)n, sizeof(double));
    t->after = calloc((size_t)n, sizeof(double));
    t->total = calloc((size_t)n, sizeof(double));
    if (!t->step || !t->after || !t->total) {
        fprintf(stderr, "bench_diag: out of memory\n");
        exit(1);
    }
}

static void times_free(step_times *t)
{
    free(t->step);
    free(t->after);
    free(t->total);
}

static double mean(const double *v, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return s / n;
}

static void check(mp_status s)
{
    if (s) {
        fprintf(stderr, "bench_diag: %s\n", mp_last_error());
        exit(1);
    }
}

/* Step i of t; with d, numbered `number` for its cadence. */
static void one_step(mp_model *m, mp_diagnostics *d, int64_t number, const mp_tensor *x,
                     const int32_t *y, step_times *t, int i)
{
    mp_step_result r;
    double t0 = now();
    if (d) check(mp_diagnostics_before_step(d, m, number));
    check(mp_model_train_step(m, x, y, NULL, &r));
    double t2 = now();
    if (d) check(mp_diagnostics_after_step(d, m, &r, x->shape[0], 1));
    double t3 = now();
    t->step[i] = 1e3 * (t2 - t0);
    t->after[i] = 1e3 * (t3 - t2), t->total[i] = 1e3 * (t3 - t0);
}

int main(int argc, char **argv)
{
    const char *policy = "mixed_bfloat16";
    int64_t batch = 256;
    int reps = 10;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--policy"))
            policy = argv[i + 1];
        else if (!strcmp(argv[i], "--batch"))
            batch = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) /* diagnostic steps at --diagnostics 1 */
            reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_diag [--policy P] [--batch N] [--steps N]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > WINDOW || batch < 1) {
        fprintf(stderr, "bench_diag: --steps 1..%d, --batch 1 or more\n", WINDOW);
        return 2;
    }
    char cpu[512], dir[] = "/tmp/mp_bench_diag_XXXXXX";
    bench_cpu_model(cpu, sizeof cpu);
    if (!mkdtemp(dir)) {
        perror("bench_diag: mkdtemp");
        return 1;
    }
    mp_model *m = seed_model(policy, batch);
    mp_tensor x;
    int32_t *y = seed_batch(batch, &x);
    printf("diagnostics overhead: seed MLP 784-4096-4096-10 (Adam), %s, batch %lld, %d threads, "
           "%s\n",
           policy, (long long)batch, mp_num_threads(), cpu);
    fflush(stdout);

    step_times warm, off, every1, window;
    times_init(&warm, WARMUP);
    times_init(&off, WINDOW);
    times_init(&every1, reps);
    times_init(&window, WINDOW);
    char dir1[64], dir100[64];
    snprintf(dir1, sizeof dir1, "%s/1", dir);
    snprintf(dir100, sizeof dir100, "%s/100", dir);
    mp_diagnostics *d1, *d100;
    check(mp_diagnostics_open(&d1, m, dir1, 1, batch));
    check(mp_diagnostics_open(&d100, m, dir100, 100, batch));
    /* warm-up: plain steps, then each log's first diagnostic step */
    for (int i = 0; i < WARMUP; i++) one_step(m, NULL, 0, &x, y, &warm, i);
    one_step(m, d1, 1, &x, y, &warm, 0);
    one_step(m, d100, 1, &x, y, &warm, 0);
    /* Rounds of one step per mode, so that what else the machine runs falls
     * on the modes alike: a step without diagnostics, one at every 100 steps
     * (steps 2 to 101 of a run: one diagnostic step) and, every few rounds,
     * one at every step, compared with the plain step of its round. */
    /* per diagnostic step: its time / the round's plain step, and what the
     * update pass's gathering added inside the step (ms) */
    double *ratio1 = malloc((size_t)reps * sizeof *ratio1),
           *inside1 = malloc((size_t)reps * sizeof *inside1);
    if (!ratio1 || !inside1) return 1;
    bench_watch w = bench_watch_start();
    for (int i = 0, k = 0; i < WINDOW; i++) {
        one_step(m, NULL, 0, &x, y, &off, i);
        one_step(m, d100, 2 + i, &x, y, &window, i);
        if (i % (WINDOW / reps) == 0 && k < reps) {
            one_step(m, d1, 2 + k, &x, y, &every1, k);
            ratio1[k] = every1.total[k] / off.total[i];
            inside1[k] = every1.step[k] - off.step[i];
            k++;
        }
    }
    bench_watch_report(w, "the timed steps");
    check(mp_diagnostics_close(d1));
    check(mp_diagnostics_close(d100));

    double off_mean = mean(off.total, WINDOW), win_mean = mean(window.total, WINDOW);
    double over1 = median(ratio1, (size_t)reps) - 1;
    double over100 = win_mean / off_mean - 1, derived100 = over1 / 100;
    printf("  no diagnostics:     %8.1f ms/step median of %d (mean %.1f)\n",
           median(off.total, WINDOW), WINDOW, off_mean);
    printf("  --diagnostics 1:    %8.1f ms/step median of %d: the step %.1f (its update pass "
           "gathering the weights' and gradients' figures: %+.1f against the round's plain "
           "step) + the other tensors' statistics and the record %.1f (medians)\n",
           median(every1.total, (size_t)reps), reps, median(every1.step, (size_t)reps),
           median(inside1, (size_t)reps), median(every1.after, (size_t)reps));
    printf("  --diagnostics 100:  %8.1f ms/step mean of %d steps holding one diagnostic step "
           "(median %.1f)\n",
           win_mean, WINDOW, median(window.total, WINDOW));
    printf("  overhead at --diagnostics 1: %+.1f%% (median over %d rounds of the diagnostic "
           "step / the round's plain step)\n",
           100 * over1, reps);
    printf("  overhead at --diagnostics 100: %+.2f%% measured (the %d steps against the %d plain "
           "ones of the same rounds), %+.2f%% from the diagnostic step's overhead / 100; target "
           "< 5%%: %s\n",
           100 * over100, WINDOW, WINDOW, 100 * derived100,
           over100 < 0.05 && derived100 < 0.05 ? "met" : "NOT met");
    printf("\nsummary: off_ms=%.1f diag1_overhead=%.3f diag100_overhead=%.4f "
           "diag100_derived_overhead=%.4f\n",
           median(off.total, WINDOW), over1, over100, derived100);
    free(ratio1);
    free(inside1);
    times_free(&warm);
    times_free(&off);
    times_free(&every1);
    times_free(&window);
    mp_tensor_release(&x);
    free(y);
    mp_model_free(m);
    const char *files[] = {"diagnostics.jsonl", "config.json", "plan.json"};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 3; i++) {
            char p[256];
            snprintf(p, sizeof p, "%s/%s", k ? dir100 : dir1, files[i]);
            unlink(p);
        }
        rmdir(k ? dir100 : dir1);
    }
    rmdir(dir);
    return 0;
}
