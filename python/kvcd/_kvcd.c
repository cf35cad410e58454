/*
 * _kvcd.c — the kvcd Python package: a CPython extension over libkvc (client/kvc.h).
 *
 * DESIGN
 * Objects: Client owns one kvc_client; Namespace, Lease and Reservation hold a strong
 * reference to their Client, and a view exported from a lease or reservation (lease[i],
 * resv[i]) holds its owner through a small exporter object (_Slot), so a memoryview keeps
 * the lease, the client and the arena mapping alive. Every Python-visible call runs under
 * the GIL; the round trips and copies of libkvc run with the GIL released.
 *
 * Lifetimes follow one rule: a libkvc handle is freed only while no call of its client is
 * in flight with the GIL released (client->inflight == 0) and no view of it is exported.
 * release(), abort() and close() mark what they finish and client_settle() frees it when
 * that holds: at once in the common case, else when the last call leaves or the last view
 * is released. So a lease released, or a client closed, while another thread copies out of
 * it, or while numpy still views its blocks, never frees memory under anyone: views stay
 * valid (the block stays pinned) until they are released, and every other use of a
 * finished object raises. All of this state is read and written under the GIL only.
 *
 * A reservation's writable views are different: committing publishes the slots to other
 * processes, so commit() refuses (BufferError) while one is exported; abort() waits for
 * them as release() does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvc.h"

static PyObject *kvcd_error; /* kvcd.Error, a subclass of OSError */

/* Raises kvcd.Error(errno, libkvc's message) for a negative errno rc; returns NULL. */
static PyObject *kvcd_raise(int rc)
{
    PyObject *args = Py_BuildValue("(is)", -rc, kvc_strerror(rc));
    if (args) {
        PyErr_SetObject(kvcd_error, args);
        Py_DECREF(args);
    }
    return NULL;
}

/* ---- objects ----------------------------------------------------------------------------- */

enum handle_kind {
    HANDLE_KIND_LEASE = 1,
    HANDLE_KIND_RESV = 2,
};

typedef struct client_object client_object;

/* The common head of Lease and Reservation: a libkvc handle on its client's list. */
struct handle {
    PyObject_HEAD client_object *client; /* strong reference */
    uint64_t conn;                       /* the connection it came from (client->conn) */
    struct handle *prev, *next;          /* the client's list of live handles (borrowed) */
    enum handle_kind kind;
    void *h;            /* kvc_lease or kvc_resv; NULL once freed */
    int finished;       /* released, committed or aborted by the caller */
    Py_ssize_t exports; /* views exported from it */
    size_t n;           /* hits of a lease, keys of a reservation */
    size_t block_bytes;
};

struct client_object {
    PyObject_HEAD kvc_client *c; /* NULL once disconnected */
    uint64_t conn;       /* this process's serial of the connection; 0 before __init__ connected */
    int closed;          /* for good: a Client connects once (__init__ again is refused) */
    Py_ssize_t inflight; /* calls running with the GIL released */
    struct handle handles; /* list head of handles with h != NULL */
};

typedef struct {
    PyObject_HEAD client_object *client; /* strong reference */
    uint64_t conn;                       /* the connection it came from (client->conn) */
    kvc_ns *ns; /* owned by the client's kvc_client: valid while ns_check passes */
    PyObject *model_id;
} ns_object;

typedef struct {
    struct handle head;
    int reserved; /* slots reserved */
} resv_object;

typedef struct {
    PyObject_HEAD struct handle *owner; /* strong reference */
    size_t i;
    int codec; /* a lease's hit: enum kvc_codec as stored; a reservation's slot: raw */
} slot_object;

static PyTypeObject client_type, ns_type, lease_type, resv_type, slot_type;

/* Serials of the connections this process made (client_object.conn); under the GIL. */
static uint64_t client_serial;

/* ---- the client's lifetime rule ---------------------------------------------------------- */

static void handle_unlink(struct handle *h)
{
    if (h->prev) {
        h->prev->next = h->next;
        h->next->prev = h->prev;
        h->prev = h->next = NULL;
    }
}

/* Frees the libkvc handle now. GIL held; no call of the client in flight. */
static void handle_free(struct handle *h)
{
    if (h->h) {
        if (h->kind == HANDLE_KIND_LEASE)
            kvc_release(h->h);
        else
            kvc_abort(h->h);
        h->h = NULL;
    }
    handle_unlink(h);
}

/* Frees what was finished and is no longer viewed, and disconnects a closed client once
 * nothing of it is left. GIL held. */
static void client_settle(client_object *c)
{
    struct handle *h, *next;
    if (c->inflight > 0)
        return;
    for (h = c->handles.next; h != &c->handles; h = next) {
        next = h->next;
        if ((h->finished || c->closed) && h->exports == 0)
            handle_free(h);
    }
    if (c->closed && c->c && c->handles.next == &c->handles) {
        kvc_disconnect(c->c);
        c->c = NULL;
    }
}

/* Before a call that releases the GIL: raises ValueError on a closed client. */
static int client_enter(client_object *c)
{
    if (c->closed || !c->c) {
        PyErr_SetString(PyExc_ValueError, "kvcd: the client is closed");
        return -1;
    }
    c->inflight++;
    return 0;
}

static void client_leave(client_object *c)
{
    c->inflight--;
    client_settle(c);
}

static int handle_check(struct handle *h)
{
    if (h->client->closed || h->conn != h->client->conn) {
        PyErr_SetString(PyExc_ValueError, "kvcd: the client is closed");
        return -1;
    }
    if (h->finished || !h->h) {
        PyErr_SetString(PyExc_ValueError, h->kind == HANDLE_KIND_LEASE
                                              ? "kvcd: the lease is released"
                                              : "kvcd: the reservation is finished");
        return -1;
    }
    return 0;
}

static void handle_init(struct handle *h, client_object *c, enum handle_kind kind, void *p,
                        size_t n, size_t block_bytes)
{
    Py_INCREF(c);
    h->client = c;
    h->conn = c->conn;
    h->kind = kind;
    h->h = p;
    h->n = n;
    h->block_bytes = block_bytes;
    h->finished = p == NULL;
    h->exports = 0;
    h->prev = h->next = NULL;
    if (p) {
        h->next = &c->handles;
        h->prev = c->handles.prev;
        c->handles.prev->next = h;
        c->handles.prev = h;
    }
}

/* Marks a handle finished and frees it when the rule allows. */
static void handle_finish(struct handle *h)
{
    h->finished = 1;
    client_settle(h->client);
}

static void handle_dealloc(PyObject *self)
{
    struct handle *h = (struct handle *)self;
    /* No view is exported (each holds us) and no call runs on us (each holds us): only
     * other calls of the client may be in flight, and libkvc serialises those. */
    handle_free(h);
    if (h->client) {
        client_object *c = h->client;
        h->client = NULL;
        client_settle(c);
        Py_DECREF(c);
    }
    Py_TYPE(self)->tp_free(self);
}

/* An index as Python counts: negative from the end. */
static Py_ssize_t handle_index(struct handle *h, Py_ssize_t i)
{
    if (i < 0)
        i += (Py_ssize_t)h->n;
    if (i < 0 || (size_t)i >= h->n) {
        PyErr_SetString(PyExc_IndexError, "kvcd: index out of range");
        return -1;
    }
    return i;
}

/* The index of h[key]. Subscripts come through the mapping slot, so a negative index
 * arrives as written and is counted from the end once (the sequence slot gets it with the
 * length already added: counting again made lease[-2] of one hit hit 0). May run Python
 * code (__index__): check the handle after it. */
static Py_ssize_t handle_subscript(struct handle *h, PyObject *key)
{
    Py_ssize_t i;
    if (!PyIndex_Check(key)) {
        PyErr_Format(PyExc_TypeError, "kvcd: indices must be integers, not %.200s",
                     Py_TYPE(key)->tp_name);
        return -1;
    }
    i = PyNumber_AsSsize_t(key, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred())
        return -1;
    return handle_index(h, i);
}

/* The sequence slot (iteration): i is already adjusted, a negative one is out of range. */
static Py_ssize_t handle_item(struct handle *h, Py_ssize_t i)
{
    if (i < 0 || (size_t)i >= h->n) {
        PyErr_SetString(PyExc_IndexError, "kvcd: index out of range");
        return -1;
    }
    return i;
}

/* ---- key and buffer arguments ------------------------------------------------------------ */

/*
 * Arguments are read into C memory before any libkvc handle is used: reading them may run
 * Python code (__iter__, __len__, __index__, __float__, buffer exporters, finalizers run by
 * the garbage collector), which may close the client, release a lease or change the very
 * list being read. So sequences are copied into a tuple first (a list changed under the
 * loop would be read past its end), and every handle is checked after the last argument
 * was read (handle_check, ns_check, client_enter), never before.
 */

/* A tuple of seq's items (any iterable), or NULL with TypeError(what) when it is none. */
static PyObject *seq_tuple(PyObject *seq, const char *what)
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
static int keys_parse(PyObject *seq, struct kvc_key **out, size_t *n)
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
static int key_parse_opt(PyObject *o, struct kvc_key *key, int *have)
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

static PyObject *keys_to_list(const struct kvc_key *keys, size_t n)
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

/* One block-sized buffer: C-contiguous, writable if asked. */
static int block_buffer_get(PyObject *o, Py_buffer *b, size_t block_bytes, int writable)
{
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if ((size_t)b->len < block_bytes) {
        PyErr_Format(PyExc_ValueError, "kvcd: buffer of %zd bytes, a block is %zu", b->len,
                     block_bytes);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* n block buffers from a sequence; *bufs and *ptrs PyMem_Malloc'd, released by
 * buffers_release(). */
static int buffers_get(PyObject *seq, size_t n, size_t block_bytes, int writable, Py_buffer **bufs,
                       void ***ptrs)
{
    PyObject *fast = seq_tuple(seq, "kvcd: buffers must be a sequence");
    Py_ssize_t i, got = 0;
    int rc = -1;
    *bufs = NULL;
    *ptrs = NULL;
    if (!fast)
        return -1;
    if ((size_t)PyTuple_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError, "kvcd: %zd buffers for %zu keys", PyTuple_GET_SIZE(fast), n);
        goto out;
    }
    *bufs = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    *ptrs = PyMem_Calloc(n ? n : 1, sizeof(void *));
    if (!*bufs || !*ptrs) {
        PyErr_NoMemory();
        goto out;
    }
    for (i = 0; i < (Py_ssize_t)n; i++, got++) {
        if (block_buffer_get(PyTuple_GET_ITEM(fast, i), &(*bufs)[i], block_bytes, writable) < 0)
            goto out;
        (*ptrs)[i] = (*bufs)[i].buf;
    }
    rc = 0;
out:
    if (rc) {
        for (i = 0; i < got; i++)
            PyBuffer_Release(&(*bufs)[i]);
        PyMem_Free(*bufs);
        PyMem_Free(*ptrs);
        *bufs = NULL;
        *ptrs = NULL;
    }
    Py_DECREF(fast);
    return rc;
}

static void buffers_release(Py_buffer *bufs, void **ptrs, size_t n)
{
    size_t i;
    for (i = 0; bufs && i < n; i++)
        PyBuffer_Release(&bufs[i]);
    PyMem_Free(bufs);
    PyMem_Free(ptrs);
}

/* ---- _Slot: the exporter of one block's view ---------------------------------------------- */

/* The bytes of block i as it is stored: a raw hit or a reserved slot is block_bytes of the
 * namespace's layout; a lossy hit is its encoded block, kvc_lease_stored() bytes long (never
 * block_bytes over a smaller slot: that would cover its neighbours, and past the mapping at
 * the arena's end). A hit in the GPU pool is device memory: no view. */
static int slot_bytes(struct handle *h, size_t i, void **p, size_t *len, int *codec)
{
    if (h->kind == HANDLE_KIND_RESV) {
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

/* Codec names as kvcctl and docs/kernels.md write them, indexed by enum kvc_codec. */
static const char *const codec_names[] = {
    [KVC_CODEC_RAW] = "raw",   [KVC_CODEC_Q8_0] = "q8_0",   [KVC_CODEC_Q4_1] = "q4_1",
    [KVC_CODEC_Q5_1] = "q5_1", [KVC_CODEC_KIVI2] = "kivi2", [KVC_CODEC_KIVI4] = "kivi4",
    [KVC_CODEC_FP8] = "fp8",
};
#define CODEC_COUNT ((int)(sizeof(codec_names) / sizeof(codec_names[0])))

static PyObject *codec_name(int f)
{
    if (f < 0 || f >= CODEC_COUNT || !codec_names[f])
        return PyUnicode_FromFormat("codec-%d", f);
    return PyUnicode_FromString(codec_names[f]);
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

static PyTypeObject slot_type = {
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
static PyObject *slot_view(struct handle *h, Py_ssize_t i)
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

/* ---- Lease -------------------------------------------------------------------------------- */

static Py_ssize_t lease_len(PyObject *self)
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

static PyObject *lease_copy_into(PyObject *self, PyObject *args)
{
    struct handle *h = (struct handle *)self;
    Py_ssize_t i;
    PyObject *dst;
    Py_buffer b;
    int rc;
    if (!PyArg_ParseTuple(args, "nO:copy_into", &i, &dst))
        return NULL;
    if ((i = handle_index(h, i)) < 0 || block_buffer_get(dst, &b, h->block_bytes, 1) < 0)
        return NULL;
    /* Checked after taking the buffer, right before the GIL goes: nothing runs between. */
    if (handle_check(h) < 0 || client_enter(h->client) < 0) {
        PyBuffer_Release(&b);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS rc = kvc_lease_copy(h->h, (size_t)i, b.buf, (size_t)b.len);
    Py_END_ALLOW_THREADS client_leave(h->client);
    PyBuffer_Release(&b);
    if (rc < 0)
        return kvcd_raise(rc);
    Py_RETURN_NONE;
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

static PyObject *handle_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    Py_INCREF(self);
    return self;
}

static PyObject *lease_exit(PyObject *self, PyObject *args)
{
    (void)args;
    handle_finish((struct handle *)self);
    Py_RETURN_FALSE;
}

static PyObject *handle_get_released(PyObject *self, void *closure)
{
    struct handle *h = (struct handle *)self;
    (void)closure;
    return PyBool_FromLong(h->finished || h->client->closed);
}

static PyObject *handle_get_block_bytes(PyObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromSize_t(((struct handle *)self)->block_bytes);
}

static PyMethodDef lease_methods[] = {
    {"copy_into", lease_copy_into, METH_VARARGS,
     "copy_into(i, buffer): copies hit i into a writable buffer of at least block_bytes."},
    {"stored", lease_stored, METH_O,
     "stored(i): how hit i is stored: 'raw' or a codec name ('q8_0', 'fp8', 'kivi4'...)."},
    {"release", lease_release, METH_NOARGS, "Unpins the hits (once no view of them is left)."},
    {"__enter__", handle_enter, METH_NOARGS, NULL},
    {"__exit__", lease_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef lease_getset[] = {
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

static PyTypeObject lease_type = {
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

/* ---- Reservation -------------------------------------------------------------------------- */

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

static PyObject *resv_write(PyObject *self, PyObject *args)
{
    struct handle *h = (struct handle *)self;
    Py_ssize_t i;
    PyObject *src;
    Py_buffer b;
    int rc;
    if (!PyArg_ParseTuple(args, "nO:write", &i, &src))
        return NULL;
    if ((i = handle_index(h, i)) < 0 || block_buffer_get(src, &b, h->block_bytes, 0) < 0)
        return NULL;
    if (handle_check(h) < 0 || client_enter(h->client) < 0) {
        PyBuffer_Release(&b);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS rc = kvc_resv_write(h->h, (size_t)i, b.buf, h->block_bytes);
    Py_END_ALLOW_THREADS client_leave(h->client);
    PyBuffer_Release(&b);
    if (rc < 0)
        return kvcd_raise(rc);
    Py_RETURN_NONE;
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
    h->h = NULL; /* kvc_commit frees it, whatever it returns */
    h->finished = 1;
    handle_unlink(h);
    Py_BEGIN_ALLOW_THREADS rc = kvc_commit(r, n);
    Py_END_ALLOW_THREADS client_leave(h->client);
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
    {"write", resv_write, METH_VARARGS, "write(i, buffer): copies a block into slot i."},
    {"commit", resv_commit, METH_VARARGS,
     "commit(n=None): publishes the first n reserved slots (None: all); returns the count."},
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

static PyTypeObject resv_type = {
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

/* ---- Namespace ---------------------------------------------------------------------------- */

/* ns->ns is usable: its connection is open (ns->ns is freed with it). Call it after the
 * last argument was read, with no Python code between it and the use. */
static int ns_check(ns_object *ns)
{
    client_object *c = ns->client;
    if (c->closed || !c->c || ns->conn != c->conn) {
        PyErr_SetString(PyExc_ValueError, "kvcd: the client is closed");
        return -1;
    }
    return 0;
}

/* ns_check, then client_enter: before a call that releases the GIL. */
static int ns_enter(ns_object *ns)
{
    return ns_check(ns) < 0 ? -1 : client_enter(ns->client);
}

static PyObject *ns_keys_from_tokens(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"tokens", "parent", "extra", NULL};
    ns_object *ns = (ns_object *)self;
    PyObject *tokens, *parent_obj = Py_None, *fast = NULL, *res = NULL;
    Py_buffer extra = {0};
    struct kvc_key parent, *keys = NULL;
    uint32_t *tok = NULL;
    Py_ssize_t ntok, i;
    size_t maxkeys;
    int have_parent, rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|Oy*:keys_from_tokens", kwlist, &tokens,
                                     &parent_obj, &extra))
        return NULL;
    if (key_parse_opt(parent_obj, &parent, &have_parent) < 0)
        goto out;
    /* A tuple of the tokens: __index__ below runs Python code, which may change a list. */
    fast = seq_tuple(tokens, "kvcd: tokens must be a sequence of ints");
    if (!fast)
        goto out;
    ntok = PyTuple_GET_SIZE(fast);
    tok = PyMem_Malloc(sizeof(*tok) * (size_t)(ntok ? ntok : 1));
    if (!tok) {
        PyErr_NoMemory();
        goto out;
    }
    for (i = 0; i < ntok; i++) {
        PyObject *ix = PyNumber_Index(PyTuple_GET_ITEM(fast, i)); /* numpy ints too */
        unsigned long v;
        if (!ix)
            goto out;
        v = PyLong_AsUnsignedLong(ix);
        Py_DECREF(ix);
        if (v == (unsigned long)-1 && PyErr_Occurred())
            goto out;
        if (v > UINT32_MAX) {
            PyErr_Format(PyExc_OverflowError, "kvcd: token %zd does not fit 32 bits", i);
            goto out;
        }
        tok[i] = (uint32_t)v;
    }
    /* Every argument is read: from here on no Python code runs until the keys are made, so
     * the namespace checked now is the one used (an __index__ above may have closed it). */
    if (ns_check(ns) < 0)
        goto out;
    maxkeys = (size_t)ntok / kvc_ns_block_tokens(ns->ns) + 1;
    keys = PyMem_Malloc(sizeof(*keys) * maxkeys);
    if (!keys) {
        PyErr_NoMemory();
        goto out;
    }
    rc = kvc_keys_from_tokens(ns->ns, have_parent ? &parent : NULL, tok, (size_t)ntok, extra.buf,
                              extra.buf ? (size_t)extra.len : 0, keys, maxkeys);
    if (rc < 0) {
        kvcd_raise(rc);
        goto out;
    }
    res = keys_to_list(keys, (size_t)rc);
out:
    if (extra.obj)
        PyBuffer_Release(&extra);
    Py_XDECREF(fast);
    PyMem_Free(tok);
    PyMem_Free(keys);
    return res;
}

static PyObject *ns_lookup(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "ready_only", NULL};
    ns_object *ns = (ns_object *)self;
    PyObject *keys_obj;
    struct kvc_key *keys = NULL;
    struct handle *h;
    kvc_lease *l = NULL;
    size_t n;
    int ready_only = 0, rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|p:lookup", kwlist, &keys_obj, &ready_only))
        return NULL;
    if (ns_check(ns) < 0 || keys_parse(keys_obj, &keys, &n) < 0)
        return NULL;
    h = PyObject_New(struct handle, &lease_type);
    if (!h || ns_enter(ns) < 0) {
        PyMem_Free(keys);
        if (h) {
            h->client = NULL;
            h->h = NULL;
            h->prev = h->next = NULL;
            Py_DECREF(h);
        }
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS rc =
        kvc_lookup(ns->ns, keys, n, ready_only ? KVC_LOOKUP_READY_ONLY : 0, &l);
    Py_END_ALLOW_THREADS PyMem_Free(keys);
    handle_init(h, ns->client, HANDLE_KIND_LEASE, rc > 0 ? l : NULL, rc > 0 ? (size_t)rc : 0,
                kvc_ns_block_bytes(ns->ns));
    client_leave(ns->client);
    if (rc < 0) {
        Py_DECREF(h);
        return kvcd_raise(rc);
    }
    return (PyObject *)h;
}

/* seq: a sequence of numbers, as floats into *out (PyMem_Malloc'd), *n how many. what names
 * it in the TypeError. 0 or -1 with an exception set. */
static int floats_parse(PyObject *seq, const char *what, float **out, size_t *n)
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

static PyObject *ns_hint(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "scores", "kind", NULL};
    ns_object *ns = (ns_object *)self;
    PyObject *keys_obj, *scores_obj;
    const char *kind_s = "attention";
    struct kvc_key *keys = NULL;
    float *scores = NULL;
    size_t n, nscores;
    unsigned kind;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|s:hint", kwlist, &keys_obj, &scores_obj,
                                     &kind_s))
        return NULL;
    if (strcmp(kind_s, "attention") == 0 || strcmp(kind_s, "h2o") == 0) {
        kind = KVC_HINT_ATTENTION;
    } else if (strcmp(kind_s, "snapkv") == 0) {
        kind = KVC_HINT_SNAPKV;
    } else {
        PyErr_Format(PyExc_ValueError, "kvcd: unknown hint kind '%s' (attention, snapkv)", kind_s);
        return NULL;
    }
    if (ns_check(ns) < 0 || keys_parse(keys_obj, &keys, &n) < 0)
        return NULL;
    if (floats_parse(scores_obj, "kvcd: scores must be a sequence of numbers", &scores, &nscores) <
        0)
        goto fail;
    if (nscores != n) {
        PyErr_SetString(PyExc_ValueError, "kvcd: one score per key");
        goto fail;
    }
    if (ns_enter(ns) < 0)
        goto fail;
    Py_BEGIN_ALLOW_THREADS rc = kvc_hint(ns->ns, kind, keys, scores, n);
    Py_END_ALLOW_THREADS client_leave(ns->client);
    PyMem_Free(keys);
    PyMem_Free(scores);
    return rc < 0 ? kvcd_raise(rc) : PyLong_FromLong(rc);
fail:
    PyMem_Free(keys);
    PyMem_Free(scores);
    return NULL;
}

static PyObject *ns_lookup_budget(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "budget", "policy", "sinks", "recent", "query", NULL};
    ns_object *ns = (ns_object *)self;
    PyObject *keys_obj, *query_obj = Py_None, *pos_list = NULL;
    const char *policy = NULL;
    struct kvc_key *keys = NULL;
    struct kvc_budget b = {0};
    size_t n, *pos = NULL, nprefix = 0;
    Py_ssize_t budget;
    unsigned sinks = 0, recent = 0;
    float *query = NULL;
    struct handle *h = NULL;
    kvc_lease *l = NULL;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "On|zIIO:lookup_budget", kwlist, &keys_obj, &budget,
                                     &policy, &sinks, &recent, &query_obj))
        return NULL;
    if (budget < 1) {
        PyErr_SetString(PyExc_ValueError, "kvcd: budget must be at least 1");
        return NULL;
    }
    if (ns_check(ns) < 0 || keys_parse(keys_obj, &keys, &n) < 0)
        return NULL;
    b.budget = (size_t)budget;
    b.policy = policy;
    b.sinks = sinks;
    b.recent = recent;
    if (query_obj != Py_None) {
        if (floats_parse(query_obj, "kvcd: query must be a sequence of head_dim floats", &query,
                         &b.query_dim) < 0)
            goto fail;
        b.query = query;
    }
    pos = PyMem_Malloc(b.budget * sizeof(*pos));
    if (!pos) {
        PyErr_NoMemory();
        goto fail;
    }
    h = PyObject_New(struct handle, &lease_type);
    if (!h)
        goto fail;
    h->client = NULL;
    h->h = NULL;
    h->prev = h->next = NULL;
    if (ns_enter(ns) < 0)
        goto fail;
    Py_BEGIN_ALLOW_THREADS rc = kvc_lookup_budget(ns->ns, keys, n, &b, pos, &nprefix, &l);
    Py_END_ALLOW_THREADS handle_init(h, ns->client, HANDLE_KIND_LEASE, rc > 0 ? l : NULL,
                                     rc > 0 ? (size_t)rc : 0, kvc_ns_block_bytes(ns->ns));
    client_leave(ns->client);
    if (rc < 0) {
        kvcd_raise(rc);
        goto fail;
    }
    pos_list = PyList_New(rc);
    if (!pos_list)
        goto fail;
    for (int i = 0; i < rc; i++) {
        PyObject *v = PyLong_FromSize_t(pos[i]);
        if (!v)
            goto fail;
        PyList_SET_ITEM(pos_list, i, v);
    }
    PyMem_Free(keys);
    PyMem_Free(query);
    PyMem_Free(pos);
    return Py_BuildValue("(NnN)", pos_list, (Py_ssize_t)nprefix, (PyObject *)h);
fail:
    Py_XDECREF(pos_list);
    Py_XDECREF(h);
    PyMem_Free(keys);
    PyMem_Free(query);
    PyMem_Free(pos);
    return NULL;
}

static PyObject *ns_reserve(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "parent", NULL};
    ns_object *ns = (ns_object *)self;
    PyObject *keys_obj, *parent_obj = Py_None;
    struct kvc_key *keys = NULL, parent;
    resv_object *r;
    kvc_resv *resv = NULL;
    size_t n;
    int have_parent, rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:reserve", kwlist, &keys_obj, &parent_obj))
        return NULL;
    if (ns_check(ns) < 0 || key_parse_opt(parent_obj, &parent, &have_parent) < 0 ||
        keys_parse(keys_obj, &keys, &n) < 0)
        return NULL;
    r = PyObject_New(resv_object, &resv_type);
    if (!r || ns_enter(ns) < 0) {
        PyMem_Free(keys);
        if (r) {
            r->head.client = NULL;
            r->head.h = NULL;
            r->head.prev = r->head.next = NULL;
            Py_DECREF(r);
        }
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS rc = kvc_reserve(ns->ns, have_parent ? &parent : NULL, keys, n, &resv);
    Py_END_ALLOW_THREADS PyMem_Free(keys);
    if (rc < 0)
        resv = NULL; /* not set on failure */
    handle_init(&r->head, ns->client, HANDLE_KIND_RESV, resv, n, kvc_ns_block_bytes(ns->ns));
    r->reserved = rc > 0 ? rc : 0;
    client_leave(ns->client);
    if (rc < 0) {
        Py_DECREF(r);
        return kvcd_raise(rc);
    }
    return (PyObject *)r;
}

/* put_prefix and get_prefix: keys and one block buffer per key. */
static PyObject *ns_prefix(ns_object *ns, PyObject *args, PyObject *kw, int put)
{
    static char *put_kwlist[] = {"keys", "buffers", "parent", NULL};
    static char *get_kwlist[] = {"keys", "buffers", NULL};
    PyObject *keys_obj, *bufs_obj, *parent_obj = Py_None;
    struct kvc_key *keys = NULL, parent;
    Py_buffer *bufs = NULL;
    void **ptrs = NULL;
    size_t n = 0, block_bytes;
    int have_parent = 0, rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, put ? "OO|O:put_prefix" : "OO:get_prefix",
                                     put ? put_kwlist : get_kwlist, &keys_obj, &bufs_obj,
                                     &parent_obj))
        return NULL;
    if (key_parse_opt(parent_obj, &parent, &have_parent) < 0 || keys_parse(keys_obj, &keys, &n) < 0)
        return NULL;
    if (ns_check(ns) < 0) { /* the keys' __iter__ may have closed it */
        PyMem_Free(keys);
        return NULL;
    }
    block_bytes = kvc_ns_block_bytes(ns->ns);
    if (buffers_get(bufs_obj, n, block_bytes, !put, &bufs, &ptrs) < 0 || ns_enter(ns) < 0) {
        buffers_release(bufs, ptrs, n);
        PyMem_Free(keys);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS if (put) rc =
        kvc_put_prefix(ns->ns, have_parent ? &parent : NULL, keys, n, (const void *const *)ptrs);
    else rc = kvc_get_prefix(ns->ns, keys, n, ptrs);
    Py_END_ALLOW_THREADS client_leave(ns->client);
    buffers_release(bufs, ptrs, n);
    PyMem_Free(keys);
    if (rc < 0)
        return kvcd_raise(rc);
    return PyLong_FromLong(rc);
}

static PyObject *ns_put_prefix(PyObject *self, PyObject *args, PyObject *kw)
{
    return ns_prefix((ns_object *)self, args, kw, 1);
}

static PyObject *ns_get_prefix(PyObject *self, PyObject *args, PyObject *kw)
{
    return ns_prefix((ns_object *)self, args, kw, 0);
}

static PyObject *ns_get_block_bytes(PyObject *self, void *closure)
{
    ns_object *ns = (ns_object *)self;
    (void)closure;
    if (ns_check(ns) < 0)
        return NULL;
    return PyLong_FromSize_t(kvc_ns_block_bytes(ns->ns));
}

static PyObject *ns_get_block_tokens(PyObject *self, void *closure)
{
    ns_object *ns = (ns_object *)self;
    (void)closure;
    if (ns_check(ns) < 0)
        return NULL;
    return PyLong_FromUnsignedLong(kvc_ns_block_tokens(ns->ns));
}

static PyObject *ns_get_id(PyObject *self, void *closure)
{
    ns_object *ns = (ns_object *)self;
    (void)closure;
    if (ns_check(ns) < 0)
        return NULL;
    return PyLong_FromUnsignedLong(kvc_ns_id(ns->ns));
}

static PyObject *ns_get_model_id(PyObject *self, void *closure)
{
    (void)closure;
    Py_INCREF(((ns_object *)self)->model_id);
    return ((ns_object *)self)->model_id;
}

static void ns_dealloc(PyObject *self)
{
    ns_object *ns = (ns_object *)self;
    Py_XDECREF(ns->model_id);
    Py_XDECREF(ns->client);
    Py_TYPE(self)->tp_free(self);
}

static PyMethodDef ns_methods[] = {
    {"keys_from_tokens", (PyCFunction)(void (*)(void))ns_keys_from_tokens,
     METH_VARARGS | METH_KEYWORDS,
     "keys_from_tokens(tokens, parent=None, extra=b''): chained 16-byte keys of full blocks."},
    {"lookup", (PyCFunction)(void (*)(void))ns_lookup, METH_VARARGS | METH_KEYWORDS,
     "lookup(keys, ready_only=False): pins the longest cached prefix; returns a Lease."},
    {"hint", (PyCFunction)(void (*)(void))ns_hint, METH_VARARGS | METH_KEYWORDS,
     "hint(keys, scores, kind='attention'): per-block importance for the policies (H2O "
     "attention mass, or 'snapkv' scores); returns the cached blocks that took one."},
    {"lookup_budget", (PyCFunction)(void (*)(void))ns_lookup_budget, METH_VARARGS | METH_KEYWORDS,
     "lookup_budget(keys, budget, policy=None, sinks=0, recent=0, query=None): at most budget "
     "blocks of the cached prefix chosen by a policy; returns (positions, prefix_len, Lease)."},
    {"reserve", (PyCFunction)(void (*)(void))ns_reserve, METH_VARARGS | METH_KEYWORDS,
     "reserve(keys, parent=None): slots for the keys not cached; returns a Reservation."},
    {"put_prefix", (PyCFunction)(void (*)(void))ns_put_prefix, METH_VARARGS | METH_KEYWORDS,
     "put_prefix(keys, buffers, parent=None): stores the blocks not cached; returns the count."},
    {"get_prefix", (PyCFunction)(void (*)(void))ns_get_prefix, METH_VARARGS | METH_KEYWORDS,
     "get_prefix(keys, buffers): loads the longest cached prefix; returns the count."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ns_getset[] = {
    {"block_bytes", ns_get_block_bytes, NULL, "Bytes of one block.", NULL},
    {"block_tokens", ns_get_block_tokens, NULL, "Tokens per block.", NULL},
    {"id", ns_get_id, NULL, "The daemon's id of the namespace.", NULL},
    {"model_id", ns_get_model_id, NULL, "The model id it was opened with.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ns_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcd.Namespace",
    .tp_basicsize = sizeof(ns_object),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = ns_dealloc,
    .tp_methods = ns_methods,
    .tp_getset = ns_getset,
    .tp_doc = "An open namespace: one model's KV layout (Client.namespace()).",
};

/* ---- Client ------------------------------------------------------------------------------- */

static int client_init(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"socket_path", NULL};
    client_object *c = (client_object *)self;
    PyObject *path_obj = Py_None, *path_bytes = NULL;
    const char *path = NULL;
    kvc_client *kc = NULL;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:Client", kwlist, &path_obj))
        return -1;
    /* Once: the namespaces, leases and views of a closed connection must never meet a new
     * one (their libkvc handles died with the old), so a used Client stays closed. */
    if (c->conn) {
        PyErr_SetString(PyExc_RuntimeError, c->closed
                                                ? "kvcd: this Client was closed: make a new one"
                                                : "kvcd: this Client is already connected");
        return -1;
    }
    if (path_obj != Py_None) {
        if (!PyUnicode_FSConverter(path_obj, &path_bytes))
            return -1;
        path = PyBytes_AS_STRING(path_bytes);
    }
    Py_BEGIN_ALLOW_THREADS rc = kvc_connect(path, &kc);
    Py_END_ALLOW_THREADS Py_XDECREF(path_bytes);
    if (rc < 0) {
        kvcd_raise(rc);
        return -1;
    }
    c->c = kc;
    c->conn = ++client_serial;
    c->closed = 0;
    return 0;
}

static PyObject *client_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    client_object *c = (client_object *)type->tp_alloc(type, 0);
    (void)args;
    (void)kw;
    if (c) {
        c->handles.next = c->handles.prev = &c->handles;
        c->closed = 1; /* until __init__ connects */
    }
    return (PyObject *)c;
}

static void client_dealloc(PyObject *self)
{
    client_object *c = (client_object *)self;
    /* Every handle holds the client: none is left. */
    if (c->c)
        kvc_disconnect(c->c);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *client_close(PyObject *self, PyObject *unused)
{
    client_object *c = (client_object *)self;
    (void)unused;
    c->closed = 1;
    client_settle(c);
    Py_RETURN_NONE;
}

static PyObject *client_exit(PyObject *self, PyObject *args)
{
    client_object *c = (client_object *)self;
    (void)args;
    c->closed = 1;
    client_settle(c);
    Py_RETURN_FALSE;
}

static PyObject *client_enter_cm(PyObject *self, PyObject *unused)
{
    (void)unused;
    Py_INCREF(self);
    return self;
}

/* The UTF-8 of a str argument (the object's own storage), refusing a NUL inside: C would
 * read the name up to it (namespace("a\x00b") opened "a"). */
static const char *str_arg(PyObject *o, const char *what)
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

static int dtype_parse(const char *s, enum kvc_dtype *d)
{
    static const struct {
        const char *name;
        enum kvc_dtype d;
    } names[] = {
        {"fp16", KVC_DTYPE_FP16},         {"float16", KVC_DTYPE_FP16}, {"bf16", KVC_DTYPE_BF16},
        {"bfloat16", KVC_DTYPE_BF16},     {"fp32", KVC_DTYPE_FP32},    {"float32", KVC_DTYPE_FP32},
        {"fp8_e4m3", KVC_DTYPE_FP8_E4M3}, {"int8", KVC_DTYPE_INT8},
    };
    size_t i;
    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(s, names[i].name) == 0) {
            *d = names[i].d;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "kvcd: unknown dtype '%s'", s);
    return -1;
}

/* A codec name (codec_names) or None (-1: not given). */
static int codec_parse(PyObject *o, int *codec)
{
    const char *name;
    int i;
    *codec = -1;
    if (o == Py_None)
        return 0;
    if (!(name = str_arg(o, "codec")))
        return -1;
    for (i = 0; i < CODEC_COUNT; i++) {
        if (codec_names[i] && strcmp(name, codec_names[i]) == 0) {
            *codec = i;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "kvcd: unknown codec '%s'", name);
    return -1;
}

static PyObject *client_namespace(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"model_id",     "layers",     "kv_heads", "head_dim",
                             "block_tokens", "dtype",      "k_only",   "k_codec",
                             "v_codec",      "raw_layers", NULL};
    client_object *c = (client_object *)self;
    PyObject *model_id, *k_obj = Py_None, *v_obj = Py_None;
    const char *dtype = "fp16";
    unsigned int layers, kv_heads, head_dim, block_tokens, raw_layers = 0;
    int k_only = 0, rc, kc, vc;
    struct kvc_layout layout;
    struct kvc_quant q;
    kvc_ns *kns = NULL;
    ns_object *ns;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "UIIII|spOOI:namespace", kwlist, &model_id, &layers,
                                     &kv_heads, &head_dim, &block_tokens, &dtype, &k_only, &k_obj,
                                     &v_obj, &raw_layers))
        return NULL;
    memset(&layout, 0, sizeof(layout));
    layout.model_id = str_arg(model_id, "model_id");
    if (!layout.model_id || dtype_parse(dtype, &layout.dtype) < 0 || codec_parse(k_obj, &kc) < 0 ||
        codec_parse(v_obj, &vc) < 0)
        return NULL;
    layout.layers = layers;
    layout.kv_heads = kv_heads;
    layout.head_dim = head_dim;
    layout.block_tokens = block_tokens;
    layout.kv_kind = k_only ? KVC_KV_KIND_K_ONLY : KVC_KV_KIND_KV;
    /* A namespace that allows lossy storage: the codecs named (None keeps that kind raw). */
    memset(&q, 0, sizeof(q));
    q.k_codec = kc > 0 ? (enum kvc_codec)kc : KVC_CODEC_RAW;
    q.v_codec = vc > 0 ? (enum kvc_codec)vc : KVC_CODEC_RAW;
    q.allowed = (kc > 0 ? 1u << kc : 0) | (vc > 0 ? 1u << vc : 0);
    q.raw_layers = raw_layers;
    if (client_enter(c) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS if (kc >= 0 || vc >= 0) rc = kvc_ns_open_quant(c->c, &layout, &q, &kns);
    else rc = kvc_ns_open(c->c, &layout, &kns);
    Py_END_ALLOW_THREADS client_leave(c);
    if (rc < 0)
        return kvcd_raise(rc);
    ns = PyObject_New(ns_object, &ns_type);
    if (!ns)
        return NULL;
    Py_INCREF(c);
    ns->client = c;
    ns->conn = c->conn;
    ns->ns = kns;
    Py_INCREF(model_id);
    ns->model_id = model_id;
    return (PyObject *)ns;
}

static PyObject *client_evict(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ns_id", "tier", NULL};
    client_object *c = (client_object *)self;
    unsigned int ns_id = 0, tier = 0;
    uint64_t evicted = 0;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|II:evict", kwlist, &ns_id, &tier))
        return NULL;
    if (client_enter(c) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS rc = kvc_evict(c->c, ns_id, tier, &evicted);
    Py_END_ALLOW_THREADS client_leave(c);
    if (rc < 0)
        return kvcd_raise(rc);
    return PyLong_FromUnsignedLongLong(evicted);
}

static PyObject *client_stats(PyObject *self, PyObject *args)
{
    client_object *c = (client_object *)self;
    unsigned int scope = 0;
    struct kvc_stat *st = NULL;
    size_t n = 0, i;
    PyObject *d;
    int rc;
    if (!PyArg_ParseTuple(args, "|I:stats", &scope))
        return NULL;
    if (client_enter(c) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS rc = kvc_stats(c->c, scope, &st, &n);
    Py_END_ALLOW_THREADS client_leave(c);
    if (rc < 0)
        return kvcd_raise(rc);
    d = PyDict_New();
    for (i = 0; d && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(st[i].value);
        st[i].name[sizeof(st[i].name) - 1] = 0;
        if (!v || PyDict_SetItemString(d, st[i].name, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    free(st);
    return d;
}

static PyObject *client_metrics(PyObject *self, PyObject *unused)
{
    client_object *c = (client_object *)self;
    char *text = NULL;
    int rc;
    (void)unused;
    if (client_enter(c) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS rc = kvc_metrics(c->c, &text);
    Py_END_ALLOW_THREADS client_leave(c);
    if (rc < 0)
        return kvcd_raise(rc);
    PyObject *o = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
    free(text);
    return o;
}

static PyObject *client_namespaces(PyObject *self, PyObject *unused)
{
    static const char *const dtypes[] = {[KVC_DTYPE_FP16] = "fp16",
                                         [KVC_DTYPE_BF16] = "bf16",
                                         [KVC_DTYPE_FP32] = "fp32",
                                         [KVC_DTYPE_FP8_E4M3] = "fp8_e4m3",
                                         [KVC_DTYPE_INT8] = "int8"};
    client_object *c = (client_object *)self;
    struct kvc_ns_info *ns = NULL;
    size_t n = 0;
    int rc;
    (void)unused;
    if (client_enter(c) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS rc = kvc_ns_list(c->c, &ns, &n);
    Py_END_ALLOW_THREADS client_leave(c);
    if (rc < 0)
        return kvcd_raise(rc);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        const char *dt =
            (unsigned)ns[i].dtype < sizeof(dtypes) / sizeof(dtypes[0]) && dtypes[ns[i].dtype]
                ? dtypes[ns[i].dtype]
                : "?";
        ns[i].model_id[sizeof(ns[i].model_id) - 1] = 0;
        PyObject *d = Py_BuildValue(
            "{s:I,s:I,s:s,s:I,s:I,s:I,s:I,s:s,s:s,s:K,s:K,s:K}", "id", ns[i].ns_id, "arena",
            ns[i].arena_id, "model_id", ns[i].model_id, "layers", ns[i].layers, "kv_heads",
            ns[i].kv_heads, "head_dim", ns[i].head_dim, "block_tokens", ns[i].block_tokens, "dtype",
            dt, "kv_kind", ns[i].kv_kind == KVC_KV_KIND_K_ONLY ? "k_only" : "kv", "block_bytes",
            (unsigned long long)ns[i].block_bytes, "blocks", (unsigned long long)ns[i].blocks,
            "bytes", (unsigned long long)ns[i].bytes);
        if (!d) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, d);
    }
    free(ns);
    return list;
}

static PyObject *client_flush(PyObject *self, PyObject *unused)
{
    client_object *c = (client_object *)self;
    int rc;
    (void)unused;
    if (client_enter(c) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS rc = kvc_flush(c->c);
    Py_END_ALLOW_THREADS client_leave(c);
    if (rc < 0)
        return kvcd_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *client_get_closed(PyObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((client_object *)self)->closed);
}

static PyMethodDef client_methods[] = {
    {"namespace", (PyCFunction)(void (*)(void))client_namespace, METH_VARARGS | METH_KEYWORDS,
     "namespace(model_id, layers, kv_heads, head_dim, block_tokens, dtype='fp16', "
     "k_only=False, k_codec=None, v_codec=None, raw_layers=0): opens (creating if new) a "
     "model's namespace; a codec named lets the daemon store that kind lossy."},
    {"evict", (PyCFunction)(void (*)(void))client_evict, METH_VARARGS | METH_KEYWORDS,
     "evict(ns_id=0, tier=0): (admin) evicts the unpinned blocks of a namespace (0: all); "
     "returns how many."},
    {"metrics", client_metrics, METH_NOARGS,
     "metrics(): every counter the caller may see, in the Prometheus text format."},
    {"namespaces", client_namespaces, METH_NOARGS,
     "namespaces(): the namespaces the caller may see, a dict each (id, model_id, layout, "
     "block_bytes, blocks, bytes)."},
    {"stats", client_stats, METH_VARARGS,
     "stats(scope=0): the daemon's counters (scope: 0 or a namespace id) as a dict."},
    {"flush", client_flush, METH_NOARGS,
     "flush(): waits until every block put_prefix stored is visible to every client; raises "
     "the error of a commit that failed since the last report."},
    {"close", client_close, METH_NOARGS,
     "Closes the connection (once the views still exported are released)."},
    {"__enter__", client_enter_cm, METH_NOARGS, NULL},
    {"__exit__", client_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef client_getset[] = {
    {"closed", client_get_closed, NULL, "True after close().", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject client_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcd.Client",
    .tp_basicsize = sizeof(client_object),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = client_new,
    .tp_init = client_init,
    .tp_dealloc = client_dealloc,
    .tp_methods = client_methods,
    .tp_getset = client_getset,
    .tp_doc = "Client(socket_path=None): one connection to kvcd.",
};

/* ---- module ------------------------------------------------------------------------------- */

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
    PyTypeObject *types[] = {&client_type, &ns_type, &lease_type, &resv_type, &slot_type};
    const char *names[] = {"Client", "Namespace", "Lease", "Reservation", "_Slot"};
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
        PyModule_AddIntConstant(m, "SLOT_NOSPACE", KVC_SLOT_NOSPACE) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
