/* router.state._keyset.SharedKeys: one engine table's held keys, per tier, in a memory
 * segment the ingestion sidecar writes and the router's loop reads (state layer; included
 * by _keyset.c only).
 *
 * Why: shipping key changes as deltas makes the loop pay a hash-table update per changed
 * key (~50 ns with the cache cold from serving requests: 2-3% of a core at 100k events/s).
 * Here the sidecar updates the tables in place and the loop only looks keys up, so KV
 * events cost the router's process nothing.
 *
 * The segment is HEADER_WORDS uint64 words, then the GPU tier's slots, then the offload
 * tier's: open addressing with linear probing, removals by backward shift, 0 an empty slot
 * (the key 0 is a flag bit in the header). Its capacities never change: the writer makes a
 * new segment to grow or shrink and the router maps that one instead. There is one writer
 * (a single-threaded sidecar) and any number of readers in other processes. Slots change
 * by atomic stores in an order that never shows a key that is not held (r_contains), and
 * each change runs inside a sequence count the writer makes odd before and even after:
 * a lookup that missed is trusted only if no change overlapped it, else retried (after
 * READ_TRIES misses the key counts absent: a shorter match, never a longer one).
 */
#ifndef PD_ROUTER_KEYSET_SHARED_H
#define PD_ROUTER_KEYSET_SHARED_H

#include <stdint.h>

enum { H_MAGIC, H_SEQ, H_CAP0, H_CAP1, H_USED0, H_USED1, H_ZERO, H_SIZE, H_OVERFLOW, H_FRESH, HEADER_WORDS = 16 };
#define SHARED_MAGIC 0x31454741534b4450ULL /* "PDKSAGE1", little-endian */
#define READ_TRIES 256
#define SHARED_MIN_CAP ((uint64_t)16)

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    uint64_t *h;
    uint64_t *slots[2];
    uint64_t cap[2];
    int writer;
} SharedKeys;

static PyTypeObject SharedKeysType;

#define LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

static inline void w_begin(SharedKeys *s) {
    STORE(&s->h[H_SEQ], s->h[H_SEQ] + 1);
    __atomic_thread_fence(__ATOMIC_RELEASE); /* odd before any slot changes */
}

static inline void w_end(SharedKeys *s) { __atomic_store_n(&s->h[H_SEQ], s->h[H_SEQ] + 1, __ATOMIC_RELEASE); }

static int s_probe(const SharedKeys *s, int t, uint64_t k) { /* 1 if held (a racy read: see r_contains) */
    if (k == 0)
        return (LOAD(&s->h[H_ZERO]) >> t) & 1;
    uint64_t mask = s->cap[t] - 1, i = mix(k) & mask;
    const uint64_t *slots = s->slots[t];
    for (uint64_t n = 0; n <= mask; n++, i = (i + 1) & mask) {
        uint64_t v = LOAD(&slots[i]);
        if (v == k)
            return 1;
        if (v == 0)
            return 0;
    }
    return 0;
}

/* A reader's lookup. A key read in a slot was held when it was read (an insert fills an
 * empty slot; a removal's backward shift writes each moved key into its new slot before
 * it clears the old one), so a hit is an answer at once. A miss can be a probe that a
 * shift overtook, so it counts only when no change overlapped it; else it is retried. */
static int r_contains(const SharedKeys *s, int t, uint64_t k) {
    for (int n = 0; n < READ_TRIES; n++) {
        uint64_t q = __atomic_load_n(&s->h[H_SEQ], __ATOMIC_ACQUIRE);
        if (s_probe(s, t, k))
            return 1;
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (!(q & 1) && LOAD(&s->h[H_SEQ]) == q)
            return 0;
    }
    return 0; /* missed every time while the writer kept changing the table: as good as absent */
}

/* The writer's insert: 1 if added, 0 if held (it checked the room beforehand). */
static int w_insert(SharedKeys *s, int t, uint64_t k) {
    if (k == 0) {
        int added = !((s->h[H_ZERO] >> t) & 1);
        STORE(&s->h[H_ZERO], s->h[H_ZERO] | (1ULL << t));
        return added;
    }
    int found;
    size_t i = probe_slot(s->slots[t], (size_t)s->cap[t] - 1, k, &found);
    if (found)
        return 0;
    STORE(&s->slots[t][i], k);
    STORE(&s->h[H_USED0 + t], s->h[H_USED0 + t] + 1);
    return 1;
}

/* The writer's erase, by _keyset_table.h's backward shift (its stores are atomic): 1 if removed. */
static int w_erase(SharedKeys *s, int t, uint64_t k) {
    if (k == 0) {
        int had = (s->h[H_ZERO] >> t) & 1;
        STORE(&s->h[H_ZERO], s->h[H_ZERO] & ~(1ULL << t));
        return had;
    }
    int found;
    size_t i = probe_slot(s->slots[t], (size_t)s->cap[t] - 1, k, &found);
    if (!found)
        return 0;
    shift_out(s->slots[t], (size_t)s->cap[t] - 1, i);
    STORE(&s->h[H_USED0 + t], s->h[H_USED0 + t] - 1);
    return 1;
}

static uint64_t shared_words(uint64_t cap0, uint64_t cap1) { return HEADER_WORDS + cap0 + cap1; }

static int valid_cap(uint64_t cap) { return cap >= SHARED_MIN_CAP && (cap & (cap - 1)) == 0 && cap <= (1ULL << 40); }

#endif
