/* checkpoint_fp8.c - the float8 recipe's state in checkpoints: for each
 * quantized tensor of the model (mixprec/fp8.h) its amax history, newest
 * first, as "float8/<layer>/<role>/amax_history" [amax_history_len] and its
 * scale as "float8/<layer>/<role>/scale" [1], both float32; checked before
 * the model changes and restored exactly, so a run resumes bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/model_internal.h"
#include "nn/quant.h"
#include "train/train_internal.h"

#define NAME_MAX_LEN 160

static void tensor_name(char *buf, const char *tensor, int k)
{
    snprintf(buf, NAME_MAX_LEN, "float8/%s/%s", tensor, k ? "scale" : "amax_history");
}

int mp_checkpoint_float8_count(const mp_model *m) { return 2 * mp_model_float8_num_tensors(m); }

char *mp_checkpoint_float8_tensors(const mp_model *m, mp_named_tensor *t)
{
    int n = mp_model_float8_num_tensors(m);
    char *names = calloc((size_t)(2 * n + 1), NAME_MAX_LEN);
    if (!names) {
        mp_set_error(MP_ERR_NOMEM, "checkpoint: out of memory");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        mp_float8_tensor_info info;
        mp_model_float8_tensor(m, i, &info);
        for (int k = 0; k < 2; k++) {
            mp_named_tensor *x = &t[2 * i + k];
            char *name = names + (size_t)(2 * i + k) * NAME_MAX_LEN;
            tensor_name(name, info.name, k);
            memset(x, 0, sizeof *x);
            x->name = name;
            x->dtype = MP_F32;
            x->ndim = 1;
            x->shape[0] = k ? 1 : info.params.amax_history_len;
            x->data = k ? (const void *)&m->fp8[i].scale : (const void *)info.history;
        }
    }
    return names;
}

mp_status mp_checkpoint_float8_check(const mp_model *m, const mp_safetensors *f, const char *path,
                                     const mp_named_tensor **found)
{
    int n = mp_model_float8_num_tensors(m);
    for (int i = 0; i < n; i++) {
        mp_float8_tensor_info info;
        mp_model_float8_tensor(m, i, &info);
        for (int k = 0; k < 2; k++) {
            char name[NAME_MAX_LEN];
            tensor_name(name, info.name, k);
            const mp_named_tensor *t = mp_safetensors_find(f, name);
            if (!t) return mp_set_error(MP_ERR_FORMAT, "'%s' has no float8 state '%s'", path, name);
            int64_t len = k ? 1 : info.params.amax_history_len;
            /* amaxes and scales: finite and never negative */
            mp_status s = mp_check_tensor(t, path, name, 1, &len, len, true);
            if (s) return s;
            if (k) {
                float sc;
                mp_convert(&sc, MP_F32, t->data, t->dtype, 1);
                if (!(sc > 0.0f) || !isfinite(sc))
                    return mp_set_error(MP_ERR_FORMAT, "'%s': float8 scale '%s' is %g", path, name,
                                        (double)sc);
            }
            found[2 * i + k] = t;
        }
    }
    return MP_OK;
}

void mp_checkpoint_float8_apply(mp_model *m, const mp_named_tensor *const *found)
{
    int n = mp_model_float8_num_tensors(m);
    for (int i = 0; i < n; i++)
        mp_float8_model_restore(m, i, found[2 * i]->data, found[2 * i]->dtype,
                                found[2 * i + 1]->data, found[2 * i + 1]->dtype);
}
