"""Whisper's token suppression as a vLLM logits processor.

transformers' ``WhisperForConditionalGeneration.generate`` (and OpenAI's and faster-whisper's
decoders) mask two sets of tokens that vLLM's Whisper support leaves alone:

* ``suppress_tokens`` at every step: symbols and special tokens that are not speech
  (``(``, ``[``, ``<|translate|>``, ...);
* ``begin_suppress_tokens`` at the first generated step only: the blank ``" "`` and
  ``<|endoftext|>``, so a transcript neither starts with a space nor is empty.

Both lists come from the checkpoint's ``generation_config.json`` (written by
:mod:`speechctl.asr.convert` from the CTranslate2 config). With them our greedy tokens are
transformers' greedy tokens. This is vLLM's public custom-logits-processor interface
(``LLM(logits_processors=[...])``): ``update_state`` sees the batch changes before each step,
``apply`` masks the [num_rows, vocab] logits in place.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality


class WhisperSuppress(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        config = json.loads((Path(vllm_config.model_config.model) / "generation_config.json").read_text())
        self.device = device
        self.always = torch.tensor(config.get("suppress_tokens") or [], dtype=torch.long, device=device)
        self.begin = torch.tensor(config.get("begin_suppress_tokens") or [], dtype=torch.long, device=device)
        self.outputs: dict[int, list[int]] = {}  # batch row -> the request's live output token list
        self._rows: list[int] = []  # batch rows at their first generated token
        self.first_rows = torch.empty(0, dtype=torch.long, device=device)

    def is_argmax_invariant(self) -> bool:
        return False  # it changes what greedy picks

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is not None:
            for row in batch_update.removed:
                self.outputs.pop(row, None)
            for added in batch_update.added:  # (row, params, prompt ids, output ids)
                self.outputs[added[0]] = added[-1]
            for src, dst, how in batch_update.moved:
                a, b = self.outputs.pop(src, None), self.outputs.pop(dst, None)
                if a is not None:
                    self.outputs[dst] = a
                if b is not None and how == MoveDirectionality.SWAP:
                    self.outputs[src] = b
        rows = sorted(row for row, out in self.outputs.items() if not out)
        if rows != self._rows:  # copy to the device only when the set changes
            self._rows = rows
            self.first_rows = torch.tensor(rows, dtype=torch.long, device=self.device)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.always.numel():
            logits[:, self.always] = float("-inf")
        if self.first_rows.numel() and self.begin.numel():
            logits[self.first_rows.unsqueeze(1), self.begin.unsqueeze(0)] = float("-inf")
        return logits
