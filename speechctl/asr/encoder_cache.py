"""One encoder pass per distinct window.

vLLM encodes each encoder-decoder request's audio itself and never shares the result, so the B
lanes of a beam search (and every fallback attempt at a higher temperature) would each run the
encoder again. :class:`EncoderCache` sits in front of the model's encoder
(``vllm_compat.share_mm_encoder``): identical log-mel inputs of one step, and inputs seen in the
last ``capacity`` encodings, reuse one encoder output. The key is two 64-bit hashes of the
input's bits (integer arithmetic, so independent of batch and kernel).

(Until the forty-third session windows could also be encoded where they were rendered, on the
render worker, each carrying a key in place of its features; measured on an H100 it was slower at
every batch size and mode, greedy at batch 64 450 against 637 audio-s/s (docs/asr.md), so it
went.)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch


class EncoderCache:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.cache: OrderedDict[tuple[int, int], torch.Tensor] = OrderedDict()  # by log-mel hash
        self.encoded = 0  # inputs actually encoded
        self.requested = 0  # inputs asked for by vLLM's step
        self._weights: dict[tuple, torch.Tensor] = {}

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
        """The encoder outputs of vLLM's step inputs, log-mel ``features`` [n, mels, frames],
        computed by ``encode`` only where not seen."""
        self.requested += features.shape[0]
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
