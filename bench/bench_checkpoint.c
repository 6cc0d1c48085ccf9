/* bench_checkpoint.c - how long a full training checkpoint of the seed
 * model (784-4096-4096-10, mixed_bfloat16, Adam: float32 masters and two
 * moments, 240 MB) takes to save (atomic: temporary, fsync, rename,
 * directory fsync) and to load (read from disk, the page cache dropped
 * first; validate everything; restore).
 * Medians of 5; the file goes to $TMPDIR (default /tmp). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"
#include "mixprec.h"

int main(void)
{
    mp_model *m = seed_model("mixed_bfloat16", 256);
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char path[512];
    snprintf(path, sizeof path, "%s/mixprec_bench_%d.safetensors", tmp, (int)getpid());
    enum { RUNS = 5 };
    double save[RUNS], load[RUNS];
    for (int r = 0; r < RUNS; r++) {
        double t0 = now();
        if (mp_model_save_checkpoint(m, path, NULL)) break;
        /* drop the file from the page cache: the load reads it from disk */
        int fd = open(path, O_RDONLY);
        if (fd >= 0) {
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
        double t1 = now();
        if (mp_model_load_checkpoint(m, path, NULL)) break;
        save[r] = t1 - t0;
        load[r] = now() - t1;
    }
    struct stat st;
    int ok = stat(path, &st) == 0;
    unlink(path);
    if (!ok || *mp_last_error()) {
        fprintf(stderr, "bench_checkpoint: %s\n", mp_last_error());
        return 1;
    }
    double mb = (double)st.st_size / 1e6, ms = median(save, RUNS), ml = median(load, RUNS);
    printf("checkpoint of the seed model (mixed_bfloat16, Adam): %.1f MB in %s\n", mb, tmp);
    printf("  save %.3f s (%.0f MB/s)   load %.3f s (%.0f MB/s)   medians of %d\n", ms, mb / ms, ml,
           mb / ml, RUNS);
    mp_model_free(m);
    return 0;
}
