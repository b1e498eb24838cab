/* The two maps behind router.state._tracked.TrackedBlocks (state layer), both open
 * addressing with linear probing over a power-of-two array, removals by backward shift
 * (no tombstones, so a probe never walks past dead slots):
 *
 *   BlockMap  engine hash -> its entry in an array of Blocks, which are also linked oldest
 *             to newest (the LRU order of the Python table's OrderedDict); the index
 *             stores entry + 1, 0 marking an empty slot, so every uint64 hash is a key;
 *   RefMap    router key -> reference count (a count of 0 marks an empty slot).
 *
 * Both grow past a load of 5/8 and shrink when under 1/8 (never under MIN_SLOTS):
 * memory follows what they hold. Included by _tracked.c only (needs Python.h for PyMem_*).
 */
#ifndef PD_ROUTER_TRACKED_MAPS_H
#define PD_ROUTER_TRACKED_MAPS_H

#include <stdint.h>
#include <string.h>

#define NIL UINT32_MAX
#define MIN_SLOTS ((size_t)16)
#define MAX_ENTRIES ((uint32_t)(UINT32_MAX - 1))

static inline size_t mix64(uint64_t k) { /* murmur3's finalizer */
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return (size_t)k;
}

static size_t slots_for(size_t n) { /* the smallest power of two holding n at a load <= 1/2 */
    size_t cap = MIN_SLOTS;
    while (cap / 2 < n) {
        if (cap > ((size_t)PY_SSIZE_T_MAX / 16) / 2)
            return 0;
        cap <<= 1;
    }
    return cap;
}

/* -- engine blocks ------------------------------------------------------------------- */
typedef struct {
    uint64_t hash;
    union {
        uint64_t one;    /* nkeys == 1 */
        uint64_t *many;  /* nkeys > 1: PyMem */
    } k;
    uint32_t older, newer; /* the LRU links; newer doubles as the free list's */
    uint32_t nkeys;        /* 0: a free entry */
    uint32_t tiers;
} Block;

typedef struct {
    Block *blocks;
    uint32_t alloc, live, free_head, oldest, newest;
    uint32_t *index; /* entry + 1 per slot, 0 empty */
    size_t icap;
} BlockMap;

static inline const uint64_t *block_keys(const Block *b) { return b->nkeys == 1 ? &b->k.one : b->k.many; }

static uint32_t bm_find(const BlockMap *m, uint64_t h) {
    size_t mask = m->icap - 1, i = mix64(h) & mask;
    for (;;) {
        uint32_t e = m->index[i];
        if (e == 0)
            return NIL;
        if (m->blocks[e - 1].hash == h)
            return e - 1;
        i = (i + 1) & mask;
    }
}

static int bm_reindex(BlockMap *m, size_t cap) {
    if (cap == 0) {
        PyErr_NoMemory();
        return -1;
    }
    uint32_t *fresh = PyMem_Calloc(cap, sizeof(uint32_t));
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t mask = cap - 1;
    for (size_t j = 0; j < m->icap; j++) {
        uint32_t e = m->index[j];
        if (e != 0) {
            size_t i = mix64(m->blocks[e - 1].hash) & mask;
            while (fresh[i] != 0)
                i = (i + 1) & mask;
            fresh[i] = e;
        }
    }
    PyMem_Free(m->index);
    m->index = fresh;
    m->icap = cap;
    return 0;
}

static void bm_unindex(BlockMap *m, uint64_t h) {
    size_t mask = m->icap - 1, i = mix64(h) & mask;
    while (m->index[i] != 0 && m->blocks[m->index[i] - 1].hash != h)
        i = (i + 1) & mask;
    if (m->index[i] == 0)
        return;
    for (size_t j = (i + 1) & mask; m->index[j] != 0; j = (j + 1) & mask) {
        size_t home = mix64(m->blocks[m->index[j] - 1].hash) & mask;
        /* move j back to i unless its home lies cyclically in (i, j] */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->index[i] = m->index[j];
            i = j;
        }
    }
    m->index[i] = 0;
}

/* A new newest entry for h (not in the map), its keys copied; NIL on a memory error. */
static uint32_t bm_add(BlockMap *m, uint64_t h, const uint64_t *keys, uint32_t nkeys, uint32_t tiers) {
    if (((size_t)m->live + 1) * 8 > m->icap * 5 && bm_reindex(m, slots_for((size_t)m->live + 1)) < 0)
        return NIL;
    if (m->free_head == NIL) {
        if (m->alloc >= MAX_ENTRIES) {
            PyErr_NoMemory();
            return NIL;
        }
        uint32_t grown = m->alloc < 8 ? 16 : (m->alloc > MAX_ENTRIES / 2 ? MAX_ENTRIES : m->alloc * 2);
        Block *more = PyMem_Realloc(m->blocks, (size_t)grown * sizeof(Block));
        if (more == NULL) {
            PyErr_NoMemory();
            return NIL;
        }
        m->blocks = more;
        for (uint32_t j = grown; j-- > m->alloc;) { /* free, lowest first */
            more[j].nkeys = 0;
            more[j].newer = m->free_head;
            m->free_head = j;
        }
        m->alloc = grown;
    }
    uint32_t e = m->free_head;
    Block *b = &m->blocks[e];
    if (nkeys == 1) {
        b->k.one = keys[0];
    } else {
        b->k.many = PyMem_Malloc((size_t)nkeys * sizeof(uint64_t));
        if (b->k.many == NULL) {
            PyErr_NoMemory();
            return NIL;
        }
        memcpy(b->k.many, keys, (size_t)nkeys * sizeof(uint64_t));
    }
    m->free_head = b->newer;
    b->hash = h;
    b->nkeys = nkeys;
    b->tiers = tiers;
    b->older = m->newest;
    b->newer = NIL;
    if (m->newest != NIL)
        m->blocks[m->newest].newer = e;
    else
        m->oldest = e;
    m->newest = e;
    size_t mask = m->icap - 1, i = mix64(h) & mask;
    while (m->index[i] != 0)
        i = (i + 1) & mask;
    m->index[i] = e + 1;
    m->live++;
    return e;
}

static void bm_unlink(BlockMap *m, uint32_t e) {
    Block *b = &m->blocks[e];
    if (b->older != NIL)
        m->blocks[b->older].newer = b->newer;
    else
        m->oldest = b->newer;
    if (b->newer != NIL)
        m->blocks[b->newer].older = b->older;
    else
        m->newest = b->older;
}

static void bm_touch(BlockMap *m, uint32_t e) { /* make e the newest */
    if (m->newest == e)
        return;
    bm_unlink(m, e);
    Block *b = &m->blocks[e];
    b->older = m->newest;
    b->newer = NIL;
    m->blocks[m->newest].newer = e;
    m->newest = e;
}

/* Forget entry e (its keys' counts are the caller's). */
static void bm_drop(BlockMap *m, uint32_t e) {
    Block *b = &m->blocks[e];
    bm_unindex(m, b->hash);
    bm_unlink(m, e);
    if (b->nkeys > 1)
        PyMem_Free(b->k.many);
    b->nkeys = 0;
    b->newer = m->free_head;
    m->free_head = e;
    m->live--;
}

static void bm_maybe_shrink(BlockMap *m) { /* after removals; a failed shrink is harmless */
    if (m->icap > MIN_SLOTS && (size_t)m->live * 8 < m->icap && bm_reindex(m, slots_for(m->live)) < 0)
        PyErr_Clear();
}

static void bm_free(BlockMap *m) {
    for (uint32_t j = 0; j < m->alloc; j++)
        if (m->blocks[j].nkeys > 1)
            PyMem_Free(m->blocks[j].k.many);
    PyMem_Free(m->blocks);
    PyMem_Free(m->index);
    memset(m, 0, sizeof(*m));
    m->free_head = m->oldest = m->newest = NIL;
}

static int bm_init(BlockMap *m) {
    memset(m, 0, sizeof(*m));
    m->free_head = m->oldest = m->newest = NIL;
    m->index = PyMem_Calloc(MIN_SLOTS, sizeof(uint32_t));
    if (m->index == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    m->icap = MIN_SLOTS;
    return 0;
}

/* -- key reference counts ------------------------------------------------------------ */
typedef struct {
    uint64_t key;
    uint64_t count; /* 0: empty */
} Ref;

typedef struct {
    Ref *slots;
    size_t cap, used;
} RefMap;

static uint64_t rm_get(const RefMap *m, uint64_t key) {
    size_t mask = m->cap - 1, i = mix64(key) & mask;
    for (;;) {
        const Ref *r = &m->slots[i];
        if (r->count == 0)
            return 0;
        if (r->key == key)
            return r->count;
        i = (i + 1) & mask;
    }
}

static int rm_resize(RefMap *m, size_t cap) {
    if (cap == 0) {
        PyErr_NoMemory();
        return -1;
    }
    Ref *fresh = PyMem_Calloc(cap, sizeof(Ref));
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t mask = cap - 1;
    for (size_t j = 0; j < m->cap; j++) {
        if (m->slots[j].count != 0) {
            size_t i = mix64(m->slots[j].key) & mask;
            while (fresh[i].count != 0)
                i = (i + 1) & mask;
            fresh[i] = m->slots[j];
        }
    }
    PyMem_Free(m->slots);
    m->slots = fresh;
    m->cap = cap;
    return 0;
}

/* The key's count after adding one, or 0 on a memory error. */
static uint64_t rm_inc(RefMap *m, uint64_t key) {
    size_t mask = m->cap - 1, i = mix64(key) & mask;
    for (;; i = (i + 1) & mask) {
        Ref *r = &m->slots[i];
        if (r->count == 0)
            break;
        if (r->key == key)
            return ++r->count;
    }
    if ((m->used + 1) * 8 > m->cap * 5) {
        if (rm_resize(m, slots_for(m->used + 1)) < 0)
            return 0;
        mask = m->cap - 1;
        for (i = mix64(key) & mask; m->slots[i].count != 0; i = (i + 1) & mask)
            ;
    }
    m->slots[i].key = key;
    m->slots[i].count = 1;
    m->used++;
    return 1;
}

/* The key's count after taking one off (0: it is gone), or NOT_HELD when it was not there. */
#define NOT_HELD UINT64_MAX
static uint64_t rm_dec(RefMap *m, uint64_t key) {
    size_t mask = m->cap - 1, i = mix64(key) & mask;
    for (;; i = (i + 1) & mask) {
        Ref *r = &m->slots[i];
        if (r->count == 0)
            return NOT_HELD;
        if (r->key == key)
            break;
    }
    if (--m->slots[i].count != 0)
        return m->slots[i].count;
    for (size_t j = (i + 1) & mask; m->slots[j].count != 0; j = (j + 1) & mask) {
        size_t home = mix64(m->slots[j].key) & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].count = 0;
    m->used--;
    return 0;
}

static void rm_maybe_shrink(RefMap *m) { /* a failed shrink is harmless */
    if (m->cap > MIN_SLOTS && m->used * 8 < m->cap && rm_resize(m, slots_for(m->used)) < 0)
        PyErr_Clear();
}

static int rm_init(RefMap *m) {
    m->slots = PyMem_Calloc(MIN_SLOTS, sizeof(Ref));
    if (m->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    m->cap = MIN_SLOTS;
    m->used = 0;
    return 0;
}

#endif
