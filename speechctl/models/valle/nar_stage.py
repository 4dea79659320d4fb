"""The NAR stage: whole utterances of many requests, batched, K-1 passes per batch, beside vLLM.

    stage = NarStage(model, device)
    stage.submit([NarJob(key, inputs, first, seed)])  # as AR requests finish
    for key, codes, error in stage.poll(): ...       # [K, T] codes of finished utterances (never waits)
    stage.run(jobs)                                   # the same work, synchronously (tests)

A worker thread takes everything queued (sorted by length, up to ``max_batch_tokens`` padded
positions per batch) and runs the passes; on CUDA on a stream of its own, so its kernels overlap
vLLM's steps and its one copy to the host per batch waits for this stream alone. The step loop
only appends to a queue and drains another: it never waits for the NAR stage.

A batch is padded (``[B, L_max, H]``, padding keys masked), so an utterance's codes do not
depend on what it is batched with; sampled codebooks draw counter-based noise keyed by (seed,
frame, codebook), the runtime's (``engine/runtime/sampling.py``), so they do not either.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from speechctl.engine.runtime.sampling import gumbel_noise, sample_streams
from speechctl.models.valle.nar import NarTransformer
from speechctl.models.valle.prompts import NarInputs
from speechctl.threads import prompt_workers


@dataclass(eq=False)
class NarJob:
    key: object  # the caller's handle, returned with the result
    inputs: NarInputs
    first: np.ndarray  # [T] codebook 0 from the AR stage
    seed: int

    @property
    def length(self) -> int:
        return len(self.inputs.text_ids) + self.inputs.prompt_codes.shape[1] + len(self.first)


class NarStage:
    def __init__(self, model: NarTransformer, device: torch.device, *, max_batch_tokens: int | None = None,
                 threaded: bool = True):
        """``threaded`` False: no worker, ``run`` only (tests)."""
        self.model, self.device = model, torch.device(device)
        self.max_batch_tokens = max_batch_tokens or (32768 if self.device.type == "cuda" else 4096)
        self._stream = None
        if self.device.type == "cuda":
            self._stream = torch.cuda.Stream(self.device)
            self._stream.wait_stream(torch.cuda.current_stream(self.device))  # the weights just loaded
        self._cv = threading.Condition()
        self._pending: list[NarJob] = []
        self._running: list[NarJob] = []
        self._done: list[tuple[object, np.ndarray | None, str | None]] = []
        self._cancelled: set[int] = set()
        self._stop = False
        self.stats = {"batches": 0, "utterances": 0, "largest_batch": 0, "busy_s": 0.0}
        self._thread = threading.Thread(target=self._loop, name="speechctl-nar", daemon=True) if threaded else None
        if self._thread is not None:
            prompt_workers()
            self._thread.start()

    # -- the step loop's side: never waits ------------------------------------------------------

    def submit(self, jobs: list[NarJob]) -> None:
        """Queue utterances (those an AR step finished, together: the worker batches them)."""
        with self._cv:
            self._pending += jobs
            self._cv.notify_all()

    def poll(self) -> list[tuple[object, np.ndarray | None, str | None]]:
        """(key, codes [K, T], None) or (key, None, error) of every utterance finished so far."""
        with self._cv:
            done, self._done = self._done, []
        return done

    def wait(self, timeout: float) -> None:
        """Block until a result is ready (for a caller with nothing else to do), or ``timeout``."""
        with self._cv:
            self._cv.wait_for(lambda: self._done or not (self._pending or self._running), timeout)

    def working(self) -> bool:
        """Utterances queued or in a batch now (results not yet collected excluded)."""
        with self._cv:
            return bool(self._pending or self._running)

    def cancel(self, keys) -> None:
        """Drop these utterances: queued ones now, running ones when their batch ends."""
        ids = {id(k) for k in keys}
        with self._cv:
            self._pending = [j for j in self._pending if id(j.key) not in ids]
            self._cancelled |= {id(j.key) for j in self._running if id(j.key) in ids}
            self._done = [d for d in self._done if id(d[0]) not in ids]

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._pending.clear()
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()

    # -- the worker -----------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._pending or self._stop)
                if self._stop:
                    return
                batch = self._take()
                self._running = batch
            try:
                results = [(j.key, codes, None) for j, codes in zip(batch, self._run_batch(batch))]
            except Exception as e:  # noqa: BLE001 - one line per request, and the stage lives on
                error = f"NAR stage failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
                results = [(j.key, None, error) for j in batch]
            with self._cv:
                self._done += [r for r in results if id(r[0]) not in self._cancelled]
                self._cancelled.clear()
                self._running = []
                self._cv.notify_all()

    def _take(self) -> list[NarJob]:
        """The queued jobs that fit one batch, shortest first (less padding)."""
        self._pending.sort(key=lambda j: j.length)
        count = len(_batches(self._pending, self.max_batch_tokens)[0])
        batch, self._pending = self._pending[:count], self._pending[count:]
        return batch

    # -- the passes -----------------------------------------------------------------------------

    def run(self, jobs: list[NarJob]) -> list[np.ndarray]:
        """[K, T] codes of each job, batched as the worker batches them."""
        order = sorted(range(len(jobs)), key=lambda i: jobs[i].length)
        out: list[np.ndarray] = [None] * len(jobs)
        for batch in _batches(order, self.max_batch_tokens, lambda i: jobs[i].length):
            for i, codes in zip(batch, self._run_batch([jobs[i] for i in batch])):
                out[i] = codes
        return out

    @torch.no_grad()
    def _run_batch(self, jobs: list[NarJob]) -> list[np.ndarray]:
        started = time.perf_counter()
        with torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext():
            codes = self._passes(jobs).cpu().numpy()  # one copy; waits for this stream only
        s = self.stats
        s["batches"] += 1
        s["utterances"] += len(jobs)
        s["largest_batch"] = max(s["largest_batch"], len(jobs))
        s["busy_s"] += time.perf_counter() - started
        ends = np.cumsum([len(j.first) for j in jobs])
        return np.split(codes, ends[:-1], axis=1)

    def _passes(self, jobs: list[NarJob]) -> torch.Tensor:
        """[K, N] codes of the batch's N frames (job after job)."""
        model, cfg = self.model, self.model.cfg
        K = cfg.num_codebooks
        lay = _Layout(jobs, K)
        dev = self._to_device
        text_at, text_ids = (dev(lay.text_rows), dev(lay.text_pos)), dev(lay.text_ids)
        voice_at, voice = (dev(lay.voice_rows), dev(lay.voice_pos)), dev(lay.voice_codes)
        frames_at, first = (dev(lay.frame_rows), dev(lay.frame_pos)), dev(lay.first)
        dtype = model.audio_embed.weight.dtype
        inputs = torch.zeros(len(jobs), lay.max_len, cfg.hidden_size, dtype=dtype, device=self.device)
        inputs.index_put_(text_at, model.text_embed(text_ids))
        every = torch.arange(K, device=self.device).expand(voice.shape[0], K)
        inputs.index_put_(voice_at, model.embed_codes(voice, every).sum(dim=1))
        inputs.index_put_(frames_at, model.embed_codes(first, torch.zeros_like(first)))
        key_mask = torch.arange(lay.max_len, device=self.device)[None, :] < dev(lay.lengths)[:, None]
        sample = _sampler(jobs, lay, dev)
        codes = [first]
        for j in range(1, K):
            tokens = sample(model.logits(inputs, key_mask, j, frames_at), j)
            codes.append(tokens)
            if j < K - 1:
                inputs.index_put_(frames_at, model.embed_codes(tokens, torch.full_like(tokens, j)), accumulate=True)
        return torch.stack(codes)

    def _to_device(self, host: np.ndarray) -> torch.Tensor:
        """Pinned, so that the copy queues on this stream instead of waiting for the device."""
        t = torch.from_numpy(host)
        return t.pin_memory().to(self.device, non_blocking=True) if self._stream is not None else t


class _Layout:
    """Where each job's text, voice frames and frames sit in the padded batch: (rows, positions,
    values) as host arrays over the whole batch."""

    def __init__(self, jobs: list[NarJob], K: int):
        text, voice, frames = [], [], []
        for b, job in enumerate(jobs):  # per request, once per batch (not in any step loop)
            x, p, t = len(job.inputs.text_ids), job.inputs.prompt_codes.shape[1], len(job.first)
            text.append((np.full(x, b), np.arange(x), job.inputs.text_ids))
            voice.append((np.full(p, b), x + np.arange(p), job.inputs.prompt_codes.T))  # [p, K]
            frames.append((np.full(t, b), x + p + np.arange(t), job.first))
        self.text_rows, self.text_pos, self.text_ids = _joined(text)
        self.voice_rows, self.voice_pos, self.voice_codes = _joined(voice)
        self.frame_rows, self.frame_pos, self.first = _joined(frames)
        self.frames_per_job = [len(j.first) for j in jobs]
        self.frame_index = np.concatenate([np.arange(t) for t in self.frames_per_job]).astype(np.int64)
        self.lengths = np.asarray([j.length for j in jobs], np.int64)
        self.max_len = int(self.lengths.max())


def _joined(parts: list[tuple]) -> tuple[np.ndarray, ...]:
    return tuple(np.ascontiguousarray(np.concatenate(column).astype(np.int64)) for column in zip(*parts))


def _sampler(jobs: list[NarJob], lay: _Layout, dev):
    """``sample(logits [N, C], codebook) -> [N]`` with each job's NAR sampling and seed; greedy
    batches (VALL-E's default) take the argmax alone."""
    settings = [j.inputs.sampling for j in jobs]
    if all(s.temperature == 0 for s in settings):
        return lambda logits, j: logits.argmax(dim=-1)
    per = lambda values, dtype: dev(np.repeat(np.asarray(values, dtype), lay.frames_per_job))  # noqa: E731
    temperature, top_k = per([s.temperature for s in settings], np.float32), per([s.top_k for s in settings], np.int64)
    top_p = per([s.top_p for s in settings], np.float32)
    seed, step = per([j.seed & 0x7FFFFFFFFFFFFFFF for j in jobs], np.int64), dev(lay.frame_index)
    flags = dict(any_random=True, all_random=all(s.temperature > 0 for s in settings),
                 any_filter=any(s.filters for s in settings), max_top_k=0, any_top_p=any(s.top_p < 1 for s in settings))

    def sample(logits: torch.Tensor, j: int) -> torch.Tensor:
        noise = gumbel_noise(seed, step, 1, logits.shape[-1], first_stream=j)  # codebook j's own draws
        return sample_streams(logits[:, None, :], temperature, top_k, top_p, seed, step, noise=noise, **flags)[:, 0]

    return sample


def _batches(items: list, budget: int, length=lambda job: job.length) -> list[list]:
    """Consecutive runs of ``items`` (sorted by length) whose padded size fits ``budget``; at
    least one item each."""
    out, current, longest = [], [], 0
    for item in items:
        n = length(item)
        if current and max(longest, n) * (len(current) + 1) > budget:
            out.append(current)
            current, longest = [], 0
        current.append(item)
        longest = max(longest, n)
    return out + [current] if current else out or [[]]
