# Part of the vLLM stand-in (see vllm/__init__.py): the configuration fields the connector
# reads.
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class KVTransferConfig:
    kv_connector: Optional[str] = None
    kv_connector_module_path: Optional[str] = None
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict = field(default_factory=dict)
    # What the scheduler does with blocks a worker failed to load: "recompute" or "fail".
    kv_load_failure_policy: str = "recompute"

    def get_from_extra_config(self, key, default) -> Any:
        return self.kv_connector_extra_config.get(key, default)

    @property
    def is_kv_producer(self):
        return self.kv_connector is not None and self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self):
        return self.kv_connector is not None and self.kv_role in ("kv_consumer", "kv_both")


@dataclass
class CacheConfig:
    block_size: int = 16
    cache_dtype: str = "auto"


@dataclass
class ModelConfig:
    model: str = "test/model"
    revision: Optional[str] = None
    dtype: str = "float16"
    use_mla: bool = False


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1


@dataclass
class VllmConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    kv_transfer_config: Optional[KVTransferConfig] = None
