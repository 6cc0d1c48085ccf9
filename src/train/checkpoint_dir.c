/* checkpoint_dir.c - directories of checkpoints as fit writes them
 * (ckpt-<steps>.safetensors): listing in step order, pruning to the newest
 * few (and temporaries a killed writer left), and the newest one that
 * reads and validates. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/train_internal.h"

/* The steps of a name ckpt-<steps>.safetensors, or -1. */
static int64_t ckpt_steps(const char *name)
{
    if (strncmp(name, "ckpt-", 5)) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(name + 5, &end, 10);
    if (errno || end == name + 5 || v < 0 || strcmp(end, ".safetensors")) return -1;
    return v;
}

int mp_checkpoint_list(const char *dir, mp_checkpoint_entry **out)
{
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t v = ckpt_steps(e->d_name);
        if (v < 0 || strlen(e->d_name) >= sizeof((*out)->name)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            mp_checkpoint_entry *ne = realloc(*out, (size_t)cap * sizeof *ne);
            if (!ne) break;
            *out = ne;
        }
        (*out)[n].steps = v;
        snprintf((*out)[n].name, sizeof(*out)[n].name, "%s", e->d_name);
        n++;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* ascending steps; a directory holds few */
        for (int j = i; j > 0 && (*out)[j - 1].steps > (*out)[j].steps; j--) {
            mp_checkpoint_entry x = (*out)[j];
            (*out)[j] = (*out)[j - 1];
            (*out)[j - 1] = x;
        }
    return n;
}

void mp_checkpoint_prune(const char *dir, int keep_last)
{
    mp_checkpoint_entry *list;
    int n = mp_checkpoint_list(dir, &list);
    char path[4096];
    for (int i = 0; keep_last > 0 && i < n - keep_last; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, list[i].name);
        unlink(path);
    }
    free(list);
    /* temporaries a killed writer left behind (only one fit writes here) */
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, "ckpt-", 5) && strstr(e->d_name, ".safetensors.tmp.")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    if (d) closedir(d);
}

mp_status mp_checkpoint_latest(const char *dir, char *path, size_t len)
{
    mp_checkpoint_entry *list;
    int n = mp_checkpoint_list(dir, &list);
    if (n < 0)
        return mp_set_error(MP_ERR_IO, "cannot read directory '%s': %s", dir, strerror(errno));
    char first_err[256] = "";
    for (int i = n - 1; i >= 0; i--) {
        snprintf(path, len, "%s/%s", dir, list[i].name);
        mp_safetensors *f;
        if (mp_safetensors_read(path, &f) == MP_OK) {
            mp_safetensors_free(f);
            free(list);
            return MP_OK;
        }
        if (!first_err[0]) snprintf(first_err, sizeof first_err, "%s", mp_last_error());
    }
    free(list);
    if (first_err[0])
        return mp_set_error(MP_ERR_IO, "no valid checkpoint in '%s' (newest: %s)", dir, first_err);
    return mp_set_error(MP_ERR_IO, "no checkpoint (ckpt-<steps>.safetensors) in '%s'", dir);
}
