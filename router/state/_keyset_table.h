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

/* Start loading the slot where k's probe begins: bulk updates and depth() issue it a few
 * keys ahead, so the cache misses of a large table overlap instead of queueing one by one
 * (a hint only: it never faults and changes nothing). */
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH_AHEAD 8
static inline void prefetch_slot(const KeyTable *s, uint64_t k, int write) {
    const uint64_t *at = &s->slots[mix(k) & (s->cap - 1)];
    if (write)
        __builtin_prefetch(at, 1, 3);
    else
        __builtin_prefetch(at, 0, 3);
}
#else
#define PREFETCH_AHEAD 0
static inline void prefetch_slot(const KeyTable *s, uint64_t k, int write) {
    (void)s;
    (void)k;
    (void)write;
}
#endif

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
    size_t mask = s->cap - 1, i = mix(k) & mask;
    for (;;) {
        uint64_t v = s->slots[i];
        if (v == k)
            return 0;
        if (v == EMPTY)
            break;
        i = (i + 1) & mask;
    }
    s->slots[i] = k;
    s->used++;
    return 1;
}

/* 1 if removed, 0 if it was not there. Backward shift: each later key of the probe run
 * whose home is not cyclically in (hole, its slot] moves into the hole, so no tombstone is
 * left and a probe never walks past a dead slot. */
static int erase(KeyTable *s, uint64_t k) {
    if (k <= FLAG_MAX) {
        unsigned int bit = k == EMPTY ? HAS_ZERO : HAS_ONE;
        int had = (s->special & bit) != 0;
        s->special &= ~bit;
        return had;
    }
    size_t mask = s->cap - 1, i = mix(k) & mask;
    for (;;) {
        uint64_t v = s->slots[i];
        if (v == k)
            break;
        if (v == EMPTY)
            return 0;
        i = (i + 1) & mask;
    }
    size_t hole = i;
    for (size_t j = (i + 1) & mask;; j = (j + 1) & mask) {
        uint64_t v = s->slots[j];
        if (v == EMPTY)
            break;
        size_t home = mix(v) & mask;
        if (((j - home) & mask) >= ((j - hole) & mask)) { /* home is not in (hole, j]: v may move back */
            s->slots[hole] = v;
            hole = j;
        }
    }
    s->slots[hole] = EMPTY;
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
