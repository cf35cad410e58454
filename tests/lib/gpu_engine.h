/*
 * gpu_engine.h — what the GPU end-to-end suites (check_e2e_gpu, check_e2e_gpu_fake) share:
 * the model's shape, the daemon of the host-tier cases, and the batch engine of issue 25.
 *
 * DESIGN
 * ge_setup()/ge_teardown() are a TCase's fixture: a kvcd with a 32 MiB host arena of 64 KiB
 * pages and no GPU tier, in ge_d; the teardown also removes any fake device table a failed
 * case left installed (one process runs every case when CK_FORK=no, as under
 * compute-sanitizer). The batch engine (gb_*) is what an engine holds: per-layer K and V
 * tensors of GB_PAGES pages of GB_PAGE tokens, a shuffled block table, in fake device memory
 * (or host memory), GB_BLOCKS blocks of tokens, every byte a function of (layer, K or V,
 * offset, salt) so any copy can be checked; gb_ops() counts a call's device operations (what
 * it queued plus the events it recorded).
 */
#ifndef KVC_TESTS_GPU_ENGINE_H
#define KVC_TESTS_GPU_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "client/kvc.h"
#include "kernels/kern_pack.h"
#include "tests/lib/daemon.h"

#define GE_LAYERS 2
#define GE_HEADS 2
#define GE_DIM 64
#define GE_BT 32    /* tokens per kvcd block */
#define GE_BLOCKS 6 /* the shared prefix */
#define GE_TOKENS (GE_BT * GE_BLOCKS)
#define GE_ROW (GE_DIM * 2) /* fp16 */

/* The daemon of ge_setup. */
extern struct daemon ge_d;
/* The suites' model: GE_LAYERS layers of GE_HEADS heads of GE_DIM, fp16, GE_BT a block. */
struct kvc_layout ge_layout(void);
/* A TCase's fixture: kvcd (32 MiB host arena, 64 KiB pages) started in ge_d; stopped (a
 * clean exit asserted) and the fake device table removed. */
void ge_setup(void);
void ge_teardown(void);

/* ---- the batch engine (issue 25) */
#define GB_MAX_LAYERS 4
#define GB_BLOCKS 64
#define GB_TOKENS (GE_BT * GB_BLOCKS)
#define GB_PAGE 16
#define GB_PAGES (GB_TOKENS / GB_PAGE)

struct gb_engine {
    uint32_t layers;
    int dev; /* tensors in fake device memory */
    void *k[GB_MAX_LAYERS], *v[GB_MAX_LAYERS];
    int32_t table[GB_PAGES];
    uint64_t bytes;
    uint32_t pad; /* bytes after each head's row (0: heads and tokens packed) */
    struct kvc_paged_kv kv;
};

/* layers layers of tensors in fake device memory (dev) or host memory, filled with the
 * engine's bytes for salt (fill) or 0x5a. */
void gb_engine_init(struct gb_engine *e, uint32_t layers, int dev, int fill, unsigned salt);
/* The same with pad bytes after each head's row: a strided layout (the gather/scatter
 * kernel's row steps, host blocks staged), where pad 0 is vLLM's packed one (run steps,
 * host blocks by DMA straight into the pages). */
void gb_engine_init_pad(struct gb_engine *e, uint32_t layers, int dev, int fill, unsigned salt,
                        uint32_t pad);
void gb_engine_fini(struct gb_engine *e);
/* The pack layout and engine of kernels/kern_pack.h for e. */
struct kern_pack_layout gb_pack_layout(uint32_t layers);
struct kern_pack_engine gb_pack_engine(const struct gb_engine *e);
/* The canonical blocks of e's first n blocks (the reference gather), malloc'd. */
uint8_t *gb_blocks(const struct gb_engine *e, uint32_t n, size_t bb);
/* ge_layout with `layers` layers, a model of its own per layer count. */
struct kvc_layout gb_layout(uint32_t layers);
/* The keys of n blocks of tokens base, base+1, ... */
void gb_keys(kvc_ns *ns, uint32_t base, uint32_t n, struct kvc_key *keys);
/* Device operations so far: fake_dev.ops + fake_dev.records. */
uint64_t gb_ops(void);
/* Layers [lf, lf+lc) of dst hold src's tokens [0, ntok) and everything else of dst is still
 * 0x5a: 0, else -1. */
int gb_engine_check(const struct gb_engine *dst, const struct gb_engine *src, uint32_t ntok,
                    uint32_t lf, uint32_t lc);
/* Every byte of e's tensors 0x5a. */
void gb_engine_clear(struct gb_engine *e);

#endif
