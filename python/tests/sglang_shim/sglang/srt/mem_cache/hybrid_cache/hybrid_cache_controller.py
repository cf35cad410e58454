# The storage half of SGLang's HybridCacheController (mem_cache/hybrid_cache/
# hybrid_cache_controller.py at 0034377, the newest stored): extra host pools registered with
# register_mem_host_pool_v2; prefetch asks batch_exists_v2 with the request's pool
# transfers (Mamba / SWA state "trailing_pages", a DSA indexer "all_pages" riding the KV
# indices), loads KV and KV-derived pools batch by batch and then the other pools'
# trailing pages (their keys re-aligned to the end of the KV hit) with batch_get_v2;
# backup stores the extra pools with batch_set_v2 (every TP rank for TP-sharded Mamba
# state, rank 0 only for rank-replicated pools) before the KV pages; on a rank that skips
# the KV backup the operation completes when every sidecar page was stored. A sidecar
# riding another extra pool's indices (indices_from_pool, e.g. the draft SWA pool on the
# SWA pool's) takes that pool's host indices and keys; a pool registered after attach
# (register_host_pool_entry) reaches the backend through register_mem_host_pool_v2 at
# once. A stand-in for tests (see sglang/__init__.py).
from sglang.srt.managers.cache_controller import HiCacheController as BaseHiCacheController
from sglang.srt.managers.cache_controller import PrefetchAck, PrefetchOperation
from sglang.srt.managers.cache_controller import StorageOperation as BaseStorageOperation
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorageExtraInfo, PoolHitPolicy,
                                                  PoolName, PoolTransfer, PoolTransferResult,
                                                  count_pool_hits)
from sglang.srt.mem_cache.utils import get_hash_str


class StorageOperation(BaseStorageOperation):
    def __init__(self, host_indices, token_ids, last_hash=None, hash_value=None,
                 prefix_keys=None, pool_transfers=None):
        super().__init__(host_indices, token_ids, last_hash, hash_value, prefix_keys)
        self.pool_transfers = pool_transfers
        self.pool_storage_result = PoolTransferResult.empty()


class HybridPrefetchOperation(PrefetchOperation):
    def __init__(self, request_id, token_ids, last_hash=None, prefix_keys=None,
                 pool_transfers=None):
        super().__init__(request_id, token_ids, last_hash, prefix_keys)
        self.pool_transfers = pool_transfers
        self.pool_storage_result = PoolTransferResult.empty()


class HybridCacheController(BaseHiCacheController):
    def __init__(self, mem_pool_host, page_size, host_pools=None, **kw):
        self.host_pools = dict(host_pools or {})  # PoolName -> host pool
        backend = kw.pop("storage_backend", None)
        super().__init__(mem_pool_host, page_size, **kw)
        if backend is not None:
            self.attach_storage_backend(backend, model_name=kw.get("model_name"),
                                        storage_backend_extra_config=kw.get(
                                            "storage_backend_extra_config"))

    def attach_storage_backend(self, storage_backend, prefetch_threshold=256, model_name=None,
                               storage_backend_extra_config=None):
        super().attach_storage_backend(storage_backend, prefetch_threshold, model_name,
                                       storage_backend_extra_config)
        # every entry of SGLang's host pool group, the KV (anchor) pool among them
        self.storage_backend.register_mem_host_pool_v2(self.mem_pool_host, PoolName.KV)
        for name, pool in self.host_pools.items():
            self.storage_backend.register_mem_host_pool_v2(pool, name)

    def register_host_pool_entry(self, name, pool):
        """A pool added after attach (SGLang's dynamic sidecars): registered with the
        backend at once."""
        self.host_pools[name] = pool
        if self.enable_storage and self.storage_backend is not None:
            self.storage_backend.register_mem_host_pool_v2(pool, name)

    def prefetch(self, request_id, new_input_tokens, last_hash=None, prefix_keys=None,
                 extra_pools=None):
        op = HybridPrefetchOperation(request_id, new_input_tokens, last_hash, prefix_keys,
                                     extra_pools)
        self.prefetch_queue.put(op)
        return op

    def write_storage(self, host_indices, token_ids, hash_value=None, prefix_keys=None,
                      extra_pools=None):
        op = StorageOperation(host_indices, token_ids, hash_value=hash_value,
                              prefix_keys=prefix_keys, pool_transfers=extra_pools)
        self.backup_queue.put(op)
        return op.id

    def _storage_hit_query(self, operation):
        hash_value = get_hash_str(operation.token_ids, operation.last_hash,
                                  page_size=self.page_size)
        operation.all_hash_values = hash_value
        extra_info = HiCacheStorageExtraInfo(
            prefix_keys=operation.prefix_keys.copy() if operation.prefix_keys else None)
        if operation.pool_transfers:
            hit = self.storage_backend.batch_exists_v2(hash_value, operation.pool_transfers,
                                                       extra_info)
        else:
            hit = PoolTransferResult(self.storage_backend.batch_exists(hash_value, extra_info),
                                     {})
        operation.pool_storage_result.update_kv_hit_pages(hit.kv_hit_pages)
        operation.exists_result = hit
        return hash_value[:hit.kv_hit_pages], hit.kv_hit_pages * self.page_size

    def _page_transfer(self, operation):
        kv_completed_pages = super()._page_transfer(operation)
        self._page_transfer_sidecar(operation, kv_completed_pages)

    def _page_transfer_sidecar(self, operation, kv_completed_pages):
        if operation.pool_transfers is None:
            return
        pool_hits = {}
        if not operation.is_terminated() and kv_completed_pages == len(operation.hash_value):
            nonkv = [t for t in operation.pool_transfers if t.indices_from_pool != PoolName.KV]
            self._sync_trailing_keys(nonkv, operation.hash_value, kv_completed_pages)
            self._resolve_sidecar_nonkv_derived_pool_transfers(operation)
            results = self.storage_backend.batch_get_v2(nonkv)
            pool_hits = count_pool_hits(results)
        self.prefetch_sync_queue.put(PrefetchAck(rid=operation.request_id, operation=operation,
                                                 pool_hits=pool_hits))

    def _sync_trailing_keys(self, pool_transfers, all_hashes, kv_hit_pages):
        for t in pool_transfers:
            if t.hit_policy != PoolHitPolicy.TRAILING_PAGES:
                continue
            n = len(t.keys) if t.keys else 1
            t.keys = all_hashes[max(0, kv_hit_pages - n):kv_hit_pages]
            if t.host_indices is None:
                continue
            pool = self.host_pools[t.name]
            needed = len(t.keys) * pool.page_size
            if t.host_indices.numel() > needed:
                pool.free(t.host_indices[needed:])
                t.host_indices = t.host_indices[:needed]

    def should_backup(self, transfer):
        if not self.backup_skip:
            return True
        return transfer.name == PoolName.MAMBA  # TP-sharded even when the KV is replicated

    def _page_backup(self, operation):
        backup = [t for t in operation.pool_transfers or [] if self.should_backup(t)]
        for t in operation.pool_transfers or []:
            if t.indices_from_pool == PoolName.KV:
                t.host_indices = operation.host_indices
                if t.keys is None:
                    t.keys = operation.hash_value
        if backup:
            self._resolve_sidecar_nonkv_derived_pool_transfers(operation)
            results = self.storage_backend.batch_set_v2(backup)
            operation.pool_storage_result.update_extra_pool_hit_pages(count_pool_hits(results))
        if not self.backup_skip:
            super()._page_backup(operation)
            return
        ok = bool(backup)
        for t in backup:
            r = results.get(t.name)
            if r is None:
                r = results.get(t.name.value)
            want = len(t.keys or [])
            if want == 0 and t.host_indices is not None:
                want = int(t.host_indices.numel())
            if not isinstance(r, (list, tuple)) or len(r) != want or not all(r):
                ok = False
                break
        operation.completed_tokens = len(operation.hash_value) * self.page_size if ok else 0

    def _resolve_sidecar_nonkv_derived_pool_transfers(self, operation):
        for t in operation.pool_transfers:
            if t.indices_from_pool is None or t.indices_from_pool == PoolName.KV:
                continue
            src = next((s for s in operation.pool_transfers
                        if s.indices_from_pool is None and s.name == t.indices_from_pool), None)
            if src is None:
                raise AssertionError("Storage sidecar derived pool source missing: %s from %s"
                                     % (t.name, t.indices_from_pool))
            t.host_indices = src.host_indices
            if t.keys is None:
                t.keys = src.keys

    def _reduce_prefetch_ack(self, ack):
        super()._reduce_prefetch_ack(ack)
        if ack.pool_hits is not None:  # every PoolName, in its order on every rank
            packed = self._all_reduce_min([ack.pool_hits.get(p.value, 0) for p in PoolName])
            for p, n in zip(PoolName, packed):
                ack.pool_hits[p.value] = n

    def backup_thread_func(self):
        from queue import Empty

        while not self.storage_stop_event.is_set():
            try:
                operation = self.backup_queue.get(block=True, timeout=1)
                if operation is None:
                    continue
                self._page_backup(operation)
                self.ack_backup_queue.put(operation)
            except Empty:
                continue

    def _alloc_extra(self, op):
        """What the hybrid radix cache does before the IO thread runs: host slots for the
        extra pools' pages (KV-derived pools ride the KV indices)."""
        for t in op.pool_transfers or []:
            if t.indices_from_pool is not None:
                continue
            pool = self.host_pools[t.name]
            n = len(t.keys) if t.keys else 1
            t.host_indices = pool.alloc(n * pool.page_size)
