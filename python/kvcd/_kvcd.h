/*
 * _kvcd.h — what the files of the kvcd Python extension share (python/kvcd/_kvcd*.c).
 *
 * DESIGN
 * The extension is one module, kvcd._kvcd, in one file per Python type: the module and its
 * exception (_kvcd.c), Client and the lifetime rule every object follows (_kvcd_client.c),
 * Namespace (_kvcd_ns.c), Lease and the _Slot views (_kvcd_lease.c), Reservation
 * (_kvcd_resv.c), reading arguments (_kvcd_args.c) and the tensor and device paths shared by
 * the types (_kvcd_dev.c). Everything here runs under the GIL; the round trips and copies
 * of libkvc run with the GIL released, between client_enter() and client_leave().
 *
 * Objects: Client owns one kvc_client; Namespace, Lease and Reservation hold a strong
 * reference to their Client and the serial of the connection they came from, and a view
 * exported from a lease or reservation (lease[i], resv[i]) holds its owner through a small
 * exporter object (_Slot), so a memoryview keeps the lease, the client and the arena mapping
 * alive. The lifetime rule and the order in which arguments are read (every handle checked
 * after the last Python code an argument ran) are described in _kvcd_client.c and
 * _kvcd_args.c. The extension is built with hidden visibility: only PyInit__kvcd is exported.
 */
#ifndef KVCD_PY_KVCD_H
#define KVCD_PY_KVCD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvc.h"

/* A namespace's layout, as the calls that take engine tensors check them against it. */
struct ns_layout {
    uint32_t layers, kv_heads, head_dim, block_tokens;
    enum kvc_dtype dtype;
    int k_only;    /* MLA latent: one kind, no V */
    uint32_t elem; /* bytes of one element of dtype */
};

enum handle_kind {
    HANDLE_KIND_LEASE = 1,
    HANDLE_KIND_RESV = 2,
};

typedef struct client_object client_object;

/* The common head of Lease and Reservation: a libkvc handle on its client's list. */
struct handle {
    PyObject ob_base;
    client_object *client;      /* strong reference */
    uint64_t conn;              /* the connection it came from (client->conn) */
    struct handle *prev, *next; /* the client's list of live handles (borrowed) */
    enum handle_kind kind;
    void *h;            /* kvc_lease or kvc_resv; NULL once freed */
    int finished;       /* released, committed or aborted by the caller */
    Py_ssize_t exports; /* views exported from it */
    size_t n;           /* hits of a lease, keys of a reservation */
    size_t block_bytes;
    struct ns_layout lay;
    int device_work; /* device copies were queued on it: release and abort wait for them */
    int gpu;         /* looked up or reserved for the GPU pool: its blocks may be device memory */
    size_t first;    /* a lease: position in the looked-up keys of hit 0 (kvc_lease_first) */
};

struct client_object {
    PyObject ob_base;
    kvc_client *c;         /* NULL once disconnected */
    uint64_t conn;         /* this process's serial of the connection; 0 before __init__ */
    int closed;            /* for good: a Client connects once (__init__ again is refused) */
    Py_ssize_t inflight;   /* calls running with the GIL released */
    struct handle handles; /* list head of handles with h != NULL */
    int gpu_state;         /* kvc_gpu_attach()'s answer (0 host copies, 1 pool); -1 not yet */
};

typedef struct {
    PyObject ob_base;
    client_object *client; /* strong reference */
    uint64_t conn;         /* the connection it came from (client->conn) */
    kvc_ns *ns;            /* owned by the client's kvc_client: valid while ns_check passes */
    PyObject *model_id;
    struct ns_layout lay;
} ns_object;

typedef struct {
    struct handle head;
    int reserved; /* slots reserved */
} resv_object;

typedef struct {
    PyObject ob_base;
    struct handle *owner; /* strong reference */
    size_t i;
    int codec; /* a lease's hit: enum kvc_codec as stored; a reservation's slot: raw */
} slot_object;

extern PyTypeObject client_type, ns_type, lease_type, resv_type, slot_type;

/* _kvcd.c */
extern PyObject *kvcd_error; /* kvcd.Error, a subclass of OSError */
/* Raises kvcd.Error(errno, libkvc's message) for a negative errno rc; returns NULL. */
PyObject *kvcd_raise(int rc);

/* _kvcd_client.c: the lifetime rule */
void handle_unlink(struct handle *h);
void handle_free(struct handle *h);
void client_settle(client_object *c);
int client_enter(client_object *c);
void client_leave(client_object *c);
int handle_check(struct handle *h);
void handle_init(struct handle *h, client_object *c, enum handle_kind kind, void *p, size_t n,
                 const ns_object *ns);
void handle_link(struct handle *h, void *p);
void handle_finish(struct handle *h);
void handle_dealloc(PyObject *self);
Py_ssize_t handle_index(struct handle *h, Py_ssize_t i);
Py_ssize_t handle_subscript(struct handle *h, PyObject *key);
Py_ssize_t handle_item(struct handle *h, Py_ssize_t i);
PyObject *handle_enter(PyObject *self, PyObject *unused);
PyObject *handle_get_released(PyObject *self, void *closure);
PyObject *handle_get_block_bytes(PyObject *self, void *closure);
int dtype_parse(const char *s, enum kvc_dtype *d);
int codec_parse(PyObject *o, int *codec);

/* _kvcd_args.c */
PyObject *seq_tuple(PyObject *seq, const char *what);
int keys_parse(PyObject *seq, struct kvc_key **out, size_t *n);
int key_parse_opt(PyObject *o, struct kvc_key *key, int *have);
PyObject *keys_to_list(const struct kvc_key *keys, size_t n);
int floats_parse(PyObject *seq, const char *what, float **out, size_t *n);
const char *str_arg(PyObject *o, const char *what);
extern const char *const codec_names[];
extern const int codec_count;
PyObject *codec_name(int f);

/* _kvcd_lease.c */
Py_ssize_t lease_len(PyObject *self);
PyObject *slot_view(struct handle *h, Py_ssize_t i);
struct mem;
/* One block between a handle's hit or slot and a caller's buffer: lease.copy_into and
 * resv.write, whose arguments (i, buffer, stream=None) are read and checked alike. */
struct slot_io_ops {
    const char *format; /* PyArg_ParseTupleAndKeywords's, with the method's name */
    int to_buffer;      /* the buffer is written (copy_into), so it must be writable */
    /* After i is checked, before the client is entered; -1 with an exception. NULL: none. */
    int (*ready)(struct handle *h, Py_ssize_t i);
    /* The move with the GIL released, into or from host memory or device memory (stream). */
    int (*host)(struct handle *h, size_t i, const struct mem *m);
    int (*device)(struct handle *h, size_t i, const struct mem *m, void *stream);
};
PyObject *slot_io(PyObject *self, PyObject *args, PyObject *kw, const struct slot_io_ops *ops);

/* _kvcd_ns.c */
int ns_check(ns_object *ns);
int ns_enter(ns_object *ns);

/* _kvcd_dev.c: engine memory (host buffers, torch tensors on the CPU or a GPU), streams,
 * paged KV, and the calls that move blocks between them and kvcd. */

/* One block-sized argument: a buffer (the buffer protocol) or a tensor (data_ptr()). */
struct mem {
    void *ptr;
    size_t len;
    int device;       /* -1: host memory; else a CUDA device (its memory) */
    PyObject *tensor; /* strong reference to a tensor argument */
    Py_buffer buf;    /* buf.obj set: taken from the buffer protocol */
};
int mem_get(PyObject *o, struct mem *m, size_t min_len, int writable);
void mem_release(struct mem *m);
/* n memories from a sequence; *out PyMem_Malloc'd, released by mems_release(). *device: 1
 * when one of them is device memory. */
int mems_get(PyObject *seq, size_t n, size_t min_len, int writable, struct mem **out, int *device);
void mems_release(struct mem *m, size_t n);
/* stream: None (torch's current stream of `tensor` when it is a torch CUDA tensor, else the
 * legacy default stream), an int (a cudaStream_t) or an object with .cuda_stream. */
int stream_get(PyObject *o, PyObject *tensor, void **stream);
/* Within client_enter/leave, GIL released: attaches the client's GPU use once. */
int client_gpu_attach_nogil(client_object *c, int *state);
void client_gpu_state_set(client_object *c, int state);
void ns_layout_fill(struct ns_layout *l, const struct kvc_layout *k);
extern PyTypeObject paged_type;
PyObject *ns_paged_kv(PyObject *self, PyObject *args, PyObject *kw);
const char *kind_name(int kind); /* enum kvc_kv_kind as the binding names it */
PyObject *lease_scatter(PyObject *self, PyObject *args, PyObject *kw);
PyObject *resv_gather(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ns_prefix_dev(ns_object *ns, const struct kvc_key *keys, size_t n,
                        const struct kvc_key *parent, struct mem *m, PyObject *stream, int put);

#endif
