# DESIGN: `make bench-python` (not part of make check): the kvcd Python package against the
# C path, and the reference engine's prefill with and without a full hit; rows in
# build/bench/python.json like every benchmark here ({"case", "value", "unit", "baseline",
# "baseline_value", "ratio"}, ratio = value / baseline_value).
#  - get_prefix / put_prefix from Python into / out of preallocated torch tensors (the rows
#    of one tensor, passed as tensors: the binding reads data_ptr()), for 2 MiB and 16 MiB
#    blocks (the layouts of bench_host.c), 256 MiB of blocks per case and 16 MiB per round
#    trip, as bench_host.c does. The baseline is the C path doing the same operation
#    (kvc_get_prefix: lookup, kvc_lease_copy of each hit, release; kvc_put_prefix) called
#    straight into libkvc.so (ctypes: one call per 16 MiB, its overhead is microseconds) on
#    its own connection to the same daemon, with the same buffers, alternating with the
#    Python run repetition by repetition, so both see the same machine. Best of 11
#    repetitions after a warm-up, median beside it. Target: ratio >= 0.9. Puts use fresh
#    keys each repetition; the namespace is evicted between repetitions, outside the
#    timings.
#  - scatter into an engine's paged KV cache (vLLM's per-layer K and V tensors [pages, 16,
#    8, 128], a shuffled block table; 2 MiB blocks, 16 MiB per lookup): Python's
#    lookup + Lease.scatter (of a Namespace.paged_kv made once, as C's struct kvc_paged_kv)
#    + release against kvc_lookup + kvc_lease_scatter + kvc_release in C, same tensors, same daemon, alternating; on the CPU, and on a CUDA device when torch
#    sees one (there also get_prefix into the rows of a CUDA tensor against kvc_lookup +
#    kvc_lease_copy_range_async + kvc_release); each run's tensors checked against the
#    blocks put. Target: ratio >= 0.9.
#  - SGLang's zero-copy L3 calls (kvcd.sglang, issue 27): batch_set_v1 / batch_get_v1 of 64
#    pages of 2 MiB between a layer_first host pool and kvcd, against the C path moving the
#    same bytes between the same tensors (kvc_reserve + kvc_resv_gather + kvc_commit;
#    kvc_lookup + kvc_lease_scatter + kvc_release), alternating. Target: ratio >= 0.9.
#  - the engine (default ModelConfig, 16-token blocks) on a 4096-token prompt, on the GPU
#    when there is one: prefill time with every full block but the last loaded from kvcd
#    (scattered into its paged cache) against no cache (baseline); the speed-up is baseline
#    / value. Generated tokens are checked equal.
#  - prefill (issue 26; prefill_case): on a GPU an 8B-shaped decoder (kvcd.engine.prefill:
#    Llama-3-8B's shape, random bf16 weights, vLLM-layout paged cache, 128 KiB of KV a token)
#    on prompts of 4k and 16k tokens: prefill with no cache, and with a full hit loaded
#    through kvcd (lookup + scatter into the pages) from the host tier and from the daemon's
#    GPU pool; each load against a copy of the same bytes in the same run (pinned host to
#    device; device to device), target ratio <= 1.1, and each hit's prefill against no
#    cache. A load is timed as an engine pays it: the lookup, the scatter queued and the
#    wait for the stream; its lease is released after the forward, outside the timings, as
#    the vLLM connector releases a step's loads at the next step (the release's wait then
#    finds the copies done; its unpin, one request to the daemon, is loadstages' release).
#    Without a GPU the 8B rows print SKIP and the same path runs with a small model on 256
#    tokens (host tier only).
#  - loadcpu (issue 26; loadcpu_case): the host CPU time per block of the CUDA load path,
#    Python (Namespace.lookup + Lease.scatter of a PagedKV, kvcd.engine.prefill's load)
#    against C (kvc_lookup + kvc_lease_scatter through the same libkvc image, the
#    extension's, so both see the same device), on the 8B shape's paged tensors (32 layers,
#    8 KV heads of 128, 16-token blocks of 2 MiB, 256 blocks: 16,384 DMA ranges of 32 KiB):
#    the calling thread's CPU time of the two calls that queue the load, the release and the
#    wait outside it (on a device they wait for the copies). On a GPU the device's own tensors
#    and the host tier and the pool; without one the strict fake device ($KVC_FAKEDEV_LIB,
#    default build/tests/libkvc_fakedev_py.so; its queueing of each range counts in both
#    paths alike), host tier only. Alternating, best and median of the repetitions; target
#    ratio <= 1.1.
#  - loadstages (issue 26; loadstages_case): where the wall time of one load goes, stage by
#    stage as the prefill rows run them (lookup, the scatter queued, the wait for the stream,
#    release: the unpin, its wait finding the copies done), on prefixes of 255 and 1023
#    8B-shaped blocks (4k and 16k tokens) with the prefill rows' table (every page of the
#    cache), Python against C (the extension's libkvc, the same device), alternating; on a
#    GPU the host tier and the pool beside the copy of the same bytes, without one the strict
#    fake device (host tier; its wait is the fake copying on the CPU). Rows: the fixed part
#    (all but the wait), Python against C; on a GPU also Python's wait against the copy.
#    Where the daemon's work after a lookup's reply (the default policy's tuner) lands:
#    KVC_BENCH_DAEMON_CPU and KVC_BENCH_CLIENT_CPU bind kvcd's loop thread and this thread to
#    one CPU each (the same CPU: the reply's reader waits for the CPU the daemon keeps),
#    KVC_BENCH_POLICY sets the daemon's cache.policy (lru: no tuner).
# --cases picks parts, --append merges rows into OUT's.
# Exit status 1 when something broke (a short hit, wrong bytes, different tokens), 0 with
# figures otherwise (a missed target is reported, not failed).
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import torch

import kvcd
from kvcd.engine import Engine, ModelConfig
from kvcd.engine.daemon import PrivateDaemon
from kvcd.engine.prefill import (LLAMA3_8B, Decoder, PagedCache, load, small_config, store,
                                 sync)
from kvcd.engine.prompts import system_prompt

SIZES = {"2MiB": ("bench/py-32l-8h-128d", 32, 8, 128, 16),
         "16MiB": ("bench/py-32l-8h-128d-t128", 32, 8, 128, 128)}
SMOKE = os.environ.get("KVC_BENCH_SMOKE") == "1"  # a quick run whose figures mean nothing
WS = (32 if SMOKE else 256) << 20
OP = 16 << 20
REPS = 2 if SMOKE else 11
PROMPT = 512 if SMOKE else 4096
CASES = ("host", "paged", "sglang", "engine", "prefill", "loadcpu", "loadstages")
PREFILL_BLOCK = 16
PREFILL_REPS = 1 if SMOKE else 3
LOADCPU_BLOCKS = 64 if SMOKE else 256


def gbps(nbytes, secs):
    return nbytes / secs / 1e9


class CPath:
    """libkvc's C calls through ctypes, on a connection of their own."""

    class Layout(ctypes.Structure):
        _fields_ = [("model_id", ctypes.c_char_p), ("layers", ctypes.c_uint32),
                    ("kv_heads", ctypes.c_uint32), ("head_dim", ctypes.c_uint32),
                    ("block_tokens", ctypes.c_uint32), ("dtype", ctypes.c_int),
                    ("kv_kind", ctypes.c_int)]

    class PagedKV(ctypes.Structure):  # struct kvc_paged_kv
        _fields_ = [("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
                    ("block_table", ctypes.c_void_p), ("table_len", ctypes.c_uint32),
                    ("page_tokens", ctypes.c_uint32), ("page_stride", ctypes.c_uint64),
                    ("token_stride", ctypes.c_uint64), ("head_stride", ctypes.c_uint64),
                    ("on_device", ctypes.c_int)]

    def __init__(self, build, sock):
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        self.lib = ctypes.CDLL(os.path.join(build, "lib", "libkvc.so"))
        self.lib.kvc_put_prefix.argtypes = [vp] * 3 + [sz, vp]
        self.lib.kvc_get_prefix.argtypes = [vp, vp, sz, vp]
        self.lib.kvc_lookup.argtypes = [vp, vp, sz, ctypes.c_uint, vp]
        self.lib.kvc_lease_scatter.argtypes = [vp, sz, sz, vp, ctypes.c_uint64, vp, vp]
        self.lib.kvc_lease_copy_range_async.argtypes = [vp, sz, sz, vp, sz, vp]
        self.lib.kvc_release.argtypes = [vp]
        self.lib.kvc_gpu_attach.argtypes = [vp]
        self.c = ctypes.c_void_p()
        rc = self.lib.kvc_connect(sock.encode(), ctypes.byref(self.c))
        if rc < 0:
            raise RuntimeError("kvc_connect: %d" % rc)

    def ns(self, model, layers, heads, dim, tokens):
        lay = self.Layout(model.encode(), layers, heads, dim, tokens, 1, 1)  # fp16, K+V
        ns = ctypes.c_void_p()
        rc = self.lib.kvc_ns_open(self.c, ctypes.byref(lay), ctypes.byref(ns))
        if rc < 0:
            raise RuntimeError("kvc_ns_open: %d" % rc)
        return ns

    def close(self):
        self.lib.kvc_disconnect(self.c)


def ptrs(tensors):
    return (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])


def ckey_chunks(keys, per_op):
    return [(ctypes.c_char * (16 * per_op)).from_buffer_copy(b"".join(keys[j:j + per_op]))
            for j in range(0, len(keys), per_op)]


def host_case(c, cpath, size):
    model, layers, heads, dim, tokens = SIZES[size]
    ns = c.namespace(model, layers, heads, dim, tokens)
    cns = cpath.ns(model, layers, heads, dim, tokens)
    bb = ns.block_bytes
    n, per_op = WS // bb, max(1, OP // bb)
    src = torch.randn(n, bb // 2).half()
    dst = torch.zeros(n, bb // 2, dtype=torch.float16)
    srcs = [src[i] for i in range(n)]  # torch tensors: the binding's tensor path
    dsts = [dst[i] for i in range(n)]
    ops = range(0, n, per_op)
    csrc = [ptrs(srcs[j:j + per_op]) for j in ops]
    cdst = [ptrs(dsts[j:j + per_op]) for j in ops]
    toks = list(range(n * tokens))
    t = {k: [] for k in ("py_put", "c_put", "py_get", "c_get")}

    def check(label):
        if not torch.equal(src, dst):
            raise RuntimeError("%s returned other bytes than put" % label)
        dst.zero_()

    for rep in range(REPS + 1):
        # Python and C alternate which goes first.
        for who in (("py", "c") if rep % 2 else ("c", "py")):
            keys = ns.keys_from_tokens(toks, extra=b"%s%d" % (who.encode(), rep))
            ckeys = [(ctypes.c_char * (16 * per_op)).from_buffer_copy(b"".join(keys[j:j + per_op]))
                     for j in ops]
            t0 = time.perf_counter()
            if who == "py":
                for j in ops:
                    if ns.put_prefix(keys[j:j + per_op], srcs[j:j + per_op],
                                     parent=keys[j - 1] if j else None) != per_op:
                        raise RuntimeError("put_prefix short")
            else:
                par = [None] + [(ctypes.c_char * 16).from_buffer_copy(keys[j - 1])
                                for j in ops if j]
                t0 = time.perf_counter()
                for k, j in enumerate(ops):
                    if cpath.lib.kvc_put_prefix(cns, par[k], ckeys[k], per_op, csrc[k]) != per_op:
                        raise RuntimeError("kvc_put_prefix short")
            t1 = time.perf_counter()
            if who == "py":
                for j in ops:
                    if ns.get_prefix(keys[j:j + per_op], dsts[j:j + per_op]) != per_op:
                        raise RuntimeError("get_prefix short")
            else:
                for k, j in enumerate(ops):
                    if cpath.lib.kvc_get_prefix(cns, ckeys[k], per_op, cdst[k]) != per_op:
                        raise RuntimeError("kvc_get_prefix short")
            t2 = time.perf_counter()
            check(who)
            c.evict(ns.id)  # room for the next repetition's fresh keys
            if rep:  # the first is the warm-up
                t[who + "_put"].append(gbps(WS, t1 - t0))
                t[who + "_get"].append(gbps(WS, t2 - t1))
    return t


def put_blocks(ns, keys, blocks, per_op):
    for j in range(0, len(keys), per_op):
        if ns.put_prefix(keys[j:j + per_op], blocks[j:j + per_op],
                         parent=keys[j - 1] if j else None) != len(keys[j:j + per_op]):
            raise RuntimeError("put_prefix short")


def paged_case(c, cpath, device):
    """Lookup + scatter into a paged cache (and, on a GPU, get_prefix into the rows of a
    device tensor), Python against C, alternating."""
    model, layers, heads, dim, tokens = SIZES["2MiB"]
    model += "-paged"
    ns = c.namespace(model, layers, heads, dim, tokens)
    cns = cpath.ns(model, layers, heads, dim, tokens)
    bb = ns.block_bytes
    n, per_op = WS // bb, max(1, OP // bb)
    src = torch.randn(n, bb // 2).half()
    keys = ns.keys_from_tokens(range(n * tokens))
    put_blocks(ns, keys, [src[i] for i in range(n)], per_op)
    c.flush()
    ckeys = ckey_chunks(keys, per_op)
    k = [torch.zeros(n, tokens, heads, dim, dtype=torch.float16, device=device)
         for _ in range(layers)]
    v = [torch.zeros_like(t) for t in k]
    table = torch.randperm(n, generator=torch.Generator().manual_seed(1)).tolist()
    ctable = (ctypes.c_int32 * n)(*table)
    ck, cv = ptrs(k), ptrs(v)
    es = 2
    kv = CPath.PagedKV(ctypes.cast(ck, ctypes.c_void_p), ctypes.cast(cv, ctypes.c_void_p),
                       ctypes.cast(ctable, ctypes.c_void_p), n, tokens, k[0].stride(0) * es,
                       k[0].stride(1) * es, k[0].stride(2) * es, int(device == "cuda"))
    stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else None
    if device == "cuda" and cpath.lib.kvc_gpu_attach(cpath.c) < 0:
        raise RuntimeError("kvc_gpu_attach failed")
    rows = torch.zeros(n, bb // 2, dtype=torch.float16, device=device)
    t = {x: [] for x in ("py_scatter", "c_scatter", "py_get", "c_get")}
    paged = ns.paged_kv(k, v)  # read once, as C's struct kvc_paged_kv is built once

    def check(label, what):
        if what == "scatter":
            pos = torch.arange(n * tokens)
            pg, off = torch.tensor(table)[pos // tokens], pos % tokens
            got = torch.stack([torch.stack([kk[lay].cpu()[pg, off] for kk in (k, v)])
                               for lay in range(layers)])  # [L, 2, n*T, H, D]
            got = got.view(layers, 2, n, tokens, heads, dim).permute(2, 0, 1, 3, 4, 5)
            ok = torch.equal(got.reshape(n, -1), src)
            for x in k + v:
                x.zero_()
        else:
            ok = torch.equal(rows.cpu(), src)
            rows.zero_()
        if not ok:
            raise RuntimeError("%s %s gave other bytes than put" % (label, what))

    for rep in range(REPS + 1):
        for who in (("py", "c") if rep % 2 else ("c", "py")):
            sync(device)
            t0 = time.perf_counter()
            if who == "py":
                for j in range(0, n, per_op):
                    with ns.lookup(keys[j:j + per_op]) as lease:
                        if len(lease) != per_op:
                            raise RuntimeError("lookup short")
                        lease.scatter(paged, None, table, first_token=j * tokens, stream=stream)
            else:
                for q, j in enumerate(range(0, n, per_op)):
                    lease = ctypes.c_void_p()
                    if cpath.lib.kvc_lookup(cns, ckeys[q], per_op, 0,
                                            ctypes.byref(lease)) != per_op:
                        raise RuntimeError("kvc_lookup short")
                    rc = cpath.lib.kvc_lease_scatter(lease, 0, per_op, ctypes.byref(kv),
                                                     j * tokens, stream, None)
                    cpath.lib.kvc_release(lease)
                    if rc != per_op:
                        raise RuntimeError("kvc_lease_scatter: %d" % rc)
            sync(device)
            t1 = time.perf_counter()
            if rep in (0, REPS):
                check(who, "scatter")
            if rep:
                t[who + "_scatter"].append(gbps(WS, t1 - t0))
            if device != "cuda":
                continue
            sync(device)
            t0 = time.perf_counter()
            if who == "py":
                for j in range(0, n, per_op):
                    if ns.get_prefix(keys[j:j + per_op], [rows[i] for i in range(j, j + per_op)],
                                     stream=stream) != per_op:
                        raise RuntimeError("get_prefix short")
            else:
                for q, j in enumerate(range(0, n, per_op)):
                    lease = ctypes.c_void_p()
                    if cpath.lib.kvc_lookup(cns, ckeys[q], per_op, 0,
                                            ctypes.byref(lease)) != per_op:
                        raise RuntimeError("kvc_lookup short")
                    rc = cpath.lib.kvc_lease_copy_range_async(lease, 0, per_op, rows[j].data_ptr(),
                                                              per_op * bb, stream)
                    cpath.lib.kvc_release(lease)
                    if rc < 0:
                        raise RuntimeError("kvc_lease_copy_range_async: %d" % rc)
            sync(device)
            t1 = time.perf_counter()
            if rep in (0, REPS):
                check(who, "get")
            if rep:
                t[who + "_get"].append(gbps(WS, t1 - t0))
    c.evict(ns.id)
    return t


def sglang_case(c, cpath, sock):
    """SGLang's zero-copy L3 calls (kvcd.sglang: batch_set_v1 / batch_get_v1 of 64 pages of
    a layer_first host pool, pages in shuffled order) against the C path moving the same
    bytes between the same pool tensors (kvc_reserve + kvc_resv_gather + kvc_commit;
    kvc_lookup + kvc_lease_scatter + kvc_release), alternating, fresh keys each
    repetition."""
    from types import SimpleNamespace

    from kvcd.sglang import KvcdHiCacheStorage, _key

    L, H, D, P, N = 32, 8, 128, 16, 64  # 2 MiB pages, SGLang's default host layout

    class Pool:  # SGLang's MHA host pool, layout layer_first: [2][layer][token][head][dim]
        layout, page_size, dtype = "layer_first", P, torch.float16

        def __init__(self, fill):
            self.kv_buffer = (torch.randn if fill else torch.zeros)(
                (2, L, N * P, H, D), dtype=torch.float32 if fill else torch.float16).half()

    src, dst = Pool(True), Pool(False)
    cfg = SimpleNamespace(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                          attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                          model_name="bench/sglang", dp_rank=0, tp_lcm_size=None,
                          should_split_heads=False,
                          extra_config=dict(socket=sock, interface_v1=1))
    be = KvcdHiCacheStorage(cfg, src)
    (model,) = be.namespaces()["kv"]
    ns = c.namespace(model, L, H, D, P)
    cns = cpath.ns(model, L, H, D, P)
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(2)).tolist()
    idx = torch.tensor([p * P + t for p in perm for t in range(P)], dtype=torch.int64)
    ctable = (ctypes.c_int32 * N)(*perm)
    es, nbytes = 2, N * 2 * L * P * H * D * 2

    def paged(pool):
        k = ptrs([pool.kv_buffer[0, l] for l in range(L)])
        v = ptrs([pool.kv_buffer[1, l] for l in range(L)])
        st = pool.kv_buffer[0, 0].stride()
        kv = CPath.PagedKV(ctypes.cast(k, ctypes.c_void_p), ctypes.cast(v, ctypes.c_void_p),
                           ctypes.cast(ctable, ctypes.c_void_p), N, P, P * st[0] * es,
                           st[0] * es, st[1] * es, 0)
        return kv, (k, v)

    ckv_src, keep_src = paged(src)
    ckv_dst, keep_dst = paged(dst)
    cpath.lib.kvc_reserve.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_size_t, ctypes.c_void_p]
    cpath.lib.kvc_resv_gather.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                                          ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p,
                                          ctypes.c_void_p]
    cpath.lib.kvc_commit.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    t = {x: [] for x in ("py_set", "c_set", "py_get", "c_get")}

    def check(label):
        got = dst.kv_buffer[:, :, idx]
        if not torch.equal(got, src.kv_buffer[:, :, idx]):
            raise RuntimeError("%s: the host pool got other bytes than were set" % label)
        dst.kv_buffer.zero_()

    for rep in range(REPS + 1):
        for who in (("py", "c") if rep % 2 else ("c", "py")):
            keys = ["sglang-bench-%s-%d-%d" % (who, rep, i) for i in range(N)]
            if who == "py":
                be.register_mem_pool_host(src)
                t0 = time.perf_counter()
                if be.batch_set_v1(keys, idx) != [True] * N:
                    raise RuntimeError("batch_set_v1 short")
                t1 = time.perf_counter()
                be.register_mem_pool_host(dst)
                t2 = time.perf_counter()
                if be.batch_get_v1(keys, idx) != [True] * N:
                    raise RuntimeError("batch_get_v1 short")
                t3 = time.perf_counter()
            else:
                ck = (ctypes.c_char * (16 * N)).from_buffer_copy(b"".join(_key(k) for k in keys))
                t0 = time.perf_counter()
                resv = ctypes.c_void_p()
                if cpath.lib.kvc_reserve(cns, None, ck, N, ctypes.byref(resv)) != N:
                    raise RuntimeError("kvc_reserve short")
                rc = cpath.lib.kvc_resv_gather(resv, 0, N, ctypes.byref(ckv_src), 0, None, None)
                if rc != N or cpath.lib.kvc_commit(resv, ctypes.c_size_t(-1).value) != N:
                    raise RuntimeError("kvc_resv_gather / kvc_commit: %d" % rc)
                t1 = t2 = time.perf_counter()
                lease = ctypes.c_void_p()
                if cpath.lib.kvc_lookup(cns, ck, N, 0, ctypes.byref(lease)) != N:
                    raise RuntimeError("kvc_lookup short")
                rc = cpath.lib.kvc_lease_scatter(lease, 0, N, ctypes.byref(ckv_dst), 0, None,
                                                 None)
                cpath.lib.kvc_release(lease)
                if rc != N:
                    raise RuntimeError("kvc_lease_scatter: %d" % rc)
                t3 = time.perf_counter()
            check(who)
            c.evict(ns.id)
            if rep:
                t[who + "_set"].append(gbps(nbytes, t1 - t0))
                t[who + "_get"].append(gbps(nbytes, t3 - t2))
    be.close()
    del keep_src, keep_dst
    return t


def engine_case(sock):
    prompt = system_prompt(0, PROMPT)
    with Engine(ModelConfig(), block_tokens=16, max_tokens=PROMPT + 8, socket_path=sock,
                threads=2) as e:
        cold = e.generate(prompt, 4, put=True)  # computes and puts every full block
        nohit, hit = [cold.prefill_s], []
        for _ in range(2):
            g = e.generate(prompt, 4, use_cache=False, put=False)
            nohit.append(g.prefill_s)
            if g.tokens != cold.tokens:
                raise RuntimeError("tokens differ between runs without kvcd")
        for _ in range(5):
            g = e.generate(prompt, 4, put=False)
            if g.tokens != cold.tokens or g.loaded_tokens != PROMPT - 16:
                raise RuntimeError("hit run: %d loaded, tokens %s vs %s" %
                                   (g.loaded_tokens, g.tokens, cold.tokens))
            hit.append(g.prefill_s)
    return hit, nohit


def prefill_plan():
    """(device, model tag, config, prompt sizes) of the prefill rows: on a GPU the 8B shape
    at 4k and 16k tokens; without one a small model at 256 tokens (the same code path, a
    smoke whose figures say nothing about a GPU). $KVC_BENCH_PREFILL_MODEL (8b, small) and
    $KVC_BENCH_PREFILL_TOKENS (comma-separated prompt lengths) override."""
    cuda = torch.cuda.is_available()
    tag = os.environ.get("KVC_BENCH_PREFILL_MODEL") or ("8b" if cuda else "small")
    if tag not in ("8b", "small"):
        raise RuntimeError("KVC_BENCH_PREFILL_MODEL: 8b or small, not %r" % tag)
    spec = os.environ.get("KVC_BENCH_PREFILL_TOKENS") or ("4096,16384" if cuda else "256")
    try:
        sizes = sorted({int(x) for x in spec.split(",")})
    except ValueError:
        raise RuntimeError("KVC_BENCH_PREFILL_TOKENS: prompt lengths, not %r" % spec)
    if sizes[0] <= PREFILL_BLOCK or sizes[-1] > 65536:
        raise RuntimeError("KVC_BENCH_PREFILL_TOKENS: lengths in (%d, 65536]" % PREFILL_BLOCK)
    return "cuda" if cuda else "cpu", tag, LLAMA3_8B if tag == "8b" else small_config(), sizes


def timed(device, fn):
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def prefill_case(device, cfg, sizes):
    """Per prompt length: prefill without a cache, and with a full hit loaded through kvcd
    from the host tier and (on a GPU) from the daemon's GPU pool; each load against a copy
    of the same bytes (the blocks in kvcd's layout) in the same run: pinned host to device
    (memcpy on the CPU), device to device. Returns {length: {what: [seconds]}}."""
    bt, top = PREFILL_BLOCK, sizes[-1]
    nblk = (top - 1) // bt  # blocks a hit can load: the last token is always computed
    kv = nblk * bt * cfg.kv_token_bytes()
    # The longest prompt's KV and a quarter more, in 64 MiB steps (2,624 MiB for 16k tokens
    # of the 8B shape): the host arena and the GPU pool each.
    arena = "%dm" % ((((kv * 5 // 4) >> 20) + 64 + 63) // 64 * 64)
    cuda = device == "cuda"
    opts = ["host.size=" + arena, "quota.uid_reserved_share=100"]
    if cuda:
        opts.append("gpu.pool_size=" + arena)
    out = {}
    with PrivateDaemon(opts) as d, kvcd.Client(d.socket) as hc, kvcd.Client(d.socket) as pc:
        t0 = time.perf_counter()
        model = Decoder(cfg, device, top)
        cache = PagedCache(cfg, bt, top, device)
        sync(device)
        print("model and cache on %s in %.1f s; kvcd with host.size=%s%s" %
              (device, time.perf_counter() - t0, arena,
               " gpu.pool_size=" + arena if cuda else ""), flush=True)
        prompt = torch.randint(0, cfg.vocab, (top,), generator=torch.Generator().manual_seed(7))
        tokens = prompt.tolist()
        prompt = prompt.to(device)
        # The host tier: reservations and lookups without gpu=True (host slots, host hits,
        # never promoted into the pool, though the binding maps the pool for its first
        # device call); the pool: a client attached after opening its namespace, reserving
        # and looking up with gpu=True (pool slots and hits).
        nss = []
        for name, cl, gpu in [("host", hc, False)] + ([("pool", pc, True)] if cuda else []):
            ns = cl.namespace(cfg.model_id("-t%d-%s" % (bt, name)), cfg.layers, cfg.kv_heads,
                              cfg.head_dim, bt, "bf16")
            if gpu and cl.gpu_attach() != 1:
                print("SKIP: the pool rows: the daemon's GPU pool is not mapped here "
                      "(gpu_attach; the daemon's log: %s)" % d.log().strip()[-300:])
                continue
            nss.append((name, cl, ns, ns.paged_kv(cache.k_layers, cache.v_layers),
                        ns.keys_from_tokens(tokens)[:nblk], gpu))
        # The KV to store: the longest prompt's, computed (also the warm-up).
        model.forward(prompt, 0, cache)
        sync(device)
        blocks = cache.pages(nblk).permute(2, 0, 1, 3, 4, 5).contiguous()  # kvcd's layout
        for name, cl, ns, paged, keys, gpu in nss:
            if store(ns, paged, keys, cache.table, bt, gpu=gpu, device=device) != nblk:
                raise RuntimeError("%s: the store wrote fewer than %d blocks" % (name, nblk))
            cl.flush()
            where = []
            load(ns, paged, keys, cache.table, gpu=gpu, device=device, tiers=where)
            want = "gpu" if gpu else "host"
            if where != [want] * nblk:
                raise RuntimeError("%s: %d hits of %d, %d of them in the %s tier" %
                                   (name, len(where), nblk, where.count(want), want))
        flat = blocks.view(-1)
        src = torch.empty(flat.numel(), dtype=flat.dtype, pin_memory=cuda)
        src.copy_(flat)
        dst = torch.empty_like(flat)
        for n in sizes:
            m = (n - 1) // bt
            nel = m * cache.page_bytes // 2
            x, tail = prompt[:n], prompt[m * bt:n]
            t = {k: [] for k in ("nocache", "copy_h2d", "copy_d2d")}

            def nocache():
                t["nocache"].append(timed(device, lambda: model.forward(x, 0, cache)))

            def hit(name, ns, paged, keys, gpu):
                cache.pages(m).zero_()
                sync(device)
                held = []  # released after the forward, as the vLLM connector does
                st = []
                t0 = time.perf_counter()
                got = load(ns, paged, keys[:m], cache.table, gpu=gpu, device=device, held=held,
                           stamps=st)
                t1 = time.perf_counter()
                logits = model.forward(tail, m * bt, cache)
                sync(device)
                t2 = time.perf_counter()
                for lease in held:
                    lease.release()
                if got != m:
                    raise RuntimeError("%s: a short hit at %d tokens" % (name, n))
                if not torch.equal(cache.pages(m).permute(2, 0, 1, 3, 4, 5), blocks[:m]):
                    raise RuntimeError("%s: the pages got other bytes than were stored" % name)
                if not bool(torch.isfinite(logits).all()):
                    raise RuntimeError("%s: logits not finite after the hit" % name)
                t.setdefault(name + "_load", []).append(t1 - t0)
                if len(st) == 2:  # the load's parts: lookup, scatter queued, the wait
                    for part, dt in (("lookup", st[0] - t0), ("queue", st[1] - st[0]),
                                     ("wait", t1 - st[1])):
                        t.setdefault(name + "_load_" + part, []).append(dt)
                t.setdefault(name + "_prefill", []).append(t2 - t0)

            def copies():
                t["copy_h2d"].append(timed(device, lambda: dst[:nel].copy_(src[:nel],
                                                                          non_blocking=cuda)))
                if cuda:
                    t["copy_d2d"].append(timed(device, lambda: dst[:nel].copy_(flat[:nel])))

            steps = [nocache, copies] + [
                (lambda a: (lambda: hit(a[0], a[2], a[3], a[4], a[5])))(e) for e in nss]
            for rep in range(PREFILL_REPS + 1):  # the first is the warm-up
                for step in steps[rep % len(steps):] + steps[:rep % len(steps)]:
                    step()
                if rep == 0:
                    t = {k: [] for k in t}
            out[n] = (m * cache.page_bytes, t)
    return out


def main():
    ap = argparse.ArgumentParser(description="kvcd's Python package against the C path")
    ap.add_argument("out", nargs="?", default="build/bench/python.json")
    ap.add_argument("--cases", default=",".join(CASES),
                    help="comma-separated, of: %s (default: all)" % ", ".join(CASES))
    ap.add_argument("--append", action="store_true",
                    help="add the rows to OUT's (replacing those of the same case)")
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    if not cases or set(cases) - set(CASES):
        ap.error("--cases: some of %s" % ", ".join(CASES))
    out = args.out
    build = os.environ.get("KVC_BUILD", "build")
    rows = []

    def row(case, best, med, unit, base_name, base):
        rows.append(dict(case=case, value=best, unit=unit, baseline=base_name,
                         baseline_value=base, ratio=best / base))
        print("%-34s %9.3f %9.3f %-4s  %-16s %9.3f  ratio %.3f" %
              (case, best, med, unit, base_name, base, best / base), flush=True)

    if {"host", "paged", "sglang"} & set(cases):
        print("kvcd from Python (torch tensors) against the same calls in C (libkvc), the same "
              "daemon and buffers, alternating;\n%d MiB of blocks per case, 16 MiB per round "
              "trip, %d repetitions; best and median GB/s,\nratio = best Python / best C "
              "(target >= 0.9)\n" % (WS >> 20, REPS))
        print("%-34s %9s %9s %-4s  %-16s %9s" % ("case", "best", "median", "unit", "baseline",
                                                 "best"))
    if set(CASES[:4]) & set(cases):
        with PrivateDaemon(["host.size=1g", "host.prefault=yes"]) as d:
            with kvcd.Client(d.socket) as c:
                cpath = CPath(build, d.socket)

                def pair(name, t, key):
                    py, cc = t["py_" + key], t["c_" + key]
                    row(name, max(py), statistics.median(py), "GB/s", "C (libkvc)", max(cc))
                    print("%-34s %9s %9.3f (C median; median ratio %.3f)" %
                          ("", "", statistics.median(cc),
                           statistics.median(py) / statistics.median(cc)))

                if "host" in cases:
                    for size in SIZES:
                        t = host_case(c, cpath, size)
                        for op, key in (("get", "get"), ("put_prefix", "put")):
                            pair("%s_%s_python" % (op, size), t, key)
                devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
                if "paged" in cases:
                    for device in devices:
                        t = paged_case(c, cpath, device)
                        pair("scatter_paged_2MiB_%s_python" % device, t, "scatter")
                        if device == "cuda":
                            pair("get_cuda_tensor_2MiB_python", t, "get")
                    if "cuda" not in devices:
                        print("%-34s skipped: no CUDA device (the CUDA rows run on a GPU host)"
                              % "scatter_paged/get_cuda_tensor")
                if "sglang" in cases:
                    t = sglang_case(c, cpath, d.socket)
                    pair("sglang_batch_set_v1_64x2MiB", t, "set")
                    pair("sglang_batch_get_v1_64x2MiB", t, "get")
                cpath.close()
            if "engine" in cases:
                device = "cuda" if torch.cuda.is_available() else "cpu"
                print("\nreference engine on %s, default model, %d-token prompt, 16-token "
                      "blocks: prefill seconds, best of runs (median beside)" % (device, PROMPT))
                hit, nohit = engine_case(d.socket)
                case = "engine_prefill_%dtok_full_hit_%s" % (PROMPT, device)
                rows.append(dict(case=case, value=min(hit), unit="s",
                                 baseline="no cache", baseline_value=min(nohit),
                                 ratio=min(hit) / min(nohit)))
                print("%-34s %9.3f %9.3f s     %-16s %9.3f  speed-up %.1fx (medians %.1fx)" %
                      (case, min(hit), statistics.median(hit), "no cache", min(nohit),
                       min(nohit) / min(hit), statistics.median(nohit) / statistics.median(hit)))
    if "loadcpu" in cases:
        loadcpu_report(rows)
    if "loadstages" in cases:
        loadstages_report(rows)
    if "prefill" in cases:
        prefill_report(rows)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    if args.append and os.path.exists(out):
        with open(out) as f:
            mine = {r["case"] for r in rows}
            rows = [r for r in json.load(f) if r.get("case") not in mine] + rows
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)
    print("\nwrote %s" % out)
    return 0


def prefill_report(rows):
    device, tag, cfg, sizes = prefill_plan()
    if device != "cuda":
        print("\nSKIP: prefill_8b_{4096,16384}tok_* (8B-shaped model, host tier and GPU pool): "
              "no CUDA device (these rows run on a GPU host)")
    print("\n%s decoder (%d layers, %d wide, %d query / %d KV heads of %d, MLP %d, vocab %d; "
          "random bf16 weights) on %s, 16-token blocks, KV %d KiB a token.\nPrefill until the "
          "last token's logits; a full hit loads every full block but the last token's through "
          "kvcd (one lookup,\none scatter into the paged cache) and computes the rest. Load "
          "against a copy of the same bytes in the same run\n(target <= 1.1); prefill with the "
          "hit against no cache. Best and median seconds of %d runs after a warm-up." %
          (tag, cfg.layers, cfg.dim, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn_dim,
           cfg.vocab, device, cfg.kv_token_bytes() >> 10, PREFILL_REPS), flush=True)
    res = prefill_case(device, cfg, sizes)
    print("%-34s %9s %9s %-4s  %-16s %9s %9s" % ("case", "best", "median", "unit", "baseline",
                                                 "best", "median"))
    copy = {"host": ("copy_h2d", "pinned H2D copy" if device == "cuda" else "memcpy"),
            "pool": ("copy_d2d", "D2D copy")}
    for n in sizes:
        nbytes, t = res[n]
        for tier in ("host", "pool"):
            name = "%s_%dtok_%s" % (tag, n, tier)
            if tier + "_load" not in t:
                print("SKIP: load_%s_%s, prefill_%s_hit_%s: %s" %
                      (name, device, name, device, "no CUDA device (the daemon's GPU pool)"
                       if device != "cuda" else "the daemon's GPU pool is not mapped"))
                continue
            for case, val, (bkey, bname), what in (
                    ("load_%s_%s" % (name, device), t[tier + "_load"], copy[tier], "load"),
                    ("prefill_%s_hit_%s" % (name, device), t[tier + "_prefill"],
                     ("nocache", "no cache"), "prefill")):
                best, med = min(val), statistics.median(val)
                bbest, bmed = min(t[bkey]), statistics.median(t[bkey])
                rows.append(dict(case=case, value=best, unit="s", baseline=bname,
                                 baseline_value=bbest, ratio=best / bbest))
                if what == "load":
                    note = "ratio %.3f (medians %.3f); %.1f vs %.1f GB/s" % (
                        best / bbest, med / bmed, nbytes / best / 1e9, nbytes / bbest / 1e9)
                else:
                    note = "speed-up %.1fx (medians %.1fx)" % (bbest / best, bmed / med)
                print("%-34s %9.6f %9.6f s     %-16s %9.6f %9.6f  %s" %
                      (case, best, med, bname, bbest, bmed, note), flush=True)
                if what == "load" and tier + "_load_wait" in t:
                    # Where the load's time goes (not rows: their sum is the load's), and the
                    # copy beside the wait, whose part of the time the copy should be.
                    print("  %s: lookup %.1f, scatter queued %.1f, wait %.1f us (medians; "
                          "best %.1f, %.1f, %.1f); the copy %.1f us" % (
                              case, *(1e6 * statistics.median(t[tier + "_load_" + p])
                                      for p in ("lookup", "queue", "wait")),
                              *(1e6 * min(t[tier + "_load_" + p])
                                for p in ("lookup", "queue", "wait")), 1e6 * bmed), flush=True)


def fake_device():
    """The strict fake device of python/tests (kvtensors.FakeDevice), installed into this
    process's extension; None when its library is not built."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "python", "tests"))
    from kvtensors import FakeDevice, fakedev_path
    if not os.path.exists(fakedev_path()):
        return None
    dev = FakeDevice()
    dev.install()
    return dev


def load_lib():
    """The extension's own libkvc through ctypes (the same image, so the same device ops as
    the package's calls), its load calls typed."""
    lib = ctypes.CDLL(kvcd._kvcd.__file__)
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.kvc_connect.argtypes = [ctypes.c_char_p, vp]
    lib.kvc_ns_open.argtypes = [vp, vp, vp]
    lib.kvc_lookup.argtypes = [vp, vp, sz, ctypes.c_uint, vp]
    lib.kvc_lease_scatter.argtypes = [vp, sz, sz, vp, ctypes.c_uint64, vp, vp]
    lib.kvc_release.argtypes = [vp]
    lib.kvc_gpu_attach.argtypes = [vp]
    lib.kvc_disconnect.argtypes = [vp]
    return lib


def load_engine(cuda, dev, shape, pages, what):
    """Per-layer paged K and V tensors of `pages` pages of shape (layers, heads, dim,
    block_tokens), bf16, zeroed on the GPU or the fake device: (k tensors, v tensors, stream,
    wait, table, ckv), table the identity block table and ckv the same engine for the C path
    (a CPath.PagedKV; its arrays kept on it)."""
    layers, heads, dim, bt = shape
    if cuda:
        kv = torch.zeros(layers, 2, pages, bt, heads, dim, dtype=torch.bfloat16, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream

        def wait():
            torch.cuda.synchronize()
    else:
        kv = dev.empty((layers, 2, pages, bt, heads, dim), torch.bfloat16)
        stream = dev.stream()

        def wait():
            if dev.sync(stream):
                raise RuntimeError("%s: the fake device's stream failed" % what)
    kl, vl = [kv[i][0] for i in range(layers)], [kv[i][1] for i in range(layers)]
    table = list(range(pages))
    vp = ctypes.c_void_p
    ctable = (ctypes.c_int32 * pages)(*table)
    ck = (vp * layers)(*[t.data_ptr() for t in kl])
    cv = (vp * layers)(*[t.data_ptr() for t in vl])
    ckv = CPath.PagedKV(ctypes.cast(ck, vp), ctypes.cast(cv, vp), ctypes.cast(ctable, vp),
                        pages, bt, kl[0].stride()[0] * 2, kl[0].stride()[1] * 2,
                        kl[0].stride()[2] * 2, 1)
    ckv.keep = (ctable, ck, cv)
    return kl, vl, stream, wait, table, ckv


def load_prefix(pc, lib, d, name, shape, n, gpu, kv, what):
    """Namespace `name` of the daemon at d with a prefix of n blocks stored: host slots
    written from the CPU, or (gpu) pool slots gathered from the engine kv (load_engine's);
    and the same namespace opened by a C client on the extension's libkvc. Returns (ns,
    paged, keys, cc, cns, ckeys), cc to disconnect, or None when the daemon's GPU pool is not
    mapped here."""
    layers, heads, dim, bt = shape
    kl, vl, stream, _, table, _ = kv
    ns = pc.namespace(name, layers, heads, dim, bt, "bf16")
    if gpu and pc.gpu_attach() != 1:
        return None
    paged = ns.paged_kv(kl, vl)
    keys = ns.keys_from_tokens(range(n * bt))[:n]
    blk = torch.arange(layers * 2 * bt * heads * dim, dtype=torch.int16).view(torch.bfloat16)
    for j in range(0, n, 32):
        part = keys[j:j + 32]
        with ns.reserve(part, parent=keys[j - 1] if j else None, gpu=gpu) as r:
            if gpu:  # pool slots: gathered from the (zeroed) paged tensors
                r.gather(paged, None, table, first_token=j * bt, stream=stream)
            else:
                for i in range(len(part)):
                    r.write(i, blk)
    pc.flush()
    vp = ctypes.c_void_p
    cc = vp()
    if lib.kvc_connect(d.socket.encode(), ctypes.byref(cc)) < 0:
        raise RuntimeError("%s: kvc_connect failed" % what)
    lay = CPath.Layout(name.encode(), layers, heads, dim, bt, 2, 1)  # bf16, K+V
    cns = vp()
    attach = lib.kvc_gpu_attach(cc)  # 1: the pool mapped, 0: host copies
    if lib.kvc_ns_open(cc, ctypes.byref(lay), ctypes.byref(cns)) < 0 or attach < 0 or (
            gpu and attach != 1):
        raise RuntimeError("%s: the C path's namespace or pool" % what)
    ckeys = (ctypes.c_char * (16 * n)).from_buffer_copy(b"".join(keys))
    return ns, paged, keys, cc, cns, ckeys


def loadcpu_case(n, reps):
    """The calling thread's CPU seconds per block of lookup + scatter of n 8B-shaped blocks,
    Python against C on the same libkvc image and device. Returns (device, {tier: {"py":
    [...], "c": [...]}}) or (None, why)."""
    cuda = torch.cuda.is_available()
    dev = None if cuda else fake_device()
    if not cuda and dev is None:
        return None, "no CUDA device and no fake device library (make build/tests/check_python)"
    layers, heads, dim, bt = 32, 8, 128, 16
    bb = layers * 2 * bt * heads * dim * 2
    arena = "%dm" % ((n * bb * 5 // 4 >> 20) + 64)
    opts = ["host.size=" + arena, "quota.uid_reserved_share=100"] + (
        ["gpu.pool_size=" + arena] if cuda else [])
    lib = load_lib()
    vp = ctypes.c_void_p
    out = {}
    try:
        with PrivateDaemon(opts) as d, kvcd.Client(d.socket) as pc:
            kv = load_engine(cuda, dev, (layers, heads, dim, bt), n + 1, "loadcpu")
            _, _, stream, wait, table, ckv = kv
            for tier, gpu in (("host", False), ("pool", True))[:2 if cuda else 1]:
                pre = load_prefix(pc, lib, d, "bench/loadcpu-8b-" + tier,
                                  (layers, heads, dim, bt), n, gpu, kv, "loadcpu")
                if pre is None:
                    print("SKIP: load_cpu pool rows: the daemon's GPU pool is not mapped here")
                    continue
                ns, paged, keys, cc, cns, ckeys = pre
                t = {"py": [], "c": []}
                for rep in range(reps + 1):
                    for who in (("py", "c") if rep % 2 else ("c", "py")):
                        wait()
                        if who == "py":
                            t0 = time.thread_time()
                            lease = ns.lookup(keys, gpu=gpu)
                            got = lease.scatter(paged, None, table, stream=stream)
                            t1 = time.thread_time()
                            lease.release()
                        else:
                            lease = vp()
                            t0 = time.thread_time()
                            hits = lib.kvc_lookup(cns, ckeys, n, 4 if gpu else 0,
                                                  ctypes.byref(lease))
                            got = lib.kvc_lease_scatter(lease, 0, n, ctypes.byref(ckv), 0,
                                                        stream, None) if hits == n else hits
                            t1 = time.thread_time()
                            lib.kvc_release(lease)
                        wait()
                        if got != n:
                            raise RuntimeError("loadcpu: %s %s load of %d blocks: %d" %
                                               (who, tier, n, got))
                        if rep:
                            t[who].append((t1 - t0) / n)
                lib.kvc_disconnect(cc)
                out[tier] = t
    finally:
        if dev is not None:
            dev.uninstall()
    return ("cuda" if cuda else "fake"), out


def loadcpu_report(rows):
    n, reps = LOADCPU_BLOCKS, 3 if SMOKE else 9
    print("\nCPU time of the calling thread per block of a CUDA load (lookup + scatter into "
          "paged tensors,\n8B shape: 2 MiB blocks, %d blocks, 64 DMA ranges a block), Python "
          "against C on the same libkvc\nand device, alternating, %d repetitions; best and "
          "median us per block (target ratio <= 1.1)" % (n, reps), flush=True)
    device, res = loadcpu_case(n, reps)
    if device is None:
        print("SKIP: load_cpu_*: %s" % res)
        return
    for tier, t in res.items():
        case = "load_cpu_8b_%dblk_%s_%s" % (n, tier, device)
        py, cc = [x * 1e6 for x in t["py"]], [x * 1e6 for x in t["c"]]
        best, med, cbest, cmed = min(py), statistics.median(py), min(cc), statistics.median(cc)
        rows.append(dict(case=case, value=best, unit="us/block", baseline="C (libkvc)",
                         baseline_value=cbest, ratio=best / cbest))
        print("%-34s %9.3f %9.3f us/block  C (libkvc) %9.3f %9.3f  ratio %.3f (medians %.3f)" %
              (case, best, med, cbest, cmed, best / cbest, med / cmed), flush=True)


def loadstages_case(sizes, reps):
    """Wall seconds of each stage of one load of a prefix of n 8B-shaped blocks, n in sizes
    (prefill_case's shape and table: every page of the longest prompt's cache), one stage
    after another as the prefill rows run them: lookup, scatter (queued), the wait for the
    stream, release (the unpin; its wait finds the copies done). Python (Namespace.lookup,
    Lease.scatter of a PagedKV, Lease.release) against C (kvc_lookup, kvc_lease_scatter,
    kvc_release through the extension's libkvc, the same device), alternating. On a GPU the
    host tier and the pool, and the copy of the same bytes (pinned host to device; device to
    device) as the prefill rows time it; without one the strict fake device, host tier (its
    wait is the fake performing the copies on the CPU: not a device's time). Returns
    (device, {(tier, n): {stage: [seconds]}}) or (None, why)."""
    cuda = torch.cuda.is_available()
    dev = None if cuda else fake_device()
    if not cuda and dev is None:
        return None, "no CUDA device and no fake device library (make build/tests/check_python)"
    layers, heads, dim, bt = 32, 8, 128, 16
    bb = layers * 2 * bt * heads * dim * 2
    top = max(sizes)
    pages = top + 1
    arena = "%dm" % ((top * bb * 5 // 4 >> 20) + 64)
    opts = ["host.size=" + arena, "quota.uid_reserved_share=100"] + (
        ["gpu.pool_size=" + arena] if cuda else [])
    if os.environ.get("KVC_BENCH_POLICY"):
        opts.append("cache.policy=" + os.environ["KVC_BENCH_POLICY"])
    lib = load_lib()
    vp = ctypes.c_void_p
    out = {}
    tt = time.perf_counter
    try:
        with PrivateDaemon(opts) as d, kvcd.Client(d.socket) as pc:
            if os.environ.get("KVC_BENCH_DAEMON_CPU"):  # kvcd's loop thread (its main thread)
                os.sched_setaffinity(d.proc.pid, {int(os.environ["KVC_BENCH_DAEMON_CPU"])})
            if os.environ.get("KVC_BENCH_CLIENT_CPU"):  # this thread, the lookups' caller
                os.sched_setaffinity(0, {int(os.environ["KVC_BENCH_CLIENT_CPU"])})
            kv = load_engine(cuda, dev, (layers, heads, dim, bt), pages, "loadstages")
            _, _, stream, wait, table, ckv = kv
            copy = None
            if cuda:
                src = {"host": torch.empty(top * bb // 2, dtype=torch.bfloat16, pin_memory=True),
                       "pool": torch.empty(top * bb // 2, dtype=torch.bfloat16, device="cuda")}
                dst = torch.empty(top * bb // 2, dtype=torch.bfloat16, device="cuda")

                def copy(tier, n):
                    nel = n * bb // 2
                    wait()
                    t0 = tt()
                    dst[:nel].copy_(src[tier][:nel], non_blocking=True)
                    wait()
                    return tt() - t0
            for tier, gpu in (("host", False), ("pool", True))[:2 if cuda else 1]:
                pre = load_prefix(pc, lib, d, "bench/loadstages-8b-" + tier,
                                  (layers, heads, dim, bt), top, gpu, kv, "loadstages")
                if pre is None:
                    print("SKIP: load_stages pool rows: the daemon's GPU pool is not mapped here")
                    continue
                ns, paged, keys, cc, cns, ckeys = pre
                for n in sizes:
                    t = {}
                    for rep in range(reps + 1):
                        for who in (("py", "c") if rep % 2 else ("c", "py")):
                            wait()
                            if who == "py":
                                t0 = tt()
                                lease = ns.lookup(keys[:n], gpu=gpu)
                                t1 = tt()
                                got = lease.scatter(paged, None, table, stream=stream)
                                t2 = tt()
                                wait()
                                t3 = tt()
                                lease.release()
                                t4 = tt()
                            else:
                                lease = vp()
                                t0 = tt()
                                hits = lib.kvc_lookup(cns, ckeys, n, 4 if gpu else 0,
                                                      ctypes.byref(lease))
                                t1 = tt()
                                got = lib.kvc_lease_scatter(lease, 0, n, ctypes.byref(ckv), 0,
                                                            stream, None) if hits == n else hits
                                t2 = tt()
                                wait()
                                t3 = tt()
                                lib.kvc_release(lease)
                                t4 = tt()
                            if got != n:
                                raise RuntimeError("loadstages: %s %s load of %d blocks: %d" %
                                                   (who, tier, n, got))
                            if rep:
                                for stage, v in (("lookup", t1 - t0), ("scatter", t2 - t1),
                                                 ("wait", t3 - t2), ("release", t4 - t3),
                                                 ("fixed", t4 - t0 - (t3 - t2))):
                                    t.setdefault(who + "_" + stage, []).append(v)
                        if rep and copy:
                            t.setdefault("copy", []).append(copy(tier, n))
                    out[(tier, n)] = t
                lib.kvc_disconnect(cc)
    finally:
        if dev is not None:
            dev.uninstall()
    return ("cuda" if cuda else "fake"), out


def loadstages_report(rows):
    sizes = (64, 128) if SMOKE else (255, 1023)
    reps = 3 if SMOKE else 15
    print("\nOne load's stages, wall us (8B shape, 2 MiB blocks; prefixes of %s blocks, the "
          "prefill rows' 4k and 16k tokens):\nlookup, scatter (queued), wait (the stream), "
          "release (the unpin: its wait finds the copies done);\nfixed = all but the wait. "
          "Python against C on the same libkvc and device, alternating, %d repetitions;\nbest "
          "and median" % (" and ".join(str(s) for s in sizes), reps), flush=True)
    device, res = loadstages_case(sizes, reps)
    if device is None:
        print("SKIP: load_stages_*: %s" % res)
        return
    if device == "fake":
        print("(the fake device: its wait is the fake performing the copies on the CPU)")
    bound = ["%s=%s" % (k, os.environ[k]) for k in ("KVC_BENCH_DAEMON_CPU",
             "KVC_BENCH_CLIENT_CPU", "KVC_BENCH_POLICY") if os.environ.get(k)]
    if bound:
        print("(%s)" % ", ".join(bound))
    print("%-30s %-8s %10s %10s %10s %10s" % ("load", "stage", "py best", "py median",
                                               "C best", "C median"))
    for (tier, n), t in res.items():
        name = "load_stages_8b_%dblk_%s_%s" % (n, tier, device)
        for stage in ("lookup", "scatter", "wait", "release", "fixed"):
            py, cc = t["py_" + stage], t["c_" + stage]
            print("%-30s %-8s %10.1f %10.1f %10.1f %10.1f" %
                  (name, stage, min(py) * 1e6, statistics.median(py) * 1e6, min(cc) * 1e6,
                   statistics.median(cc) * 1e6))
        if "copy" in t:
            cp = t["copy"]
            print("%-30s %-8s %10.1f %10.1f" % (name, "copy", min(cp) * 1e6,
                                                statistics.median(cp) * 1e6))
            print("%-30s wait / copy: Python %.3f (medians %.3f), C %.3f (medians %.3f)" %
                  (name, min(t["py_wait"]) / min(cp),
                   statistics.median(t["py_wait"]) / statistics.median(cp),
                   min(t["c_wait"]) / min(cp), statistics.median(t["c_wait"]) /
                   statistics.median(cp)))
            rows.append(dict(case=name + "_wait", value=min(t["py_wait"]) * 1e6, unit="us",
                             baseline="copy", baseline_value=min(cp) * 1e6,
                             ratio=min(t["py_wait"]) / min(cp)))
        py, cc = t["py_fixed"], t["c_fixed"]
        rows.append(dict(case=name + "_fixed", value=min(py) * 1e6, unit="us",
                         baseline="C (libkvc)", baseline_value=min(cc) * 1e6,
                         ratio=min(py) / min(cc)))
        print("%-30s fixed: ratio %.3f (medians %.3f)" %
              (name, min(py) / min(cc), statistics.median(py) / statistics.median(cc)),
              flush=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:
        print("bench_python: %s" % e, file=sys.stderr)
        sys.exit(1)
