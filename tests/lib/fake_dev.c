/*
 * fake_dev.c — see fake_dev.h.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/kern.h"
#include "kernels/kern_batch.h"
#include "kernels/kern_pack.h"
#include "tests/lib/fake_dev.h"

#define FAKE_STREAM_MAGIC 0x5354524du /* "STRM" */
#define FAKE_EVENT_MAGIC 0x4556544eu  /* "EVTN" */
#define FAKE_MAX_RANGES 256

struct fake_stream {
    uint32_t magic;
    int dev;
};

struct fake_event {
    uint32_t magic;
    int dev; /* event_new's device (recorded only on its streams); -1: not checked */
    void *stream;
    uint64_t seq; /* copies of stream up to this one */
};

/* One queued copy (batch == NULL) or batch kernel, performed at the wait that covers it. A
 * kernel keeps its tables (copied at the call, as a launch copies its parameters) and reads
 * the memory they point to when it runs, as the device would. */
struct fake_op {
    void *stream;
    void *dst;
    const void *src;
    uint64_t len;
    uint64_t seq;
    void *staged;                  /* owned: a pageable source, copied when the copy was queued */
    struct kern_batch_args *batch; /* owned: a kernel's arguments */
    void *after;                   /* a stream wait: this stream's work up to after_seq first */
    uint64_t after_seq;
    int barrier; /* a stream wait (fake_dev_stream_wait_event) */
    struct fake_op *next;
};

/* Device memory the fake handed out. */
struct fake_range {
    char *base;
    uint64_t size;
    int dev;
};

struct fake_dev_state fake_dev;
static struct fake_range fake_ranges[FAKE_MAX_RANGES];
static int fake_nranges;
static struct fake_range fake_pinned[FAKE_MAX_RANGES]; /* host_register'ed host memory */
static int fake_npinned;
/* The pinned table and its counters: host_register may come from another thread than the
 * test's (kvcd's registration thread, daemon/gpu_reg.h) while the test's copies ask it. */
static pthread_mutex_t fake_pin_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fake_op *fake_ops_head, **fake_ops_tail = &fake_ops_head;
static uint64_t fake_seq;
static _Thread_local int fake_cur;

static int fake_pending(void *stream, uint64_t upto);

void fake_dev_reset(int devices)
{
    while (fake_ops_head) {
        struct fake_op *o = fake_ops_head;
        fake_ops_head = o->next;
        free(o->staged);
        free(o->batch);
        free(o);
    }
    fake_ops_tail = &fake_ops_head;
    fake_nranges = 0;
    fake_npinned = 0;
    fake_seq = 0;
    fake_cur = 0;
    memset(&fake_dev, 0, sizeof(fake_dev));
    fake_dev.devices = devices;
}

void fake_dev_current_set(int dev)
{
    fake_cur = dev;
}

int fake_dev_current(void)
{
    return fake_cur;
}

int fake_dev_last_error(void)
{
    int e = fake_dev.last_error;
    fake_dev.last_error = 0;
    return e;
}

/* The driver's state belongs to the process that first used it. */
static int fake_enter(void)
{
    if (fake_dev.init_pid == 0)
        fake_dev.init_pid = getpid();
    if (fake_dev.init_pid != getpid()) {
        fake_dev.fork_refused++;
        fake_dev.last_error = -EIO;
        return -EIO;
    }
    return fake_dev.sticky ? -EIO : 0;
}

static int fake_range_add(void *base, uint64_t size, int dev)
{
    if (fake_nranges == FAKE_MAX_RANGES)
        return -ENOMEM;
    fake_ranges[fake_nranges++] = (struct fake_range){(char *)base, size, dev};
    return 0;
}

static void fake_range_del(const void *base)
{
    for (int i = 0; i < fake_nranges; i++)
        if (fake_ranges[i].base == base) {
            fake_ranges[i] = fake_ranges[--fake_nranges];
            return;
        }
}

/* Device of [p, p+len) when it lies in device memory, else -1 (host memory). */
static int fake_range_dev(const void *p, uint64_t len)
{
    const char *c = p;
    for (int i = 0; i < fake_nranges; i++) {
        const struct fake_range *r = &fake_ranges[i];
        if (c >= r->base && c < r->base + r->size) {
            if (len > r->size - (uint64_t)(c - r->base))
                return -2; /* runs off the end of an allocation */
            return r->dev;
        }
    }
    return -1;
}

/* 1 when every tensor base and block a queued kernel dereferences is device memory now. */
static int fake_batch_ok(const struct kern_batch_args *a)
{
    for (uint32_t i = 0; i < kern_batch_nptrs(a); i++) {
        uint64_t len;
        const void *p = kern_batch_ptr_at(a, i, &len);
        if (!p && i >= a->h.layers * a->h.kinds)
            continue; /* a block the batch does not move */
        if (fake_range_dev(p, len ? len : 1) < 0)
            return 0;
    }
    return 1;
}

/* 1 when [p, p+len) lies in host memory registered with host_register. */
static int fake_pinned_has(const void *p, uint64_t len)
{
    const char *c = p;
    int has = 0;
    pthread_mutex_lock(&fake_pin_mu);
    for (int i = 0; i < fake_npinned && !has; i++)
        has = c >= fake_pinned[i].base && len <= fake_pinned[i].size &&
              (uint64_t)(c - fake_pinned[i].base) <= fake_pinned[i].size - len;
    pthread_mutex_unlock(&fake_pin_mu);
    return has;
}

static int fake_device_count(void)
{
    return fake_enter() ? 0 : fake_dev.devices;
}

static int fake_device_uuid(int dev, uint8_t uuid[KERN_DEV_UUID_BYTES])
{
    int rc = fake_enter();
    if (rc)
        return rc;
    if (dev < 0 || dev >= fake_dev.devices)
        return -ENODEV;
    memset(uuid, 0xf0 + dev, KERN_DEV_UUID_BYTES);
    return 0;
}

static int fake_pool_map(struct kern_dev_pool *p)
{
    void *m = mmap(NULL, p->size, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, 0);
    if (m == MAP_FAILED)
        return -errno;
    if (fake_range_add(m, p->size, p->device)) {
        munmap(m, p->size);
        return -ENOMEM;
    }
    p->base = m;
    fake_dev.pools_live++;
    return 0;
}

static int fake_pool_create(int dev, uint64_t size, struct kern_dev_pool *p)
{
    int rc;
    memset(p, 0, sizeof(*p));
    p->fd = -1;
    if (fake_dev.fail_create)
        return -fake_dev.fail_create;
    rc = fake_enter();
    if (rc)
        return rc;
    if (dev < 0 || dev >= fake_dev.devices)
        return -ENODEV;
    p->fd = memfd_create("fake-dev-pool", MFD_CLOEXEC); /* the exported handle */
    if (p->fd < 0)
        return -errno;
    if (ftruncate(p->fd, (off_t)size)) {
        rc = -errno;
        goto fail;
    }
    p->device = dev;
    p->size = size;
    p->handle = KERN_DEV_HANDLE_FD;
    fake_device_uuid(dev, p->uuid);
    rc = fake_pool_map(p);
    if (rc == 0)
        return 0;
fail:
    close(p->fd);
    p->fd = -1;
    return rc;
}

static int fake_pool_import(struct kern_dev_pool *p)
{
    uint8_t u[KERN_DEV_UUID_BYTES];
    int rc = fake_enter(), dev = -1;
    if (rc)
        return rc;
    if (p->handle != KERN_DEV_HANDLE_FD || p->fd < 0 || p->size == 0)
        return -ENOTSUP;
    for (int i = 0; i < fake_dev.devices && dev < 0; i++)
        if (fake_device_uuid(i, u) == 0 && memcmp(u, p->uuid, sizeof(u)) == 0)
            dev = i;
    if (dev < 0)
        return -ENODEV;
    p->device = dev;
    return fake_pool_map(p);
}

static void fake_pool_destroy(struct kern_dev_pool *p)
{
    if (p->base) {
        fake_range_del(p->base);
        munmap(p->base, p->size);
        fake_dev.pools_live--;
    }
    if (p->fd >= 0)
        close(p->fd);
    p->base = NULL;
    p->fd = -1;
}

static int fake_stream_ok(void *stream)
{
    return !stream || ((struct fake_stream *)stream)->magic == FAKE_STREAM_MAGIC;
}

/* Checks one copy like cudaMemcpyAsync and queues it (not yet counted as an operation). */
static int fake_copy_queue(void *dst, const void *src, uint64_t len, int kind, void *stream)
{
    if (!fake_stream_ok(stream) || !dst || !src)
        return -EINVAL;
    int ddev = fake_range_dev(dst, len), sdev = fake_range_dev(src, len);
    int ok = ddev != -2 && sdev != -2;
    switch (kind) {
    case KERN_DEV_COPY_H2D:
        ok = ok && sdev < 0 && ddev >= 0;
        break;
    case KERN_DEV_COPY_D2H:
        ok = ok && sdev >= 0 && ddev < 0;
        break;
    case KERN_DEV_COPY_D2D:
        ok = ok && sdev >= 0 && ddev >= 0;
        break;
    case KERN_DEV_COPY_DEFAULT:
        break;
    default:
        ok = 0;
    }
    if (!ok) {
        fake_dev.bad_kinds++;
        fake_dev.last_error = -EINVAL;
        return -EINVAL;
    }
    struct fake_op *o = calloc(1, sizeof(*o));
    if (!o)
        return -ENOMEM;
    if (sdev == -1 && !fake_pinned_has(src, len)) {
        /* From pageable memory the driver stages the bytes before it returns: the source
         * may go at once. Pinned (registered) sources are read when the copy runs. */
        o->staged = malloc(len ? len : 1);
        if (!o->staged) {
            free(o);
            return -ENOMEM;
        }
        memcpy(o->staged, src, len);
        src = o->staged;
    }
    o->stream = stream;
    o->dst = dst;
    o->src = src;
    o->len = len;
    o->seq = ++fake_seq;
    *fake_ops_tail = o;
    fake_ops_tail = &o->next;
    fake_dev.copies++;
    fake_dev.queued++;
    return 0;
}

static int fake_copy_async(void *dst, const void *src, uint64_t len, int kind, void *stream)
{
    int rc = fake_enter();
    if (rc)
        return rc;
    rc = fake_copy_queue(dst, src, len, kind, stream);
    if (rc == 0)
        fake_dev.ops++;
    return rc;
}

/* n copies as one operation: each checked and queued as cudaMemcpyAsync would be (a piece
 * refused leaves the pieces before it queued, as a real batch may have started them). */
static int fake_copy_batch(void *const *dst, const void *const *src, const uint64_t *len,
                           uint32_t n, int kind, void *stream)
{
    int rc = fake_enter();
    if (rc)
        return rc;
    if (n > (kind == KERN_DEV_COPY_D2D ? KERN_COPY_BATCH_MAX : KERN_DMA_BATCH_MAX) ||
        (n && (!dst || !src || !len)))
        return -EINVAL;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        rc = fake_copy_queue(dst[i], src[i], len[i], kind, stream);
        /* a range that does not continue the one before: a cudaMemcpyAsync of its own where
         * the runtime has no batched DMA */
        fake_dev.dma_ranges += kind != KERN_DEV_COPY_D2D &&
                               (i == 0 || (const char *)dst[i - 1] + len[i - 1] != dst[i] ||
                                (const char *)src[i - 1] + len[i - 1] != src[i]);
    }
    fake_dev.ops++;
    fake_dev.copy_batches++;
    return rc;
}

/* Performs (or, with fail_wait set, loses) stream's work up to seq; every stream's with
 * all set. A kernel that meets host memory faults: the wait answers -EIO and what follows
 * on the stream is lost. A stream wait met on the way performs the other stream's work it
 * names first (the list is walked again from its head after that: the drain took ops out). */
static int fake_drain(void *stream, uint64_t upto, int all)
{
    int rc = fake_dev.fail_wait ? -fake_dev.fail_wait : 0;
    fake_dev.fail_wait = 0;
    for (struct fake_op **pp = &fake_ops_head; *pp;) {
        struct fake_op *o = *pp;
        if (!all && (o->stream != stream || o->seq > upto)) {
            pp = &o->next;
            continue;
        }
        *pp = o->next;
        fake_dev.queued -= !o->barrier;
        if (o->barrier) {
            void *after = o->after;
            uint64_t after_seq = o->after_seq;
            free(o);
            fake_ops_tail = &fake_ops_head;
            while (*fake_ops_tail)
                fake_ops_tail = &(*fake_ops_tail)->next;
            if (!all) {
                int wrc = fake_drain(after, after_seq, 0);
                rc = rc ? rc : wrc;
            }
            pp = &fake_ops_head;
            continue;
        }
        if (rc == 0 && o->batch && !fake_batch_ok(o->batch)) {
            fake_dev.bad_packs++; /* a kernel reads and writes device memory only */
            rc = -EIO;
        } else if (rc == 0 && o->batch) {
            kern_batch_run_cpu(o->batch);
        } else if (rc == 0) {
            memmove(o->dst, o->src, o->len);
            fake_dev.bytes += o->len;
        }
        free(o->staged);
        free(o->batch);
        free(o);
    }
    fake_ops_tail = &fake_ops_head;
    while (*fake_ops_tail)
        fake_ops_tail = &(*fake_ops_tail)->next;
    return rc;
}

static int fake_stream_new(int dev, void **stream)
{
    int rc = fake_enter();
    if (rc)
        return rc;
    if (dev < 0 || dev >= fake_dev.devices)
        return -ENODEV;
    struct fake_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->magic = FAKE_STREAM_MAGIC;
    s->dev = dev;
    fake_dev.streams_live++;
    *stream = s;
    return 0;
}

static void fake_stream_free(void *stream)
{
    struct fake_stream *s = stream;
    if (!s || fake_enter())
        return;
    fake_drain(s, UINT64_MAX, 0); /* cudaStreamDestroy lets queued work finish */
    s->magic = 0;
    fake_dev.streams_live--;
    free(s);
}

void *fake_dev_stream(int dev)
{
    void *s = NULL;
    return fake_stream_new(dev, &s) ? NULL : s;
}

void fake_dev_stream_free(void *stream)
{
    fake_stream_free(stream);
}

int fake_dev_stream_wait_event(void *stream, void *ev)
{
    struct fake_event *e = ev;
    int rc = fake_enter();
    if (rc)
        return rc;
    if (!stream || !fake_stream_ok(stream) || !e || e->magic != FAKE_EVENT_MAGIC)
        return -EINVAL;
    if (e->stream == stream || !fake_pending(e->stream, e->seq))
        return 0; /* in order already, or nothing left to wait for */
    struct fake_op *o = calloc(1, sizeof(*o));
    if (!o)
        return -ENOMEM;
    o->stream = stream;
    o->seq = ++fake_seq;
    o->barrier = 1;
    o->after = e->stream;
    o->after_seq = e->seq;
    *fake_ops_tail = o;
    fake_ops_tail = &o->next;
    fake_dev.stream_waits++;
    return 0;
}

static int fake_device_get(int *dev)
{
    int rc = fake_enter();
    if (rc == 0)
        *dev = fake_cur;
    return rc;
}

static int fake_event_record(void *event, void *stream)
{
    struct fake_event *e = event;
    int rc = fake_enter();
    if (rc)
        return rc;
    if (!e || !fake_stream_ok(stream))
        return -EINVAL;
    if (e->magic == FAKE_EVENT_MAGIC && e->dev >= 0 &&
        (!stream || ((struct fake_stream *)stream)->dev != e->dev)) {
        fake_dev.last_error = -EINVAL; /* an event and a stream of different devices */
        return -EINVAL;
    }
    if (e->magic == FAKE_EVENT_MAGIC) { /* one of ours, recorded again: the new point */
        e->stream = stream;
        e->seq = fake_seq;
    }
    fake_dev.records++;
    return 0;
}

static int fake_event_new_record(void **ev, void *stream)
{
    int rc = fake_enter();
    if (rc)
        return rc;
    if (!fake_stream_ok(stream))
        return -EINVAL;
    struct fake_event *e = calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    *e = (struct fake_event){FAKE_EVENT_MAGIC, -1, stream, fake_seq};
    *ev = e;
    fake_dev.events_live++;
    fake_dev.events_created++;
    fake_dev.records++;
    return 0;
}

static int fake_event_wait(void *ev)
{
    struct fake_event *e = ev;
    int rc = fake_enter();
    if (rc)
        return rc;
    if (!e || e->magic != FAKE_EVENT_MAGIC)
        return -EINVAL;
    fake_dev.waits++;
    fake_dev.blocking_waits += fake_pending(e->stream, e->seq);
    return fake_drain(e->stream, e->seq, 0);
}

static int fake_event_wait_free(void *ev)
{
    struct fake_event *e = ev;
    int rc = fake_enter();
    if (rc)
        return rc;
    if (!e || e->magic != FAKE_EVENT_MAGIC)
        return -EINVAL;
    fake_dev.waits++;
    fake_dev.blocking_waits += fake_pending(e->stream, e->seq);
    rc = fake_drain(e->stream, e->seq, 0);
    e->magic = 0;
    free(e);
    fake_dev.events_live--;
    return rc;
}

static int fake_event_new(int dev, void **ev)
{
    int rc = fake_enter();
    if (rc)
        return rc;
    if (dev < 0 || dev >= fake_dev.devices)
        return -ENODEV;
    struct fake_event *e = calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    *e = (struct fake_event){FAKE_EVENT_MAGIC, dev, NULL, 0};
    *ev = e;
    fake_dev.events_live++;
    fake_dev.events_created++;
    return 0;
}

/* 1 when work of stream up to seq is still queued. */
static int fake_pending(void *stream, uint64_t upto)
{
    for (const struct fake_op *o = fake_ops_head; o; o = o->next)
        if (o->stream == stream && o->seq <= upto)
            return 1;
    return 0;
}

static int fake_event_query(void *ev)
{
    struct fake_event *e = ev;
    int rc = fake_enter();
    if (rc)
        return rc;
    if (!e || e->magic != FAKE_EVENT_MAGIC)
        return -EINVAL;
    fake_dev.queries++;
    if (!fake_pending(e->stream, e->seq))
        return 0;
    if (fake_dev.hold)
        return -EAGAIN;
    return fake_drain(e->stream, e->seq, 0);
}

static void fake_event_free(void *ev)
{
    struct fake_event *e = ev;
    if (!e || fake_enter() || e->magic != FAKE_EVENT_MAGIC)
        return;
    e->magic = 0;
    free(e);
    fake_dev.events_live--;
}

static int fake_stream_sync(void *stream)
{
    int rc = fake_enter();
    if (rc)
        return rc;
    if (!fake_stream_ok(stream))
        return -EINVAL;
    if (!stream)
        fake_dev.legacy_syncs++;
    fake_dev.waits++;
    fake_dev.blocking_waits += fake_pending(stream, UINT64_MAX);
    return fake_drain(stream, UINT64_MAX, 0);
}

/* Pages of [p, p + len) not resident now (mincore). */
static uint64_t fake_unresident(const void *p, uint64_t len)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), n = 0;
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(page - 1), e = (uintptr_t)p + len;
    unsigned char vec[1024];
    while (a < e) {
        uint64_t pages = (e - a + page - 1) / page;
        if (pages > sizeof(vec))
            pages = sizeof(vec);
        if (mincore((void *)a, pages * page, vec) != 0)
            return 0; /* not a mapping mincore answers for: nothing to tell */
        for (uint64_t i = 0; i < pages; i++)
            n += !(vec[i] & 1);
        a += pages * page;
    }
    return n;
}

static int fake_host_register(void *p, uint64_t len, int readonly)
{
    int rc = fake_enter();
    if (rc)
        return rc;
    if (!p || !len || fake_range_dev(p, len) != -1)
        return -EINVAL;
    if (readonly && fake_dev.readonly_unsup)
        return -ENOTSUP;
    if (fake_dev.fail_register)
        return -fake_dev.fail_register;
    uint64_t unresident = fake_unresident(p, len);
    pthread_mutex_lock(&fake_pin_mu);
    rc = fake_npinned == FAKE_MAX_RANGES ? -ENOMEM : 0;
    if (rc == 0) {
        fake_pinned[fake_npinned++] = (struct fake_range){p, len, -1};
        fake_dev.registered++;
        fake_dev.register_unresident += unresident;
    }
    pthread_mutex_unlock(&fake_pin_mu);
    return rc;
}

static int fake_host_unregister(void *p)
{
    int rc = fake_enter();
    if (rc)
        return rc;
    rc = -EINVAL;
    pthread_mutex_lock(&fake_pin_mu);
    for (int i = 0; i < fake_npinned && rc; i++)
        if (fake_pinned[i].base == p) {
            fake_pinned[i] = fake_pinned[--fake_npinned];
            fake_dev.registered--;
            rc = 0;
        }
    pthread_mutex_unlock(&fake_pin_mu);
    return rc;
}

static int fake_pointer_device(const void *p)
{
    if (fake_enter())
        return -EINVAL;
    int dev = fake_range_dev(p, 1);
    return dev >= 0 ? dev : -EINVAL;
}

static int fake_mem_alloc(void **p, uint64_t len)
{
    int rc = fake_enter();
    if (rc)
        return rc;
    *p = malloc(len ? len : 1);
    if (!*p)
        return -ENOMEM;
    if (fake_range_add(*p, len ? len : 1, fake_cur)) {
        free(*p);
        *p = NULL;
        return -ENOMEM;
    }
    fake_dev.allocs++;
    fake_dev.alloc_bytes += len ? len : 1;
    fake_dev.alloc_max = len > fake_dev.alloc_max ? len : fake_dev.alloc_max;
    return 0;
}

static void fake_mem_free(void *p)
{
    if (!p || fake_enter())
        return;
    fake_dev.device_syncs++; /* cudaFree waits for the whole device */
    fake_drain(NULL, UINT64_MAX, 1);
    for (int i = 0; i < fake_nranges; i++)
        if (fake_ranges[i].base == p)
            fake_dev.alloc_bytes -= fake_ranges[i].size;
    fake_range_del(p);
    free(p);
    fake_dev.frees++;
}

/* A new kernel op on stream, queued behind the stream's earlier work; NULL without memory. */
static struct fake_op *fake_kernel_op(void *stream)
{
    struct fake_op *o = calloc(1, sizeof(*o));
    if (!o)
        return NULL;
    o->stream = stream;
    o->seq = ++fake_seq;
    *fake_ops_tail = o;
    fake_ops_tail = &o->next;
    fake_dev.queued++;
    return o;
}

static int fake_batch(const struct kern_batch_args *a, void *stream)
{
    int rc = fake_enter();
    if (rc)
        return rc;
    if (!fake_stream_ok(stream) || !a || a->h.nwords > KERN_BATCH_WORDS ||
        (a->h.op != KERN_BATCH_GATHER && a->h.op != KERN_BATCH_SCATTER &&
         a->h.op != KERN_BATCH_DECODE))
        return -EINVAL;
    struct kern_batch_args *copy = malloc(sizeof(*copy));
    if (!copy)
        return -ENOMEM;
    copy->h = a->h;
    memcpy(copy->w, a->w, (size_t)a->h.nwords * sizeof(uint64_t));
    struct fake_op *o = fake_kernel_op(stream);
    if (!o) {
        free(copy);
        return -ENOMEM;
    }
    o->batch = copy;
    fake_dev.ops++;
    if (a->h.op == KERN_BATCH_DECODE) {
        fake_dev.decodes++;
        fake_dev.decode_cols = a->h.kivik;
    } else
        fake_dev.packs++;
    fake_dev.pack_runs += a->h.op != KERN_BATCH_DECODE && a->h.run;
    return 0;
}

const struct kern_dev_ops fake_dev_ops = {
    .name = "fake",
    .device_count = fake_device_count,
    .device_uuid = fake_device_uuid,
    .pool_create = fake_pool_create,
    .pool_import = fake_pool_import,
    .pool_destroy = fake_pool_destroy,
    .copy_async = fake_copy_async,
    .stream_new = fake_stream_new,
    .stream_free = fake_stream_free,
    .device_get = fake_device_get,
    .event_record = fake_event_record,
    .event_new_record = fake_event_new_record,
    .event_wait = fake_event_wait,
    .event_wait_free = fake_event_wait_free,
    .stream_sync = fake_stream_sync,
    .host_register = fake_host_register,
    .host_unregister = fake_host_unregister,
    .pointer_device = fake_pointer_device,
    .mem_alloc = fake_mem_alloc,
    .mem_free = fake_mem_free,
    .batch = fake_batch,
    .copy_batch = fake_copy_batch,
    .event_new = fake_event_new,
    .event_query = fake_event_query,
    .event_free = fake_event_free,
};
