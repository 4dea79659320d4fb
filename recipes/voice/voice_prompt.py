"""The default voice's own voice prompt: speech its LM follows on from (``speechctl.voice_prompt``).

    python -m recipes.voice voice-prompt --codec speechctl/voices/default/codec --out recipes/voice/voice_prompt.json

espeak-ng (the data's voice, rate and pitch) says ``SAID`` and then ``FOLLOW``; the waveform is cut
where ``FOLLOW``'s first word starts, so the prompt ends in the pause after ``SAID``'s comma with
the intonation of a sentence that goes on, and the codec encodes it. A request then reads ``SAID``
and its own text, and its speech continues the prompt's. Why: the voice LM begins a fresh
utterance with the words most sentences begin with ("Hello world" heard as "The world" or "A
world"); after a prompt it reads the first words as it reads the rest (docs/voice/lm-progress.md,
fifty-third session). ``SAID`` is made-up, in none of the held-out sentences.

The codes are committed (``voice_prompt.json``), not remade at install: another CPU could round
the codec's encoder differently and flip a code. ``export`` writes them into the voice's config
when it exports with the codec they were made with (its weights' hash), and leaves them out
otherwise: another codec's codes would be noise to it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

SAID = "The boy ran to the store for some milk,"
FOLLOW = "and he came home."
PROMPT_FILE = Path(__file__).with_name("voice_prompt.json")
SILENCE = 1e-3  # a frame whose samples stay below this (of full scale) is pause


def make_voice_prompt(codec_dir: Path, said: str = SAID, follow: str = FOLLOW) -> dict:
    """The prompt as config.json's ``speechctl.voice_prompt`` holds it, with what made it."""
    from recipes.voice.config import DataConfig
    from recipes.voice.data import espeak_version, utterance
    from speechctl.codecs import load_codec

    codec = load_codec(Path(codec_dir), device="cpu")
    wave, words, _ = utterance(f"{said} {follow}", DataConfig())
    first = len(said.split())
    if first >= len(words):
        raise ValueError(f"espeak-ng gave {len(words)} words for {len(said.split())} + {len(follow.split())}")
    hop = codec.hop_length
    # up to where FOLLOW begins, the pause whole (the last frame filled with more of it): the
    # LM goes on after a pause as long as the one it learnt at a comma (cut to whole frames, one
    # frame shorter, "Hello world" was heard right at 2 of 64 seeds instead of 30 of 32)
    said_wave = wave[: int(words[first, 2])].astype(np.float32) / 32768.0
    said_wave = np.concatenate([said_wave, np.zeros(-len(said_wave) % hop, np.float32)])
    (codes,) = codec.encode([said_wave])
    frames = said_wave.reshape(-1, hop)
    pause = 0
    while pause < len(frames) and np.abs(frames[-1 - pause]).max() < SILENCE:
        pause += 1
    if not pause:
        raise ValueError(f"{said!r} ends in no pause: the new speech would start mid-sound")
    return {"text": said, "codes": codes.tolist(), "lead_frames": pause, "codec_sha256": codec_hash(Path(codec_dir)),
            "made_with": {"espeak_ng": espeak_version(), "follow": follow,
                          "seconds": round(len(said_wave) / codec.sample_rate, 3)}}


def codec_hash(codec_dir: Path) -> str:
    """The codec's weights' SHA-256: which codec a prompt's codes belong to."""
    return hashlib.sha256((Path(codec_dir) / "model.safetensors").read_bytes()).hexdigest()


def read_voice_prompt(path: Path = PROMPT_FILE) -> dict | None:
    """The committed prompt, with what made it (None: there is none)."""
    return json.loads(path.read_text()) if path.is_file() else None


def config_entry(prompt: dict, codec_dir: Path) -> dict | None:
    """``prompt`` as config.json's ``speechctl.voice_prompt`` holds it, for a voice whose codec is
    ``codec_dir``; None where the prompt was made with another codec."""
    if prompt["codec_sha256"] != codec_hash(codec_dir):
        return None
    return {k: prompt[k] for k in ("text", "codes", "lead_frames")}


def write_voice_prompt(entry: dict, out: Path = PROMPT_FILE) -> Path:
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(entry) + "\n")
    os.replace(tmp, out)
    return out
