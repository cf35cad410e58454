# Part of the vLLM stand-in (see vllm/__init__.py).
from dataclasses import dataclass


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
