/* main.c - the mixprec command-line tool: a thin layer that parses flags and
 * calls the library. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "mixprec.h"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: mixprec [--help] [--version] COMMAND [ARGS]\n"
        "\n"
        "Mixed-precision neural-network training.\n"
        "\n"
        "commands:\n"
        "  train      train a model (an MLP, a JSON model file, resnet20) on Fashion-MNIST,\n"
        "             CSV or text; mixprec train --help\n"
        "  demo       the seed model under float32, mixed_bfloat16 and mixed_float16\n"
        "  evaluate   loss and accuracy of a saved model; mixprec evaluate FILE --data ...\n"
        "  predict    predicted classes of a saved model, as CSV\n"
        "  inspect    what a safetensors file or checkpoint holds; mixprec inspect FILE\n"
        "  generate   text from a trained language model; mixprec generate FILE --prompt ...\n"
        "  report     an HTML report of run directories; mixprec report DIR... -o FILE.html\n"
        "  tune-precision  per-layer number formats measured on probe batches; writes a\n"
        "             model file; mixprec tune-precision --model M.json --help\n"
        "  info       CPU features, the kernel path in use, threads\n"
        "  formats    the number formats and their facts\n"
        "\n"
        "environment:\n"
        "  MP_ISA=scalar|avx2|avx512|avx512bf16  force a kernel path\n"
        "  MP_NUM_THREADS=N                       threads for kernels (else OMP_NUM_THREADS)\n");
}

static int cmd_info(void)
{
    const mp_cpu_features *f = mp_cpu();
    printf("mixprec %s\n", MP_VERSION_STRING);
    printf("cpu:      %s (%s)\n", f->brand[0] ? f->brand : "unknown", f->vendor);
    printf("features:%s%s%s%s%s%s%s%s%s%s%s%s\n", f->avx2 ? " avx2" : "", f->fma ? " fma" : "",
           f->f16c ? " f16c" : "", f->avx512f ? " avx512f" : "", f->avx512bw ? " avx512bw" : "",
           f->avx512vl ? " avx512vl" : "", f->avx512dq ? " avx512dq" : "",
           f->avx512_bf16 ? " avx512_bf16" : "", f->avx512_fp16 ? " avx512_fp16" : "",
           f->amx_bf16 ? " amx_bf16" : "", f->amx_tile ? " amx_tile" : "",
           f->amx_tile && !f->os_amx ? " (tile data not granted by the OS)" : "");
    printf("paths:   ");
    for (int i = 0; i < MP_ISA_COUNT; i++)
        printf(" %s%s", mp_isa_name((mp_isa)i), mp_isa_supported((mp_isa)i) ? "" : "(unsupported)");
    printf("\nactive:   %s (best %s; MP_ISA overrides)\n", mp_isa_name(mp_isa_active()),
           mp_isa_name(mp_isa_best()));
    printf("threads:  %d\n", mp_num_threads());
    return mp_gemm_dispatch_report(stdout) == MP_OK && mp_kernel_dispatch_report(stdout) == MP_OK
               ? 0
               : 1;
}

static int cmd_formats(void)
{
    printf("%-12s %4s %4s %4s %5s %5s %-12s %-12s %-12s %-12s %-12s\n", "dtype", "bits", "exp",
           "man", "bias", "inf", "epsilon", "max", "min_normal", "min_subnorm", "unit_round");
    for (int t = 0; t < MP_DTYPE_COUNT; t++) {
        mp_dtype_info in;
        mp_dtype_get_info((mp_dtype)t, &in);
        printf("%-12s %4d %4d %4d %5d %5s %-12.6g %-12.6g %-12.6g %-12.6g %-12.6g\n",
               mp_dtype_name((mp_dtype)t), in.bits, in.exponent_bits, in.mantissa_bits,
               in.exponent_bias, in.has_inf ? "yes" : "no", (double)in.epsilon, (double)in.max,
               (double)in.min_normal, (double)in.min_subnormal, (double)in.unit_roundoff);
    }
    printf("\nfloat32 -> lower precision: round-to-nearest-even, subnormals kept.\n"
           "float16/bfloat16 overflow to +-inf; fp8 saturates finite overflow to +-max,\n"
           "inf stays inf in float8_e5m2 and becomes NaN in float8_e4m3 (no infinity).\n");
    return 0;
}

static int run(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("mixprec %s (kernel path %s)\n", MP_VERSION_STRING, mp_isa_name(mp_isa_active()));
        return 0;
    }
    if (!strcmp(cmd, "info")) return cmd_info();
    if (!strcmp(cmd, "formats")) return cmd_formats();
    if (!strcmp(cmd, "train")) return mp_cli_train(argc - 2, argv + 2);
    if (!strcmp(cmd, "demo")) return mp_cli_demo(argc - 2, argv + 2);
    if (!strcmp(cmd, "evaluate")) return mp_cli_evaluate(argc - 2, argv + 2);
    if (!strcmp(cmd, "predict")) return mp_cli_predict(argc - 2, argv + 2);
    if (!strcmp(cmd, "inspect")) return mp_cli_inspect(argc - 2, argv + 2);
    if (!strcmp(cmd, "generate")) return mp_cli_generate(argc - 2, argv + 2);
    if (!strcmp(cmd, "report")) return mp_cli_report(argc - 2, argv + 2);
    if (!strcmp(cmd, "tune-precision")) return mp_cli_tune(argc - 2, argv + 2);
    fprintf(stderr, "mixprec: unknown command '%s' (try mixprec --help)\n", cmd);
    return 2;
}

/* Under mpirun (a build with MPI): MPI starts first, every rank runs the
 * command, and only rank 0's standard output is kept. */
int main(int argc, char **argv)
{
    bool dist = mp_dist_launched() && mp_dist_available();
    if (dist) {
        if (mp_dist_init(&argc, &argv)) {
            fprintf(stderr, "mixprec: %s\n", mp_last_error());
            return 1;
        }
        if (mp_dist_rank() != 0 && !freopen("/dev/null", "w", stdout)) {
            fprintf(stderr, "mixprec: rank %d cannot silence its output\n", mp_dist_rank());
            mp_dist_finalize();
            return 1;
        }
    }
    int rc = run(argc, argv);
    return dist ? mp_dist_exit(rc) : rc;
}
