/* Python ints as uint64 keys, for router.state's C extensions (_keyset.c, _tracked.c). */
#ifndef PD_ROUTER_UINT64_ARG_H
#define PD_ROUTER_UINT64_ARG_H

#include <stdint.h>

/* A Python int as a key: 1 with *out set, 0 if it is an int no key can equal (negative or
 * >= 2**64), -1 with an exception set if it is not an int. (Not PyLong_AsUnsignedLongLong:
 * below 3.13 it converts a multi-digit int byte by byte, most of a lookup's time.) */
static int as_key(PyObject *obj, uint64_t *out) {
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "keys are ints, not %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
#if PY_VERSION_HEX >= 0x030D0000
    Py_ssize_t n = PyLong_AsNativeBytes(obj, out, (Py_ssize_t)sizeof(*out),
                                        Py_ASNATIVEBYTES_NATIVE_ENDIAN | Py_ASNATIVEBYTES_UNSIGNED_BUFFER |
                                            Py_ASNATIVEBYTES_REJECT_NEGATIVE);
    if (n < 0) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            return -1;
        PyErr_Clear(); /* negative */
        return 0;
    }
    return n <= (Py_ssize_t)sizeof(*out);
#else
    if (_PyLong_Sign(obj) < 0)
        return 0;
    size_t bits = _PyLong_NumBits(obj);
    if (bits > 64) {
        if (bits == (size_t)-1 && PyErr_Occurred())
            PyErr_Clear();
        return 0;
    }
    *out = (uint64_t)PyLong_AsUnsignedLongLongMask(obj);
    return 1;
#endif
}

static int strict_key(PyObject *obj, uint64_t *out) {
    int r = as_key(obj, out);
    if (r == 0)
        PyErr_SetString(PyExc_OverflowError, "a key is an int in [0, 2**64)");
    return r == 1 ? 0 : -1;
}

#endif
