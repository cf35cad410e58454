/*
 * _kvcd_client.c — kvcd.Client and the lifetime rule of every object of the extension.
 *
 * DESIGN
 * Client owns one kvc_client (a connection) and the list of its live leases and
 * reservations. Lifetimes follow one rule: a libkvc handle is freed only while no call of its
 * client is in flight with the GIL released (client->inflight == 0) and no view of it is
 * exported. release(), abort() and close() mark what they finish and client_settle() frees
 * it when that holds: at once in the common case, else when the last call leaves or the last
 * view is released. So a lease released, or a client closed, while another thread copies out
 * of it, or while numpy still views its blocks, never frees memory under anyone: views stay
 * valid (the block stays pinned) until they are released, and every other use of a finished
 * object raises. A Client connects once and each connection has a serial that its
 * namespaces, leases and reservations carry, so nothing of a closed connection ever meets
 * another. All of this state is read and written under the GIL only.
 */
#include "python/kvcd/_kvcd.h"

/* Serials of the connections this process made (client_object.conn); under the GIL. */
static uint64_t client_serial;

void handle_unlink(struct handle *h)
{
    if (h->prev) {
        h->prev->next = h->next;
        h->next->prev = h->prev;
        h->prev = h->next = NULL;
    }
}

/* Frees the libkvc handle now. GIL held; no call of the client in flight. A handle with
 * device work queued on it waits for that work inside kvc_release()/kvc_abort(): that wait
 * runs with the GIL released and the client counted in flight (nothing else of it is
 * freed meanwhile), so the client's list may change across this call. */
void handle_free(struct handle *h)
{
    void *p = h->h;
    h->h = NULL;
    handle_unlink(h);
    if (!p)
        return;
    if (h->device_work) {
        client_object *c = h->client;
        enum handle_kind kind = h->kind;
        c->inflight++;
        Py_BEGIN_ALLOW_THREADS;
        if (kind == HANDLE_KIND_LEASE)
            kvc_release(p);
        else
            kvc_abort(p);
        Py_END_ALLOW_THREADS;
        c->inflight--;
    } else if (h->kind == HANDLE_KIND_LEASE) {
        kvc_release(p);
    } else {
        kvc_abort(p);
    }
}

/* Frees what was finished and is no longer viewed, and disconnects a closed client once
 * nothing of it is left. GIL held. */
void client_settle(client_object *c)
{
    struct handle *h;
    if (c->inflight > 0)
        return;
restart:
    for (h = c->handles.next; h != &c->handles; h = h->next) {
        if ((h->finished || c->closed) && h->exports == 0) {
            handle_free(h); /* may let other threads run: the list is read again */
            if (c->inflight > 0)
                return; /* another thread's call began meanwhile: its leave settles */
            goto restart;
        }
    }
    if (c->closed && c->c && c->handles.next == &c->handles) {
        kvc_disconnect(c->c);
        c->c = NULL;
    }
}

/* Before a call that releases the GIL: raises ValueError on a closed client. */
int client_enter(client_object *c)
{
    if (c->closed || !c->c) {
        PyErr_SetString(PyExc_ValueError, "kvcd: the client is closed");
        return -1;
    }
    c->inflight++;
    return 0;
}

void client_leave(client_object *c)
{
    c->inflight--;
    client_settle(c);
}

int handle_check(struct handle *h)
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

void handle_init(struct handle *h, client_object *c, enum handle_kind kind, void *p, size_t n,
                 const ns_object *ns)
{
    Py_INCREF(c);
    h->client = c;
    h->conn = c->conn;
    h->kind = kind;
    h->h = p;
    h->n = n;
    h->lay = ns->lay;
    h->block_bytes = (size_t)ns->lay.layers * (ns->lay.k_only ? 1 : 2) * ns->lay.block_tokens *
                     ns->lay.kv_heads * ns->lay.head_dim * ns->lay.elem;
    h->device_work = 0;
    h->gpu = 0;
    h->first = 0;
    h->finished = p == NULL;
    h->exports = 0;
    h->prev = h->next = NULL;
    if (p)
        handle_link(h, p);
}

/* Puts libkvc handle p on h and h on its client's list. */
void handle_link(struct handle *h, void *p)
{
    client_object *c = h->client;
    h->h = p;
    h->next = &c->handles;
    h->prev = c->handles.prev;
    c->handles.prev->next = h;
    c->handles.prev = h;
}

/* Marks a handle finished and frees it when the rule allows. */
void handle_finish(struct handle *h)
{
    h->finished = 1;
    client_settle(h->client);
}

void handle_dealloc(PyObject *self)
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
Py_ssize_t handle_index(struct handle *h, Py_ssize_t i)
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
Py_ssize_t handle_subscript(struct handle *h, PyObject *key)
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
Py_ssize_t handle_item(struct handle *h, Py_ssize_t i)
{
    if (i < 0 || (size_t)i >= h->n) {
        PyErr_SetString(PyExc_IndexError, "kvcd: index out of range");
        return -1;
    }
    return i;
}

PyObject *handle_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    Py_INCREF(self);
    return self;
}

PyObject *handle_get_released(PyObject *self, void *closure)
{
    struct handle *h = (struct handle *)self;
    (void)closure;
    return PyBool_FromLong(h->finished || h->client->closed);
}

PyObject *handle_get_block_bytes(PyObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromSize_t(((struct handle *)self)->block_bytes);
}

/* kvcd.Error for a failed connect: the path tried as the error's filename, and what to do
 * about the common causes (kvc_strerror's words cover every call, not this one). */
static void client_raise_connect(int rc, const char *path)
{
    const char *why = rc == -ENOENT || rc == -ENOTDIR
                          ? "cannot reach kvcd: no socket there (kvcd not running, or "
                            "$KVCD_SOCKET / the path given names another)"
                      : rc == -ECONNREFUSED
                          ? "cannot reach kvcd: nothing listens there (a stale socket of a "
                            "stopped kvcd, or not a socket)"
                      : rc == -EACCES ? "cannot reach kvcd: permission denied (the socket's mode "
                                        "and group, or a directory above it this user may "
                                        "not enter)"
                                      : NULL;
    PyObject *file, *args = NULL;
    if (!why) {
        kvcd_raise(rc);
        return;
    }
    file = PyUnicode_DecodeFSDefault(path);
    if (file)
        args = Py_BuildValue("(isO)", -rc, why, file);
    if (args)
        PyErr_SetObject(kvcd_error, args);
    Py_XDECREF(args);
    Py_XDECREF(file);
}

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
    Py_BEGIN_ALLOW_THREADS;
    rc = kvc_connect(path, &kc);
    Py_END_ALLOW_THREADS;
    if (rc < 0)
        client_raise_connect(rc, path ? path : kvc_default_socket());
    Py_XDECREF(path_bytes);
    if (rc < 0)
        return -1;
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
        c->gpu_state = -1;
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

int dtype_parse(const char *s, enum kvc_dtype *d)
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
int codec_parse(PyObject *o, int *codec)
{
    const char *name;
    int i;
    *codec = -1;
    if (o == Py_None)
        return 0;
    if (!(name = str_arg(o, "codec")))
        return -1;
    for (i = 0; i < codec_count; i++) {
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
    Py_BEGIN_ALLOW_THREADS;
    if (kc >= 0 || vc >= 0)
        rc = kvc_ns_open_quant(c->c, &layout, &q, &kns);
    else
        rc = kvc_ns_open(c->c, &layout, &kns);
    Py_END_ALLOW_THREADS;
    client_leave(c);
    if (rc < 0)
        return kvcd_raise(rc);
    ns = PyObject_New(ns_object, &ns_type);
    if (!ns)
        return NULL;
    Py_INCREF(c);
    ns->client = c;
    ns->conn = c->conn;
    ns->ns = kns;
    ns_layout_fill(&ns->lay, &layout);
    Py_INCREF(model_id);
    ns->model_id = model_id;
    return (PyObject *)ns;
}

/* The kind names of the binding (enum kvc_kv_kind). */
static const char *const kind_names[] = {[KVC_KV_KIND_KV] = "kv",
                                         [KVC_KV_KIND_K_ONLY] = "k_only",
                                         [KVC_KV_KIND_KV_WINDOW] = "kv_window",
                                         [KVC_KV_KIND_STATE] = "state"};

const char *kind_name(int kind)
{
    return kind > 0 && (size_t)kind < sizeof(kind_names) / sizeof(kind_names[0]) ? kind_names[kind]
                                                                                 : "?";
}

/* Client.namespace_kind(): a namespace of one kind of layer of a hybrid model. */
static PyObject *client_namespace_kind(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"model_id", "layers", "kv_heads",      "head_dim", "block_tokens",
                             "dtype",    "kind",   "window_tokens", NULL};
    client_object *c = (client_object *)self;
    PyObject *model_id;
    const char *dtype = "fp16", *kind = "kv";
    unsigned int layers, kv_heads, head_dim, block_tokens, window = 0;
    struct kvc_layout layout;
    kvc_ns *kns = NULL;
    ns_object *ns;
    int k = 0, rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "UIIII|ssI:namespace_kind", kwlist, &model_id,
                                     &layers, &kv_heads, &head_dim, &block_tokens, &dtype, &kind,
                                     &window))
        return NULL;
    for (int i = 1; i < (int)(sizeof(kind_names) / sizeof(kind_names[0])); i++)
        if (strcmp(kind, kind_names[i]) == 0)
            k = i;
    if (!k) {
        PyErr_Format(PyExc_ValueError, "kvcd: kind %s (kv, k_only, kv_window, state)", kind);
        return NULL;
    }
    if ((k == KVC_KV_KIND_KV_WINDOW) != (window != 0)) {
        PyErr_SetString(PyExc_ValueError, "kvcd: window_tokens is for (and needed by) kind "
                                          "kv_window");
        return NULL;
    }
    memset(&layout, 0, sizeof(layout));
    layout.model_id = str_arg(model_id, "model_id");
    if (!layout.model_id || dtype_parse(dtype, &layout.dtype) < 0)
        return NULL;
    layout.layers = layers;
    layout.kv_heads = kv_heads;
    layout.head_dim = head_dim;
    layout.block_tokens = block_tokens;
    layout.kv_kind = (enum kvc_kv_kind)k;
    if (client_enter(c) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS;
    rc = k == KVC_KV_KIND_KV_WINDOW ? kvc_ns_open_window(c->c, &layout, window, &kns)
                                    : kvc_ns_open(c->c, &layout, &kns);
    Py_END_ALLOW_THREADS;
    client_leave(c);
    if (rc < 0)
        return kvcd_raise(rc);
    ns = PyObject_New(ns_object, &ns_type);
    if (!ns)
        return NULL;
    Py_INCREF(c);
    ns->client = c;
    ns->conn = c->conn;
    ns->ns = kns;
    ns_layout_fill(&ns->lay, &layout);
    if (k == KVC_KV_KIND_STATE) { /* one state: no token dimension, one section */
        ns->lay.block_tokens = 1;
        ns->lay.k_only = 1;
    }
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
    Py_BEGIN_ALLOW_THREADS;
    rc = kvc_evict(c->c, ns_id, tier, &evicted);
    Py_END_ALLOW_THREADS;
    client_leave(c);
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
    Py_BEGIN_ALLOW_THREADS;
    rc = kvc_stats(c->c, scope, &st, &n);
    Py_END_ALLOW_THREADS;
    client_leave(c);
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
    Py_BEGIN_ALLOW_THREADS;
    rc = kvc_metrics(c->c, &text);
    Py_END_ALLOW_THREADS;
    client_leave(c);
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
    Py_BEGIN_ALLOW_THREADS;
    rc = kvc_ns_list(c->c, &ns, &n);
    Py_END_ALLOW_THREADS;
    client_leave(c);
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
            dt, "kv_kind", kind_name(ns[i].kv_kind), "block_bytes",
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
    Py_BEGIN_ALLOW_THREADS;
    rc = kvc_flush(c->c);
    Py_END_ALLOW_THREADS;
    client_leave(c);
    if (rc < 0)
        return kvcd_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *client_gpu_attach(PyObject *self, PyObject *unused)
{
    client_object *c = (client_object *)self;
    int rc, state = -1;
    (void)unused;
    if (client_enter(c) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS;
    rc = client_gpu_attach_nogil(c, &state);
    Py_END_ALLOW_THREADS;
    client_gpu_state_set(c, state);
    client_leave(c);
    if (rc < 0)
        return kvcd_raise(rc);
    return PyLong_FromLong(state);
}

static PyObject *client_get_closed(PyObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((client_object *)self)->closed);
}

static PyMethodDef client_methods[] = {
    {"namespace_kind", (PyCFunction)(void (*)(void))client_namespace_kind,
     METH_VARARGS | METH_KEYWORDS,
     "namespace_kind(model_id, layers, kv_heads, head_dim, block_tokens, dtype='fp16', "
     "kind='kv', window_tokens=0): opens (creating if new) the namespace of one kind of layer "
     "of a hybrid model: 'kv', 'k_only', 'kv_window' (sliding-window layers; window_tokens "
     "the window) or 'state' (a fixed-size state per layer of layers x kv_heads x head_dim "
     "elements, valid at the end of the block it is stored under)."},
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
    {"gpu_attach", client_gpu_attach, METH_NOARGS,
     "gpu_attach(): attaches to the daemon's GPU pool and registers the host arenas for DMA "
     "(done by the first call that needs it); 1: the pool is mapped here, 0: host copies. "
     "Call it from a thread whose current CUDA device is the engine's."},
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

PyTypeObject client_type = {
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
