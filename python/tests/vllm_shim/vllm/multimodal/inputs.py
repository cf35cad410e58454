# Part of the vLLM stand-in (see vllm/__init__.py): a multimodal input's placeholder and hash.
from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class PlaceholderRange:
    offset: int
    length: int


@dataclass
class MultiModalFeatureSpec:
    data: Any
    modality: str
    identifier: str
    mm_position: PlaceholderRange
    mm_hash: Optional[str] = None
