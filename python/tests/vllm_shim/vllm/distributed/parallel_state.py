# Part of the vLLM stand-in (see vllm/__init__.py): the tensor-parallel group of this
# process, which the test's worker process sets (vLLM sets it when it starts a worker).
_tp = {"rank": 0, "size": 1}


def set_tensor_model_parallel(rank, size):
    _tp.update(rank=rank, size=size)


def get_tensor_model_parallel_rank():
    return _tp["rank"]


def get_tensor_model_parallel_world_size():
    return _tp["size"]
