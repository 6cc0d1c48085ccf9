/* cache_file.c - where measured choices are cached and how the files are
 * read and written (cache_file.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cache_file.h"

uint64_t mp_fnv1a(const void *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return h;
}

#ifndef __has_feature
#define __has_feature(x) 0
#endif

const char *mp_build_flavor(void)
{
#if defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
    return "asan";
#elif defined(__SANITIZE_THREAD__) || __has_feature(thread_sanitizer)
    return "tsan";
#elif !defined(__OPTIMIZE__)
    return "unoptimized";
#else
    return "optimized";
#endif
}

uint64_t mp_cpu_model_key(void)
{
    const mp_cpu_features *f = mp_cpu();
    char s[192];
    int n = snprintf(s, sizeof s, "%s|%s|%08x|%s|", f->vendor, f->brand,
                     (unsigned)mp_cpu_signature(), mp_build_flavor());
    for (int i = 0; i < MP_ISA_COUNT && n > 0 && n < (int)sizeof s - 1; i++)
        s[n++] = mp_isa_supported((mp_isa)i) ? '1' : '0';
    return mp_fnv1a(s, n > 0 && n < (int)sizeof s ? (size_t)n : 0);
}

bool mp_cache_dir(char *dir, size_t len, char *note, size_t nlen)
{
    const char *env = getenv("MP_DISPATCH_CACHE");
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int w;
    if (env && !strcmp(env, "0")) {
        snprintf(note, nlen, "off (MP_DISPATCH_CACHE=0)");
        return false;
    }
    if (env && *env)
        w = snprintf(dir, len, "%s", env);
    else if (xdg && xdg[0] == '/') /* the XDG rule: a relative value is ignored */
        w = snprintf(dir, len, "%s/mixprec", xdg);
    else if (home && home[0] == '/')
        w = snprintf(dir, len, "%s/.cache/mixprec", home);
    else {
        snprintf(note, nlen, "off (neither MP_DISPATCH_CACHE, XDG_CACHE_HOME nor HOME is set)");
        return false;
    }
    if (w < 0 || (size_t)w >= len) {
        snprintf(note, nlen, "off (the cache path is too long)");
        return false;
    }
    return true;
}

bool mp_cache_slurp(const char *path, char *buf, size_t *n, const char **why)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        *why = errno == ENOENT ? "none yet" : "ignored (cannot be opened)";
        return false;
    }
    struct stat st;
    bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    *why = "ignored (not a regular file)";
    *n = 0;
    while (ok && *n < MP_CACHE_MAX + 1) {
        ssize_t r = read(fd, buf + *n, MP_CACHE_MAX + 1 - *n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) *why = "ignored (unreadable)";
        if (r <= 0) {
            ok = r == 0;
            break;
        }
        *n += (size_t)r;
    }
    close(fd);
    if (!ok) return false;
    *why = "ignored (too large)";
    if (*n > MP_CACHE_MAX) return false;
    buf[*n] = '\0';
    *why = "ignored (not this version's format, or corrupt)";
    return memchr(buf, '\0', *n) == NULL;
}

/* mkdir -p with mode 0700; 0 or an errno. */
static int make_dirs(const char *dir)
{
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return ENAMETOOLONG;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0') continue;
        const char c = *s;
        *s = '\0';
        if (mkdir(p, 0700) != 0 && errno != EEXIST) return errno;
        *s = c;
        if (c == '\0') break;
    }
    return 0;
}

int mp_cache_write(const char *dir, const char *path, const char *text, size_t n)
{
    char tmp[4096 + 8];
    int err = make_dirs(dir);
    if (err) return err;
    if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp) return ENAMETOOLONG;
    int fd = mkstemp(tmp);
    if (fd < 0) return errno;
    size_t off = 0;
    while (off < n && !err) {
        ssize_t w = write(fd, text + off, n - off);
        if (w < 0 && errno != EINTR) err = errno;
        if (w > 0) off += (size_t)w;
    }
    if (!err && fsync(fd) != 0) err = errno;
    if (close(fd) != 0 && !err) err = errno;
    if (!err && rename(tmp, path) != 0) err = errno;
    if (err) unlink(tmp);
    return err;
}

long long mp_cache_rate_thousandths(double rate)
{
    const double k = rate * 1e3 + 0.5;
    return !(k >= 1) ? 1 : k > 1e9 ? 1000000000ll : (long long)k;
}

double mp_cache_rate_round(double rate) { return (double)mp_cache_rate_thousandths(rate) * 1e-3; }

bool mp_cache_rate_after(const char **p, const char *name, double *rate)
{
    const size_t len = strlen(name);
    const char *s = *p;
    if (strncmp(s, name, len) || s[len] != ' ') return false;
    s += len + 1;
    long long v = 0;
    int digits = 0;
    for (; *s >= '0' && *s <= '9' && digits < 11; s++, digits++) v = v * 10 + (*s - '0');
    if (digits == 0 || digits > 10 || v < 1 || v > 1000000000ll) return false;
    *rate = (double)v * 1e-3;
    *p = s;
    return true;
}
