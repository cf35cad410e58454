/*
 * fake_dev.c — see fake_dev.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/lib/fake_dev.h"

struct fake_dev_state fake_dev;

void fake_dev_reset(int devices)
{
    memset(&fake_dev, 0, sizeof(fake_dev));
    fake_dev.devices = devices;
}

static int fake_device_count(void)
{
    return fake_dev.devices;
}

static int fake_device_uuid(int dev, uint8_t uuid[KERN_DEV_UUID_BYTES])
{
    if (dev < 0 || dev >= fake_dev.devices)
        return -ENODEV;
    memset(uuid, 0xf0 + dev, KERN_DEV_UUID_BYTES);
    return 0;
}

static int fake_pool_create(int dev, uint64_t size, struct kern_dev_pool *p)
{
    memset(p, 0, sizeof(*p));
    p->fd = -1;
    if (fake_dev.fail_create)
        return -fake_dev.fail_create;
    if (dev < 0 || dev >= fake_dev.devices)
        return -ENODEV;
    p->base = calloc(1, size);
    if (!p->base)
        return -ENOMEM;
    p->device = dev;
    p->size = size;
    p->handle = KERN_DEV_HANDLE_FD;
    p->fd = dup(STDERR_FILENO); /* any descriptor: it stands for the exported handle */
    fake_device_uuid(dev, p->uuid);
    fake_dev.pools_live++;
    return 0;
}

static int fake_pool_import(struct kern_dev_pool *p)
{
    (void)p;
    return -ENOTSUP; /* separate processes share no fake device memory */
}

static void fake_pool_destroy(struct kern_dev_pool *p)
{
    free(p->base);
    if (p->fd >= 0)
        close(p->fd);
    p->base = NULL;
    p->fd = -1;
    fake_dev.pools_live--;
}

static int fake_copy(void *dst, const void *src, uint64_t len, int kind)
{
    (void)kind;
    memmove(dst, src, len);
    fake_dev.copies++;
    fake_dev.bytes += len;
    return 0;
}

static int fake_copy_async(void *dst, const void *src, uint64_t len, int kind, void *stream)
{
    (void)stream;
    return fake_copy(dst, src, len, kind);
}

static int fake_event_record(void *event, void *stream)
{
    (void)event, (void)stream;
    return 0;
}

static int fake_event_new_record(void **ev, void *stream)
{
    (void)stream;
    *ev = &fake_dev;
    fake_dev.events_live++;
    return 0;
}

static int fake_event_wait_free(void *ev)
{
    (void)ev;
    fake_dev.events_live--;
    return 0;
}

static int fake_stream_sync(void *stream)
{
    (void)stream;
    return 0;
}

static int fake_host_register(void *p, uint64_t len, int readonly)
{
    (void)p, (void)len, (void)readonly;
    fake_dev.registered++;
    return 0;
}

static int fake_host_unregister(void *p)
{
    (void)p;
    fake_dev.registered--;
    return 0;
}

static int fake_pointer_device(const void *p)
{
    (void)p;
    return fake_dev.devices ? 0 : -EINVAL;
}

static int fake_mem_alloc(void **p, uint64_t len)
{
    *p = malloc(len);
    return *p ? 0 : -ENOMEM;
}

static void fake_mem_free(void *p)
{
    free(p);
}

const struct kern_dev_ops fake_dev_ops = {
    .name = "fake",
    .device_count = fake_device_count,
    .device_uuid = fake_device_uuid,
    .pool_create = fake_pool_create,
    .pool_import = fake_pool_import,
    .pool_destroy = fake_pool_destroy,
    .copy_async = fake_copy_async,
    .copy = fake_copy,
    .event_record = fake_event_record,
    .event_new_record = fake_event_new_record,
    .event_wait_free = fake_event_wait_free,
    .stream_sync = fake_stream_sync,
    .host_register = fake_host_register,
    .host_unregister = fake_host_unregister,
    .pointer_device = fake_pointer_device,
    .mem_alloc = fake_mem_alloc,
    .mem_free = fake_mem_free,
};
