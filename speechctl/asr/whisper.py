"""Whisper on vLLM: many audio inputs, cut into <=30 s windows, decoded together.

    from speechctl.asr import WhisperAsr
    asr = WhisperAsr()                          # whisper-tiny.en (converted on first use)
    result = asr.asr(waveform_16k)              # AsrResult: .text, .segments
    for r in asr.run(jobs): ...                 # AsrJob/FailedJob in, AsrResult out, as they finish

One in-process vLLM engine (``vllm.LLM``) runs every window of every input with continuous
batching: inputs are pulled lazily, their windows queued so that the engine always has up to
``2 * max_num_seqs`` windows, and a result is yielded as soon as all windows of its input are
done. Each window is an encoder-decoder prompt: the audio as the encoder's multimodal input (vLLM
computes the log-mel features with transformers' WhisperFeatureExtractor and pads to 30 s), the
decoder prompt ``<|startoftranscript|><|notimestamps|>`` (English-only models take no language
or task token). Greedy by default; :class:`WhisperSuppress` applies Whisper's token suppression,
so the tokens are those of transformers' ``generate``.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from speechctl.accelerator import has_cuda
from speechctl.asr.segments import MAX_SECONDS, RATE, Window, join_text, plan_windows, segment
from speechctl.errors import SpeechctlError

ENCODER_POSITIONS = 1500  # 30 s of audio after the encoder's stride-2 convolution


@dataclass
class WhisperConfig:
    """How to run vLLM for Whisper. ``None`` means: chosen for the platform."""

    max_num_seqs: int = 64
    dtype: str = "auto"  # auto: float32 on CPU (exactly transformers' numbers), float16 on GPU
    kv_cache_bytes: int | None = None  # default: room for max_num_seqs windows (explicit, so
    # that engines of one process do not count each other's memory)
    max_num_batched_tokens: int | None = None  # CPU default: one encoder input per step
    gpu_memory_utilization: float | None = None
    enforce_eager: bool | None = None  # default: eager on CPU, CUDA graphs on GPU
    seed: int = 0

    def engine_args(self, model_dir: Path, on_gpu: bool) -> dict:
        from speechctl.asr.suppress import WhisperSuppress

        config = json.loads((model_dir / "config.json").read_text())
        dtype = self.dtype
        if dtype == "auto" and not on_gpu:
            dtype = "float32"
        args = dict(
            model=str(model_dir),
            dtype=dtype,
            max_model_len=config["max_target_positions"],
            max_num_seqs=self.max_num_seqs,
            limit_mm_per_prompt={"audio": 1},
            enforce_eager=(not on_gpu) if self.enforce_eager is None else self.enforce_eager,
            seed=self.seed,
            logits_processors=[WhisperSuppress],
            use_tqdm_on_load=False,
            kv_cache_memory_bytes=self.kv_cache_bytes or kv_bytes_per_window(config, dtype) * self.max_num_seqs,
        )
        # On CPU vLLM pads every step to max_num_batched_tokens: keep it at one encoder input
        # (the minimum Whisper accepts); the GPU default batches several.
        tokens = self.max_num_batched_tokens or (None if on_gpu else config["max_source_positions"])
        if tokens is not None:
            args["max_num_batched_tokens"] = tokens
        if self.gpu_memory_utilization is not None:
            args["gpu_memory_utilization"] = self.gpu_memory_utilization
        return args


def kv_bytes_per_window(config: dict, dtype: str) -> int:
    """KV cache of one window: keys and values of every decoder layer for the cross-attention
    over the encoder positions (1500) and the self-attention over the decoder context (448),
    each rounded up to 128-token blocks (about 25 MB in float32 for tiny)."""
    itemsize = 4 if dtype == "float32" else 2
    blocks = -(-config["max_source_positions"] // 128) + -(-config["max_target_positions"] // 128)
    positions = 128 * blocks
    return 2 * config["decoder_layers"] * config["d_model"] * itemsize * positions


@dataclass
class _Input:
    """One job in flight: its windows and the transcripts that came back."""

    job: object
    windows: list[Window]
    texts: dict[int, str] = field(default_factory=dict)
    tokens: dict[int, list[int]] = field(default_factory=dict)
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.error is not None or len(self.texts) == len(self.windows)


class WhisperAsr:
    """A Whisper checkpoint in a vLLM engine, ready to run ASR jobs. Duck-compatible with
    :class:`speechctl.api.Speech` for ASR: ``sample_rate``, ``run(jobs)``, ``asr(audio)``,
    ``close()``."""

    sample_rate = RATE

    def __init__(self, model: str | Path | None = None, config: WhisperConfig | None = None):
        from speechctl.asr.checkpoint import whisper_dir
        from speechctl.engine import vllm_compat

        vllm_compat.check_vllm_version()
        vllm_compat.apply_engine_environment()
        from vllm import LLM

        self.model_dir = whisper_dir(model)
        if self.model_dir is None:
            raise SpeechctlError(f"{model}: not a Whisper model")
        self.config = config or WhisperConfig()
        args = self.config.engine_args(self.model_dir, has_cuda())
        with vllm_compat.other_engines_keep_their_graphs():
            self._llm = LLM(**args)
        vllm_compat.track_engine(self._llm.llm_engine)
        self._engine = self._llm.llm_engine
        self.tokenizer = self._llm.get_tokenizer()
        vocab = self.tokenizer.get_vocab()
        self.prompt = [vocab["<|startoftranscript|>"], vocab["<|notimestamps|>"]]
        self.eot = vocab["<|endoftext|>"]
        self.max_tokens = json.loads((self.model_dir / "config.json").read_text())["max_target_positions"] - len(self.prompt)
        self._ids = itertools.count()
        self.peak_live = 0  # most windows in the engine at once (batching, for tests and stats)

    # -- one-shot -------------------------------------------------------------------------------

    def asr(self, audio: np.ndarray, **options):
        from speechctl.jobs import AsrJob

        (result,) = self.run([AsrJob(id="audio", audio=audio, **options)])
        if result.error:
            raise SpeechctlError(result.error)
        return result

    # -- many jobs ------------------------------------------------------------------------------

    def run(self, jobs: Iterable, max_window: float = MAX_SECONDS) -> Iterator:
        """Transcribe ``AsrJob``s (16 kHz audio) and pass ``FailedJob``s through; yield
        ``AsrResult``s (with ``segments``) in the order they finish. Inputs longer than
        ``max_window`` seconds are cut into windows (:func:`plan_windows`)."""
        from speechctl.jobs import AsrResult, FailedJob

        pending = iter(jobs)
        windows: deque[tuple[_Input, int]] = deque()  # windows not yet in the engine
        live: dict[str, tuple[_Input, int]] = {}
        exhausted = False
        budget = 2 * self.config.max_num_seqs
        try:
            while True:
                while not exhausted and len(windows) + len(live) < budget:
                    job = next(pending, None)
                    if job is None:
                        exhausted = True
                    elif isinstance(job, FailedJob):
                        yield AsrResult(job.id, None, error=job.error)
                    else:
                        item = self._plan(job, max_window)
                        if item.done:
                            yield self._result(item)
                        windows.extend((item, i) for i in range(len(item.windows)))
                while windows and len(live) < budget:
                    item, i = windows.popleft()
                    if item.error is None:
                        self._submit(item, i, live)
                        if item.error is not None:
                            yield self._result(item)
                if not live:
                    if exhausted and not windows:
                        return
                    continue
                self.peak_live = max(self.peak_live, len(live))
                for out in self._engine.step():
                    if not out.finished or out.request_id not in live:
                        continue
                    item, i = live.pop(out.request_id)
                    ids = [t for t in out.outputs[0].token_ids if t != self.eot]
                    item.tokens[i] = ids
                    item.texts[i] = self.decode(ids)
                    if item.done and item.error is None:
                        yield self._result(item)
        finally:  # the caller stopped early (or failed): leave nothing running in the engine
            if live:
                self._engine.abort_request(list(live))

    def decode(self, ids: list[int]) -> str:
        """Text of generated token ids (timestamp and other special tokens dropped)."""
        return self.tokenizer.decode([t for t in ids if t < self.eot]).strip()

    def _plan(self, job, max_window: float) -> _Input:
        audio = getattr(job, "audio", None)
        if audio is None or len(audio) == 0:
            return _Input(job, [], error=f"{job.id}: empty audio")
        try:
            windows = plan_windows(np.asarray(audio, dtype=np.float32), RATE, max_window)
        except ValueError as e:
            return _Input(job, [], error=f"{job.id}: {e}")
        return _Input(job, windows)

    def _submit(self, item: _Input, i: int, live: dict) -> None:
        from speechctl.engine import vllm_compat

        job, window = item.job, item.windows[i]
        key = f"w{next(self._ids)}"
        audio = np.ascontiguousarray(job.audio[window.start : window.end], dtype=np.float32)
        prompt = {
            "encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (audio, RATE)}},
            "decoder_prompt": {"prompt_token_ids": list(self.prompt)},
        }
        try:
            self._engine.add_request(key, prompt, self._sampling(job, i))
        except vllm_compat.REQUEST_ERRORS as e:
            item.error = f"{job.id}: {str(e).splitlines()[0]}"
            return
        live[key] = (item, i)

    def _sampling(self, job, index: int):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        text = job.text_sampling
        seed = None if job.seed is None or text.temperature == 0 else job.seed + index
        return SamplingParams(
            temperature=text.temperature,
            top_k=text.top_k if text.top_k > 0 else -1,
            top_p=text.top_p,
            seed=seed,
            max_tokens=max(1, min(job.max_tokens, self.max_tokens)),
            stop_token_ids=[self.eot],
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def _result(self, item: _Input):
        from speechctl.jobs import AsrResult

        if item.error is not None:
            return AsrResult(item.job.id, None, error=item.error)
        segments = [segment(w, item.texts[i]) for i, w in enumerate(item.windows)]
        segments = [s for s in segments if s.text]
        return AsrResult(item.job.id, join_text(segments), segments=segments, tokens=[item.tokens[i] for i in range(len(item.windows))])

    def close(self) -> None:
        llm = getattr(self, "_llm", None)
        if llm is not None:
            from speechctl.engine import vllm_compat

            self._llm = self._engine = None
            vllm_compat.stop_worker_processes(llm.llm_engine)
            del llm
            vllm_compat.collect_dropped_engines()

