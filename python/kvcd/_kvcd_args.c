/*
 * _kvcd_args.c — reading the arguments of the extension's calls into C memory.
 *
 * DESIGN
 * Arguments are read into C memory before any libkvc handle is used: reading them may run
 * Python code (__iter__, __len__, __index__, __float__, buffer exporters, finalizers run by
 * the garbage collector), which may close the client, release a lease or change the very
 * list being read. So sequences are copied into a tuple first (a list changed under the
 * loop would be read past its end), and every handle is checked after the last argument
 * was read (handle_check, ns_check, client_enter), never before.
 */
#include "python/kvcd/_kvcd.h"

/*
 * Arguments are read into C memory before any libkvc handle is used: reading them may run
 * Python code (__iter__, __len__, __index__, __float__, buffer exporters, finalizers run by
 * the garbage collector), which may close the client, release a lease or change the very
 * list being read. So sequences are copied into a tuple first (a list changed under the
 * loop would be read past its end), and every handle is checked after the last argument
 * was read (handle_check, ns_check, client_enter), never before.
 */

/* A tuple of seq's items (any iterable), or NULL with TypeError(what) when it is none. */
PyObject *seq_tuple(PyObject *seq, const char *what)
{
    PyObject *it, *t;
    if (PyList_CheckExact(seq) || PyTuple_CheckExact(seq))
        return PySequence_Tuple(seq);
    it = PyObject_GetIter(seq);
    if (!it) {
        if (PyErr_ExceptionMatches(PyExc_TypeError))
            PyErr_SetString(PyExc_TypeError, what);
        return NULL;
    }
    t = PySequence_Tuple(it);
    Py_DECREF(it);
    return t;
}

/* keys: a sequence of 16-byte bytes-like objects. *out is PyMem_Malloc'd. */
int keys_parse(PyObject *seq, struct kvc_key **out, size_t *n)
{
    PyObject *fast = seq_tuple(seq, "kvcd: keys must be a sequence of 16-byte keys");
    struct kvc_key *keys = NULL;
    Py_ssize_t i, len;
    int rc = -1;
    if (!fast)
        return -1;
    len = PyTuple_GET_SIZE(fast);
    keys = PyMem_Malloc(sizeof(*keys) * (size_t)(len ? len : 1));
    if (!keys) {
        PyErr_NoMemory();
        goto out;
    }
    for (i = 0; i < len; i++) {
        Py_buffer b;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(fast, i), &b, PyBUF_SIMPLE) < 0)
            goto out;
        if (b.len != (Py_ssize_t)sizeof(struct kvc_key)) {
            PyBuffer_Release(&b);
            PyErr_Format(PyExc_ValueError, "kvcd: key %zd is not 16 bytes", i);
            goto out;
        }
        memcpy(&keys[i], b.buf, sizeof(struct kvc_key));
        PyBuffer_Release(&b);
    }
    *out = keys;
    *n = (size_t)len;
    keys = NULL;
    rc = 0;
out:
    PyMem_Free(keys);
    Py_DECREF(fast);
    return rc;
}

/* An optional parent key: None or 16 bytes. */
int key_parse_opt(PyObject *o, struct kvc_key *key, int *have)
{
    Py_buffer b;
    *have = 0;
    if (!o || o == Py_None)
        return 0;
    if (PyObject_GetBuffer(o, &b, PyBUF_SIMPLE) < 0)
        return -1;
    if (b.len != (Py_ssize_t)sizeof(*key)) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "kvcd: a key is 16 bytes");
        return -1;
    }
    memcpy(key, b.buf, sizeof(*key));
    PyBuffer_Release(&b);
    *have = 1;
    return 0;
}

PyObject *keys_to_list(const struct kvc_key *keys, size_t n)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    size_t i;
    if (!list)
        return NULL;
    for (i = 0; i < n; i++) {
        PyObject *k = PyBytes_FromStringAndSize((const char *)&keys[i], sizeof(keys[i]));
        if (!k) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, k);
    }
    return list;
}

/* seq: a sequence of numbers, as floats into *out (PyMem_Malloc'd), *n how many. what names
 * it in the TypeError. 0 or -1 with an exception set. */
int floats_parse(PyObject *seq, const char *what, float **out, size_t *n)
{
    PyObject *fast = seq_tuple(seq, what);
    float *v = NULL;
    if (!fast)
        return -1;
    *n = (size_t)PyTuple_GET_SIZE(fast);
    v = PyMem_Malloc((*n ? *n : 1) * sizeof(*v));
    if (!v) {
        PyErr_NoMemory();
        goto fail;
    }
    for (size_t i = 0; i < *n; i++) {
        double d = PyFloat_AsDouble(PyTuple_GET_ITEM(fast, (Py_ssize_t)i));
        if (d == -1.0 && PyErr_Occurred())
            goto fail;
        v[i] = (float)d;
    }
    Py_DECREF(fast);
    *out = v;
    return 0;
fail:
    Py_DECREF(fast);
    PyMem_Free(v);
    return -1;
}

/* The UTF-8 of a str argument (the object's own storage), refusing a NUL inside: C would
 * read the name up to it (namespace("a\x00b") opened "a"). */
const char *str_arg(PyObject *o, const char *what)
{
    Py_ssize_t len;
    const char *s;
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "kvcd: %s must be a str", what);
        return NULL;
    }
    s = PyUnicode_AsUTF8AndSize(o, &len);
    if (s && strlen(s) != (size_t)len) {
        PyErr_Format(PyExc_ValueError, "kvcd: %s contains a NUL character", what);
        return NULL;
    }
    return s;
}

/* Codec names as kvcctl and docs/kernels.md write them, indexed by enum kvc_codec. */
const char *const codec_names[] = {
    [KVC_CODEC_RAW] = "raw",     [KVC_CODEC_Q8_0] = "q8_0",       [KVC_CODEC_Q4_1] = "q4_1",
    [KVC_CODEC_Q5_1] = "q5_1",   [KVC_CODEC_KIVI2] = "kivi2",     [KVC_CODEC_KIVI4] = "kivi4",
    [KVC_CODEC_FP8] = "fp8",     [KVC_CODEC_ROT2] = "rot2",       [KVC_CODEC_ROT4] = "rot4",
    [KVC_CODEC_MERGE] = "merge", [KVC_CODEC_LOWRANK] = "lowrank",
};

const int codec_count = KVC_CODEC_LOWRANK + 1;

PyObject *codec_name(int f)
{
    if (f < 0 || f >= codec_count || !codec_names[f])
        return PyUnicode_FromFormat("codec-%d", f);
    return PyUnicode_FromString(codec_names[f]);
}
