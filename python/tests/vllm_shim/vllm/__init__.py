# DESIGN: a minimal stand-in for the parts of vLLM that kvcd.vllm and its conformance test
# (python/tests/test_vllm.py) touch, for tests only (vLLM is not installable here): the
# connector base class and role, the scheduler's output objects, the KV cache config and
# blocks, the request, the connector output and the tensor-parallel rank, with the names,
# fields and constructors of vLLM's main branch as read at commit 003df29
# (vllm/distributed/kv_transfer/kv_connector/v1/base.py, vllm/v1/core/sched/output.py,
# vllm/v1/request.py, vllm/v1/kv_cache_interface.py, vllm/v1/outputs.py). Written from the
# published interface, not copied; nothing here is part of the kvcd package.
