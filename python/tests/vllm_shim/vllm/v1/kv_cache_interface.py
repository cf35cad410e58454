# Part of the vLLM stand-in (see vllm/__init__.py): the KV cache config a connector is
# built with, and the spec classes of its groups with vLLM's class names, fields and
# keyword-only construction (vllm/v1/kv_cache_interface.py): one KVCacheGroupSpec per group
# of layers sharing a spec; with the hybrid allocator a model of several kinds of layers has
# several groups, their block ids drawn from one block pool.
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple


@dataclass(frozen=True)
class KVCacheSpec:
    block_size: int


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int
    head_size: int
    dtype: Any
    page_size_padded: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    head_size_v: Optional[int] = None
    sliding_window: Optional[int] = None
    attention_chunk_size: Optional[int] = None

    def __post_init__(self):
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    cache_dtype_str: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    attention_chunk_size: int


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    sliding_window: int


@dataclass(frozen=True)
class MambaSpec(KVCacheSpec):
    shapes: Tuple[Tuple[int, ...], ...]
    dtypes: Tuple[Any, ...]
    page_size_padded: Optional[int] = None
    mamba_type: str = "mamba2"
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0


@dataclass
class KVCacheGroupSpec:
    layer_names: List[str]
    kv_cache_spec: KVCacheSpec


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_groups: List[KVCacheGroupSpec]
