# Part of the vLLM stand-in (see vllm/__init__.py).
