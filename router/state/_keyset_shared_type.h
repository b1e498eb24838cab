/* router.state._keyset.SharedKeys, the Python type over a segment of _keyset_shared.h
 * (state layer; included by _keyset.c only, after it): the writer's apply and copy_from,
 * the reader's lookups, depth and header words. */
#ifndef PD_ROUTER_KEYSET_SHARED_TYPE_H
#define PD_ROUTER_KEYSET_SHARED_TYPE_H

#include "_keyset_shared.h"

/* SharedKeys(segment, caps=None): over a writable buffer with caps=(gpu, offload), a new
 * table the caller writes (the buffer zeroed, of shared_size(*caps) bytes); without caps,
 * a reader of a table another process writes (any buffer, e.g. a read-only mmap). */
static PyObject *SharedKeys_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *segment, *caps = Py_None;
    static char *kwlist[] = {"segment", "caps", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:SharedKeys", kwlist, &segment, &caps))
        return NULL;
    SharedKeys *s = (SharedKeys *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    s->writer = caps != Py_None;
    if (PyObject_GetBuffer(segment, &s->view, s->writer ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        s->view.obj = NULL;
        Py_DECREF(s);
        return NULL;
    }
    if (((uintptr_t)s->view.buf & 7) != 0 || s->view.len < (Py_ssize_t)(HEADER_WORDS * 8)) {
        PyErr_SetString(PyExc_ValueError, "a segment is an 8-byte aligned buffer of at least its header");
        Py_DECREF(s);
        return NULL;
    }
    s->h = (uint64_t *)s->view.buf;
    if (s->writer) {
        unsigned long long c0, c1;
        if (!PyArg_ParseTuple(caps, "KK:caps", &c0, &c1)) {
            Py_DECREF(s);
            return NULL;
        }
        if (!valid_cap(c0) || !valid_cap(c1) || (uint64_t)s->view.len != 8 * shared_words(c0, c1)) {
            PyErr_SetString(PyExc_ValueError, "caps are powers of two >= 16 and the segment shared_size(*caps) bytes");
            Py_DECREF(s);
            return NULL;
        }
        memset(s->view.buf, 0, (size_t)s->view.len);
        s->h[H_CAP0] = c0;
        s->h[H_CAP1] = c1;
        __atomic_store_n(&s->h[H_MAGIC], SHARED_MAGIC, __ATOMIC_RELEASE);
    } else {
        uint64_t c0 = s->h[H_CAP0], c1 = s->h[H_CAP1];
        if (__atomic_load_n(&s->h[H_MAGIC], __ATOMIC_ACQUIRE) != SHARED_MAGIC || !valid_cap(c0) || !valid_cap(c1) ||
            (uint64_t)s->view.len != 8 * shared_words(c0, c1)) {
            PyErr_SetString(PyExc_ValueError, "not a key segment (magic, capacities or length)");
            Py_DECREF(s);
            return NULL;
        }
    }
    s->cap[0] = s->h[H_CAP0];
    s->cap[1] = s->h[H_CAP1];
    s->slots[0] = s->h + HEADER_WORDS;
    s->slots[1] = s->slots[0] + s->cap[0];
    return (PyObject *)s;
}

static void SharedKeys_dealloc(SharedKeys *s) {
    if (s->view.obj != NULL)
        PyBuffer_Release(&s->view);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static int need_writer(const SharedKeys *s) {
    if (!s->writer)
        PyErr_SetString(PyExc_TypeError, "this SharedKeys reads a segment another process writes");
    return s->writer ? 0 : -1;
}

/* apply(added_gpu, removed_gpu, added_offload, removed_offload, size, overflow, fresh):
 * a TableDelta's changes (removals first, per tier) and the table's state. Refused whole,
 * before any change, when the additions could pass 7/8 of a tier: the caller regrows. */
static PyObject *SharedKeys_apply(SharedKeys *s, PyObject *args) {
    PyObject *bufs[4];
    unsigned long long size, overflow;
    int fresh;
    if (need_writer(s) < 0 || !PyArg_ParseTuple(args, "OOOOKKp", &bufs[0], &bufs[1], &bufs[2], &bufs[3], &size,
                                                &overflow, &fresh))
        return NULL;
    Py_buffer views[4];
    int got = 0;
    for (; got < 4; got++)
        if (get_keys_buffer(bufs[got], &views[got]) < 0)
            break;
    PyObject *result = NULL;
    if (got == 4) {
        for (int t = 0; t < 2; t++)
            if ((s->h[H_USED0 + t] + (uint64_t)views[2 * t].len / 8) * 8 > s->cap[t] * 7) {
                PyErr_SetString(PyExc_OverflowError, "the additions do not fit this segment: regrow it");
                goto done;
            }
        for (int t = 0; t < 2; t++) {
            for (int add = 0; add < 2; add++) { /* removed first, then added */
                const Py_buffer *v = &views[2 * t + (add ? 0 : 1)];
                const char *p = (const char *)v->buf;
                Py_ssize_t n = v->len / 8;
                for (Py_ssize_t j = 0; j < n; j++) {
                    uint64_t k;
                    memcpy(&k, p + 8 * j, 8);
                    w_begin(s);
                    if (add)
                        w_insert(s, t, k);
                    else
                        w_erase(s, t, k);
                    w_end(s);
                }
            }
        }
        w_begin(s);
        STORE(&s->h[H_SIZE], (uint64_t)size);
        STORE(&s->h[H_OVERFLOW], (uint64_t)overflow);
        STORE(&s->h[H_FRESH], (uint64_t)(fresh != 0));
        w_end(s);
        result = Py_NewRef(Py_None);
    }
done:
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    return result;
}

/* copy_from(other): every key other holds, and its state, into this (new) segment. */
static PyObject *SharedKeys_copy_from(SharedKeys *s, PyObject *other) {
    if (need_writer(s) < 0)
        return NULL;
    if (!PyObject_TypeCheck(other, &SharedKeysType)) {
        PyErr_SetString(PyExc_TypeError, "copy_from takes a SharedKeys");
        return NULL;
    }
    const SharedKeys *o = (const SharedKeys *)other;
    for (int t = 0; t < 2; t++)
        if ((s->h[H_USED0 + t] + o->h[H_USED0 + t]) * 8 > s->cap[t] * 7) {
            PyErr_SetString(PyExc_OverflowError, "the keys do not fit this segment");
            return NULL;
        }
    w_begin(s);
    for (int t = 0; t < 2; t++) {
        for (uint64_t j = 0; j < o->cap[t]; j++)
            if (o->slots[t][j] != 0)
                w_insert(s, t, o->slots[t][j]);
    }
    STORE(&s->h[H_ZERO], s->h[H_ZERO] | o->h[H_ZERO]);
    STORE(&s->h[H_SIZE], o->h[H_SIZE]);
    STORE(&s->h[H_OVERFLOW], o->h[H_OVERFLOW]);
    STORE(&s->h[H_FRESH], o->h[H_FRESH]);
    w_end(s);
    Py_RETURN_NONE;
}

/* state() -> (size, overflow, fresh, used_gpu, used_offload), read consistently. */
static PyObject *SharedKeys_state(SharedKeys *s, PyObject *Py_UNUSED(ignored)) {
    uint64_t w[5] = {0, 0, 0, 0, 0};
    for (int n = 0; n < READ_TRIES; n++) {
        uint64_t q = __atomic_load_n(&s->h[H_SEQ], __ATOMIC_ACQUIRE);
        if (q & 1)
            continue;
        w[0] = LOAD(&s->h[H_SIZE]);
        w[1] = LOAD(&s->h[H_OVERFLOW]);
        w[2] = LOAD(&s->h[H_FRESH]);
        w[3] = LOAD(&s->h[H_USED0]) + ((LOAD(&s->h[H_ZERO]) >> 0) & 1);
        w[4] = LOAD(&s->h[H_USED1]) + ((LOAD(&s->h[H_ZERO]) >> 1) & 1);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (LOAD(&s->h[H_SEQ]) == q)
            break;
        w[2] = 0; /* never read whole: not fresh */
    }
    return Py_BuildValue("KKOKK", (unsigned long long)w[0], (unsigned long long)w[1], w[2] ? Py_True : Py_False,
                         (unsigned long long)w[3], (unsigned long long)w[4]);
}

/* tolist(tier) -> list[int]: a tier's keys (for tests and debugging; retried until whole). */
static PyObject *SharedKeys_tolist(SharedKeys *s, PyObject *arg) {
    long t = PyLong_AsLong(arg);
    if (t == -1 && PyErr_Occurred())
        return NULL;
    if (t != 0 && t != 1) {
        PyErr_SetString(PyExc_ValueError, "tier 0 (GPU) or 1 (offload)");
        return NULL;
    }
    for (int n = 0; n < READ_TRIES; n++) {
        uint64_t q = __atomic_load_n(&s->h[H_SEQ], __ATOMIC_ACQUIRE);
        if (q & 1)
            continue;
        PyObject *out = PyList_New(0);
        if (out == NULL)
            return NULL;
        uint64_t zero = (LOAD(&s->h[H_ZERO]) >> t) & 1;
        for (uint64_t j = 0; j < s->cap[t] + 1; j++) {
            uint64_t k = j == 0 ? 0 : LOAD(&s->slots[t][j - 1]);
            if (j == 0 ? !zero : k == 0)
                continue;
            PyObject *v = PyLong_FromUnsignedLongLong(k);
            if (v == NULL || PyList_Append(out, v) < 0) {
                Py_XDECREF(v);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(v);
        }
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (LOAD(&s->h[H_SEQ]) == q)
            return out;
        Py_DECREF(out);
    }
    PyErr_SetString(PyExc_RuntimeError, "the segment kept changing while it was read");
    return NULL;
}

static int SharedKeys_contains(SharedKeys *s, PyObject *key) { /* on either tier */
    uint64_t k;
    int r = as_key(key, &k);
    return r == 1 ? (r_contains(s, 0, k) || r_contains(s, 1, k)) : r;
}

/* depth(keys, cpu_weight) -> float: MirrorTable.depth over the segment. */
static PyObject *SharedKeys_depth(SharedKeys *s, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "depth(keys, cpu_weight)");
        return NULL;
    }
    double weight = PyFloat_AsDouble(args[1]);
    if (weight == -1.0 && PyErr_Occurred())
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "keys are a sequence of ints");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    double total = 0.0;
    for (Py_ssize_t j = 0; j < n; j++) {
        uint64_t k;
        int r = as_key(items[j], &k);
        if (r < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        if (r == 1 && r_contains(s, 0, k))
            total += 1.0;
        else if (r == 1 && r_contains(s, 1, k))
            total += weight;
        else
            break;
    }
    Py_DECREF(seq);
    return PyFloat_FromDouble(total);
}

static PyObject *shared_size(PyObject *Py_UNUSED(module), PyObject *args) {
    unsigned long long c0, c1;
    if (!PyArg_ParseTuple(args, "KK", &c0, &c1))
        return NULL;
    if (!valid_cap(c0) || !valid_cap(c1)) {
        PyErr_SetString(PyExc_ValueError, "capacities are powers of two in [16, 2**40]");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(8 * shared_words(c0, c1));
}

/* One header word: written whole by an atomic store, so read whole without the lock. */
static uint64_t r_word(const SharedKeys *s, int word) { return __atomic_load_n(&s->h[word], __ATOMIC_ACQUIRE); }

static PyObject *SharedKeys_get_fresh(SharedKeys *s, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(r_word(s, H_FRESH) != 0);
}

static PyObject *SharedKeys_get_size(SharedKeys *s, void *Py_UNUSED(closure)) {
    return PyLong_FromUnsignedLongLong(r_word(s, H_SIZE));
}

static PyObject *SharedKeys_get_overflow(SharedKeys *s, void *Py_UNUSED(closure)) {
    return PyLong_FromUnsignedLongLong(r_word(s, H_OVERFLOW));
}

static PyObject *SharedKeys_get_version(SharedKeys *s, void *Py_UNUSED(closure)) { /* changes with every write */
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&s->h[H_SEQ], __ATOMIC_ACQUIRE) & ~1ULL);
}

static PyObject *SharedKeys_get_caps(SharedKeys *s, void *Py_UNUSED(closure)) {
    return Py_BuildValue("KK", (unsigned long long)s->cap[0], (unsigned long long)s->cap[1]);
}

static PyMethodDef SharedKeys_methods[] = {
    {"apply", (PyCFunction)SharedKeys_apply, METH_VARARGS,
     "apply(added_gpu, removed_gpu, added_offload, removed_offload, size, overflow, fresh) (the writer)"},
    {"copy_from", (PyCFunction)SharedKeys_copy_from, METH_O, "copy_from(other): its keys and state (the writer)"},
    {"state", (PyCFunction)SharedKeys_state, METH_NOARGS, "state() -> (size, overflow, fresh, used_gpu, used_offload)"},
    {"tolist", (PyCFunction)SharedKeys_tolist, METH_O, "tolist(tier) -> list[int]"},
    {"depth", (PyCFunction)(void (*)(void))SharedKeys_depth, METH_FASTCALL,
     "depth(keys, cpu_weight) -> float: leading keys held, an offloaded one counting cpu_weight"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef SharedKeys_getset[] = {
    {"caps", (getter)SharedKeys_get_caps, NULL, "slots per tier (GPU, offload)", NULL},
    {"fresh", (getter)SharedKeys_get_fresh, NULL, "the table's freshness, as last written", NULL},
    {"size", (getter)SharedKeys_get_size, NULL, "engine blocks the table holds, as last written", NULL},
    {"overflow", (getter)SharedKeys_get_overflow, NULL, "blocks the table forgot when full, as last written", NULL},
    {"version", (getter)SharedKeys_get_version, NULL, "an even number that changes with every write", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods SharedKeys_as_sequence = {
    .sq_contains = (objobjproc)SharedKeys_contains,
};

static PyTypeObject SharedKeysType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "router.state._keyset.SharedKeys",
    .tp_basicsize = sizeof(SharedKeys),
    .tp_dealloc = (destructor)SharedKeys_dealloc,
    .tp_as_sequence = &SharedKeys_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SharedKeys(segment, caps=None): a table's held keys in a segment one process writes, others read",
    .tp_methods = SharedKeys_methods,
    .tp_getset = SharedKeys_getset,
    .tp_new = SharedKeys_new,
};

#endif
