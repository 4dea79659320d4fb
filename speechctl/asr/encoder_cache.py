"""One encoder pass per distinct window, and the passes out of vLLM's step.

vLLM encodes each encoder-decoder request's audio itself and never shares the result, so the B
lanes of a beam search (and every fallback attempt at a higher temperature) would each run the
encoder again. :class:`EncoderCache` sits in front of the model's encoder
(``vllm_compat.share_mm_encoder``) and serves what vLLM's step asks for in one of two ways:

- **log-mel features** (the default, vLLM's own path): identical inputs of one call, and inputs
  seen in the last ``capacity`` encodings, reuse one encoder output. The key is two 64-bit
  hashes of the input's bits (integer arithmetic, so independent of batch and kernel);
- **windows encoded where they were rendered** (``WhisperConfig.encoder_at_render``, off by
  default: measured slower on an H100, docs/asr.md): the driver encodes a chunk of windows on
  the render worker, off the step loop (``encode_windows``), and hands vLLM a key per window
  (``key_tensor``: the input's serial number and the window) in place of its log-mel features;
  the step looks the keys up. vLLM then stacks, pins and copies 16 bytes a window instead of the
  features (0.96 MB: in an H100 beam-5 profile that batching was 25 of an admitting step's
  46 ms), and runs no encoder. An entry lives until the driver drops it (its window final, its
  input done), so that a fallback or a restart of the window reuses it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

WindowKey = tuple[int, int]  # (the input's serial number, the window)


class EncoderCache:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.cache: OrderedDict[tuple[int, int], torch.Tensor] = OrderedDict()  # by log-mel hash
        self.windows: dict[WindowKey, torch.Tensor] = {}  # encoded at render, by window key
        self._lock = threading.Lock()  # windows: written on the render worker, read in the step
        self.encoded = 0  # inputs actually encoded
        self.requested = 0  # inputs asked for by vLLM's step
        self._weights: dict[tuple, torch.Tensor] = {}

    # -- windows encoded where they are rendered --------------------------------------------------

    @staticmethod
    def key_tensor(key: WindowKey) -> torch.Tensor:
        """What vLLM carries for the window in place of its features (kept on the host)."""
        return torch.tensor(key, dtype=torch.long)

    def has(self, key: WindowKey) -> bool:
        with self._lock:
            return key in self.windows

    def encode_windows(self, keys: Sequence[WindowKey], features: Sequence[torch.Tensor],
                       encode: Callable[[torch.Tensor], Sequence[torch.Tensor]]) -> None:
        """Encode the windows ``keys`` (their log-mel ``features`` [mels, frames]) in one
        ``encode`` call and keep the outputs until dropped."""
        if not keys:
            return
        outputs = encode(torch.stack(list(features)))
        with self._lock:
            self.windows.update(zip(keys, outputs))
            self.encoded += len(keys)

    def drop(self, serial: int, window: int | None = None) -> None:
        """Forget an input's encoded windows (all of them, or one)."""
        with self._lock:
            for key in [k for k in self.windows if k[0] == serial and window in (None, k[1])]:
                del self.windows[key]

    def clear_windows(self) -> None:
        with self._lock:
            self.windows.clear()

    def _look_up(self, keys: torch.Tensor) -> tuple:
        with self._lock:
            try:
                return tuple(self.windows[tuple(k)] for k in keys.tolist())
            except KeyError as e:  # a driver bug: the step asked for a window it no longer keeps
                raise RuntimeError(f"Whisper: the encoder output of window {e.args[0]} was dropped before its step") from None

    # -- log-mel features, in vLLM's step ---------------------------------------------------------

    def keys(self, features: torch.Tensor) -> list[tuple[int, int]]:
        """[n, ...] inputs -> n keys."""
        flat = features.reshape(features.shape[0], -1)
        ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
        bits = flat.view(ints).long()
        key = (bits.shape[1], bits.device)
        if key not in self._weights:
            g = torch.Generator().manual_seed(1234)
            w = torch.randint(-(2**62), 2**62, (2, bits.shape[1]), generator=g, dtype=torch.long)
            self._weights[key] = w.to(bits.device)
        w = self._weights[key]
        h = torch.stack([(bits * w[0]).sum(1), (bits * w[1]).sum(1)], 1).cpu().tolist()
        return [tuple(x) for x in h]

    def __call__(self, features: torch.Tensor, encode: Callable[[torch.Tensor], tuple]) -> tuple:
        """The encoder outputs of vLLM's step inputs: window keys [n, 2] (``key_tensor``) looked
        up, or log-mel ``features`` [n, mels, frames] computed by ``encode`` only where not seen."""
        self.requested += features.shape[0]
        if features.dtype == torch.long:
            return self._look_up(features)
        keys = self.keys(features)
        missing, wanted = [], set()
        for i, k in enumerate(keys):
            if k in self.cache:
                self.cache.move_to_end(k)
            elif k not in wanted:
                missing.append(i)
                wanted.add(k)
        if missing:
            outputs = encode(features[missing])
            self.encoded += len(missing)
            for i, out in zip(missing, outputs):
                self.cache[keys[i]] = out
                self.cache.move_to_end(keys[i])
        result = tuple(self.cache[k] for k in keys)
        while len(self.cache) > self.capacity:
            self.cache.popitem(last=False)
        return result
