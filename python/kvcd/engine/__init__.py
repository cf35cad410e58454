# DESIGN: a reference inference engine on kvcd (python/README.md): a small Llama-architecture
# decoder in PyTorch (model.py) with a paged KV cache whose pages are kvcd blocks (cache.py)
# and greedy generation that loads cached prefixes and puts what it computed (engine.py).
# It proves that a hit changes nothing (the same tokens as without kvcd) and what it saves.
from kvcd.engine.engine import Engine, Generation  # noqa: F401
from kvcd.engine.model import Model, ModelConfig, tiny_config  # noqa: F401

__all__ = ["Engine", "Generation", "Model", "ModelConfig", "tiny_config"]
