# Part of the vLLM stand-in (see vllm/__init__.py): the KV cache config a connector is
# built with.
from dataclasses import dataclass
from typing import Any, List


@dataclass
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: Any


@dataclass
class MLAAttentionSpec(FullAttentionSpec):
    pass


@dataclass
class KVCacheGroupSpec:
    layer_names: List[str]
    kv_cache_spec: FullAttentionSpec


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_groups: List[KVCacheGroupSpec]
