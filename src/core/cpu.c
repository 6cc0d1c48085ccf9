/* cpu.c - CPU feature detection (CPUID + XGETBV) and the choice of ISA path,
 * made once at first use and overridable with MP_ISA or mp_isa_set(). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#if MP_X86
#include <cpuid.h>
#endif
#if MP_X86 && defined(__linux__)
#include <sys/syscall.h>
#endif

static mp_cpu_features features;
static uint32_t signature;
static atomic_int active_isa = -1;
static atomic_int isa_forced = 0;
static atomic_int detected = 0;

#if MP_X86
static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

/* Whether this process may use the AMX tile data: XCR0 enables the tile
 * config and data state (bits 17, 18), and on Linux the kernel grants the
 * permission the tile data's large XSAVE area needs (asked here, once per
 * process; threads inherit it). */
static bool amx_permitted(uint64_t xcr0)
{
    if ((xcr0 & 0x60000) != 0x60000) return false;
#if MP_X86 && defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    unsigned long mask = 0;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, (unsigned long)XFEATURE_XTILEDATA) != 0)
        return false;
    return syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &mask) == 0 &&
           (mask >> XFEATURE_XTILEDATA & 1);
#else
    return false; /* no known way to ask: the tiles stay unused */
#endif
}

static void detect(void)
{
    mp_cpu_features f;
    memset(&f, 0, sizeof f);
#if MP_X86
    unsigned a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d)) {
        unsigned max_leaf = a;
        memcpy(f.vendor, &b, 4);
        memcpy(f.vendor + 4, &d, 4);
        memcpy(f.vendor + 8, &c, 4);
        __get_cpuid(1, &a, &b, &c, &d);
        signature = a;
        bool osxsave = (c >> 27) & 1;
        f.sse2 = (d >> 26) & 1;
        f.fma = (c >> 12) & 1;
        f.f16c = (c >> 29) & 1;
        bool avx_hw = (c >> 28) & 1;
        uint64_t xcr0 = osxsave ? xgetbv0() : 0;
        bool os_avx = (xcr0 & 0x6) == 0x6;
        f.os_avx512 = (xcr0 & 0xE6) == 0xE6;
        f.avx = avx_hw && os_avx;
        if (!os_avx) f.fma = f.f16c = false;
        if (max_leaf >= 7) {
            __cpuid_count(7, 0, a, b, c, d);
            f.avx2 = f.avx && ((b >> 5) & 1);
            f.avx512f = f.os_avx512 && ((b >> 16) & 1);
            f.avx512dq = f.avx512f && ((b >> 17) & 1);
            f.avx512bw = f.avx512f && ((b >> 30) & 1);
            f.avx512vl = f.avx512f && ((b >> 31) & 1);
            f.avx512_fp16 = f.avx512f && ((d >> 23) & 1);
            f.amx_bf16 = (d >> 22) & 1;
            f.amx_tile = (d >> 24) & 1;
            f.os_amx = f.amx_tile && f.amx_bf16 && amx_permitted(xcr0);
            if (a >= 1) {
                __cpuid_count(7, 1, a, b, c, d);
                f.avx512_bf16 = f.avx512f && ((a >> 5) & 1);
            }
        }
        __get_cpuid(0x80000000u, &a, &b, &c, &d);
        if (a >= 0x80000004u) {
            unsigned regs[12];
            for (unsigned i = 0; i < 3; i++)
                __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2],
                            &regs[4 * i + 3]);
            memcpy(f.brand, regs, 48);
            f.brand[48] = '\0';
        }
    }
#else
    strcpy(f.vendor, "non-x86");
#endif
    features = f;
}

const mp_cpu_features *mp_cpu(void)
{
    if (!atomic_load(&detected)) {
        detect(); /* idempotent: a race only repeats the same writes */
        atomic_store(&detected, 1);
    }
    return &features;
}

bool mp_isa_supported(mp_isa isa)
{
    const mp_cpu_features *f = mp_cpu();
    bool avx512 = f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->f16c && f->fma;
    switch (isa) {
    case MP_ISA_SCALAR:
        return true;
    case MP_ISA_AVX2:
        return MP_X86 && f->avx2 && f->fma && f->f16c;
    case MP_ISA_AVX512:
        return MP_X86 && avx512;
    case MP_ISA_AVX512BF16:
        return MP_X86 && avx512 && f->avx512_bf16;
    case MP_ISA_AMX:
        return MP_X86 && avx512 && f->avx512_bf16 && f->os_amx;
    }
    return false;
}

mp_isa mp_isa_best(void)
{
    if (mp_isa_supported(MP_ISA_AMX)) return MP_ISA_AMX;
    if (mp_isa_supported(MP_ISA_AVX512BF16)) return MP_ISA_AVX512BF16;
    if (mp_isa_supported(MP_ISA_AVX512)) return MP_ISA_AVX512;
    if (mp_isa_supported(MP_ISA_AVX2)) return MP_ISA_AVX2;
    return MP_ISA_SCALAR;
}

static const char *const isa_names[MP_ISA_COUNT] = {"scalar", "avx2", "avx512", "avx512bf16",
                                                    "amx"};

const char *mp_isa_name(mp_isa isa)
{
    return (unsigned)isa < MP_ISA_COUNT ? isa_names[isa] : "unknown";
}

mp_status mp_isa_from_name(const char *name, mp_isa *out)
{
    for (int i = 0; i < MP_ISA_COUNT; i++)
        if (name && strcmp(name, isa_names[i]) == 0) {
            *out = (mp_isa)i;
            return MP_OK;
        }
    return mp_set_error(MP_ERR_INVALID,
                        "unknown ISA '%s' (expected scalar, avx2, avx512, avx512bf16 or amx)",
                        name ? name : "(null)");
}

mp_isa mp_isa_active(void)
{
    int isa = atomic_load(&active_isa);
    if (isa >= 0) return (mp_isa)isa;
    mp_isa chosen = mp_isa_best();
    const char *env = getenv("MP_ISA");
    if (env && *env) {
        mp_isa want;
        if (mp_isa_from_name(env, &want) != MP_OK)
            fprintf(stderr, "mixprec: MP_ISA: %s; using %s\n", mp_last_error(),
                    mp_isa_name(chosen));
        else if (!mp_isa_supported(want))
            fprintf(stderr, "mixprec: MP_ISA=%s is not supported by this CPU; using %s\n", env,
                    mp_isa_name(chosen));
        else {
            chosen = want;
            atomic_store(&isa_forced, 1);
        }
    }
    int expected = -1;
    atomic_compare_exchange_strong(&active_isa, &expected, (int)chosen);
    return (mp_isa)atomic_load(&active_isa);
}

mp_status mp_isa_set(mp_isa isa)
{
    if ((unsigned)isa >= MP_ISA_COUNT)
        return mp_set_error(MP_ERR_INVALID, "unknown ISA value %d", (int)isa);
    if (!mp_isa_supported(isa))
        return mp_set_error(MP_ERR_UNSUPPORTED, "ISA %s is not supported by this CPU",
                            mp_isa_name(isa));
    atomic_store(&isa_forced, 1);
    atomic_store(&active_isa, (int)isa);
    return MP_OK;
}

bool mp_isa_forced(void)
{
    (void)mp_isa_active(); /* MP_ISA is read on first use */
    return atomic_load(&isa_forced) != 0;
}

void mp_isa_reset(void)
{
    atomic_store(&isa_forced, 0);
    atomic_store(&active_isa, -1);
}

uint32_t mp_cpu_signature(void)
{
    (void)mp_cpu();
    return signature;
}

size_t mp_cpu_cache_bytes(int level)
{
    static atomic_long l1 = -1, l2 = -1;
    atomic_long *slot = level == 1 ? &l1 : level == 2 ? &l2 : NULL;
    if (!slot) return 0;
    long v = atomic_load(slot);
    if (v < 0) {
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
        v = sysconf(level == 1 ? _SC_LEVEL1_DCACHE_SIZE : _SC_LEVEL2_CACHE_SIZE);
#endif
        if (v < 0) v = 0;
        atomic_store(slot, v);
    }
    return (size_t)v;
}
