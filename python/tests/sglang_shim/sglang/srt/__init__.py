# Package layout of SGLang (see sglang/__init__.py).
