/* fuzz_files.h - what the fuzz targets of loaders that take a path share
 * (fuzz_dataset.c, fuzz_cache.c, fuzz_report.c): a scratch directory per
 * process (under /dev/shm when there is one, so that no input touches a
 * disk; removed at exit) and an input written there as a file, plain or
 * gzip-compressed; the checks are fuzz_check.h's. A header of static
 * functions: each target (and the regression test that #includes it) is
 * one translation unit. */
#ifndef MP_FUZZ_FILES_H
#define MP_FUZZ_FILES_H

#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "fuzz_check.h"
#include "mixprec.h"

/* What one input came to. */
enum {
    FUZZ_REFUSED = 0, /* an error status (with a message) */
    FUZZ_LOADED = 1,  /* accepted, and every invariant held */
};

static char fuzz_dir_path[64];

/* The directory is flat: its files, then itself. */
static void fuzz_dir_remove(void)
{
    DIR *d = fuzz_dir_path[0] ? opendir(fuzz_dir_path) : NULL;
    for (struct dirent *e; d && (e = readdir(d));) {
        char p[400];
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            snprintf(p, sizeof p, "%s/%s", fuzz_dir_path, e->d_name) < (int)sizeof p)
            remove(p);
    }
    if (d) closedir(d);
    if (fuzz_dir_path[0]) rmdir(fuzz_dir_path);
}

/* The scratch directory, made on the first call. */
static const char *fuzz_dir(void)
{
    if (fuzz_dir_path[0]) return fuzz_dir_path;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/mp_fuzz_XXXXXX", base);
    if (!mkdtemp(fuzz_dir_path)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(fuzz_dir_remove);
    return fuzz_dir_path;
}

/* <scratch>/<name> into buf. */
static inline const char *fuzz_path(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", fuzz_dir(), name);
    return buf;
}

/* n bytes into path, replacing it; gzip-compressed when gz. Aborts when the
 * file cannot be written (the machine, not the input, is at fault). */
static inline void fuzz_write(const char *path, const void *p, size_t n, bool gz)
{
    bool ok;
    if (gz) {
        gzFile f = gzopen(path, "wb");
        ok = f && (n == 0 || gzwrite(f, p, (unsigned)n) == (int)n);
        ok = f && gzclose(f) == Z_OK && ok;
    } else {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        size_t off = 0;
        while (fd >= 0 && off < n) {
            ssize_t w = write(fd, (const char *)p + off, n - off);
            if (w <= 0) break;
            off += (size_t)w;
        }
        ok = fd >= 0 && off == n;
        ok = fd >= 0 && close(fd) == 0 && ok;
    }
    if (!ok) {
        perror(path);
        abort();
    }
}

#endif
