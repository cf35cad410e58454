# Part of the vLLM stand-in (see vllm/__init__.py).
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: F401
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, SupportsHMA)
