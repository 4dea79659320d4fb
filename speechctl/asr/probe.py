"""The known-logit check of a converted Whisper tiny.en: transformers on the converted checkpoint
must reproduce numbers that the original implementation (CTranslate2 4.x, float32, on the
bundled model.bin) computed for a fixed synthetic input.

The input is 3 s of a rising chirp (150 -> 450 Hz, with its third harmonic) under a half-sine
envelope: deterministic, no files needed. Recorded from CTranslate2:

* the encoder output at frames 0, 150 and 1499 (first 4 channels);
* the first-step logits after ``<|startoftranscript|><|notimestamps|>`` of the 5 best tokens and
  of ``<|endoftext|>`` (the best two are 0.11 apart, far above float32 noise);
* the greedy continuation without suppression (``[MUSIC]`` then ``<|endoftext|>``).

A wrong mapping (say q and k swapped, a norm's gamma and beta exchanged, a transposed conv)
moves these by whole units; float32 rounding moves them by ~1e-4. ``tests/test_whisper_convert.py``
recomputes the table with ctranslate2 itself, so these constants are checked, not trusted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from speechctl.errors import ModelError

PROMPT = [50257, 50362]  # <|startoftranscript|><|notimestamps|>
ENCODER_FRAMES = (0, 150, 1499)
KNOWN = {
    "encoder": [
        [-1.2633, -0.2977, 0.4776, 0.4684],
        [-2.1292, -0.9514, 0.4293, 0.7859],
        [-0.106, -0.1388, -0.3599, 0.7845],
    ],
    "logits": {685: 18.0588, 357: 17.947, 1635: 15.2571, 20724: 13.6574, 532: 13.4294, 50256: 12.2437},
    "greedy": [685, 22648, 60, 50256],
}
TOLERANCE = 2e-2  # absolute, on values of magnitude ~1-20


def probe_audio(rate: int = 16000) -> np.ndarray:
    """[3 * rate] float32: the fixed synthetic input."""
    t = np.arange(3 * rate) / rate
    phase = 2 * np.pi * np.cumsum(150 + 100 * t) / rate
    return ((0.3 * np.sin(phase) + 0.1 * np.sin(3 * phase)) * np.sin(np.pi * t / 3)).astype(np.float32)


def probe_features(model_dir: str | Path) -> np.ndarray:
    """[1, n_mels, 3000] log-mel features of the probe (transformers' WhisperFeatureExtractor)."""
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor.from_pretrained(str(model_dir))
    return extractor(probe_audio(), sampling_rate=16000, return_tensors="np").input_features.astype(np.float32)


def measure(model_dir: str | Path) -> dict:
    """The probe's numbers from transformers on the checkpoint in ``model_dir`` (float32, CPU)."""
    import torch
    from transformers import WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    features = torch.from_numpy(probe_features(model_dir))
    with torch.inference_mode():
        encoded = model.model.encoder(features).last_hidden_state[0]
        ids = torch.tensor([PROMPT + KNOWN["greedy"][:-1]])
        logits = model(encoder_outputs=(encoded[None],), decoder_input_ids=ids).logits[0]
    first = logits[len(PROMPT) - 1]
    return {
        "encoder": [[float(v) for v in encoded[t, :4]] for t in ENCODER_FRAMES],
        "logits": {i: float(first[i]) for i in KNOWN["logits"]},
        "greedy": [int(i) for i in logits[len(PROMPT) - 1 :].argmax(-1)],
    }


def check_known_logits(model_dir: str | Path) -> float:
    """Raise ModelError unless the checkpoint reproduces :data:`KNOWN`; return the largest
    absolute difference."""
    got = measure(model_dir)
    diffs = [abs(a - b) for row, ref in zip(got["encoder"], KNOWN["encoder"]) for a, b in zip(row, ref)]
    diffs += [abs(got["logits"][i] - v) for i, v in KNOWN["logits"].items()]
    worst = max(diffs)
    if worst > TOLERANCE or got["greedy"] != KNOWN["greedy"]:
        raise ModelError(
            f"{model_dir}: converted Whisper fails the known-logit check (largest difference {worst:.3g}, "
            f"greedy {got['greedy']} vs {KNOWN['greedy']}); the conversion is wrong"
        )
    return worst
