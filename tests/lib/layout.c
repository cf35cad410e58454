/*
 * layout.c — see layout.h.
 */
#include <stdio.h>
#include <string.h>

#include "tests/lib/layout.h"

struct kvc_wire_layout layout_fp16(const char *model, uint32_t layers, uint32_t flags)
{
    struct kvc_wire_layout l;
    memset(&l, 0, sizeof(l));
    snprintf(l.model_id, sizeof(l.model_id), "%s", model);
    l.layers = layers;
    l.kv_heads = 4;
    l.head_dim = 128;
    l.block_tokens = 16;
    l.dtype = KVC_WIRE_DTYPE_FP16;
    l.kv_kind = KVC_WIRE_KV_KIND_KV;
    l.flags = flags;
    return l;
}
