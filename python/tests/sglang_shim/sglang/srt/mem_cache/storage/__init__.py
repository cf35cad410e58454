# Package layout of SGLang (see sglang/__init__.py).
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: F401
