/* router.state._tracked's store_tokens: a BlockStored's router keys computed here, from its
 * token ids, instead of in Python (array('I'), struct, a PyLong per key, a tuple per block).
 *
 * The chain is router.request.hashing's own: key_i = xxh3_64(block_i, seed=key_{i-1}), a
 * router block being its token ids as little-endian uint32. xxh3_64 is the xxHash
 * library's XXH3_64bits_withSeed; this module has no copy of it but is handed its address
 * (router.state.precise_native takes it from the xxhash package's extension, which
 * exports it, and checks it against xxhash.xxh3_64_intdigest first). Until then, or if
 * that check failed, store_tokens refuses and the Python chain serves.
 * Included by _tracked.c only, after store_one and evict.
 */
#ifndef PD_ROUTER_TRACKED_TOKENS_H
#define PD_ROUTER_TRACKED_TOKENS_H

typedef uint64_t (*xxh3_fn)(const void *data, size_t len, uint64_t seed);
static xxh3_fn xxh3_64;

/* use_xxh3(address): the function store_tokens hashes with (0: none). */
static PyObject *tracked_use_xxh3(PyObject *Py_UNUSED(module), PyObject *address) {
    void *p = PyLong_AsVoidPtr(address);
    if (p == NULL && PyErr_Occurred())
        return NULL;
    xxh3_64 = (xxh3_fn)p;
    Py_RETURN_NONE;
}

/* xxh3(data, seed) -> int: the handed function on a bytes object (for that check). */
static PyObject *tracked_xxh3(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer data;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "y*K", &data, &seed))
        return NULL;
    PyObject *out = xxh3_64 == NULL ? PyErr_Format(PyExc_RuntimeError, "no xxh3_64: use_xxh3 first")
                                    : PyLong_FromUnsignedLongLong(xxh3_64(data.buf, (size_t)data.len, seed));
    PyBuffer_Release(&data);
    return out;
}

/* Token ids as uint32 little-endian bytes; -1 with OverflowError or TypeError on one that
 * is not a uint32 (as array('I') refuses it). */
static int pack_tokens(PyObject **items, Py_ssize_t n, unsigned char *out) {
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *v = items[j];
        if (!PyLong_Check(v)) {
            PyErr_Format(PyExc_TypeError, "a token id is an int, not %.100s", Py_TYPE(v)->tp_name);
            return -1;
        }
        unsigned long x = PyLong_AsUnsignedLong(v);
        if ((x == (unsigned long)-1 && PyErr_Occurred()) || x > 0xFFFFFFFFUL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_OverflowError, "a token id is a uint32");
            return -1;
        }
        out[4 * j] = (unsigned char)x;
        out[4 * j + 1] = (unsigned char)(x >> 8);
        out[4 * j + 2] = (unsigned char)(x >> 16);
        out[4 * j + 3] = (unsigned char)(x >> 24);
    }
    return 0;
}

/* store_tokens(hashes, tokens, block_size, per, seed, tier) -> int: n = min(len(hashes),
 * len(tokens) // block_size) blocks stored, hashes[j] holding the per router keys chained
 * from seed over its block_size tokens (block_size / per each); nothing is stored when a
 * token id is not a uint32. */
static PyObject *Tracked_store_tokens(Tracked *t, PyObject *args) {
    PyObject *hashes, *tokens;
    Py_ssize_t bs, per;
    unsigned long long seed;
    long tier;
    if (!PyArg_ParseTuple(args, "OOnnKl", &hashes, &tokens, &bs, &per, &seed, &tier))
        return NULL;
    int i = tier_index(tier);
    if (i < 0)
        return NULL;
    if (xxh3_64 == NULL)
        return PyErr_Format(PyExc_RuntimeError, "no xxh3_64: use_xxh3 first");
    if (bs < 1 || per < 1 || bs % per || per > (Py_ssize_t)UINT32_MAX)
        return PyErr_Format(PyExc_ValueError, "per (%zd) must divide block_size (%zd)", per, bs);
    PyObject *hs = PySequence_Fast(hashes, "hashes are a sequence of ints");
    PyObject *ts = hs == NULL ? NULL : PySequence_Fast(tokens, "token ids are a sequence of ints");
    if (ts == NULL) {
        Py_XDECREF(hs);
        return NULL;
    }
    Py_ssize_t n = Py_MIN(PySequence_Fast_GET_SIZE(hs), PySequence_Fast_GET_SIZE(ts) / bs);
    size_t nkeys = (size_t)(n * per), block_bytes = (size_t)(bs / per) * 4;
    /* the hashes, the keys, then the packed tokens: every input checked before any store */
    uint64_t *hv = scratch(t, (size_t)n + nkeys + ((size_t)(n * bs) + 1) / 2 + 1), *keys = hv + n;
    unsigned char *packed = hv == NULL ? NULL : (unsigned char *)(keys + nkeys);
    int err = packed == NULL || pack_tokens(PySequence_Fast_ITEMS(ts), n * bs, packed) < 0;
    for (Py_ssize_t j = 0; !err && j < n; j++)
        err = strict_key(PySequence_Fast_ITEMS(hs)[j], &hv[j]) < 0;
    if (!err) {
        uint64_t prev = seed;
        for (size_t b = 0; b < nkeys; b++)
            keys[b] = prev = xxh3_64(packed + b * block_bytes, block_bytes, prev);
        t->touched = 1;
    }
    for (Py_ssize_t j = 0; !err && j < n; j++)
        err = store_one(t, hv[j], keys + j * per, (uint32_t)per, i) < 0;
    Py_DECREF(hs);
    Py_DECREF(ts);
    if (err || evict(t) < 0)
        return NULL;
    return PyLong_FromSsize_t(n);
}

#endif
