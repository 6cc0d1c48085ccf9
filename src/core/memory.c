/* memory.c - tracked allocation and the per-category memory accounting that
 * lets the library report its own footprint (current and peak) exactly. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

static atomic_size_t current[MP_MEM_CATEGORY_COUNT];
static atomic_size_t peak[MP_MEM_CATEGORY_COUNT];
static atomic_size_t total_current, total_peak;

static const char *const category_names[MP_MEM_CATEGORY_COUNT] = {
    "weights",     "master_weights", "gradients", "optimizer_state",
    "activations", "workspace",      "other",
};

const char *mp_mem_category_name(mp_mem_category c)
{
    return (unsigned)c < MP_MEM_CATEGORY_COUNT ? category_names[c] : "unknown";
}

static void raise_peak(atomic_size_t *pk, size_t v)
{
    size_t old = atomic_load(pk);
    while (v > old && !atomic_compare_exchange_weak(pk, &old, v)) {
    }
}

void mp_mem_charge(mp_mem_category cat, size_t bytes)
{
    size_t c = atomic_fetch_add(&current[cat], bytes) + bytes;
    raise_peak(&peak[cat], c);
    size_t t = atomic_fetch_add(&total_current, bytes) + bytes;
    raise_peak(&total_peak, t);
}

void mp_mem_uncharge(mp_mem_category cat, size_t bytes)
{
    atomic_fetch_sub(&current[cat], bytes);
    atomic_fetch_sub(&total_current, bytes);
}

void mp_mem_get_stats(mp_mem_stats *out)
{
    for (int i = 0; i < MP_MEM_CATEGORY_COUNT; i++) {
        out->current[i] = atomic_load(&current[i]);
        out->peak[i] = atomic_load(&peak[i]);
    }
    out->total_current = atomic_load(&total_current);
    out->total_peak = atomic_load(&total_peak);
}

void mp_mem_reset_peaks(void)
{
    for (int i = 0; i < MP_MEM_CATEGORY_COUNT; i++)
        atomic_store(&peak[i], atomic_load(&current[i]));
    atomic_store(&total_peak, atomic_load(&total_current));
}

/* Regions of 2 MiB or more are mapped and advised onto transparent huge
 * pages: on this VM each 4 KiB first touch costs ~14 us. */
#define HUGE_THRESHOLD (2u << 20)

void *mp_region_alloc(size_t bytes)
{
    if (bytes >= HUGE_THRESHOLD) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
        madvise(p, bytes, MADV_HUGEPAGE);
#endif
        return p;
    }
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

void mp_region_free(void *p, size_t bytes)
{
    if (!p) return;
    if (bytes >= HUGE_THRESHOLD)
        munmap(p, bytes);
    else
        free(p);
}

typedef struct {
    void *p;
    size_t bytes;
} scratch;
static _Thread_local scratch scratch_slots[MP_SCRATCH_SLOTS];

/* A thread's scratch is freed when the thread ends (an OpenMP pool that
 * shrinks, a caller's own threads), through a key whose destructor the
 * thread library runs at its exit; the value is the thread's slots. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_release(void *slots)
{
    scratch *sl = slots;
    for (int i = 0; i < MP_SCRATCH_SLOTS; i++) {
        mp_region_free(sl[i].p, sl[i].bytes);
        mp_mem_uncharge(MP_MEM_WORKSPACE, sl[i].bytes);
        sl[i].p = NULL;
        sl[i].bytes = 0;
    }
}

static void scratch_key_make(void) { (void)pthread_key_create(&scratch_key, scratch_release); }

size_t mp_scratch_fail_above = SIZE_MAX;

void *mp_scratch(int slot, size_t bytes)
{
    scratch *s = &scratch_slots[slot];
    bytes = (bytes + 4095) & ~(size_t)4095;
    if (bytes > mp_scratch_fail_above) {
        mp_set_error(MP_ERR_NOMEM, "scratch: cannot allocate %zu bytes (test limit)", bytes);
        return NULL;
    }
    if (s->bytes < bytes) {
        /* charged as workspace for as long as the thread keeps it, so the
         * per-category figures include the kernels' packing buffers */
        mp_region_free(s->p, s->bytes);
        mp_mem_uncharge(MP_MEM_WORKSPACE, s->bytes);
        s->p = mp_region_alloc(bytes);
        s->bytes = s->p ? bytes : 0;
        mp_mem_charge(MP_MEM_WORKSPACE, s->bytes);
        if (s->p) {
            (void)pthread_once(&scratch_once, scratch_key_make);
            (void)pthread_setspecific(scratch_key, scratch_slots);
        }
        if (!s->p) mp_set_error(MP_ERR_NOMEM, "scratch: cannot allocate %zu bytes", bytes);
    }
    return s->p;
}

/* mp_alloc keeps a 64-byte header in front of the block. */
typedef struct {
    size_t bytes;
    size_t region_bytes;
    uint32_t category;
    uint32_t magic;
} block_header;
#define HEADER 64
#define MAGIC 0x6D70616Cu

void *mp_alloc(size_t bytes, mp_mem_category cat)
{
    if ((unsigned)cat >= MP_MEM_CATEGORY_COUNT) {
        mp_set_error(MP_ERR_INVALID, "mp_alloc: unknown memory category %d", (int)cat);
        return NULL;
    }
    if (bytes > SIZE_MAX - 2 * HEADER) {
        mp_set_error(MP_ERR_NOMEM, "mp_alloc: %zu bytes is too large", bytes);
        return NULL;
    }
    size_t region = (bytes + HEADER + 63) & ~(size_t)63;
    char *base = mp_region_alloc(region);
    if (!base) {
        mp_set_error(MP_ERR_NOMEM, "mp_alloc: cannot allocate %zu bytes for %s", bytes,
                     mp_mem_category_name(cat));
        return NULL;
    }
    block_header *h = (block_header *)base;
    h->bytes = bytes;
    h->region_bytes = region;
    h->category = (uint32_t)cat;
    h->magic = MAGIC;
    mp_mem_charge(cat, bytes);
    return base + HEADER;
}

void mp_free(void *p)
{
    if (!p) return;
    block_header *h = (block_header *)((char *)p - HEADER);
    h->magic = 0;
    mp_mem_uncharge((mp_mem_category)h->category, h->bytes);
    mp_region_free(h, h->region_bytes);
}
