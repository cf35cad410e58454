# DESIGN: a reference inference engine on kvcd (python/README.md): a small Llama-architecture
# decoder in PyTorch (model.py) with a paged KV cache whose pages are kvcd blocks (cache.py)
# and greedy generation that loads cached prefixes and puts what it computed (engine.py).
# It proves that a hit changes nothing (the same tokens as without kvcd) and what it saves.
# Its names load on first use (PEP 562), so kvcd.engine.daemon (a private kvcd for tests and
# demos) imports without PyTorch.
import importlib

_NAMES = {"Engine": "engine", "Generation": "engine", "Model": "model",
          "ModelConfig": "model", "tiny_config": "model"}

__all__ = ["Engine", "Generation", "Model", "ModelConfig", "tiny_config"]


def __getattr__(name):
    if name in _NAMES:
        return getattr(importlib.import_module("kvcd.engine." + _NAMES[name]), name)
    raise AttributeError("module 'kvcd.engine' has no attribute %r" % name)


def __dir__():
    return sorted(list(globals()) + __all__)
