/* gzfile.c - reading plain or gzip files through zlib with every failure
 * (missing file, corrupt or cut-short gzip stream) turned into an mp_status
 * and a message naming the file, shared by the IDX and CSV loaders. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/io_internal.h"

mp_status mp_gz_open(const char *path, gzFile *out)
{
    *out = NULL;
    if (!path || !*path) return mp_set_error(MP_ERR_INVALID, "no file name given");
    struct stat st;
    if (stat(path, &st) != 0)
        return mp_set_error(MP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return mp_set_error(MP_ERR_IO, "%s: is a directory, not a file", path);
    gzFile f = gzopen(path, "rb");
    if (!f) {
        int e = errno;
        return mp_set_error(MP_ERR_IO, "%s: cannot open: %s", path,
                            e ? strerror(e) : "out of memory");
    }
    /* The default 8 KiB buffer makes reading 26 MB of images slower. */
    gzbuffer(f, 1 << 17);
    *out = f;
    return MP_OK;
}

static mp_status stream_error(gzFile f, const char *path, int r)
{
    int err = Z_OK;
    const char *msg = gzerror(f, &err);
    if (err == Z_ERRNO) return mp_set_error(MP_ERR_IO, "%s: read error: %s", path, strerror(errno));
    if (err == Z_MEM_ERROR) return mp_set_error(MP_ERR_NOMEM, "%s: zlib out of memory", path);
    if (err == Z_BUF_ERROR)
        return mp_set_error(MP_ERR_FORMAT, "%s: gzip stream is truncated (%s)", path,
                            msg && *msg ? msg : "unexpected end of file");
    if (err != Z_OK || r < 0)
        return mp_set_error(MP_ERR_FORMAT, "%s: corrupt gzip data (%s)", path,
                            msg && *msg ? msg : "unknown zlib error");
    return MP_OK;
}

mp_status mp_gz_read(gzFile f, const char *path, void *buf, size_t len, size_t *got)
{
    size_t done = 0;
    char *p = buf;
    while (done < len) {
        size_t want = len - done;
        if (want > (1u << 30)) want = 1u << 30; /* gzread counts in int */
        int r = gzread(f, p + done, (unsigned)want);
        if (r < 0) {
            *got = done;
            return stream_error(f, path, r);
        }
        done += (size_t)r;
        if ((size_t)r < want) break;
    }
    *got = done;
    /* A short read is either the clean end of the data or a stream that
     * stopped early or failed its check: only gzerror tells them apart. */
    if (done < len) return stream_error(f, path, 0);
    return MP_OK;
}

mp_status mp_gz_read_upto(gzFile f, const char *path, size_t max_bytes, char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    size_t cap = max_bytes < ((size_t)1 << 16) ? max_bytes : (size_t)1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf)
            return mp_set_error(MP_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, cap);
        size_t got;
        mp_status s = mp_gz_read(f, path, buf + n, cap - n, &got);
        n += got;
        if (s) {
            free(buf);
            return s;
        }
        if (n < cap || cap == max_bytes) break;
        size_t ncap = cap * 2 > max_bytes ? max_bytes : cap * 2;
        char *nb = realloc(buf, ncap + 1);
        if (!nb) free(buf);
        buf = nb;
        cap = ncap;
    }
    *data = buf;
    *len = n;
    return MP_OK;
}

mp_status mp_gz_read_all(const char *path, size_t max_bytes, char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    gzFile f;
    mp_status s = mp_gz_open(path, &f);
    if (s) return s;
    char *buf;
    size_t n;
    s = mp_gz_read_upto(f, path, max_bytes, &buf, &n);
    if (!s && n == max_bytes) { /* at the limit: one byte more is too large */
        char extra;
        size_t g = 0;
        s = mp_gz_read(f, path, &extra, 1, &g);
        if (!s && g)
            s = mp_set_error(MP_ERR_FORMAT, "%s: larger than the %zu-byte limit", path, max_bytes);
        if (s) free(buf);
    }
    gzclose(f);
    if (s) return s;
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return MP_OK;
}
