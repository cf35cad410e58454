# Part of the vLLM stand-in (see vllm/__init__.py): what the workers' connectors report back
# each step (KVConnectorOutput's fields at vLLM commit 003df29).
from dataclasses import dataclass, field
from typing import Any, Optional, Set


@dataclass
class KVConnectorOutput:
    finished_sending: Optional[Set[str]] = None
    finished_recving: Optional[Set[str]] = None
    kv_connector_stats: Any = None
    kv_cache_events: Any = None
    kv_connector_worker_meta: Any = None
    invalid_block_ids: Set[int] = field(default_factory=set)
    expected_finished_count: int = 0

    def is_empty(self):
        return (not self.finished_sending and not self.finished_recving and
                not self.kv_connector_stats and not self.kv_cache_events and
                not self.invalid_block_ids and not self.kv_connector_worker_meta)
