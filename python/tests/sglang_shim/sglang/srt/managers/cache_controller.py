# The storage half of SGLang's HiCacheController (managers/cache_controller.py at
# 001067ff), as it drives an L3 backend: attach_storage_backend (the storage config from
# the ranks and extra_config, tp_lcm_size popped and should_split_heads decided as SGLang
# does, the dynamic backend built by the factory, the host pool registered, the zero-copy
# page functions chosen only for "interface_v1"), and the four threads: prefetch (a
# batch_exists per STORAGE_BATCH_SIZE pages with extra_info.prefix_keys and the request's
# router hint in extra_info.extra_info, the hit count
# all-reduced to the minimum over ranks), prefetch-IO (batch by batch, the zero-copy
# batch_get_v1 counted up to its first False, or the generic batch_get into dummy pages
# then set_from_flat_data_page; KV-derived sidecar pools through batch_get_v2), prefetch-sync
# (completed tokens all-reduced) and backup (batch by batch, all() over batch_set_v1 or the
# generic batch_set of get_data_page copies; stops at the first failed batch; skipped on
# TP ranks other than 0 of rank-replicated models). What the scheduler does between the
# threads (host memory for the hits, the acks) is run_prefetch / run_backup here; GPU
# transfers (L1 <-> L2) are not part of it. A stand-in for tests (see sglang/__init__.py).
import logging
import threading
import time
from dataclasses import dataclass
from queue import Empty, Queue
from typing import List, Optional

from sglang.srt.mem_cache.hicache_storage import (STORAGE_BATCH_SIZE, HiCacheStorageConfig,
                                                  HiCacheStorageExtraInfo, PoolName,
                                                  PoolTransfer, count_pool_hits)
from sglang.srt.mem_cache.utils import get_hash_str
from sglang.srt.metrics.collector import StorageMetricsCollector

logger = logging.getLogger(__name__)


class SyncGroup:
    """A process group of ranks running as threads of one process: all_reduce(MIN)."""

    def __init__(self, size):
        self.size = size
        self._barrier = threading.Barrier(size)
        self._lock = threading.Lock()
        self._vals = []
        self._out = None

    def all_reduce_min(self, values):
        with self._lock:
            self._vals.append(list(values))
        if self._barrier.wait() == 0:
            self._out = [min(v) for v in zip(*self._vals)]
            self._vals = []
        self._barrier.wait()
        out = self._out
        self._barrier.wait()
        return out


# The extra_info.extra_info key under which a request's router hint reaches the backend
# (SGLang keeps it a literal so the controller stays backend-agnostic).
_ROUTER_HINT_EXTRA_INFO_KEY = "kvcc_router_hint"


def _router_hint_extra_info(operation):
    if operation.router_hint is None:
        return None
    return {_ROUTER_HINT_EXTRA_INFO_KEY: operation.router_hint}


class StorageOperation:
    counter = 0

    def __init__(self, host_indices, token_ids, last_hash=None, hash_value=None,
                 prefix_keys=None, router_hint=None):
        self.host_indices = host_indices
        self.token_ids = token_ids
        self.last_hash = last_hash
        self.completed_tokens = 0
        self.hash_value = hash_value if hash_value is not None else []
        self.prefix_keys = prefix_keys
        self.all_hash_values = None
        self.router_hint = router_hint
        self.id = StorageOperation.counter
        StorageOperation.counter += 1


class PrefetchOperation(StorageOperation):
    def __init__(self, request_id, token_ids, last_hash=None, prefix_keys=None,
                 router_hint=None):
        self.request_id = request_id
        self._lock = threading.Lock()
        self._terminated_flag = False
        self.storage_hit_count = 0
        super().__init__(None, token_ids, last_hash, prefix_keys=prefix_keys,
                         router_hint=router_hint)

    def mark_terminate(self):
        with self._lock:
            self._terminated_flag = True

    def is_terminated(self):
        with self._lock:
            return self._terminated_flag


@dataclass
class PrefetchAck:
    rid: str
    operation: PrefetchOperation
    completed_tokens: Optional[int] = None
    pool_hits: Optional[dict] = None
    completed_req: Optional[bool] = None


class HiCacheController:
    def __init__(self, mem_pool_host, page_size, storage_backend=None, model_name=None,
                 storage_backend_extra_config=None, enable_storage_metrics=False,
                 tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                 attn_cp_size=1, dp_rank=0, dp_size=1, is_mla_model=False,
                 sync_group=None):
        self.mem_pool_host = self.storage_host_pool = mem_pool_host
        self.page_size = page_size
        self.enable_storage = False
        self.enable_storage_metrics = enable_storage_metrics
        self.ranks = dict(tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size,
                          attn_cp_rank=attn_cp_rank, attn_cp_size=attn_cp_size,
                          dp_rank=dp_rank, dp_size=dp_size)
        self.is_mla_model = is_mla_model
        self.sync_groups = [sync_group] if sync_group is not None and sync_group.size > 1 \
            else []
        self.page_get_func = self._generic_page_get
        self.page_set_func = self._generic_page_set
        self.storage_stop_event = threading.Event()
        self.storage_metrics_collector = StorageMetricsCollector() \
            if enable_storage_metrics else None
        if storage_backend is not None:
            self.attach_storage_backend(storage_backend, model_name=model_name,
                                        storage_backend_extra_config=storage_backend_extra_config)

    # ---- attach -------------------------------------------------------------------------

    def _generate_storage_config(self, model_name, extra):
        extra = dict(extra or {})
        tp_lcm_size = extra.pop("tp_lcm_size", None)
        should_split_heads = False
        if tp_lcm_size:
            assert tp_lcm_size % self.ranks["tp_size"] == 0
            should_split_heads = (not self.is_mla_model and
                                  self.mem_pool_host.layout == "page_head" and
                                  tp_lcm_size > self.ranks["tp_size"])
        return HiCacheStorageConfig(
            tp_rank=self.ranks["tp_rank"], tp_size=self.ranks["tp_size"],
            pp_rank=self.ranks["pp_rank"], pp_size=self.ranks["pp_size"],
            attn_cp_rank=self.ranks["attn_cp_rank"], attn_cp_size=self.ranks["attn_cp_size"],
            is_mla_model=self.is_mla_model, enable_storage_metrics=self.enable_storage_metrics,
            is_page_first_layout=self.mem_pool_host.layout == "page_first",
            model_name=model_name, dp_rank=self.ranks["dp_rank"],
            dp_size=self.ranks["dp_size"], tp_lcm_size=tp_lcm_size,
            should_split_heads=should_split_heads, extra_config=extra)

    def attach_storage_backend(self, storage_backend, prefetch_threshold=256, model_name=None,
                               storage_backend_extra_config=None):
        from sglang.srt.mem_cache.storage import StorageBackendFactory

        self.storage_backend_type = storage_backend
        self.storage_config = self._generate_storage_config(model_name,
                                                            storage_backend_extra_config)
        # rank-replicated (MLA) models: one rank backs up
        self.backup_skip = self.storage_config.is_mla_model and self.storage_config.tp_rank != 0
        self.storage_backend = StorageBackendFactory.create_backend(
            storage_backend, self.storage_config, self.storage_host_pool)
        self.storage_backend.register_mem_pool_host(self.storage_host_pool)
        self.enable_storage = True
        self.page_get_func = self._generic_page_get
        self.page_set_func = self._generic_page_set
        if self.storage_backend_type == "dynamic" and bool(
                self.storage_config.extra_config.get("interface_v1", 0)):
            self.page_get_func = self._page_get_zero_copy
            self.page_set_func = self._page_set_zero_copy
        self._start_storage_threads()

    def _start_storage_threads(self):
        self.prefetch_queue, self.backup_queue = Queue(), Queue()
        self.prefetch_buffer, self.prefetch_sync_queue = Queue(), Queue()
        self.prefetch_hit_queue, self.ack_prefetch_queue = Queue(), Queue()
        self.ack_backup_queue = Queue()
        self.threads = [threading.Thread(target=f, daemon=True) for f in (
            self.prefetch_thread_func, self.prefetch_io_aux_func,
            self.prefetch_sync_thread_func, self.backup_thread_func)]
        for t in self.threads:
            t.start()

    def detach_storage_backend(self):
        self.storage_stop_event.set()
        for q in (self.prefetch_queue, self.backup_queue, self.prefetch_buffer,
                  self.prefetch_sync_queue):
            q.put_nowait(None)
        for t in self.threads:
            t.join(timeout=10)
        if hasattr(self.storage_backend, "close"):
            self.storage_backend.close()
        self.enable_storage = False

    def _all_reduce_min(self, values):
        for g in self.sync_groups:
            values = g.all_reduce_min(values)
        return values

    # ---- prefetch -----------------------------------------------------------------------

    def prefetch(self, request_id, new_input_tokens, last_hash=None, prefix_keys=None,
                 router_hint=None):
        op = PrefetchOperation(request_id, new_input_tokens, last_hash, prefix_keys,
                               router_hint=router_hint)
        self.prefetch_queue.put(op)
        return op

    def _page_get_zero_copy(self, operation, hash_values, host_indices, extra_info=None):
        results = self.storage_backend.batch_get_v1(hash_values, host_indices, extra_info)
        inc = 0
        for i in range(len(hash_values)):
            if not results[i]:
                break
            inc += 1
        return inc

    def _generic_page_get(self, operation, hash_values, host_indices, extra_info=None):
        dummy = [self.storage_host_pool.get_dummy_flat_data_page() for _ in hash_values]
        page_data = self.storage_backend.batch_get(hash_values, dummy)
        if page_data is None:
            return 0
        count = 0
        for i in range(len(hash_values)):
            if page_data[i] is None or operation.is_terminated():
                break
            self.storage_host_pool.set_from_flat_data_page(host_indices[i * self.page_size],
                                                           page_data[i])
            count += 1
        return count

    def _page_transfer(self, operation):
        prefix_keys = operation.prefix_keys
        kv_derived = [t for t in getattr(operation, "pool_transfers", None) or []
                      if t.indices_from_pool == PoolName.KV]
        all_success, completed_pages = True, 0
        for i in range(0, len(operation.hash_value), STORAGE_BATCH_SIZE):
            if all_success and operation.is_terminated():
                all_success = False
            if all_success:
                batch_hashes = operation.hash_value[i:i + STORAGE_BATCH_SIZE]
                batch_host_indices = operation.host_indices[
                    i * self.page_size:(i + len(batch_hashes)) * self.page_size]
                extra_info = HiCacheStorageExtraInfo(
                    prefix_keys=prefix_keys, extra_info=_router_hint_extra_info(operation))
                hit_pages = self._page_transfer_kv_batch(operation, batch_hashes,
                                                         batch_host_indices, extra_info,
                                                         kv_derived)
                if hit_pages != len(batch_hashes):
                    all_success = False
                if prefix_keys and len(prefix_keys) > 0:
                    prefix_keys += batch_hashes
                completed_pages += hit_pages
            self.prefetch_sync_queue.put(PrefetchAck(
                rid=operation.request_id, operation=operation,
                completed_tokens=completed_pages * self.page_size))
        return completed_pages

    def _page_transfer_kv_batch(self, operation, batch_hashes, batch_host_indices, extra_info,
                                kv_derived_transfers):
        kv_hits = self.page_get_func(operation, batch_hashes, batch_host_indices, extra_info)
        sidecar_hits = {}
        if kv_derived_transfers:
            sidecar = self.storage_backend.batch_get_v2([
                PoolTransfer(name=t.name, host_indices=batch_host_indices, keys=batch_hashes)
                for t in kv_derived_transfers])
            sidecar_hits = count_pool_hits(sidecar)
        return min([kv_hits, *sidecar_hits.values()])

    def prefetch_io_aux_func(self):
        while not self.storage_stop_event.is_set():
            try:
                operation = self.prefetch_buffer.get(block=True, timeout=1)
                if operation is None:
                    continue
                self._page_transfer(operation)
                self.prefetch_sync_queue.put(PrefetchAck(
                    rid=operation.request_id, operation=operation, completed_req=True))
            except Empty:
                continue

    def _storage_hit_query(self, operation):
        prefix_keys = operation.prefix_keys.copy() if operation.prefix_keys else None
        storage_query_count, hash_value = 0, []
        page_hashes = get_hash_str(operation.token_ids, operation.last_hash,
                                   page_size=self.page_size)
        operation.all_hash_values = page_hashes
        for start in range(0, len(page_hashes), STORAGE_BATCH_SIZE):
            batch_hashes = page_hashes[start:start + STORAGE_BATCH_SIZE]
            extra_info = HiCacheStorageExtraInfo(
                prefix_keys=prefix_keys, extra_info=_router_hint_extra_info(operation))
            hit_page_num = self.storage_backend.batch_exists(batch_hashes, extra_info)
            hash_value.extend(batch_hashes[:hit_page_num])
            storage_query_count += hit_page_num * self.page_size
            if hit_page_num < len(batch_hashes):
                break
            if prefix_keys and len(prefix_keys) > 0:
                prefix_keys += batch_hashes
        return hash_value, storage_query_count

    def prefetch_thread_func(self):
        while not self.storage_stop_event.is_set() or not self.prefetch_queue.empty():
            try:
                operation = self.prefetch_queue.get(block=True, timeout=1)
                if operation is None:
                    continue
                if operation.is_terminated():
                    hash_value, hits = [], 0
                else:
                    hash_value, hits = self._storage_hit_query(operation)
                hits = self._all_reduce_min([hits])[0]
                operation.hash_value = hash_value[:hits // self.page_size]
                operation.storage_hit_count = hits
                self.prefetch_hit_queue.put(operation)
            except Empty:
                continue

    def prefetch_sync_thread_func(self):
        while not self.storage_stop_event.is_set():
            try:
                ack = self.prefetch_sync_queue.get(block=True, timeout=1)
                if ack is None:
                    continue
                self._reduce_prefetch_ack(ack)
                self.ack_prefetch_queue.put(ack)
            except Empty:
                continue

    def _reduce_prefetch_ack(self, ack):
        if ack.completed_tokens is not None:
            ack.completed_tokens = self._all_reduce_min([ack.completed_tokens])[0]

    # ---- backup -------------------------------------------------------------------------

    def write_storage(self, host_indices, token_ids, hash_value=None, prefix_keys=None):
        op = StorageOperation(host_indices, token_ids, hash_value=hash_value,
                              prefix_keys=prefix_keys)
        self.backup_queue.put(op)
        return op.id

    def _generic_page_set(self, hash_values, host_indices, extra_info=None):
        data = [self.storage_host_pool.get_data_page(host_indices[i * self.page_size])
                for i in range(len(hash_values))]
        return self.storage_backend.batch_set(hash_values, data)

    def _page_set_zero_copy(self, hash_values, host_indices, extra_info=None):
        return all(self.storage_backend.batch_set_v1(hash_values, host_indices, extra_info))

    def _page_backup(self, operation):
        prefix_keys = operation.prefix_keys
        for i in range(0, len(operation.hash_value), STORAGE_BATCH_SIZE):
            batch_hashes = operation.hash_value[i:i + STORAGE_BATCH_SIZE]
            batch_host_indices = operation.host_indices[
                i * self.page_size:(i + len(batch_hashes)) * self.page_size]
            extra_info = HiCacheStorageExtraInfo(prefix_keys=prefix_keys)
            if not self.page_set_func(batch_hashes, batch_host_indices, extra_info):
                logger.warning("Write page to storage: %d pages failed.", len(batch_hashes))
                break
            if prefix_keys and len(prefix_keys) > 0:
                prefix_keys += batch_hashes
            operation.completed_tokens += self.page_size * len(batch_hashes)

    def backup_thread_func(self):
        while not self.storage_stop_event.is_set():
            try:
                operation = self.backup_queue.get(block=True, timeout=1)
                if operation is None:
                    continue
                if not self.backup_skip:
                    self._page_backup(operation)
                self.ack_backup_queue.put(operation)
            except Empty:
                continue

    # ---- what the scheduler (HiRadixCache) does around the threads ----------------------

    def check_hicache_events(self):
        if self.enable_storage_metrics:
            self.storage_metrics_collector.log_storage_metrics(self.storage_backend.get_stats())

    def run_backup(self, host_indices, token_ids, hash_value, prefix_keys=None, timeout=60,
                   **kw):
        """write_storage, then the backup ack; returns the operation (completed_tokens)."""
        op_id = self.write_storage(host_indices, token_ids, hash_value, prefix_keys, **kw)
        op = self.ack_backup_queue.get(timeout=timeout)
        assert op.id == op_id
        self.check_hicache_events()
        return op

    def run_prefetch(self, rid, token_ids, last_hash=None, prefix_keys=None, timeout=60,
                     **kw):
        """prefetch; host memory for the synced hits; the IO thread's transfer; the acks
        until completed_req. Returns (operation, completed tokens, PrefetchAcks)."""
        op = self.prefetch(rid, token_ids, last_hash, prefix_keys, **kw)
        got = self.prefetch_hit_queue.get(timeout=timeout)
        assert got is op
        op.host_indices = self.mem_pool_host.alloc(op.storage_hit_count)
        self._alloc_extra(op)
        self.prefetch_buffer.put(op)
        acks, done = [], 0
        end = time.monotonic() + timeout
        while True:
            ack = self.ack_prefetch_queue.get(timeout=max(0.1, end - time.monotonic()))
            acks.append(ack)
            if ack.completed_tokens is not None:
                done = ack.completed_tokens
            if ack.completed_req:
                break
        self.check_hicache_events()
        return op, done, acks

    def _alloc_extra(self, op):
        pass
