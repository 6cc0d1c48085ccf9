/* tensor.c - the tensor type: a dtype, a row-major contiguous shape and a
 * pointer into storage that it may or may not own. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

static mp_status check_shape(mp_dtype dtype, int ndim, const int64_t *shape, size_t *bytes)
{
    if ((unsigned)dtype >= MP_DTYPE_COUNT && dtype != MP_I32)
        return mp_set_error(MP_ERR_INVALID, "tensor: unknown dtype %d", (int)dtype);
    if (ndim < 0 || ndim > MP_MAX_DIMS)
        return mp_set_error(MP_ERR_INVALID, "tensor: %d dimensions (0..%d allowed)", ndim,
                            MP_MAX_DIMS);
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return mp_set_error(MP_ERR_INVALID, "tensor: dimension %d is negative (%lld)", i,
                                (long long)shape[i]);
        if (shape[i] && count > (UINT64_MAX >> 4) / (uint64_t)shape[i])
            return mp_set_error(MP_ERR_INVALID, "tensor: shape too large");
        count *= (uint64_t)shape[i];
    }
    if (count > SIZE_MAX / 8) return mp_set_error(MP_ERR_INVALID, "tensor: shape too large");
    *bytes = (size_t)count * mp_dtype_size(dtype);
    return MP_OK;
}

static void fill(mp_tensor *t, mp_dtype dtype, int ndim, const int64_t *shape, void *data)
{
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->data = data;
}

mp_status mp_tensor_init(mp_tensor *t, mp_dtype dtype, int ndim, const int64_t *shape,
                         mp_mem_category cat)
{
    size_t bytes;
    mp_status s = check_shape(dtype, ndim, shape, &bytes);
    if (s) return s;
    void *p = mp_alloc(bytes, cat);
    if (!p) return MP_ERR_NOMEM;
    memset(p, 0, bytes);
    fill(t, dtype, ndim, shape, p);
    t->owns_data = true;
    t->category = cat;
    return MP_OK;
}

mp_status mp_tensor_wrap(mp_tensor *t, mp_dtype dtype, int ndim, const int64_t *shape, void *data)
{
    size_t bytes;
    mp_status s = check_shape(dtype, ndim, shape, &bytes);
    if (s) return s;
    if (!data && bytes) return mp_set_error(MP_ERR_INVALID, "tensor: NULL data");
    fill(t, dtype, ndim, shape, data);
    t->category = MP_MEM_OTHER;
    return MP_OK;
}

mp_status mp_tensor_from_arena(mp_tensor *t, mp_arena *a, mp_dtype dtype, int ndim,
                               const int64_t *shape)
{
    size_t bytes;
    mp_status s = check_shape(dtype, ndim, shape, &bytes);
    if (s) return s;
    void *p = mp_arena_alloc(a, bytes);
    if (!p) return MP_ERR_NOMEM;
    fill(t, dtype, ndim, shape, p);
    return MP_OK;
}

void mp_tensor_release(mp_tensor *t)
{
    if (t->owns_data) mp_free(t->data);
    t->data = NULL;
    t->owns_data = false;
}

int64_t mp_tensor_numel(const mp_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t mp_tensor_bytes(const mp_tensor *t)
{
    return (size_t)mp_tensor_numel(t) * mp_dtype_size(t->dtype);
}

mp_status mp_tensor_convert(mp_tensor *dst, const mp_tensor *src)
{
    if (mp_tensor_numel(dst) != mp_tensor_numel(src)) {
        char a[128], b[128];
        return mp_set_error(MP_ERR_INVALID, "tensor convert: %s and %s differ in size",
                            mp_tensor_describe(src, a, sizeof a),
                            mp_tensor_describe(dst, b, sizeof b));
    }
    mp_convert(dst->data, dst->dtype, src->data, src->dtype, (size_t)mp_tensor_numel(src));
    return MP_OK;
}

const char *mp_tensor_describe(const mp_tensor *t, char *buf, size_t len)
{
    size_t off = (size_t)snprintf(buf, len, "%s[", mp_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && off < len; i++)
        off +=
            (size_t)snprintf(buf + off, len - off, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (off < len) snprintf(buf + off, len - off, "]");
    return buf;
}
