# Part of the vLLM stand-in (see vllm/__init__.py): what start_load_kv is given.
from dataclasses import dataclass, field
from typing import Any, Dict


@dataclass
class ForwardContext:
    no_compile_layers: Dict[str, Any] = field(default_factory=dict)
    attn_metadata: Any = None
    virtual_engine: int = 0
