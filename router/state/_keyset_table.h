/* The hash table behind router.state._keyset.KeySet (state layer): uint64 keys, open
 * addressing with linear probing over a power-of-two array of slots, removals by backward
 * shift (no tombstones: a churning set never walks past dead slots, nor rehashes to drop
 * them). 0 marks an empty slot, so the keys 0 and 1 (1 marked removed slots once) are
 * flags beside the array. It grows when live keys would pass 3/4 (rehashing to a load of
 * at most 1/2) and shrinks when they fall under 1/8: memory follows what it holds, within
 * a factor of 8, never less than MIN_CAP slots. Included by _keyset.c and _tracked.c
 * (needs Python.h for PyMem_*).
 */
#ifndef PD_ROUTER_KEYSET_TABLE_H
#define PD_ROUTER_KEYSET_TABLE_H

#include <stdint.h>

#define EMPTY ((uint64_t)0)
#define FLAG_MAX ((uint64_t)1) /* keys 0 .. FLAG_MAX are flags, not slots */
#define MIN_CAP ((size_t)16)
#define HAS_ZERO 1u
#define HAS_ONE 2u

typedef struct {
    uint64_t *slots;
    size_t cap;   /* a power of two >= MIN_CAP */
    size_t used;  /* live keys in slots (not counting 0 and 1) */
    unsigned int special;
} KeyTable;

static inline size_t mix(uint64_t k) { /* murmur3's finalizer: sequential keys spread out */
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return (size_t)k;
}

/* Probe the run of k's home slot in slots[0..mask]: k's slot if it is there, else the
 * empty slot that ends the run (where k would go), with *found saying which. */
static inline size_t probe_slot(const uint64_t *slots, size_t mask, uint64_t k, int *found) {
    size_t i = (size_t)mix(k) & mask;
    for (;;) {
        uint64_t v = slots[i];
        if (v == k || v == EMPTY) {
            *found = v == k;
            return i;
        }
        i = (i + 1) & mask;
    }
}

/* Empty slots[i] by backward shift: each later key of the run whose home is not cyclically
 * in (hole, its slot] moves into the hole, so no tombstone is left. Stores are atomic and
 * in this order (a moved key is written into its new slot before its old one is cleared)
 * because a shared segment's readers look on from another process (_keyset_shared.h);
 * for a private table they cost what plain stores do. */
static inline void shift_out(uint64_t *slots, size_t mask, size_t i) {
    size_t hole = i;
    for (size_t j = (i + 1) & mask;; j = (j + 1) & mask) {
        uint64_t v = slots[j];
        if (v == EMPTY)
            break;
        size_t home = (size_t)mix(v) & mask;
        if (((j - home) & mask) >= ((j - hole) & mask)) { /* home is not in (hole, j]: v may move back */
            __atomic_store_n(&slots[hole], v, __ATOMIC_RELAXED);
            hole = j;
        }
    }
    __atomic_store_n(&slots[hole], EMPTY, __ATOMIC_RELAXED);
}

static inline size_t size_special(const KeyTable *s) {
    return (size_t)((s->special & HAS_ZERO) != 0) + (size_t)((s->special & HAS_ONE) != 0);
}

static inline int contains(const KeyTable *s, uint64_t k) {
    if (k <= FLAG_MAX)
        return (s->special & (k == EMPTY ? HAS_ZERO : HAS_ONE)) != 0;
    size_t mask = s->cap - 1, i = mix(k) & mask;
    for (;;) {
        uint64_t v = s->slots[i];
        if (v == k)
            return 1;
        if (v == EMPTY)
            return 0;
        i = (i + 1) & mask;
    }
}

/* The smallest table for n live keys at a load of at most 1/2. */
static size_t cap_for(size_t n) {
    size_t cap = MIN_CAP;
    while (cap / 2 < n) {
        if (cap > ((size_t)PY_SSIZE_T_MAX / sizeof(uint64_t)) / 2)
            return 0;
        cap <<= 1;
    }
    return cap;
}

static int rehash(KeyTable *s, size_t cap) {
    if (cap == 0) {
        PyErr_NoMemory();
        return -1;
    }
    uint64_t *fresh = PyMem_Calloc(cap, sizeof(uint64_t));
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t mask = cap - 1;
    for (size_t j = 0; j < s->cap; j++) {
        uint64_t k = s->slots[j];
        if (k > FLAG_MAX) {
            size_t i = mix(k) & mask;
            while (fresh[i] != EMPTY)
                i = (i + 1) & mask;
            fresh[i] = k;
        }
    }
    PyMem_Free(s->slots);
    s->slots = fresh;
    s->cap = cap;
    return 0;
}

/* 1 if added, 0 if it was there, -1 on a memory error (the set unchanged). */
static int insert(KeyTable *s, uint64_t k) {
    if (k <= FLAG_MAX) {
        unsigned int bit = k == EMPTY ? HAS_ZERO : HAS_ONE;
        int added = (s->special & bit) == 0;
        s->special |= bit;
        return added;
    }
    if ((s->used + 1) * 4 > s->cap * 3 && rehash(s, cap_for(s->used + 1)) < 0)
        return -1;
    int found;
    size_t i = probe_slot(s->slots, s->cap - 1, k, &found);
    if (found)
        return 0;
    s->slots[i] = k;
    s->used++;
    return 1;
}

/* 1 if removed, 0 if it was not there (by backward shift: shift_out). */
static int erase(KeyTable *s, uint64_t k) {
    if (k <= FLAG_MAX) {
        unsigned int bit = k == EMPTY ? HAS_ZERO : HAS_ONE;
        int had = (s->special & bit) != 0;
        s->special &= ~bit;
        return had;
    }
    int found;
    size_t i = probe_slot(s->slots, s->cap - 1, k, &found);
    if (!found)
        return 0;
    shift_out(s->slots, s->cap - 1, i);
    s->used--;
    return 1;
}

/* After removals: shrink when live keys fill less than 1/8 (a failed shrink is harmless). */
static inline void maybe_shrink(KeyTable *s) {
    if (s->cap > MIN_CAP && s->used * 8 < s->cap && rehash(s, cap_for(s->used)) < 0)
        PyErr_Clear();
}

static int reset(KeyTable *s) {
    uint64_t *fresh = PyMem_Calloc(MIN_CAP, sizeof(uint64_t));
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(s->slots);
    s->slots = fresh;
    s->cap = MIN_CAP;
    s->used = 0;
    s->special = 0;
    return 0;
}

#endif
