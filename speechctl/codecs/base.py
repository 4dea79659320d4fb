"""The acoustic codec interface.

A codec maps a mono waveform of ``T * hop_length`` samples to ``K`` codebooks of ``T`` frames of
integer codes (``[K, T]``) and back. Subclasses wrap one model family and implement three small
batched primitives on equal-length batches; ``Codec`` turns them into ``encode`` / ``decode``
over lists of items of different lengths that give, up to float rounding, exactly what encoding or
decoding each item on its own gives (``batching.run_exact_batched``), on CUDA within a memory
budget and through CUDA graphs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from abc import ABC, abstractmethod

import numpy as np
import torch

from speechctl.codecs.batching import Context, bounded, frames_within, measure_context, pad_end, run_exact_batched
from speechctl.errors import InputError
from speechctl.graphs import StepGraphs

logger = logging.getLogger(__name__)

# Frames (items x padded frames) per model call at most; bounds activation memory on the CPU.
# About 11 minutes of 50 Hz audio; on CUDA a codec measures what a frame costs and lowers it to
# its memory budget (``Codec.fit_to_memory``).
DEFAULT_MAX_BATCH_FRAMES = 32768

# Decode graphs (CUDA) need few shapes. A codec with a finite receptive field decodes an item
# longer than left context + this many frames + right context as windows of exactly that length
# (their context is decoded twice, so a longer core wastes less: Higgs' tokenizer, 11 + 11
# frames, 15 %). Calls are padded up to one of GRAPH_FRAMES (``run_exact_batched``'s ``pad_to``:
# exact, the padding's effect is decoded again at the items' natural end, or for a causal codec
# never reaches back); a causal codec decodes longer calls eagerly.
GRAPH_WINDOW_CORE = 128
GRAPH_FRAMES = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# Decode graphs kept at most (batch-size buckets x lengths); past it a new shape decodes eagerly.
MOST_DECODE_GRAPHS = 192


def decode_graphs_enabled(codec: "Codec") -> bool:
    """Decode in CUDA graphs: on CUDA, for a codec whose calls can be given a few shapes (a finite
    receptive field both ways, DAC and Higgs' tokenizer, or a causal one, Mimi; not EnCodec, whose
    left context is its whole input and whose right is not empty), unless
    ``SPEECHCTL_CODEC_GRAPHS=0``. On by default since all five of ``tests/test_codecs.py -k cuda``
    passed on a GPU (H100, 2026-12-05: graphed decodes equal eager, the graphs share one pool);
    opt-in before, as a wrong graphed decode would be heard."""
    shapeable = bounded(codec.decode_context) or codec.decode_context[1] == 0
    return codec.device.type == "cuda" and shapeable and os.environ.get("SPEECHCTL_CODEC_GRAPHS", "1") != "0"


def codec_compile_mode(codec: "Codec") -> str:
    """What of the codec's decode ``load_codec`` compiles: ``SPEECHCTL_CODEC_COMPILE`` = "snakes"
    (the default on CUDA: its Snake activations, ``fuse_snakes``), "decoder" (the whole decoder,
    ``compile_decoder``: an opt-in to measure, 2.3x the eager decode of Higgs' tokenizer on the
    H100 against the Snakes' 1.5x, fifty-first session) or "0" (nothing: transformers' eager
    modules). Nothing on the CPU, where a short command would wait for the compile."""
    mode = os.environ.get("SPEECHCTL_CODEC_COMPILE", "snakes")
    mode = {"1": "snakes", "0": "none"}.get(mode, mode)
    if mode not in ("snakes", "decoder", "none"):
        raise InputError(f"SPEECHCTL_CODEC_COMPILE={mode!r}: give snakes, decoder or 0")
    return mode if codec.device.type == "cuda" else "none"


def compile_decoder(codec: "Codec") -> bool:
    """Compile the codec's decoder (its model's ``decoder_module``) whole with ``torch.compile``,
    shapes dynamic: every elementwise op between its convolutions fused; False where the codec
    names none. The compile happens at the first decode of a shape, eagerly, before any graph
    records it (``StepGraphs.run``)."""
    name = getattr(codec, "decoder_module", None)
    if name is None:
        return False
    setattr(codec.model, name, torch.compile(getattr(codec.model, name), dynamic=True))
    return True


def _snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The Snake activation as transformers' ``Snake1d`` computes it, ``x`` ``[B, C, T]``."""
    return x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)


_fused_snake = None  # _snake compiled (one for all Snakes: the shapes are dynamic)


def fuse_snakes(model: torch.nn.Module) -> int:
    """Run every Snake activation of ``model`` (transformers' ``Snake1d``: DAC's decoder, Higgs'
    tokenizer's acoustic decoder) as one fused kernel compiled by ``torch.compile``; returns how
    many. Why: eager, a Snake is five kernels over its whole input (x * alpha, sin, square,
    times 1 / alpha, plus x), each reading and writing it; on the H100 elementwise kernels were
    ~70 % of the Higgs tokenizer's decode and its convolutions ~10 % (``benchmarks/codec_speed.py``,
    fifty-first session). CUDA only (``load_codec``): on the CPU its compile, not its run, is what
    a short command would wait for. The first decode of a new shape compiles before any graph
    records it (``StepGraphs.run`` runs a shape eagerly first)."""
    global _fused_snake
    snakes = [m for m in model.modules() if type(m).__name__ == "Snake1d"]
    if snakes and _fused_snake is None:
        _fused_snake = torch.compile(_snake, dynamic=True)
    for snake in snakes:
        snake.forward = functools.partial(_fused_snake_forward, snake)
    return len(snakes)


def _fused_snake_forward(snake: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    shape = hidden_states.shape
    return _fused_snake(hidden_states.reshape(shape[0], shape[1], -1), snake.alpha).reshape(shape)


def keep_conv_padding_on_host(model: torch.nn.Module) -> int:
    """Move the scalar stride / kernel-size buffers of transformers' EnCodec and Mimi
    convolutions back to the CPU after the model went to its device; returns how many
    convolutions had them. Each such convolution computes its padding from those scalars and
    hands it to ``F.pad`` as a Python int: on the GPU that is a host sync per convolution (an
    eager decode waits on every one of them) and it invalidates a CUDA graph capture."""
    moved = 0
    for module in model.modules():
        if not hasattr(module, "_get_extra_padding_for_conv1d"):
            continue
        for name in ("stride", "kernel_size", "padding_total"):
            if module._buffers.get(name) is not None:
                module._buffers[name] = module._buffers[name].cpu()
        moved += 1
    return moved


class Codec(ABC):
    """A multi-codebook acoustic codec: mono waveforms <-> integer codes ``[K, T]``.

    Attributes:
        sample_rate: Hz of waveforms in and out.
        frame_rate: code frames per second (``sample_rate / hop_length``).
        hop_length: waveform samples per code frame.
        num_codebooks: ``K``, rows of a code array.
        codebook_size: codes are ints in ``[0, codebook_size)``.
        device: where the model runs.
        decode_context: ``(left, right)`` frames: decoded frame ``t`` depends on code frames
            ``t - left .. t + right`` only. Measured at load time (see ``measure_context``);
            ``right == 0`` for a causal decoder. Streaming decode reuses it.
        encode_context: ``(left, right)`` frames: code frame ``t`` depends on the waveform of
            frames ``t - left .. t + right`` only.
        max_batch_frames: largest ``items x padded frames`` given to one model call (on CUDA
            lowered to the codec's memory budget at load, ``fit_to_memory``).
        graph_window: with decode graphs on (``use_decode_graphs``), the frames of the windows an
            item longer than it is decoded in; None otherwise.

    Subclasses set the model up, call ``Codec.__init__`` and then ``self.measure_contexts()``, and
    implement ``_decode_batch``, ``_encode_batch`` and ``_encoder_features``; one whose ``model``
    decodes through a submodule that takes the quantized latents to audio names it in
    ``decoder_module`` (``compile_decoder``).
    """

    decoder_module: str | None = None

    sample_rate: int
    frame_rate: float
    hop_length: int
    num_codebooks: int
    codebook_size: int
    device: torch.device
    decode_context: Context
    encode_context: Context
    max_batch_frames: int

    def __init__(
        self,
        *,
        sample_rate: int,
        hop_length: int,
        num_codebooks: int,
        codebook_size: int,
        device: str | torch.device = "cpu",
        max_batch_frames: int = DEFAULT_MAX_BATCH_FRAMES,
    ):
        if max_batch_frames < 1:
            raise ValueError(f"max_batch_frames must be positive, got {max_batch_frames}")
        self.sample_rate = int(sample_rate)
        self.hop_length = int(hop_length)
        self.frame_rate = self.sample_rate / self.hop_length
        self.num_codebooks = int(num_codebooks)
        self.codebook_size = int(codebook_size)
        self.device = torch.device(device)
        self.max_batch_frames = int(max_batch_frames)
        self.decode_bytes_per_frame: float | None = None  # measured on CUDA (fit_to_memory)
        # Device memory the codec leaves alone though the driver reports it free: the room an engine
        # beside it may still need for its steps' activations (load_codec sets it).
        self.leave_free_bytes = 0
        # On CUDA the codec runs on a stream of its own: its results are waited for alone, not
        # behind the engine's next step that vLLM's async scheduling has already queued.
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._lock = threading.Lock()  # decodes may run on a worker thread (worker.py) beside encodes
        self._graphs: StepGraphs | None = None  # the decode's CUDA graphs (use_decode_graphs)
        self._told_no_room = False  # (a graph left out for memory is said once: _room_for_graph)
        self._told_split = False  # (a decode split for memory is said once: _decode_eager)
        self._graph_out: torch.Tensor | None = None  # the buffer they write their waveforms to
        self._graph_lengths: list[int] = []  # frames the decode's calls are padded up to (graphs on)
        self.graph_window: int | None = None
        self.compiled: str | None = None  # what of its decode runs compiled (``load_codec``; CUDA)

    # ---- what a codec family implements: equal-length batches, no padding logic ----

    @abstractmethod
    def _decode_batch(self, codes: torch.Tensor) -> torch.Tensor:
        """int64 ``[B, K, T]`` on ``self.device`` -> float ``[B, S]`` waveforms, S close to T*hop.

        ``S`` may differ from ``T * hop_length`` by a few samples (odd upsampling strides); the
        base class trims or zero-pads the end.
        """

    @abstractmethod
    def _encode_batch(self, waveforms: torch.Tensor) -> torch.Tensor:
        """float32 ``[B, T * hop_length]`` on ``self.device`` -> int64 codes ``[B, K, T]``."""

    @abstractmethod
    def _encoder_features(self, waveforms: torch.Tensor) -> torch.Tensor:
        """float32 ``[B, T * hop_length]`` -> continuous features ``[B, C, T]`` that fix the codes.

        The encoder output before quantization; quantization must act on each frame alone.
        Only used to measure ``encode_context``: codes are discrete, so a perturbation that
        reaches a frame need not change its code, while it always changes these features.
        """

    # ---- public API ----

    def decode(self, codes: list[np.ndarray]) -> list[np.ndarray]:
        """Decode items of codes, int ``[K, T]`` each, to float32 waveforms ``[T * hop_length]``.

        Batched internally (see ``run_exact_batched``); each result equals decoding that item on
        its own up to float rounding. Where the model returns fewer than ``T * hop_length``
        samples the end is zero-padded (DAC with an odd upsampling stride returns a few short).
        """
        items = _as_list(codes, "codes")
        arrays = [self._check_codes(item, index) for index, item in enumerate(items)]
        hop = self.hop_length

        def decode_batch(batch: torch.Tensor) -> torch.Tensor:
            waveforms = self._decode_on_device(batch.to(self.device)).float()
            return pad_end(waveforms, batch.shape[-1] * hop).cpu()  # exactly T * hop samples

        nonempty = [i for i, a in enumerate(arrays) if a.shape[1] > 0]
        with self._on_own_stream():
            outputs = run_exact_batched(
                [torch.from_numpy(arrays[i]) for i in nonempty],
                decode_batch,
                in_per_frame=1,
                out_per_frame=hop,
                context=self.decode_context,
                max_batch_frames=self.max_batch_frames,
                window=self.graph_window,
                pad_to=self._graph_lengths,
            )
        results = [np.zeros(0, dtype=np.float32) for _ in arrays]
        for i, output in zip(nonempty, outputs):
            results[i] = output.numpy()
        return results

    def encode(self, waveforms: list[np.ndarray]) -> list[np.ndarray]:
        """Encode mono float waveforms at ``sample_rate`` to int64 codes ``[K, T]`` each.

        A waveform of N samples gives ``T = ceil(N / hop_length)`` frames: its end is zero-padded
        to the next multiple of ``hop_length`` first (the codec only sees whole frames). Batched
        internally (see ``run_exact_batched``); each result equals encoding that item on its own,
        except where float rounding flips a near-tie between two codes (rare).
        """
        items = _as_list(waveforms, "waveforms")
        arrays = [self._check_waveform(item, index) for index, item in enumerate(items)]
        hop = self.hop_length

        def encode_batch(batch: torch.Tensor) -> torch.Tensor:
            codes = self._encode_batch(batch.to(self.device))
            frames = batch.shape[-1] // hop
            if codes.shape[-1] != frames:
                name = type(self).__name__
                raise RuntimeError(f"{name} encoded {frames} frames of audio into {codes.shape[-1]} frames")
            return codes.long().cpu()

        padded = [np.pad(a, (0, -len(a) % hop)) for a in arrays]
        nonempty = [i for i, a in enumerate(padded) if len(a) > 0]
        with self._on_own_stream():
            outputs = run_exact_batched(
                [torch.from_numpy(padded[i]) for i in nonempty],
                encode_batch,
                in_per_frame=hop,
                out_per_frame=1,
                context=self.encode_context,
                max_batch_frames=self.max_batch_frames,
            )
        results = [np.zeros((self.num_codebooks, 0), dtype=np.int64) for _ in arrays]
        for i, output in zip(nonempty, outputs):
            results[i] = output.numpy()
        return results

    # ---- decode graphs ----

    def use_decode_graphs(self, core: int = GRAPH_WINDOW_CORE, most: int = MOST_DECODE_GRAPHS) -> None:
        """Decode in CUDA graphs from now on, recorded per (batch-size bucket, frames) the first
        time each is met (``record_decode_graphs``: ahead of time), at most ``most`` of them.
        Why: eager, a decode is hundreds of kernel launches, and on the codec's worker thread each
        waits for Python's lock while the engine's thread runs Python (``speechctl.graphs``); a
        replay is one launch. The shapes are made few (module constants): windows of
        ``left + core + right`` frames (``graph_window``) where the receptive field is finite,
        and calls padded to ``GRAPH_FRAMES`` (and the lengths ``record_decode_graphs`` is given).
        Every graph writes its waveforms into one buffer, so that the graphs' memory is their
        largest decode's, not the sum of their outputs."""
        left, right = self.decode_context
        self.graph_window = left + core + right if bounded(self.decode_context) else None
        longest = self.graph_window or GRAPH_FRAMES[-1]
        self._graph_lengths = sorted({n for n in GRAPH_FRAMES if n <= longest and self._paddable(n)} | {longest})
        most_rows = max(1, self.max_batch_frames // longest)
        sizes = [1 << i for i in range(most_rows.bit_length())] + [most_rows]
        self._graphs = StepGraphs(sizes, self.device, most=most)
        self._graph_out = torch.zeros((most_rows, longest * self.hop_length), device=self.device)

    @property
    def decode_graphs(self) -> str | None:
        """How the decode's calls meet its graphs (None: it decodes eagerly); benches record it."""
        if self._graphs is None:
            return None
        lengths = f"calls padded to {self._graph_lengths[0]}-{self._graph_lengths[-1]} frames"
        return f"windows of {self.graph_window} frames, {lengths}" if self.graph_window else f"causal, {lengths}"

    @property
    def decode_graphs_recorded(self) -> int:
        """Decode graphs recorded so far (0 without graphs): one recorded mid-run costs that
        decode an eager run and a capture."""
        return self._graphs.captured if self._graphs is not None else 0

    def decode_eagerly(self) -> None:
        """Decode without graphs from now on (their memory goes back once nothing holds it)."""
        self._graphs = self.graph_window = self._graph_out = None
        self._graph_lengths = []

    def record_decode_graphs(self, frame_counts=(), most_rows: int = 64, padded: bool = False) -> int:
        """Record now the decode graphs of the batch-size buckets up to ``most_rows`` for calls of
        each of ``frame_counts`` frames (which calls are then not padded past) and of a long
        item's window, instead of at their first use (larger buckets: there); with ``padded``,
        also of every call a whole item's decode makes (``run_exact_batched``): the lengths calls
        are padded to and the natural-end windows (``left + right`` frames) in those buckets, and
        items shorter than that window, each its own length, one row (they run in groups of
        equal length: mostly alone); returns how many were new (none without graphs).
        The streamer calls it with its windows' lengths (``StreamingDecoder.window_lengths``): a
        first chunk then never waits for one, nor for a longer decode than its own; and with
        ``padded``, for its one-shot requests' whole audio. A graph recorded mid-run is an eager
        decode and a capture on the codec's thread, and ``torch.cuda.graph`` synchronizes the
        device and empties the caching allocator before each capture, while the engine's steps
        run (the Higgs 3B workload bench's first timed round met 16, and its engine steps took
        1.5x as long as the same round's after it: fortieth session)."""
        if self._graphs is None:
            return 0
        before, started, reserved = self._graphs.captured, time.perf_counter(), self._reserved_bytes()
        longest = self._graph_lengths[-1]
        lengths = {n for n in frame_counts if n <= longest}
        self._graph_lengths = sorted(set(self._graph_lengths) | {n for n in lengths if self._paddable(n)})
        rows = dict.fromkeys(lengths | {self.graph_window or longest}, most_rows)  # frames -> most rows
        if padded:
            rows.update(dict.fromkeys(self._graph_lengths, most_rows))
            end_window = sum(self.decode_context) if bounded(self.decode_context) and self.decode_context[1] else 0
            rows.update({n: rows.get(n, 1) for n in range(1, min(end_window, longest + 1))})
            if 0 < end_window <= longest:
                rows[end_window] = most_rows
        # self._graphs is read anew for every shape, never held here: where a capture fails the
        # decode falls back to eager and frees the graphs and their pool first, and a reference
        # here kept them (and their memory) through that eager decode (H100, Higgs 3B beside an
        # engine at its default share: the fallback ran out of memory, fortieth session).
        sizes = self._graphs.sizes
        with self._on_own_stream(), torch.no_grad():
            for frames in sorted(rows):
                for size in sizes:
                    if size > rows[frames] or size * frames > self.max_batch_frames or self._graphs.recorded(size, frames):
                        continue
                    if not self._room_for_graph(size, frames):
                        break  # (larger buckets need more: they decode eagerly)
                    self._decode_on_device(torch.zeros((size, self.num_codebooks, frames), dtype=torch.int64, device=self.device))
                    if self._graphs is None:  # it could not be recorded: eager from now on
                        return 0
        recorded = self._graphs.captured - before
        logger.info("speechctl: %d decode graphs of %s recorded in %.1f s (the device's reserved memory %+.0f MiB)",
                    recorded, type(self).__name__, time.perf_counter() - started, (self._reserved_bytes() - reserved) / 2**20)
        return recorded

    def _room_for_graph(self, size: int, frames: int) -> bool:
        """Whether the device has the memory to record the graph of ``size`` rows x ``frames``
        and still decode eagerly what has no graph: its capture's activations go into the graphs'
        pool (kept while the graph lives), beside the caching allocator's blocks of the largest
        eager decode (``max_batch_frames``; a recording's own eager run reuses them), at
        ``decode_bytes_per_frame`` (measured at load), and a quarter more. A graph that does not
        fit is not recorded (its calls decode eagerly) and says so once: beside an engine that
        took its share, recording every bucket ran the H200 out of memory (thirty-first session,
        Higgs 3B's workload bench)."""
        if self.decode_bytes_per_frame is None:  # (the CPU: no graphs' memory to watch)
            return True
        need = 1.25 * self.decode_bytes_per_frame * (size * frames + self.max_batch_frames)
        free = self._free_bytes()
        if free >= need:
            return True
        if not self._told_no_room:
            self._told_no_room = True
            logger.warning("speechctl: %s records no decode graph of %d x %d frames: it needs ~%.0f MiB, %.0f MiB are free; "
                           "such calls decode eagerly", type(self).__name__, size, frames, need / 2**20, free / 2**20)
        return False

    def _free_bytes(self) -> float:
        """Device memory the codec may still take: the driver's free memory plus what the caching
        allocator holds unused, less what it leaves to an engine (``leave_free_bytes``)."""
        from speechctl.accelerator import device_bytes_free

        return max(0.0, device_bytes_free(self.device) - self.leave_free_bytes)

    def _reserved_bytes(self) -> int:
        return torch.cuda.memory_reserved(self.device) if self.device.type == "cuda" else 0

    def _paddable(self, frames: int) -> bool:
        """Whether a call may be padded up to ``frames`` (a non-causal call shorter than its
        context cannot be: it runs at its own length, ``run_exact_batched``'s step 3)."""
        left, right = self.decode_context
        return right == 0 or frames >= left + right

    def _decode_on_device(self, codes: torch.Tensor) -> torch.Tensor:
        """``_decode_batch`` through the decode graphs where one fits, else eagerly. A graph's
        waveforms are read before the next decode (``decode`` copies them to the host)."""
        graphs = self._graphs
        if graphs is None:
            return self._decode_eager(codes)
        rows, frames = codes.shape[0], codes.shape[-1]
        size = graphs.bucket(rows)
        if size is None or frames > self._graph_lengths[-1] or size * frames > self.max_batch_frames:
            return self._decode_eager(codes)
        if not graphs.recorded(size, frames) and not self._room_for_graph(size, frames):
            return self._decode_eager(codes)
        out, hop = self._graph_out, self.hop_length

        def decode_into_buffer(batch: torch.Tensor) -> tuple[torch.Tensor]:
            waveforms = self._decode_batch(batch)
            samples = min(waveforms.shape[-1], frames * hop)  # (DAC's odd strides give a few fewer)
            return (out[: batch.shape[0], :samples].copy_(waveforms[:, :samples]),)

        failed = False
        try:
            result = graphs.run(decode_into_buffer, frames, rows, (codes,), (0,))
        except RuntimeError as error:  # a decode that cannot be captured (it syncs the host ...)
            # (the message, not the error: a log handler that keeps records, as pytest's does,
            # would keep its traceback, and the graphs with it)
            logger.warning("speechctl: %s decodes eagerly: its decode could not be recorded as a CUDA graph (%s)",
                           type(self).__name__, str(error))
            failed = True
        if failed:
            # Out of the handler (its traceback holds the failed capture's tensors): the graphs and
            # their pool go back to the device before the eager decode needs the memory.
            del graphs
            self.decode_eagerly()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return self._decode_eager(codes)
        return self._decode_eager(codes) if result is None else result[0]  # (None: past the most kept)

    def _decode_eager(self, codes: torch.Tensor) -> torch.Tensor:
        """``_decode_batch``, in halves of its rows where the device runs out of memory (down to one
        row, which fails as it would have): a decode beside an engine at its share meets what the
        codec's budget did not foresee (the real Higgs 3B's workload at vLLM's default share on
        an H100: a capture there failed, then the eager decode of its batch, 180 MiB short by 12,
        forty-second session), and a call of fewer rows gives the same audio row for row."""
        try:
            return self._decode_batch(codes)
        except torch.OutOfMemoryError as error:
            if codes.shape[0] == 1:
                raise
            message = str(error).splitlines()[0]
        # (out of the handler: its traceback holds the failed call's tensors)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        if not self._told_split:
            self._told_split = True
            logger.warning("speechctl: %s ran out of memory decoding %d rows at once (%s): it decodes such calls in "
                           "halves", type(self).__name__, codes.shape[0], message)
        half = codes.shape[0] // 2
        return torch.cat([self._decode_eager(codes[:half]), self._decode_eager(codes[half:])])

    @contextlib.contextmanager
    def _on_own_stream(self):
        """One call at a time, on the codec's CUDA stream (the CPU: just the lock)."""
        with self._lock, (torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()):
            yield

    # ---- memory ----

    def fit_to_memory(self, budget_bytes: int | None = None, probe_frames: int = 1024) -> None:
        """On CUDA, lower ``max_batch_frames`` so that one decode call's activations stay within
        ``budget_bytes`` (default ``accelerator.codec_memory_budget``), from the peak of a probe
        decode of ``probe_frames`` frames. A fixed frame count cannot do it: a frame costs what its
        samples and channels do (Higgs' tokenizer 960 samples a frame, Mimi 1920, DAC 512), and the
        real Higgs 3B's and CSM's end-to-end benches ran out of memory at 64 x 256 frames beside an
        engine at its default share. Elsewhere (the CPU) nothing changes."""
        if self.device.type != "cuda":
            return
        from speechctl.accelerator import codec_memory_budget

        if budget_bytes is None:
            budget_bytes = codec_memory_budget(self._free_bytes())
        batch = 4
        codes = torch.randint(0, self.codebook_size, (batch, self.num_codebooks, probe_frames // batch), device=self.device)
        frames = codes.shape[0] * codes.shape[2]
        with self._on_own_stream(), torch.no_grad():
            torch.cuda.synchronize(self.device)
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._decode_batch(codes)
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device) - before
        self.decode_bytes_per_frame = peak / frames
        self.max_batch_frames = frames_within(budget_bytes, self.decode_bytes_per_frame, self.max_batch_frames)
        torch.cuda.empty_cache()  # the probe's blocks go back: an engine started after sees them free

    # ---- receptive fields ----

    def measure_contexts(self, seed: int = 0) -> None:
        """Measure ``decode_context`` and ``encode_context`` on this model (a few model calls)."""
        generator = torch.Generator().manual_seed(seed)
        hop = self.hop_length

        def decode_probe(frames: int) -> tuple[torch.Tensor, torch.Tensor]:
            shape = (1, self.num_codebooks, frames)
            base = torch.randint(0, self.codebook_size, shape, generator=generator)
            changed = base.clone()
            shift = torch.randint(1, self.codebook_size, (self.num_codebooks,), generator=generator)
            changed[0, :, frames // 2] = (base[0, :, frames // 2] + shift) % self.codebook_size
            return base, changed

        def encode_probe(frames: int) -> tuple[torch.Tensor, torch.Tensor]:
            base = 0.1 * torch.randn(1, frames * hop, generator=generator)
            changed = base.clone()
            start = (frames // 2) * hop
            changed[0, start : start + hop] += 0.1 * torch.randn(hop, generator=generator)
            return base, changed

        def decode_output(codes: torch.Tensor) -> torch.Tensor:
            return self._decode_batch(codes.to(self.device)).float().cpu()[:, None, :]

        def encode_output(waveforms: torch.Tensor) -> torch.Tensor:
            return self._encoder_features(waveforms.to(self.device)).float().cpu()

        self.decode_context = measure_context(decode_output, decode_probe, out_per_frame=hop)
        self.encode_context = measure_context(encode_output, encode_probe, out_per_frame=1)

    # ---- input checks ----

    def _check_codes(self, codes: np.ndarray, index: int) -> np.ndarray:
        array = np.asarray(codes)
        if array.ndim != 2 or array.shape[0] != self.num_codebooks:
            expected = f"[{self.num_codebooks}, T]"
            raise ValueError(f"codes[{index}]: expected shape {expected}, got {list(array.shape)}")
        if not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"codes[{index}]: expected integer codes, got dtype {array.dtype}")
        if array.size and (array.min() < 0 or array.max() >= self.codebook_size):
            found = f"[{array.min()}, {array.max()}]"
            raise ValueError(f"codes[{index}]: codes must be in [0, {self.codebook_size}), got {found}")
        return np.ascontiguousarray(array, dtype=np.int64)

    def _check_waveform(self, waveform: np.ndarray, index: int) -> np.ndarray:
        array = np.asarray(waveform)
        if array.ndim != 1:
            shape = list(array.shape)
            raise ValueError(f"waveforms[{index}]: expected a mono waveform [N], got shape {shape}")
        if not np.issubdtype(array.dtype, np.floating):
            raise ValueError(f"waveforms[{index}]: expected float samples, got dtype {array.dtype}")
        if not np.all(np.isfinite(array)):
            raise ValueError(f"waveforms[{index}]: contains NaN or infinite samples")
        return np.ascontiguousarray(array, dtype=np.float32)


def _as_list(items, name: str) -> list:
    if isinstance(items, (np.ndarray, torch.Tensor)):
        raise ValueError(f"{name}: pass a list of arrays, one per item (got a single {type(items).__name__})")
    return list(items)
