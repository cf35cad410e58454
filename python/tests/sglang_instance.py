# DESIGN: one SGLang "instance" in its own process for test_sglang_controller.py: SGLang's
# cache controller (the stand-in in sglang_shim, on sys.path here) with kvcd.sglang loaded
# as its dynamic backend exactly as SGLang loads it, one thread per rank (tensor or context
# parallel ranks of one instance, their hit counts all-reduced), host pools built as
# SGLang's (sglang_pools.py). argv[1] is a JSON spec; the JSON answer on stdout says what
# each rank backed up and loaded, and whether every loaded page holds exactly the KV (and
# state) of its key (pages are filled with KV that depends only on the page's key and
# head, so a reader checks what any writer of any layout stored).
#
# spec: socket, model, page, layers, heads (the model's KV heads), dim, layout, ranks:
# [{tp_rank, tp_size, attn_cp_rank, attn_cp_size, dp_rank}], mla, fp8, interface_v1,
# metrics, tp_lcm_size, extra_config (as a user gives it), hybrid ({"swa_window": W (0:
# no SWA pool), "indexer": bool, "draft_swa": bool: a draft SWA pool riding the SWA pool's
# indices, registered after attach}), allocator, and ops: [{"op": "backup"|"prefetch",
# "tokens": [...], "from_page": k (backup: the pages from k on, a node under the first
# k), "state_at": [page numbers with a Mamba state taken at their end],
# "expect_state_at": page, "router_hint": {...} (a prefetch's router hint, which SGLang
# hands the backend in extra_info.extra_info)}]
import hashlib
import json
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "sglang_shim"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from sglang.srt.managers.cache_controller import HiCacheController, SyncGroup  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (PoolHitPolicy, PoolName,  # noqa: E402
                                                  PoolTransfer)
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import (  # noqa: E402
    HybridCacheController)
from sglang.srt.mem_cache.utils import get_hash_str  # noqa: E402
from sglang_pools import HostPool, MambaPool, _Fp8, page_kv  # noqa: E402


class IndexerPool:
    """A DSA indexer host pool riding the KV pool's indices: per token `width` bytes."""

    layout = "page_first"

    def __init__(self, size, page, width=24):
        self.page_size, self.buf = page, torch.zeros((size, width), dtype=torch.uint8)

    def get_data_page(self, index, flat=True):
        return self.buf[int(index):int(index) + self.page_size].flatten()

    def set_from_flat_data_page(self, index, data):
        self.buf[int(index):int(index) + self.page_size] = data.reshape(self.page_size, -1)

    def get_dummy_flat_data_page(self):
        return torch.zeros(self.page_size * self.buf.shape[1], dtype=torch.uint8)

    def fill(self, index, key):
        self.buf[index:index + self.page_size] = indexer_page(key, self.page_size,
                                                              self.buf.shape[1]).view(
                                                                  self.page_size, -1)


def indexer_page(key, page, width=24):
    seed = int(hashlib.blake2b(key.encode(), digest_size=7).hexdigest(), 16)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 255, (page, width), generator=g, dtype=torch.uint8).flatten()


def rank_heads(spec, r):
    """(first head, count) of the model's KV heads that this TP rank holds."""
    if spec.get("mla"):
        return 0, 1
    per = spec["heads"] // r["tp_size"]
    return r["tp_rank"] * per, per


def cp_key(key, r):
    """The KV of a context-parallel rank is its own slice of the page: another key's."""
    return key if r.get("attn_cp_size", 1) == 1 else "%s/cp%d" % (key, r["attn_cp_rank"])


def state_key(key, r):
    """A Mamba state is TP-sharded (each rank its own slice), even on an MLA model."""
    key = cp_key(key, r)
    return key if r["tp_size"] == 1 else "%s/tp%d" % (key, r["tp_rank"])


def run_rank(spec, r, group, out):
    P, heads_total = spec["page"], spec["heads"]
    h0, nh = rank_heads(spec, r)
    pages = spec.get("pool_pages", 160)
    pool = HostPool(spec["layout"], spec["layers"], nh, spec["dim"], P, pages,
                    mla=spec.get("mla", False), fp8=_Fp8 if spec.get("fp8") else None,
                    allocator=spec.get("allocator", "default"))
    extra = dict(backend_name="kvcd", module_path="kvcd.sglang",
                 class_name="KvcdHiCacheStorage", socket=spec["socket"])
    if spec.get("interface_v1"):
        extra["interface_v1"] = 1
    if spec.get("tp_lcm_size"):
        extra["tp_lcm_size"] = spec["tp_lcm_size"]
    if spec.get("allocator"):
        extra["allocator"] = spec["allocator"]
    if "extra_config" in spec:  # as given (the socket still the test's)
        extra = dict(spec["extra_config"], socket=spec["socket"])
    # SGLang's tree cache takes its own keys out before the controller sees the config,
    # and passes prefix keys only when asked to
    pass_prefix = bool(extra.pop("hicache_storage_pass_prefix_keys", False))
    for k in ("prefetch_threshold", "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
              "prefetch_timeout_max"):
        extra.pop(k, None)
    kw = dict(storage_backend="dynamic", model_name=spec["model"],
              storage_backend_extra_config=extra, enable_storage_metrics=spec.get("metrics"),
              tp_rank=r["tp_rank"], tp_size=r["tp_size"],
              attn_cp_rank=r.get("attn_cp_rank", 0), attn_cp_size=r.get("attn_cp_size", 1),
              dp_rank=r.get("dp_rank", 0), is_mla_model=spec.get("mla", False),
              sync_group=group)
    hy = spec.get("hybrid")
    if hy:
        mamba = MambaPool(slots=16)
        host_pools = {PoolName.MAMBA: mamba}
        swa = None
        if hy["swa_window"]:
            swa = HostPool(spec["layout"], 1, nh, spec["dim"], P, pages)
            host_pools[PoolName.SWA] = swa
        indexer = IndexerPool(pool.size, P) if hy.get("indexer") else None
        if indexer is not None:
            host_pools[PoolName.INDEXER] = indexer
        cc = HybridCacheController(pool, P, host_pools=host_pools, **kw)
        draft_swa = None
        if hy.get("draft_swa"):  # a sidecar pool added once storage is attached
            draft_swa = HostPool(spec["layout"], 1, nh, spec["dim"], P, pages)
            cc.register_host_pool_entry(PoolName.DRAFT_SWA, draft_swa)
    else:
        cc = HiCacheController(pool, P, **kw)
    be = cc.storage_backend
    seen_extra = []  # extra_info.extra_info of each batch_exists / batch_get_v1 call

    def spy_exists(f):
        def call(keys, extra_info=None):
            seen_extra.append(getattr(extra_info, "extra_info", None))
            return f(keys, extra_info)
        return call

    def spy_get(f):
        def call(keys, host_indices, extra_info=None):
            seen_extra.append(getattr(extra_info, "extra_info", None))
            return f(keys, host_indices, extra_info)
        return call
    be.batch_exists, be.batch_get_v1 = spy_exists(be.batch_exists), spy_get(be.batch_get_v1)
    res = dict(rank=r, namespaces=be.namespaces(), ops=[],
               zero_copy=cc.page_get_func == cc._page_get_zero_copy)
    for op in spec["ops"]:
        tokens = op["tokens"]
        hashes = get_hash_str(tokens, None, P)
        prefix_keys = op.get("prefix_keys", []) if pass_prefix else None
        if op.get("from_page"):  # a node under one backed up before: its pages only
            k = op["from_page"]
            prefix_keys = hashes[:k] if pass_prefix else None
            hashes, tokens = hashes[k:], tokens[k * P:]
        if op["op"] == "backup":
            idx = pool.alloc(len(hashes) * P)
            for i, h in enumerate(hashes):
                pool.fill(int(idx[i * P]), cp_key(h, r), heads_total if not spec.get("mla")
                          else 1, h0)
            extra_pools = None
            if hy:
                extra_pools = []
                for at in op.get("state_at", []):
                    slot = mamba.alloc(1)
                    mamba.fill(int(slot[0]), state_key(hashes[at], r))
                    extra_pools.append(PoolTransfer(name=PoolName.MAMBA, host_indices=slot,
                                                    keys=[hashes[at]],
                                                    hit_policy=PoolHitPolicy.TRAILING_PAGES))
                W = hy["swa_window"]
                if W:
                    win = hashes[-W:]
                    sidx = swa.alloc(len(win) * P)
                    for i, h in enumerate(win):
                        swa.fill(int(sidx[i * P]), "swa/" + cp_key(h, r), heads_total, h0)
                    extra_pools.append(PoolTransfer(name=PoolName.SWA, host_indices=sidx,
                                                    keys=win,
                                                    hit_policy=PoolHitPolicy.TRAILING_PAGES))
                if draft_swa is not None:  # its pages at the SWA pool's indices
                    for i, h in enumerate(win):
                        draft_swa.fill(int(sidx[i * P]), "dswa/" + cp_key(h, r), heads_total,
                                       h0)
                    extra_pools.append(PoolTransfer(name=PoolName.DRAFT_SWA,
                                                    indices_from_pool=PoolName.SWA))
                if indexer is not None:
                    for i, h in enumerate(hashes):
                        indexer.fill(int(idx[i * P]), h)
                    extra_pools.append(PoolTransfer(name=PoolName.INDEXER,
                                                    indices_from_pool=PoolName.KV,
                                                    hit_policy=PoolHitPolicy.ALL_PAGES))
                done = cc.run_backup(idx, tokens, hashes, prefix_keys,
                                     extra_pools=extra_pools)
            else:
                done = cc.run_backup(idx, tokens, hashes, prefix_keys)
            res["ops"].append(dict(op="backup", pages=len(hashes),
                                   completed_tokens=done.completed_tokens))
        else:
            extra_pools = None
            if hy:
                extra_pools = [PoolTransfer(name=PoolName.MAMBA, keys=[hashes[-1]],
                                            hit_policy=PoolHitPolicy.TRAILING_PAGES)]
                if swa is not None:
                    extra_pools.append(PoolTransfer(name=PoolName.SWA,
                                                    keys=hashes[-hy["swa_window"]:],
                                                    hit_policy=PoolHitPolicy.TRAILING_PAGES))
                if indexer is not None:
                    extra_pools.append(PoolTransfer(name=PoolName.INDEXER,
                                                    indices_from_pool=PoolName.KV,
                                                    hit_policy=PoolHitPolicy.ALL_PAGES))
                if draft_swa is not None:
                    extra_pools.append(PoolTransfer(name=PoolName.DRAFT_SWA,
                                                    indices_from_pool=PoolName.SWA))
                o, done, acks = cc.run_prefetch(op.get("rid", "r"), tokens,
                                                extra_pools=extra_pools)
            else:
                del seen_extra[:]
                o, done, acks = cc.run_prefetch(op.get("rid", "r"), tokens,
                                                router_hint=op.get("router_hint"))
            npages = done // P
            good = []
            for i in range(npages):
                want = page_kv(cp_key(hashes[i], r), spec["layers"],
                               heads_total if not spec.get("mla") else 1, P, spec["dim"], h0,
                               h0 + nh, pool.dtype, spec.get("mla", False))
                good.append(bool(torch.equal(pool.read_canonical(int(o.host_indices[i * P])),
                                             want)))
            entry = dict(op="prefetch", hit_tokens=o.storage_hit_count, completed_tokens=done,
                         pages_ok=good, acks=len(acks), extra_info_seen=list(seen_extra))
            if hy:
                ex = o.exists_result
                entry["exists_v2"] = dict(kv=ex.kv_hit_pages,
                                          pools={str(k): v for k, v in
                                                 ex.extra_pool_hit_pages.items()})
                hits = [a.pool_hits for a in acks if a.pool_hits is not None]
                entry["pool_hits"] = {str(k): v for k, v in (hits[-1] if hits else {}).items()}
                # which state did the Mamba slot receive: the one taken at which page?
                mt = next(t for t in extra_pools if t.name == PoolName.MAMBA)
                entry["mamba_keys"] = [hashes.index(k) for k in mt.keys]
                if entry["pool_hits"].get("mamba"):
                    got = mamba.get_data_page(int(mt.host_indices[0]))
                    probe = MambaPool(slots=1)
                    entry["mamba_state_ok"] = bool(torch.equal(
                        got, probe.fill(0, state_key(mt.keys[0], r))))
                st = next((t for t in extra_pools if t.name == PoolName.SWA), None)
                if st is not None:
                    entry["swa_keys"] = [hashes.index(k) for k in st.keys]
                if entry["pool_hits"].get("swa"):
                    entry["swa_ok"] = [bool(torch.equal(
                        swa.read_canonical(int(st.host_indices[i * P])),
                        page_kv("swa/" + cp_key(k, r), 1, heads_total, P, spec["dim"], h0,
                                h0 + nh))) for i, k in enumerate(st.keys)]
                if draft_swa is not None and entry["pool_hits"].get("draft_swa"):
                    entry["draft_swa_ok"] = [bool(torch.equal(
                        draft_swa.read_canonical(int(st.host_indices[i * P])),
                        page_kv("dswa/" + cp_key(k, r), 1, heads_total, P, spec["dim"], h0,
                                h0 + nh))) for i, k in enumerate(st.keys)]
                if indexer is not None and npages:
                    entry["indexer_ok"] = all(bool(torch.equal(
                        indexer.get_data_page(int(o.host_indices[i * P])),
                        indexer_page(hashes[i], P))) for i in range(npages))
            res["ops"].append(entry)
    if spec.get("metrics"):
        c = cc.storage_metrics_collector
        res["metrics"] = dict(prefetch_pgs=sum(c.histogram_prefetch_pgs),
                              backup_pgs=sum(c.histogram_backup_pgs),
                              bandwidth_samples=len(c.histogram_prefetch_bandwidth) +
                              len(c.histogram_backup_bandwidth))
    res["stats"] = {k: v for k, v in be.stats().items() if not k.startswith("kvcd_")}
    cc.detach_storage_backend()
    out[r["tp_rank"] * 100 + r.get("attn_cp_rank", 0)] = res


def main():
    spec = json.loads(sys.argv[1])
    ranks = spec.get("ranks") or [dict(tp_rank=0, tp_size=1)]
    group = SyncGroup(len(ranks)) if len(ranks) > 1 else None
    out, errs = {}, []

    def go(r):
        try:
            run_rank(spec, r, group, out)
        except BaseException as e:  # noqa: B902 - reported to the test
            import traceback
            errs.append(traceback.format_exc())
            if group is not None:
                group._barrier.abort()
            raise e

    threads = [threading.Thread(target=go, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errs:
        sys.stderr.write("\n".join(errs))
        sys.exit(1)
    print(json.dumps([out[k] for k in sorted(out)]))


if __name__ == "__main__":
    main()
