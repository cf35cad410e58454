/* libFuzzer target: the daemon's request decoder. Anything it accepts must lie inside the
 * datagram. Run with `make fuzz` (clang, ASan+UBSan); seeds in tests/fuzz/corpus/proto (a
 * request of every opcode, the counted ones at their edges), words in tests/fuzz/proto.dict. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint64_t buf[(KVC_PROTO_MAX_MSG + 64) / 8];
    struct proto_req r;
    const char *why;
    if (size > KVC_PROTO_MAX_MSG)
        return 0;
    memcpy(buf, data, size);
    if (proto_decode(buf, size, &r, &why) == 0) {
        if (sizeof(struct kvc_msg_hdr) + r.hdr->len != size)
            abort();
        if (r.tail && (const char *)r.tail < (const char *)buf)
            abort();
        /* The floats after the keys (HINT_HEADS' scores, LOOKUP_BUDGET's query) end where
         * the datagram does: their count is a product of the request's counts. */
        if (r.tail2 && ((const char *)r.tail2 < (const char *)r.tail ||
                        (const char *)r.tail2 + (uint64_t)r.ntail2 * sizeof(float) !=
                            (const char *)buf + size))
            abort();
        if (!r.tail2 && r.ntail2)
            abort();
    }
    return 0;
}
