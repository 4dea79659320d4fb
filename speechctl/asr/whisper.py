"""Whisper on vLLM: many audio inputs, cut into <=30 s windows, decoded together.

    from speechctl.asr import WhisperAsr
    asr = WhisperAsr()                          # whisper-tiny.en (converted on first use)
    result = asr.asr(waveform_16k)              # AsrResult: .text, .segments, .language
    for r in asr.run(jobs): ...                 # AsrJob/FailedJob in, AsrResult out, as they finish

One in-process vLLM engine (``vllm.LLM``) runs every window of every input with continuous
batching. A window's decoding is a *group* of requests (*lanes*): one (greedy), B (beam search),
or best_of (sampling at a temperature); a lane is an encoder-decoder request whose decoder
prompt is ``[<|startofprev|> previous text] <|startoftranscript|>``. Every token is chosen by
:class:`speechctl.asr.decoder.WhisperDecoding`, a vLLM logits processor: the language/task/
<|notimestamps|> tokens are forced, the rest follows Whisper's rules and the group's search.

* **Features and encoder once per window, ahead of time.** vLLM computes a request's log-mel
  features on the host inside ``add_request``, between steps, never caches them for
  encoder-decoder models, and batches, copies and encodes them once per lane in an admitting
  step. A window is rendered once for all its lanes, on a worker thread while the engine steps
  (:class:`~speechctl.asr.prerender.Prerender`), a few windows of the line a call:
  transformers' feature extractor gives their features (all at once on a GPU), and each window
  is one vLLM rendering made from them (``vllm_compat.rendered_like``), not a pass through
  vLLM's processor. The lanes of a step hand their shared features to vLLM's encoder once
  (``vllm_compat.encode_shared_inputs_once``; :class:`~speechctl.asr.encoder_cache.EncoderCache`
  in front of the model's encoder, ``vllm_compat.share_mm_encoder``) and identical inputs share
  one pass across steps.
* **Beams without re-running anything.** Beam lanes stay in the engine for the whole search; a
  lane that continues another lane's history gets that lane's self-attention KV blocks copied
  (``vllm_compat.SelfAttentionKv``). The lanes of a group must step together: a group is added only when
  the next step can take all of its lanes (sequences, token and encoder budgets, read from vLLM's
  scheduler), and a group whose lanes fall out of step anyway is decoded again.
* **Fallback in the batch.** A result that needs the next temperature becomes a new group in the
  same loop; nothing waits for it but its own input.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from speechctl.accelerator import gpu_memory_share, has_cuda
from speechctl.asr.segments import MAX_SECONDS, RATE, join_text, plan_windows
from speechctl.asr.vocab import TIME_PRECISION
from speechctl.errors import SpeechctlError

logger = logging.getLogger(__name__)
ENCODER_POSITIONS = 1500  # 30 s of audio after the encoder's stride-2 convolution
MAX_RESTARTS = 3
GPU_ADMIT_SHARE = 0.5  # WhisperConfig.admit_share's default on a GPU


def sampling_key(seed: int, job_id: str, window: int, temperature: float) -> int:
    """The sampling key of a window's first lane (lane i draws from key + i): a stable hash of
    what identifies the draw, so that a seeded job samples the same tokens in every process
    (Python's ``hash()`` of a str changes per process)."""
    from speechctl.engine.requests import condition_tag

    return condition_tag(f"{seed}/{job_id}/{window}/{temperature}")


@dataclass
class WhisperConfig:
    """How to run vLLM for Whisper. ``None`` means: chosen for the platform."""

    max_num_seqs: int = 64  # lanes (vLLM sequences): windows x beam size at once
    dtype: str = "auto"  # auto: float32 on CPU (exactly transformers' numbers), float16 on GPU
    kv_cache_bytes: int | None = None  # default: room for max_num_seqs lanes (explicit, so
    # that engines of one process do not count each other's memory)
    max_num_batched_tokens: int | None = None  # default: max_group encoder inputs per step (CPU), every lane's (GPU)
    max_group: int = 8  # largest beam size / best-of a job may ask for
    gpu_memory_utilization: float | None = None
    feature_device: str | None = None  # where the log-mel features are computed (the feature
    # extractor's ``device``: "cpu", "cuda"); None: the engine's device. On the GPU the features of
    # a chunk of windows are one call there (H100, 2026-12-05: greedy at batch 64 455 audio-s/s
    # against 368 with them on the CPU, the same tokens; docs/asr.md)
    enforce_eager: bool | None = None  # default: eager on CPU, CUDA graphs on GPU
    seed: int = 0
    align_batch: int = 8  # windows per word-timestamp pass
    # Grouped admission: while lanes run, new windows wait until this share of the lanes is free
    # (or admit_wait_steps steps passed), so that they start together and more steps are pure
    # decode steps (vLLM's whole CUDA graphs) instead of ~1 lane joining every other step. 0: admit
    # at once. None: 0.5 on a GPU, 0 on the CPU (eager: a decode step alone gains nothing there).
    # Measured side by side (H100, 2026-12-05, docs/asr.md): at batch 16 greedy 61 -> 15 admitting
    # steps, 295 -> 355 audio-s/s (beam 5: 135 -> 197); at batch 64 within ~15 % either way.
    admit_share: float | None = None
    admit_wait_steps: int = 8
    default_options: object | None = None  # WhisperOptions for jobs without any (None: OpenAI's defaults)

    def engine_args(self, model_dir: Path, on_gpu: bool) -> dict:
        from speechctl.asr.decoder import WhisperDecoding

        config = json.loads((model_dir / "config.json").read_text())
        dtype = self.dtype
        if dtype == "auto" and not on_gpu:
            dtype = "float32"
        group_tokens = config["max_source_positions"] * self.max_group
        batched = self.max_num_batched_tokens or (
            max(16384, group_tokens, config["max_source_positions"] * self.max_num_seqs) if on_gpu else group_tokens)
        # vLLM sizes one request's cross-attention by the encoder inputs one step may take
        # (max_num_batched_tokens of them) and refuses to start unless the cache holds that
        # much: on a GPU's larger budget, more windows than max_num_seqs (8 lanes fell short)
        windows = max(self.max_num_seqs, self.max_group, -(-batched // config["max_source_positions"]))
        args = dict(
            model=str(model_dir),
            dtype=dtype,
            max_model_len=config["max_target_positions"],
            max_num_seqs=self.max_num_seqs,
            limit_mm_per_prompt={"audio": 1},
            enforce_eager=(not on_gpu) if self.enforce_eager is None else self.enforce_eager,
            seed=self.seed,
            logits_processors=[WhisperDecoding],
            use_tqdm_on_load=False,
            kv_cache_memory_bytes=self.kv_cache_bytes or kv_bytes_per_window(config, dtype) * windows,
            # A group's lanes are added between two steps and must all run in the next one.
            async_scheduling=False,
            # Each lane of a group is an encoder input to vLLM's scheduler (the encoder runs once):
            # one step must be able to take max_group of them. On a GPU, every lane at once: a
            # batch of windows starts in one step, and the steps after it are pure decode steps
            # (whole CUDA graphs) rather than ~10 lanes joining at each of many mixed steps.
            # (The CPU keeps the smaller budget: every lane at once was not faster there, beam 5
            # on 32 windows took 8.0-10.4 s either way, its steps being compute-bound.)
            max_num_batched_tokens=batched,
        )
        share = self.gpu_memory_utilization or (gpu_memory_share() if on_gpu else None)
        if share is not None:  # else vLLM's default
            args["gpu_memory_utilization"] = share
        return args


def kv_bytes_per_window(config: dict, dtype: str) -> int:
    """KV cache of one lane: keys and values of every decoder layer for the cross-attention over
    the encoder positions (1500) and the self-attention over the decoder context (448), each
    rounded up to 128-token blocks (about 25 MB in float32 for tiny)."""
    itemsize = 4 if dtype == "float32" else 2
    blocks = -(-config["max_source_positions"] // 128) + -(-config["max_target_positions"] // 128)
    positions = 128 * blocks
    return 2 * config["decoder_layers"] * config["d_model"] * itemsize * positions


@dataclass
class _Group:
    """One window's decoding at one temperature, in the engine."""

    state: object  # transcript.InputState
    window: int
    temperature: float
    mode: int
    slots: list[int]
    forced: tuple[int, ...]
    keys: list[str] = field(default_factory=list)
    outputs: dict = field(default_factory=dict)  # lane -> token ids
    beam: object = None  # beam.BeamGroup


class WhisperAsr:
    """A Whisper checkpoint in a vLLM engine, ready to run ASR jobs. Duck-compatible with
    :class:`speechctl.api.Speech` for ASR: ``sample_rate``, ``run(jobs)``, ``asr(audio)``,
    ``close()``."""

    sample_rate = RATE

    def __init__(self, model: str | Path | None = None, config: WhisperConfig | None = None):
        from speechctl.asr.checkpoint import DEFAULT_ASR_MODEL, engine_dir, resolve_whisper
        from speechctl.asr.decoder import WhisperDecoding
        from speechctl.asr.encoder_cache import EncoderCache
        from speechctl.asr.prerender import Prerender
        from speechctl.engine import vllm_compat

        vllm_compat.check_vllm_version()
        vllm_compat.apply_engine_environment()
        from vllm import LLM

        self.name = str(model or DEFAULT_ASR_MODEL)
        self.model_dir = resolve_whisper(model)
        self.config = config or WhisperConfig()
        self.on_gpu = has_cuda()
        if self.config.feature_device not in (None, "cpu") and not self.on_gpu:
            raise SpeechctlError(f"WhisperConfig.feature_device={self.config.feature_device!r}: no GPU here")
        self.feature_device = self.config.feature_device or ("cuda" if self.on_gpu else "cpu")
        self.admit_share = self.config.admit_share
        if self.admit_share is None:
            self.admit_share = GPU_ADMIT_SHARE if self.on_gpu else 0.0
        args = self.config.engine_args(engine_dir(self.model_dir), self.on_gpu)
        vllm_compat.keep_whisper_decoder_prompts()
        vllm_compat.collect_dropped_engines()  # before vLLM's first look at free memory (see there)
        with vllm_compat.other_engines_keep_their_graphs():
            self._llm = LLM(**args)
        vllm_compat.track_engine(self._llm.llm_engine)
        self._engine = self._llm.llm_engine
        self.tokenizer = self._llm.get_tokenizer()
        self.hf_config = json.loads((self.model_dir / "config.json").read_text())
        self.max_positions = self.hf_config["max_target_positions"]
        self.encoder_positions = self.hf_config["max_source_positions"]
        runner = vllm_compat.engine_runner(self._engine)
        self.decoding = vllm_compat.runner_logits_processor(runner, WhisperDecoding)
        self.vocab = self.decoding.vocab  # (loaded with the tokenizer once, by the logits processor)
        self.decoding.kv = vllm_compat.SelfAttentionKv(runner)
        vllm_compat.encode_shared_inputs_once(runner)  # a beam's lanes: their one input batched once a step
        self.encoder = vllm_compat.share_mm_encoder(runner, EncoderCache(capacity=2 * self.config.max_num_seqs))
        self.eot = self.vocab.eot
        self.budgets = vllm_compat.scheduler_budgets(self._engine)
        self.max_group = min(self.config.max_group, self.budgets["encoder_tokens"] // self.encoder_positions, self.budgets["sequences"])
        self._free_slots = list(range(self.decoding.capacity))
        self._ids = itertools.count()
        self._serials = itertools.count()  # inputs' numbers: they key their windows' renderings
        self._aligner = None
        self.peak_live = 0  # most lanes in the engine at once (batching, for tests and stats)
        self.stats = {"groups": 0, "fallbacks": 0, "restarts": 0, "aligned_windows": 0, "steps": 0, "step_s": 0.0,
                      "admitting_steps": 0, "admitting_step_s": 0.0}
        self._features = None  # transformers' Whisper feature extractor, what vLLM's processor calls
        self._template = None  # one window rendered by vLLM: every other window is rendered like it
        self._mm_ids = itertools.count()
        self._prerender = Prerender(self._render_many, depth=self.config.max_num_seqs)
        self._line_seen = None  # (the ready line and the renders in flight when last asked ahead)

    def counters(self) -> dict:
        """Where the time went so far, for benchmarks: this driver's steps (``stats``), the
        decoding's logits processor and beams (its ``stats``) and the window renderer's work."""
        render = self._prerender
        decoding = {f"decoding_{k}" if k in self.stats else k: v for k, v in self.decoding.stats.items()}  # its own steps
        return {**self.stats, **decoding, "render_wait_s": render.waited_s,
                "rendered_ahead": render.rendered_ahead, "rendered_inline": render.rendered_inline,
                "render_calls": render.calls, "encoded_windows": self.encoder.encoded}

    # -- one-shot -------------------------------------------------------------------------------

    def asr(self, audio: np.ndarray, **options):
        from speechctl.jobs import AsrJob

        (result,) = self.run([AsrJob(id="audio", audio=audio, **options)])
        if result.error:
            raise SpeechctlError(result.error)
        return result

    # -- many jobs ------------------------------------------------------------------------------

    def run(self, jobs: Iterable, max_window: float = MAX_SECONDS, max_lanes: int | None = None,
            admit_share: float | None = None) -> Iterator:
        """Transcribe ``AsrJob``s (16 kHz audio) and pass ``FailedJob``s through; yield
        ``AsrResult``s (with ``segments``) in the order they finish. Inputs longer than
        ``max_window`` seconds are cut into windows (:func:`plan_windows`). ``max_lanes`` caps
        the sequences in the engine at once (default: all it takes), e.g. for a benchmark of one
        engine at several batch sizes; ``admit_share``: grouped admission (default
        ``WhisperConfig.admit_share``)."""
        from speechctl.jobs import AsrResult, FailedJob

        pending = iter(jobs)
        ready: deque[tuple] = deque()  # (state, window, temperature index) not yet in the engine
        live: dict[str, tuple[_Group, int]] = {}  # request id -> (group, lane)
        inputs: list = []  # inputs in flight
        to_align: list = []  # decoded inputs waiting for their word timestamps
        exhausted = False
        budget = 2 * self.config.max_num_seqs  # windows in flight
        self._line_seen = None
        self._admit_share = self.admit_share if admit_share is None else admit_share
        if not 0 <= self._admit_share <= 1:
            raise ValueError(f"admit_share={self._admit_share}: a share of the lanes, in [0, 1]")
        self._held = 0  # steps the line has waited for its group's lanes
        try:
            while True:
                while not exhausted and sum(s.open_windows for s in inputs) < budget:
                    job = next(pending, None)
                    if job is None:
                        exhausted = True
                    elif isinstance(job, FailedJob):
                        yield AsrResult(job.id, None, error=job.error)
                    else:
                        state = self._plan(job, max_window)
                        if state.done:
                            yield from self._finish([state], to_align)
                        else:
                            inputs.append(state)
                            self._queue(state, ready)
                admitting = self._admit(ready, live, max_lanes)
                if admitting:
                    self.stats["admitting_steps"] += 1  # steps that start lanes (no whole CUDA graph)
                for state in [s for s in inputs if s.done]:  # failed while being added
                    inputs.remove(state)
                    yield from self._finish([state], to_align)
                if not live:
                    if to_align:
                        yield from self._flush_alignment(to_align)
                        continue
                    if exhausted and not ready and not inputs:
                        return
                    if ready:  # pragma: no cover - the budgets admit any group on an idle engine
                        state, w, _ = ready.popleft()
                        state.error = f"{state.job.id}: window {w} does not fit the engine's budgets {self.budgets}"
                    continue
                self.peak_live = max(self.peak_live, len(live))
                started = time.perf_counter()
                outputs = self._engine.step()
                elapsed = time.perf_counter() - started
                self.stats["steps"] += 1
                self.stats["step_s"] += elapsed
                if admitting:  # its encoder passes and prefills: the steps that decode alone are the rest
                    self.stats["admitting_step_s"] += elapsed
                for out in outputs:
                    if not out.finished or out.request_id not in live:
                        continue
                    group, lane = live.pop(out.request_id)
                    group.outputs[lane] = list(out.outputs[0].token_ids)
                    if len(group.outputs) == len(group.slots):
                        self._group_done(group, ready)
                finished = [s for s in inputs if s.done]
                for state in finished:
                    inputs.remove(state)
                if finished:
                    alive = {s.serial for s in inputs}
                    self._prerender.forget(lambda key: key[0] in alive)
                yield from self._finish(finished, to_align)
                if len(to_align) >= self.config.align_batch or (to_align and not live and not ready):
                    yield from self._flush_alignment(to_align)
        finally:  # the caller stopped early (or failed): leave nothing running in the engine
            self._prerender.clear()
            if live:
                self._engine.abort_request(list(live))
                slots = {s for g, _ in live.values() for s in g.slots}
                self.decoding.close_lanes(slots)
                self._free_slots.extend(slots)

    @staticmethod
    def _queue(state, ready: deque) -> None:
        for w in state.ready():
            state.started.add(w)
            ready.append((state, w, 0))

    # -- planning ---------------------------------------------------------------------------------

    def _plan(self, job, max_window: float):
        from speechctl.asr.options import resolve_options
        from speechctl.asr.transcript import InputState

        from speechctl.asr.options import WhisperOptions

        def failed(message: str):
            return InputState(job, [], WhisperOptions(), self.vocab, 1, error=f"{job.id}: {message}")

        audio = getattr(job, "audio", None)
        if audio is None or len(audio) == 0:
            return failed("empty audio")
        try:
            options = resolve_options(job, self.config.default_options)
            self._check_options(options)
            windows = plan_windows(np.asarray(audio, dtype=np.float32), RATE, max_window)
            state = InputState(job, windows, options, self.vocab, max(1, job.max_tokens), serial=next(self._serials))
        except ValueError as e:
            return failed(str(e))
        state.start_prompt(lambda text: self.tokenizer.encode(text, add_special_tokens=False))
        return state

    def _check_options(self, options) -> None:
        v = self.vocab
        if not v.multilingual:
            if options.language not in (None, "en"):
                raise ValueError(f"language {options.language!r}: {self.name} is an English-only model")
            if options.task == "translate":
                raise ValueError(f"task translate: {self.name} is an English-only model (it cannot translate)")
        elif options.language is not None:
            v.language_token(options.language)
        widest = max(options.lanes(t) for t in options.temperatures)
        if widest > self.max_group:
            raise ValueError(f"beam size / best-of {widest} is more than this engine takes per window ({self.max_group}; WhisperConfig.max_group)")

    def _group_for(self, state, w: int, t_index: int) -> tuple[_Group, list[int], int]:
        from speechctl.asr.beam import BeamGroup
        from speechctl.asr.decoder import BEAM, DETECT, GREEDY, SAMPLE

        options, v = state.options, self.vocab
        temperature = options.temperatures[t_index]
        decoder_prompt = self._decoder_prompt(state)
        forced: list[int] = []
        if v.multilingual:
            forced += [state.language if state.language is not None else DETECT,
                       v.translate if options.task == "translate" else v.transcribe]
        if not options.timestamps:
            forced.append(v.no_timestamps)
        if temperature > 0:
            mode, lanes = SAMPLE, options.best_of
        elif options.beam_size > 1:
            mode, lanes = BEAM, options.beam_size
        else:
            mode, lanes = GREEDY, 1
        room = self.max_positions - len(decoder_prompt) - len(forced)
        sample_len = max(1, min(state.max_tokens, room))
        group = _Group(state, w, temperature, mode, [], tuple(forced))
        if mode == BEAM:
            group.beam = BeamGroup(lanes, options.max_candidates, options.length_penalty, sample_len, self.eot)
        return group, decoder_prompt, sample_len

    def _decoder_prompt(self, state) -> list[int]:
        """``[<|startofprev|> previous text] <|startoftranscript|>``."""
        prompt, v = state.prompt(), self.vocab
        return ([v.sot_prev] + prompt if prompt else []) + [v.sot]

    def _render(self, audio: np.ndarray, decoder_prompt: list[int]):
        """A window as vLLM takes it, rendered by vLLM's own processor."""
        from speechctl.engine import vllm_compat

        encoder_prompt = {"prompt": "", "multi_modal_data": {"audio": (audio, RATE)}}
        if self.feature_device != "cpu":
            encoder_prompt["mm_processor_kwargs"] = {"device": self.feature_device}
        return vllm_compat.render_prompt(self._engine, {
            "encoder_prompt": encoder_prompt, "decoder_prompt": {"prompt_token_ids": list(decoder_prompt)}})

    def _render_many(self, windows) -> list:
        """Windows ``[(key, audio, decoder prompt), ...]`` (``key``: ``_window_key``) as vLLM
        takes them (``Prerender``'s worker). Their log-mel features come from transformers'
        feature extractor, the one call of vLLM's Whisper processor that computes anything: on the
        CPU one window a call (a batched call there ran slower a window), on ``feature_device``
        all at once. Each window is then the template's rendering with its own features and prompt
        (``vllm_compat.rendered_like``), which skips the processor's per-window overhead (its hash
        of the audio, tokenizer call)."""
        from transformers import WhisperFeatureExtractor

        from speechctl.asr.checkpoint import engine_dir
        from speechctl.engine import vllm_compat

        if self._features is None:
            self._features = WhisperFeatureExtractor.from_pretrained(str(engine_dir(self.model_dir)))
            self._template = self._render(np.zeros(RATE, dtype=np.float32), [self.vocab.sot])
        features = self._log_mel([audio for _, audio, _ in windows])
        return [vllm_compat.rendered_like(self._template, prompt, f, f"speechctl-asr-{next(self._mm_ids)}")
                for f, (_, _, prompt) in zip(features, windows)]

    def _log_mel(self, audios: list) -> list:
        """transformers' log-mel features [mels, frames] of each window (host tensors)."""
        if not audios:
            return []
        audios = [np.asarray(audio, dtype=np.float32) for audio in audios]
        if self.feature_device == "cpu":
            return [self._features(a, sampling_rate=RATE, return_tensors="pt")["input_features"][0] for a in audios]
        return list(self._features(audios, sampling_rate=RATE, return_tensors="pt", device=self.feature_device)["input_features"])

    @staticmethod
    def _window_key(state, w: int, decoder_prompt: list[int]) -> tuple:
        return state.serial, w, tuple(decoder_prompt)

    def _admit(self, ready: deque, live: dict, max_lanes: int | None = None) -> bool:
        """Add groups from ``ready`` while the next step can take all of their lanes."""
        b = self.budgets
        lanes = min(b["sequences"], max_lanes or b["sequences"])
        seqs = lanes - len(live)
        tokens = b["tokens"] - len(live)
        encoder = b["encoder_tokens"]
        admitted = False
        self._render_ahead(ready)  # (the first admission of a run: its windows in chunks, not one by one)
        # grouped admission: hold the line while lanes run and too few are free, a few steps at most
        hold = (bool(ready) and bool(live) and seqs < math.ceil(self._admit_share * lanes)
                and self._held < self.config.admit_wait_steps)
        self._held = self._held + 1 if hold else 0
        while ready and not hold:
            state, w, t_index = ready[0]
            if state.error is not None:
                ready.popleft()
                continue
            group, prompt, sample_len = self._group_for(state, w, t_index)
            n = state.options.lanes(group.temperature)
            if n > seqs or n * len(prompt) > tokens or n * self.encoder_positions > encoder or n > len(self._free_slots):
                break
            ready.popleft()
            seqs, tokens, encoder = seqs - n, tokens - n * len(prompt), encoder - n * self.encoder_positions
            self._submit(group, prompt, sample_len, n, live)
            admitted = True
        self._render_ahead(ready)
        return admitted

    def _render_ahead(self, ready: deque) -> None:
        """The windows next in line: their features computed while the engine steps. Asked again
        only when the line or the renders in flight changed (each window's prompt is built to
        name it: with hundreds of lanes, doing that every step cost the host ~0.5 ms a step)."""
        head = (id(ready[0][0]), ready[0][0].job.id, ready[0][1]) if ready else None
        line = (len(ready), head, self._prerender.pending)
        if line != self._line_seen:
            self._line_seen = line
            waiting = ((state, w, self._decoder_prompt(state))
                       for state, w, _ in itertools.islice(ready, self._prerender.depth) if state.error is None)
            self._prerender.ahead((self._window_key(state, w, prompt), lambda s=state, w=w: s.window_audio(w), prompt)
                                  for state, w, prompt in waiting)

    def _submit(self, group: _Group, prompt: list[int], sample_len: int, n: int, live: dict) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from speechctl.asr.decoder import SLOT_KEY, LaneSpec
        from speechctl.engine import vllm_compat

        state, options = group.state, group.state.options
        slots = [self._free_slots.pop() for _ in range(n)]
        group.slots = slots
        seed = state.job.seed if getattr(state.job, "seed", None) is not None else self.config.seed
        base_key = sampling_key(seed, state.job.id, group.window, group.temperature)
        specs = {}
        for lane, slot in enumerate(slots):
            specs[slot] = LaneSpec(
                mode=group.mode, forced=group.forced, prompt_len=len(prompt), temperature=group.temperature,
                top_k=options.top_k, top_p=options.top_p, key=base_key + lane, timestamps=options.timestamps,
                suppress_blank=options.suppress_blank,
                max_initial=-1 if options.max_initial_timestamp is None else round(options.max_initial_timestamp / TIME_PRECISION),
                group=group.beam, lane=lane, lane0_slot=slots[0],
            )
        self.decoding.open_lanes(specs)
        try:  # the log-mel features once for all lanes (vLLM would compute them for each)
            rendered = self._prerender.take(self._window_key(state, group.window, prompt),
                                            lambda: state.window_audio(group.window), prompt)
        except vllm_compat.REQUEST_ERRORS as e:
            state.error = f"{state.job.id}: {str(e).splitlines()[0]}"
            self.decoding.close_lanes(slots)
            self._free_slots.extend(slots)
            return
        extra = len(group.forced) + sample_len
        self.stats["groups"] += 1
        for lane, slot in enumerate(slots):
            key = f"w{next(self._ids)}"
            params = SamplingParams(
                temperature=0.0, max_tokens=extra, stop_token_ids=[self.eot], detokenize=False,
                output_kind=RequestOutputKind.FINAL_ONLY, extra_args={SLOT_KEY: slot},
                # made for this lane alone, so vLLM's copy of it on admission may be shallow: its
                # deep copy took 0.118 s of 640 lanes (beam 5 at batch 16, cProfile, an H100)
                skip_clone=True,
            )
            try:
                self._engine.add_request(key, rendered, params)
            except vllm_compat.REQUEST_ERRORS as e:
                state.error = f"{state.job.id}: {str(e).splitlines()[0]}"
                if group.keys:
                    self._engine.abort_request(group.keys)
                for k in group.keys:
                    live.pop(k, None)
                self.decoding.close_lanes(slots)
                self._free_slots.extend(slots)
                return
            group.keys.append(key)
            live[key] = (group, lane)

    # -- results ----------------------------------------------------------------------------------

    def _group_done(self, group: _Group, ready: deque) -> None:
        from speechctl.asr.beam import rank
        from speechctl.asr.decoder import DETECT
        from speechctl.asr.transcript import DecodeResult

        state, v = group.state, self.vocab
        lanes = self.decoding.close_lanes(group.slots)
        self._free_slots.extend(group.slots)
        nf = len(group.forced)
        t_index = state.options.temperatures.index(group.temperature) if group.temperature in state.options.temperatures else 0
        if group.beam is not None and (group.beam.broken or not group.beam.done):
            # Its lanes did not all run in the same steps: vLLM scheduled less than the planner
            # expected. Decode the window again, and expect less of each step from now on.
            self.stats["restarts"] += 1
            state.restarts[group.window] = restarts = state.restarts.get(group.window, 0) + 1
            floor = self.encoder_positions * group.beam.size
            self.budgets["encoder_tokens"] = max(floor, self.budgets["encoder_tokens"] // 2)
            logger.warning("Whisper: the beams of %s window %d fell out of step; decoding it again (encoder budget now %d)",
                           state.job.id, group.window, self.budgets["encoder_tokens"])
            if restarts > MAX_RESTARTS:
                state.error = f"{state.job.id}: window {group.window}: the beams could not be kept in step"
                return
            ready.appendleft((state, group.window, t_index))
            return
        outputs = [group.outputs[i] for i in range(len(group.slots))]
        for out, steps in zip(outputs, lanes["steps"]):
            if group.beam is None and steps != len(out):
                raise RuntimeError(f"Whisper lane took {steps} steps but vLLM returned {len(out)} tokens")
        language = state.language
        if v.multilingual and group.forced and group.forced[0] == DETECT:
            language = outputs[0][0]
        if group.beam is not None:
            tokens, sum_logprob = group.beam.result
        else:
            candidates = [self._free_tokens(out, nf) for out in outputs]
            best = 0 if len(candidates) == 1 else rank(candidates, lanes["sum_logprob"], state.options.length_penalty)
            tokens, sum_logprob = candidates[best], lanes["sum_logprob"][best]
        result = DecodeResult(tokens, float(sum_logprob), group.temperature, float(lanes["no_speech"][0]),
                              self.decode(tokens), language)
        next_t = state.accept(group.window, result, self.decode)
        if next_t is not None:
            self.stats["fallbacks"] += 1
            ready.appendleft((state, group.window, next_t))
            return
        self._queue(state, ready)

    def _free_tokens(self, out: list[int], nf: int) -> list[int]:
        free = out[nf:]
        return free[: free.index(self.eot)] if self.eot in free else free

    def decode(self, ids: list[int]) -> str:
        """Text of generated token ids (timestamp and other special tokens dropped)."""
        return self.tokenizer.decode([t for t in ids if t < self.eot]).strip()

    def _finish(self, states: list, to_align: list) -> Iterator:
        for state in states:
            if state.error is None and state.options.word_timestamps and any(s for s in state.segments):
                to_align.append(state)
            else:
                yield self._result(state)

    def _flush_alignment(self, to_align: list) -> Iterator:
        states = list(to_align)
        to_align.clear()
        self._align(states)
        for state in states:
            yield self._result(state)

    def _result(self, state):
        from speechctl.jobs import AsrResult

        if state.error is not None:
            return AsrResult(state.job.id, None, error=state.error, duration=len(state.job.audio) / RATE)
        segments = [s for segs in state.segments for s in (segs or []) if s.text]
        tokens = [[] if skipped else (r.tokens if r is not None else []) for r, skipped in zip(state.final, state.skipped)]
        return AsrResult(state.job.id, join_text(segments), segments=segments, tokens=tokens, language=self.language_code(state),
                         duration=len(state.job.audio) / RATE)

    def language_code(self, state) -> str | None:
        if not self.vocab.multilingual:
            return "en"
        return self.vocab.language_names.get(state.language) if state.language is not None else None

    # -- word timestamps -------------------------------------------------------------------------

    def aligner(self):
        if self._aligner is None:
            import torch

            from speechctl.asr.timing import Aligner

            dtype = torch.float16 if self.on_gpu and self.config.dtype in ("auto", "float16") else (
                torch.bfloat16 if self.config.dtype == "bfloat16" else torch.float32)
            self._aligner = Aligner(self.model_dir, self.vocab, self.tokenizer, "cuda" if self.on_gpu else "cpu", dtype,
                                    batch=self.config.align_batch)
        return self._aligner

    def _align(self, states: list) -> None:
        """Word timestamps for every decoded window of ``states``, in batched passes."""
        from speechctl.asr.timing import AlignItem, place_words

        aligner = self.aligner()
        items, where = [], []
        for state in states:
            code = self.language_code(state)
            for w, segments in enumerate(state.segments):
                if not segments:
                    continue
                text = [t for s in segments for t in s.tokens if t < self.eot]
                sot = self.vocab.sot_sequence(state.language, state.options.task) if self.vocab.multilingual else [self.vocab.sot]
                items.append(AlignItem(state.window_audio(w), text, sot, code))
                where.append((state, w))
        alignments = aligner.align(items)
        self.stats["aligned_windows"] += len(items)
        last = {}
        for (state, w), alignment in zip(where, alignments):
            offset = state.windows[w].speech_start / RATE
            last[id(state)] = place_words(state.segments[w], alignment, offset, last.get(id(state), 0.0), self.eot)
            for s in state.segments[w]:
                if s.start == s.end or not s.text.strip():
                    s.text, s.words = "", []

    def close(self) -> None:
        if getattr(self, "_prerender", None) is not None:
            self._prerender.close()
        if getattr(self, "_llm", None) is not None:
            from speechctl.engine import vllm_compat

            self._engine = self._aligner = self.decoding = self.encoder = None  # they hold the runner's KV cache and model
            vllm_compat.drop_engine(self, "_llm", lambda llm: llm.llm_engine)
