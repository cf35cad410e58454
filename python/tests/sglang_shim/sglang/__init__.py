# DESIGN: a stand-in for the parts of SGLang that kvcd.sglang and its controller tests
# (python/tests/test_sglang_controller.py) touch, for tests only (SGLang is not installable
# here): the storage interface and its types (mem_cache/hicache_storage.py), the dynamic
# backend factory (mem_cache/storage/backend_factory.py), StorageMetrics and its collector
# (metrics/collector.py), the page hash (mem_cache/utils.py), and the storage half of the
# cache controllers (managers/cache_controller.py, mem_cache/hybrid_cache/
# hybrid_cache_controller.py): their prefetch, prefetch-IO, prefetch-sync and backup
# threads as SGLang runs them, with the names, fields and call order of sgl-project/sglang
# as read at 001067ff. Written from the published source, not copied; nothing here is part
# of the kvcd package.
