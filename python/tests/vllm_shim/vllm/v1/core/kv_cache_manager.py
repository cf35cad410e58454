# Part of the vLLM stand-in (see vllm/__init__.py): the blocks update_state_after_alloc
# gets (one list of block ids per KV cache group).
from dataclasses import dataclass
from typing import List, Tuple


@dataclass
class KVCacheBlock:
    block_id: int


@dataclass
class KVCacheBlocks:
    blocks: Tuple[List[KVCacheBlock], ...]

    def get_block_ids(self):
        return tuple([b.block_id for b in group] for group in self.blocks)
