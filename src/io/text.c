/* text.c - reading text for language models: a file (plain or gzip) or a
 * directory of them (Debian's fortunes: the texts next to their .dat
 * indexes), concatenated as bytes. The windows over the bytes are the
 * dataset's (dataset.c). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/io_internal.h"

/* Largest text accepted (a bound on what a mistaken path can allocate). */
#define MAX_TEXT_BYTES ((size_t)1 << 31)

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whether a directory entry is one of the texts: a regular file, not
 * hidden, not a fortune index (.dat). Symbolic links (fortunes' .u8 names
 * for the same files) are left out. */
static bool is_text_file(const char *dir, const char *name)
{
    size_t n = strlen(name);
    if (name[0] == '.' || (n >= 4 && !strcmp(name + n - 4, ".dat"))) return false;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return false;
    struct stat st;
    return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Append the file at path to *buf (*len bytes, *cap allocated). */
static mp_status append_file(const char *path, uint8_t **buf, size_t *len, size_t *cap)
{
    char *data;
    size_t n;
    mp_status s = mp_gz_read_all(path, MAX_TEXT_BYTES - *len, &data, &n);
    if (s) return s;
    if (*len + n > *cap) {
        size_t nc = *cap ? *cap : (size_t)1 << 16;
        while (nc < *len + n) nc *= 2;
        uint8_t *nb = realloc(*buf, nc);
        if (!nb) {
            free(data);
            return mp_set_error(MP_ERR_NOMEM, "%s: out of memory for the text", path);
        }
        *buf = nb;
        *cap = nc;
    }
    if (n) memcpy(*buf + *len, data, n);
    *len += n;
    free(data);
    return MP_OK;
}

static mp_status read_dir(const char *dir, uint8_t **buf, size_t *len, size_t *cap)
{
    DIR *d = opendir(dir);
    if (!d)
        return mp_set_error(MP_ERR_IO, "cannot read the directory '%s': %s", dir, strerror(errno));
    char **names = NULL;
    size_t count = 0, room = 0;
    mp_status s = MP_OK;
    for (struct dirent *e; (e = readdir(d));) {
        if (!is_text_file(dir, e->d_name)) continue;
        if (count == room) {
            room = room ? 2 * room : 64;
            char **nn = realloc(names, room * sizeof *nn);
            if (!nn) {
                s = mp_set_error(MP_ERR_NOMEM, "%s: out of memory", dir);
                break;
            }
            names = nn;
        }
        if (!(names[count] = strdup(e->d_name))) {
            s = mp_set_error(MP_ERR_NOMEM, "%s: out of memory", dir);
            break;
        }
        count++;
    }
    closedir(d);
    if (!s && count == 0)
        s = mp_set_error(MP_ERR_IO, "the directory '%s' holds no text files", dir);
    if (!s) qsort(names, count, sizeof *names, cmp_names);
    for (size_t i = 0; !s && i < count; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        s = append_file(path, buf, len, cap);
    }
    for (size_t i = 0; i < count; i++) free(names[i]);
    free(names);
    return s;
}

mp_status mp_dataset_load_text(const char *path, int64_t context, mp_dataset **out)
{
    if (!out) return mp_set_error(MP_ERR_INVALID, "mp_dataset_load_text: out is NULL");
    *out = NULL;
    if (!path) return mp_set_error(MP_ERR_INVALID, "mp_dataset_load_text: path is NULL");
    if (context < 1 || context > MP_TEXT_MAX_CONTEXT)
        return mp_set_error(MP_ERR_INVALID, "text '%s': context %lld outside 1..%d", path,
                            (long long)context, MP_TEXT_MAX_CONTEXT);
    struct stat st;
    if (stat(path, &st) != 0)
        return mp_set_error(MP_ERR_IO, "cannot read the text '%s': %s%s", path, strerror(errno),
                            strncmp(path, MP_FORTUNES_DIR, strlen(MP_FORTUNES_DIR))
                                ? ""
                                : " (Debian package: fortunes)");
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    mp_status s = S_ISDIR(st.st_mode) ? read_dir(path, &buf, &len, &cap)
                                      : append_file(path, &buf, &len, &cap);
    if (!s && len == 0) s = mp_set_error(MP_ERR_FORMAT, "the text '%s' is empty", path);
    if (s) {
        free(buf);
        return s;
    }
    if ((s = mp_dataset_adopt_text(buf, (int64_t)len, context, out)))
        return mp_set_error(s, "text '%s': %s", path, mp_last_error());
    return MP_OK;
}
