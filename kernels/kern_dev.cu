/*
 * kern_dev.cu — the CUDA table of kern_dev.h: pools exported through the VMM API with
 * descriptor handles (legacy IPC handles as the fallback), stream-ordered copies, events,
 * pinned host registration.
 *
 * DESIGN
 * The driver API is reached through cudaGetDriverEntryPointByVersion, so nothing links
 * libcuda: a binary built here starts on a machine without a driver and device_count says
 * 0. Driver calls run in the device's primary context, made current with cudaSetDevice
 * inside a dev_scope, which gives the calling thread its own current device back when the
 * call returns: the engine's threads keep the device they chose.
 *
 * No copy here is synchronous by itself: cudaMemcpy may return before a pageable
 * host-to-device DMA has landed and does not wait for device-to-device copies, so callers
 * that need the bytes in place queue on a private stream (stream_new, created with
 * cudaStreamNonBlocking so that it never synchronises with the legacy default stream and
 * through it with the engine's streams) and wait for it.
 *
 * Errors become -EIO with one line on stderr; nothing aborts. After a failure the runtime's
 * last error is read back (cudaGetLastError), so an error this file handled does not
 * surface later in the engine's own checks or as a failed launch; a sticky error cannot be
 * cleared and fails every later call, as the runtime says.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/kern.h"
#include "kernels/kern_dev.h"
#include "kernels/kern_pack.h"

struct dev_drv {
    int ok; /* 1 loaded, -1 not available */
    CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                           unsigned long long);
    CUresult (*mem_release)(CUmemGenericAllocationHandle);
    CUresult (*address_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*address_free)(CUdeviceptr, size_t);
    CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                        unsigned long long);
    CUresult (*mem_unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*export_handle)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                              unsigned long long);
    CUresult (*import_handle)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *,
                            CUmemAllocationGranularity_flags);
    CUresult (*device_attr)(int *, CUdevice_attribute, CUdevice);
};

static struct dev_drv dev_drv;

static int dev_fail(const char *what, cudaError_t e)
{
    fprintf(stderr, "kern_dev: %s failed (%s)\n", what, cudaGetErrorString(e));
    (void)cudaGetLastError(); /* handled here: not the engine's to see */
    return -EIO;
}

/* Makes a device current for one call and gives the caller's back at the end of scope. */
struct dev_scope {
    int saved;
    bool ok;
    dev_scope() : saved(0), ok(cudaGetDevice(&saved) == cudaSuccess)
    {
        if (!ok)
            (void)cudaGetLastError();
    }
    ~dev_scope()
    {
        int now = -1;
        if (ok && (cudaGetDevice(&now) != cudaSuccess || now != saved) &&
            cudaSetDevice(saved) != cudaSuccess)
            (void)cudaGetLastError();
    }
    /* cudaSetDevice plus the primary context made current for the driver calls. */
    cudaError_t enter(int dev)
    {
        cudaError_t e = cudaSetDevice(dev);
        if (e == cudaSuccess)
            e = cudaFree(0);
        return e;
    }
};

static int dev_cufail(const char *what, CUresult r)
{
    fprintf(stderr, "kern_dev: %s failed (CUresult %d)\n", what, (int)r);
    return -EIO;
}

static int dev_sym(const char *name, void **fn)
{
    cudaDriverEntryPointQueryResult q;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q);
    return e == cudaSuccess && q == cudaDriverEntryPointSuccess && *fn ? 0 : -1;
}

static int dev_drv_load(void)
{
    if (dev_drv.ok)
        return dev_drv.ok > 0 ? 0 : -ENOTSUP;
    int bad = 0;
    bad |= dev_sym("cuMemCreate", (void **)&dev_drv.mem_create);
    bad |= dev_sym("cuMemRelease", (void **)&dev_drv.mem_release);
    bad |= dev_sym("cuMemAddressReserve", (void **)&dev_drv.address_reserve);
    bad |= dev_sym("cuMemAddressFree", (void **)&dev_drv.address_free);
    bad |= dev_sym("cuMemMap", (void **)&dev_drv.mem_map);
    bad |= dev_sym("cuMemUnmap", (void **)&dev_drv.mem_unmap);
    bad |= dev_sym("cuMemSetAccess", (void **)&dev_drv.set_access);
    bad |= dev_sym("cuMemExportToShareableHandle", (void **)&dev_drv.export_handle);
    bad |= dev_sym("cuMemImportFromShareableHandle", (void **)&dev_drv.import_handle);
    bad |= dev_sym("cuMemGetAllocationGranularity", (void **)&dev_drv.granularity);
    bad |= dev_sym("cuDeviceGetAttribute", (void **)&dev_drv.device_attr);
    dev_drv.ok = bad ? -1 : 1;
    return bad ? -ENOTSUP : 0;
}

/* The VMM state of a pool: what to unmap and release. */
struct dev_vmm {
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    size_t size;
};

static int dev_device_count(void)
{
    static int said;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        /* No device, or no driver at all, is a normal host; anything else (a driver older
         * than this build needs, no access to /dev/nvidia*) is said once, with the runtime's
         * words, instead of passing for a host without a GPU. */
        bool driver = e != cudaErrorInsufficientDriver;
        if (!driver) {
            void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
            driver = h != NULL;
            if (h)
                dlclose(h);
        }
        if (e != cudaErrorNoDevice && driver && !said++)
            fprintf(stderr, "kern_dev: CUDA devices unusable: %s (%s)\n", cudaGetErrorString(e),
                    cudaGetErrorName(e));
        return 0;
    }
    return n;
}

static int dev_device_uuid(int dev, uint8_t uuid[KERN_DEV_UUID_BYTES])
{
    cudaDeviceProp pr;
    cudaError_t e = cudaGetDeviceProperties(&pr, dev);
    if (e != cudaSuccess)
        return dev_fail("cudaGetDeviceProperties", e);
    memcpy(uuid, pr.uuid.bytes, KERN_DEV_UUID_BYTES);
    return 0;
}

static int dev_vmm_supported(int dev)
{
    int vmm = 0, fd = 0;
    if (dev_drv_load())
        return 0;
    if (dev_drv.device_attr(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) ||
        dev_drv.device_attr(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                            dev))
        return 0;
    return vmm && fd;
}

static void dev_prop(CUmemAllocationProp *prop, int dev)
{
    memset(prop, 0, sizeof(*prop));
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = dev;
}

/* Reserves address space for the allocation h, maps it and grants dev read-write. */
static int dev_vmm_map(struct dev_vmm *v, int dev)
{
    CUmemAccessDesc acc;
    CUresult r = dev_drv.address_reserve(&v->va, v->size, 0, 0, 0);
    if (r)
        return dev_cufail("cuMemAddressReserve", r);
    r = dev_drv.mem_map(v->va, v->size, 0, v->h, 0);
    if (r) {
        dev_drv.address_free(v->va, v->size);
        return dev_cufail("cuMemMap", r);
    }
    memset(&acc, 0, sizeof(acc));
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = dev_drv.set_access(v->va, v->size, &acc, 1);
    if (r) {
        dev_drv.mem_unmap(v->va, v->size);
        dev_drv.address_free(v->va, v->size);
        return dev_cufail("cuMemSetAccess", r);
    }
    return 0;
}

static int dev_pool_create_vmm(int dev, uint64_t size, struct kern_dev_pool *p)
{
    CUmemAllocationProp prop;
    size_t gran = 0;
    struct dev_vmm *v = (struct dev_vmm *)calloc(1, sizeof(*v));
    int fd = -1, rc;
    CUresult r;
    if (!v)
        return -ENOMEM;
    dev_prop(&prop, dev);
    r = dev_drv.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r || !gran) {
        rc = dev_cufail("cuMemGetAllocationGranularity", r);
        goto fail;
    }
    v->size = (size + gran - 1) / gran * gran;
    r = dev_drv.mem_create(&v->h, v->size, &prop, 0);
    if (r) {
        rc = r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : dev_cufail("cuMemCreate", r);
        goto fail;
    }
    r = dev_drv.export_handle(&fd, v->h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r) {
        dev_drv.mem_release(v->h);
        rc = dev_cufail("cuMemExportToShareableHandle", r);
        goto fail;
    }
    rc = dev_vmm_map(v, dev);
    if (rc) {
        close(fd);
        dev_drv.mem_release(v->h);
        goto fail;
    }
    p->base = (void *)(uintptr_t)v->va;
    p->size = v->size;
    p->handle = KERN_DEV_HANDLE_FD;
    p->fd = fd;
    p->priv = v;
    return 0;
fail:
    free(v);
    return rc;
}

static int dev_pool_create(int dev, uint64_t size, struct kern_dev_pool *p)
{
    cudaError_t e;
    int rc;
    memset(p, 0, sizeof(*p));
    p->fd = -1;
    p->device = dev;
    if (dev < 0 || dev >= dev_device_count())
        return -ENODEV;
    dev_scope scope;
    e = scope.enter(dev);
    if (e != cudaSuccess)
        return dev_fail("cudaSetDevice", e);
    rc = dev_device_uuid(dev, p->uuid);
    if (rc)
        return rc;
    if (dev_vmm_supported(dev)) {
        rc = dev_pool_create_vmm(dev, size, p);
        if (rc != -EIO)
            return rc;
        /* Allocation or export refused (a driver or container without shareable
         * descriptors): the legacy IPC handle below, said once in the log. */
        fprintf(stderr, "kern_dev: GPU pool: shareable allocation failed; using legacy IPC\n");
        memset(p, 0, sizeof(*p));
        p->fd = -1;
        p->device = dev;
        rc = dev_device_uuid(dev, p->uuid);
        if (rc)
            return rc;
    }
    /* Legacy IPC: a plain allocation and its 64-byte handle. */
    void *d = NULL;
    cudaIpcMemHandle_t h;
    e = cudaMalloc(&d, size);
    if (e != cudaSuccess)
        return e == cudaErrorMemoryAllocation ? -ENOMEM : dev_fail("cudaMalloc", e);
    e = cudaIpcGetMemHandle(&h, d);
    if (e != cudaSuccess) {
        cudaFree(d);
        return dev_fail("cudaIpcGetMemHandle", e);
    }
    memcpy(p->legacy, &h, sizeof(h) < KERN_DEV_LEGACY_BYTES ? sizeof(h) : KERN_DEV_LEGACY_BYTES);
    p->base = d;
    p->size = size;
    p->handle = KERN_DEV_HANDLE_LEGACY;
    return 0;
}

static int dev_pool_import(struct kern_dev_pool *p)
{
    int n = dev_device_count(), dev = -1, rc;
    uint8_t u[KERN_DEV_UUID_BYTES];
    for (int i = 0; i < n && dev < 0; i++)
        if (dev_device_uuid(i, u) == 0 && memcmp(u, p->uuid, sizeof(u)) == 0)
            dev = i;
    if (dev < 0)
        return -ENODEV;
    /* Mapped on the pool's device, with access for that device only; the caller's current
     * device is given back, and libkvc uses the pool only from threads on that device. */
    dev_scope scope;
    cudaError_t e = scope.enter(dev);
    if (e != cudaSuccess)
        return dev_fail("cudaSetDevice", e);
    p->device = dev;
    if (p->handle == KERN_DEV_HANDLE_LEGACY) {
        cudaIpcMemHandle_t h;
        void *d = NULL;
        memcpy(&h, p->legacy, sizeof(h));
        e = cudaIpcOpenMemHandle(&d, h, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess)
            return dev_fail("cudaIpcOpenMemHandle", e);
        p->base = d;
        p->priv = &dev_drv; /* marks an import: destroy closes instead of freeing */
        return 0;
    }
    if (p->handle != KERN_DEV_HANDLE_FD || p->fd < 0)
        return -EINVAL;
    rc = dev_drv_load();
    if (rc)
        return rc;
    struct dev_vmm *v = (struct dev_vmm *)calloc(1, sizeof(*v));
    if (!v)
        return -ENOMEM;
    CUresult r = dev_drv.import_handle(&v->h, (void *)(uintptr_t)p->fd,
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r) {
        free(v);
        return dev_cufail("cuMemImportFromShareableHandle", r);
    }
    v->size = p->size;
    rc = dev_vmm_map(v, dev);
    if (rc) {
        dev_drv.mem_release(v->h);
        free(v);
        return rc;
    }
    p->base = (void *)(uintptr_t)v->va;
    p->priv = v;
    return 0;
}

static void dev_pool_destroy(struct kern_dev_pool *p)
{
    if (p->handle == KERN_DEV_HANDLE_FD && p->priv) {
        struct dev_vmm *v = (struct dev_vmm *)p->priv;
        dev_drv.mem_unmap(v->va, v->size);
        dev_drv.address_free(v->va, v->size);
        dev_drv.mem_release(v->h);
        free(v);
    } else if (p->handle == KERN_DEV_HANDLE_LEGACY && p->base) {
        /* The exporter frees; an importer closes its mapping. */
        if (p->priv)
            cudaIpcCloseMemHandle(p->base);
        else
            cudaFree(p->base);
    }
    if (p->fd >= 0)
        close(p->fd);
    p->fd = -1;
    p->base = NULL;
    p->priv = NULL;
}

static cudaMemcpyKind dev_kind(int kind)
{
    switch (kind) {
    case KERN_DEV_COPY_H2D:
        return cudaMemcpyHostToDevice;
    case KERN_DEV_COPY_D2H:
        return cudaMemcpyDeviceToHost;
    case KERN_DEV_COPY_D2D:
        return cudaMemcpyDeviceToDevice;
    default:
        return cudaMemcpyDefault;
    }
}

static int dev_copy_async(void *dst, const void *src, uint64_t len, int kind, void *stream)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, len, dev_kind(kind), (cudaStream_t)stream);
    return e == cudaSuccess ? 0 : dev_fail("cudaMemcpyAsync", e);
}

static int dev_stream_new(int dev, void **stream)
{
    cudaStream_t st;
    dev_scope scope;
    cudaError_t e = scope.enter(dev);
    if (e != cudaSuccess)
        return dev_fail("cudaSetDevice", e);
    e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        return dev_fail("cudaStreamCreateWithFlags", e);
    *stream = (void *)st;
    return 0;
}

static void dev_stream_free(void *stream)
{
    if (stream && cudaStreamDestroy((cudaStream_t)stream) != cudaSuccess)
        (void)cudaGetLastError();
}

static int dev_device_get(int *dev)
{
    cudaError_t e = cudaGetDevice(dev);
    return e == cudaSuccess ? 0 : dev_fail("cudaGetDevice", e);
}

static int dev_event_record(void *event, void *stream)
{
    cudaError_t e = cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream);
    return e == cudaSuccess ? 0 : dev_fail("cudaEventRecord", e);
}

static int dev_event_new_record(void **ev, void *stream)
{
    cudaEvent_t e;
    cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (r != cudaSuccess)
        return dev_fail("cudaEventCreate", r);
    r = cudaEventRecord(e, (cudaStream_t)stream);
    if (r != cudaSuccess) {
        cudaEventDestroy(e);
        return dev_fail("cudaEventRecord", r);
    }
    *ev = (void *)e;
    return 0;
}

static int dev_event_wait(void *ev)
{
    cudaError_t r = cudaEventSynchronize((cudaEvent_t)ev);
    return r == cudaSuccess ? 0 : dev_fail("cudaEventSynchronize", r);
}

static int dev_event_wait_free(void *ev)
{
    cudaError_t r = cudaEventSynchronize((cudaEvent_t)ev);
    cudaEventDestroy((cudaEvent_t)ev);
    return r == cudaSuccess ? 0 : dev_fail("cudaEventSynchronize", r);
}

static int dev_event_new(int dev, void **ev)
{
    cudaEvent_t e;
    dev_scope scope;
    cudaError_t r = scope.enter(dev);
    if (r != cudaSuccess)
        return dev_fail("cudaSetDevice", r);
    r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (r != cudaSuccess)
        return dev_fail("cudaEventCreate", r);
    *ev = (void *)e;
    return 0;
}

static int dev_event_query(void *ev)
{
    cudaError_t r = cudaEventQuery((cudaEvent_t)ev);
    if (r == cudaSuccess)
        return 0;
    /* Not an error: the runtime leaves nothing pending for it. */
    if (r == cudaErrorNotReady)
        return -EAGAIN;
    return dev_fail("cudaEventQuery", r);
}

static void dev_event_free(void *ev)
{
    if (ev && cudaEventDestroy((cudaEvent_t)ev) != cudaSuccess)
        (void)cudaGetLastError();
}

static int dev_stream_sync(void *stream)
{
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    return e == cudaSuccess ? 0 : dev_fail("cudaStreamSynchronize", e);
}

static int dev_host_register(void *p, uint64_t len, int readonly)
{
    if (readonly) {
        /* Without this attribute the flag fails and leaves an error behind; a read-only
         * mapping cannot be registered without it, so it stays pageable. */
        int dev = 0, ro = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, dev) !=
                cudaSuccess) {
            (void)cudaGetLastError();
            return -ENOTSUP;
        }
        if (!ro)
            return -ENOTSUP;
    }
    unsigned flags = cudaHostRegisterPortable | (readonly ? cudaHostRegisterReadOnly : 0);
    cudaError_t e = cudaHostRegister(p, len, flags);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
        cudaGetLastError();
        return 0;
    }
    return e == cudaSuccess ? 0 : dev_fail("cudaHostRegister", e);
}

static int dev_host_unregister(void *p)
{
    cudaError_t e = cudaHostUnregister(p);
    return e == cudaSuccess ? 0 : dev_fail("cudaHostUnregister", e);
}

static int dev_pointer_device(const void *p)
{
    cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return -EINVAL;
    }
    return a.type == cudaMemoryTypeDevice ? a.device : -EINVAL;
}

static int dev_mem_alloc(void **p, uint64_t len)
{
    cudaError_t e = cudaMalloc(p, len);
    return e == cudaSuccess ? 0 : dev_fail("cudaMalloc", e);
}

static void dev_mem_free(void *p)
{
    if (p)
        cudaFree(p);
}

static int dev_batch(const struct kern_batch_args *a, void *stream)
{
    return kern_batch_cuda(a, stream);
}

/* ---- batched DMA ----------------------------------------------------------------------
 * The ranges of a host-to-device or device-to-host copy batch go to the copy engines in one
 * call, cudaMemcpyBatchAsync (CUDA 12.8; the CUDA 13 signature here), every range reading its
 * source in stream order (cudaMemcpySrcAccessOrderStream: the sources are the engine's pages
 * and the host arena's blocks, which earlier work on the stream may still write). Where the
 * runtime answers cudaErrorNotSupported (or was built older) the ranges go one
 * cudaMemcpyAsync each, as before, and the batch call is not tried again. The batch call
 * takes no legacy default stream: a batch for it runs on a private non-blocking stream of
 * the current device between two events (the private stream waits for what the legacy
 * stream queued before, the legacy stream for the batch), which orders it exactly as a copy
 * on the legacy stream would be. */
static int dev_dma_unsup;

struct dev_bridge {
    cudaStream_t side;
    cudaEvent_t before, after;
};
static struct dev_bridge dev_bridges[64];
static pthread_mutex_t dev_bridge_mu = PTHREAD_MUTEX_INITIALIZER;

static cudaError_t dev_dma_call(void **d, const void **s, size_t *l, size_t m, cudaStream_t st)
{
#if CUDART_VERSION >= 13000
    struct cudaMemcpyAttributes at;
    size_t first = 0;
    memset(&at, 0, sizeof(at));
    at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    return cudaMemcpyBatchAsync(d, s, l, m, &at, &first, 1, st);
#else
    (void)d;
    (void)s;
    (void)l;
    (void)m;
    (void)st;
    return cudaErrorNotSupported;
#endif
}

/* One batch call on stream, bridged for the legacy default stream. */
static cudaError_t dev_dma_batch(void **d, const void **s, size_t *l, size_t m, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    if (st && st != cudaStreamLegacy)
        return dev_dma_call(d, s, l, m, st);
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return e;
    if (dev < 0 || dev >= 64)
        return cudaErrorNotSupported;
    pthread_mutex_lock(&dev_bridge_mu);
    struct dev_bridge *b = &dev_bridges[dev];
    if (!b->side) {
        e = cudaStreamCreateWithFlags(&b->side, cudaStreamNonBlocking);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&b->before, cudaEventDisableTiming);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&b->after, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            if (b->before)
                cudaEventDestroy(b->before);
            if (b->side)
                cudaStreamDestroy(b->side);
            memset(b, 0, sizeof(*b));
        }
    }
    if (e == cudaSuccess)
        e = cudaEventRecord(b->before, cudaStreamLegacy);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(b->side, b->before, 0);
    if (e == cudaSuccess)
        e = dev_dma_call(d, s, l, m, b->side);
    if (e == cudaSuccess)
        e = cudaEventRecord(b->after, b->side);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(cudaStreamLegacy, b->after, 0);
    pthread_mutex_unlock(&dev_bridge_mu);
    return e;
}

static int dev_copy_batch(void *const *dst, const void *const *src, const uint64_t *len, uint32_t n,
                          int kind, void *stream)
{
    if (n > (kind == KERN_DEV_COPY_D2D ? KERN_COPY_BATCH_MAX : KERN_DMA_BATCH_MAX) ||
        (n && (!dst || !src || !len)))
        return -EINVAL;
    if (kind == KERN_DEV_COPY_D2D)
        return kern_copy_batch_cuda(dst, src, len, n, stream);
    /* DMA: the contiguous ranges (a piece that continues the one before joins it) */
    void **d = (void **)malloc((n ? n : 1) * (2 * sizeof(void *) + sizeof(size_t)));
    if (!d)
        return -ENOMEM;
    const void **s = (const void **)(d + (n ? n : 1));
    size_t *l = (size_t *)(s + (n ? n : 1)), m = 0;
    for (uint32_t i = 0; i < n;) {
        d[m] = dst[i];
        s[m] = src[i];
        l[m] = len[i++];
        while (i < n && (uint8_t *)dst[i] == (uint8_t *)d[m] + l[m] &&
               (const uint8_t *)src[i] == (const uint8_t *)s[m] + l[m])
            l[m] += len[i++];
        m++;
    }
    int rc = 0;
    if (m > 1 && !__atomic_load_n(&dev_dma_unsup, __ATOMIC_RELAXED)) {
        cudaError_t e = dev_dma_batch(d, s, l, m, stream);
        if (e == cudaSuccess) {
            free(d);
            return 0;
        }
        if (e != cudaErrorNotSupported && e != cudaErrorInvalidValue) {
            free(d);
            return dev_fail("cudaMemcpyBatchAsync", e);
        }
        /* not here (never again), or refused as a whole (a range the batch call does not
         * take, nothing queued): the ranges one by one, each refused or queued as a plain
         * copy would be */
        (void)cudaGetLastError();
        if (e == cudaErrorNotSupported)
            __atomic_store_n(&dev_dma_unsup, 1, __ATOMIC_RELAXED);
    }
    for (size_t i = 0; rc == 0 && i < m; i++)
        rc = dev_copy_async(d[i], s[i], l[i], kind, stream);
    free(d);
    return rc;
}

static const struct kern_dev_ops dev_cuda_ops = {
    "cuda",
    dev_device_count,
    dev_device_uuid,
    dev_pool_create,
    dev_pool_import,
    dev_pool_destroy,
    dev_copy_async,
    dev_stream_new,
    dev_stream_free,
    dev_device_get,
    dev_event_record,
    dev_event_new_record,
    dev_event_wait,
    dev_event_wait_free,
    dev_stream_sync,
    dev_host_register,
    dev_host_unregister,
    dev_pointer_device,
    dev_mem_alloc,
    dev_mem_free,
    dev_batch,
    dev_copy_batch,
    dev_event_new,
    dev_event_query,
    dev_event_free,
};

const struct kern_dev_ops *kern_dev_cuda(void)
{
    return &dev_cuda_ops;
}
