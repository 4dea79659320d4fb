"""StreamTracker: the logits processor through which vLLM tells the runtime who sits where.

A logits processor that changes no logits: vLLM's public hook that reports, before each forward,
which request sits in which batch row (``BatchUpdate``). It hands that to the model's runtime as
plain ``Admitted``/``Moved`` records (``StreamRuntime.admit``).
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from speechctl.engine.params import StreamParams
from speechctl.engine.runtime.slots import Admitted, Moved


class StreamTracker(LogitsProcessor):
    def __init__(self, vllm_config, device, is_pin_memory):
        self.runtime = None  # the model's StreamRuntime, set by vllm_compat.attach_runtime

    @classmethod
    def validate_params(cls, sampling_params):
        StreamParams.from_extra_args(sampling_params.extra_args)

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        if self.runtime is None:
            if batch_update.added:
                raise RuntimeError("speechctl: requests reached the model before the engine attached")
            return
        added = [Admitted(row, StreamParams.from_extra_args(params.extra_args), len(prompt_ids))
                 for row, params, prompt_ids, _ in batch_update.added]
        moved = [Moved(src, dst, how == MoveDirectionality.SWAP) for src, dst, how in batch_update.moved]
        self.runtime.admit(batch_update.batch_size, list(batch_update.removed), added, moved)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits
