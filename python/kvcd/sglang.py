# DESIGN: kvcd as SGLang's HiCache L3 storage backend. Every SGLang instance on a node
# loads this class through its dynamic backend option and talks to the node's one kvcd, so
# a page computed by any instance is a hit for all of them; each instance's GPU pool (L1)
# and host pool (L2) stay its own.
#
# Interface followed: HiCacheStorage in python/sglang/srt/mem_cache/hicache_storage.py of
# sgl-project/sglang as read at commit 001067fffe33 (2026): get/set/exists,
# batch_get/batch_set/batch_exists, the zero-copy batch_get_v1/batch_set_v1 over the host
# pool (HostKVCache: get_data_page, set_from_flat_data_page, kv_buffer of the MHA pool in
# the "layer_first" [2][layer][token][head][dim] or "page_first" [2][token][layer][head][dim]
# layout), register_mem_pool_host, clear, get_stats; constructor (storage_config,
# mem_pool_host=None), or (storage_config, kwargs) as its dynamic backend loader calls it.
# The v2 pool-transfer calls (hybrid models) are not implemented.
#
# Mapping: one kvcd namespace per model, TP/PP rank and page layout (layers, kv heads, head
# dim, page_size tokens, dtype), as SGLang's own file backend suffixes its keys; an SGLang
# page is one kvcd block, stored in kvcd's canonical layout [layer][k/v][token][head][dim]
# so that kvcd's codecs and other engines read it right. A page key (a string naming the
# whole prefix, as kvcd keys do) becomes a 128-bit kvcd key by BLAKE2b; a batch is one
# chain (parent = the previous page's key, from extra_info.prefix_keys when given).
# Copies: no SGLang MHA layout holds a page contiguously in the canonical order (K and V
# are apart), so the v1 calls copy once, strided, between the pool's page view and the
# block inside kvcd's shared arena (a lease's or a reservation slot's view, no staging); a
# hit the daemon stored quantized is decoded by libkvc into a staging block first.
#
# Use: --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
#   '{"backend_name": "kvcd", "module_path": "kvcd.sglang",
#     "class_name": "KvcdHiCacheStorage", "socket": "/run/kvcd/kvcd.sock"}'
import hashlib
import logging
import threading
import warnings
from typing import Any, List, Optional

import torch

import kvcd

try:  # SGLang's abstract base when SGLang is installed; the class stands alone otherwise.
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except Exception:  # pragma: no cover - SGLang is not installed where kvcd is tested
    _Base = object

log = logging.getLogger(__name__)

_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}

# For each host pool layout: the permutation from the pool's page view
# (get_data_page(i, flat=False)) to kvcd's canonical [layer][k/v][token][head][dim].
_TO_CANONICAL = {
    "layer_first": (1, 0, 2, 3, 4),  # [2][layer][token][head][dim]
    "page_first": (2, 0, 1, 3, 4),  # [2][token][layer][head][dim]
}


def _inverse(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


class KvcdHiCacheStorage(_Base):
    """SGLang HiCacheStorage over kvcd (see the module's DESIGN comment).

    storage_config: SGLang's HiCacheStorageConfig (tp_rank, tp_size, pp_rank, pp_size,
    is_mla_model, model_name, extra_config); extra_config may name "socket" (default:
    kvcd.default_socket()) and, to use the class without a host pool, the page layout
    "layers", "kv_heads", "head_dim", "page_size", "dtype" ("fp16"...)."""

    def __init__(self, storage_config, mem_pool_host=None, **_kw):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        if getattr(storage_config, "is_mla_model", False):
            raise NotImplementedError("kvcd.sglang: MLA (latent) pools are not supported yet")
        model = (getattr(storage_config, "model_name", None) or "model").replace("/", "-")
        suffix = "tp%d-%d" % (storage_config.tp_rank, storage_config.tp_size)
        if getattr(storage_config, "pp_size", 1) > 1:
            suffix += "-pp%d-%d" % (storage_config.pp_rank, storage_config.pp_size)
        self.model_prefix = "sglang/%s/%s" % (model, suffix)
        self.client = kvcd.Client(extra.get("socket"))
        self.ns = None
        self.mem_pool_host = None
        self.page_size = None
        self._perm = None
        self._local = threading.local()
        self._counts = dict(get_pages=0, get_hits=0, set_pages=0, set_written=0,
                            exists_pages=0, exists_hits=0)
        self._lock = threading.Lock()
        # SGLang's dynamic loader passes its kwargs dict where built-in backends get the pool
        # (StorageBackendFactory._create_dynamic_backend: backend_class(storage_config,
        # kwargs)); the pool then comes through register_mem_pool_host().
        if isinstance(mem_pool_host, dict):
            mem_pool_host = mem_pool_host.get("mem_pool_host")
        if mem_pool_host is not None:
            self.register_mem_pool_host(mem_pool_host)
        elif "layers" in extra:
            self._open(extra["layers"], extra["kv_heads"], extra["head_dim"],
                       extra["page_size"], extra.get("dtype", "fp16"), "canonical")

    # ---- setup ------------------------------------------------------------------------

    def _open(self, layers, kv_heads, head_dim, page_size, dtype, layout):
        self.page_size = int(page_size)
        self.layout = layout
        self.shape = (int(layers), 2, self.page_size, int(kv_heads), int(head_dim))
        self.torch_dtype = {v: k for k, v in _DTYPES.items()}[dtype]
        model_id = "%s/%s-l%d-h%d-d%d-p%d" % (self.model_prefix, dtype, layers, kv_heads,
                                             head_dim, self.page_size)
        self.ns = self.client.namespace(model_id, int(layers), int(kv_heads), int(head_dim),
                                        self.page_size, dtype)

    def register_mem_pool_host(self, mem_pool_host):
        """Binds the instance's host pool (SGLang's MHA HostKVCache) and opens the
        namespace of its page layout."""
        layout = getattr(mem_pool_host, "layout", "layer_first")
        if layout not in _TO_CANONICAL:
            raise NotImplementedError("kvcd.sglang: host pool layout %r (supported: %s)" %
                                      (layout, ", ".join(sorted(_TO_CANONICAL))))
        dtype = _DTYPES.get(mem_pool_host.dtype)
        if dtype is None:
            raise NotImplementedError("kvcd.sglang: host pool dtype %s" % mem_pool_host.dtype)
        self.mem_pool_host = mem_pool_host
        self._perm = _TO_CANONICAL[layout]
        self._open(mem_pool_host.layer_num, mem_pool_host.head_num, mem_pool_host.head_dim,
                   mem_pool_host.page_size, dtype, layout)

    def close(self):
        self.client.close()

    # ---- helpers ----------------------------------------------------------------------

    def _need_ns(self):
        if self.ns is None:
            raise RuntimeError("kvcd.sglang: no host pool registered and no layout in "
                               "extra_config")

    @staticmethod
    def _key(key):
        return hashlib.blake2b(key.encode() if isinstance(key, str) else bytes(key),
                               digest_size=16).digest()

    def _parent(self, extra_info):
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        return self._key(prefix[-1]) if prefix else None

    def _staging(self):
        st = getattr(self._local, "staging", None)
        if st is None:
            st = self._local.staging = torch.empty(self.shape, dtype=self.torch_dtype)
        return st

    def _canonical(self, host_index):
        """The canonical view (no copy) of the host pool page starting at token index
        host_index."""
        page = self.mem_pool_host.get_data_page(int(host_index), flat=False)
        return page.permute(*self._perm)

    def _count(self, **kw):
        with self._lock:
            for k, v in kw.items():
                self._counts[k] += v

    def _flat_to_canonical(self, value):
        """A flat page in the pool's get_data_page(flat=True) order -> canonical tensor."""
        if self._perm is None:
            return value.reshape(self.shape)
        pool_shape = tuple(self.shape[i] for i in _inverse(self._perm))
        return value.reshape(pool_shape).permute(*self._perm)

    def _canonical_to_flat(self, canon, out=None):
        if self._perm is None:
            flat = canon.reshape(-1)
        else:
            flat = canon.permute(*_inverse(self._perm)).reshape(-1)
        if out is None:
            return flat.contiguous()
        out.view(-1).copy_(flat)
        return out

    def _put(self, keys, canon_pages, parent):
        """Stores canonical page tensors (any strides) under keys as one chain, each copied
        once into its reserved slot in the arena; one bool per key."""
        res = [False] * len(keys)
        with self.ns.reserve(keys, parent=parent) as r:
            for i, st in enumerate(r.statuses):
                if st == kvcd.SLOT_PRESENT:
                    res[i] = True
                elif st == kvcd.SLOT_RESERVED:
                    mv = r[i]
                    slot = torch.frombuffer(mv, dtype=self.torch_dtype).view(self.shape)
                    slot.copy_(canon_pages[i])
                    del slot
                    mv.release()  # commit() refuses while a slot view is alive
                    res[i] = True
            self._count(set_pages=len(keys), set_written=r.reserved)
        return res

    def _load(self, lease, i, dst):
        """Copies hit i of lease into dst (a canonical tensor view, any strides)."""
        if lease.stored(i) == "raw":
            mv = lease[i]
            with warnings.catch_warnings():  # read-only view: the tensor is only read
                warnings.simplefilter("ignore", UserWarning)
                src = torch.frombuffer(mv, dtype=self.torch_dtype).view(self.shape)
            dst.copy_(src)
            del src
            mv.release()  # unpins with the lease, not later
        else:
            st = self._staging()
            lease.copy_into(i, st.view(torch.uint8).numpy())
            dst.copy_(st)

    # ---- zero-copy batch interface (host pool) ----------------------------------------

    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        """Length of the leading run of keys cached in kvcd (one lookup)."""
        self._need_ns()
        if not keys:
            return 0
        with self.ns.lookup([self._key(k) for k in keys]) as lease:
            n = len(lease)
        self._count(exists_pages=len(keys), exists_hits=n)
        return n

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info=None) -> List[bool]:
        """Loads the cached leading run of keys into the host pool pages at
        host_indices[i * page_size]; True for each page loaded."""
        self._need_ns()
        if not keys:
            return []
        idx = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        with self.ns.lookup([self._key(k) for k in keys]) as lease:
            hits = len(lease)
            for i in range(hits):
                self._load(lease, i, self._canonical(idx[i * self.page_size]))
        self._count(get_pages=len(keys), get_hits=hits)
        return [True] * hits + [False] * (len(keys) - hits)

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info=None) -> List[bool]:
        """Stores the host pool pages at host_indices[i * page_size] under keys (one
        chain); a key already cached counts as stored and costs nothing."""
        self._need_ns()
        if not keys:
            return []
        idx = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        pages = [self._canonical(idx[i * self.page_size]) for i in range(len(keys))]
        return self._put([self._key(k) for k in keys], pages, self._parent(extra_info))

    # ---- value interface (flat pages in the pool's order) -----------------------------

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Optional[torch.Tensor]:
        """The flat page of key (into target_location when given), or None."""
        r = self.batch_get([key], [target_location] if target_location is not None else None)
        return r[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[torch.Tensor]]:
        self._need_ns()
        if not keys:
            return []
        out = [None] * len(keys)
        with self.ns.lookup([self._key(k) for k in keys]) as lease:
            hits = len(lease)
            for i in range(hits):
                canon = torch.empty(self.shape, dtype=self.torch_dtype)
                self._load(lease, i, canon)
                dst = target_locations[i] if target_locations is not None else None
                out[i] = self._canonical_to_flat(canon, dst)
        self._count(get_pages=len(keys), get_hits=hits)
        return out

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Stores flat pages (get_data_page(flat=True) order) under keys; True when every
        one is cached afterwards."""
        self._need_ns()
        if not keys:
            return True
        if values is None:
            values = target_locations
        pages = [self._flat_to_canonical(v) for v in values]
        return all(self._put([self._key(k) for k in keys], pages, None))

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ---- housekeeping -----------------------------------------------------------------

    def clear(self) -> None:
        """Evicts this namespace's pages from kvcd (an admin operation: refused, with a log
        line, for a user who is not kvcd's admin)."""
        if self.ns is None:
            return
        try:
            self.client.evict(self.ns.id)
        except kvcd.Error as e:
            log.warning("kvcd.sglang: clear refused (%s)", e.strerror)

    def get_stats(self):
        """This backend's page counts and kvcd's counters of its namespace."""
        with self._lock:
            s = dict(self._counts)
        if self.ns is not None:
            s.update(("kvcd_" + k, v) for k, v in self.client.stats(self.ns.id).items())
        return s
