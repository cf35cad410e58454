/*
 * _kvcd_resv.c — kvcd.Reservation: slots of one reservation, written then committed.
 *
 * DESIGN
 * A reservation's writable views differ from a lease's: committing publishes the slots to
 * other processes, so commit() refuses (BufferError) while one is exported; abort() waits
 * for them as release() does. A with block commits on success and aborts on an exception.
 */
#include "python/kvcd/_kvcd.h"

/* resv[i] with i in range: checked here, after whatever Python code the index ran. */
static PyObject *resv_view(struct handle *h, Py_ssize_t i)
{
    if (handle_check(h) < 0)
        return NULL;
    if (kvc_resv_status(h->h, (size_t)i) != KVC_SLOT_RESERVED) {
        PyErr_Format(PyExc_ValueError, "kvcd: key %zd has no reserved slot", i);
        return NULL;
    }
    return slot_view(h, i);
}

static PyObject *resv_item(PyObject *self, Py_ssize_t i)
{
    if ((i = handle_item((struct handle *)self, i)) < 0)
        return NULL;
    return resv_view((struct handle *)self, i);
}

static PyObject *resv_subscript(PyObject *self, PyObject *key)
{
    Py_ssize_t i = handle_subscript((struct handle *)self, key);
    if (i < 0)
        return NULL;
    return resv_view((struct handle *)self, i);
}

static PyObject *resv_status(PyObject *self, PyObject *arg)
{
    struct handle *h = (struct handle *)self;
    Py_ssize_t i = PyNumber_AsSsize_t(arg, PyExc_IndexError);
    int st;
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (handle_check(h) < 0 || (i = handle_index(h, i)) < 0)
        return NULL;
    st = kvc_resv_status(h->h, (size_t)i);
    if (st < 0)
        return kvcd_raise(st);
    return PyLong_FromLong(st);
}

static int resv_write_host(struct handle *h, size_t i, const struct mem *m)
{
    return kvc_resv_write(h->h, i, m->ptr, h->block_bytes);
}

static int resv_write_device(struct handle *h, size_t i, const struct mem *m, void *stream)
{
    return kvc_resv_write_async(h->h, i, m->ptr, h->block_bytes, stream);
}

static PyObject *resv_write(PyObject *self, PyObject *args, PyObject *kw)
{
    static const struct slot_io_ops ops = {
        .format = "nO|O:write", .host = resv_write_host, .device = resv_write_device};
    return slot_io(self, args, kw, &ops);
}

/* Commits the first n reserved slots (None: all). */
static int resv_commit_n(struct handle *h, PyObject *nobj, int *committed)
{
    size_t n = SIZE_MAX;
    kvc_resv *r;
    int rc;
    if (nobj && nobj != Py_None) {
        Py_ssize_t v =
            PyNumber_AsSsize_t(nobj, PyExc_OverflowError); /* may run Python code: checked below */
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < 0) {
            PyErr_SetString(PyExc_ValueError, "kvcd: commit(n) needs n >= 0");
            return -1;
        }
        n = (size_t)v;
    }
    if (handle_check(h) < 0)
        return -1;
    if (h->exports > 0) {
        PyErr_SetString(PyExc_BufferError,
                        "kvcd: release the views of the reservation's slots before commit");
        return -1;
    }
    if (client_enter(h->client) < 0)
        return -1;
    r = h->h;
    h->h = NULL; /* kvc_commit frees it, whatever it returns but -EBUSY and -EAGAIN */
    h->finished = 1;
    handle_unlink(h);
    Py_BEGIN_ALLOW_THREADS;
    rc = kvc_commit(r, n);
    Py_END_ALLOW_THREADS;
    if (rc == -EBUSY || rc == -EAGAIN) { /* a slot gathered layer by layer is not whole, or
                                            the parent's reservation commits first: ours */
        h->finished = 0;
        handle_link(h, r);
    }
    client_leave(h->client);
    if (rc < 0) {
        kvcd_raise(rc);
        return -1;
    }
    *committed = rc;
    return 0;
}

static PyObject *resv_commit(PyObject *self, PyObject *args)
{
    PyObject *nobj = Py_None;
    int committed;
    if (!PyArg_ParseTuple(args, "|O:commit", &nobj))
        return NULL;
    if (resv_commit_n((struct handle *)self, nobj, &committed) < 0)
        return NULL;
    return PyLong_FromLong(committed);
}

static PyObject *resv_abort(PyObject *self, PyObject *unused)
{
    (void)unused;
    handle_finish((struct handle *)self);
    Py_RETURN_NONE;
}

static PyObject *resv_exit(PyObject *self, PyObject *args)
{
    struct handle *h = (struct handle *)self;
    PyObject *type = Py_None, *value = Py_None, *tb = Py_None;
    int committed;
    if (!PyArg_ParseTuple(args, "|OOO:__exit__", &type, &value, &tb))
        return NULL;
    if (type != Py_None || h->finished || !h->h || h->client->closed) {
        handle_finish(h);
        Py_RETURN_FALSE;
    }
    if (h->exports > 0) {
        handle_finish(h);
        PyErr_SetString(PyExc_BufferError, "kvcd: views of the reservation's slots are still "
                                           "exported: it was aborted, not committed");
        return NULL;
    }
    if (resv_commit_n(h, Py_None, &committed) < 0)
        return NULL;
    Py_RETURN_FALSE;
}

static PyObject *resv_get_reserved(PyObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(((resv_object *)self)->reserved);
}

static PyObject *resv_get_statuses(PyObject *self, void *closure)
{
    struct handle *h = (struct handle *)self;
    PyObject *list;
    size_t i;
    (void)closure;
    if (handle_check(h) < 0)
        return NULL;
    list = PyList_New((Py_ssize_t)h->n);
    for (i = 0; list && i < h->n; i++) {
        PyObject *v = PyLong_FromLong(kvc_resv_status(h->h, i));
        if (!v) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    return list;
}

static PyMethodDef resv_methods[] = {
    {"status", resv_status, METH_O, "status(i): the SLOT_* status of key i."},
    {"write", (PyCFunction)(void (*)(void))resv_write, METH_VARARGS | METH_KEYWORDS,
     "write(i, buffer, stream=None): copies a block (a buffer or tensor) into slot i; from a "
     "CUDA tensor it is queued on the stream and commit() waits for it."},
    {"gather", (PyCFunction)(void (*)(void))resv_gather, METH_VARARGS | METH_KEYWORDS,
     "gather(k_caches, v_caches, block_table, *, first=0, n=None, first_token=0, layers=None, "
     "stream=None, event=None, kv_dim=0): the slots of keys [first, first+n) from an engine's "
     "paged KV cache (keys not RESERVED skipped); returns the slots written."},
    {"commit", resv_commit, METH_VARARGS,
     "commit(n=None): publishes the first n reserved slots (None: all); returns the count. "
     "kvcd.Error EBUSY (nothing done, still yours) while a slot gathered layer by layer lacks "
     "layers; EAGAIN (nothing done, still yours) while the reservation it hangs from is not "
     "committed."},
    {"abort", resv_abort, METH_NOARGS, "Frees every slot unseen."},
    {"__enter__", handle_enter, METH_NOARGS, NULL},
    {"__exit__", resv_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef resv_getset[] = {
    {"reserved", resv_get_reserved, NULL, "Slots reserved (status SLOT_RESERVED).", NULL},
    {"statuses", resv_get_statuses, NULL, "The SLOT_* status of every key.", NULL},
    {"finished", handle_get_released, NULL, "True after commit(), abort() or close().", NULL},
    {"block_bytes", handle_get_block_bytes, NULL, "Bytes of one block.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods resv_as_sequence = {
    .sq_length = lease_len,
    .sq_item = resv_item,
};

static PyMappingMethods resv_as_mapping = {
    .mp_length = lease_len,
    .mp_subscript = resv_subscript,
};

PyTypeObject resv_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcd.Reservation",
    .tp_basicsize = sizeof(resv_object),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = handle_dealloc,
    .tp_as_sequence = &resv_as_sequence,
    .tp_as_mapping = &resv_as_mapping,
    .tp_methods = resv_methods,
    .tp_getset = resv_getset,
    .tp_doc = "Slots of one reservation; resv[i] is a writable memoryview of reserved slot i.",
};
