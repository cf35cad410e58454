# Part of the vLLM stand-in (see vllm/__init__.py): what the workers' connectors report back
# each step.
from dataclasses import dataclass, field
from typing import Optional, Set


@dataclass
class KVConnectorOutput:
    finished_sending: Optional[Set[str]] = None
    finished_recving: Optional[Set[str]] = None
    invalid_block_ids: Set[int] = field(default_factory=set)
