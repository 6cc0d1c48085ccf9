/* arena.c - a bump allocator for per-step memory: one region reserved once,
 * handed out in 64-byte aligned pieces and reset every step, so the training
 * loop never pays for malloc or first-touch page faults after warm-up. */
#include <stdlib.h>

#include "internal.h"

struct mp_arena {
    char *base;
    size_t capacity, used, peak;
    mp_mem_category category;
};

mp_arena *mp_arena_create(size_t capacity, mp_mem_category cat)
{
    if ((unsigned)cat >= MP_MEM_CATEGORY_COUNT) {
        mp_set_error(MP_ERR_INVALID, "arena: unknown memory category %d", (int)cat);
        return NULL;
    }
    mp_arena *a = calloc(1, sizeof *a);
    if (!a) {
        mp_set_error(MP_ERR_NOMEM, "arena: out of memory");
        return NULL;
    }
    capacity = (capacity + 63) & ~(size_t)63;
    a->base = capacity ? mp_region_alloc(capacity) : NULL;
    if (capacity && !a->base) {
        free(a);
        mp_set_error(MP_ERR_NOMEM, "arena: cannot reserve %zu bytes", capacity);
        return NULL;
    }
    a->capacity = capacity;
    a->category = cat;
    return a;
}

void mp_arena_destroy(mp_arena *a)
{
    if (!a) return;
    mp_mem_uncharge(a->category, a->used);
    mp_region_free(a->base, a->capacity);
    free(a);
}

void *mp_arena_alloc(mp_arena *a, size_t bytes)
{
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes || rounded > a->capacity - a->used) {
        mp_set_error(MP_ERR_NOMEM, "arena (%s): %zu bytes requested, %zu of %zu free",
                     mp_mem_category_name(a->category), bytes, a->capacity - a->used, a->capacity);
        return NULL;
    }
    void *p = a->base + a->used;
    a->used += rounded;
    if (a->used > a->peak) a->peak = a->used;
    mp_mem_charge(a->category, rounded);
    return p;
}

void mp_arena_reset(mp_arena *a) { mp_arena_release(a, 0); }

size_t mp_arena_mark(const mp_arena *a) { return a->used; }

void mp_arena_release(mp_arena *a, size_t mark)
{
    if (mark >= a->used) return;
    mp_mem_uncharge(a->category, a->used - mark);
    a->used = mark;
}

size_t mp_arena_used(const mp_arena *a) { return a->used; }
size_t mp_arena_peak(const mp_arena *a) { return a->peak; }
size_t mp_arena_capacity(const mp_arena *a) { return a->capacity; }
