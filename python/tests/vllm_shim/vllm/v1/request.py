# Part of the vLLM stand-in (see vllm/__init__.py): the request fields the connector reads.
from typing import Any, List, Optional


class Request:
    def __init__(self, request_id: str, prompt_token_ids: List[int], sampling_params=None,
                 lora_request=None, mm_features: Optional[list] = None,
                 cache_salt: Optional[str] = None):
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.num_prompt_tokens = len(prompt_token_ids)
        self._all_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.lora_request = lora_request
        self.mm_features = mm_features or []
        self.cache_salt = cache_salt
        self.num_computed_tokens = 0
        self.num_external_computed_tokens = 0
        self.kv_transfer_params: Optional[dict] = None
        self.block_hashes: List[Any] = []

    @property
    def all_token_ids(self):
        return self._all_token_ids

    @property
    def num_tokens(self):
        return len(self._all_token_ids)
