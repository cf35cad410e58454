/*
 * _kvcd_lease.c — kvcd.Lease (pinned hits of one lookup) and _Slot, the exporter of views.
 *
 * DESIGN
 * A view (lease[i], resv[i]) is a memoryview over a _Slot that holds its lease or
 * reservation: the block stays pinned, and the arena mapped, until the last view is
 * released, whatever release() or close() happened since. A view is the block as stored:
 * block_bytes of raw KV, or the encoded block of a lossy hit (kvc_lease_stored() bytes,
 * and the _Slot says so), never more than the slot holds. Hits in device memory have no
 * view.
 */
#include "python/kvcd/_kvcd.h"

/* The bytes of block i as it is stored: a raw hit or a reserved slot is block_bytes of the
 * namespace's layout; a lossy hit is its encoded block, kvc_lease_stored() bytes long (never
 * block_bytes over a smaller slot: that would cover its neighbours, and past the mapping at
 * the arena's end). A hit in the GPU pool is device memory: no view. */
static int slot_bytes(struct handle *h, size_t i, void **p, size_t *len, int *codec)
{
    if (h->kind == HANDLE_KIND_RESV) {
        if (h->gpu) { /* its slots may be in the GPU pool: kvc_resv_data() is device memory */
            PyErr_SetString(PyExc_BufferError, "kvcd: a reservation for the GPU pool has no "
                                               "views: use write or gather");
            return -1;
        }
        *p = kvc_resv_data(h->h, i);
        *len = h->block_bytes;
        *codec = KVC_CODEC_RAW;
    } else {
        const void *d = NULL;
        int f = kvc_lease_stored(h->h, i, &d, len);
        if (f < 0) {
            kvcd_raise(f);
            return -1;
        }
        if (kvc_lease_tier(h->h, i) == KVC_TIER_GPU) {
            PyErr_SetString(PyExc_BufferError,
                            "kvcd: this hit is in the GPU pool (device memory): use copy_into or "
                            "scatter");
            return -1;
        }
        if (i >= (size_t)kvc_lease_ready(h->h)) {
            PyErr_SetString(PyExc_ValueError,
                            "kvcd: this hit is still being read from disk (lease.wait() first)");
            return -1;
        }
        *p = (void *)d;
        *codec = f;
    }
    if (!*p) {
        PyErr_SetString(PyExc_ValueError, "kvcd: no block at this index");
        return -1;
    }
    return 0;
}

static int slot_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    slot_object *s = (slot_object *)self;
    struct handle *h = s->owner;
    void *p;
    size_t len;
    int codec;
    view->obj = NULL;
    if (handle_check(h) < 0 || slot_bytes(h, s->i, &p, &len, &codec) < 0)
        return -1;
    if (PyBuffer_FillInfo(view, self, p, (Py_ssize_t)len, h->kind == HANDLE_KIND_LEASE, flags) < 0)
        return -1;
    h->exports++;
    return 0;
}

static void slot_releasebuffer(PyObject *self, Py_buffer *view)
{
    struct handle *h = ((slot_object *)self)->owner;
    (void)view;
    h->exports--;
    if (h->exports == 0 && (h->finished || h->client->closed))
        client_settle(h->client);
}

static void slot_dealloc(PyObject *self)
{
    Py_XDECREF(((slot_object *)self)->owner);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *slot_get_codec(PyObject *self, void *closure)
{
    (void)closure;
    return codec_name(((slot_object *)self)->codec);
}

static PyObject *slot_get_encoded(PyObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((slot_object *)self)->codec != KVC_CODEC_RAW);
}

static PyBufferProcs slot_as_buffer = {
    .bf_getbuffer = slot_getbuffer,
    .bf_releasebuffer = slot_releasebuffer,
};

static PyGetSetDef slot_getset[] = {
    {"codec", slot_get_codec, NULL, "How the viewed bytes are stored: 'raw' or a codec name.",
     NULL},
    {"encoded", slot_get_encoded, NULL,
     "True when the view holds an encoded (lossy) block, not block_bytes of raw KV.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject slot_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcd._Slot",
    .tp_basicsize = sizeof(slot_object),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = slot_dealloc,
    .tp_as_buffer = &slot_as_buffer,
    .tp_getset = slot_getset,
    .tp_doc = "The exporter of one block's memory (lease[i], reservation[i]): the view's .obj, "
              "whose codec and encoded say how the viewed bytes are stored.",
};

/* A memoryview over block i of a lease or slot i of a reservation (i already in range). */
PyObject *slot_view(struct handle *h, Py_ssize_t i)
{
    slot_object *s;
    PyObject *mv;
    void *p;
    size_t len;
    int codec;
    if (handle_check(h) < 0 || slot_bytes(h, (size_t)i, &p, &len, &codec) < 0)
        return NULL;
    s = PyObject_New(slot_object, &slot_type);
    if (!s)
        return NULL;
    Py_INCREF(h);
    s->owner = h;
    s->i = (size_t)i;
    s->codec = codec;
    mv = PyMemoryView_FromObject((PyObject *)s);
    Py_DECREF(s);
    return mv;
}

Py_ssize_t lease_len(PyObject *self)
{
    return (Py_ssize_t)((struct handle *)self)->n;
}

static PyObject *lease_item(PyObject *self, Py_ssize_t i)
{
    if ((i = handle_item((struct handle *)self, i)) < 0)
        return NULL;
    return slot_view((struct handle *)self, i);
}

static PyObject *lease_subscript(PyObject *self, PyObject *key)
{
    Py_ssize_t i = handle_subscript((struct handle *)self, key);
    if (i < 0)
        return NULL;
    return slot_view((struct handle *)self, i);
}

PyObject *slot_io(PyObject *self, PyObject *args, PyObject *kw, const struct slot_io_ops *ops)
{
    static char *kwlist[] = {"i", "buffer", "stream", NULL};
    struct handle *h = (struct handle *)self;
    Py_ssize_t i;
    PyObject *buf, *stream_obj = Py_None;
    struct mem m;
    void *stream = NULL;
    int rc, state = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, ops->format, kwlist, &i, &buf, &stream_obj))
        return NULL;
    if (mem_get(buf, &m, h->block_bytes, ops->to_buffer) < 0)
        return NULL;
    if (m.device != -1 && stream_get(stream_obj, m.tensor, &stream) < 0)
        goto fail;
    /* Checked after the last argument was read, right before the GIL goes. */
    if (handle_check(h) < 0 || (i = handle_index(h, i)) < 0 || (ops->ready && ops->ready(h, i) < 0))
        goto fail;
    if (client_enter(h->client) < 0)
        goto fail;
    Py_BEGIN_ALLOW_THREADS;
    if (m.device == -1) {
        rc = ops->host(h, (size_t)i, &m);
    } else {
        rc = client_gpu_attach_nogil(h->client, &state);
        if (rc >= 0)
            rc = ops->device(h, (size_t)i, &m, stream);
    }
    Py_END_ALLOW_THREADS;
    client_gpu_state_set(h->client, state);
    if (m.device != -1)
        h->device_work = 1;
    client_leave(h->client);
    mem_release(&m);
    if (rc < 0)
        return kvcd_raise(rc);
    Py_RETURN_NONE;
fail:
    mem_release(&m);
    return NULL;
}

static int lease_copy_ready(struct handle *h, Py_ssize_t i)
{
    if ((size_t)i < (size_t)kvc_lease_ready(h->h))
        return 0;
    PyErr_SetString(PyExc_ValueError,
                    "kvcd: this hit is still being read from disk (lease.wait() first)");
    return -1;
}

static int lease_copy_host(struct handle *h, size_t i, const struct mem *m)
{
    return kvc_lease_copy(h->h, i, m->ptr, m->len);
}

static int lease_copy_device(struct handle *h, size_t i, const struct mem *m, void *stream)
{
    return kvc_lease_copy_async(h->h, i, m->ptr, m->len, stream);
}

static PyObject *lease_copy_into(PyObject *self, PyObject *args, PyObject *kw)
{
    static const struct slot_io_ops ops = {.format = "nO|O:copy_into",
                                           .to_buffer = 1,
                                           .ready = lease_copy_ready,
                                           .host = lease_copy_host,
                                           .device = lease_copy_device};
    return slot_io(self, args, kw, &ops);
}

static PyObject *lease_ready(PyObject *self, PyObject *unused)
{
    struct handle *h = (struct handle *)self;
    (void)unused;
    if (handle_check(h) < 0)
        return NULL;
    return PyLong_FromLong(kvc_lease_ready(h->h));
}

static PyObject *lease_wait(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout_ms", NULL};
    struct handle *h = (struct handle *)self;
    unsigned int timeout_ms = 10000;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|I:wait", kwlist, &timeout_ms))
        return NULL;
    if (handle_check(h) < 0 || client_enter(h->client) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS;
    rc = kvc_lease_wait(h->h, timeout_ms);
    Py_END_ALLOW_THREADS;
    /* Once no read is left, hits after one that failed are dropped from the lease. */
    h->n = kvc_lease_count(h->h);
    client_leave(h->client);
    if (rc < 0)
        return kvcd_raise(rc);
    return PyLong_FromLong(rc);
}

static PyObject *lease_tier(PyObject *self, PyObject *arg)
{
    struct handle *h = (struct handle *)self;
    Py_ssize_t i = PyNumber_AsSsize_t(arg, PyExc_IndexError);
    int t;
    if ((i == -1 && PyErr_Occurred()) || handle_check(h) < 0 || (i = handle_index(h, i)) < 0)
        return NULL;
    t = kvc_lease_tier(h->h, (size_t)i);
    if (t < 0)
        return kvcd_raise(t);
    return PyUnicode_FromString(t == KVC_TIER_GPU ? "gpu" : "host");
}

static PyObject *lease_stored(PyObject *self, PyObject *arg)
{
    struct handle *h = (struct handle *)self;
    Py_ssize_t i = PyNumber_AsSsize_t(arg, PyExc_IndexError);
    const void *data;
    size_t len;
    int f;
    if ((i == -1 && PyErr_Occurred()) || (i = handle_index(h, i)) < 0 || handle_check(h) < 0)
        return NULL;
    f = kvc_lease_stored(h->h, (size_t)i, &data, &len);
    if (f < 0)
        return kvcd_raise(f);
    return codec_name(f);
}

static PyObject *lease_release(PyObject *self, PyObject *unused)
{
    (void)unused;
    handle_finish((struct handle *)self);
    Py_RETURN_NONE;
}

static PyObject *lease_exit(PyObject *self, PyObject *args)
{
    (void)args;
    handle_finish((struct handle *)self);
    Py_RETURN_FALSE;
}

static PyMethodDef lease_methods[] = {
    {"copy_into", (PyCFunction)(void (*)(void))lease_copy_into, METH_VARARGS | METH_KEYWORDS,
     "copy_into(i, buffer, stream=None): copies hit i, decoded, into a writable buffer or "
     "tensor of at least block_bytes; into a CUDA tensor it is queued on the stream and "
     "release() waits for it."},
    {"scatter", (PyCFunction)(void (*)(void))lease_scatter, METH_VARARGS | METH_KEYWORDS,
     "scatter(k_caches, v_caches, block_table, *, first=0, n=None, first_token=0, layers=None, "
     "stream=None, event=None, kv_dim=0): hits [first, first+n) into an engine's paged KV "
     "cache; returns n."},
    {"ready", lease_ready, METH_NOARGS,
     "ready(): the leading hits in memory now (lookup(nowait=True) returns hits still being "
     "read from disk)."},
    {"wait", (PyCFunction)(void (*)(void))lease_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(timeout_ms=10000): waits for the hits being read from disk; returns ready()."},
    {"tier", lease_tier, METH_O, "tier(i): 'host' or 'gpu' (the daemon's GPU pool)."},
    {"stored", lease_stored, METH_O,
     "stored(i): how hit i is stored: 'raw' or a codec name ('q8_0', 'fp8', 'kivi4'...)."},
    {"release", lease_release, METH_NOARGS, "Unpins the hits (once no view of them is left)."},
    {"__enter__", handle_enter, METH_NOARGS, NULL},
    {"__exit__", lease_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyObject *lease_get_first(PyObject *self, void *closure)
{
    struct handle *h = (struct handle *)self;
    (void)closure;
    return PyLong_FromSize_t(h->first);
}

static PyGetSetDef lease_getset[] = {
    {"first", lease_get_first, NULL,
     "Position in the looked-up keys of hit 0 (kv_window, state; 0 otherwise).", NULL},
    {"released", handle_get_released, NULL, "True after release() or the client's close().", NULL},
    {"block_bytes", handle_get_block_bytes, NULL, "Bytes of one block.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods lease_as_sequence = {
    .sq_length = lease_len,
    .sq_item = lease_item,
};

static PyMappingMethods lease_as_mapping = {
    .mp_length = lease_len,
    .mp_subscript = lease_subscript,
};

PyTypeObject lease_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcd.Lease",
    .tp_basicsize = sizeof(struct handle),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = handle_dealloc,
    .tp_as_sequence = &lease_as_sequence,
    .tp_as_mapping = &lease_as_mapping,
    .tp_methods = lease_methods,
    .tp_getset = lease_getset,
    .tp_doc = "Pinned hits of one lookup; lease[i] is a read-only memoryview of hit i.",
};
