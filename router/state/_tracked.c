/* router.state._tracked: the sidecar's engine-block table in C (state layer).
 *
 * TrackedBlocks is router.state.precise_mirror.TrackedTable's data without a Python object
 * per block or per key: engine hash -> (router keys, tier bits) in LRU order with the
 * same capacity rule, a reference count per router key and tier, and per tier the keys
 * whose presence changed since the last take (netted: held then dropped in between is in
 * neither). One C call applies a whole event's blocks (store_tokens, which also chains
 * their router keys from the token ids, _tracked_tokens.h; store_run, store_flat,
 * remove_run) and take() builds the delta's four array('Q') straight from those sets. Same semantics
 * as the Python table (tests/state/test_tracked_native.py runs both on random streams);
 * router.state.precise_native adds the Python face. No Python objects are held.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *array_type; /* array.array */

#include "_tracked_read.h"

static int tier_index(long tier) { /* precise.py: GPU = 1, offload = 2 */
    if (tier == 1 || tier == 2)
        return (int)tier - 1;
    PyErr_Format(PyExc_ValueError, "a tier is 1 (GPU) or 2 (offload), not %ld", tier);
    return -1;
}

static int note(KeyTable *gone_from, KeyTable *into, uint64_t key) { /* netted: undo, else record */
    if (erase(gone_from, key))
        return 0;
    return insert(into, key) < 0 ? -1 : 0;
}

static int count_up(Tracked *t, int i, const uint64_t *keys, uint32_t n) {
    for (uint32_t j = 0; j < n; j++) {
        uint64_t c = rm_inc(&t->refs[i], keys[j]);
        if (c == 0 || (c == 1 && t->track && note(&t->removed[i], &t->added[i], keys[j]) < 0))
            return -1;
    }
    return 0;
}

static int count_down(Tracked *t, int i, const uint64_t *keys, uint32_t n) {
    for (uint32_t j = 0; j < n; j++)
        if (rm_dec(&t->refs[i], keys[j]) == 0 && t->track && note(&t->added[i], &t->removed[i], keys[j]) < 0)
            return -1;
    return 0;
}

/* One block stored on tier i: 1 if counts changed, 0 if it was only moved, -1 on error. */
static int store_one(Tracked *t, uint64_t h, const uint64_t *keys, uint32_t n, int i) {
    uint32_t bit = (uint32_t)i + 1, e = bm_find(&t->map, h);
    if (e == NIL) {
        if (bm_add(&t->map, h, keys, n, bit) == NIL)
            return -1;
        return count_up(t, i, keys, n) < 0 ? -1 : 1;
    }
    bm_touch(&t->map, e);
    Block *b = &t->map.blocks[e];
    if (b->tiers & bit)
        return 0;
    b->tiers |= bit;
    return count_up(t, i, block_keys(b), b->nkeys) < 0 ? -1 : 1;
}

/* Past capacity, the oldest blocks go (both tiers): 1 if any did, -1 on error. */
static int evict(Tracked *t) {
    int any = 0;
    while ((Py_ssize_t)t->map.live > t->capacity) {
        uint32_t e = t->map.oldest;
        Block *b = &t->map.blocks[e];
        for (int i = 0; i < 2; i++)
            if ((b->tiers & (uint32_t)(i + 1)) && count_down(t, i, block_keys(b), b->nkeys) < 0)
                return -1;
        bm_drop(&t->map, e);
        t->overflow++;
        any = 1;
    }
    return any;
}

static uint64_t *scratch(Tracked *t, size_t n) {
    if (n > t->scratch_cap) {
        uint64_t *more = PyMem_Realloc(t->scratch, n * sizeof(uint64_t));
        if (more == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        t->scratch = more;
        t->scratch_cap = n;
    }
    return t->scratch;
}

/* items[0:n] (ints) into the scratch buffer; NULL with an exception set. */
static uint64_t *convert(Tracked *t, PyObject **items, Py_ssize_t n) {
    uint64_t *out = scratch(t, n > 0 ? (size_t)n : 1);
    for (Py_ssize_t j = 0; out != NULL && j < n; j++)
        if (strict_key(items[j], &out[j]) < 0)
            return NULL;
    return out;
}

#include "_tracked_tokens.h"

static PyObject *Tracked_store_flat(Tracked *t, PyObject *args) {
    PyObject *hashes, *flat;
    Py_ssize_t per;
    long tier;
    if (!PyArg_ParseTuple(args, "OOnl", &hashes, &flat, &per, &tier))
        return NULL;
    int i = tier_index(tier);
    if (i < 0)
        return NULL;
    if (per < 1 || per > (Py_ssize_t)UINT32_MAX)
        return PyErr_Format(PyExc_ValueError, "per must be a positive int, not %zd", per);
    t->touched = 1;
    PyObject *hs = PySequence_Fast(hashes, "hashes are a sequence of ints");
    PyObject *ks = hs == NULL ? NULL : PySequence_Fast(flat, "keys are a sequence of ints");
    Py_ssize_t n = ks == NULL ? 0 : PySequence_Fast_GET_SIZE(ks) / per;
    if (ks != NULL && n > PySequence_Fast_GET_SIZE(hs))
        n = PySequence_Fast_GET_SIZE(hs);
    const uint64_t *keys = ks == NULL ? NULL : convert(t, PySequence_Fast_ITEMS(ks), n * per);
    int err = keys == NULL;
    for (Py_ssize_t j = 0; !err && j < n; j++) {
        uint64_t h;
        err = strict_key(PySequence_Fast_ITEMS(hs)[j], &h) < 0 || store_one(t, h, keys + j * per, (uint32_t)per, i) < 0;
    }
    Py_XDECREF(hs);
    Py_XDECREF(ks);
    if (err || evict(t) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The keys of one block (a sequence of ints, at least one) in the scratch buffer. */
static uint64_t *block_arg(Tracked *t, PyObject *obj, uint32_t *n) {
    PyObject *seq = PySequence_Fast(obj, "a block's keys are a sequence of ints");
    if (seq == NULL)
        return NULL;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    uint64_t *keys = NULL;
    if (len < 1 || len > (Py_ssize_t)UINT32_MAX)
        PyErr_SetString(PyExc_ValueError, "a block has at least one key");
    else
        keys = convert(t, PySequence_Fast_ITEMS(seq), len);
    *n = (uint32_t)len;
    Py_DECREF(seq);
    return keys;
}

/* store_run(hashes, keys, tier): hashes[j] holds the tuple keys[j] (zip's length). */
static PyObject *Tracked_store_run(Tracked *t, PyObject *args) {
    PyObject *hashes, *blocks;
    long tier;
    if (!PyArg_ParseTuple(args, "OOl", &hashes, &blocks, &tier))
        return NULL;
    int i = tier_index(tier);
    if (i < 0)
        return NULL;
    t->touched = 1;
    PyObject *hs = PySequence_Fast(hashes, "hashes are a sequence of ints");
    PyObject *bs = hs == NULL ? NULL : PySequence_Fast(blocks, "keys are a sequence of tuples");
    int err = bs == NULL;
    Py_ssize_t n = err ? 0 : Py_MIN(PySequence_Fast_GET_SIZE(hs), PySequence_Fast_GET_SIZE(bs));
    for (Py_ssize_t j = 0; !err && j < n; j++) {
        uint64_t h;
        uint32_t nk;
        const uint64_t *keys;
        err = strict_key(PySequence_Fast_ITEMS(hs)[j], &h) < 0
              || (keys = block_arg(t, PySequence_Fast_ITEMS(bs)[j], &nk)) == NULL || store_one(t, h, keys, nk, i) < 0;
    }
    Py_XDECREF(hs);
    Py_XDECREF(bs);
    if (err || evict(t) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* store(hash, keys, tier): one block; counts as changed only if its keys were counted. */
static PyObject *Tracked_store(Tracked *t, PyObject *args) {
    PyObject *hash, *keys_obj;
    long tier;
    uint64_t h;
    uint32_t nk;
    if (!PyArg_ParseTuple(args, "OOl", &hash, &keys_obj, &tier))
        return NULL;
    int i = tier_index(tier);
    const uint64_t *keys;
    if (i < 0 || strict_key(hash, &h) < 0 || (keys = block_arg(t, keys_obj, &nk)) == NULL)
        return NULL;
    int r = store_one(t, h, keys, nk, i), ev = r < 0 ? 0 : evict(t);
    if (r < 0 || ev < 0)
        return NULL;
    if (r > 0 || ev > 0)
        t->touched = 1;
    Py_RETURN_NONE;
}

static Py_ssize_t remove_hashes(Tracked *t, PyObject *hashes, long tier) {
    int i = tier_index(tier);
    if (i < 0)
        return -1;
    PyObject *hs = PySequence_Fast(hashes, "hashes are a sequence of ints");
    if (hs == NULL)
        return -1;
    uint32_t bit = (uint32_t)i + 1;
    Py_ssize_t found = 0, n = PySequence_Fast_GET_SIZE(hs);
    for (Py_ssize_t j = 0; j < n; j++) {
        uint64_t h;
        int r = as_key(PySequence_Fast_ITEMS(hs)[j], &h);
        if (r < 0) {
            found = -1;
            break;
        }
        uint32_t e = r == 1 ? bm_find(&t->map, h) : NIL;
        if (e == NIL || !(t->map.blocks[e].tiers & bit))
            continue;
        found++;
        Block *b = &t->map.blocks[e];
        if (count_down(t, i, block_keys(b), b->nkeys) < 0) {
            found = -1;
            break;
        }
        if (b->tiers == bit)
            bm_drop(&t->map, e);
        else
            b->tiers &= ~bit;
    }
    Py_DECREF(hs);
    bm_maybe_shrink(&t->map);
    rm_maybe_shrink(&t->refs[i]);
    return found;
}

static PyObject *Tracked_remove_run(Tracked *t, PyObject *args) {
    PyObject *hashes;
    long tier;
    if (!PyArg_ParseTuple(args, "Ol", &hashes, &tier))
        return NULL;
    t->touched = 1;
    Py_ssize_t found = remove_hashes(t, hashes, tier);
    return found < 0 ? NULL : PyLong_FromSsize_t(found);
}

static PyObject *Tracked_remove(Tracked *t, PyObject *args) {
    PyObject *hash;
    long tier;
    if (!PyArg_ParseTuple(args, "Ol", &hash, &tier))
        return NULL;
    PyObject *one = PyTuple_Pack(1, hash);
    Py_ssize_t found = one == NULL ? -1 : remove_hashes(t, one, tier);
    Py_XDECREF(one);
    if (found > 0)
        t->touched = 1;
    return found < 0 ? NULL : PyBool_FromLong(found > 0);
}

static int clear_all(Tracked *t) {
    bm_free(&t->map);
    for (int i = 0; i < 2; i++) {
        PyMem_Free(t->refs[i].slots);
        t->refs[i].slots = NULL;
        if (rm_init(&t->refs[i]) < 0 || reset(&t->added[i]) < 0 || reset(&t->removed[i]) < 0)
            return -1;
    }
    return bm_init(&t->map);
}

static PyObject *Tracked_clear(Tracked *t, PyObject *Py_UNUSED(ignored)) {
    PyMem_Free(t->scratch);
    t->scratch = NULL;
    t->scratch_cap = 0;
    if (clear_all(t) < 0)
        return NULL;
    t->reset = t->touched = 1;
    Py_RETURN_NONE;
}

static int Tracked_set_fresh(Tracked *t, PyObject *value, void *Py_UNUSED(c)) {
    int v = value == NULL ? -1 : PyObject_IsTrue(value);
    if (v < 0) {
        if (value == NULL)
            PyErr_SetString(PyExc_AttributeError, "fresh cannot be deleted");
        return -1;
    }
    t->fresh = v;
    t->touched = 1; /* every applied batch reaches the mirror, its freshness included */
    return 0;
}

static PyObject *Tracked_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Py_ssize_t capacity;
    int track = 1;
    static char *kwlist[] = {"capacity", "track", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n|$p:TrackedBlocks", kwlist, &capacity, &track))
        return NULL;
    if (capacity < 0)
        return PyErr_Format(PyExc_ValueError, "capacity must be >= 0, not %zd", capacity);
    Tracked *t = (Tracked *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    t->capacity = capacity;
    t->track = track;
    t->touched = 1; /* as the Python table, whose constructor sets fresh */
    if (clear_all(t) < 0) {
        Py_DECREF(t);
        return NULL;
    }
    return (PyObject *)t;
}

static void Tracked_dealloc(Tracked *t) {
    bm_free(&t->map);
    for (int i = 0; i < 2; i++) {
        PyMem_Free(t->refs[i].slots);
        PyMem_Free(t->added[i].slots);
        PyMem_Free(t->removed[i].slots);
    }
    PyMem_Free(t->scratch);
    Py_TYPE(t)->tp_free((PyObject *)t); /* a Python subclass's type is released by its own dealloc */
}

static PyMethodDef Tracked_methods[] = {
    {"store_flat", (PyCFunction)Tracked_store_flat, METH_VARARGS,
     "store_flat(hashes, keys, per, tier): hashes[j] holds keys[j*per:(j+1)*per] (the hot path)"},
    {"store_tokens", (PyCFunction)Tracked_store_tokens, METH_VARARGS,
     "store_tokens(hashes, tokens, block_size, per, seed, tier) -> int: blocks stored, keys chained here"},
    {"store_run", (PyCFunction)Tracked_store_run, METH_VARARGS,
     "store_run(hashes, keys, tier): hashes[j] holds the keys tuple keys[j]"},
    {"store", (PyCFunction)Tracked_store, METH_VARARGS, "store(hash, keys, tier)"},
    {"remove_run", (PyCFunction)Tracked_remove_run, METH_VARARGS,
     "remove_run(hashes, tier) -> int: drop one tier of each; how many the table had there"},
    {"remove", (PyCFunction)Tracked_remove, METH_VARARGS, "remove(hash, tier) -> bool"},
    {"keys_of", (PyCFunction)Tracked_keys_of, METH_O, "keys_of(hash) -> tuple[int, ...] | None"},
    {"last_key", (PyCFunction)Tracked_last_key, METH_O, "last_key(hash) -> int | None"},
    {"holds", (PyCFunction)Tracked_holds, METH_O, "holds(key) -> bool: on either tier"},
    {"depth", (PyCFunction)Tracked_depth, METH_VARARGS,
     "depth(keys, cpu_weight) -> float: leading keys held, an offloaded one counting cpu_weight"},
    {"clear", (PyCFunction)Tracked_clear, METH_NOARGS, "clear(): hold nothing (the next take says reset)"},
    {"take", (PyCFunction)Tracked_take, METH_NOARGS,
     "take() -> None | (fresh, size, overflow, reset, added_gpu, removed_gpu, added_offload, removed_offload)"},
    {"entries", (PyCFunction)Tracked_entries, METH_NOARGS, "entries() -> [(hash, keys, tiers)], oldest first"},
    {"held", (PyCFunction)Tracked_held, METH_NOARGS, "held() -> (set of GPU keys, set of offload keys)"},
    {"__sizeof__", (PyCFunction)Tracked_sizeof, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Tracked_getset[] = {
    {"fresh", (getter)Tracked_get_fresh, (setter)Tracked_set_fresh, "trusted (every event since a known state)", NULL},
    {"capacity", (getter)Tracked_get_capacity, NULL, "engine blocks kept; the oldest go beyond it", NULL},
    {"overflow", (getter)Tracked_get_overflow, NULL, "blocks forgotten because the table was full", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Tracked_as_sequence = {.sq_length = (lenfunc)Tracked_len};

static PyTypeObject TrackedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "router.state._tracked.TrackedBlocks",
    .tp_basicsize = sizeof(Tracked),
    .tp_dealloc = (destructor)Tracked_dealloc,
    .tp_as_sequence = &Tracked_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "TrackedBlocks(capacity): one engine's blocks, key refcounts and netted key changes",
    .tp_methods = Tracked_methods,
    .tp_getset = Tracked_getset,
    .tp_new = Tracked_new,
};

static PyMethodDef module_methods[] = {
    {"use_xxh3", (PyCFunction)tracked_use_xxh3, METH_O, "use_xxh3(address): XXH3_64bits_withSeed, for store_tokens"},
    {"xxh3", (PyCFunction)tracked_xxh3, METH_VARARGS, "xxh3(data, seed) -> int: with that function"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef tracked_module = {
    PyModuleDef_HEAD_INIT, "router.state._tracked",
    "The sidecar's engine-block tables in C (state layer; router.state.precise_native).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__tracked(void) {
    PyObject *array_mod = PyImport_ImportModule("array");
    if (array_mod == NULL)
        return NULL;
    array_type = PyObject_GetAttrString(array_mod, "array");
    Py_DECREF(array_mod);
    if (array_type == NULL || PyType_Ready(&TrackedType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&tracked_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&TrackedType);
    if (PyModule_AddObject(m, "TrackedBlocks", (PyObject *)&TrackedType) < 0) {
        Py_DECREF(&TrackedType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
