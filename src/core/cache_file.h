/* cache_file.h - the files under the user's cache directory that keep
 * measured kernel choices (gemm_dispatch.c, gemm_ways.c, measured.c): where
 * they live, the CPU model they are keyed by, a bounded read that a bad file
 * can never break, a write that never leaves a torn file, and the rates as
 * the files keep them. Each user writes its own canonical text and accepts
 * a file only when it equals that text. */
#ifndef MP_CORE_CACHE_FILE_H
#define MP_CORE_CACHE_FILE_H

#include "core/internal.h"

/* Cache files are at most this many bytes. */
enum { MP_CACHE_MAX = 4096 };

/* FNV-1a over n bytes: the files' checksums and the CPU key. */
uint64_t mp_fnv1a(const void *p, size_t n);
/* How this library was compiled, as far as it moves measured rates:
 * "optimized", "unoptimized" (no -O) or "asan" / "tsan" (a sanitizer). */
const char *mp_build_flavor(void);
/* The key of the files: the CPU model (brand string, CPUID signature, the
 * paths it supports) and the build flavor, so that a sanitized or
 * unoptimized build, whose kernels run at other ratios, never hands its
 * choices to an optimized one. */
uint64_t mp_cpu_model_key(void);
/* The cache directory into dir (MP_DISPATCH_CACHE, else XDG_CACHE_HOME/mixprec,
 * else HOME/.cache/mixprec); false, with the reason in note, when off. */
bool mp_cache_dir(char *dir, size_t len, char *note, size_t nlen);
/* The file at path into buf (MP_CACHE_MAX + 2 bytes), NUL-terminated, its
 * length in *n; false with the reason in *why unless it is a regular file
 * of at most MP_CACHE_MAX bytes without a NUL. Never blocks (a FIFO) and
 * never follows a link at the last component. */
bool mp_cache_slurp(const char *path, char *buf, size_t *n, const char **why);
/* text into path (directories made, mode 0700) through a temporary file and
 * a rename: a reader sees the old file or the new one; 0 or an errno. */
int mp_cache_write(const char *dir, const char *path, const char *text, size_t n);

/* Rates as every cache file keeps them: whole thousandths of the unit the
 * reader prints (MFLOP/s of GFLOP/s, thousands of million elements/s),
 * from 1 to 1e9. mp_cache_rate_round gives the rate a file can hold. */
long long mp_cache_rate_thousandths(double rate);
double mp_cache_rate_round(double rate);
/* At *p, name, one space and a rate as written (1 to 10 digits, at least
 * 1) into *rate, and *p past it; false otherwise. A file is still valid
 * only when it equals its writer's text for the rates read. */
bool mp_cache_rate_after(const char **p, const char *name, double *rate);

#endif
