/* The hash table behind router.state._keyset.KeySet (state layer): uint64 keys, open
 * addressing with linear probing over a power-of-two array of slots. 0 marks an empty slot
 * and 1 a removed one (a tombstone, reused by a later insert), so the keys 0 and 1
 * themselves are flags beside the array. It grows when live + tombstone slots would pass
 * 3/4 (rehashing to a load of at most 1/2, which drops every tombstone) and shrinks when
 * live keys fall under 1/8: memory follows what it holds, within a factor of 8, never
 * less than MIN_CAP slots. Included by _keyset.c only (needs Python.h for PyMem_*).
 */
#ifndef PD_ROUTER_KEYSET_TABLE_H
#define PD_ROUTER_KEYSET_TABLE_H

#include <stdint.h>

#define EMPTY ((uint64_t)0)
#define TOMB ((uint64_t)1)
#define MIN_CAP ((size_t)16)
#define HAS_ZERO 1u
#define HAS_ONE 2u

typedef struct {
    uint64_t *slots;
    size_t cap;   /* a power of two >= MIN_CAP */
    size_t used;  /* live keys in slots (not counting 0 and 1) */
    size_t tombs; /* tombstones in slots */
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

static inline size_t size_special(const KeyTable *s) {
    return (size_t)((s->special & HAS_ZERO) != 0) + (size_t)((s->special & HAS_ONE) != 0);
}

static inline int contains(const KeyTable *s, uint64_t k) {
    if (k <= TOMB)
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
        if (k > TOMB) {
            size_t i = mix(k) & mask;
            while (fresh[i] != EMPTY)
                i = (i + 1) & mask;
            fresh[i] = k;
        }
    }
    PyMem_Free(s->slots);
    s->slots = fresh;
    s->cap = cap;
    s->tombs = 0;
    return 0;
}

/* 1 if added, 0 if it was there, -1 on a memory error (the set unchanged). */
static int insert(KeyTable *s, uint64_t k) {
    if (k <= TOMB) {
        unsigned int bit = k == EMPTY ? HAS_ZERO : HAS_ONE;
        int added = (s->special & bit) == 0;
        s->special |= bit;
        return added;
    }
    if ((s->used + s->tombs + 1) * 4 > s->cap * 3 && rehash(s, cap_for(s->used + 1)) < 0)
        return -1;
    size_t mask = s->cap - 1, i = mix(k) & mask, tomb = SIZE_MAX;
    for (;;) {
        uint64_t v = s->slots[i];
        if (v == k)
            return 0;
        if (v == EMPTY)
            break;
        if (v == TOMB && tomb == SIZE_MAX)
            tomb = i;
        i = (i + 1) & mask;
    }
    if (tomb != SIZE_MAX) {
        i = tomb;
        s->tombs--;
    }
    s->slots[i] = k;
    s->used++;
    return 1;
}

/* 1 if removed, 0 if it was not there. A slot followed by an empty one ends no probe
 * chain but its own, so it becomes empty instead of a tombstone. */
static int erase(KeyTable *s, uint64_t k) {
    if (k <= TOMB) {
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
    if (s->slots[(i + 1) & mask] == EMPTY) {
        s->slots[i] = EMPTY;
    } else {
        s->slots[i] = TOMB;
        s->tombs++;
    }
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
    s->used = s->tombs = 0;
    s->special = 0;
    return 0;
}

#endif
