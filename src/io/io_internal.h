/* io_internal.h - helpers shared by the dataset loaders, not part of the API. */
#ifndef MP_IO_INTERNAL_H
#define MP_IO_INTERNAL_H

#include <jansson.h>
#include <zlib.h>

#include "core/internal.h"

/* Wrap buffers allocated with mp_alloc(..., MP_MEM_OTHER) in a dataset. The
 * dataset takes ownership of x and y whether or not this succeeds. */
mp_status mp_dataset_adopt(float *x, int32_t *y, int64_t n, int64_t dim, int32_t classes,
                           mp_dataset **out);

/* Wrap a malloc'd text of len bytes in a dataset of windows of `context`
 * tokens (mp_dataset_load_text); takes ownership of text either way. */
mp_status mp_dataset_adopt_text(uint8_t *text, int64_t len, int64_t context, mp_dataset **out);

/* Open a plain or gzip file for reading; a missing file, a directory or an
 * unreadable file is MP_ERR_IO with a message naming path. */
mp_status mp_gz_open(const char *path, gzFile *out);

/* Read up to len bytes; *got receives how many arrived (less than len only
 * at the end of the data). A gzip stream error - corrupt data, bad CRC or
 * length check, stream cut short - is MP_ERR_FORMAT naming path. */
mp_status mp_gz_read(gzFile f, const char *path, void *buf, size_t len, size_t *got);

/* Read from f until the end of the data or max_bytes, into a malloc'd
 * buffer (one spare byte past *len) that grows as the bytes arrive (64 KiB,
 * doubling): a size announced by a file's header is never allocated before
 * the data is there. */
mp_status mp_gz_read_upto(gzFile f, const char *path, size_t max_bytes, char **data, size_t *len);

/* Read a whole file into a malloc'd buffer with a terminating NUL (not
 * counted in *len). max_bytes bounds what is accepted. */
mp_status mp_gz_read_all(const char *path, size_t max_bytes, char **data, size_t *len);

/* A uint64 as the JSON string "0x" + 16 hex digits (a JSON number cannot
 * carry 64 bits through every reader), and back: "0x" and 1 to 16 hex
 * digits, nothing else. */
json_t *mp_json_hex(uint64_t x);
bool mp_json_hex_value(const json_t *j, uint64_t *out);

/* The model's parameters as file tensors (masters, or the weights under a
 * pure low-precision policy); t has room for every parameter. */
int mp_model_param_tensors(mp_model *m, mp_named_tensor *t);
/* Check file tensor t against the given shape (numel `want`) and for
 * NaN/inf (and, if asked, negative values) without copying it; the error
 * names path and name. */
mp_status mp_check_tensor(const mp_named_tensor *t, const char *path, const char *name, int ndim,
                          const int64_t *shape, int64_t want, bool nonnegative);
/* Check every parameter of the model against f, recording its tensor in
 * found[i]; then write them into the model (converting from the file's
 * dtype). Loading is all or nothing: check, then commit. */
mp_status mp_model_check_weights(mp_model *m, const mp_safetensors *f, const char *path,
                                 const mp_named_tensor **found);
void mp_model_commit_weights(mp_model *m, const mp_named_tensor *const *found);

/* Test hook for atomic writes (mp_safetensors_write): called before each
 * step; a nonzero return is an injected errno and fails that step. Before a
 * write it may also shrink *len to make the write short. NULL: no hook. */
typedef enum {
    MP_WRITE_OP_CREATE,    /* the temporary file */
    MP_WRITE_OP_WRITE,     /* one piece of header or data (at most 1 MiB) */
    MP_WRITE_OP_FSYNC,     /* the temporary's contents */
    MP_WRITE_OP_RENAME,    /* over the final name */
    MP_WRITE_OP_DIR_FSYNC, /* the directory entry */
} mp_write_op;
typedef int (*mp_write_fault_fn)(mp_write_op op, size_t *len, void *user);
extern mp_write_fault_fn mp_write_fault_hook;
extern void *mp_write_fault_user;

#endif
