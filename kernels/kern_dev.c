/*
 * kern_dev.c — what kern_dev.h needs in every build: handle names, and in a build without
 * CUDA the absent table (kern_dev_cuda() is NULL, so every caller takes its no-device path).
 */
#include <stddef.h>

#include "kernels/kern_dev.h"

const char *kern_dev_handle_name(uint32_t handle)
{
    switch (handle) {
    case KERN_DEV_HANDLE_FD:
        return "vmm-fd";
    case KERN_DEV_HANDLE_LEGACY:
        return "legacy-ipc";
    default:
        return "none";
    }
}

#if !KVC_CUDA
const struct kern_dev_ops *kern_dev_cuda(void)
{
    return NULL;
}
#endif
