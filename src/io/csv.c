/* csv.c - numeric CSV files (plain or gzip) as datasets: float32 features
 * and one integer label column, with errors that point at the line and
 * column of the offending field. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/io_internal.h"

/* A larger text file is surely not meant for an in-memory dataset. */
#define MAX_FILE_BYTES ((size_t)1 << 34)
/* Longest text accepted as a number; longer fields are reported, not cut. */
#define MAX_NUMBER_CHARS 255
/* 2^128 - 2^103: the least double that rounds to infinity as a float32. */
#define FLOAT_OVERFLOW 0x1.ffffffp+127

typedef struct {
    const char *p;
    size_t len;
} span;

typedef struct {
    const char *path;
    char sep;
    span *f; /* fields of the current line */
    int nf, cap;
} parser;

mp_csv_options mp_csv_options_default(void)
{
    return (mp_csv_options){.label_column = -1, .header = MP_CSV_HEADER_AUTO, .separator = ','};
}

static bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

static span trim(span s)
{
    while (s.len && is_blank(s.p[0])) s.p++, s.len--;
    while (s.len && is_blank(s.p[s.len - 1])) s.len--;
    if (s.len >= 2 && s.p[0] == '"' && s.p[s.len - 1] == '"') {
        s.p++;
        s.len -= 2;
        while (s.len && is_blank(s.p[0])) s.p++, s.len--;
        while (s.len && is_blank(s.p[s.len - 1])) s.len--;
    }
    return s;
}

/* Split one line (without its '\n') into fields; separators inside double
 * quotes do not split, so quoted header names may contain them. */
static mp_status split_line(parser *ps, const char *line, size_t len, long long ln)
{
    ps->nf = 0;
    size_t start = 0;
    bool quoted = false;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && line[i] == '"') quoted = !quoted;
        if (i < len && (quoted || line[i] != ps->sep)) continue;
        if (ps->nf == ps->cap) {
            int ncap = ps->cap ? ps->cap * 2 : 64;
            span *nfs = realloc(ps->f, (size_t)ncap * sizeof *nfs);
            if (!nfs) return mp_set_error(MP_ERR_NOMEM, "%s: out of memory", ps->path);
            ps->f = nfs;
            ps->cap = ncap;
        }
        ps->f[ps->nf++] = trim((span){line + start, i - start});
        start = i + 1;
    }
    if (quoted)
        return mp_set_error(MP_ERR_FORMAT, "%s: line %lld: unterminated double quote", ps->path,
                            ln);
    return MP_OK;
}

typedef enum { NUM_OK, NUM_EMPTY, NUM_BAD, NUM_LONG } num_result;

static num_result parse_number(span s, double *v)
{
    if (s.len == 0) return NUM_EMPTY;
    if (s.len > MAX_NUMBER_CHARS) return NUM_LONG;
    char buf[MAX_NUMBER_CHARS + 1];
    memcpy(buf, s.p, s.len);
    buf[s.len] = '\0';
    /* strtod would skip leading white space that trim() already removed;
     * a quote or blank left inside means the field is not one number. */
    char *end;
    *v = strtod(buf, &end);
    if (end == buf || *end != '\0') return NUM_BAD;
    return NUM_OK;
}

/* An empty field says nothing either way (pandas leaves the index column's
 * name empty), so only text that is not a number marks a header. */
static bool line_is_numeric(const parser *ps)
{
    for (int i = 0; i < ps->nf; i++) {
        double v;
        num_result r = parse_number(ps->f[i], &v);
        if (r != NUM_OK && r != NUM_EMPTY) return false;
    }
    return true;
}

/* The field's text, shortened for messages. */
static const char *shown(span s, char *buf, size_t cap)
{
    size_t n = s.len < cap - 4 ? s.len : cap - 4;
    memcpy(buf, s.p, n);
    strcpy(buf + n, s.len > n ? "..." : "");
    return buf;
}

static mp_status field_error(const parser *ps, long long ln, int col, span s, num_result r,
                             double v, bool label)
{
    char t[48];
    const char *what = label ? "label" : "feature";
    switch (r) {
    case NUM_EMPTY:
        return mp_set_error(MP_ERR_FORMAT, "%s: line %lld, column %d: empty %s field", ps->path, ln,
                            col, what);
    case NUM_LONG:
        return mp_set_error(MP_ERR_FORMAT,
                            "%s: line %lld, column %d: field '%s' is too long "
                            "to be a number",
                            ps->path, ln, col, shown(s, t, sizeof t));
    case NUM_BAD:
        return mp_set_error(MP_ERR_FORMAT, "%s: line %lld, column %d: '%s' is not a number",
                            ps->path, ln, col, shown(s, t, sizeof t));
    case NUM_OK:
        break;
    }
    if (isnan(v))
        return mp_set_error(MP_ERR_FORMAT,
                            "%s: line %lld, column %d: NaN %s value '%s'; NaN data cannot be "
                            "trained on (drop or impute it first)",
                            ps->path, ln, col, what, shown(s, t, sizeof t));
    if (label)
        return mp_set_error(MP_ERR_FORMAT,
                            "%s: line %lld, column %d: label '%s' is not a non-negative integer "
                            "below %d",
                            ps->path, ln, col, shown(s, t, sizeof t), MP_DATASET_MAX_CLASSES);
    return mp_set_error(MP_ERR_FORMAT,
                        "%s: line %lld, column %d: value '%s' is infinite or beyond float32 "
                        "range",
                        ps->path, ln, col, shown(s, t, sizeof t));
}

static mp_status parse(parser *ps, char *text, size_t len, const mp_csv_options *o,
                       mp_dataset **out)
{
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';

    float *x = NULL;
    int32_t *y = NULL;
    int nf = 0, lc = 0, header_line = 0;
    int64_t dim = 0, n = 0;
    int32_t maxl = -1;
    bool first = true;
    mp_status s = MP_OK;
    const char *p = text, *endp = text + len;
    long long ln = 0;
    while (!s && p < endp) {
        const char *nl = memchr(p, '\n', (size_t)(endp - p));
        size_t ll = nl ? (size_t)(nl - p) : (size_t)(endp - p);
        const char *line = p;
        p = nl ? nl + 1 : endp;
        ln++;
        size_t k = 0;
        while (k < ll && (is_blank(line[k]))) k++;
        if (k == ll) continue; /* blank lines are skipped wherever they are */
        if (memchr(line, '\0', ll)) {
            s = mp_set_error(MP_ERR_FORMAT, "%s: line %lld: NUL byte; not a text file", ps->path,
                             ln);
            break;
        }
        s = split_line(ps, line, ll, ln);
        if (s) break;
        if (first) {
            first = false;
            nf = ps->nf;
            if (nf < 2) {
                s = mp_set_error(MP_ERR_FORMAT,
                                 "%s: line %lld has %d field; a dataset needs at least one "
                                 "feature and a label (separator '%c')",
                                 ps->path, ln, nf, ps->sep);
                break;
            }
            lc = o->label_column < 0 ? nf + o->label_column : o->label_column;
            if (lc < 0 || lc >= nf) {
                s = mp_set_error(MP_ERR_INVALID,
                                 "%s: label column %d is outside the %d columns of the file",
                                 ps->path, o->label_column, nf);
                break;
            }
            dim = nf - 1;
            /* Rows of nf fields take nf bytes at least (nf - 1 separators
             * and a newline), so no more than len / nf + 1 fit in the file:
             * a wide first line over many blank lines must not size the
             * buffers by the line count (64 KiB asked for 2 GB). */
            if (lines > len / (size_t)nf + 1) lines = len / (size_t)nf + 1;
            if ((uint64_t)lines > SIZE_MAX / sizeof(float) / (uint64_t)dim) {
                s = mp_set_error(MP_ERR_NOMEM, "%s: too large", ps->path);
                break;
            }
            x = mp_alloc(lines * (size_t)dim * sizeof(float), MP_MEM_OTHER);
            y = mp_alloc(lines * sizeof(int32_t), MP_MEM_OTHER);
            if (!x || !y) {
                s = mp_set_error(MP_ERR_NOMEM, "%s: out of memory for %zu rows of %d fields",
                                 ps->path, lines, nf);
                break;
            }
            bool header = o->header == MP_CSV_HEADER_PRESENT ||
                          (o->header == MP_CSV_HEADER_AUTO && !line_is_numeric(ps));
            if (header) {
                header_line = (int)ln;
                continue;
            }
        }
        if (ps->nf != nf) {
            s = mp_set_error(MP_ERR_FORMAT,
                             "%s: line %lld has %d fields, expected %d (as on line "
                             "%d)",
                             ps->path, ln, ps->nf, nf, header_line ? header_line : 1);
            break;
        }
        if ((size_t)n >= lines) { /* cannot happen: the bound above */
            s = mp_set_error(MP_ERR_FORMAT, "%s: line %lld: more rows than the file can hold",
                             ps->path, ln);
            break;
        }
        float *row = x + n * dim;
        for (int c = 0, j = 0; c < nf; c++) {
            double v = 0;
            num_result r = parse_number(ps->f[c], &v);
            if (c == lc) {
                if (r != NUM_OK || !(v >= 0) || v >= MP_DATASET_MAX_CLASSES || v != floor(v)) {
                    s = field_error(ps, ln, c + 1, ps->f[c], r, v, true);
                    break;
                }
                y[n] = (int32_t)v;
                if (y[n] > maxl) maxl = y[n];
                continue;
            }
            /* A finite double from FLT_MAX + half an ulp on becomes inf as
             * a float; below it, it rounds to at most FLT_MAX (the text
             * "3.4028235e+38" that numpy writes for it is past FLT_MAX). */
            if (r != NUM_OK || !isfinite(v) || fabs(v) >= FLOAT_OVERFLOW) {
                s = field_error(ps, ln, c + 1, ps->f[c], r, v, false);
                break;
            }
            row[j++] = (float)v;
        }
        n++;
    }
    if (!s && n == 0)
        s = mp_set_error(MP_ERR_FORMAT, "%s: no data rows%s", ps->path,
                         header_line ? " after the header" : "");
    if (s) {
        mp_free(x);
        mp_free(y);
        return s;
    }
    return mp_dataset_adopt(x, y, n, dim, maxl + 1, out);
}

mp_status mp_dataset_load_csv(const char *path, const mp_csv_options *opt, mp_dataset **out)
{
    if (!out) return mp_set_error(MP_ERR_INVALID, "mp_dataset_load_csv: out is NULL");
    *out = NULL;
    mp_csv_options o = opt ? *opt : mp_csv_options_default();
    if (o.header != MP_CSV_HEADER_AUTO && o.header != MP_CSV_HEADER_NONE &&
        o.header != MP_CSV_HEADER_PRESENT)
        return mp_set_error(MP_ERR_INVALID, "mp_dataset_load_csv: unknown header mode %d",
                            (int)o.header);
    if (o.separator == '\0' || o.separator == '"' || o.separator == '\n' || o.separator == '\r')
        return mp_set_error(MP_ERR_INVALID, "mp_dataset_load_csv: separator %d is not usable",
                            (int)o.separator);
    char *text;
    size_t len;
    mp_status s = mp_gz_read_all(path, MAX_FILE_BYTES, &text, &len);
    if (s) return s;
    parser ps = {.path = path, .sep = o.separator};
    s = parse(&ps, text, len, &o, out);
    free(ps.f);
    free(text);
    return s;
}
