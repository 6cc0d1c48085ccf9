/* demo_cmd.c - `mixprec demo`: one model (the seed MLP, or --model) trained
 * under float32, mixed_bfloat16 and mixed_float16 on Fashion-MNIST, one
 * table comparing accuracy, time, memory, loss scaling and the largest
 * batch that fits 2 GiB, and the HTML report of the three runs (their run
 * directories under --run-dir, default mixprec-demo, with per-layer
 * numerics every --diagnostics steps, default 100). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/train.h"

int mp_cli_demo(int argc, char **argv)
{
    train_args a;
    /* defaults sized to finish in a few minutes on two cores; every flag the
     * user gives is parsed after them and wins (all of train's flags count:
     * `make resnet` passes --lr-decay cosine, which a list of the flags the
     * demo forwarded had dropped) */
    static char *defaults[] = {"--epochs", "2", "--batch-size", "256", "--quiet"};
    enum { NDEF = sizeof defaults / sizeof *defaults };
    char **merged = malloc((size_t)(NDEF + argc) * sizeof *merged);
    if (!merged) {
        fprintf(stderr, "mixprec demo: out of memory\n");
        return 1;
    }
    memcpy(merged, defaults, sizeof defaults);
    if (argc) memcpy(merged + NDEF, argv, (size_t)argc * sizeof *argv);
    int rc = mp_cli_parse_train_args(NDEF + argc, merged, &a);
    free(merged);
    if (rc) return rc == 1 ? 0 : rc;
    if (a.resume || a.policy_given) {
        fprintf(stderr,
                "mixprec demo: %s: the demo trains afresh under each of its three "
                "policies (use mixprec train)\n",
                a.resume ? "--resume" : "--policy");
        return 2;
    }
    const char *base = a.run_dir ? a.run_dir : "mixprec-demo";
    if (!a.diagnostics_every) a.diagnostics_every = 100;
    if (mkdir(base, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "mixprec demo: cannot create the run directory '%s': %s\n", base,
                strerror(errno));
        return 1;
    }
    char dirs[3][4096];
    mp_dataset *train = NULL, *test = NULL;
    if (mp_cli_load_data(&a, true, 0, &train) || mp_cli_load_data(&a, false, 0, &test)) {
        mp_dataset_free(train);
        return 1;
    }
    const char *policies[3] = {"float32", "mixed_bfloat16", "mixed_float16"};
    run_result r[3];
    if (a.model_file) {
        printf("mixprec demo: %s", a.model_file);
    } else {
        printf("mixprec demo: MLP 784 -> ");
        for (int i = 0; i < a.nhidden; i++) printf("%lld -> ", (long long)a.hidden[i]);
        printf("10 (relu, float32 softmax)");
    }
    /* the optimizer as train builds it: its name, --lr, --weight-decay (or
     * the optimizer's default), the warm-up and the schedule */
    const mp_optimizer_config oc = mp_optimizer_config_default(a.optimizer);
    const double wd = a.weight_decay >= 0 ? (double)a.weight_decay : (double)oc.weight_decay;
    char opt[160];
    int at =
        snprintf(opt, sizeof opt, "%s lr %g", mp_optimizer_kind_name(a.optimizer), (double)a.lr);
    if (wd > 0) at += snprintf(opt + at, sizeof opt - (size_t)at, " weight decay %g", wd);
    if (a.warmup_steps)
        at += snprintf(opt + at, sizeof opt - (size_t)at, ", %lld warm-up steps",
                       (long long)a.warmup_steps);
    if (a.cosine) snprintf(opt + at, sizeof opt - (size_t)at, " with cosine decay");
    printf(", %s, batch %lld, %d epoch%s%s on %s (%lld train / %lld test)\n", opt,
           (long long)a.batch, a.epochs, a.epochs > 1 ? "s" : "",
           a.max_steps ? " (capped by --max-steps)" : "",
           strcmp(a.data, "fashion-mnist") ? a.data : "Fashion-MNIST",
           (long long)mp_dataset_count(train), (long long)mp_dataset_count(test));
    printf("kernel path %s, %d threads\n\n", mp_isa_name(mp_isa_active()), mp_num_threads());
    for (int p = 0; p < 3; p++) {
        a.policy = policies[p];
        a.policy_given = true;
        snprintf(dirs[p], sizeof dirs[p], "%s/%s", base, policies[p]);
        a.run_dir = dirs[p];
        char old[4250]; /* a new run, not appended to an earlier demo's log */
        snprintf(old, sizeof old, "%.4096s/diagnostics.jsonl", dirs[p]);
        unlink(old);
        printf("training under %-15s ...", policies[p]);
        fflush(stdout);
        if (a.model_file) { /* a fresh model in this policy */
            mp_mem_reset_peaks();
            a.model_base = mp_cli_model_peak_bytes();
            if (!(a.model = mp_cli_model_from_file(&a))) {
                rc = 2;
                break;
            }
        }
        if ((rc = mp_cli_run_training(&a, train, test, false, &r[p]))) break;
        printf(" test accuracy %.4f, %.1f ms/step\n", r[p].test_acc, r[p].ms_per_step);
    }
    if (!rc) {
        printf("\n%-16s %9s %10s %9s %12s %8s %13s %8s %8s %11s %10s\n", "policy", "test acc",
               "ms/step", "speed-up", "peak memory", "saving", "act+workspace", "saving", "skipped",
               "loss scale", "batch@2GiB");
        for (int p = 0; p < 3; p++) {
            char scale[32];
            if (r[p].scaled)
                snprintf(scale, sizeof scale, "%g", (double)r[p].scale);
            else
                snprintf(scale, sizeof scale, "none");
            printf(
                "%-16s %9.4f %10.1f %8.2fx %8.1f MiB %7.1f%% %9.1f MiB %7.1f%% %8lld %11s %10lld\n",
                policies[p], r[p].test_acc, r[p].ms_per_step, r[0].ms_per_step / r[p].ms_per_step,
                (double)r[p].peak / (1 << 20),
                100.0 * (1.0 - (double)r[p].peak / (double)r[0].peak),
                (double)r[p].step_peak / (1 << 20),
                100.0 * (1.0 - (double)r[p].step_peak / (double)r[0].step_peak),
                (long long)r[p].skipped, scale, (long long)r[p].batch_2g);
        }
        printf(
            "\npeak memory: the library's own bytes (weights, masters, gradients, optimizer "
            "state,\n"
            "activations, workspace) at batch %lld; the dataset is not counted. Mixed policies add "
            "a\n"
            "low-precision copy of the weights and halve the per-step memory (act+workspace), so\n"
            "they save overall once batches are large (see make bench-step, batch 8192).\n"
            "batch@2GiB: the largest batch whose planned training memory (the summary's plan,\n"
            "optimizer state included) fits 2 GiB.\n\n",
            (long long)a.batch);
        char out[4300];
        snprintf(out, sizeof out, "%s/report.html", base);
        const char *d[3] = {dirs[0], dirs[1], dirs[2]};
        if (mp_cli_report_write(d, 3, out) == 2) rc = 1;
    }
    mp_dataset_free(train);
    mp_dataset_free(test);
    return rc;
}
