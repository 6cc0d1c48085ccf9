/* policy.c - Keras dtype policies: the compute dtype layers run in and the
 * dtype their variables are kept in (and whether GEMM inputs go to float8
 * or to MX blocks), plus the global default. */
#include <stdatomic.h>
#include <string.h>

#include "core/internal.h"

static const mp_policy policies[] = {
    {"float32", MP_F32, MP_F32, false, false, 0},
    {"mixed_float16", MP_F16, MP_F32, false, false, 0},
    {"mixed_bfloat16", MP_BF16, MP_F32, false, false, 0},
    {"float16", MP_F16, MP_F16, false, false, 0},
    {"bfloat16", MP_BF16, MP_BF16, false, false, 0},
    {"mixed_float8", MP_BF16, MP_F32, true, false, 0},
    {"mixed_mxfp8", MP_BF16, MP_F32, false, true, MP_MXFP8_E4M3},
    {"mixed_mxfp6", MP_BF16, MP_F32, false, true, MP_MXFP6_E2M3},
    {"mixed_mxfp4", MP_BF16, MP_F32, false, true, MP_MXFP4_E2M1},
};
#define NPOLICIES (int)(sizeof policies / sizeof policies[0])

static atomic_int global_policy = 0;

mp_status mp_policy_from_name(const char *name, mp_policy *out)
{
    for (int i = 0; name && i < NPOLICIES; i++)
        if (strcmp(name, policies[i].name) == 0) {
            *out = policies[i];
            return MP_OK;
        }
    return mp_set_error(MP_ERR_INVALID,
                        "unknown policy '%s' (expected float32, mixed_float16, mixed_bfloat16, "
                        "float16, bfloat16, mixed_float8, mixed_mxfp8, mixed_mxfp6 or mixed_mxfp4)",
                        name ? name : "(null)");
}

mp_status mp_set_global_policy(const char *name)
{
    for (int i = 0; name && i < NPOLICIES; i++)
        if (strcmp(name, policies[i].name) == 0) {
            atomic_store(&global_policy, i);
            return MP_OK;
        }
    mp_policy unused;
    return mp_policy_from_name(name, &unused);
}

mp_policy mp_global_policy(void) { return policies[atomic_load(&global_policy)]; }

bool mp_policy_is_mixed(const mp_policy *p) { return p->compute != p->variable; }
