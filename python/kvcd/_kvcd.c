/*
 * _kvcd.c — the kvcd Python package: a CPython extension over libkvc (client/kvc.h).
 *
 * DESIGN
 * The module kvcd._kvcd: its types (one file each, see _kvcd.h), its exception kvcd.Error
 * (an OSError carrying libkvc's errno and message) and its constants. kvcd/__init__.py
 * re-exports it; the types are documented in kvcd/__init__.pyi.
 */
#include "python/kvcd/_kvcd.h"

PyObject *kvcd_error;

/* Raises kvcd.Error(errno, libkvc's message) for a negative errno rc; returns NULL. */
PyObject *kvcd_raise(int rc)
{
    PyObject *args = Py_BuildValue("(is)", -rc, kvc_strerror(rc));
    if (args) {
        PyErr_SetObject(kvcd_error, args);
        Py_DECREF(args);
    }
    return NULL;
}

static PyObject *kvcd_default_socket(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyUnicode_DecodeFSDefault(kvc_default_socket());
}

static PyMethodDef kvcd_methods[] = {
    {"default_socket", kvcd_default_socket, METH_NOARGS,
     "The socket path Client() connects to without one."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kvcd_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvcd._kvcd",
    .m_doc = "CPython binding of libkvc, the client library of kvcd.",
    .m_size = -1,
    .m_methods = kvcd_methods,
};

PyMODINIT_FUNC PyInit__kvcd(void);
PyMODINIT_FUNC PyInit__kvcd(void)
{
    PyTypeObject *types[] = {&client_type, &ns_type,   &lease_type,
                             &resv_type,   &slot_type, &paged_type};
    const char *names[] = {"Client", "Namespace", "Lease", "Reservation", "_Slot", "PagedKV"};
    PyObject *m;
    size_t i;
    for (i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    m = PyModule_Create(&kvcd_module);
    if (!m)
        return NULL;
    kvcd_error = PyErr_NewExceptionWithDoc(
        "kvcd.Error", "A libkvc call failed: errno and libkvc's message.", PyExc_OSError, NULL);
    if (!kvcd_error || PyModule_AddObjectRef(m, "Error", kvcd_error) < 0)
        goto fail;
    for (i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (PyModule_AddObjectRef(m, names[i], (PyObject *)types[i]) < 0)
            goto fail;
    if (PyModule_AddIntConstant(m, "SLOT_PRESENT", KVC_SLOT_PRESENT) < 0 ||
        PyModule_AddIntConstant(m, "SLOT_RESERVED", KVC_SLOT_RESERVED) < 0 ||
        PyModule_AddIntConstant(m, "SLOT_BUSY", KVC_SLOT_BUSY) < 0 ||
        PyModule_AddIntConstant(m, "SLOT_SKIPPED", KVC_SLOT_SKIPPED) < 0 ||
        PyModule_AddIntConstant(m, "SLOT_NOSPACE", KVC_SLOT_NOSPACE) < 0 ||
        PyModule_AddIntConstant(m, "HEAD_UNKNOWN", KVC_HEAD_UNKNOWN) < 0 ||
        PyModule_AddIntConstant(m, "HEAD_SINK", KVC_HEAD_SINK) < 0 ||
        PyModule_AddIntConstant(m, "HEAD_LOCAL", KVC_HEAD_LOCAL) < 0 ||
        PyModule_AddIntConstant(m, "HEAD_FULL", KVC_HEAD_FULL) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
