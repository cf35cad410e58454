/*
 * _kvcd_ns.c — kvcd.Namespace: keys, lookups, reservations and whole-prefix copies.
 *
 * DESIGN
 * A Namespace is a kvc_ns of its client's connection: ns->ns is freed with that connection,
 * so every call checks the namespace (ns_check: its client open, the same connection) after
 * it read its last argument, with no Python code between that check and the use, and
 * round trips run between ns_enter() and client_leave().
 */
#include "python/kvcd/_kvcd.h"

/* ns->ns is usable: its connection is open (ns->ns is freed with it). Call it after the
 * last argument was read, with no Python code between it and the use. */
int ns_check(ns_object *ns)
{
    client_object *c = ns->client;
    if (c->closed || !c->c || ns->conn != c->conn) {
        PyErr_SetString(PyExc_ValueError, "kvcd: the client is closed");
        return -1;
    }
    return 0;
}

/* ns_check, then client_enter: before a call that releases the GIL. */
int ns_enter(ns_object *ns)
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
    static char *kwlist[] = {"keys", "ready_only", "nowait", "gpu", NULL};
    ns_object *ns = (ns_object *)self;
    PyObject *keys_obj;
    struct kvc_key *keys = NULL;
    struct handle *h;
    kvc_lease *l = NULL;
    size_t n;
    unsigned flags = 0;
    int ready_only = 0, nowait = 0, gpu = 0, rc, state = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|ppp:lookup", kwlist, &keys_obj, &ready_only,
                                     &nowait, &gpu))
        return NULL;
    flags = (ready_only ? KVC_LOOKUP_READY_ONLY : 0) | (nowait ? KVC_LOOKUP_NOWAIT : 0) |
            (gpu ? KVC_LOOKUP_GPU : 0);
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
    Py_BEGIN_ALLOW_THREADS;
    rc = gpu ? client_gpu_attach_nogil(ns->client, &state) : 0;
    if (rc >= 0)
        rc = kvc_lookup(ns->ns, keys, n, flags, &l);
    Py_END_ALLOW_THREADS;
    client_gpu_state_set(ns->client, state);
    PyMem_Free(keys);
    handle_init(h, ns->client, HANDLE_KIND_LEASE, rc > 0 ? l : NULL, rc > 0 ? (size_t)rc : 0, ns);
    h->gpu = gpu;
    h->first = rc > 0 ? kvc_lease_first(l) : 0;
    client_leave(ns->client);
    if (rc < 0) {
        Py_DECREF(h);
        return kvcd_raise(rc);
    }
    return (PyObject *)h;
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
    Py_BEGIN_ALLOW_THREADS;
    rc = kvc_hint(ns->ns, kind, keys, scores, n);
    Py_END_ALLOW_THREADS;
    client_leave(ns->client);
    PyMem_Free(keys);
    PyMem_Free(scores);
    return rc < 0 ? kvcd_raise(rc) : PyLong_FromLong(rc);
fail:
    PyMem_Free(keys);
    PyMem_Free(scores);
    return NULL;
}

static PyObject *ns_hint_heads(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "scores", "layers", "heads", "kind", NULL};
    ns_object *ns = (ns_object *)self;
    PyObject *keys_obj, *scores_obj;
    const char *kind_s = "attention";
    struct kvc_key *keys = NULL;
    float *scores = NULL;
    size_t n, nscores;
    unsigned kind, layers, heads;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOII|s:hint_heads", kwlist, &keys_obj, &scores_obj,
                                     &layers, &heads, &kind_s))
        return NULL;
    if (strcmp(kind_s, "attention") == 0 || strcmp(kind_s, "h2o") == 0) {
        kind = KVC_HINT_ATTENTION;
    } else if (strcmp(kind_s, "snapkv") == 0) {
        kind = KVC_HINT_SNAPKV;
    } else {
        PyErr_Format(PyExc_ValueError, "kvcd: unknown hint kind '%s' (attention, snapkv)", kind_s);
        return NULL;
    }
    if (layers == 0 || heads == 0 || (uint64_t)layers * heads > KVC_HINT_HEADS_MAX) {
        PyErr_Format(PyExc_ValueError, "kvcd: layers * heads must be 1..%u", KVC_HINT_HEADS_MAX);
        return NULL;
    }
    if (ns_check(ns) < 0 || keys_parse(keys_obj, &keys, &n) < 0)
        return NULL;
    if (floats_parse(scores_obj, "kvcd: scores must be a flat sequence of numbers", &scores,
                     &nscores) < 0)
        goto fail;
    if (nscores != n * (size_t)layers * heads) {
        PyErr_SetString(PyExc_ValueError, "kvcd: layers * heads scores per key");
        goto fail;
    }
    if (ns_enter(ns) < 0)
        goto fail;
    Py_BEGIN_ALLOW_THREADS;
    rc = kvc_hint_heads(ns->ns, kind, keys, scores, n, layers, heads);
    Py_END_ALLOW_THREADS;
    client_leave(ns->client);
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
    static char *kwlist[] = {"keys",   "budget", "policy",   "sinks",
                             "recent", "query",  "per_head", NULL};
    ns_object *ns = (ns_object *)self;
    PyObject *keys_obj, *query_obj = Py_None, *pos_list = NULL, *heads_list = NULL;
    unsigned char *heads = NULL;
    size_t lh = 0;
    int per_head = 0;
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
    if (!PyArg_ParseTupleAndKeywords(args, kw, "On|zIIOp:lookup_budget", kwlist, &keys_obj, &budget,
                                     &policy, &sinks, &recent, &query_obj, &per_head))
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
    /* per head: the selection may hold every key, and the profile comes back. Without, at
     * most the budget and never more than the keys: a budget of 2^61 sized pos at 0 bytes
     * (the product wraps), and libkvc wrote a position per selected block past it. */
    lh = per_head ? (size_t)ns->lay.layers * ns->lay.kv_heads : 0;
    pos = PyMem_Malloc((per_head || b.budget > n ? (n ? n : 1) : b.budget) * sizeof(*pos));
    heads = per_head ? PyMem_Malloc(lh ? lh : 1) : NULL;
    if (!pos || (per_head && !heads)) {
        PyErr_NoMemory();
        goto fail;
    }
    if (heads)
        memset(heads, KVC_HEAD_UNKNOWN, lh ? lh : 1); /* what a call with no keys leaves */
    h = PyObject_New(struct handle, &lease_type);
    if (!h)
        goto fail;
    h->client = NULL;
    h->h = NULL;
    h->prev = h->next = NULL;
    if (ns_enter(ns) < 0)
        goto fail;
    Py_BEGIN_ALLOW_THREADS;
    rc = per_head ? kvc_lookup_budget_heads(ns->ns, keys, n, &b, pos, heads, &nprefix, &l)
                  : kvc_lookup_budget(ns->ns, keys, n, &b, pos, &nprefix, &l);
    Py_END_ALLOW_THREADS;
    handle_init(h, ns->client, HANDLE_KIND_LEASE, rc > 0 ? l : NULL, rc > 0 ? (size_t)rc : 0, ns);
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
    if (per_head) {
        heads_list = PyList_New((Py_ssize_t)lh);
        if (!heads_list)
            goto fail;
        for (size_t j = 0; j < lh; j++) {
            PyObject *v = PyLong_FromLong(heads[j]);
            if (!v)
                goto fail;
            PyList_SET_ITEM(heads_list, (Py_ssize_t)j, v);
        }
    }
    PyMem_Free(keys);
    PyMem_Free(query);
    PyMem_Free(pos);
    PyMem_Free(heads);
    if (per_head)
        return Py_BuildValue("(NnNN)", pos_list, (Py_ssize_t)nprefix, (PyObject *)h, heads_list);
    return Py_BuildValue("(NnN)", pos_list, (Py_ssize_t)nprefix, (PyObject *)h);
fail:
    Py_XDECREF(pos_list);
    Py_XDECREF(heads_list);
    Py_XDECREF(h);
    PyMem_Free(keys);
    PyMem_Free(query);
    PyMem_Free(pos);
    PyMem_Free(heads);
    return NULL;
}

static PyObject *ns_reserve(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"keys", "parent", "gpu", NULL};
    ns_object *ns = (ns_object *)self;
    PyObject *keys_obj, *parent_obj = Py_None;
    struct kvc_key *keys = NULL, parent;
    resv_object *r;
    kvc_resv *resv = NULL;
    size_t n;
    int have_parent, rc, gpu = 0, state = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|Op:reserve", kwlist, &keys_obj, &parent_obj,
                                     &gpu))
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
    Py_BEGIN_ALLOW_THREADS;
    rc = gpu ? client_gpu_attach_nogil(ns->client, &state) : 0;
    if (rc >= 0)
        rc = gpu ? kvc_reserve_gpu(ns->ns, have_parent ? &parent : NULL, keys, n, &resv)
                 : kvc_reserve(ns->ns, have_parent ? &parent : NULL, keys, n, &resv);
    Py_END_ALLOW_THREADS;
    client_gpu_state_set(ns->client, state);
    PyMem_Free(keys);
    if (rc < 0)
        resv = NULL; /* not set on failure */
    handle_init(&r->head, ns->client, HANDLE_KIND_RESV, resv, n, ns);
    r->head.gpu = gpu;
    r->reserved = rc > 0 ? rc : 0;
    client_leave(ns->client);
    if (rc < 0) {
        Py_DECREF(r);
        return kvcd_raise(rc);
    }
    return (PyObject *)r;
}

/* put_prefix and get_prefix: keys and one block buffer or tensor per key. Host memory
 * takes libkvc's whole-prefix calls (the fast path for gets); device tensors the device
 * path of _kvcd_dev.c. */
static PyObject *ns_prefix(ns_object *ns, PyObject *args, PyObject *kw, int put)
{
    static char *put_kwlist[] = {"keys", "buffers", "parent", "stream", NULL};
    static char *get_kwlist[] = {"keys", "buffers", "stream", NULL};
    PyObject *keys_obj, *bufs_obj, *parent_obj = Py_None, *stream_obj = Py_None, *res;
    struct kvc_key *keys = NULL, parent;
    struct mem *m = NULL;
    void **ptrs = NULL;
    size_t n = 0, block_bytes;
    int have_parent = 0, device = 0, rc;
    if (put ? !PyArg_ParseTupleAndKeywords(args, kw, "OO|OO:put_prefix", put_kwlist, &keys_obj,
                                           &bufs_obj, &parent_obj, &stream_obj)
            : !PyArg_ParseTupleAndKeywords(args, kw, "OO|O:get_prefix", get_kwlist, &keys_obj,
                                           &bufs_obj, &stream_obj))
        return NULL;
    if (key_parse_opt(parent_obj, &parent, &have_parent) < 0 || keys_parse(keys_obj, &keys, &n) < 0)
        return NULL;
    if (ns_check(ns) < 0) { /* the keys' __iter__ may have closed it */
        PyMem_Free(keys);
        return NULL;
    }
    block_bytes = kvc_ns_block_bytes(ns->ns);
    if (mems_get(bufs_obj, n, block_bytes, !put, &m, &device) < 0) {
        PyMem_Free(keys);
        return NULL;
    }
    if (device) {
        res = ns_prefix_dev(ns, keys, n, have_parent ? &parent : NULL, m, stream_obj, put);
        mems_release(m, n);
        PyMem_Free(keys);
        return res;
    }
    ptrs = PyMem_Calloc(n ? n : 1, sizeof(*ptrs));
    if (!ptrs || ns_enter(ns) < 0) {
        if (!ptrs)
            PyErr_NoMemory();
        PyMem_Free(ptrs);
        mems_release(m, n);
        PyMem_Free(keys);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        ptrs[i] = m[i].ptr;
    Py_BEGIN_ALLOW_THREADS;
    if (put)
        rc = kvc_put_prefix(ns->ns, have_parent ? &parent : NULL, keys, n,
                            (const void *const *)ptrs);
    else
        rc = kvc_get_prefix(ns->ns, keys, n, ptrs);
    Py_END_ALLOW_THREADS;
    client_leave(ns->client);
    PyMem_Free(ptrs);
    mems_release(m, n);
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
    {"hint_heads", (PyCFunction)(void (*)(void))ns_hint_heads, METH_VARARGS | METH_KEYWORDS,
     "hint_heads(keys, scores, layers, heads, kind='attention'): per-(layer, head) importance, "
     "scores flat [len(keys)][layers][heads]; feeds the policies and the namespace's head "
     "profiles; returns the cached blocks that took one."},
    {"lookup_budget", (PyCFunction)(void (*)(void))ns_lookup_budget, METH_VARARGS | METH_KEYWORDS,
     "lookup_budget(keys, budget, policy=None, sinks=0, recent=0, query=None, per_head=False): "
     "at most budget blocks of the cached prefix chosen by a policy; returns (positions, "
     "prefix_len, Lease). per_head: budget is per (layer, kv head) over the namespace's head "
     "profile (kvc_lookup_budget_heads); returns (positions, prefix_len, Lease, profile)."},
    {"paged_kv", (PyCFunction)(void (*)(void))ns_paged_kv, METH_VARARGS | METH_KEYWORDS,
     "paged_kv(k_caches, v_caches=None, kv_dim=0): an engine's paged KV cache (as scatter "
     "and gather take it) read and checked against this namespace once; pass it as k_caches "
     "(v_caches None) to Lease.scatter and Reservation.gather."},
    {"reserve", (PyCFunction)(void (*)(void))ns_reserve, METH_VARARGS | METH_KEYWORDS,
     "reserve(keys, parent=None): slots for the keys not cached; returns a Reservation."},
    {"put_prefix", (PyCFunction)(void (*)(void))ns_put_prefix, METH_VARARGS | METH_KEYWORDS,
     "put_prefix(keys, buffers, parent=None): stores the blocks not cached; returns the count."},
    {"get_prefix", (PyCFunction)(void (*)(void))ns_get_prefix, METH_VARARGS | METH_KEYWORDS,
     "get_prefix(keys, buffers): loads the longest cached prefix; returns the count."},
    {NULL, NULL, 0, NULL},
};

static PyObject *ns_get_kind(PyObject *self, void *closure)
{
    ns_object *ns = (ns_object *)self;
    (void)closure;
    if (ns_check(ns) < 0)
        return NULL;
    return PyUnicode_FromString(kind_name(kvc_ns_kind(ns->ns)));
}

static PyObject *ns_get_window_tokens(PyObject *self, void *closure)
{
    ns_object *ns = (ns_object *)self;
    (void)closure;
    if (ns_check(ns) < 0)
        return NULL;
    return PyLong_FromUnsignedLong(kvc_ns_window_tokens(ns->ns));
}

static PyGetSetDef ns_getset[] = {
    {"kind", ns_get_kind, NULL, "kv, k_only, kv_window or state.", NULL},
    {"window_tokens", ns_get_window_tokens, NULL, "The window of a kv_window namespace.", NULL},
    {"block_bytes", ns_get_block_bytes, NULL, "Bytes of one block.", NULL},
    {"block_tokens", ns_get_block_tokens, NULL, "Tokens per block.", NULL},
    {"id", ns_get_id, NULL, "The daemon's id of the namespace.", NULL},
    {"model_id", ns_get_model_id, NULL, "The model id it was opened with.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject ns_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcd.Namespace",
    .tp_basicsize = sizeof(ns_object),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = ns_dealloc,
    .tp_methods = ns_methods,
    .tp_getset = ns_getset,
    .tp_doc = "An open namespace: one model's KV layout (Client.namespace()).",
};
