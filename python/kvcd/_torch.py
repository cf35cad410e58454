# DESIGN: what the C extension asks of torch, kept out of C and out of `import kvcd`: torch is
# imported here only when the caller already loaded it (a torch tensor was passed), so the
# package never depends on torch nor on a CUDA build of it.
import sys


def default_stream(tensor):
    """The cudaStream_t (an int) a call on `tensor` runs on when given no stream: torch's
    current stream on the tensor's device for a torch CUDA tensor, else 0 (the legacy
    default stream)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
        return 0
    return torch.cuda.current_stream(tensor.device).cuda_stream
