/* libFuzzer target: the daemon's request decoder. Anything it accepts must lie inside the
 * datagram. Run with `make fuzz` (clang, ASan+UBSan). */
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
    }
    return 0;
}
