/*
 * layout.h — the namespace layout the store-level suites use: fp16 K and V, 4 KV heads of
 * 128 channels, 16 tokens a block, so a block is 32 KiB per layer.
 */
#ifndef KVC_TESTS_LAYOUT_H
#define KVC_TESTS_LAYOUT_H

#include <stdint.h>

#include "client/kvc_proto.h"

struct kvc_wire_layout layout_fp16(const char *model, uint32_t layers, uint32_t flags);

#endif
