# Part of the vLLM stand-in (see vllm/__init__.py): the scheduler's output, which vLLM
# serialises to every worker with the connector's metadata in it.
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: Optional[List[int]]
    mm_features: list
    sampling_params: Any
    pooling_params: Any
    block_ids: Tuple[List[int], ...]
    num_computed_tokens: int
    lora_request: Any
    prompt_embeds: Any = None
    prefill_token_ids: Optional[List[int]] = None

    @classmethod
    def from_request(cls, request, block_ids, prefill_token_ids=None):
        return cls(req_id=request.request_id, prompt_token_ids=request.prompt_token_ids,
                   mm_features=request.mm_features, sampling_params=request.sampling_params,
                   pooling_params=None, block_ids=block_ids,
                   num_computed_tokens=request.num_computed_tokens,
                   lora_request=request.lora_request, prefill_token_ids=prefill_token_ids)


@dataclass
class CachedRequestData:
    req_ids: List[str]
    resumed_req_ids: Set[str]
    new_token_ids: List[List[int]]
    all_token_ids: Dict[str, List[int]]
    new_block_ids: List[Optional[Tuple[List[int], ...]]]
    num_computed_tokens: List[int]
    num_output_tokens: List[int]

    @classmethod
    def make_empty(cls):
        return cls([], set(), [], {}, [], [], [])


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: List[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: Dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: Dict[str, List[int]]
    scheduled_encoder_inputs: Dict[str, List[int]]
    num_common_prefix_blocks: List[int]
    finished_req_ids: Set[str]
    free_encoder_mm_hashes: List[str]
    preempted_req_ids: Optional[Set[str]] = None
    pending_structured_output_tokens: bool = False
    kv_connector_metadata: Any = None
    ec_connector_metadata: Any = None
