/* idx.c - the IDX format of MNIST and Fashion-MNIST (plain or gzip), read
 * with every header field and the exact data length checked, and the
 * Fashion-MNIST files by name. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/io_internal.h"

/* Sane bounds: far above any real IDX file, low enough that a corrupt header
 * cannot ask for an absurd allocation or overflow a product. */
#define MAX_DIM_SIZE 0x7FFFFFFFll
#define MAX_BYTES ((int64_t)1 << 34)

static const char *idx_type_name(unsigned t)
{
    switch (t) {
    case 0x08:
        return "unsigned byte";
    case 0x09:
        return "signed byte";
    case 0x0B:
        return "int16";
    case 0x0C:
        return "int32";
    case 0x0D:
        return "float32";
    case 0x0E:
        return "float64";
    }
    return "unknown type";
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* The rest of the stream must be empty: count what is left so the message
 * says how much garbage there is. */
static mp_status expect_end(gzFile f, const char *path, int64_t expected)
{
    unsigned char buf[1 << 14];
    uint64_t extra = 0;
    for (;;) {
        size_t got;
        mp_status s = mp_gz_read(f, path, buf, sizeof buf, &got);
        if (s) return s;
        extra += got;
        if (got < sizeof buf) break;
    }
    if (extra)
        return mp_set_error(MP_ERR_FORMAT,
                            "%s: %llu trailing bytes after the %lld data bytes the IDX header "
                            "announces",
                            path, (unsigned long long)extra, (long long)expected);
    return MP_OK;
}

static mp_status read_header(gzFile f, const char *path, mp_idx *out)
{
    unsigned char magic[4];
    size_t got;
    mp_status s = mp_gz_read(f, path, magic, 4, &got);
    if (s) return s;
    if (got < 4)
        return mp_set_error(MP_ERR_FORMAT,
                            "%s: truncated IDX header: expected at least 4 bytes, file has %zu",
                            path, got);
    if (magic[0] != 0 || magic[1] != 0)
        return mp_set_error(MP_ERR_FORMAT,
                            "%s: not an IDX file: wrong magic %02x %02x %02x %02x (expected 00 "
                            "00 08 <dims>, e.g. 0x00000803 for images, 0x00000801 for labels)",
                            path, magic[0], magic[1], magic[2], magic[3]);
    if (magic[2] != 0x08)
        return mp_set_error(MP_ERR_UNSUPPORTED,
                            "%s: IDX element type 0x%02x (%s) is not supported; only unsigned "
                            "bytes (0x08) are",
                            path, magic[2], idx_type_name(magic[2]));
    int ndim = magic[3];
    if (ndim < 1 || ndim > MP_MAX_DIMS)
        return mp_set_error(MP_ERR_FORMAT,
                            "%s: IDX header declares %d dimensions; expected 1 to %d", path, ndim,
                            MP_MAX_DIMS);
    unsigned char dims[4 * MP_MAX_DIMS];
    size_t want = 4 * (size_t)ndim;
    s = mp_gz_read(f, path, dims, want, &got);
    if (s) return s;
    if (got < want)
        return mp_set_error(MP_ERR_FORMAT,
                            "%s: truncated IDX header: expected %zu bytes of dimensions, file has "
                            "%zu",
                            path, want, got);
    int64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        int64_t d = be32(dims + 4 * i);
        if (d == 0) return mp_set_error(MP_ERR_FORMAT, "%s: IDX dimension %d is zero", path, i);
        if (d > MAX_DIM_SIZE)
            return mp_set_error(MP_ERR_FORMAT, "%s: IDX dimension %d is %lld, beyond 2^31-1", path,
                                i, (long long)d);
        if (d > MAX_BYTES / count) /* divide first: the product may not fit */
            return mp_set_error(MP_ERR_FORMAT,
                                "%s: IDX dimensions describe more than 2^34 bytes of data", path);
        count *= d;
        out->dims[i] = d;
    }
    out->ndim = ndim;
    out->count = count;
    return MP_OK;
}

/* The data the header announces into out->data, read as it arrives
 * (mp_gz_read_upto): a short file whose header announces up to 2^34 bytes
 * is refused without that allocation. */
static mp_status read_data(gzFile f, const char *path, mp_idx *out)
{
    const size_t want = (size_t)out->count;
    char *buf;
    size_t have;
    mp_status s = mp_gz_read_upto(f, path, want, &buf, &have);
    if (s) return s;
    if (have < want) {
        free(buf);
        return mp_set_error(MP_ERR_FORMAT,
                            "%s: truncated IDX data: the header announces %zu bytes, the file "
                            "holds %zu",
                            path, want, have);
    }
    out->data = (uint8_t *)buf;
    return MP_OK;
}

mp_status mp_idx_read(const char *path, mp_idx *out)
{
    if (!out) return mp_set_error(MP_ERR_INVALID, "mp_idx_read: out is NULL");
    memset(out, 0, sizeof *out);
    gzFile f;
    mp_status s = mp_gz_open(path, &f);
    if (s) return s;
    mp_idx a;
    memset(&a, 0, sizeof a);
    s = read_header(f, path, &a);
    if (!s) s = read_data(f, path, &a);
    if (!s) s = expect_end(f, path, a.count);
    gzclose(f);
    if (s) {
        free(a.data);
        return s;
    }
    *out = a;
    return MP_OK;
}

void mp_idx_release(mp_idx *idx)
{
    if (!idx) return;
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}

/* fashion: the images must be [n, 28, 28], the labels below 10, and the
 * dataset has 10 classes even if a subset lacks the last ones. */
static mp_status load_pair(const char *images_path, const char *labels_path, bool fashion,
                           mp_dataset **out)
{
    mp_idx im, lb;
    mp_status s = mp_idx_read(images_path, &im);
    if (s) return s;
    s = mp_idx_read(labels_path, &lb);
    if (s) {
        mp_idx_release(&im);
        return s;
    }
    if (im.ndim < 2)
        s = mp_set_error(MP_ERR_FORMAT,
                         "%s: images need at least 2 dimensions [n, ...], the file has %d",
                         images_path, im.ndim);
    else if (lb.ndim != 1)
        s = mp_set_error(MP_ERR_FORMAT, "%s: labels need 1 dimension [n], the file has %d",
                         labels_path, lb.ndim);
    else if (im.dims[0] != lb.dims[0])
        s = mp_set_error(MP_ERR_FORMAT, "%s holds %lld images but %s holds %lld labels",
                         images_path, (long long)im.dims[0], labels_path, (long long)lb.dims[0]);
    else if (fashion && (im.ndim != 3 || im.dims[1] != 28 || im.dims[2] != 28))
        s = mp_set_error(MP_ERR_FORMAT,
                         "%s: not Fashion-MNIST: images must be [n, 28, 28], the file has %d "
                         "dimensions [%lld, %lld, ...]",
                         images_path, im.ndim, (long long)im.dims[0], (long long)im.dims[1]);
    for (int64_t i = 0; !s && fashion && i < lb.count; i++)
        if (lb.data[i] > 9)
            s = mp_set_error(MP_ERR_FORMAT,
                             "%s: not Fashion-MNIST: label %d of sample %lld is not in 0..9",
                             labels_path, lb.data[i], (long long)i);
    if (s) {
        mp_idx_release(&im);
        mp_idx_release(&lb);
        return s;
    }
    int64_t n = im.dims[0], dim = im.count / n;
    float *x = mp_alloc((size_t)im.count * sizeof(float), MP_MEM_OTHER);
    int32_t *y = mp_alloc((size_t)n * sizeof(int32_t), MP_MEM_OTHER);
    if (!x || !y) {
        mp_free(x);
        mp_free(y);
        mp_idx_release(&im);
        mp_idx_release(&lb);
        return mp_set_error(MP_ERR_NOMEM, "%s: out of memory for %lld images", images_path,
                            (long long)n);
    }
    /* x / 255.0f is the correctly rounded quotient, as numpy's float32
     * division gives; a table keeps it out of the inner loop. */
    float scale[256];
    for (int i = 0; i < 256; i++) scale[i] = (float)i / 255.0f;
    for (int64_t i = 0; i < im.count; i++) x[i] = scale[im.data[i]];
    int32_t maxl = 0;
    for (int64_t i = 0; i < n; i++) {
        y[i] = lb.data[i];
        if (y[i] > maxl) maxl = y[i];
    }
    mp_idx_release(&im);
    mp_idx_release(&lb);
    return mp_dataset_adopt(x, y, n, dim, fashion ? 10 : maxl + 1, out);
}

mp_status mp_dataset_load_idx(const char *images_path, const char *labels_path, mp_dataset **out)
{
    if (!out) return mp_set_error(MP_ERR_INVALID, "mp_dataset_load_idx: out is NULL");
    *out = NULL;
    return load_pair(images_path, labels_path, false, out);
}

const char *mp_fashion_mnist_dir(const char *dir)
{
    if (dir && *dir) return dir;
    const char *env = getenv(MP_FASHION_MNIST_ENV);
    if (env && *env) return env;
    return MP_FASHION_MNIST_DEFAULT_DIR;
}

#define INSTALL_HINT                                                                               \
    "install Debian's package with `apt-get install dataset-fashion-mnist`, or "                   \
    "set " MP_FASHION_MNIST_ENV " to a directory holding the files"

mp_status mp_dataset_load_fashion_mnist(const char *dir, bool train, mp_dataset **out)
{
    if (!out) return mp_set_error(MP_ERR_INVALID, "mp_dataset_load_fashion_mnist: out is NULL");
    *out = NULL;
    const char *d = mp_fashion_mnist_dir(dir);
    struct stat st;
    if (stat(d, &st) != 0 || !S_ISDIR(st.st_mode))
        return mp_set_error(MP_ERR_IO, "Fashion-MNIST directory %s not found; %s", d, INSTALL_HINT);
    const char *prefix = train ? "train" : "t10k";
    char images[4096], labels[4096];
    int a = snprintf(images, sizeof images, "%s/%s-images-idx3-ubyte.gz", d, prefix);
    int b = snprintf(labels, sizeof labels, "%s/%s-labels-idx1-ubyte.gz", d, prefix);
    if (a < 0 || b < 0 || (size_t)a >= sizeof images || (size_t)b >= sizeof labels)
        return mp_set_error(MP_ERR_INVALID, "Fashion-MNIST directory name is too long: %s", d);
    const char *paths[2] = {images, labels};
    for (int i = 0; i < 2; i++) {
        if (stat(paths[i], &st) != 0)
            return mp_set_error(MP_ERR_IO, "Fashion-MNIST file %s is missing (%s); %s", paths[i],
                                strerror(errno), INSTALL_HINT);
    }
    return load_pair(images, labels, true, out);
}
