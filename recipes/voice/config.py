"""Every setting of the recipe: one dataclass per concern, two scales ("full" for the H200,
"tiny" for the CPU dry run and the tests). A stage writes the settings it ran with beside its
checkpoint (``recipe.json``); a resumed run takes them from there, not from the presets."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

from speechctl.phonemes import READS


class ConfigError(ValueError):
    pass


# The natural text a voice may read (recipes/voice/text/NAME.txt, built by text_sources.py), and
# how an exported voice credits it (text/SOURCES.md has the licences)
NATURAL_TEXT = {
    "devil": "The Devil's Dictionary by Ambrose Bierce (1911, public domain)",
    "wordnet": "WordNet 3.0's example sentences (Princeton University, WordNet licence)",
    "jargon": "the Jargon File 4.4.7 (public domain)",
}


@dataclass
class DataConfig:
    """Speech synthesized by espeak-ng from the committed text (``recipes/voice/text/``)."""

    hours: float = 100.0  # training audio, about (held-out sentences come on top)
    voice: str = "en-us"  # espeak-ng -v
    words_per_minute: int = 175  # espeak-ng -s (its default)
    pitch: int = 50  # espeak-ng -p (its default)
    sample_rate: int = 16000
    max_chars: int = 180  # longer sentences are left out (about 12 s of speech)
    heldout: int = 200  # natural sentences kept out of training (plus the fixed ones in text.py)
    # Share of the made-up sentences (beyond the source text itself) that are random word-list
    # words rather than sentences of the word-bigram chain over the source text.
    wordlist_share: float = 0.3
    max_silence_s: float = 0.1  # leading/trailing silence kept at most
    seed: int = 0
    # The natural text read before any made-up sentence (``NATURAL_TEXT``, ``text/NAME.txt``):
    # "devil" (the held-out sentences come from it, whatever this says), "wordnet" (42,011 modern
    # example phrases, ~24 h), "jargon" (10,398 sentences of the Jargon File, ~19 h). The voice's
    # LM read "devil" alone to step 8,597, then "devil" and "wordnet" (docs/voice/lm-progress.md).
    natural: list[str] = field(default_factory=lambda: ["devil"])

    def voiced_as(self, other: "DataConfig") -> "DataConfig":
        """This text (hours, sources, made-up sentences) spoken in ``other``'s voice (espeak-ng's
        voice, rate and pitch, the sample rate, the silences kept): an LM reads its own text in
        the voice its codec was trained on."""
        return replace(self, voice=other.voice, words_per_minute=other.words_per_minute, pitch=other.pitch,
                       sample_rate=other.sample_rate, max_silence_s=other.max_silence_s)

    def validate(self):
        if self.hours <= 0 or not 0 <= self.wordlist_share <= 1 or self.heldout < 0:
            raise ConfigError(f"bad data settings: {self}")
        if any(name not in NATURAL_TEXT for name in self.natural) or "devil" not in self.natural:
            raise ConfigError(f"data.natural {self.natural}: the sources are {list(NATURAL_TEXT)}, "
                              "devil among them (the held-out sentences are its)")


@dataclass
class CodecShape:
    """A ``transformers.DacConfig`` (the codec speechctl ships in ``codec/``)."""

    encoder_hidden_size: int = 16
    downsampling_ratios: list[int] = field(default_factory=lambda: [2, 4, 8, 10])  # hop 640: 25 frames/s
    decoder_hidden_size: int = 384
    n_codebooks: int = 8
    codebook_size: int = 1024
    codebook_dim: int = 8
    sampling_rate: int = 16000

    @property
    def hop_length(self) -> int:
        return math.prod(self.downsampling_ratios)

    @property
    def frame_rate(self) -> float:
        return self.sampling_rate / self.hop_length

    def validate(self):
        if any(r % 2 for r in self.downsampling_ratios):
            # DAC's transposed convolution returns a sample short per odd stride: even strides
            # keep T frames = T * hop samples exactly.
            raise ConfigError(f"downsampling ratios must be even, got {self.downsampling_ratios}")
        if self.codebook_size & (self.codebook_size - 1):
            raise ConfigError("codebook_size must be a power of two (DacModel requires it)")
        if not 1 <= self.n_codebooks <= 16:
            raise ConfigError("n_codebooks must be in 1..16")

    def dac_config(self, **extra):
        import transformers

        return transformers.DacConfig(**asdict(self), **extra)

    def describe(self) -> dict:
        return {**asdict(self), "hop_length": self.hop_length, "frame_rate": self.frame_rate}


@dataclass
class CodecTrain:
    data_hours: float | None = 20.0  # the codec trains on the corpus' first hours (None: all)
    batch_size: int = 64
    segment_s: float = 1.0  # random crops of the training audio
    lr: float = 6e-4
    lr_disc: float = 6e-4
    betas: tuple[float, float] = (0.8, 0.99)
    weight_decay: float = 0.0
    warmup_steps: int = 300
    decay_share: float = 0.3  # the LR anneals over the last 30% of each run's time (schedule.py)
    min_lr_share: float = 0.1
    grad_clip: float = 100.0
    # Share of a batch trained with fewer codebooks (DAC's 0.5 buys variable bitrate at some cost
    # in quality at the full one; speechctl always uses all of them).
    quantizer_dropout: float = 0.0
    # Loss weights (DAC's): multi-scale mel L1, waveform L1, VQ commitment and codebook, GAN.
    w_mel: float = 15.0
    w_wave: float = 1.0
    w_commit: float = 0.25
    w_codebook: float = 1.0
    w_adv: float = 1.0
    w_feat: float = 2.0
    adversarial: bool = True
    disc_start_step: int = 1000  # reconstruction alone first: the GAN then refines
    mel_windows: tuple[int, ...] = (32, 64, 128, 256, 512, 1024, 2048)
    mel_bins: tuple[int, ...] = (5, 10, 20, 40, 80, 160, 320)
    disc_periods: tuple[int, ...] = (2, 3, 5, 7, 11)
    disc_stft: tuple[int, ...] = (2048, 1024, 512)
    disc_channels: int = 16
    codebook_init_std: float = 1.0  # DAC's (nn.Embedding's default); transformers' own init is 0.02
    codebook_reset_every: int = 200  # steps; re-seed unused codes from encoder outputs (0: never)
    # TF32, not bf16 autocast: a bf16 residual stream puts a ~-48 dB noise floor on the waveform.
    bf16: bool = False
    # bf16 autocast for the discriminators alone (the codec's own stream stays float32): their
    # share of a step, if the codec-speed stage shows it pays.
    disc_bf16: bool = False
    # The encoder and quantizer frozen (no gradients, no dead-code re-seeding, no VQ losses): the
    # codes of any audio stay as they are while the decoder trains on, so that the LM can train on
    # them at the same time (``codes.codes_identity`` hashes what fixes them). Set on a resume.
    freeze_codes: bool = False
    # torch.compile of the codec and discriminators: on the H200 the first 50 steps took 119 s
    # (compiling), then 7.5-8.2 s per 50 against 9.5 eager: a 9-minute call does not earn it back.
    compile: bool = False
    log_every: int = 50
    seed: int = 0


@dataclass
class LMShape:
    """The backbone of ``SpeechctlMultiStreamLM`` (a transformers Llama, as vLLM runs it)."""

    hidden_size: int = 384
    num_layers: int = 8
    num_heads: int = 6  # head_dim 64
    num_kv_heads: int = 2
    intermediate_size: int = 1024
    backbone: str = "llama"
    delays: list[int] | None = None  # default: stream k waits k steps
    max_position_embeddings: int = 4096  # speechctl's engine asks for 4096 by default
    dtype: str = "bfloat16"  # storage and run dtype of the exported checkpoint

    def validate(self):
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ConfigError("hidden_size must divide into heads, heads into kv heads")
        head_dim = self.hidden_size // self.num_heads
        if head_dim not in (32, 64, 80, 96, 112, 128, 256):
            raise ConfigError(f"head_dim {head_dim}: vLLM's CPU attention has no kernel for it")

    def describe(self) -> dict:
        return asdict(self)


@dataclass
class LMTrain:
    batch_tokens: int = 131072  # tokens per optimizer step (sequences packed by length)
    max_tokens: int = 1024  # longest sequence (prompt + audio steps)
    lr: float = 1.5e-3
    min_lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    warmup_steps: int = 200
    decay_share: float = 0.3  # the LR anneals over the last 30% of each run's time (schedule.py)
    grad_clip: float = 1.0
    # The weight of codebook k's loss: the first codebooks carry the most (RVQ), EOS included.
    codebook_weights: list[float] | None = None  # default: 1.0 for all
    # Share of training sentences the LM reads as typed ("the quick brown fox" for "The quick
    # brown fox."): espeak-ng says both alike, and `speechctl tts "Hello world"` has no full stop.
    bare_text_share: float = 0.3
    # What the LM reads: "text" (the sentence's bytes, as every kept model did) or "phonemes"
    # (espeak-ng's phoneme names of it, ``speechctl.phonemes``: the letter-to-sound rules that
    # espeak-ng spoke the data with are then not the LM's to learn; the engine phonemizes alike).
    text_input: str = "text"
    # Dropout on the attention weights while training (transformers' Llama ``attention_dropout``;
    # evaluation and the exported model have none): the lever if new sentences alone do not
    # close the gap between training and held-out loss (docs/voice/lm-progress.md).
    attention_dropout: float = 0.0
    # Guided attention (align.py): heads 0 .. align_heads-1 of layer align_layer are taught to
    # attend to the text of the word each frame reads (espeak-ng's word starts), this weight
    # times their loss added to the LM's. 0: off, as the kept models were trained.
    align_weight: float = 0.0
    align_layer: int = 2
    align_heads: int = 2
    # ... and only from step align_start on, its weight rising over align_ramp steps. From the
    # first step it starved the LM: an untrained model's attention is spread evenly, so the guided
    # loss's gradient (norm 4-8 against the LM's own 0.1-0.7) set the global clip (grad_clip 1),
    # which cut the LM's own gradient 5-8x: a new LM on the H200 stood at held-out 6.16 at step
    # 500 where the letter LM without it had 4.55 (docs/voice/lm-progress.md). A run resumed past
    # start + ramp has the whole weight from its first step, as before these settings.
    align_start: int = 1000
    align_ramp: int = 1000
    # Share of training utterances whose condition (BOS, task, text) is dropped to PAD, as
    # speechctl builds a CFG pair's unconditional prompt (``MultiStreamPrompts.unconditional``):
    # the LM then also knows speech without text, which classifier-free guidance (``--cfg``)
    # pushes its reading away from. 0: off, as the kept models were trained.
    text_dropout: float = 0.0
    bf16: bool = True
    compile: bool = False  # torch.compile the loss (model included); eager is safe, batches are large
    log_every: int = 50
    eval_every: int = 500
    seed: int = 0


@dataclass
class Recipe:
    data: DataConfig = field(default_factory=DataConfig)
    codec: CodecShape = field(default_factory=CodecShape)
    codec_train: CodecTrain = field(default_factory=CodecTrain)
    lm: LMShape = field(default_factory=LMShape)
    lm_train: LMTrain = field(default_factory=LMTrain)
    scale: str = "full"

    def validate(self) -> "Recipe":
        for part in (self.data, self.codec, self.lm):
            part.validate()
        if self.data.sample_rate != self.codec.sampling_rate:
            raise ConfigError("the data's sample rate must be the codec's")
        t = self.lm_train
        if t.text_input not in READS:
            raise ConfigError(f"lm_train.text_input={t.text_input!r}: one of {', '.join(READS)}")
        if t.align_weight < 0 or t.align_weight > 0 and not (0 <= t.align_layer < self.lm.num_layers
                                                             and 0 < t.align_heads <= self.lm.num_heads):
            raise ConfigError(f"lm_train.align_*: layer {t.align_layer} of {self.lm.num_layers}, "
                              f"{t.align_heads} heads of {self.lm.num_heads}, weight {t.align_weight} >= 0")
        if t.align_start < 0 or t.align_ramp < 0:
            raise ConfigError(f"lm_train.align_start={t.align_start}, align_ramp={t.align_ramp}: steps, >= 0")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Recipe":
        parts = {f.name: f.type for f in fields(cls)}
        kinds = {"data": DataConfig, "codec": CodecShape, "codec_train": CodecTrain, "lm": LMShape,
                 "lm_train": LMTrain}
        kwargs = {}
        for name, value in d.items():
            if name not in parts:
                raise ConfigError(f"unknown recipe section {name!r}")
            kind = kinds.get(name)
            kwargs[name] = _build(kind, value) if kind else value
        return cls(**kwargs).validate()


# Settings added after runs were recorded, with the value those runs had: a record without one
# was made before it existed. (The first codecs' codebooks were transformers' N(0, 0.02).)
BEFORE_RECORDED = {"CodecTrain": {"codebook_init_std": 0.02}}


def _build(kind, values: dict):
    known = {f.name for f in fields(kind)}
    unknown = set(values) - known
    if unknown:
        raise ConfigError(f"unknown {kind.__name__} settings: {sorted(unknown)}")
    out = kind(**{**BEFORE_RECORDED.get(kind.__name__, {}), **values})
    for f in fields(kind):  # JSON gives lists where the defaults are tuples
        default = getattr(kind(), f.name)
        if isinstance(default, tuple):
            setattr(out, f.name, tuple(getattr(out, f.name)))
    return out


def preset(scale: str) -> Recipe:
    """``full``: what the H200 trains and speechctl ships. ``tiny``: minutes on a CPU (the dry
    run, tests): the same code paths at toy sizes."""
    if scale == "full":
        return Recipe().validate()
    if scale == "tiny":
        return Recipe(
            data=DataConfig(hours=0.05, heldout=8, max_chars=80),
            codec=CodecShape(encoder_hidden_size=4, decoder_hidden_size=32, n_codebooks=4, codebook_size=64,
                             downsampling_ratios=[2, 4, 8, 10]),
            codec_train=CodecTrain(data_hours=None, quantizer_dropout=0.5, batch_size=4, segment_s=0.4, warmup_steps=5, disc_start_step=4,
                                   mel_windows=(64, 256, 1024), mel_bins=(10, 40, 80), disc_periods=(2, 3),
                                   disc_stft=(512, 256), disc_channels=4, codebook_reset_every=10, bf16=False,
                                   log_every=2),
            lm=LMShape(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128,
                       dtype="float32"),
            lm_train=LMTrain(batch_tokens=2048, max_tokens=512, warmup_steps=5, bf16=False,
                             compile=False, log_every=2, eval_every=10),
            scale="tiny",
        ).validate()
    raise ConfigError(f"unknown scale {scale!r} (full, tiny)")


def multistream_recipe(lm: LMShape, codec: CodecShape, seed: int = 0, weights: bool = True,
                       text_input: str = "text", phoneme_voice: str = "en-us", max_piece_chars: int | None = None):
    """speechctl's ``MultiStreamRecipe`` of these shapes (random weights: speed tests, and the
    frame the export fills); ``text_input``: what the LM reads (``LMTrain.text_input``), in the
    data's espeak-ng voice; ``max_piece_chars``: the longest piece of text it speaks (the export's)."""
    from speechctl.models.generic.checkpoint import MultiStreamRecipe

    dac = asdict(codec)
    return MultiStreamRecipe(
        backbone=lm.backbone,
        hidden_size=lm.hidden_size,
        num_layers=lm.num_layers,
        num_heads=lm.num_heads,
        num_kv_heads=lm.num_kv_heads,
        intermediate_size=lm.intermediate_size,
        max_position_embeddings=lm.max_position_embeddings,
        num_codebooks=dac.pop("n_codebooks"),
        codebook_size=dac.pop("codebook_size"),
        delays=tuple(lm.delays) if lm.delays else None,
        init_std=0.02,
        seed=seed,
        dtype=lm.dtype,
        weights=weights,
        text_input=text_input,
        phoneme_voice=phoneme_voice,
        max_piece_chars=max_piece_chars,
        codec=dac,
    )
