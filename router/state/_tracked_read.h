/* router.state._tracked's object, its read-only methods (queries, introspection) and
 * take(), which hands out and empties the netted key changes. Included by _tracked.c only. */
#ifndef PD_ROUTER_TRACKED_READ_H
#define PD_ROUTER_TRACKED_READ_H

#include <stdint.h>
#include <string.h>

#include "_keyset_table.h"
#include "_tracked_maps.h"
#include "_uint64_arg.h"

typedef struct {
    PyObject_HEAD
    BlockMap map;
    RefMap refs[2];                  /* by tier: GPU, offload */
    KeyTable added[2], removed[2];   /* presence changes since the last take, by tier */
    uint64_t *scratch;               /* one call's keys, converted */
    size_t scratch_cap;
    Py_ssize_t capacity;
    long long overflow;
    int fresh, touched, reset;
    int track; /* note presence changes for take() (a sidecar's); 0: an in-process table, read where it is */
} Tracked;

/* The entry of an engine hash, NIL when absent (or not a uint64); -1 on a non-int. */
static int lookup(Tracked *t, PyObject *hash, uint32_t *e) {
    uint64_t h;
    int r = as_key(hash, &h);
    *e = r == 1 ? bm_find(&t->map, h) : NIL;
    return r < 0 ? -1 : 0;
}

static PyObject *block_tuple(const Block *b) {
    const uint64_t *keys = block_keys(b);
    PyObject *out = PyTuple_New(b->nkeys);
    for (uint32_t j = 0; out != NULL && j < b->nkeys; j++) {
        PyObject *v = PyLong_FromUnsignedLongLong(keys[j]);
        if (v == NULL)
            Py_CLEAR(out);
        else
            PyTuple_SET_ITEM(out, j, v);
    }
    return out;
}

static PyObject *Tracked_keys_of(Tracked *t, PyObject *hash) {
    uint32_t e;
    if (lookup(t, hash, &e) < 0)
        return NULL;
    if (e == NIL)
        Py_RETURN_NONE;
    return block_tuple(&t->map.blocks[e]);
}

static PyObject *Tracked_last_key(Tracked *t, PyObject *hash) {
    uint32_t e;
    if (lookup(t, hash, &e) < 0)
        return NULL;
    if (e == NIL)
        Py_RETURN_NONE;
    const Block *b = &t->map.blocks[e];
    return PyLong_FromUnsignedLongLong(block_keys(b)[b->nkeys - 1]);
}

static PyObject *Tracked_holds(Tracked *t, PyObject *key) {
    uint64_t k;
    int r = as_key(key, &k);
    if (r < 0)
        return NULL;
    return PyBool_FromLong(r == 1 && (rm_get(&t->refs[0], k) || rm_get(&t->refs[1], k)));
}

static PyObject *Tracked_depth(Tracked *t, PyObject *args) {
    PyObject *keys;
    double weight, total = 0.0;
    if (!PyArg_ParseTuple(args, "Od", &keys, &weight))
        return NULL;
    PyObject *seq = PySequence_Fast(keys, "keys are a sequence of ints");
    if (seq == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(seq); j++) {
        uint64_t k;
        int r = as_key(PySequence_Fast_ITEMS(seq)[j], &k);
        if (r < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        if (r == 1 && rm_get(&t->refs[0], k))
            total += 1.0;
        else if (r == 1 && rm_get(&t->refs[1], k))
            total += weight;
        else
            break;
    }
    Py_DECREF(seq);
    return PyFloat_FromDouble(total);
}

/* entries() -> [(hash, keys, tiers)], oldest first (as the Python table's OrderedDict). */
static PyObject *Tracked_entries(Tracked *t, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New(0);
    for (uint32_t e = t->map.oldest; out != NULL && e != NIL; e = t->map.blocks[e].newer) {
        const Block *b = &t->map.blocks[e];
        PyObject *keys = block_tuple(b);
        PyObject *item = keys == NULL ? NULL : Py_BuildValue("(KNI)", (unsigned long long)b->hash, keys, b->tiers);
        if (item == NULL || PyList_Append(out, item) < 0)
            Py_CLEAR(out);
        Py_XDECREF(item);
    }
    return out;
}

static PyObject *ref_keys(const RefMap *m) {
    PyObject *out = PySet_New(NULL);
    for (size_t j = 0; out != NULL && j < m->cap; j++) {
        if (m->slots[j].count == 0)
            continue;
        PyObject *v = PyLong_FromUnsignedLongLong(m->slots[j].key);
        if (v == NULL || PySet_Add(out, v) < 0)
            Py_CLEAR(out);
        Py_XDECREF(v);
    }
    return out;
}

/* held() -> (GPU keys, offload keys): the keys some block holds, per tier. */
static PyObject *Tracked_held(Tracked *t, PyObject *Py_UNUSED(ignored)) {
    PyObject *gpu = ref_keys(&t->refs[0]), *off = gpu == NULL ? NULL : ref_keys(&t->refs[1]);
    if (off == NULL) {
        Py_XDECREF(gpu);
        return NULL;
    }
    return Py_BuildValue("(NN)", gpu, off);
}

static PyObject *Tracked_sizeof(Tracked *t, PyObject *Py_UNUSED(ignored)) {
    size_t n = sizeof(Tracked) + (size_t)t->map.alloc * sizeof(Block) + t->map.icap * sizeof(uint32_t)
               + t->scratch_cap * sizeof(uint64_t);
    for (uint32_t j = 0; j < t->map.alloc; j++)
        if (t->map.blocks[j].nkeys > 1)
            n += t->map.blocks[j].nkeys * sizeof(uint64_t);
    for (int i = 0; i < 2; i++)
        n += t->refs[i].cap * sizeof(Ref) + (t->added[i].cap + t->removed[i].cap) * sizeof(uint64_t);
    return PyLong_FromSize_t(n);
}


/* A key set's members as an array('Q'), the set left empty (its table kept, or cut down
 * to what it held if that was far less). */
static PyObject *take_keys(KeyTable *s) {
    size_t n = s->used + size_special(s), i = 0;
    PyObject *raw = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * 8));
    if (raw == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(raw);
    for (uint64_t k = 0; k <= FLAG_MAX; k++)
        if (contains(s, k))
            memcpy(p + 8 * i++, &k, 8);
    for (size_t j = 0; j < s->cap; j++)
        if (s->slots[j] > FLAG_MAX)
            memcpy(p + 8 * i++, &s->slots[j], 8);
    PyObject *out = PyObject_CallFunction(array_type, "sO", "Q", raw);
    Py_DECREF(raw);
    if (out == NULL)
        return NULL;
    size_t want = cap_for(n);
    if (s->cap > 4 * want && want != 0) {
        uint64_t *fresh = PyMem_Calloc(want, sizeof(uint64_t));
        if (fresh != NULL) {
            PyMem_Free(s->slots);
            s->slots = fresh;
            s->cap = want;
        } else {
            memset(s->slots, 0, s->cap * sizeof(uint64_t));
        }
    } else {
        memset(s->slots, 0, s->cap * sizeof(uint64_t));
    }
    s->used = 0;
    s->special = 0;
    return out;
}

/* take() -> None | (fresh, size, overflow, reset, added_gpu, removed_gpu, added_offload,
 * removed_offload): the changes since the last take (precise_native makes it a TableDelta). */
static PyObject *Tracked_take(Tracked *t, PyObject *Py_UNUSED(ignored)) {
    if (!t->track) {
        PyErr_SetString(PyExc_TypeError, "a table made with track=False notes no changes to take");
        return NULL;
    }
    KeyTable *sets[4] = {&t->added[0], &t->removed[0], &t->added[1], &t->removed[1]};
    int any = t->touched;
    for (int j = 0; j < 4; j++)
        any |= sets[j]->used + size_special(sets[j]) > 0;
    if (!any)
        Py_RETURN_NONE;
    PyObject *out = PyTuple_New(8);
    if (out == NULL)
        return NULL;
    PyTuple_SET_ITEM(out, 0, PyBool_FromLong(t->fresh));
    PyTuple_SET_ITEM(out, 1, PyLong_FromUnsignedLong(t->map.live));
    PyTuple_SET_ITEM(out, 2, PyLong_FromLongLong(t->overflow));
    PyTuple_SET_ITEM(out, 3, PyBool_FromLong(t->reset));
    for (int j = 0; j < 4; j++) {
        PyObject *keys = take_keys(sets[j]);
        if (keys == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, 4 + j, keys);
    }
    t->touched = t->reset = 0;
    return out;
}

static PyObject *Tracked_get_fresh(Tracked *t, void *Py_UNUSED(c)) { return PyBool_FromLong(t->fresh); }

static PyObject *Tracked_get_capacity(Tracked *t, void *Py_UNUSED(c)) { return PyLong_FromSsize_t(t->capacity); }

static PyObject *Tracked_get_overflow(Tracked *t, void *Py_UNUSED(c)) { return PyLong_FromLongLong(t->overflow); }

static Py_ssize_t Tracked_len(Tracked *t) { return (Py_ssize_t)t->map.live; }

#endif
