/* test_data.c - the dataset loaders on valid and corrupt IDX (plain and
 * gzip) and CSV files with their messages checked, the Keras validation
 * split, per-epoch orders and batches, and real Fashion-MNIST when the
 * Debian package is installed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common.h"
#include "io/io_internal.h"

/* Every test writes into one temporary directory, removed at the end. */
static char tmpdir[64];
static char made[256][128];
static int nmade;

static const char *tpath(const char *name)
{
    static char buf[4][192];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, sizeof buf[0], "%s/%s", tmpdir, name);
    return p;
}

static void remember(const char *path)
{
    for (int i = 0; i < nmade; i++)
        if (!strcmp(made[i], path)) return;
    if (nmade < 256) snprintf(made[nmade++], sizeof made[0], "%s", path);
}

static const char *write_file(const char *name, const void *data, size_t len, bool gz)
{
    const char *p = tpath(name);
    remember(p);
    if (gz) {
        gzFile f = gzopen(p, "wb");
        assert_non_null(f);
        if (len) assert_int_equal(gzwrite(f, data, (unsigned)len), (int)len);
        assert_int_equal(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(p, "wb");
        assert_non_null(f);
        if (len) assert_int_equal(fwrite(data, 1, len, f), len);
        assert_int_equal(fclose(f), 0);
    }
    return p;
}

static unsigned char *read_raw(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void expect_error(mp_status got, mp_status want, const char *substr)
{
    if (got != want)
        fail_msg("status %s, expected %s (message: %s)", mp_status_name(got), mp_status_name(want),
                 mp_last_error());
    if (!strstr(mp_last_error(), substr))
        fail_msg("message '%s' lacks '%s'", mp_last_error(), substr);
}

/* An IDX file image: magic 00 00 type ndim, big-endian dims, payload. */
static unsigned char *idx_bytes(unsigned type, int ndim, const uint32_t *dims, const uint8_t *data,
                                size_t ndata, size_t *len)
{
    *len = 4 + 4 * (size_t)ndim + ndata;
    unsigned char *b = malloc(*len);
    b[0] = 0;
    b[1] = 0;
    b[2] = (unsigned char)type;
    b[3] = (unsigned char)ndim;
    for (int i = 0; i < ndim; i++) {
        b[4 + 4 * i] = (unsigned char)(dims[i] >> 24);
        b[5 + 4 * i] = (unsigned char)(dims[i] >> 16);
        b[6 + 4 * i] = (unsigned char)(dims[i] >> 8);
        b[7 + 4 * i] = (unsigned char)dims[i];
    }
    if (ndata) memcpy(b + 4 + 4 * ndim, data, ndata);
    return b;
}

static const char *write_idx(const char *name, unsigned type, int ndim, const uint32_t *dims,
                             const uint8_t *data, size_t ndata, bool gz)
{
    size_t len;
    unsigned char *b = idx_bytes(type, ndim, dims, data, ndata, &len);
    const char *p = write_file(name, b, len, gz);
    free(b);
    return p;
}

static uint8_t *random_bytes(size_t n, uint64_t seed, unsigned mod)
{
    test_rng r = {seed};
    uint8_t *b = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(test_rng_u32(&r) % mod);
    return b;
}

/* ------------------------------------------------------------------ IDX */

static void test_idx_valid_plain_and_gzip(void **state)
{
    (void)state;
    enum { N = 5, R = 3, C = 2 };
    uint8_t *px = random_bytes(N * R * C, 1, 256);
    px[0] = 0;
    px[1] = 255;
    uint8_t lab[N] = {0, 3, 1, 3, 2};
    uint32_t idims[3] = {N, R, C}, ldims[1] = {N};
    for (int gz = 0; gz < 2; gz++) {
        const char *ip = write_idx(gz ? "im.gz" : "im", 0x08, 3, idims, px, N * R * C, gz);
        const char *lp = write_idx(gz ? "lb.gz" : "lb", 0x08, 1, ldims, lab, N, gz);
        mp_idx a;
        assert_int_equal(mp_idx_read(ip, &a), MP_OK);
        assert_int_equal(a.ndim, 3);
        assert_int_equal(a.dims[0], N);
        assert_int_equal(a.dims[2], C);
        assert_int_equal(a.count, N * R * C);
        assert_memory_equal(a.data, px, N * R * C);
        mp_idx_release(&a);
        assert_null(a.data);

        mp_dataset *ds;
        assert_int_equal(mp_dataset_load_idx(ip, lp, &ds), MP_OK);
        assert_int_equal(mp_dataset_count(ds), N);
        assert_int_equal(mp_dataset_dim(ds), R * C);
        assert_int_equal(mp_dataset_classes(ds), 4);
        const float *x = mp_dataset_features(ds);
        for (int i = 0; i < N * R * C; i++) assert_true(x[i] == (float)px[i] / 255.0f);
        assert_true(x[0] == 0.0f && x[1] == 1.0f);
        assert_memory_equal(mp_dataset_labels(ds), ((int32_t[]){0, 3, 1, 3, 2}),
                            sizeof(int32_t) * N);
        mp_dataset_free(ds);
    }
    free(px);
}

static void test_idx_bad_headers(void **state)
{
    (void)state;
    uint8_t d[6] = {1, 2, 3, 4, 5, 6};
    uint32_t dims[3] = {1, 2, 3};
    mp_idx a;
    size_t len;
    unsigned char *b = idx_bytes(0x08, 3, dims, d, 6, &len);
    b[0] = 1; /* wrong magic */
    const char *p = write_file("magic", b, len, false);
    expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "wrong magic 01 00 08 03");
    assert_null(a.data);
    assert_non_null(strstr(mp_last_error(), p));
    free(b);

    p = write_idx("float", 0x0D, 3, dims, d, 6, false);
    expect_error(mp_idx_read(p, &a), MP_ERR_UNSUPPORTED, "0x0d (float32) is not supported");
    p = write_idx("ndim0", 0x08, 0, dims, d, 6, false);
    expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "declares 0 dimensions");
    p = write_idx("ndim9", 0x08, 9, (uint32_t[9]){1, 1, 1, 1, 1, 1, 1, 1, 1}, d, 1, false);
    expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "declares 9 dimensions");
    p = write_idx("zero", 0x08, 3, (uint32_t[]){2, 0, 3}, d, 0, false);
    expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "dimension 1 is zero");
    p = write_idx("huge", 0x08, 2, (uint32_t[]){0xFFFFFFFFu, 1}, d, 0, false);
    expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "dimension 0 is 4294967295");
    /* Each dimension is fine alone; the product would overflow 64 bits. */
    p = write_idx("product", 0x08, 3, (uint32_t[]){0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF}, d, 0,
                  false);
    expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "more than 2^34 bytes");
    p = write_idx("product2", 0x08, 3, (uint32_t[]){0x7FFFFFFF, 8, 0x7FFFFFFF}, d, 0, false);
    expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "more than 2^34 bytes");
    p = write_file("short", "\0\0\x08", 3, false);
    expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "truncated IDX header");
    p = write_file("shortdims", "\0\0\x08\x03\0\0\0\x01", 8, true);
    expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "expected 12 bytes of dimensions, file has 4");
    p = write_file("empty", "", 0, false);
    expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "file has 0");
    expect_error(mp_idx_read(tpath("no-such-file"), &a), MP_ERR_IO, "no-such-file: cannot open");
    expect_error(mp_idx_read(tmpdir, &a), MP_ERR_IO, "is a directory");
}

static void test_idx_length_checks(void **state)
{
    (void)state;
    uint8_t *d = random_bytes(40, 2, 256);
    mp_idx a;
    for (int gz = 0; gz < 2; gz++) {
        /* dims 5x3x2 = 30 bytes announced */
        const char *p = write_idx("trunc", 0x08, 3, (uint32_t[]){5, 3, 2}, d, 29, gz);
        expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT,
                     "truncated IDX data: the header announces 30 bytes, the file holds 29");
        assert_non_null(strstr(mp_last_error(), "trunc"));
        p = write_idx("trail", 0x08, 3, (uint32_t[]){5, 3, 2}, d, 33, gz);
        expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "3 trailing bytes after the 30");
        /* dims that disagree with the payload, in both directions */
        p = write_idx("dimsmall", 0x08, 3, (uint32_t[]){4, 3, 2}, d, 30, gz);
        expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "6 trailing bytes after the 24");
        p = write_idx("dimbig", 0x08, 3, (uint32_t[]){6, 3, 2}, d, 30, gz);
        expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "announces 36 bytes, the file holds 30");
        p = write_idx("exact", 0x08, 3, (uint32_t[]){5, 3, 2}, d, 30, gz);
        assert_int_equal(mp_idx_read(p, &a), MP_OK);
        mp_idx_release(&a);
    }
    free(d);
}

static void test_idx_count_mismatch_and_shapes(void **state)
{
    (void)state;
    uint8_t *d = random_bytes(30, 3, 10);
    mp_dataset *ds = (mp_dataset *)1;
    const char *ip = write_idx("cm_im", 0x08, 3, (uint32_t[]){5, 3, 2}, d, 30, false);
    const char *lp = write_idx("cm_lb", 0x08, 1, (uint32_t[]){4}, d, 4, false);
    expect_error(mp_dataset_load_idx(ip, lp, &ds), MP_ERR_FORMAT, "holds 5 images but");
    assert_non_null(strstr(mp_last_error(), "holds 4 labels"));
    assert_null(ds);
    lp = write_idx("cm_lb2", 0x08, 2, (uint32_t[]){5, 1}, d, 5, false);
    expect_error(mp_dataset_load_idx(ip, lp, &ds), MP_ERR_FORMAT, "labels need 1 dimension");
    expect_error(mp_dataset_load_idx(lp, ip, &ds), MP_ERR_FORMAT, "labels need 1 dimension");
    const char *one = write_idx("cm_1d", 0x08, 1, (uint32_t[]){5}, d, 5, false);
    expect_error(mp_dataset_load_idx(one, one, &ds), MP_ERR_FORMAT,
                 "images need at least 2 dimensions");
    expect_error(mp_dataset_load_idx(ip, tpath("cm_missing"), &ds), MP_ERR_IO, "cm_missing");
    free(d);
}

/* Corrupt a gzip file in the ways disks and downloads do. */
static void test_idx_gzip_corruption(void **state)
{
    (void)state;
    enum { N = 50 };
    uint8_t *d = random_bytes(N * 28 * 28, 4, 256);
    const char *good = write_idx("gz_good.gz", 0x08, 3, (uint32_t[]){N, 28, 28}, d, N * 784, true);
    size_t len;
    unsigned char *raw = read_raw(good, &len);
    assert_true(len > 1000);
    mp_idx a;

    unsigned char *b = malloc(len);
    memcpy(b, raw, len);
    for (size_t i = len / 2; i < len / 2 + 4; i++) b[i] ^= 0x5A;
    const char *p = write_file("gz_flip.gz", b, len, false);
    expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "gz_flip.gz: corrupt gzip data");
    assert_null(a.data);

    memcpy(b, raw, len);
    b[len - 6] ^= 1; /* CRC-32 of the trailer */
    p = write_file("gz_crc.gz", b, len, false);
    expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "incorrect data check");

    memcpy(b, raw, len);
    b[len - 2] ^= 1; /* ISIZE of the trailer */
    p = write_file("gz_isize.gz", b, len, false);
    expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "incorrect length check");

    p = write_file("gz_half.gz", raw, len / 2, false);
    expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "gz_half.gz: gzip stream is truncated");
    p = write_file("gz_notrailer.gz", raw, len - 4, false);
    expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "gzip stream is truncated");
    p = write_file("gz_header.gz", raw, 12, false);
    expect_error(mp_idx_read(p, &a), MP_ERR_FORMAT, "gzip stream is truncated");

    /* Every prefix and many single-byte flips must fail cleanly or, for a
     * flip zlib cannot notice, succeed with the exact announced size. */
    test_rng r = {5};
    for (int t = 0; t < 60; t++) {
        memcpy(b, raw, len);
        size_t cut = (size_t)(test_rng_u32(&r) % len);
        if (t & 1) {
            b[cut] ^= (unsigned char)(1 + test_rng_u32(&r) % 255);
            p = write_file("gz_fuzz.gz", b, len, false);
        } else {
            p = write_file("gz_fuzz.gz", b, cut, false);
        }
        mp_status s = mp_idx_read(p, &a);
        if (s == MP_OK) {
            assert_int_equal(a.count, N * 784);
            mp_idx_release(&a);
        } else {
            assert_null(a.data);
            assert_non_null(strstr(mp_last_error(), "gz_fuzz.gz"));
        }
    }
    free(b);
    free(raw);
    free(d);
}

/* --------------------------------------------------------- Fashion-MNIST */

static void write_fashion(const char *sub, const char *prefix, int n, int rows, int maxlab)
{
    char name[128];
    uint8_t *px = random_bytes((size_t)n * (size_t)rows * 28, 6, 256);
    uint8_t *lb = random_bytes((size_t)n, 7, (unsigned)maxlab + 1);
    snprintf(name, sizeof name, "%s/%s-images-idx3-ubyte.gz", sub, prefix);
    write_idx(name, 0x08, 3, (uint32_t[]){(uint32_t)n, (uint32_t)rows, 28}, px,
              (size_t)n * (size_t)rows * 28, true);
    snprintf(name, sizeof name, "%s/%s-labels-idx1-ubyte.gz", sub, prefix);
    write_idx(name, 0x08, 1, (uint32_t[]){(uint32_t)n}, lb, (size_t)n, true);
    free(px);
    free(lb);
}

static void test_fashion_by_name(void **state)
{
    (void)state;
    const char *dirs[3] = {"fm", "fm_bad", "fm_lab"};
    for (int i = 0; i < 3; i++) {
        const char *p = tpath(dirs[i]);
        assert_int_equal(mkdir(p, 0700), 0);
    }
    write_fashion("fm", "train", 7, 28, 3); /* labels 0..3: classes still 10 */
    write_fashion("fm", "t10k", 3, 28, 9);
    write_fashion("fm_bad", "train", 4, 27, 9);
    write_fashion("fm_lab", "train", 4, 28, 200);
    char fm[192];
    snprintf(fm, sizeof fm, "%s", tpath("fm"));

    mp_dataset *ds;
    assert_int_equal(mp_dataset_load_fashion_mnist(fm, true, &ds), MP_OK);
    assert_int_equal(mp_dataset_count(ds), 7);
    assert_int_equal(mp_dataset_dim(ds), 784);
    assert_int_equal(mp_dataset_classes(ds), 10);
    mp_dataset_free(ds);

    /* The environment variable stands in for a NULL directory. */
    char *old = getenv(MP_FASHION_MNIST_ENV) ? strdup(getenv(MP_FASHION_MNIST_ENV)) : NULL;
    setenv(MP_FASHION_MNIST_ENV, fm, 1);
    assert_string_equal(mp_fashion_mnist_dir(NULL), fm);
    assert_string_equal(mp_fashion_mnist_dir("/x"), "/x");
    assert_int_equal(mp_dataset_load_fashion_mnist(NULL, false, &ds), MP_OK);
    assert_int_equal(mp_dataset_count(ds), 3);
    mp_dataset_free(ds);
    unsetenv(MP_FASHION_MNIST_ENV);
    assert_string_equal(mp_fashion_mnist_dir(""), MP_FASHION_MNIST_DEFAULT_DIR);
    if (old) setenv(MP_FASHION_MNIST_ENV, old, 1);
    free(old);

    expect_error(mp_dataset_load_fashion_mnist(tpath("fm_none"), true, &ds), MP_ERR_IO,
                 "apt-get install dataset-fashion-mnist");
    assert_non_null(strstr(mp_last_error(), "fm_none"));
    expect_error(mp_dataset_load_fashion_mnist(tpath("fm_bad"), false, &ds), MP_ERR_IO,
                 "t10k-images-idx3-ubyte.gz is missing");
    assert_non_null(strstr(mp_last_error(), "apt-get install dataset-fashion-mnist"));
    expect_error(mp_dataset_load_fashion_mnist(tpath("fm_bad"), true, &ds), MP_ERR_FORMAT,
                 "must be [n, 28, 28]");
    expect_error(mp_dataset_load_fashion_mnist(tpath("fm_lab"), true, &ds), MP_ERR_FORMAT,
                 "is not in 0..9");
}

static void test_fashion_real(void **state)
{
    (void)state;
    struct stat st;
    if (stat(MP_FASHION_MNIST_DEFAULT_DIR "/train-images-idx3-ubyte.gz", &st) != 0) {
        print_message("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)\n");
        skip();
    }
    const int64_t want[2] = {10000, 60000};
    for (int train = 0; train < 2; train++) {
        mp_dataset *ds;
        mp_status s = mp_dataset_load_fashion_mnist(MP_FASHION_MNIST_DEFAULT_DIR, train, &ds);
        if (s) fail_msg("%s", mp_last_error());
        int64_t n = mp_dataset_count(ds);
        assert_int_equal(n, want[train]);
        assert_int_equal(mp_dataset_dim(ds), 784);
        assert_int_equal(mp_dataset_classes(ds), 10);
        const float *x = mp_dataset_features(ds);
        float lo = 1, hi = 0;
        for (int64_t i = 0; i < n * 784; i++) {
            if (x[i] < lo) lo = x[i];
            if (x[i] > hi) hi = x[i];
        }
        assert_true(lo == 0.0f && hi == 1.0f);
        int64_t hist[10] = {0};
        const int32_t *y = mp_dataset_labels(ds);
        for (int64_t i = 0; i < n; i++) hist[y[i]]++;
        for (int c = 0; c < 10; c++) assert_int_equal(hist[c], n / 10);
        mp_dataset_free(ds);
    }
}

/* The growing read under the loaders: a file across several doublings of
 * the buffer (64 KiB, 128 KiB, then the limit), plain and gzip, exactly at
 * the limit, one byte over it, and a stream read up to a bound. */
static void test_gz_read(void **state)
{
    (void)state;
    enum { N = 200003 };
    char *b = malloc(N);
    assert_non_null(b);
    for (int i = 0; i < N; i++) b[i] = (char)(i * 7 + i / 251);
    for (int gz = 0; gz < 2; gz++) {
        const char *p = write_file(gz ? "big.gz" : "big", b, N, gz);
        char *d;
        size_t n;
        assert_int_equal(mp_gz_read_all(p, N, &d, &n), MP_OK);
        assert_int_equal(n, N);
        assert_memory_equal(d, b, N);
        assert_int_equal(d[N], '\0');
        free(d);
        assert_int_equal(mp_gz_read_all(p, (size_t)N + 5, &d, &n), MP_OK);
        assert_int_equal(n, N);
        free(d);
        expect_error(mp_gz_read_all(p, N - 1, &d, &n), MP_ERR_FORMAT,
                     "larger than the 200002-byte limit");
        assert_null(d);
        gzFile f;
        assert_int_equal(mp_gz_open(p, &f), MP_OK);
        assert_int_equal(mp_gz_read_upto(f, p, 150000, &d, &n), MP_OK);
        assert_int_equal(n, 150000);
        assert_memory_equal(d, b, 150000);
        free(d);
        gzclose(f);
    }
    free(b);
}

/* ------------------------------------------------------------------- CSV */

static mp_dataset *csv_ok(const char *name, const char *text, const mp_csv_options *o)
{
    const char *p = write_file(name, text, strlen(text), false);
    mp_dataset *ds = NULL;
    mp_status s = mp_dataset_load_csv(p, o, &ds);
    if (s) fail_msg("%s: %s", name, mp_last_error());
    return ds;
}

static void csv_bad(const char *text, const mp_csv_options *o, mp_status want, const char *substr)
{
    const char *p = write_file("bad.csv", text, strlen(text), false);
    mp_dataset *ds = (mp_dataset *)1;
    expect_error(mp_dataset_load_csv(p, o, &ds), want, substr);
    assert_null(ds);
    assert_non_null(strstr(mp_last_error(), "bad.csv"));
}

static void test_csv_valid(void **state)
{
    (void)state;
    /* header detected, CRLF, blanks, quotes, trailing blank lines */
    mp_dataset *ds =
        csv_ok("h.csv", "x1, \"x,2\" ,label\r\n1, 2.5 ,0\r\n\n-3e-1,\"4\",2\r\n\r\n\n", NULL);
    assert_int_equal(mp_dataset_count(ds), 2);
    assert_int_equal(mp_dataset_dim(ds), 2);
    assert_int_equal(mp_dataset_classes(ds), 3);
    assert_memory_equal(mp_dataset_features(ds), ((float[]){1, 2.5f, -0.3f, 4}), 16);
    assert_memory_equal(mp_dataset_labels(ds), ((int32_t[]){0, 2}), 8);
    mp_dataset_free(ds);

    /* no header, no final newline, label first given as 0 and as -3 */
    mp_csv_options o = mp_csv_options_default();
    for (int k = 0; k < 2; k++) {
        o.label_column = k ? -3 : 0;
        ds = csv_ok("nh.csv", "1,0.5,0.25\n4.0,1,2", &o);
        assert_int_equal(mp_dataset_count(ds), 2);
        assert_int_equal(mp_dataset_classes(ds), 5);
        assert_memory_equal(mp_dataset_features(ds), ((float[]){0.5f, 0.25f, 1, 2}), 16);
        assert_memory_equal(mp_dataset_labels(ds), ((int32_t[]){1, 4}), 8);
        mp_dataset_free(ds);
    }
    /* a middle label column; an all-numeric header needs the option */
    o = mp_csv_options_default();
    o.label_column = 1;
    o.header = MP_CSV_HEADER_PRESENT;
    ds = csv_ok("mid.csv", "0,1,2\n7,1,8\n", &o);
    assert_int_equal(mp_dataset_count(ds), 1);
    assert_memory_equal(mp_dataset_features(ds), ((float[]){7, 8}), 8);
    mp_dataset_free(ds);
    o.header = MP_CSV_HEADER_NONE;
    ds = csv_ok("mid.csv", "0,1,2\n7,1,8\n", &o);
    assert_int_equal(mp_dataset_count(ds), 2);
    mp_dataset_free(ds);
    /* other separator; gzip */
    o = mp_csv_options_default();
    o.separator = ';';
    ds = csv_ok("semi.csv", "a;b\n1.5;1\n", &o);
    assert_int_equal(mp_dataset_dim(ds), 1);
    mp_dataset_free(ds);
    const char *t = "f,l\n1,1\n2,0\n3,1\n";
    const char *p = write_file("z.csv.gz", t, strlen(t), true);
    assert_int_equal(mp_dataset_load_csv(p, NULL, &ds), MP_OK);
    assert_int_equal(mp_dataset_count(ds), 3);
    mp_dataset_free(ds);
}

/* The loader sizes its buffers by the rows the file can hold, not by its
 * line count: a row of nf fields takes nf bytes at least, so the features
 * and labels take 4 (len / nf + 1) nf bytes at most, and the file's text
 * len more: under 8 len in all. One 512-field line over 100000 blank lines
 * (100 KiB) asked for 204 MB before. */
static void test_csv_memory_bound(void **state)
{
    (void)state;
    enum { NF = 512, BLANK = 100000 };
    char *t = malloc(2 * NF + BLANK + 1);
    assert_non_null(t);
    size_t len = 0;
    for (int i = 0; i < NF; i++) {
        t[len++] = i == NF - 1 ? '1' : '0';
        t[len++] = i == NF - 1 ? '\n' : ',';
    }
    memset(t + len, '\n', BLANK);
    len += BLANK;
    t[len] = '\0';
    mp_mem_stats before, after;
    mp_mem_reset_peaks();
    mp_mem_get_stats(&before);
    mp_dataset *ds = csv_ok("wide.csv", t, NULL);
    mp_mem_get_stats(&after);
    assert_int_equal(mp_dataset_count(ds), 1);
    assert_int_equal(mp_dataset_dim(ds), NF - 1);
    mp_dataset_free(ds);
    free(t);
    assert_true(after.total_peak - before.total_current < 8 * len);
}

static void test_csv_invalid(void **state)
{
    (void)state;
    csv_bad("a,b,c\n1,2,0\n1,x7,1\n", NULL, MP_ERR_FORMAT,
            "line 3, column 2: 'x7' is not a number");
    csv_bad("1,2,0\n\n1,2\n", NULL, MP_ERR_FORMAT, "line 3 has 2 fields, expected 3");
    csv_bad("1,2,0\n1,2,3,4\n", NULL, MP_ERR_FORMAT, "line 2 has 4 fields, expected 3");
    csv_bad("1,2,0\n1,nan,1\n", NULL, MP_ERR_FORMAT, "line 2, column 2: NaN feature value");
    csv_bad("NaN,2,0\n", NULL, MP_ERR_FORMAT, "line 1, column 1: NaN");
    csv_bad("1,2,0\n-inf,2,1\n", NULL, MP_ERR_FORMAT, "line 2, column 1: value '-inf' is infinite");
    csv_bad("1,1e39,0\n", NULL, MP_ERR_FORMAT, "beyond float32 range");
    csv_bad("1,2,-1\n", NULL, MP_ERR_FORMAT, "line 1, column 3: label '-1' is not a non-negative");
    csv_bad("1,2,0\n1,2,1.5\n", NULL, MP_ERR_FORMAT, "line 2, column 3: label '1.5'");
    csv_bad("1,2,0\n1,2,nan\n", NULL, MP_ERR_FORMAT, "NaN label value");
    csv_bad("1,2,0\n1,2,1e9\n", NULL, MP_ERR_FORMAT, "label '1e9'");
    csv_bad("1,,0\n", NULL, MP_ERR_FORMAT, "line 1, column 2: empty feature field");
    csv_bad("h1,h2\n", NULL, MP_ERR_FORMAT, "no data rows after the header");
    csv_bad("\n\n", NULL, MP_ERR_FORMAT, "no data rows");
    csv_bad("1\n2\n", NULL, MP_ERR_FORMAT, "at least one feature and a label");
    csv_bad("1,\"2,0\n", NULL, MP_ERR_FORMAT, "line 1: unterminated double quote");
    mp_csv_options o = mp_csv_options_default();
    o.label_column = 3;
    csv_bad("1,2,0\n", &o, MP_ERR_INVALID, "label column 3 is outside the 3 columns");
    o.label_column = -4;
    csv_bad("1,2,0\n", &o, MP_ERR_INVALID, "label column -4");
    o = mp_csv_options_default();
    o.header = (mp_csv_header)7;
    mp_dataset *ds;
    expect_error(mp_dataset_load_csv(tpath("x.csv"), &o, &ds), MP_ERR_INVALID, "header mode");
    expect_error(mp_dataset_load_csv(tpath("none.csv"), NULL, &ds), MP_ERR_IO, "none.csv");
    char big[400] = "5,0\n"; /* a first data line, so the long one is not a header */
    memset(big + 4, '1', sizeof big - 4);
    memcpy(big + 390, ",0\n", 4);
    csv_bad(big, NULL, MP_ERR_FORMAT, "too long to be a number");
}

/* --------------------------------------------------------------- dataset */

static mp_dataset *ramp(int64_t n, int64_t dim)
{
    float *x = malloc((size_t)(n * dim) * sizeof(float));
    int32_t *y = malloc((size_t)n * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) {
        y[i] = (int32_t)(i % 7);
        for (int64_t j = 0; j < dim; j++) x[i * dim + j] = (float)(i * 1000 + j);
    }
    mp_dataset *ds;
    assert_int_equal(mp_dataset_from_arrays(x, y, n, dim, 0, &ds), MP_OK);
    free(x);
    free(y);
    return ds;
}

static void test_from_arrays(void **state)
{
    (void)state;
    float x[4] = {1, 2, 3, 4};
    int32_t y[2] = {0, 4};
    mp_dataset *ds;
    assert_int_equal(mp_dataset_from_arrays(x, y, 2, 2, 0, &ds), MP_OK);
    assert_int_equal(mp_dataset_classes(ds), 5);
    x[0] = 9; /* a copy was taken */
    assert_true(mp_dataset_features(ds)[0] == 1.0f);
    mp_dataset_free(ds);
    assert_int_equal(mp_dataset_from_arrays(x, y, 2, 2, 10, &ds), MP_OK);
    assert_int_equal(mp_dataset_classes(ds), 10);
    mp_dataset_free(ds);
    expect_error(mp_dataset_from_arrays(x, y, 2, 2, 3, &ds), MP_ERR_INVALID,
                 "label 4 of sample 1 is outside [0, 3)");
    x[3] = bits_f32(0x7FC00000u);
    expect_error(mp_dataset_from_arrays(x, y, 2, 2, 0, &ds), MP_ERR_INVALID,
                 "feature 1 of sample 1 is NaN");
    expect_error(mp_dataset_from_arrays(x, y, 0, 2, 0, &ds), MP_ERR_INVALID, "n >= 1");
    mp_dataset_free(NULL);
}

static void test_validation_split(void **state)
{
    (void)state;
    /* Expected train sizes from Keras: int(math.floor(n * (1.0 - split)))
     * evaluated in Python; 1000 x 0.07 is the float trap (930 if rounded). */
    static const struct {
        int64_t n;
        double f;
        int64_t train;
    } cases[] = {{10, 0.3, 7},        {100, 0.1, 90}, {100, 0.29, 71}, {1000, 0.07, 929},
                 {60000, 0.2, 48000}, {7, 0.5, 3},    {3, 0.1, 2},     {49, 0.7, 14},
                 {37, 0.33, 24},      {29, 0.9, 2},   {10, 0.45, 5},   {1000, 0.001, 999}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        mp_dataset *ds = ramp(cases[c].n, 3), *tr, *va;
        assert_int_equal(mp_dataset_split(ds, cases[c].f, &tr, &va), MP_OK);
        int64_t nt = cases[c].train, nv = cases[c].n - nt;
        assert_int_equal(mp_dataset_count(tr), nt);
        assert_int_equal(mp_dataset_count(va), nv);
        assert_int_equal(mp_dataset_dim(va), 3);
        assert_int_equal(mp_dataset_classes(va), mp_dataset_classes(ds));
        /* the last fraction, in the original order */
        assert_ptr_equal(mp_dataset_features(tr), mp_dataset_features(ds));
        assert_memory_equal(mp_dataset_features(va), mp_dataset_features(ds) + nt * 3,
                            (size_t)nv * 3 * sizeof(float));
        assert_memory_equal(mp_dataset_labels(va), mp_dataset_labels(ds) + nt,
                            (size_t)nv * sizeof(int32_t));
        /* views outlive the parent, and splitting a view is relative to it */
        mp_dataset_free(ds);
        if (nv >= 2) {
            mp_dataset *a, *b;
            assert_int_equal(mp_dataset_split(va, 0.5, &a, &b), MP_OK);
            assert_true(mp_dataset_features(b)[0] == (float)((nt + nv / 2) * 1000));
            mp_dataset_free(a);
            mp_dataset_free(b);
        }
        mp_dataset_free(tr);
        assert_true(mp_dataset_features(va)[0] == (float)(nt * 1000));
        mp_dataset_free(va);
    }
    mp_dataset *ds = ramp(10, 2), *tr, *va;
    assert_int_equal(mp_dataset_split(ds, 0.0, &tr, &va), MP_OK);
    assert_null(va);
    assert_int_equal(mp_dataset_count(tr), 10);
    mp_dataset_free(tr);
    expect_error(mp_dataset_split(ds, 1.0, &tr, &va), MP_ERR_INVALID, "must be in [0, 1)");
    expect_error(mp_dataset_split(ds, -0.1, &tr, &va), MP_ERR_INVALID, "must be in [0, 1)");
    expect_error(mp_dataset_split(ds, bits_f32(0x7FC00000u), &tr, &va), MP_ERR_INVALID, "[0, 1)");
    expect_error(mp_dataset_split(ds, 0.95, &tr, &va), MP_ERR_INVALID, "10 samples");
    expect_error(mp_dataset_split(ds, 1e-17, &tr, &va), MP_ERR_INVALID, "not enough to split");
    assert_null(tr);
    assert_null(va);
    mp_dataset_free(ds);
}

static bool is_permutation(const int64_t *o, int64_t n)
{
    char *seen = calloc((size_t)n, 1);
    bool ok = true;
    for (int64_t i = 0; i < n && ok; i++) {
        if (o[i] < 0 || o[i] >= n || seen[o[i]])
            ok = false;
        else
            seen[o[i]] = 1;
    }
    free(seen);
    return ok;
}

static void test_order(void **state)
{
    (void)state;
    enum { N = 1000 };
    mp_dataset *ds = ramp(N, 1);
    int64_t *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    assert_int_equal(mp_dataset_order(ds, 3, 42, false, a), MP_OK);
    for (int64_t i = 0; i < N; i++) assert_int_equal(a[i], i);
    assert_int_equal(mp_dataset_order(ds, 0, 42, true, a), MP_OK);
    assert_true(is_permutation(a, N));
    /* pinned so that a change of generator is a visible, deliberate act */
    static const int64_t golden[5] = {414, 207, 597, 377, 13};
    assert_memory_equal(a, golden, sizeof golden);
    assert_int_equal(mp_dataset_order(ds, 0, 42, true, b), MP_OK);
    assert_memory_equal(a, b, N * sizeof *a);
    int fixed = 0;
    for (int64_t i = 0; i < N; i++) fixed += a[i] == i;
    assert_true(fixed < 10); /* about one expected */
    /* other epochs and seeds give other permutations; an epoch recomputed
     * after others (resume) is the same */
    for (uint64_t e = 1; e < 5; e++) {
        assert_int_equal(mp_dataset_order(ds, e, 42, true, b), MP_OK);
        assert_true(is_permutation(b, N));
        assert_true(memcmp(a, b, N * sizeof *a) != 0);
    }
    assert_int_equal(mp_dataset_order(ds, 0, 43, true, b), MP_OK);
    assert_true(memcmp(a, b, N * sizeof *a) != 0);
    assert_int_equal(mp_dataset_order(ds, 0, 42, true, b), MP_OK);
    assert_memory_equal(a, b, N * sizeof *a);
    mp_dataset_free(ds);

    /* uniformity: each of the 6 orders of 3 items about equally often */
    ds = ramp(3, 1);
    int counts[6] = {0};
    for (uint64_t e = 0; e < 6000; e++) {
        int64_t o[3];
        mp_dataset_order(ds, e, 7, true, o);
        counts[o[0] * 2 + (o[1] > o[2])]++;
    }
    for (int k = 0; k < 6; k++) assert_in_range(counts[k], 850, 1150);
    mp_dataset_free(ds);
    free(a);
    free(b);
}

static void test_batches(void **state)
{
    (void)state;
    enum { N = 23, D = 3, B = 5 };
    mp_dataset *ds = ramp(N, D);
    assert_int_equal(mp_dataset_batch_count(ds, B), 5);
    assert_int_equal(mp_dataset_batch_count(ds, 23), 1);
    assert_int_equal(mp_dataset_batch_count(ds, 100), 1);
    assert_int_equal(mp_dataset_batch_count(ds, 1), 23);
    assert_int_equal(mp_dataset_batch_count(ds, 0), 0);
    int64_t order[N];
    float x[B * D];
    int32_t y[B];
    for (uint64_t epoch = 0; epoch < 3; epoch++) {
        int seen[N] = {0};
        assert_int_equal(mp_dataset_order(ds, epoch, 9, epoch != 2, order), MP_OK);
        int64_t nb = mp_dataset_batch_count(ds, B);
        for (int64_t b = 0; b < nb; b++) {
            int64_t start = b * B, cnt = N - start < B ? N - start : B;
            assert_int_equal(cnt, b == nb - 1 ? 3 : 5);
            assert_int_equal(mp_dataset_gather(ds, order + start, cnt, x, y), MP_OK);
            for (int64_t i = 0; i < cnt; i++) {
                int64_t k = order[start + i];
                seen[k]++;
                assert_int_equal(y[i], k % 7);
                for (int j = 0; j < D; j++) assert_true(x[i * D + j] == (float)(k * 1000 + j));
            }
        }
        for (int i = 0; i < N; i++) assert_int_equal(seen[i], 1);
    }
    int64_t bad[2] = {0, N};
    expect_error(mp_dataset_gather(ds, bad, 2, x, y), MP_ERR_INVALID,
                 "index 23 (position 1) is outside a dataset of 23 samples");
    bad[1] = -1;
    expect_error(mp_dataset_gather(ds, bad, 2, x, NULL), MP_ERR_INVALID, "index -1");
    assert_int_equal(mp_dataset_gather(ds, bad, 1, x, NULL), MP_OK);
    mp_dataset_free(ds);
}

static int setup(void **state)
{
    (void)state;
    return test_scratch_dir(tmpdir, sizeof tmpdir, "mp_test_data");
}

static int teardown(void **state)
{
    (void)state;
    for (int i = nmade - 1; i >= 0; i--) unlink(made[i]);
    const char *subs[] = {"fm", "fm_bad", "fm_lab"};
    for (int i = 0; i < 3; i++) rmdir(tpath(subs[i]));
    return rmdir(tmpdir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idx_valid_plain_and_gzip),
        cmocka_unit_test(test_idx_bad_headers),
        cmocka_unit_test(test_idx_length_checks),
        cmocka_unit_test(test_idx_count_mismatch_and_shapes),
        cmocka_unit_test(test_idx_gzip_corruption),
        cmocka_unit_test(test_fashion_by_name),
        cmocka_unit_test(test_fashion_real),
        cmocka_unit_test(test_csv_valid),
        cmocka_unit_test(test_gz_read),
        cmocka_unit_test(test_csv_memory_bound),
        cmocka_unit_test(test_csv_invalid),
        cmocka_unit_test(test_from_arrays),
        cmocka_unit_test(test_validation_split),
        cmocka_unit_test(test_order),
        cmocka_unit_test(test_batches),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
