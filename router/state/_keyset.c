/* router.state._keyset: a set of uint64 keys for the router's mirror tables (state layer).
 *
 * The loop applies a sidecar's deltas (packed uint64 arrays) to per-tier key sets and
 * decisions ask which leading keys of a prompt are held. With Python sets every key of a
 * delta becomes a PyLong first (.tolist()), ~175 ns per key change on a busy loop; here a
 * delta is read straight from its buffer into the hash table of _keyset_table.h. No
 * Python objects are held, so the type needs no GC support.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_keyset_table.h"
#include "_uint64_arg.h"

typedef struct {
    PyObject_HEAD
    KeyTable t;
} KeySet;

static PyTypeObject KeySetType;

/* A buffer of uint64 items (array('Q'), a memoryview cast to 'Q'), one dimension. */
static int get_keys_buffer(PyObject *obj, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    const char *f = view->format == NULL ? "B" : view->format;
    if (*f == '@' || *f == '=')
        f++;
    int ok = view->ndim == 1 && view->itemsize == 8 && (strcmp(f, "Q") == 0 || strcmp(f, "L") == 0);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "a key buffer holds uint64 items ('Q'), not '%s' of %zd bytes",
                     view->format == NULL ? "B" : view->format, view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

typedef int (*key_op)(KeyTable *, uint64_t);

/* op over keys[start:stop] (a uint64 buffer, or any iterable of ints without bounds);
 * returns how many keys op changed, or -1 with an exception set. */
static Py_ssize_t bulk(KeySet *s, PyObject *args, key_op op) {
    PyObject *keys;
    Py_ssize_t start = 0, stop = PY_SSIZE_T_MAX;
    if (!PyArg_ParseTuple(args, "O|nn", &keys, &start, &stop))
        return -1;
    Py_ssize_t changed = 0;
    if (PyObject_CheckBuffer(keys)) {
        Py_buffer view;
        if (get_keys_buffer(keys, &view) < 0)
            return -1;
        Py_ssize_t n = view.len / 8;
        if (stop > n)
            stop = n;
        if (start < 0 || start > stop) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_IndexError, "start must be in [0, stop]");
            return -1;
        }
        const char *p = (const char *)view.buf;
        for (Py_ssize_t j = start; j < stop; j++) {
            uint64_t k;
            memcpy(&k, p + 8 * j, 8);
            int r = op(&s->t, k);
            if (r < 0) {
                changed = -1;
                break;
            }
            changed += r;
        }
        PyBuffer_Release(&view);
        return changed;
    }
    if (start != 0 || stop != PY_SSIZE_T_MAX) {
        PyErr_SetString(PyExc_TypeError, "start and stop need a uint64 buffer");
        return -1;
    }
    PyObject *it = PyObject_GetIter(keys);
    if (it == NULL)
        return -1;
    PyObject *item;
    while ((item = PyIter_Next(it)) != NULL) {
        uint64_t k;
        int r = strict_key(item, &k);
        Py_DECREF(item);
        if (r == 0)
            r = op(&s->t, k);
        if (r < 0) {
            Py_DECREF(it);
            return -1;
        }
        changed += r;
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : changed;
}

static PyObject *KeySet_add_keys(KeySet *s, PyObject *args) {
    Py_ssize_t n = bulk(s, args, insert);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

static PyObject *KeySet_remove_keys(KeySet *s, PyObject *args) {
    Py_ssize_t n = bulk(s, args, erase);
    maybe_shrink(&s->t);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

static PyObject *KeySet_add(KeySet *s, PyObject *key) {
    uint64_t k;
    if (strict_key(key, &k) < 0 || insert(&s->t, k) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *KeySet_discard(KeySet *s, PyObject *key) {
    uint64_t k;
    int r = as_key(key, &k);
    if (r < 0)
        return NULL;
    if (r == 1 && erase(&s->t, k))
        maybe_shrink(&s->t);
    Py_RETURN_NONE;
}

static PyObject *KeySet_clear(KeySet *s, PyObject *Py_UNUSED(ignored)) {
    if (reset(&s->t) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *KeySet_tolist(KeySet *s, PyObject *Py_UNUSED(ignored)) {
    Py_ssize_t n = (Py_ssize_t)(s->t.used + size_special(&s->t)), i = 0;
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (size_t j = 0; i < n && j < s->t.cap + 2; j++) { /* the flags' keys 0 and 1, then the slots */
        uint64_t k = j < 2 ? (uint64_t)j : s->t.slots[j - 2];
        if (j < 2 ? !contains(&s->t, k) : k <= FLAG_MAX)
            continue;
        PyObject *v = PyLong_FromUnsignedLongLong(k);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i++, v);
    }
    return out;
}

static PyObject *KeySet_iter(KeySet *s) {
    PyObject *list = KeySet_tolist(s, NULL);
    if (list == NULL)
        return NULL;
    PyObject *it = PyObject_GetIter(list);
    Py_DECREF(list);
    return it;
}

static PyObject *KeySet_sizeof(KeySet *s, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromSize_t(sizeof(KeySet) + s->t.cap * sizeof(uint64_t));
}

static PyObject *KeySet_get_capacity(KeySet *s, void *Py_UNUSED(closure)) { return PyLong_FromSize_t(s->t.cap); }

static Py_ssize_t KeySet_len(KeySet *s) { return (Py_ssize_t)(s->t.used + size_special(&s->t)); }

static int KeySet_contains(KeySet *s, PyObject *key) {
    uint64_t k;
    int r = as_key(key, &k);
    return r == 1 ? contains(&s->t, k) : r;
}

static PyObject *KeySet_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *keys = NULL;
    static char *kwlist[] = {"keys", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:KeySet", kwlist, &keys))
        return NULL;
    KeySet *s = (KeySet *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    if (reset(&s->t) < 0) {
        Py_DECREF(s);
        return NULL;
    }
    if (keys != NULL) {
        PyObject *one = PyTuple_Pack(1, keys);
        Py_ssize_t n = one == NULL ? -1 : bulk(s, one, insert);
        Py_XDECREF(one);
        if (n < 0) {
            Py_DECREF(s);
            return NULL;
        }
    }
    return (PyObject *)s;
}

static void KeySet_dealloc(KeySet *s) {
    PyMem_Free(s->t.slots);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *KeySet_repr(KeySet *s) {
    return PyUnicode_FromFormat("KeySet(<%zd keys>)", KeySet_len(s));
}

/* depth(keys, gpu, offload, cpu_weight): the leading keys held, 1 each on gpu, cpu_weight
 * each on offload only (MirrorTable.depth, BlockTable.depth). */
static PyObject *keyset_depth(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "depth(keys, gpu, offload, cpu_weight)");
        return NULL;
    }
    if (!PyObject_TypeCheck(args[1], &KeySetType) || !PyObject_TypeCheck(args[2], &KeySetType)) {
        PyErr_SetString(PyExc_TypeError, "gpu and offload are KeySets");
        return NULL;
    }
    const KeySet *gpu = (const KeySet *)args[1], *offload = (const KeySet *)args[2];
    double weight = PyFloat_AsDouble(args[3]);
    if (weight == -1.0 && PyErr_Occurred())
        return NULL;
    double total = 0.0;
    if (PyObject_CheckBuffer(args[0])) {
        Py_buffer view;
        if (get_keys_buffer(args[0], &view) < 0)
            return NULL;
        const char *p = (const char *)view.buf;
        Py_ssize_t n = view.len / 8;
        for (Py_ssize_t j = 0; j < n; j++) {
            uint64_t k;
            memcpy(&k, p + 8 * j, 8);
            if (contains(&gpu->t, k))
                total += 1.0;
            else if (contains(&offload->t, k))
                total += weight;
            else
                break;
        }
        PyBuffer_Release(&view);
        return PyFloat_FromDouble(total);
    }
    PyObject *seq = PySequence_Fast(args[0], "keys are a sequence of ints or a uint64 buffer");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t j = 0; j < n; j++) {
        uint64_t k;
        int r = as_key(items[j], &k);
        if (r < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        if (r == 1 && contains(&gpu->t, k))
            total += 1.0;
        else if (r == 1 && contains(&offload->t, k))
            total += weight;
        else
            break;
    }
    Py_DECREF(seq);
    return PyFloat_FromDouble(total);
}

static PyMethodDef KeySet_methods[] = {
    {"add_keys", (PyCFunction)KeySet_add_keys, METH_VARARGS,
     "add_keys(keys, start=0, stop=len) -> int: add keys[start:stop] (a uint64 buffer, or ints); how many were new"},
    {"remove_keys", (PyCFunction)KeySet_remove_keys, METH_VARARGS,
     "remove_keys(keys, start=0, stop=len) -> int: remove keys[start:stop]; how many were held"},
    {"add", (PyCFunction)KeySet_add, METH_O, "add(key)"},
    {"discard", (PyCFunction)KeySet_discard, METH_O, "discard(key): remove it if held"},
    {"clear", (PyCFunction)KeySet_clear, METH_NOARGS, "clear(): hold nothing (and release the table)"},
    {"tolist", (PyCFunction)KeySet_tolist, METH_NOARGS, "tolist() -> list[int], in no order"},
    {"__sizeof__", (PyCFunction)KeySet_sizeof, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef KeySet_getset[] = {
    {"capacity", (getter)KeySet_get_capacity, NULL, "slots in the table", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods KeySet_as_sequence = {
    .sq_length = (lenfunc)KeySet_len,
    .sq_contains = (objobjproc)KeySet_contains,
};

static PyTypeObject KeySetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "router.state._keyset.KeySet",
    .tp_basicsize = sizeof(KeySet),
    .tp_dealloc = (destructor)KeySet_dealloc,
    .tp_repr = (reprfunc)KeySet_repr,
    .tp_as_sequence = &KeySet_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "KeySet(keys=()): a set of uint64 keys, bulk-updated from uint64 buffers",
    .tp_iter = (getiterfunc)KeySet_iter,
    .tp_methods = KeySet_methods,
    .tp_getset = KeySet_getset,
    .tp_new = KeySet_new,
};

#include "_keyset_shared_type.h"

static PyMethodDef module_methods[] = {
    {"depth", (PyCFunction)(void (*)(void))keyset_depth, METH_FASTCALL,
     "depth(keys, gpu, offload, cpu_weight) -> float: leading keys held, an offloaded one counting cpu_weight"},
    {"shared_size", (PyCFunction)shared_size, METH_VARARGS,
     "shared_size(cap_gpu, cap_offload) -> int: the bytes of a SharedKeys segment"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef keyset_module = {
    PyModuleDef_HEAD_INIT, "router.state._keyset",
    "Native uint64 key sets for the mirror tables (state layer; router.state.precise_mirror).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__keyset(void) {
    if (PyType_Ready(&KeySetType) < 0 || PyType_Ready(&SharedKeysType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&keyset_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "KeySet", (PyObject *)&KeySetType) < 0 ||
        PyModule_AddObjectRef(m, "SharedKeys", (PyObject *)&SharedKeysType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
