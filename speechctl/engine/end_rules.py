"""How a family's audio ends: its reference's end rules as data (``EndRules``), applied on the
device by ``runtime/rules.py``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EndRules:
    """How a family's reference implementation ends the audio while generating.

    The audio ends at the first step where a stream samples EOS; ``frames`` counts the lead
    stream's codes before that step. Stream k is then forced to EOS at step
    ``frames + delays[k] + eos_lag`` and to PAD after it (EOS again where PAD is EOS).

    * generic (``eos_lag=0``, ``open_vocab=False``): free choices are codes, plus EOS on the lead
      stream once ``min_frames`` are out; so only the lead stream ends the audio and the other
      streams end exactly at their delay.
    * Higgs Audio v2 (``eos_lag=1``, ``open_vocab=True``): its ``generate`` masks nothing where a
      stream is free (BOS and EOS may come anywhere), any stream's EOS ends the audio, and the
      forced EOS comes one step after a stream's delay-shifted end.
    * Dia (``eos_if_top=True``, ``stop_offset=0``): the lead stream may end only where EOS is its
      most likely choice, and then must (its EOS channel filter); the request stops at the step
      where the last stream takes its EOS.
    * MusicGen (``end_token=False``, ``stop_offset=-1``): no stream samples an end; the audio ends
      after ``max_frames`` frames, each stream takes PAD after its last code, and the request
      stops with the last stream's last code.

    The request stops (primary ``audio_eos_id``) at the first step where every stream is PAD
    after the end, or, with ``stop_offset``, at audio step
    ``frames + max(delays) + eos_lag + stop_offset``.
    """

    eos_lag: int = 0
    open_vocab: bool = False
    # CSM: no stream ends by a token; the audio ends with (and includes) the first frame whose
    # codebooks, all but the last, hold this code (0): its primary token is audio_eos_id.
    eos_frame: int | None = None
    eos_if_top: bool = False
    end_token: bool = True  # False: the audio ends by length only, streams take PAD, no EOS
    stop_offset: int | None = None

    def __post_init__(self):
        if self.eos_lag < 0:
            raise ValueError(f"eos_lag must be non-negative, got {self.eos_lag}")
        if not self.end_token and (self.open_vocab or self.eos_if_top or self.stop_offset is None):
            raise ValueError("an audio that ends by length alone needs a stop_offset and no sampled EOS")
