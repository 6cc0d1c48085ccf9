/* step_peers.h - the peers of `bench_step --peers`: the seed-MLP step in
 * Keras 3 on TensorFlow (bench/step_keras.py, XLA off and on, the faster
 * kept per policy) and in PyTorch from Debian (bench/step_torch.py), run as
 * child processes with our thread count, and the side-by-side table. A peer
 * that is not installed is reported as missing with how to install it. */
#ifndef MP_BENCH_STEP_PEERS_H
#define MP_BENCH_STEP_PEERS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

/* Medians per policy, [0] float32, [1] mixed_bfloat16 (PyTorch: bf16
 * autocast): wall ms per step and the process's CPU ms per step (all
 * threads); 0 where not measured. */
typedef struct {
    double ms[2], cpu[2];
    char note[2][96]; /* Keras: both XLA settings' ms and which was kept */
    char version[128];
    char why[256]; /* why it is missing */
} peer_result;

/* Keras 3 on TensorFlow: bench/step_keras.py under `python`. */
static inline peer_result run_keras(const char *python, int threads)
{
    peer_result r;
    memset(&r, 0, sizeof r);
    if (access(python, X_OK)) {
        snprintf(r.why, sizeof r.why,
                 "missing: %s not found (make keras-venv installs tensorflow-cpu and keras from "
                 "PyPI into build/venv-keras)",
                 python);
        return r;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "env OMP_NUM_THREADS=%d TF_CPP_MIN_LOG_LEVEL=2 KERAS_BACKEND=tensorflow '%s' "
             "bench/step_keras.py --threads %d --jit both 2>&1",
             threads, python, threads);
    snprintf(r.why, sizeof r.why, "missing: bench/step_keras.py printed nothing");
    FILE *py = popen(cmd, "r");
    if (!py) return r;
    char line[4096];
    double jit_ms[2][2] = {{0}}; /* [policy][XLA off, on] */
    while (fgets(line, sizeof line, py)) {
        if (line[0] != '{') {
            if (line[0] != '\n' && !r.ms[0] && !r.ms[1]) {
                line[strcspn(line, "\n")] = 0;
                snprintf(r.why, sizeof r.why, "missing: step_keras.py said: %.200s", line);
            }
            continue;
        }
        json_t *j = json_loads(line, 0, NULL);
        const char *pol = j ? json_string_value(json_object_get(j, "policy")) : NULL;
        if (pol) {
            int p = !strcmp(pol, "float32") ? 0 : !strcmp(pol, "mixed_bfloat16") ? 1 : -1;
            const bool jit = json_is_true(json_object_get(j, "jit_compile"));
            const double ms = json_number_value(json_object_get(j, "median_ms"));
            if (p >= 0 && ms > 0) {
                jit_ms[p][jit] = ms;
                if (r.ms[p] == 0 || ms < r.ms[p]) { /* the faster XLA setting */
                    r.ms[p] = ms;
                    r.cpu[p] = json_number_value(json_object_get(j, "cpu_ms"));
                }
            }
            const char *kv = json_string_value(json_object_get(j, "keras"));
            const char *tv = json_string_value(json_object_get(j, "tensorflow"));
            snprintf(r.version, sizeof r.version,
                     "Keras %s, TensorFlow %s, XLA off and on, the faster kept per policy",
                     kv ? kv : "?", tv ? tv : "?");
        }
        json_decref(j);
    }
    pclose(py);
    for (int p = 0; p < 2; p++)
        if (jit_ms[p][0] > 0 || jit_ms[p][1] > 0)
            snprintf(r.note[p], sizeof r.note[p], "XLA off %.1f ms, on %.1f ms: %s kept",
                     jit_ms[p][0], jit_ms[p][1],
                     jit_ms[p][1] > 0 && (jit_ms[p][0] <= 0 || jit_ms[p][1] < jit_ms[p][0])
                         ? "on"
                         : "off");
    return r;
}

/* PyTorch from Debian (python3-torch): bench/step_torch.py, with
 * OPENBLAS_CORETYPE as the caller set it (PyTorch's float32 products are
 * OpenBLAS's). */
static inline peer_result run_torch(int threads)
{
    peer_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.why, sizeof r.why,
             "missing: /usr/bin/python3 cannot import torch (apt-get install -y python3-torch)");
    if (system("/usr/bin/python3 -c 'import torch.nn' >/dev/null 2>&1")) return r;
    char cmd[256];
    snprintf(cmd, sizeof cmd,
             "env -u OPENBLAS_L2_SIZE GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "
             "/usr/bin/python3 bench/step_torch.py %d 2>/dev/null",
             threads);
    FILE *py = popen(cmd, "r");
    if (!py) return r;
    char line[512] = "", ver[64] = "?";
    if (fgets(line, sizeof line, py) &&
        sscanf(line,
               "torch_f32_ms=%lf torch_bf16_ms=%lf torch_version=%63s torch_f32_cpu_ms=%lf "
               "torch_bf16_cpu_ms=%lf",
               &r.ms[0], &r.ms[1], ver, &r.cpu[0], &r.cpu[1]) >= 2)
        snprintf(r.version, sizeof r.version, "PyTorch %s (python3-torch), bf16 autocast", ver);
    else
        snprintf(r.why, sizeof r.why,
                 "missing: bench/step_torch.py printed no timings (run it by hand to see why; "
                 "apt-get install -y python3-torch)");
    pclose(py);
    return r;
}

/* One table: mixprec's figure per policy against each peer's, the ratio
 * peer / mixprec (above 1: mixprec is faster) and the fastest peer; appends
 * "<prefix>_<f32|bf16>_vs_fastest_peer=R" to summary. */
static inline void print_peer_table(const char *title, const char *prefix, const double mp[2],
                                    const double peer[2][2], char *summary, size_t slen)
{
    static const char *const policies[2] = {"float32", "mixed_bfloat16"};
    static const char *const names[2] = {"Keras/TF", "PyTorch"};
    printf("\n%s; speedup = peer / mixprec (above 1: mixprec is faster)\n", title);
    printf("%-15s %9s %9s %9s %11s %11s  %s\n", "policy", "mixprec", names[0], names[1],
           "vs Keras/TF", "vs PyTorch", "fastest peer");
    for (int p = 0; p < 2; p++) {
        char col[2][16], ratio[2][16], fastest[64] = "none measured";
        double best = 0;
        for (int i = 0; i < 2; i++) {
            snprintf(col[i], sizeof col[i], "missing");
            snprintf(ratio[i], sizeof ratio[i], "n/a");
            if (peer[i][p] <= 0 || mp[p] <= 0) continue;
            snprintf(col[i], sizeof col[i], "%.1f", peer[i][p]);
            snprintf(ratio[i], sizeof ratio[i], "%.2fx", peer[i][p] / mp[p]);
            if (best == 0 || peer[i][p] < best) {
                best = peer[i][p];
                snprintf(fastest, sizeof fastest, "%s (mixprec %.2fx)", names[i], best / mp[p]);
            }
        }
        printf("%-15s %9.1f %9s %9s %11s %11s  %s\n", policies[p], mp[p], col[0], col[1], ratio[0],
               ratio[1], fastest);
        size_t n = strlen(summary);
        const char *tag = p ? "bf16" : "f32";
        if (best > 0)
            snprintf(summary + n, slen - n, " %s_%s_vs_fastest_peer=%.2f", prefix, tag,
                     best / mp[p]);
        else
            snprintf(summary + n, slen - n, " %s_%s_vs_fastest_peer=n/a", prefix, tag);
    }
}

#endif
