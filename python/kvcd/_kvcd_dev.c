/*
 * _kvcd_dev.c — engine memory in the extension's calls: host buffers, torch tensors on the
 * CPU or a GPU, CUDA streams, engines' paged KV caches, and the calls that move blocks
 * between them and kvcd (paged scatter and gather, whole prefixes into device tensors).
 *
 * DESIGN
 * The package never imports torch nor links CUDA: a tensor is any object with data_ptr(),
 * element_size(), shape, stride(), is_contiguous() and device (.type "cpu" or "cuda",
 * .index), read through those attributes; a stream is a raw cudaStream_t (an int, or
 * .cuda_stream of a torch.cuda.Stream), an event a raw cudaEvent_t. libkvc's GPU calls
 * (kvc_gpu_attach, kvc_lease_copy_async, kvc_lease_scatter, kvc_resv_gather,
 * kvc_resv_write_async, and the layer ranges kvc_lease_scatter_layers and
 * kvc_resv_gather_layers) get those pointers as they are; the client attaches to the GPU the
 * first time a device tensor or a GPU lookup needs it, inside the call, with the GIL
 * released. Device work is queued on the caller's stream and tracked on its lease or
 * reservation: nothing here waits for the device, except release()/abort() and the
 * whole-prefix calls, whose libkvc calls wait for their own copies (never the whole device).
 *
 * Reading a tensor runs Python code (its attributes), so, as everywhere in the extension,
 * every argument is read first and the lease, reservation or namespace is checked after the
 * last of them. A tensor argument is held (a strong reference) until the call returns; its
 * storage must not be resized meanwhile, as for any call that takes data_ptr(). The paged
 * layout is checked against the namespace (heads, head_dim, element size, dim contiguous)
 * and every page the call touches against the tensors' page count: libkvc cannot see how
 * many pages an engine's tensor holds.
 */
#include "python/kvcd/_kvcd.h"

/* Keys per reservation (the protocol's batch, as kvc_put_prefix splits its puts). */
#define DEV_MAX_KEYS 2048u
/* Dimensions of a tensor argument this file reads. */
#define DEV_MAX_DIMS 6

void ns_layout_fill(struct ns_layout *l, const struct kvc_layout *k)
{
    static const uint32_t elem[] = {[KVC_DTYPE_FP16] = 2,
                                    [KVC_DTYPE_BF16] = 2,
                                    [KVC_DTYPE_FP32] = 4,
                                    [KVC_DTYPE_FP8_E4M3] = 1,
                                    [KVC_DTYPE_INT8] = 1};
    l->layers = k->layers;
    l->kv_heads = k->kv_heads;
    l->head_dim = k->head_dim;
    l->block_tokens = k->block_tokens;
    l->dtype = k->dtype;
    l->k_only = k->kv_kind == KVC_KV_KIND_K_ONLY;
    l->elem = (unsigned)k->dtype < sizeof(elem) / sizeof(elem[0]) ? elem[k->dtype] : 0;
}

/* ---- the client's GPU use ----------------------------------------------------------------- */

int client_gpu_attach_nogil(client_object *c, int *state)
{
    /* Read without the GIL: a stale -1 only calls kvc_gpu_attach again, which returns its
     * first answer. */
    int s = __atomic_load_n(&c->gpu_state, __ATOMIC_RELAXED);
    if (s >= 0) {
        *state = s;
        return 0;
    }
    s = kvc_gpu_attach(c->c);
    if (s < 0)
        return s;
    *state = s;
    return 0;
}

void client_gpu_state_set(client_object *c, int state)
{
    if (state >= 0)
        __atomic_store_n(&c->gpu_state, state, __ATOMIC_RELAXED);
}

/* ---- tensors -------------------------------------------------------------------------------- */

/* o.name() (call) or o.name as a long long. */
static int attr_ll(PyObject *o, const char *name, int call, long long *v)
{
    PyObject *a = PyObject_GetAttrString(o, name), *r = NULL;
    if (!a)
        return -1;
    r = call ? PyObject_CallNoArgs(a) : (Py_INCREF(a), a);
    Py_DECREF(a);
    if (!r)
        return -1;
    *v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return *v == -1 && PyErr_Occurred() ? -1 : 0;
}

/* A tensor-like object: has data_ptr() (torch.Tensor and look-alikes). */
static int is_tensor(PyObject *o)
{
    return !PyObject_CheckBuffer(o) && PyObject_HasAttrString(o, "data_ptr");
}

/* The device of a tensor: -1 for the CPU, the CUDA device index (the current device's
 * -2 when the tensor does not say) for a CUDA tensor; TypeError for other devices. */
static int tensor_device(PyObject *o, int *device)
{
    PyObject *dev = PyObject_GetAttrString(o, "device"), *type = NULL, *index = NULL;
    int rc = -1;
    if (!dev)
        return -1;
    type = PyObject_GetAttrString(dev, "type");
    if (!type || !PyUnicode_Check(type))
        goto out;
    if (PyUnicode_CompareWithASCIIString(type, "cpu") == 0) {
        *device = -1;
        rc = 0;
    } else if (PyUnicode_CompareWithASCIIString(type, "cuda") == 0) {
        index = PyObject_GetAttrString(dev, "index");
        if (!index)
            goto out;
        *device = index == Py_None ? -2 : (int)PyLong_AsLong(index);
        rc = *device == -1 && PyErr_Occurred() ? -1 : 0;
    } else {
        PyErr_Format(PyExc_TypeError, "kvcd: tensors on %U are not supported (cpu, cuda)", type);
    }
out:
    if (rc < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "kvcd: a tensor's device has no type");
    Py_XDECREF(index);
    Py_XDECREF(type);
    Py_DECREF(dev);
    return rc;
}

/* The namespace dtype a torch dtype names (0: not a name this knows; only sizes are then
 * compared). */
static int torch_dtype(PyObject *o)
{
    static const struct {
        const char *name;
        int dtype;
    } names[] = {{"torch.float16", KVC_DTYPE_FP16},
                 {"torch.bfloat16", KVC_DTYPE_BF16},
                 {"torch.float32", KVC_DTYPE_FP32},
                 {"torch.float8_e4m3fn", KVC_DTYPE_FP8_E4M3},
                 {"torch.int8", KVC_DTYPE_INT8}};
    PyObject *d = PyObject_GetAttrString(o, "dtype"), *s;
    int r = 0;
    if (!d) {
        PyErr_Clear();
        return 0;
    }
    s = PyObject_Str(d);
    Py_DECREF(d);
    if (!s) {
        PyErr_Clear();
        return 0;
    }
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (PyUnicode_CompareWithASCIIString(s, names[i].name) == 0)
            r = names[i].dtype;
    Py_DECREF(s);
    return r;
}

int mem_get(PyObject *o, struct mem *m, size_t min_len, int writable)
{
    long long ptr, nbytes, elem, numel;
    memset(m, 0, sizeof(*m));
    m->device = -1;
    if (!is_tensor(o)) {
        if (PyObject_GetBuffer(o, &m->buf, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) <
            0)
            return -1;
        m->ptr = m->buf.buf;
        m->len = (size_t)m->buf.len;
    } else {
        PyObject *c = PyObject_CallMethod(o, "is_contiguous", NULL);
        int contiguous = c ? PyObject_IsTrue(c) : -1;
        Py_XDECREF(c);
        if (contiguous < 0)
            return -1;
        if (!contiguous) {
            PyErr_SetString(PyExc_ValueError, "kvcd: a block tensor must be contiguous");
            return -1;
        }
        if (tensor_device(o, &m->device) < 0 || attr_ll(o, "data_ptr", 1, &ptr) < 0 ||
            attr_ll(o, "element_size", 1, &elem) < 0 || attr_ll(o, "numel", 1, &numel) < 0)
            return -1;
        nbytes = elem * numel;
        if (ptr == 0 || nbytes < 0) {
            PyErr_SetString(PyExc_ValueError, "kvcd: a tensor without storage");
            return -1;
        }
        Py_INCREF(o);
        m->tensor = o;
        m->ptr = (void *)(uintptr_t)ptr;
        m->len = (size_t)nbytes;
    }
    if (m->len < min_len) {
        PyErr_Format(PyExc_ValueError, "kvcd: buffer of %zu bytes, a block is %zu", m->len,
                     min_len);
        mem_release(m);
        return -1;
    }
    return 0;
}

void mem_release(struct mem *m)
{
    if (m->buf.obj)
        PyBuffer_Release(&m->buf);
    Py_CLEAR(m->tensor);
}

int mems_get(PyObject *seq, size_t n, size_t min_len, int writable, struct mem **out, int *device)
{
    PyObject *t = seq_tuple(seq, "kvcd: buffers must be a sequence");
    struct mem *m = NULL;
    size_t got = 0;
    *out = NULL;
    *device = 0;
    if (!t)
        return -1;
    if ((size_t)PyTuple_GET_SIZE(t) != n) {
        PyErr_Format(PyExc_ValueError, "kvcd: %zd buffers for %zu keys", PyTuple_GET_SIZE(t), n);
        goto fail;
    }
    m = PyMem_Calloc(n ? n : 1, sizeof(*m));
    if (!m) {
        PyErr_NoMemory();
        goto fail;
    }
    for (; got < n; got++) {
        if (mem_get(PyTuple_GET_ITEM(t, (Py_ssize_t)got), &m[got], min_len, writable) < 0)
            goto fail;
        *device |= m[got].device != -1;
    }
    Py_DECREF(t);
    *out = m;
    return 0;
fail:
    mems_release(m, got);
    Py_DECREF(t);
    return -1;
}

void mems_release(struct mem *m, size_t n)
{
    for (size_t i = 0; m && i < n; i++)
        mem_release(&m[i]);
    PyMem_Free(m);
}

int stream_get(PyObject *o, PyObject *tensor, void **stream)
{
    PyObject *v = NULL;
    *stream = NULL;
    if (o == Py_None) {
        /* torch's current stream for a torch CUDA tensor (kvcd._torch, which imports torch
         * only when torch is already loaded), else the legacy default stream. */
        PyObject *mod;
        if (!tensor)
            return 0;
        mod = PyImport_ImportModule("kvcd._torch");
        if (!mod)
            return -1;
        v = PyObject_CallMethod(mod, "default_stream", "O", tensor);
        Py_DECREF(mod);
    } else if (PyLong_Check(o)) {
        Py_INCREF(o);
        v = o;
    } else {
        v = PyObject_GetAttrString(o, "cuda_stream");
        if (!v && PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "kvcd: stream must be None, a cudaStream_t (int) or a "
                                             "torch.cuda.Stream");
        }
    }
    if (!v)
        return -1;
    *stream = PyLong_AsVoidPtr(v);
    Py_DECREF(v);
    return *stream == NULL && PyErr_Occurred() ? -1 : 0;
}

/* event: None or a cudaEvent_t (an int). */
static int event_get(PyObject *o, void **event)
{
    *event = NULL;
    if (o == Py_None)
        return 0;
    if (!PyLong_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "kvcd: event must be None or a cudaEvent_t (an int); "
                                         "with torch, record a torch.cuda.Event on the stream "
                                         "after the call");
        return -1;
    }
    *event = PyLong_AsVoidPtr(o);
    return *event == NULL && PyErr_Occurred() ? -1 : 0;
}

/* ---- paged KV ------------------------------------------------------------------------------- */

/* A strided tensor or buffer: shape and byte strides. */
struct tinfo {
    char *ptr;
    int ndim;
    Py_ssize_t shape[DEV_MAX_DIMS], strides[DEV_MAX_DIMS];
    size_t elem;
    int dtype; /* a torch dtype's namespace dtype, 0 unknown */
    int device;
    PyObject *tensor; /* strong */
    Py_buffer buf;
};

static void tinfo_release(struct tinfo *t)
{
    if (t->buf.obj)
        PyBuffer_Release(&t->buf);
    Py_CLEAR(t->tensor);
}

/* A sequence of ints into v[0..n). */
static int ints_get(PyObject *o, const char *what, Py_ssize_t *v, int max, int *n)
{
    PyObject *t = seq_tuple(o, what);
    if (!t)
        return -1;
    *n = (int)PyTuple_GET_SIZE(t);
    if (*n > max) {
        PyErr_Format(PyExc_ValueError, "kvcd: %s: more than %d dimensions", what, max);
        Py_DECREF(t);
        return -1;
    }
    for (int i = 0; i < *n; i++) {
        v[i] = PyNumber_AsSsize_t(PyTuple_GET_ITEM(t, i), PyExc_OverflowError);
        if (v[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(t);
            return -1;
        }
    }
    Py_DECREF(t);
    return 0;
}

static int tinfo_get(PyObject *o, struct tinfo *t, int writable)
{
    memset(t, 0, sizeof(*t));
    t->device = -1;
    if (!is_tensor(o)) {
        int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(o, &t->buf, flags) < 0)
            return -1;
        if (t->buf.ndim > DEV_MAX_DIMS || t->buf.ndim < 1) {
            PyErr_SetString(PyExc_ValueError, "kvcd: a KV cache array of 1 to 6 dimensions");
            tinfo_release(t);
            return -1;
        }
        t->ptr = t->buf.buf;
        t->ndim = t->buf.ndim;
        t->elem = (size_t)t->buf.itemsize;
        for (int i = 0; i < t->ndim; i++) {
            t->shape[i] = t->buf.shape[i];
            t->strides[i] = t->buf.strides[i];
        }
        return 0;
    }
    long long ptr, elem;
    int n2 = 0;
    PyObject *shape = NULL, *strides = NULL;
    if (tensor_device(o, &t->device) < 0 || attr_ll(o, "data_ptr", 1, &ptr) < 0 ||
        attr_ll(o, "element_size", 1, &elem) < 0)
        return -1;
    shape = PyObject_GetAttrString(o, "shape");
    strides = shape ? PyObject_CallMethod(o, "stride", NULL) : NULL;
    if (!strides ||
        ints_get(shape, "kvcd: a tensor's shape", t->shape, DEV_MAX_DIMS, &t->ndim) < 0 ||
        ints_get(strides, "kvcd: a tensor's strides", t->strides, DEV_MAX_DIMS, &n2) < 0) {
        Py_XDECREF(shape);
        Py_XDECREF(strides);
        return -1;
    }
    Py_DECREF(shape);
    Py_DECREF(strides);
    if (n2 != t->ndim || t->ndim < 1 || elem <= 0 || ptr == 0) {
        PyErr_SetString(PyExc_ValueError, "kvcd: a KV cache tensor without storage or shape");
        return -1;
    }
    for (int i = 0; i < t->ndim; i++)
        t->strides[i] *= (Py_ssize_t)elem;
    t->ptr = (char *)(uintptr_t)ptr;
    t->elem = (size_t)elem;
    t->dtype = torch_dtype(o);
    Py_INCREF(o);
    t->tensor = o;
    return 0;
}

/* An engine's paged KV, read from its tensors and block table. */
struct paged {
    struct kvc_paged_kv kv;
    void **k, **v;
    int32_t *table;
    struct tinfo *t; /* every tensor read, released by paged_release() */
    size_t nt;
    Py_ssize_t pages;
    int device;   /* -1 host, else CUDA */
    int borrowed; /* t, k and v belong to a kvcd.PagedKV: only the table is this call's */
};

static void paged_release(struct paged *p)
{
    if (!p->borrowed) {
        for (size_t i = 0; p->t && i < p->nt; i++)
            tinfo_release(&p->t[i]);
        PyMem_Free(p->t);
        PyMem_Free(p->k);
        PyMem_Free(p->v);
    }
    PyMem_Free(p->table);
    memset(p, 0, sizeof(*p));
}

/* The 4 dimensions [pages, page_tokens, heads, head_dim] of layer tensor t (or of its K or
 * V half: `half` 0/1 of a combined tensor split on kv_dim, -1 none): the base, shape and
 * byte strides. 3-D tensors are MLA's [pages, page_tokens, dim] (one head). */
static int paged_dims(const struct ns_layout *lay, const struct tinfo *t, int half, int kv_dim,
                      char **base, Py_ssize_t shape[4], Py_ssize_t strides[4])
{
    int j = 0;
    if (t->elem != lay->elem || (t->dtype && t->dtype != (int)lay->dtype)) {
        PyErr_SetString(PyExc_TypeError, "kvcd: a KV cache tensor of another dtype than the "
                                         "namespace's");
        return -1;
    }
    *base = t->ptr;
    if (half >= 0) {
        if (t->ndim != 5 || kv_dim < 0 || kv_dim > 1 || t->shape[kv_dim] != 2) {
            PyErr_Format(PyExc_ValueError,
                         "kvcd: a K+V tensor is [2, pages, page_tokens, heads, dim] (kv_dim=0) "
                         "or [pages, 2, ...] (kv_dim=1); got %d dimensions",
                         t->ndim);
            return -1;
        }
        *base += half * t->strides[kv_dim];
        for (int i = 0; i < 5; i++)
            if (i != kv_dim) {
                shape[j] = t->shape[i];
                strides[j++] = t->strides[i];
            }
    } else if (t->ndim == 4) {
        for (int i = 0; i < 4; i++) {
            shape[i] = t->shape[i];
            strides[i] = t->strides[i];
        }
    } else if (t->ndim == 3 && lay->kv_heads == 1) {
        shape[0] = t->shape[0];
        shape[1] = t->shape[1];
        shape[2] = 1;
        shape[3] = t->shape[2];
        strides[0] = t->strides[0];
        strides[1] = t->strides[1];
        strides[2] = t->shape[2] * (Py_ssize_t)t->elem;
        strides[3] = t->strides[2];
    } else {
        PyErr_Format(PyExc_ValueError,
                     "kvcd: a KV cache tensor is [pages, page_tokens, heads, dim] (3-D "
                     "[pages, page_tokens, dim] for one head); got %d dimensions",
                     t->ndim);
        return -1;
    }
    if (shape[2] != (Py_ssize_t)lay->kv_heads || shape[3] != (Py_ssize_t)lay->head_dim ||
        strides[3] != (Py_ssize_t)lay->elem || shape[0] < 1 || shape[1] < 1 || strides[0] < 0 ||
        strides[1] < 0 || strides[2] < 0) {
        PyErr_Format(PyExc_ValueError,
                     "kvcd: a KV cache tensor of [%zd, %zd, %zd, %zd] with strides (bytes) "
                     "[%zd, %zd, %zd, %zd] does not hold this namespace's %u heads of %u "
                     "contiguous elements",
                     shape[0], shape[1], shape[2], shape[3], strides[0], strides[1], strides[2],
                     strides[3], lay->kv_heads, lay->head_dim);
        return -1;
    }
    return 0;
}

/* Entries [0, need) of a list or tuple of ints into table (need <= its length): 1 done, 0
 * when an entry is not an exact int of a C long (the caller converts the general way, which
 * raises for it as before). An exact int's conversion runs no Python code, so the sequence
 * cannot change under this loop. */
static int paged_table_ints(PyObject *o, Py_ssize_t need, int32_t *table)
{
    PyObject **items = PySequence_Fast_ITEMS(o);
    for (Py_ssize_t i = 0; i < need; i++) {
        int overflow = 0;
        if (!PyLong_CheckExact(items[i]))
            return 0;
        long v = PyLong_AsLongAndOverflow(items[i], &overflow);
        if (overflow)
            return 0;
        table[i] = v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : (int32_t)v;
    }
    return 1;
}

/* The block table as int32, every page the call touches (tokens [first_token, end)) checked
 * against the tensors' page count. Only the entries up to the last page touched are read
 * (table_len is theirs): an engine passes its whole table (a sequence's, or every page of
 * its cache) to load a prefix of it, and a call's cost should be its blocks', not the
 * table's. A list or tuple of ints is read in place; anything else (torch, numpy: their
 * tolist(), any sequence) is converted whole first. */
static int paged_table(struct paged *p, PyObject *o, uint64_t first_token, uint64_t end)
{
    PyObject *t = NULL, *tt = NULL;
    Py_ssize_t len, need;
    const uint64_t pt = p->kv.page_tokens;
    const uint64_t last = end > first_token ? (end - 1) / pt : 0;
    int rc = -1;
    if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
        tt = o;
        Py_INCREF(tt);
    } else {
        if (is_tensor(o) ||
            (!PyList_Check(o) && !PyTuple_Check(o) && PyObject_HasAttrString(o, "tolist")))
            t = PyObject_CallMethod(o, "tolist", NULL); /* torch or numpy: their ints */
        else
            t = seq_tuple(o, "kvcd: block_table must be a sequence of page indexes");
        if (!t)
            return -1;
        tt = seq_tuple(t, "kvcd: block_table must be a sequence of page indexes");
        Py_DECREF(t);
        if (!tt)
            return -1;
    }
    len = PySequence_Fast_GET_SIZE(tt);
    if (len > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "kvcd: block_table too long");
        goto out;
    }
    if (end > first_token && last >= (uint64_t)len) {
        PyErr_Format(PyExc_ValueError,
                     "kvcd: tokens up to %llu need %llu block_table entries, it has %zd",
                     (unsigned long long)end, (unsigned long long)last + 1, len);
        goto out;
    }
    need = end > first_token ? (Py_ssize_t)last + 1 : len;
    p->table = PyMem_Malloc((size_t)(need ? need : 1) * sizeof(int32_t));
    if (!p->table) {
        PyErr_NoMemory();
        goto out;
    }
    if (!paged_table_ints(tt, need, p->table)) {
        /* Not all exact ints: a tuple of its own (an entry's __index__ may run code that
         * changes a list), each entry converted as an index. */
        PyObject *own = PySequence_Tuple(tt);
        if (!own)
            goto out;
        Py_SETREF(tt, own);
        if (PyTuple_GET_SIZE(tt) < need) {
            PyErr_SetString(PyExc_ValueError, "kvcd: block_table changed while it was read");
            goto out;
        }
        for (Py_ssize_t i = 0; i < need; i++) {
            long v = PyLong_AsLong(PyTuple_GET_ITEM(tt, i));
            if (v == -1 && PyErr_Occurred())
                goto out;
            p->table[i] = v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : (int32_t)v;
        }
    }
    p->kv.block_table = p->table;
    p->kv.table_len = (uint32_t)need;
    if (end > first_token) {
        for (uint64_t pg = first_token / pt; pg <= last; pg++)
            if (p->table[pg] < 0 || p->table[pg] >= p->pages) {
                PyErr_Format(PyExc_ValueError,
                             "kvcd: block_table[%llu] = %d is not a page of the KV cache "
                             "(%zd pages)",
                             (unsigned long long)pg, (int)p->table[pg], p->pages);
                goto out;
            }
    }
    rc = 0;
out:
    Py_XDECREF(tt);
    return rc;
}

/* k_caches / v_caches (one tensor per layer; v None: K+V tensors split on kv_dim, or a K-only
 * namespace) and the block table, for tokens [first_token, first_token + n blocks). */
static int paged_get(const struct ns_layout *lay, PyObject *k_obj, PyObject *v_obj, int kv_dim,
                     int writable, struct paged *p)
{
    PyObject *ks = NULL, *vs = NULL;
    int combined = 0, rc = -1;
    size_t L = lay->layers;
    memset(p, 0, sizeof(*p));
    ks = seq_tuple(k_obj, "kvcd: k_caches must be a sequence of one tensor per layer");
    if (!ks)
        goto out;
    if (v_obj != Py_None) {
        if (lay->k_only) {
            PyErr_SetString(PyExc_ValueError, "kvcd: a K-only (MLA) namespace takes no v_caches");
            goto out;
        }
        vs = seq_tuple(v_obj, "kvcd: v_caches must be a sequence of one tensor per layer");
        if (!vs)
            goto out;
    } else {
        combined = !lay->k_only;
    }
    if ((size_t)PyTuple_GET_SIZE(ks) != L || (vs && (size_t)PyTuple_GET_SIZE(vs) != L)) {
        PyErr_Format(PyExc_ValueError,
                     "kvcd: one KV cache tensor per layer of the namespace (%u), %zd given",
                     lay->layers, PyTuple_GET_SIZE(ks));
        goto out;
    }
    p->t = PyMem_Calloc(2 * L, sizeof(*p->t));
    p->k = PyMem_Calloc(L, sizeof(void *));
    p->v = lay->k_only ? NULL : PyMem_Calloc(L, sizeof(void *));
    if (!p->t || !p->k || (!lay->k_only && !p->v)) {
        PyErr_NoMemory();
        goto out;
    }
    Py_ssize_t shape0[4] = {0}, strides0[4] = {0};
    for (size_t l = 0; l < L; l++) {
        for (int kind = 0; kind < (lay->k_only ? 1 : 2); kind++) {
            struct tinfo *t;
            Py_ssize_t shape[4], strides[4];
            char *base;
            if (kind == 1 && combined) {
                t = &p->t[p->nt - 1];
            } else {
                t = &p->t[p->nt];
                if (tinfo_get(PyTuple_GET_ITEM(kind ? vs : ks, (Py_ssize_t)l), t, writable) < 0)
                    goto out;
                p->nt++;
            }
            if (paged_dims(lay, t, combined ? kind : -1, kv_dim, &base, shape, strides) < 0)
                goto out;
            if (p->nt == 1 && kind == 0) {
                memcpy(shape0, shape, sizeof(shape0));
                memcpy(strides0, strides, sizeof(strides0));
                p->device = t->device;
            } else if (memcmp(shape, shape0, sizeof(shape0)) ||
                       memcmp(strides, strides0, sizeof(strides0)) || t->device != p->device) {
                PyErr_SetString(PyExc_ValueError, "kvcd: every layer's K and V tensors must have "
                                                  "the same shape, strides and device");
                goto out;
            }
            (kind ? p->v : p->k)[l] = base;
        }
    }
    p->pages = shape0[0];
    p->kv.k = p->k;
    p->kv.v = p->v;
    p->kv.page_tokens = (uint32_t)shape0[1];
    p->kv.page_stride = (uint64_t)strides0[0];
    p->kv.token_stride = (uint64_t)strides0[1];
    p->kv.head_stride = (uint64_t)strides0[2];
    p->kv.on_device = p->device != -1;
    if (shape0[1] > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "kvcd: too many tokens per page");
        goto out;
    }
    rc = 0;
out:
    Py_XDECREF(ks);
    Py_XDECREF(vs);
    if (rc < 0)
        paged_release(p);
    return rc;
}

/* ---- kvcd.PagedKV: an engine's paged KV cache read once ------------------------------------ */

/* The tensors of a cache are read (attributes, shapes, strides, checks) once, when the
 * PagedKV is made, instead of at every scatter and gather: an engine that loads layer by
 * layer calls them per layer and step. It holds its tensors (and the buffers of arrays). */
typedef struct {
    PyObject ob_base;
    struct paged p;
    struct ns_layout lay;
} paged_object;

static void paged_dealloc(PyObject *self)
{
    paged_release(&((paged_object *)self)->p);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *paged_get_pages(PyObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromSsize_t(((paged_object *)self)->p.pages);
}

static PyObject *paged_get_page_tokens(PyObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLong(((paged_object *)self)->p.kv.page_tokens);
}

static PyObject *paged_get_on_device(PyObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((paged_object *)self)->p.device != -1);
}

static PyGetSetDef paged_getset[] = {
    {"pages", paged_get_pages, NULL, "Pages of the cache.", NULL},
    {"page_tokens", paged_get_page_tokens, NULL, "Tokens per page.", NULL},
    {"on_device", paged_get_on_device, NULL, "True for CUDA tensors.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject paged_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcd.PagedKV",
    .tp_basicsize = sizeof(paged_object),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = paged_dealloc,
    .tp_getset = paged_getset,
    .tp_doc = "An engine's paged KV cache checked against a namespace once "
              "(Namespace.paged_kv()); pass it as k_caches (v_caches None) to scatter and "
              "gather.",
};

PyObject *ns_paged_kv(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"k_caches", "v_caches", "kv_dim", NULL};
    ns_object *ns = (ns_object *)self;
    PyObject *k_obj, *v_obj = Py_None;
    int kv_dim = 0;
    paged_object *o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|Oi:paged_kv", kwlist, &k_obj, &v_obj, &kv_dim))
        return NULL;
    o = PyObject_New(paged_object, &paged_type);
    if (!o)
        return NULL;
    memset(&o->p, 0, sizeof(o->p));
    o->lay = ns->lay; /* the layout is the namespace object's own copy: no handle is used */
    if (paged_get(&o->lay, k_obj, v_obj, kv_dim, 1, &o->p) < 0) {
        Py_DECREF(o);
        return NULL;
    }
    return (PyObject *)o;
}

/* layers: None (all), an int, or a range of step 1 within the namespace's layers. */
static int layers_get(PyObject *o, uint32_t nlayers, uint32_t *first, uint32_t *count)
{
    Py_ssize_t a, b;
    *first = 0;
    *count = nlayers;
    if (o == Py_None)
        return 0;
    if (PyLong_Check(o)) {
        a = PyLong_AsSsize_t(o);
        if (a == -1 && PyErr_Occurred())
            return -1;
        b = a + 1;
    } else if (PyRange_Check(o)) {
        long long s;
        if (attr_ll(o, "step", 0, &s) < 0)
            return -1;
        long long aa, bb;
        if (attr_ll(o, "start", 0, &aa) < 0 || attr_ll(o, "stop", 0, &bb) < 0)
            return -1;
        if (s != 1) {
            PyErr_SetString(PyExc_ValueError, "kvcd: layers must be a range of step 1");
            return -1;
        }
        a = (Py_ssize_t)aa;
        b = (Py_ssize_t)bb;
    } else {
        PyErr_SetString(PyExc_TypeError, "kvcd: layers must be None, an int or a range");
        return -1;
    }
    if (a < 0 || b <= a || b > (Py_ssize_t)nlayers) {
        PyErr_Format(PyExc_ValueError, "kvcd: layers [%zd, %zd) not within the namespace's %u", a,
                     b, nlayers);
        return -1;
    }
    *first = (uint32_t)a;
    *count = (uint32_t)(b - a);
    return 0;
}

/* ---- scatter and gather --------------------------------------------------------------------- */

/* Lease.scatter and Reservation.gather: the same arguments, one direction each. */
static PyObject *handle_paged(struct handle *h, PyObject *args, PyObject *kw, int scatter)
{
    static char *kwlist[] = {"k_caches", "v_caches", "block_table", "first",  "n", "first_token",
                             "layers",   "stream",   "event",       "kv_dim", NULL};
    PyObject *k_obj, *v_obj, *table, *n_obj = Py_None, *layers = Py_None, *stream_obj = Py_None,
                                     *event_obj = Py_None;
    Py_ssize_t first = 0;
    unsigned long long first_token = 0;
    int kv_dim = 0, rc, state = -1;
    uint32_t lfirst, lcount;
    void *stream = NULL, *event = NULL;
    struct paged p;
    size_t n;
    if (!PyArg_ParseTupleAndKeywords(args, kw,
                                     scatter ? "OOO|$nOKOOOi:scatter" : "OOO|$nOKOOOi:gather",
                                     kwlist, &k_obj, &v_obj, &table, &first, &n_obj, &first_token,
                                     &layers, &stream_obj, &event_obj, &kv_dim))
        return NULL;
    if (first < 0 || (size_t)first > h->n) {
        PyErr_SetString(PyExc_IndexError, "kvcd: first out of range");
        return NULL;
    }
    if (n_obj == Py_None) {
        n = h->n - (size_t)first;
    } else {
        Py_ssize_t v = PyNumber_AsSsize_t(n_obj, PyExc_OverflowError);
        if (v == -1 && PyErr_Occurred())
            return NULL;
        if (v < 0) {
            PyErr_SetString(PyExc_ValueError, "kvcd: n must be >= 0");
            return NULL;
        }
        n = (size_t)v;
        if (n > h->n - (size_t)first) {
            PyErr_Format(PyExc_IndexError, "kvcd: blocks [%zd, %zu) of %zu", first,
                         (size_t)first + n, h->n);
            return NULL;
        }
    }
    if (PyObject_TypeCheck(k_obj, &paged_type)) {
        paged_object *po = (paged_object *)k_obj;
        if (v_obj != Py_None || memcmp(&po->lay, &h->lay, sizeof(h->lay)) != 0) {
            PyErr_SetString(PyExc_ValueError, "kvcd: a PagedKV of another layout (or with "
                                              "v_caches given)");
            return NULL;
        }
        p = po->p; /* borrowed: k_obj is held by the call's arguments */
        p.borrowed = 1;
        p.table = NULL;
    } else if (paged_get(&h->lay, k_obj, v_obj, kv_dim, scatter, &p) < 0) {
        return NULL;
    }
    if (paged_table(&p, table, first_token, first_token + (uint64_t)n * h->lay.block_tokens) < 0)
        goto fail;
    if (layers_get(layers, h->lay.layers, &lfirst, &lcount) < 0 ||
        stream_get(stream_obj, p.device != -1 ? p.t[0].tensor : NULL, &stream) < 0 ||
        event_get(event_obj, &event) < 0)
        goto fail;
    /* Every argument read: the handle is checked now, nothing runs before its use. */
    if (handle_check(h) < 0)
        goto fail;
    if ((size_t)first > h->n || n > h->n - (size_t)first) {
        PyErr_Format(PyExc_IndexError, "kvcd: blocks [%zd, %zu) of %zu", first, (size_t)first + n,
                     h->n);
        goto fail;
    }
    if (scatter && (size_t)first + n > (size_t)kvc_lease_ready(h->h)) {
        PyErr_SetString(PyExc_ValueError,
                        "kvcd: hits still being read from disk (lease.wait() first)");
        goto fail;
    }
    if (client_enter(h->client) < 0)
        goto fail;
    Py_BEGIN_ALLOW_THREADS;
    rc = p.device != -1 ? client_gpu_attach_nogil(h->client, &state) : 0;
    if (rc >= 0 && scatter)
        rc = lcount == h->lay.layers
                 ? kvc_lease_scatter(h->h, (size_t)first, n, &p.kv, first_token, stream, event)
                 : kvc_lease_scatter_layers(h->h, (size_t)first, n, &p.kv, first_token, lfirst,
                                            lcount, stream, event);
    else if (rc >= 0)
        rc = lcount == h->lay.layers
                 ? kvc_resv_gather(h->h, (size_t)first, n, &p.kv, first_token, stream, event)
                 : kvc_resv_gather_layers(h->h, (size_t)first, n, &p.kv, first_token, lfirst,
                                          lcount, stream, event);
    Py_END_ALLOW_THREADS;
    client_gpu_state_set(h->client, state);
    if (p.device != -1)
        h->device_work = 1;
    client_leave(h->client);
    paged_release(&p);
    if (rc < 0)
        return kvcd_raise(rc);
    return PyLong_FromLong(rc);
fail:
    paged_release(&p);
    return NULL;
}

PyObject *lease_scatter(PyObject *self, PyObject *args, PyObject *kw)
{
    return handle_paged((struct handle *)self, args, kw, 1);
}

PyObject *resv_gather(PyObject *self, PyObject *args, PyObject *kw)
{
    return handle_paged((struct handle *)self, args, kw, 0);
}

/* ---- whole prefixes with device tensors ------------------------------------------------------ */

/* get: one lookup, each hit copied to its tensor (queued on stream for device memory), one
 * release, which waits for those copies. put: per batch of keys one reservation, each
 * reserved slot written from its tensor (device: queued), one commit, which waits for the
 * copies before it publishes. Returns the blocks loaded or written. GIL released. */
static int prefix_dev_nogil(kvc_ns *kns, const struct kvc_key *keys, size_t n,
                            const struct kvc_key *parent, const struct mem *m, void *stream,
                            size_t block_bytes, int put)
{
    int rc = 0, done = 0;
    if (!put) {
        kvc_lease *l = NULL;
        int hits = kvc_lookup(kns, keys, n, 0, &l);
        if (hits <= 0)
            return hits;
        for (int i = 0, j; i < hits && rc >= 0; i = j) {
            j = i + 1;
            if (m[i].device == -1) {
                rc = kvc_lease_copy(l, (size_t)i, m[i].ptr, m[i].len);
                continue;
            }
            /* Device blocks that follow each other in memory (rows of one tensor): one
             * range copy, a bounded number of device operations whatever their count. */
            while (j < hits && m[j].device != -1 &&
                   (char *)m[j].ptr == (char *)m[i].ptr + (size_t)(j - i) * block_bytes)
                j++;
            rc = j - i > 1 ? kvc_lease_copy_range_async(l, (size_t)i, (size_t)(j - i), m[i].ptr,
                                                        (size_t)(j - i) * block_bytes, stream)
                           : kvc_lease_copy_async(l, (size_t)i, m[i].ptr, m[i].len, stream);
        }
        rc = rc < 0 ? rc : 0;
        int rrc = kvc_release(l);
        rc = rc ? rc : rrc;
        return rc ? rc : hits;
    }
    for (size_t off = 0; off < n && rc >= 0; off += DEV_MAX_KEYS) {
        size_t cn = n - off < DEV_MAX_KEYS ? n - off : DEV_MAX_KEYS;
        kvc_resv *r = NULL;
        int written = 0;
        rc = kvc_reserve(kns, off ? &keys[off - 1] : parent, keys + off, cn, &r);
        if (rc < 0)
            break;
        for (size_t i = 0; i < cn && rc >= 0; i++) {
            if (kvc_resv_status(r, i) != KVC_SLOT_RESERVED)
                continue;
            const struct mem *b = &m[off + i];
            rc = b->device != -1 ? kvc_resv_write_async(r, i, b->ptr, block_bytes, stream)
                                 : kvc_resv_write(r, i, b->ptr, block_bytes);
            written += rc >= 0;
        }
        if (rc < 0) {
            kvc_abort(r);
            break;
        }
        rc = kvc_commit(r, SIZE_MAX);
        if (rc >= 0)
            done += written;
    }
    return rc < 0 ? rc : done;
}

PyObject *ns_prefix_dev(ns_object *ns, const struct kvc_key *keys, size_t n,
                        const struct kvc_key *parent, struct mem *m, PyObject *stream_obj, int put)
{
    PyObject *tensor = NULL;
    void *stream = NULL;
    size_t block_bytes = 0;
    int rc, state = -1;
    for (size_t i = 0; i < n && !tensor; i++)
        if (m[i].device != -1)
            tensor = m[i].tensor;
    if (stream_get(stream_obj, tensor, &stream) < 0 || ns_enter(ns) < 0)
        return NULL;
    block_bytes = kvc_ns_block_bytes(ns->ns);
    Py_BEGIN_ALLOW_THREADS;
    rc = client_gpu_attach_nogil(ns->client, &state);
    if (rc >= 0)
        rc = prefix_dev_nogil(ns->ns, keys, n, parent, m, stream, block_bytes, put);
    Py_END_ALLOW_THREADS;
    client_gpu_state_set(ns->client, state);
    client_leave(ns->client);
    if (rc < 0)
        return kvcd_raise(rc);
    return PyLong_FromLong(rc);
}
