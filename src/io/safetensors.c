/* safetensors.c - reading and writing safetensors files with Debian's
 * jansson for the JSON header. Reading trusts nothing: every field is
 * checked against the file before a byte of tensor data is handed out.
 * Writing is atomic: temporary file, fsync, rename, directory fsync. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/io_internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this build assumes a little-endian host"
#endif

/* A header larger than this is refused before it is read (the reference
 * implementation uses the same bound). */
#define MAX_HEADER ((uint64_t)100 << 20)

static const struct {
    const char *name;
    mp_dtype t;
} st_dtypes[] = {{"F32", MP_F32},
                 {"F16", MP_F16},
                 {"BF16", MP_BF16},
                 {"F8_E4M3", MP_F8E4M3},
                 {"F8_E5M2", MP_F8E5M2}};

static const char *st_name(mp_dtype t)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (st_dtypes[i].t == t) return st_dtypes[i].name;
    return NULL;
}

/* ---------------------------------------------------------------- write */

mp_write_fault_fn mp_write_fault_hook;
void *mp_write_fault_user;

/* Give the test hook (if any) its say before one step of a write: a nonzero
 * return is an injected errno. */
static int fault(mp_write_op op, size_t *len)
{
    if (!mp_write_fault_hook) return 0;
    int e = mp_write_fault_hook(op, len, mp_write_fault_user);
    if (e) errno = e;
    return e;
}

/* Data goes out in pieces of at most this size: a test can stop the writer
 * between any two of them. */
#define WRITE_CHUNK ((size_t)1 << 20)

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        size_t want = len < WRITE_CHUNK ? len : WRITE_CHUNK;
        if (fault(MP_WRITE_OP_WRITE, &want)) return -1;
        ssize_t w = write(fd, p, want);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

static size_t tensor_bytes(const mp_named_tensor *t)
{
    size_t n = mp_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

/* The mode a new file gets: the replaced file's, else 0666 less the umask
 * (read from /proc, since umask() cannot be read without changing it). */
static mode_t file_mode(const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0) return st.st_mode & 07777;
    unsigned mask = 022;
    FILE *f = fopen("/proc/self/status", "r");
    char line[128];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Umask: %o", &mask) == 1) break;
    if (f) fclose(f);
    return (mode_t)(0666 & ~mask);
}

mp_status mp_safetensors_write(const char *path, const mp_named_tensor *tensors, int n,
                               const char *const *meta_keys, const char *const *meta_values,
                               int n_meta)
{
    json_t *root = json_object();
    if (!root) return mp_set_error(MP_ERR_NOMEM, "safetensors: out of memory");
    if (n_meta > 0) {
        json_t *meta = json_object();
        for (int i = 0; i < n_meta; i++)
            json_object_set_new(meta, meta_keys[i], json_string(meta_values[i]));
        json_object_set_new(root, "__metadata__", meta);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const mp_named_tensor *t = &tensors[i];
        const char *dn = st_name(t->dtype);
        if (!t->name || !*t->name || !strcmp(t->name, "__metadata__") || !dn || t->ndim < 0 ||
            t->ndim > MP_MAX_DIMS || json_object_get(root, t->name)) {
            json_decref(root);
            return mp_set_error(
                MP_ERR_INVALID,
                "safetensors: tensor %d ('%s') has a bad or duplicate name, dtype or shape", i,
                t->name ? t->name : "(null)");
        }
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        uint64_t bytes = tensor_bytes(t);
        json_object_set_new(root, t->name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", dn, "shape", shape,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + bytes)));
        off += bytes;
    }
    char *hdr = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!hdr) return mp_set_error(MP_ERR_NOMEM, "safetensors: cannot encode the header");
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7; /* pad with spaces to 8 bytes */

    /* the temporary lives next to the target so that rename is atomic */
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) {
        free(hdr);
        return mp_set_error(MP_ERR_NOMEM, "safetensors: out of memory");
    }
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    int fd = fault(MP_WRITE_OP_CREATE, NULL) ? -1 : mkstemp(tmp);
    if (fd < 0) {
        mp_status s = mp_set_error(MP_ERR_IO, "cannot create a temporary file next to '%s': %s",
                                   path, strerror(errno));
        free(hdr);
        free(tmp);
        return s;
    }
    fchmod(fd, file_mode(path)); /* mkstemp makes it 0600 */
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int bad = write_all(fd, len8, 8) || write_all(fd, hdr, hlen) ||
              write_all(fd, "        ", padded - hlen);
    for (int i = 0; i < n && !bad; i++)
        bad = write_all(fd, tensors[i].data, tensor_bytes(&tensors[i]));
    int err = errno;
    free(hdr);
    if (!bad && (fault(MP_WRITE_OP_FSYNC, NULL) || fsync(fd) != 0)) bad = 1, err = errno;
    if (close(fd) != 0 && !bad) bad = 1, err = errno;
    if (!bad && (fault(MP_WRITE_OP_RENAME, NULL) || rename(tmp, path) != 0)) bad = 1, err = errno;
    if (bad) {
        unlink(tmp);
        free(tmp);
        return mp_set_error(MP_ERR_IO,
                            "cannot write '%s': %s (the previous file, if any, is unchanged)", path,
                            strerror(err));
    }
    free(tmp);
    /* make the rename itself durable */
    char *dir = strdup(path);
    char *slash = dir ? strrchr(dir, '/') : NULL;
    const char *dname = slash ? (slash == dir ? "/" : (*slash = '\0', dir)) : ".";
    int dfd = fault(MP_WRITE_OP_DIR_FSYNC, NULL) ? -1 : open(dname, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(dir);
    return MP_OK;
}

/* ----------------------------------------------------------------- read */

struct mp_safetensors {
    mp_named_tensor *tensors;
    char **names;
    int count;
    uint8_t *data; /* the whole file image (mp_region_alloc) */
    size_t data_bytes;
    uint64_t tensor_bytes; /* the data section, exactly tiled by the tensors */
    char **meta_keys, **meta_values;
    int n_meta;
};

void mp_safetensors_free(mp_safetensors *f)
{
    if (!f) return;
    for (int i = 0; i < f->count; i++) free(f->names[i]);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->names);
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_values);
    mp_region_free(f->data, f->data_bytes);
    free(f);
}

int mp_safetensors_count(const mp_safetensors *f) { return f->count; }
uint64_t mp_safetensors_data_bytes(const mp_safetensors *f) { return f->tensor_bytes; }

const mp_named_tensor *mp_safetensors_tensor(const mp_safetensors *f, int i)
{
    return i >= 0 && i < f->count ? &f->tensors[i] : NULL;
}

const mp_named_tensor *mp_safetensors_find(const mp_safetensors *f, const char *name)
{
    for (int i = 0; i < f->count; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

const char *mp_safetensors_metadata(const mp_safetensors *f, const char *key)
{
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_keys[i], key)) return f->meta_values[i];
    return NULL;
}

typedef struct {
    uint64_t begin, end;
    int index;
} range;

static int by_begin(const void *a, const void *b)
{
    const range *x = a, *y = b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

#define FAIL(code, ...)                                                                            \
    do {                                                                                           \
        s = mp_set_error(code, __VA_ARGS__);                                                       \
        goto fail;                                                                                 \
    } while (0)

/* Parse a whole file image of fsize bytes; takes ownership of buf (from
 * mp_region_alloc), which becomes the tensors' storage (freed here on
 * error). */
static mp_status parse(uint8_t *buf, uint64_t fsize, const char *path, mp_safetensors **out)
{
    *out = NULL;
    mp_status s = MP_OK;
    json_t *root = NULL;
    range *ranges = NULL;
    mp_safetensors *f = calloc(1, sizeof *f);
    if (!f) {
        mp_region_free(buf, (size_t)fsize);
        return mp_set_error(MP_ERR_NOMEM, "safetensors: out of memory");
    }
    f->data = buf;
    f->data_bytes = (size_t)fsize;
    if (fsize < 8)
        FAIL(MP_ERR_FORMAT, "'%s': too short for a safetensors header (%llu bytes)", path,
             (unsigned long long)fsize);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)buf[i] << (8 * i);
    if (hlen < 2 || hlen > MAX_HEADER || hlen > fsize - 8)
        FAIL(MP_ERR_FORMAT, "'%s': header length %llu is impossible for a file of %llu bytes", path,
             (unsigned long long)hlen, (unsigned long long)fsize);
    json_error_t je;
    root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        FAIL(MP_ERR_FORMAT, "'%s': header is not valid JSON (%s at byte %d)", path, je.text,
             je.position);
    if (!json_is_object(root)) FAIL(MP_ERR_FORMAT, "'%s': header is not a JSON object", path);
    uint64_t dsize = fsize - 8 - hlen;
    const uint8_t *data = buf + 8 + hlen;
    size_t nkeys = json_object_size(root);
    f->tensors = calloc(nkeys + 1, sizeof *f->tensors);
    f->names = calloc(nkeys + 1, sizeof *f->names);
    ranges = calloc(nkeys + 1, sizeof *ranges);
    if (!f->tensors || !f->names || !ranges) FAIL(MP_ERR_NOMEM, "safetensors: out of memory");
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(val))
                FAIL(MP_ERR_FORMAT, "'%s': __metadata__ is not an object", path);
            size_t nm = json_object_size(val);
            f->meta_keys = calloc(nm + 1, sizeof(char *));
            f->meta_values = calloc(nm + 1, sizeof(char *));
            if (!f->meta_keys || !f->meta_values) FAIL(MP_ERR_NOMEM, "safetensors: out of memory");
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv)
            {
                if (!json_is_string(mv))
                    FAIL(MP_ERR_FORMAT, "'%s': metadata '%s' is not a string", path, mk);
                f->meta_keys[f->n_meta] = strdup(mk);
                f->meta_values[f->n_meta] = strdup(json_string_value(mv));
                if (!f->meta_keys[f->n_meta] || !f->meta_values[f->n_meta])
                    FAIL(MP_ERR_NOMEM, "safetensors: out of memory");
                f->n_meta++;
            }
            continue;
        }
        mp_named_tensor *t = &f->tensors[f->count];
        json_t *dt = json_object_get(val, "dtype"), *sh = json_object_get(val, "shape"),
               *of = json_object_get(val, "data_offsets");
        if (!json_is_object(val) || !json_is_string(dt) || !json_is_array(sh) ||
            !json_is_array(of) || json_array_size(of) != 2)
            FAIL(MP_ERR_FORMAT, "'%s': tensor '%s' needs dtype, shape and data_offsets", path, key);
        bool found = false;
        for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
            if (!strcmp(json_string_value(dt), st_dtypes[i].name))
                t->dtype = st_dtypes[i].t, found = true;
        if (!found)
            FAIL(MP_ERR_FORMAT, "'%s': tensor '%s' has unsupported dtype '%s'", path, key,
                 json_string_value(dt));
        if (json_array_size(sh) > MP_MAX_DIMS)
            FAIL(MP_ERR_FORMAT, "'%s': tensor '%s' has %zu dimensions (at most %d)", path, key,
                 json_array_size(sh), MP_MAX_DIMS);
        t->ndim = (int)json_array_size(sh);
        uint64_t bytes = mp_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) {
            json_t *e = json_array_get(sh, (size_t)d);
            if (!json_is_integer(e) || json_integer_value(e) < 0)
                FAIL(MP_ERR_FORMAT, "'%s': tensor '%s' has a bad shape", path, key);
            t->shape[d] = json_integer_value(e);
            /* saturate instead of overflowing: such a tensor cannot fit anyway */
            if (t->shape[d] && bytes > UINT64_MAX / (uint64_t)t->shape[d])
                bytes = UINT64_MAX;
            else if (bytes != UINT64_MAX)
                bytes *= (uint64_t)t->shape[d];
        }
        json_t *b0 = json_array_get(of, 0), *b1 = json_array_get(of, 1);
        if (!json_is_integer(b0) || !json_is_integer(b1) || json_integer_value(b0) < 0 ||
            json_integer_value(b1) < json_integer_value(b0))
            FAIL(MP_ERR_FORMAT, "'%s': tensor '%s' has bad data_offsets", path, key);
        range *r = &ranges[f->count];
        r->begin = (uint64_t)json_integer_value(b0);
        r->end = (uint64_t)json_integer_value(b1);
        r->index = f->count;
        if (r->end > dsize)
            FAIL(MP_ERR_FORMAT, "'%s': tensor '%s' ends at byte %llu of a %llu-byte data section",
                 path, key, (unsigned long long)r->end, (unsigned long long)dsize);
        if (r->end - r->begin != bytes)
            FAIL(MP_ERR_FORMAT, "'%s': tensor '%s' has %llu bytes for a shape that needs %llu",
                 path, key, (unsigned long long)(r->end - r->begin), (unsigned long long)bytes);
        f->names[f->count] = strdup(key);
        if (!f->names[f->count]) FAIL(MP_ERR_NOMEM, "safetensors: out of memory");
        t->name = f->names[f->count];
        f->count++;
    }
    /* the tensors must tile the data section exactly: no overlap, no gap */
    qsort(ranges, (size_t)f->count, sizeof *ranges, by_begin);
    uint64_t pos = 0;
    for (int i = 0; i < f->count; i++) {
        if (ranges[i].begin != pos)
            FAIL(MP_ERR_FORMAT, "'%s': tensor '%s' %s (byte %llu, expected %llu)", path,
                 f->tensors[ranges[i].index].name,
                 ranges[i].begin < pos ? "overlaps another" : "leaves a gap",
                 (unsigned long long)ranges[i].begin, (unsigned long long)pos);
        pos = ranges[i].end;
    }
    if (pos != dsize)
        FAIL(MP_ERR_FORMAT, "'%s': %llu bytes of data after the last tensor", path,
             (unsigned long long)(dsize - pos));
    for (int i = 0; i < f->count; i++) f->tensors[ranges[i].index].data = data + ranges[i].begin;
    f->tensor_bytes = dsize;
    free(ranges);
    json_decref(root);
    *out = f;
    return MP_OK;
fail:
    free(ranges);
    json_decref(root);
    mp_safetensors_free(f);
    return s;
}

mp_status mp_safetensors_parse(const void *image, size_t len, const char *name,
                               mp_safetensors **out)
{
    *out = NULL;
    uint8_t *buf = mp_region_alloc(len);
    if (!buf) return mp_set_error(MP_ERR_NOMEM, "safetensors: out of memory");
    if (len) memcpy(buf, image, len);
    return parse(buf, len, name ? name : "(memory)", out);
}

mp_status mp_safetensors_read(const char *path, mp_safetensors **out)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mp_set_error(MP_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return mp_set_error(MP_ERR_IO, "'%s' is not a regular file", path);
    }
    size_t fsize = (size_t)st.st_size;
    /* large files land on huge pages: first touches are costly here */
    uint8_t *buf = mp_region_alloc(fsize);
    if (!buf) {
        close(fd);
        return mp_set_error(MP_ERR_NOMEM, "'%s': out of memory for %zu bytes", path, fsize);
    }
    size_t got = 0;
    while (got < fsize) {
        ssize_t r = read(fd, buf + got, fsize - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != fsize) {
        mp_region_free(buf, fsize);
        return mp_set_error(MP_ERR_IO, "'%s': cannot read its %zu bytes", path, fsize);
    }
    return parse(buf, fsize, path, out);
}

/* --------------------------------------------------------------- models */

int mp_model_param_tensors(mp_model *m, mp_named_tensor *t)
{
    int np = mp_model_num_params(m);
    for (int i = 0; i < np; i++) {
        const mp_model_param *p = mp_model_get_param(m, i);
        memset(&t[i], 0, sizeof t[i]);
        t[i].name = p->name;
        t[i].ndim = p->ndim;
        memcpy(t[i].shape, p->shape, (size_t)p->ndim * sizeof *p->shape);
        t[i].dtype = p->master ? MP_F32 : p->weight_dtype;
        t[i].data = p->master ? (const void *)p->master : p->weight;
    }
    return np;
}

mp_status mp_check_tensor(const mp_named_tensor *t, const char *path, const char *name, int ndim,
                          const int64_t *shape, int64_t want, bool nonnegative)
{
    bool same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        char have[96] = "[", need[96] = "[";
        for (int d = 0; d < t->ndim; d++)
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", d ? ", " : "",
                     (long long)t->shape[d]);
        for (int d = 0; d < ndim; d++)
            snprintf(need + strlen(need), sizeof need - strlen(need), "%s%lld", d ? ", " : "",
                     (long long)shape[d]);
        return mp_set_error(MP_ERR_FORMAT, "'%s': tensor '%s' has shape %s], the model needs %s]",
                            path, name, have, need);
    }
    /* in pieces through a small buffer: the file's data is not copied */
    float buf[1024];
    size_t es = mp_dtype_size(t->dtype);
    for (int64_t j0 = 0; j0 < want; j0 += 1024) {
        int64_t c = want - j0 < 1024 ? want - j0 : 1024;
        mp_convert(buf, MP_F32, (const uint8_t *)t->data + (size_t)j0 * es, t->dtype, (size_t)c);
        for (int64_t j = 0; j < c; j++) {
            if (!isfinite(buf[j]))
                return mp_set_error(MP_ERR_FORMAT,
                                    "'%s': tensor '%s' holds a non-finite value at element %lld",
                                    path, name, (long long)(j0 + j));
            if (nonnegative && buf[j] < 0)
                return mp_set_error(MP_ERR_FORMAT, "'%s': '%s' is negative at element %lld", path,
                                    name, (long long)(j0 + j));
        }
    }
    return MP_OK;
}

mp_status mp_model_check_weights(mp_model *m, const mp_safetensors *f, const char *path,
                                 const mp_named_tensor **found)
{
    int np = mp_model_num_params(m);
    for (int i = 0; i < np; i++) {
        const mp_model_param *p = mp_model_get_param(m, i);
        const mp_named_tensor *t = mp_safetensors_find(f, p->name);
        if (!t)
            return mp_set_error(MP_ERR_FORMAT, "'%s' has no tensor '%s' for this model", path,
                                p->name);
        mp_status s = mp_check_tensor(t, path, p->name, p->ndim, p->shape, p->n, false);
        if (s) return s;
        found[i] = t;
    }
    return MP_OK;
}

void mp_model_commit_weights(mp_model *m, const mp_named_tensor *const *found)
{
    int np = mp_model_num_params(m);
    for (int i = 0; i < np; i++) {
        mp_model_param *p = mp_model_get_param(m, i);
        if (p->master)
            mp_convert(p->master, MP_F32, found[i]->data, found[i]->dtype, (size_t)p->n);
        else /* through float32, as every copy from a master is rounded */
            for (int64_t j0 = 0; j0 < p->n; j0 += 1024) {
                float buf[1024];
                int64_t c = p->n - j0 < 1024 ? p->n - j0 : 1024;
                size_t es = mp_dtype_size(found[i]->dtype), ws = mp_dtype_size(p->weight_dtype);
                mp_convert(buf, MP_F32, (const uint8_t *)found[i]->data + (size_t)j0 * es,
                           found[i]->dtype, (size_t)c);
                mp_convert((uint8_t *)p->weight + (size_t)j0 * ws, p->weight_dtype, buf, MP_F32,
                           (size_t)c);
            }
    }
    mp_model_mark_masters_changed(m);
}

mp_status mp_model_save_weights(mp_model *m, const char *path)
{
    return mp_model_save_weights_ex(m, path, NULL, NULL, 0);
}

mp_status mp_model_save_weights_ex(mp_model *m, const char *path, const char *const *meta_keys,
                                   const char *const *meta_values, int n_meta)
{
    if (n_meta < 0 || n_meta > 60)
        return mp_set_error(MP_ERR_INVALID, "save: %d metadata entries", n_meta);
    int np = mp_model_num_params(m);
    mp_named_tensor *t = calloc((size_t)(np ? np : 1), sizeof *t);
    char *config = mp_model_config_json(m);
    if (!t || !config) {
        free(t);
        free(config);
        return mp_set_error(MP_ERR_NOMEM, "save: out of memory");
    }
    mp_model_param_tensors(m, t);
    mp_policy g = mp_model_policy(m); /* the policy it was built under */
    const char *keys[64] = {"format", "mixprec_version", "mixprec.config", "mixprec.global_policy"};
    const char *vals[64] = {"pt", MP_VERSION_STRING, config, g.name};
    for (int i = 0; i < n_meta; i++) {
        keys[4 + i] = meta_keys[i];
        vals[4 + i] = meta_values[i];
    }
    mp_status s = mp_safetensors_write(path, t, np, keys, vals, 4 + n_meta);
    free(t);
    free(config);
    return s;
}

mp_status mp_model_load_weights_from(mp_model *m, const mp_safetensors *f, const char *name)
{
    int np = mp_model_num_params(m);
    const mp_named_tensor **found = calloc((size_t)(np ? np : 1), sizeof *found);
    if (!found) return mp_set_error(MP_ERR_NOMEM, "load: out of memory");
    /* check everything first: an error leaves the model as it was */
    mp_status s = mp_model_check_weights(m, f, name, found);
    if (!s) mp_model_commit_weights(m, found);
    free(found);
    return s;
}

mp_status mp_model_load_weights(mp_model *m, const char *path)
{
    mp_safetensors *f;
    mp_status s = mp_safetensors_read(path, &f);
    if (s) return s;
    s = mp_model_load_weights_from(m, f, path);
    mp_safetensors_free(f);
    return s;
}
