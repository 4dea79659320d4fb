"""Token streams of a multi-stream speech LM and their layout over decoding steps.

A frame is K+1 tokens: the primary stream (text and control tokens, sampled by vLLM) and K audio
codebooks (sampled on the device by the model). The audio codebooks are laid out with a delay
pattern: codebook k is shifted right by ``delays[k]`` steps. The layout is data (``DelayPattern``)
so that neither the model nor the engine special-cases it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from speechctl.engine.end_rules import EndRules


@dataclass(frozen=True)
class DelayPattern:
    """Delay layout of K codebooks over decoding steps.

    T frames of codes span ``T + max(delays) + 1`` steps. For K=3, delays [0, 1, 2], T=2
    (c = code, B = BOS, E = EOS, P = PAD)::

        step       0 1 2 3 4
        stream 0   c c E P P
        stream 1   B c c E P
        stream 2   B B c c E

    The stream with the smallest delay leads: its EOS fixes T, and every other stream then
    emits its own EOS at ``T + delays[k]`` (the end-of-audio flush).

    The stream vocabulary is the ``codebook_size`` codes followed by BOS, EOS, PAD, unless a
    family names its own special ids: Higgs Audio v2 has BOS 1024, EOS 1025 and no PAD (a stream
    repeats EOS after its end, ``pad_id == eos_id``) in a 1026-token vocabulary.
    """

    delays: tuple[int, ...]
    codebook_size: int  # codes are [0, codebook_size)
    bos_id: int | None = None  # default codebook_size
    eos_id: int | None = None  # default codebook_size + 1
    pad_id: int | None = None  # default codebook_size + 2
    vocab: int | None = None  # tokens per stream; default codebook_size + 3

    def __post_init__(self):
        if not self.delays or min(self.delays) < 0:
            raise ValueError(f"delays must be non-negative, got {self.delays}")
        if self.codebook_size < 1:
            raise ValueError(f"codebook_size must be positive, got {self.codebook_size}")
        specials = (self.bos, self.eos, self.pad)
        if min(specials) < self.codebook_size or max(specials) >= self.vocab_size or self.bos == self.eos:
            raise ValueError(f"special ids {specials} must be distinct codes past {self.codebook_size} in a vocabulary of {self.vocab_size}")

    @property
    def num_streams(self) -> int:
        return len(self.delays)

    @property
    def max_delay(self) -> int:
        return max(self.delays)

    @property
    def lead(self) -> int:
        """The stream whose EOS ends the audio (smallest delay)."""
        return int(np.argmin(self.delays))

    # Auxiliary-stream vocabulary: codes, then BOS, EOS, PAD.
    @property
    def bos(self) -> int:
        return self.codebook_size if self.bos_id is None else self.bos_id

    @property
    def eos(self) -> int:
        return self.codebook_size + 1 if self.eos_id is None else self.eos_id

    @property
    def pad(self) -> int:
        return self.codebook_size + 2 if self.pad_id is None else self.pad_id

    @property
    def vocab_size(self) -> int:
        return self.codebook_size + 3 if self.vocab is None else self.vocab

    def num_steps(self, num_frames: int) -> int:
        return num_frames + self.max_delay + 1

    def num_frames(self, num_steps: int) -> int:
        frames = num_steps - self.max_delay - 1
        if frames < 0:
            raise ValueError(f"{num_steps} steps are too few for delays {list(self.delays)}")
        return frames

    def code_mask(self, num_frames: int) -> np.ndarray:
        """[K, S] True where a step holds a code (not BOS/EOS/PAD)."""
        steps = np.arange(self.num_steps(num_frames))[None, :]
        d = np.asarray(self.delays)[:, None]
        return (steps >= d) & (steps < d + num_frames)

    def build(self, codes: np.ndarray) -> np.ndarray:
        """[K, T] codes -> [K, T + max_delay + 1] interleaved steps."""
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[0] != self.num_streams:
            raise ValueError(f"expected codes of shape [{self.num_streams}, T], got {codes.shape}")
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise ValueError(f"codes must lie in [0, {self.codebook_size})")
        num_frames = codes.shape[1]
        steps = np.arange(self.num_steps(num_frames))[None, :]
        d = np.asarray(self.delays)[:, None]
        out = np.where(steps < d, self.bos, self.pad)
        out = np.where(steps == d + num_frames, self.eos, out)
        mask = self.code_mask(num_frames)
        out[mask] = codes.reshape(-1)  # row-major: each stream's T steps are contiguous
        return out.astype(np.int64)

    def continuation(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Audio a decoder-only model continues (a voice prompt that the new speech follows on
        from, VALL-E's way): ``codes`` [K, T] -> ([K, T] its first T steps, every frame of the
        lead stream, the prompt's last positions; [max_delay, K] the first generated steps'
        forced tokens: stream k's frames T - d_k .. T - 1 on generated steps 0 .. d_k - 1, -1
        elsewhere). The generated audio's own frames then start at frame T on every stream, as
        a fresh audio's start at frame 0 (its steps before each delay forced). Needs a lead
        stream without delay (the generated step ``a`` holds stream k's frame T + a - d_k)::

            K=2, delays [0, 1], T=2        prompt  | generated
            step                           0   1   | 0   1
            stream 0                       c   c   | -   -
            stream 1                       B   c   | c   -
        """
        if min(self.delays) != 0:
            raise ValueError(f"audio is continued only where a stream has no delay, not {list(self.delays)}")
        steps = self.build(codes)  # (checks the codes)
        K, T = np.shape(codes)
        lead_in = np.full((max(1, self.max_delay), K), -1, dtype=np.int64)
        for k, d in enumerate(self.delays):
            for a in range(d):
                if T + a - d >= 0:
                    lead_in[a, k] = steps[k, T + a]  # frame T + a - d of stream k
        return steps[:, :T], lead_in

    def decoder_prompt(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """An encoder-decoder family's decoder prompt (Dia, MusicGen): an all-BOS start frame,
        then T frames of ``codes`` [K, T] with stream k's frame f at position 1 + d_k + f. The
        positions up to the lead's last frame are the prompt; the delayed streams' remaining
        frames are forced on the first generated steps (as transformers' delay masks force them).
        Returns ([T + 1, K] the prompt positions' tokens, [max_delay, K] the first generated steps'
        forced tokens, -1 where free; None without codes)::

            K=2, delays [0, 1], T=2        prompt        | generated
            position                       0   1   2     | 0   1
            stream 0                       B   c   c     | -   -
            stream 1                       B   B   c     | c   -
        """
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[0] != self.num_streams:
            raise ValueError(f"expected codes of shape [{self.num_streams}, T], got {list(codes.shape)}")
        K, T = codes.shape
        frame = np.arange(T + 1 + self.max_delay)[:, None] - 1 - np.asarray(self.delays)[None, :]  # [positions, K]
        steps = np.full(frame.shape, self.bos, dtype=np.int64)
        inside = (frame >= 0) & (frame < T)
        steps[inside] = codes.T[frame[inside], np.nonzero(inside)[1]]
        steps[frame >= T] = -1
        return (steps[: T + 1], steps[T + 1 :]) if T else (steps[:1], None)

    def revert(self, steps: np.ndarray) -> np.ndarray:
        """[K, S] interleaved steps -> [K, T] codes; raises if the layout is malformed."""
        steps = np.asarray(steps)
        if steps.ndim != 2 or steps.shape[0] != self.num_streams:
            raise ValueError(f"expected steps of shape [{self.num_streams}, S], got {steps.shape}")
        num_frames = self.num_frames(steps.shape[1])
        expected = self.build(np.zeros((self.num_streams, num_frames), dtype=np.int64))
        mask = self.code_mask(num_frames)
        if not np.array_equal(steps[~mask], expected[~mask]):
            raise ValueError("malformed delay layout: BOS/EOS/PAD out of place")
        codes = steps[mask]
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise ValueError("malformed delay layout: a special token where a code belongs")
        return codes.reshape(self.num_streams, num_frames)


# An audio item of a prompt is its codes [K, T], laid out with the delay pattern whole; or
# (codes, CONTINUED): speech the model continues, laid out open-ended (DelayPattern.continuation).
CONTINUED = "continued"


def audio_item(codes: np.ndarray, continued: bool = False):
    """An audio item as vLLM's prompt carries it to the model's processor (see CONTINUED)."""
    return (np.asarray(codes), CONTINUED) if continued else np.asarray(codes)


def item_steps(pattern: DelayPattern, item) -> np.ndarray:
    """[K, S] the steps an audio item (``audio_item``) takes in a prompt."""
    if isinstance(item, tuple):
        codes, how = item
        if how != CONTINUED:
            raise ValueError(f"an audio item is codes or (codes, {CONTINUED!r}), not (codes, {how!r})")
        return pattern.continuation(np.asarray(codes))[0]
    return pattern.build(np.asarray(item))


def complete_frames(steps: np.ndarray, delays) -> np.ndarray:
    """[S, K] steps so far, as generated (stream k holds frame t at step t + delays[k]) -> [K, T]
    codes of every frame present on all streams; no check of what they hold."""
    n = max(0, len(steps) - max(delays))
    return np.stack([steps[d : d + n, k] for k, d in enumerate(delays)]).reshape(len(delays), n)


@dataclass(frozen=True)
class StreamSpec:
    """Everything about a model's streams that the engine and the model share.

    Read from the ``speechctl`` section of a checkpoint's config.json (the generic family), or
    built from a published config by the family's module (``speechctl.models.families``).
    """

    pattern: DelayPattern
    # Primary-stream control tokens.
    bos_id: int
    eos_id: int
    pad_id: int
    audio_bos_id: int  # the next steps are audio
    audio_id: int  # an audio step (also the placeholder of audio in prompts)
    audio_eos_id: int  # audio ended; back to text
    task_ids: Mapping[str, int] = field(default_factory=dict)
    rules: EndRules = EndRules()
    # The primary token of audio steps once the audio is ending (Higgs: its "delay" token);
    # default audio_id. The step where every stream has ended then takes audio_eos_id.
    audio_flush_id: int | None = None
    # Encoder-decoder families (Dia, MusicGen): the decoder prompt's positions carry stream
    # tokens (the BOS frame, an audio prompt under the delay pattern), given per request.
    prompt_streams: bool = False

    @property
    def num_codebooks(self) -> int:
        return self.pattern.num_streams

    @property
    def flush_id(self) -> int:
        return self.audio_id if self.audio_flush_id is None else self.audio_flush_id

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StreamSpec":
        try:
            tokens = d["tokens"]
            return cls(
                pattern=DelayPattern(tuple(int(x) for x in d["delays"]), int(d["codebook_size"])),
                bos_id=int(tokens["bos"]),
                eos_id=int(tokens["eos"]),
                pad_id=int(tokens["pad"]),
                audio_bos_id=int(tokens["audio_bos"]),
                audio_id=int(tokens["audio"]),
                audio_eos_id=int(tokens["audio_eos"]),
                task_ids={k: int(v) for k, v in d.get("tasks", {}).items()},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"invalid speechctl stream config: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "delays": list(self.pattern.delays),
            "codebook_size": self.pattern.codebook_size,
            "tokens": {
                "bos": self.bos_id,
                "eos": self.eos_id,
                "pad": self.pad_id,
                "audio_bos": self.audio_bos_id,
                "audio": self.audio_id,
                "audio_eos": self.audio_eos_id,
            },
            "tasks": dict(self.task_ids),
        }

    @classmethod
    def from_hf_config(cls, config: Any) -> "StreamSpec":
        section = getattr(config, "speechctl", None)
        if section is None:
            raise ValueError("config.json has no 'speechctl' section")
        return cls.from_dict(section)
