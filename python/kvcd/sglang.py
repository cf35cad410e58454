# DESIGN: kvcd as SGLang's HiCache L3 storage backend. Every SGLang instance on a node
# loads this class through its dynamic backend option and talks to the node's one kvcd, so
# a page computed by any instance is a hit for all of them; each instance's GPU pool (L1)
# and host pool (L2) stay its own.
#
# Interface followed (sgl-project/sglang, read at 001067fffe33, 2026; the hybrid
# controller at 00343773, the host pools at 0047d999):
# python/sglang/srt/mem_cache/hicache_storage.py (HiCacheStorage, HiCacheStorageConfig,
# HiCacheStorageExtraInfo, PoolName, PoolHitPolicy, PoolTransfer, PoolTransferResult),
# storage/backend_factory.py (a dynamic backend is built as cls(storage_config, {}), the
# host pool registered afterwards), managers/cache_controller.py and
# mem_cache/hybrid_cache/hybrid_cache_controller.py (how the prefetch and backup threads
# call a backend: the zero-copy batch_get_v1/batch_set_v1 only when extra_config has
# "interface_v1", each batch's extra_info.prefix_keys naming the pages before it, all()
# over batch_set_v1's answers, batch_exists_v2/batch_get_v2/batch_set_v2 for hybrid
# pools; sidecars riding another pool's indices), mem_cache/pool_host/ (the host pools'
# layouts) and observability/metrics_collector.py, metrics/collector.py before
# (StorageMetrics, which get_stats must return: StorageMetricsCollector asserts it).
#
# Mapping: an SGLang page is one kvcd block. Each host pool maps to kvcd namespaces named
# after the model, the ranks that change the bytes and the page's shape
# (sglang/<model>/<ranks>/<pool>-<dtype>-l<L>-h<H>-d<D>-p<P>): an MHA pool one namespace
# per TP rank ("tp<rank>-<size>"; with SGLang's tp_lcm_size / should_split_heads, one per
# slice of tp_lcm_size, so instances of different TP sizes share), an MLA or other
# rank-replicated pool one namespace for every rank ("mla": TP rank 0 writes, every rank
# reads), "-pp<r>-<n>" with pipeline parallelism and "-cp<r>-<n>" with context parallelism
# (each CP rank holds its own slice of a page). The attention-DP rank is not in the name:
# DP replicas hold the same heads, so their pages are equal and shared (two writers of one
# page meet in kvcd's reservation, and one writes it). A block is stored in kvcd's
# canonical layout, [layer][k/v][token][head][dim] (MLA: [layer][token][1][dim]), whatever
# the host pool's layout ("layer_first", "page_first", "page_first_direct", "page_head"):
# pages move with one strided copy inside libkvc (Lease.scatter / Reservation.gather over
# per-layer views of the pool), no staging and no per-page Python. Other pools (Mamba
# state, DSA indexer) are stored as the bytes of the pool's flat page. A page key (a string
# naming the whole prefix, as kvcd keys do) becomes a 128-bit kvcd key by BLAKE2b; a
# batch is one chain whose parent is extra_info.prefix_keys[-1].
#
# Threads: SGLang calls a backend from its prefetch, prefetch-IO and backup threads at
# once; each thread has its own kvcd connection (libkvc serialises the calls of one), and
# one that fails (kvcd restarted) is dropped and made again on the next call.
#
# Use (docs/engines.md): --hicache-storage-backend dynamic
#   --hicache-storage-backend-extra-config '{"backend_name": "kvcd",
#     "module_path": "kvcd.sglang", "class_name": "KvcdHiCacheStorage",
#     "interface_v1": 1, "socket": "/run/kvcd/kvcd.sock"}'
import errno
import hashlib
import logging
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch

import kvcd

try:  # SGLang's types when SGLang is installed; faithful local equivalents otherwise.
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except Exception:  # pragma: no cover - SGLang is not installed where kvcd is tested
    _Base = object
try:
    from sglang.srt.mem_cache.hicache_storage import PoolTransferResult
except Exception:

    @dataclass
    class PoolTransferResult:
        """SGLang's PoolTransferResult: the usable KV prefix and each pool's hits."""

        kv_hit_pages: int
        extra_pool_hit_pages: dict


try:  # where SGLang's collector takes it from: observability/ in newer trees
    from sglang.srt.observability.metrics_collector import StorageMetrics
except Exception:
    StorageMetrics = None
if StorageMetrics is None:
    try:
        from sglang.srt.metrics.collector import StorageMetrics
    except Exception:
        StorageMetrics = None
if StorageMetrics is None:

    @dataclass
    class StorageMetrics:
        """SGLang's StorageMetrics (metrics/collector.py): per-batch page counts and
        bandwidths (GB/s) since the last get_stats()."""

        prefetch_pgs: List[int] = field(default_factory=list)
        backup_pgs: List[int] = field(default_factory=list)
        prefetch_bandwidth: List[float] = field(default_factory=list)
        backup_bandwidth: List[float] = field(default_factory=list)
        prefetch_occupied_ratios: List[float] = field(default_factory=list)


log = logging.getLogger(__name__)

MODEL_ID_MAX = 127  # bytes of a kvcd model id (client/kvc.h)
KV = "kv"  # PoolName.KV
_RANK_REPLICATED_EXCEPT = ("mamba",)  # TP-sharded pools of rank-replicated (MLA) models
_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
# pools laid out like the KV pool (kvcd's canonical KV namespaces); others are stored as bytes
_KV_SHAPED = ("kv", "swa", "draft", "draft_swa")
_STATE_POOLS = ("mamba",)  # pools of recurrent state: kvcd namespaces of kind "state"
# Keys one reservation takes, and one lookup (libkvc: 2048 a request, 8 requests a lease).
# SGLang hands over as many pages as an operation has (page_size 1: one a token), so longer
# operations go in pieces of these, each after the one before it went whole.
_RESERVE_KEYS = 2048
_LOOKUP_KEYS = 8 * 2048
_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
# fp8 by name: older torch has no float8 dtypes (SGLang's pools then hold the bytes as uint8)
_FP8 = {"torch.float8_e4m3fn": "fp8_e4m3"}
# errnos after which this thread's connection is made again (kvcd restarted, the
# connection idled out, a namespace dropped by an admin)
_RECONNECT = {errno.EPIPE, errno.ECONNRESET, errno.ECONNREFUSED, errno.ENOENT,
              errno.ENOTCONN, errno.ETIMEDOUT}


def _name(pool_name):
    """A PoolName (a str enum) or a string as the plain string."""
    return str(getattr(pool_name, "value", pool_name))


def _policy(transfer):
    return _name(getattr(transfer, "hit_policy", "all_pages"))


def _key(key):
    return hashlib.blake2b(key.encode() if isinstance(key, str) else bytes(key),
                           digest_size=16).digest()


def _indices(host_indices):
    return host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)


def _kv_dtype(pool):
    """kvcd's dtype for a host pool, or NotImplementedError naming what to change. SGLang
    keeps fp8 KV in uint8 pools (the device pool's store_dtype) and says which fp8 in the
    device pool's dtype."""
    dt = getattr(pool, "dtype", None)
    if dt == torch.uint8:
        dt = getattr(getattr(pool, "device_pool", None), "dtype", None) or dt
    if dt in _DTYPES:
        return _DTYPES[dt]
    if str(dt) in _FP8:
        return _FP8[str(dt)]
    if str(dt) == "torch.float8_e5m2":
        raise NotImplementedError("kvcd.sglang: fp8_e5m2 KV is not a kvcd dtype; run SGLang "
                                  "with --kv-cache-dtype fp8_e4m3 (or bf16/fp16)")
    raise NotImplementedError("kvcd.sglang: host pool dtype %s is not one kvcd stores "
                              "(fp16, bf16, fp32, fp8_e4m3)" % (dt,))


class _PoolMap:
    """How one SGLang host pool maps to kvcd: the namespaces (one per shard: a slice of
    heads, or the whole page) and, for MHA/MLA pools, per-layer views [pages, page_tokens,
    heads, head_dim] of the pool's buffer that libkvc copies blocks to and from.

    kind: "mha" (K and V), "mla" (one latent, a K-only namespace) or "bytes" (the flat page
    as bytes, through the pool's get_data_page / set_from_flat_data_page)."""

    def __init__(self, name, pool, kind, page_size, shards, page_shape=None, heads=None,
                 replicated=False, nlayers=0, layout=None):
        self.name, self.pool, self.kind, self.page_size = name, pool, kind, page_size
        self.shards = shards  # [(model_id, namespace args)]
        self.page_shape = page_shape  # get_data_page(flat=False)'s shape, MHA/MLA
        self.heads = heads  # [(first head, end)] per shard, MHA
        self.replicated = replicated  # every rank holds the same bytes: rank 0 writes
        self.nlayers = nlayers
        self.layout = layout or getattr(pool, "layout", "layer_first")
        self.block_bytes = None
        self.state = False  # a kvcd "state" namespace: one lookup per key
        # page_head keeps a page's heads outside its tokens, which libkvc's paged copies do
        # not take: its pages move one strided torch copy each (canonical_page)
        self.per_page = self.layout == "page_head"
        self.pool_views = self.views_of_pool() if kind != "bytes" and not self.per_page \
            else None

    # Per-layer [pages, page_tokens, heads, dim] views, by layout; `s` the page-shaped
    # tensor: the whole pool buffer, or stacked flat pages (views_of_pages).
    def _layer_views(self, s, stacked):
        lay, P, L = self.layout, self.page_size, self.nlayers
        if self.kind == "mla":
            if stacked:
                sel = {"layer_first": lambda l: s[:, l], "page_first": lambda l: s[:, :, l],
                       "page_first_direct": lambda l: s[:, 0, l]}[lay]
            else:
                sel = {"layer_first": lambda l: s[l].unflatten(0, (-1, P)),
                       "page_first": lambda l: s[:, l].unflatten(0, (-1, P)),
                       "page_first_direct": lambda l: s[:, l]}[lay]
            return [[sel(l) for l in range(L)]], [None]
        if stacked:
            sel = {"layer_first": lambda kv, l: s[:, kv, l],
                   "page_first": lambda kv, l: s[:, kv, :, l],
                   "page_first_direct": lambda kv, l: s[:, kv, 0, l],
                   "page_head": lambda kv, l: s[:, kv, 0, :, :, l].transpose(1, 2),
                   "canonical": lambda kv, l: s[:, l, kv]}[lay]
        else:
            sel = {"layer_first": lambda kv, l: s[kv, l].unflatten(0, (-1, P)),
                   "page_first": lambda kv, l: s[kv, :, l].unflatten(0, (-1, P)),
                   "page_first_direct": lambda kv, l: s[kv, :, l],
                   "page_head": lambda kv, l: s[kv, :, :, :, l].transpose(1, 2),
                   "canonical": lambda kv, l: s[l, kv].unflatten(0, (-1, P))}[lay]
        ks, vs = [], []
        for h0, h1 in self.heads:
            ks.append([sel(0, l)[:, :, h0:h1] for l in range(L)])
            vs.append([sel(1, l)[:, :, h0:h1] for l in range(L)])
        return ks, vs

    def canonical_page(self, buf, page, shard):
        """[layer][k/v][token][head][dim] view of page number `page` of a page_head buffer
        [2][pages][heads][tokens][layers][dim], this shard's heads."""
        h0, h1 = self.heads[shard]
        return buf[:, page, h0:h1].permute(3, 0, 2, 1, 4)

    def views_of_pool(self):
        buf = self.pool.kv_buffer
        return list(zip(*self._layer_views(buf, False)))

    def views_of_pages(self, pages):
        """Views of flat pages (the pool's get_data_page(flat=True) order), stacked."""
        s = torch.stack([p.reshape(self.page_shape) for p in pages])
        if self.per_page:  # [n][2][1][H][P][L][D] as a page_head buffer [2][n][H][P][L][D]
            return s, s[:, :, 0].transpose(0, 1)
        return s, list(zip(*self._layer_views(s, True)))


class _CanonicalPool:
    """The host pool of a backend used without one: flat pages in kvcd's canonical order."""

    layout = "canonical"
    device_pool = None

    def __init__(self, buf, page_size):
        self.kv_buffer, self.page_size, self.dtype = buf, page_size, buf.dtype


class KvcdHiCacheStorage(_Base):
    """SGLang HiCacheStorage over kvcd (see the module's DESIGN comment).

    storage_config: SGLang's HiCacheStorageConfig. extra_config may name "socket" (default:
    kvcd.default_socket()), "interface_v1" (1: SGLang's controller takes the zero-copy
    batch_get_v1/batch_set_v1 path; without it SGLang copies every page twice more),
    "busy_wait_ms" (how long batch_set waits for a page another instance is writing, 500),
    "allocator" ("shm": SGLang's host pool in shared memory; any host memory works here),
    and, to use the class without a host pool, the page layout "layers", "kv_heads",
    "head_dim", "page_size", "dtype"."""

    def __init__(self, storage_config, mem_pool_host=None, **_kw):
        cfg = storage_config
        self.storage_config = cfg
        self.extra = dict(getattr(cfg, "extra_config", None) or {})
        self.socket = self.extra.get("socket")
        self.busy_wait = float(self.extra.get("busy_wait_ms", 500)) / 1e3
        self.interface_v1 = bool(self.extra.get("interface_v1", 0))
        self.is_mla = bool(getattr(cfg, "is_mla_model", False))
        self.tp_rank, self.tp_size = int(cfg.tp_rank), int(cfg.tp_size)
        self.pp_rank = int(getattr(cfg, "pp_rank", 0) or 0)
        self.pp_size = int(getattr(cfg, "pp_size", 1) or 1)
        self.cp_rank = int(getattr(cfg, "attn_cp_rank", 0) or 0)
        self.cp_size = int(getattr(cfg, "attn_cp_size", 1) or 1)
        self.dp_rank = int(getattr(cfg, "dp_rank", 0) or 0)
        self.tp_lcm = getattr(cfg, "tp_lcm_size", None)
        self.split = bool(getattr(cfg, "should_split_heads", False))
        if self.split and (not self.tp_lcm or self.tp_lcm % self.tp_size):
            raise ValueError("kvcd.sglang: should_split_heads needs a tp_lcm_size that is a "
                             "multiple of tp_size (got %r, %d)" % (self.tp_lcm, self.tp_size))
        self.model_name = getattr(cfg, "model_name", None) or "model"
        self.metrics_on = bool(getattr(cfg, "enable_storage_metrics", False))
        self.shm_pool = self.extra.get("allocator") == "shm"
        self.pools: Dict[str, _PoolMap] = {}
        self.mem_pool_host = None
        self.registered_pools = {}
        self._tls = threading.local()
        self._conns = []  # every thread's client, for close()
        self._lock = threading.Lock()
        self._counts = dict(get_pages=0, get_hits=0, set_pages=0, set_written=0,
                            set_present=0, set_busy=0, set_busy_late=0, set_orphan=0,
                            set_failed=0, exists_pages=0, exists_hits=0, errors=0)
        self._metrics = StorageMetrics()
        self._warned = set()
        self._closed = False
        self.long_model_ids = {}  # namespace model id -> the whole id it was cut from
        # SGLang's dynamic loader passes its kwargs dict where built-in backends get the pool
        # (StorageBackendFactory._create_dynamic_backend: backend_class(storage_config,
        # kwargs)); the pool then comes through register_mem_pool_host().
        if isinstance(mem_pool_host, dict):
            mem_pool_host = mem_pool_host.get("mem_pool_host")
        if mem_pool_host is not None:
            self.register_mem_pool_host(mem_pool_host)
        elif "layers" in self.extra:
            self._map_canonical()
        log.info("kvcd.sglang: %s tp %d/%d pp %d/%d cp %d/%d dp %d%s, interface_v1 %s",
                 self.model_name, self.tp_rank, self.tp_size, self.pp_rank, self.pp_size,
                 self.cp_rank, self.cp_size, self.dp_rank, " (rank-replicated)"
                 if self.is_mla else "", "on" if self.interface_v1 else
                 "OFF (SGLang copies each page twice more; set \"interface_v1\": 1)")

    # ---- names ------------------------------------------------------------------------

    def _ranks(self, tp_part):
        s = tp_part
        if self.pp_size > 1:
            s += "-pp%d-%d" % (self.pp_rank, self.pp_size)
        if self.cp_size > 1:
            s += "-cp%d-%d" % (self.cp_rank, self.cp_size)
        return s

    def _model_id(self, ranks, desc):
        """sglang/<model>/<ranks>/<desc>, at most MODEL_ID_MAX bytes: a longer model name is
        cut and followed by a hash of the whole id (logged with it)."""
        model = self.model_name.replace("/", "-")
        mid = "sglang/%s/%s/%s" % (model, ranks, desc)
        if len(mid.encode()) <= MODEL_ID_MAX:
            return mid
        h = hashlib.blake2b(mid.encode(), digest_size=8).hexdigest()
        tail = "~%s/%s/%s" % (h, ranks, desc)
        room = MODEL_ID_MAX - len("sglang/") - len(tail.encode())
        if room < 1:
            raise ValueError("kvcd.sglang: ranks and layout do not fit a model id: %r" % mid)
        cut = model.encode()[:room].decode(errors="ignore")
        short = "sglang/%s%s" % (cut, tail)
        log.info("kvcd.sglang: model id %r (%d bytes, over kvcd's %d) is namespace %r",
                 mid, len(mid.encode()), MODEL_ID_MAX, short)
        self.long_model_ids[short] = mid
        return short

    def _shards(self, replicated, heads, split=True):
        """[(ranks part of the name, (first head, end head))] of this rank's share."""
        if replicated:
            return [(self._ranks("mla"), (0, heads))]
        if self.split and split:
            f = self.tp_lcm // self.tp_size
            if heads % f:
                raise NotImplementedError("kvcd.sglang: %d heads do not split in %d (tp_lcm_size"
                                          " %d over tp_size %d)" % (heads, f, self.tp_lcm,
                                                                     self.tp_size))
            w = heads // f
            return [(self._ranks("tp%d-%d" % (self.tp_rank * f + i, self.tp_lcm)),
                     (i * w, (i + 1) * w)) for i in range(f)]
        return [(self._ranks("tp%d-%d" % (self.tp_rank, self.tp_size)), (0, heads))]

    # ---- host pools -------------------------------------------------------------------

    def _map_pool(self, name, pool):
        """The _PoolMap of an SGLang host pool, or NotImplementedError naming what to
        change. The KV pool and the pools shaped like it (SWA, draft) map to canonical KV
        namespaces; any other pool (Mamba state, DSA indexer) to the bytes of its page."""
        replicated = self.is_mla and name not in _RANK_REPLICATED_EXCEPT
        buf = getattr(pool, "kv_buffer", None)
        layout = getattr(pool, "layout", "layer_first")
        prefix = "" if name == KV else name + "-"
        if name in _KV_SHAPED:
            if not isinstance(buf, torch.Tensor):
                raise NotImplementedError("kvcd.sglang: a KV pool with K and V apart (head_dim "
                                          "!= v_head_dim) has no kvcd layout")
            if layout not in _LAYOUTS:
                raise NotImplementedError("kvcd.sglang: host pool layout %r (supported: %s; "
                                          "--hicache-mem-layout)" % (layout, ", ".join(_LAYOUTS)))
            P, dtype = int(pool.page_size), _kv_dtype(pool)
            if self.is_mla or hasattr(pool, "kv_lora_rank"):
                return self._map_mla(name, pool, buf, layout, P, dtype, prefix)
            return self._map_mha(name, pool, buf, layout, P, dtype, prefix)
        for f in ("get_data_page", "set_from_flat_data_page", "get_dummy_flat_data_page"):
            if not hasattr(pool, f):
                raise NotImplementedError("kvcd.sglang: host pool %r has no %s()" % (name, f))
        dummy = pool.get_dummy_flat_data_page()
        nbytes = dummy.numel() * dummy.element_size()
        L, H, D = self._bytes_shape(nbytes)
        if name in _STATE_POOLS:
            # A recurrent state taken at the end of the page it is stored under: kvcd's state
            # kind, whose lookup answers with the longest prefix that has one.
            P = int(getattr(self.pools.get(KV), "page_size", 1) or 1)
            desc = "%sstate-%d" % (prefix, nbytes)
            args = dict(layers=L, kv_heads=H, head_dim=D, block_tokens=P, dtype="int8",
                        kind="state")
        else:
            desc = "%sbytes-%d" % (prefix, nbytes)
            args = dict(layers=L, kv_heads=H, head_dim=D, block_tokens=1, dtype="int8",
                        k_only=True)
        shards = [(self._model_id(r, desc), args)
                  for r, _ in self._shards(replicated, 1, split=False)]
        m = _PoolMap(name, pool, "bytes", int(getattr(pool, "page_size", 1) or 1), shards,
                     replicated=replicated)
        m.state = name in _STATE_POOLS
        return m

    def _map_mla(self, name, pool, buf, layout, P, dtype, prefix):
        # [layer][token][1][dim], [token][layer][1][dim] or [page][layer][P][1][dim]
        if layout == "page_head" or buf.dim() != (5 if layout == "page_first_direct" else 4):
            raise NotImplementedError("kvcd.sglang: an MLA pool in layout %r of %d dimensions "
                                      "(layer_first, page_first and page_first_direct are "
                                      "supported)" % (layout, buf.dim()))
        L = buf.shape[1] if layout in ("page_first", "page_first_direct") else buf.shape[0]
        H, D = buf.shape[-2], buf.shape[-1]
        if H != 1:
            raise NotImplementedError("kvcd.sglang: an MLA pool of %d heads" % H)
        page_shape = {"layer_first": (L, P, 1, D), "page_first": (P, L, 1, D),
                      "page_first_direct": (1, L, P, 1, D)}[layout]
        desc = "%s%s-l%d-h1-d%d-p%d-mla" % (prefix, dtype, L, D, P)
        shards = [(self._model_id(r, desc), dict(layers=L, kv_heads=1, head_dim=D,
                                                 block_tokens=P, dtype=dtype, k_only=True))
                  for r, _ in self._shards(True, 1)]
        return _PoolMap(name, pool, "mla", P, shards, page_shape, [(0, 1)], True, L)

    def _map_mha(self, name, pool, buf, layout, P, dtype, prefix):
        if buf.dim() != (6 if layout in ("page_first_direct", "page_head") else 5) or \
                buf.shape[0] != 2:
            raise NotImplementedError("kvcd.sglang: an MHA pool in layout %r of shape %s"
                                      % (layout, tuple(buf.shape)))
        # [2] + layer_first [L][T][H][D], page_first [T][L][H][D], page_first_direct
        # [pages][L][P][H][D], page_head [pages][H][P][L][D]
        dims = {"layer_first": (1, 3, 4), "page_first": (2, 3, 4),
                "page_first_direct": (2, 4, 5), "page_head": (4, 2, 5)}[layout]
        L, H, D = (int(buf.shape[i]) for i in dims)
        page_shape = {"layer_first": (2, L, P, H, D), "page_first": (2, P, L, H, D),
                      "page_first_direct": (2, 1, L, P, H, D),
                      "page_head": (2, 1, H, P, L, D)}[layout]
        shards, heads = [], []
        for r, (h0, h1) in self._shards(False, H):
            desc = "%s%s-l%d-h%d-d%d-p%d" % (prefix, dtype, L, h1 - h0, D, P)
            shards.append((self._model_id(r, desc),
                           dict(layers=L, kv_heads=h1 - h0, head_dim=D, block_tokens=P,
                                dtype=dtype)))
            heads.append((h0, h1))
        return _PoolMap(name, pool, "mha", P, shards, page_shape, heads, False, L)

    @staticmethod
    def _bytes_shape(n):
        """layers x heads x dim = n bytes within kvcd's bounds (4096, 4096, 65536)."""
        d = next(x for x in range(min(n, 65536), 0, -1) if n % x == 0)
        rest = n // d
        h = next(x for x in range(min(rest, 4096), 0, -1) if rest % x == 0)
        if rest // h > 4096:
            raise NotImplementedError("kvcd.sglang: a page of %d bytes has no kvcd layout" % n)
        return rest // h, h, d

    def _map_canonical(self):
        """No host pool: pages are flat tensors in kvcd's canonical layout (extra_config's
        "layers", "kv_heads", "head_dim", "page_size", "dtype")."""
        e = self.extra
        L, H, D, P = (int(e[k]) for k in ("layers", "kv_heads", "head_dim", "page_size"))
        dtype = e.get("dtype", "fp16")
        tdt = {v: k for k, v in _DTYPES.items()}.get(dtype, torch.uint8)
        pool = _CanonicalPool(torch.empty((L, 2, P, H, D), dtype=tdt), P)
        shards, heads = [], []
        for r, (h0, h1) in self._shards(False, H):
            desc = "%s-l%d-h%d-d%d-p%d" % (dtype, L, h1 - h0, D, P)
            shards.append((self._model_id(r, desc), dict(layers=L, kv_heads=h1 - h0,
                                                         head_dim=D, block_tokens=P,
                                                         dtype=dtype)))
            heads.append((h0, h1))
        self.pools[KV] = _PoolMap(KV, pool, "mha", P, shards, (L, 2, P, H, D), heads, False, L,
                                  "canonical")

    def register_mem_pool_host(self, mem_pool_host):
        """Binds the instance's host pool (SGLang's HostKVCache: MHA or MLA, any layout)
        and maps it to its namespaces; NotImplementedError names what SGLang must change."""
        m = self._map_pool(KV, mem_pool_host)
        self.mem_pool_host = mem_pool_host
        self.pools[KV] = m
        self.registered_pools[KV] = mem_pool_host
        if self.shm_pool:
            log.info("kvcd.sglang: host pool in shared memory (allocator shm); kvcd copies "
                     "between it and its arena as from any host memory")

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """Binds a hybrid model's extra host pool (PoolName: "mamba", "swa", "indexer",
        ...) for the v2 calls."""
        name = _name(host_pool_name)
        self.registered_pools[name] = host_pool
        if name == KV:
            return self.register_mem_pool_host(host_pool)
        self.pools[name] = self._map_pool(name, host_pool)

    # ---- connections ------------------------------------------------------------------

    def _conn(self):
        c = getattr(self._tls, "client", None)
        if c is None:
            if self._closed:
                raise ValueError("kvcd.sglang: the backend is closed")
            c = self._tls.client = kvcd.Client(self.socket)
            self._tls.ns = {}
            with self._lock:
                self._conns.append(c)
        return c

    def _ns(self, m, shard):
        c = self._conn()
        mid, args = m.shards[shard]
        ns = self._tls.ns.get(mid)
        if ns is None:
            ns = self._tls.ns[mid] = (c.namespace_kind(mid, **args) if "kind" in args
                                      else c.namespace(mid, **args))
            m.block_bytes = ns.block_bytes
        return ns

    def _failed(self, what, e):
        """A kvcd error inside one of SGLang's storage threads: logged (once per kind and
        errno), counted, and this thread's connection made again when it is gone."""
        with self._lock:
            self._counts["errors"] += 1
            first = (what, e.errno) not in self._warned
            self._warned.add((what, e.errno))
        if first:
            log.warning("kvcd.sglang: %s failed (%s)", what, e.strerror)
        if e.errno in _RECONNECT:
            c = getattr(self._tls, "client", None)
            self._tls.client, self._tls.ns = None, {}
            if c is not None:
                c.close()

    def _count(self, **kw):
        with self._lock:
            for k, v in kw.items():
                self._counts[k] += v

    def _metric(self, kind, pages, nbytes, secs):
        if not self.metrics_on or pages <= 0:
            return
        with self._lock:
            getattr(self._metrics, kind + "_pgs").append(pages)
            getattr(self._metrics, kind + "_bandwidth").append(nbytes / max(secs, 1e-9) / 1e9)

    def _pool(self, name):
        m = self.pools.get(name)
        if m is None:
            raise RuntimeError("kvcd.sglang: no host pool %r registered (and no layout in "
                               "extra_config)" % name)
        return m

    # ---- the three moves: exists, load, store ------------------------------------------

    def _exists(self, m, kb):
        """Leading keys cached in memory now, over every shard: a ready-only lookup, which
        neither the daemon nor libkvc holds for disk reads (SGLang asks from its prefetch
        thread). Pages on disk after that run are not counted; their reads start, so a
        later request finds them in memory. In lookups of _LOOKUP_KEYS keys at most."""
        done = 0
        while done < len(kb):
            c = n = min(len(kb) - done, _LOOKUP_KEYS)
            for s in range(len(m.shards)):
                if n == 0:
                    break
                with self._ns(m, s).lookup(kb[done:done + n], ready_only=True) as lease:
                    n = min(n, len(lease))
            done += n
            if n < c:
                break
        return done

    def _table(self, m, idx, npages):
        P = m.page_size
        return [int(idx[i * P]) // P for i in range(npages)]

    def _load(self, m, kb, idx, views=None):
        """Loads the cached leading run of kb into the pool pages at idx[i * page_size]
        (or into `views`, page i at block table entry i); returns the pages loaded. In
        lookups of _LOOKUP_KEYS keys at most, each after the one before it loaded whole."""
        done, P = 0, m.page_size
        while done < len(kb):
            c = min(len(kb) - done, _LOOKUP_KEYS)
            got = self._load_run(m, kb[done:done + c],
                                 idx[done * P:] if idx is not None else None, views, done)
            done += got
            if got < c:
                break
        return done

    def _load_run(self, m, kb, idx, views, off):
        """_load of one lookup's keys: page i of kb is page off + i of the operation."""
        leases = []
        try:
            n = len(kb)
            for s in range(len(m.shards)):
                if n == 0:
                    break
                leases.append(self._ns(m, s).lookup(kb[:n]))
                n = min(n, len(leases[-1]))
            if n == 0:
                return 0
            if m.kind == "bytes" and m.state:
                # A state lookup answers with the last state of the keys: each key alone.
                ns = self._ns(m, 0)
                for lease in leases:
                    lease.release()
                leases = []
                for i in range(len(kb)):
                    leases.append(ns.lookup(kb[i:i + 1]))
                    if len(leases[-1]) == 0:
                        return i
                    page = m.pool.get_dummy_flat_data_page()
                    leases[-1].copy_into(0, page)
                    m.pool.set_from_flat_data_page(int(idx[i * m.page_size]), page)
                return len(kb)
            if m.kind == "bytes":
                lease = leases[0]
                for i in range(n):
                    page = m.pool.get_dummy_flat_data_page()
                    lease.copy_into(i, page)
                    m.pool.set_from_flat_data_page(int(idx[i * m.page_size]), page)
                return n
            if m.per_page:
                buf = m.pool.kv_buffer if views is None else views
                table = self._table(m, idx, n) if views is None else list(range(off, off + n))
                for s, lease in enumerate(leases):
                    for i in range(n):
                        self._load_page(m, lease, i, m.canonical_page(buf, table[i], s))
                return n
            if views is None:
                views, table = m.pool_views, self._table(m, idx, n)
            else:
                table = list(range(off, off + n))
            for lease, (kc, vc) in zip(leases, views):
                lease.scatter(kc, vc, table, n=n)
            return n
        finally:
            for lease in leases:
                lease.release()

    def _load_page(self, m, lease, i, dst):
        shape = dst.shape
        if lease.stored(i) == "raw":
            mv = lease[i]
            with warnings.catch_warnings():  # a read-only view, only read
                warnings.simplefilter("ignore", UserWarning)
                src = torch.frombuffer(mv, dtype=dst.dtype).view(shape)
            dst.copy_(src)
            del src
            mv.release()
        else:
            st = torch.empty(shape, dtype=dst.dtype)
            lease.copy_into(i, st)
            dst.copy_(st)

    def _store(self, m, kb, idx, parent, views=None):
        """Stores pages as one chain under parent; one bool per key, every shard's."""
        if m.replicated and self.tp_rank != 0:
            return [True] * len(kb)  # TP rank 0 writes the bytes every rank holds
        if views is None and m.kind != "bytes":
            views, table = m.pool_views, self._table(m, idx, len(kb))
        else:
            table = list(range(len(kb)))
        ok = [True] * len(kb)
        for s in range(len(m.shards)):
            if m.per_page:  # the page_head buffer itself (or the stacked pages)
                view = m.pool.kv_buffer if views is None else views
            else:
                view = views[s] if views else None
            r = self._store_shard(m, s, kb, idx, parent, view, table)
            ok = [a and b for a, b in zip(ok, r)]
        return ok

    def _store_shard(self, m, s, kb, idx, parent, view, table):
        ns = self._ns(m, s)
        n, P = len(kb), m.page_size
        ok = [False] * n
        i, deadline, pause = 0, None, 0.0005
        while i < n:
            with ns.reserve(kb[i:i + _RESERVE_KEYS], parent=parent) as r:
                st = r.statuses
                if r.reserved:
                    if m.kind == "bytes":
                        for j, x in enumerate(st):
                            if x == kvcd.SLOT_RESERVED:
                                page = m.pool.get_data_page(int(idx[(i + j) * P]), flat=True)
                                r.write(j, page.contiguous().view(torch.uint8))
                    elif m.per_page:
                        for j, x in enumerate(st):
                            if x == kvcd.SLOT_RESERVED:
                                mv = r[j]
                                slot = torch.frombuffer(mv, dtype=view.dtype)
                                slot.view(m.canonical_page(view, table[i + j], s).shape).copy_(
                                    m.canonical_page(view, table[i + j], s))
                                del slot
                                mv.release()  # commit refuses while a slot view is alive
                    else:
                        r.gather(view[0], view[1], table, first_token=i * P)
            j = 0
            while j < len(st) and st[j] in (kvcd.SLOT_PRESENT, kvcd.SLOT_RESERVED):
                ok[i + j] = True
                j += 1
            self._count(set_written=sum(x == kvcd.SLOT_RESERVED for x in st[:j]),
                        set_present=sum(x == kvcd.SLOT_PRESENT for x in st[:j]))
            if j:
                i, parent, deadline = i + j, kb[i + j - 1], None
                continue
            if st[0] == kvcd.SLOT_BUSY:
                # Another instance is writing this page now: wait for its commit, then go on
                # from it; one that takes longer than busy_wait is reported stored (present
                # soon) and the chain goes on as a new root.
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.busy_wait
                    self._count(set_busy=1)
                if now < deadline:
                    time.sleep(pause)
                    pause = min(pause * 2, 0.02)
                    continue
                self._count(set_busy_late=1)
                ok[i] = True
                i, parent, deadline = i + 1, None, None
                continue
            if st[0] == kvcd.SLOT_SKIPPED and parent is not None:
                # The parent is not cached (evicted, or stored before this backend wrote
                # here): SGLang looks pages up from the end of its own cached prefix, so the
                # chain is worth storing as a root.
                self._count(set_orphan=1)
                parent = None
                continue
            break  # no room (everything pinned), or no slot could be made
        self._count(set_failed=n - sum(ok))
        return ok

    # ---- zero-copy batch interface (host pool) ----------------------------------------

    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        """Length of the leading run of keys cached in kvcd's memory now (a lookup that
        never waits; reads of the pages on disk after that run start)."""
        if not keys:
            return 0
        m = self._pool(KV)
        try:
            n = self._exists(m, [_key(k) for k in keys])
        except kvcd.Error as e:
            self._failed("batch_exists", e)
            n = 0
        self._count(exists_pages=len(keys), exists_hits=n)
        return n

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info=None) -> List[bool]:
        """Loads the cached leading run of keys into the host pool pages at
        host_indices[i * page_size]; True for each page loaded."""
        if not keys:
            return []
        m = self._pool(KV)
        idx = _indices(host_indices)
        if len(idx) < len(keys) * m.page_size:
            log.error("kvcd.sglang: batch_get_v1: %d host indices for %d pages of %d",
                      len(idx), len(keys), m.page_size)
            return [False] * len(keys)
        t0 = time.perf_counter()
        try:
            hits = self._load(m, [_key(k) for k in keys], idx)
        except kvcd.Error as e:
            self._failed("batch_get_v1", e)
            hits = 0
        self._count(get_pages=len(keys), get_hits=hits)
        self._metric("prefetch", hits, hits * (m.block_bytes or 0) * len(m.shards),
                     time.perf_counter() - t0)
        return [True] * hits + [False] * (len(keys) - hits)

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info=None) -> List[bool]:
        """Stores the host pool pages at host_indices[i * page_size] under keys, one chain
        after extra_info.prefix_keys[-1]. A page cached already, or being written by
        another instance (kvcd makes one writer of a page), counts as stored."""
        if not keys:
            return []
        m = self._pool(KV)
        idx = _indices(host_indices)
        if len(idx) < len(keys) * m.page_size:
            log.error("kvcd.sglang: batch_set_v1: %d host indices for %d pages of %d",
                      len(idx), len(keys), m.page_size)
            return [False] * len(keys)
        t0 = time.perf_counter()
        try:
            ok = self._store(m, [_key(k) for k in keys], idx, self._parent(extra_info))
        except kvcd.Error as e:
            self._failed("batch_set_v1", e)
            ok = [False] * len(keys)
        self._count(set_pages=len(keys))
        self._metric("backup", sum(ok), sum(ok) * (m.block_bytes or 0) * len(m.shards),
                     time.perf_counter() - t0)
        return ok

    @staticmethod
    def _parent(extra_info):
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        return _key(prefix[-1]) if prefix else None

    # ---- hybrid pools (v2) --------------------------------------------------------------

    def batch_exists_v2(self, keys: List[str], pool_transfers=None,
                        extra_info=None) -> PoolTransferResult:
        """The usable KV prefix under each pool's hit policy (SGLang's batch_exists_v2):
        "all_pages" pools must hold every page of it, "trailing_pages" pools the last
        len(transfer.keys) pages before its end; the prefix is the shortest of them. A
        sidecar riding another extra pool's indices (indices_from_pool: the draft SWA pool
        on the SWA pool's) holds the pages its source holds, so its source's policy and
        keys are what it must have."""
        kb = [_key(k) for k in keys]
        sources = {_name(t.name): t for t in pool_transfers or []
                   if getattr(t, "indices_from_pool", None) is None}
        try:
            kv = self._exists(self._pool(KV), kb) if kb else 0
            hits = {KV: kv} if kv else {}
            final = kv
            for t in pool_transfers or []:
                if final == 0:
                    break
                m = self._pool(_name(t.name))
                src = getattr(t, "indices_from_pool", None)
                ref = sources.get(_name(src), t) if src is not None and _name(src) != KV \
                    else t
                if _policy(ref) == "all_pages":
                    b = self._exists(m, kb[:kv])
                elif m.state and (len(ref.keys) if ref.keys else 1) == 1:
                    # The state of the longest prefix of the KV hit that has one: one lookup
                    # (of the last keys a lease takes).
                    lo = max(0, kv - _LOOKUP_KEYS)
                    with self._ns(m, 0).lookup(kb[lo:kv], ready_only=True) as lease:
                        b = lo + lease.first + 1 if len(lease) else 0
                else:
                    w, b = max(1, len(ref.keys) if ref.keys else 1), 0
                    for end in range(kv, 0, -1):
                        lo = max(0, end - w)
                        if self._exists(m, kb[lo:end]) == end - lo:
                            b = end
                            break
                if b:
                    hits[t.name] = b
                final = min(final, b)
        except kvcd.Error as e:
            self._failed("batch_exists_v2", e)
            return PoolTransferResult(0, {})
        self._count(exists_pages=len(keys), exists_hits=final)
        return PoolTransferResult(final, hits)

    def _v2(self, transfers, extra_info, load):
        results = {}
        for t in transfers:
            name = _name(t.name)
            m = self._pool(name)
            keys = list(t.keys or [])
            idx = _indices(t.host_indices) if t.host_indices is not None else []
            if len(idx) != len(keys) * m.page_size:
                log.error("kvcd.sglang: %s %s: %d host indices for %d pages of %d",
                          "batch_get_v2" if load else "batch_set_v2", name, len(idx),
                          len(keys), m.page_size)
                results[t.name] = [False] * len(keys)
                continue
            if not keys:
                results[t.name] = []
                continue
            kb = [_key(k) for k in keys]
            try:
                if load:
                    n = self._load(m, kb, idx)
                    results[t.name] = [True] * n + [False] * (len(kb) - n)
                else:
                    parent = self._parent(extra_info) if _policy(t) == "all_pages" else None
                    results[t.name] = self._store(m, kb, idx, parent)
            except kvcd.Error as e:
                self._failed("batch_get_v2" if load else "batch_set_v2", e)
                results[t.name] = [False] * len(keys)
        return results

    def batch_get_v2(self, transfers, extra_info=None) -> Dict[str, List[bool]]:
        """Loads each PoolTransfer's keys into its pool at its host_indices; per pool one
        bool per key (the leading run found)."""
        return self._v2(transfers, extra_info, True)

    def batch_set_v2(self, transfers, extra_info=None) -> Dict[str, List[bool]]:
        """Stores each PoolTransfer's pages under its keys; per pool one bool per key."""
        return self._v2(transfers, extra_info, False)

    # ---- value interface (flat pages in the pool's order) -----------------------------

    def _note_generic(self):
        if "generic" not in self._warned:
            self._warned.add("generic")
            log.warning("kvcd.sglang: SGLang calls the copying batch_get/batch_set: add "
                        "\"interface_v1\": 1 to --hicache-storage-backend-extra-config")

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Optional[torch.Tensor]:
        """The flat page of key (into target_location when given), or None."""
        r = self.batch_get([key], [target_location] if target_location is not None else None)
        return r[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[torch.Tensor]]:
        if not keys:
            return []
        self._note_generic()
        m = self._pool(KV)
        out = [None] * len(keys)
        if target_locations is None:
            dtype = getattr(m.pool, "dtype", torch.float16)
            target_locations = [torch.empty(int(torch.Size(m.page_shape).numel()),
                                            dtype=dtype) for _ in keys]
        try:
            s, views = m.views_of_pages(target_locations)
            hits = self._load(m, [_key(k) for k in keys], None, views)
            for i in range(hits):
                target_locations[i].view(-1).copy_(s[i].reshape(-1))
                out[i] = target_locations[i]
        except kvcd.Error as e:
            self._failed("batch_get", e)
            hits = 0
        self._count(get_pages=len(keys), get_hits=hits)
        return out

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Stores flat pages (get_data_page(flat=True) order) under keys (SGLang passes
        no prefix here: the chain starts at the first key); True when every one is
        cached or being written."""
        if not keys:
            return True
        self._note_generic()
        m = self._pool(KV)
        if values is None:
            values = target_locations
        try:
            _, views = m.views_of_pages(values)
            ok = self._store(m, [_key(k) for k in keys], None, None, views)
        except kvcd.Error as e:
            self._failed("batch_set", e)
            ok = [False]
        self._count(set_pages=len(keys))
        return all(ok)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ---- housekeeping -----------------------------------------------------------------

    def namespaces(self):
        """The kvcd model ids this backend reads and writes, by pool."""
        return {name: [mid for mid, _ in m.shards] for name, m in self.pools.items()}

    def clear(self) -> bool:
        """Evicts the pages of this backend's namespaces (every instance's: the pages of a
        namespace are shared). kvcd lets only its admins evict (root, its user, members of
        server.admin_group): for anyone else this refuses, logs what to do, and returns
        False."""
        done = True
        for m in self.pools.values():
            for s in range(len(m.shards)):
                ns = None
                try:
                    ns = self._ns(m, s)
                    self._conn().evict(ns.id)
                except kvcd.Error as e:
                    if e.errno == errno.EPERM:
                        log.warning("kvcd.sglang: clear refused: evicting kvcd pages is for "
                                    "kvcd's admins; run `kvcctl evict %d` (namespace %s) as "
                                    "one, or add this user to kvcd's server.admin_group",
                                    ns.id, m.shards[s][0])
                        return False
                    self._failed("clear", e)
                    done = False
        return done

    def get_stats(self):
        """SGLang's StorageMetrics since the last call (SGLang calls this every scheduler
        step when storage metrics are on): pages and GB/s of each batch_get_v1 and
        batch_set_v1. No round trip."""
        with self._lock:
            m, self._metrics = self._metrics, StorageMetrics()
        return m

    def stats(self):
        """This backend's page counts, and kvcd's counters of its KV namespace (kvcd_*)."""
        with self._lock:
            s = dict(self._counts)
        m = self.pools.get(KV)
        if m is not None:
            try:
                ns = self._ns(m, 0)
                s.update(("kvcd_" + k, v) for k, v in self._conn().stats(ns.id).items())
            except kvcd.Error as e:
                self._failed("stats", e)
        return s

    def close(self):
        self._closed = True
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            c.close()
