# SGLang's backend factory (mem_cache/storage/backend_factory.py at 001067ff), its dynamic
# path: the class named by extra_config, checked to be a HiCacheStorage, built as
# cls(storage_config, kwargs). A stand-in for tests (see sglang/__init__.py).
import importlib

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage


class StorageBackendFactory:
    @staticmethod
    def _load_backend_class(module_path, class_name, backend_name):
        module = importlib.import_module(module_path)
        backend_class = getattr(module, class_name)
        if not issubclass(backend_class, HiCacheStorage):
            raise TypeError("Backend class %s must inherit from HiCacheStorage" % class_name)
        return backend_class

    @classmethod
    def create_backend(cls, backend_name, storage_config, mem_pool_host, **kwargs):
        if backend_name == "dynamic" and storage_config.extra_config is not None:
            cfg = storage_config.extra_config
            for f in ("backend_name", "module_path", "class_name"):
                if f not in cfg:
                    raise ValueError("Missing required field '%s' in backend config for "
                                     "'dynamic' backend" % f)
            backend_class = cls._load_backend_class(cfg["module_path"], cfg["class_name"],
                                                    cfg["backend_name"])
            return backend_class(storage_config, kwargs)
        raise ValueError("Unknown storage backend '%s'" % backend_name)
