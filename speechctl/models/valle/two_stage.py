"""ArNarEngine: the AR+NAR family's two stages behind the engine interface ``Speech`` and the
streamer already drive (submit / step / abort / tags / generate_steps).

    AR   SpeechEngine (vLLM, continuous batch): codebook 1 of every request, frame by frame
    NAR  NarStage (worker thread; on CUDA its own stream): as each AR request finishes, its
         codebook 1 joins the next batch of whole utterances; K-1 passes fill codebooks 2..K
    ->   one StreamOutput per request with all K codebooks (``VallePrompts.full_output``), which
         ``Speech`` decodes with the codec like any family's

``step`` is one AR step plus bookkeeping: it hands finished AR outputs to the NAR queue and takes
whatever the NAR stage has finished, never waiting for it while vLLM has requests to decode; only
when the AR stage is idle does it wait (briefly) for the NAR stage instead of spinning. A
streamed request (``stream_tts``) gets its whole utterance in one piece once the NAR stage is
done: codebooks 2..K need the whole of codebook 1.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from speechctl.accelerator import has_cuda
from speechctl.engine.feed import feed_steps
from speechctl.engine.requests import StreamOutput, StreamRequest
from speechctl.errors import SpeechctlError
from speechctl.models.valle.prompts import NarInputs

IDLE_WAIT_S = 0.05  # how long an idle AR stage waits for the NAR stage per step


@dataclass(eq=False)
class _Staged:
    """A request between the stages (its tag inside the AR engine)."""

    tag: object  # the caller's
    inputs: NarInputs
    seed: int
    ar_output: StreamOutput | None = None


class ArNarEngine:
    def __init__(self, checkpoint, config=None):
        import torch

        from speechctl.engine.engine import SpeechEngine
        from speechctl.models.valle.nar import load_nar
        from speechctl.models.valle.nar_stage import NarStage

        self.ar = SpeechEngine(checkpoint, config)
        self.checkpoint = self.ar.checkpoint
        self.prompts = self.ar.prompt_builder()
        self._in_ar: dict[int, _Staged] = {}
        self._in_nar: dict[int, _Staged] = {}
        # AR steps timed apart by whether the NAR stage had work (does it slow vLLM down?), and
        # the step loop's own time around them (the hand-off: does the NAR stage block it?)
        self.timing = {"ar_steps_alone": 0, "ar_step_s_alone": 0.0, "ar_steps_beside_nar": 0,
                       "ar_step_s_beside_nar": 0.0, "handoff_s": 0.0}
        ck, cfg = self.checkpoint, self.ar.config
        dtype = cfg.dtype if cfg.dtype != "auto" else (ck.dtype or "float32")
        try:
            dummy = cfg.load_format == "dummy"
            model = load_nar(ck.path, ck.config, [] if dummy else [ck.path / name for name in ck.weights.chosen],
                             device="cuda" if has_cuda() else "cpu", dtype=getattr(torch, dtype),
                             dummy=dummy)
        except BaseException:
            self.ar.shutdown()
            raise
        self.nar = NarStage(model, model.audio_embed.weight.device)
        self.nar.run([self._warm_up_job()])  # first-use costs (kernels, cuBLAS) at start-up, not in a request

    def _warm_up_job(self):
        import numpy as np

        from speechctl.engine.params import GREEDY
        from speechctl.models.valle.nar_stage import NarJob

        K = self.checkpoint.spec.num_codebooks
        return NarJob(None, NarInputs(np.zeros(4, np.int64), np.zeros((K, 2), np.int64), GREEDY), np.zeros(8, np.int64), 0)

    def __getattr__(self, name: str):
        """The AR engine's own attributes (tokenizer, spec, config, capacity, prompt_length, ...)."""
        if name == "ar":
            raise AttributeError(name)
        return getattr(self.ar, name)

    def prompt_builder(self):
        return self.prompts

    # -- request lifecycle ----------------------------------------------------------------------

    def submit(self, request: StreamRequest) -> None:
        """Queue a TTS request (``VallePrompts.tts``); its seed, drawn here if unset, keys both
        stages' sampling."""
        seed = request.seed if request.seed is not None else secrets.randbits(63)
        staged = _Staged(request.tag, self.prompts.nar_inputs(request), seed)
        self._in_ar[id(staged)] = staged
        # the NAR stage takes its sampling (``depth``) and the whole utterance (no AR pieces)
        self.ar.submit(replace(request, tag=staged, seed=seed, depth=None, stream=False))

    def step(self) -> list[StreamOutput]:
        """One AR step; returns the requests whose NAR stage finished meanwhile (and failures)."""
        from speechctl.models.valle.nar_stage import NarJob

        results, jobs = [], []
        started = time.perf_counter()
        outputs = []
        if self.ar.has_work():
            beside = "beside_nar" if self.nar.working() else "alone"
            outputs = self.ar.step()
            stepped = time.perf_counter()
            self.timing[f"ar_steps_{beside}"] += 1
            self.timing[f"ar_step_s_{beside}"] += stepped - started
        else:
            stepped = None  # nothing for vLLM: the hand-off is all this step does
        for out in outputs:
            staged = self._in_ar.pop(id(out.tag), None)
            if staged is None:
                continue  # aborted meanwhile
            error = out.error
            if error is None:
                try:
                    first = self.prompts.first_codebook(out)
                except (SpeechctlError, ValueError) as e:
                    error = str(e)
            if error is not None:
                results.append(replace(out, tag=staged.tag, error=error))
                continue
            staged.ar_output = out
            self._in_nar[id(staged)] = staged
            jobs.append(NarJob(staged, staged.inputs, first, staged.seed))
        if jobs:
            self.nar.submit(jobs)
        if not self.ar.has_work() and not results and self._in_nar:
            self.nar.wait(IDLE_WAIT_S)  # nothing for vLLM to do: wait for the NAR stage, don't spin
        for staged, codes, error in self.nar.poll():
            if self._in_nar.pop(id(staged), None) is None:
                continue
            out = replace(staged.ar_output, tag=staged.tag)
            results.append(replace(out, error=error) if error else self.prompts.full_output(out, codes))
        if stepped is not None:
            self.timing["handoff_s"] += time.perf_counter() - stepped
        return results

    def has_work(self) -> bool:
        return bool(self._in_ar or self._in_nar or self.ar.has_work())

    def tags(self) -> list[object]:
        """The tags of the requests in either stage."""
        return [s.tag for s in (*self._in_ar.values(), *self._in_nar.values())]

    def abort(self, tags: Iterable[object]) -> None:
        ids = set(map(id, tags))
        in_ar = [s for s in self._in_ar.values() if id(s.tag) in ids]
        in_nar = [s for s in self._in_nar.values() if id(s.tag) in ids]
        self.ar.abort(in_ar)
        self.nar.cancel(in_nar)
        for s in in_ar:
            del self._in_ar[id(s)]
        for s in in_nar:
            del self._in_nar[id(s)]

    def generate_steps(self, requests: Iterable[StreamRequest], every_step: bool = False) -> Iterator[list[StreamOutput]]:
        """As ``SpeechEngine.generate_steps``: at most twice the AR stage's capacity queued; every
        step's outputs, empty ones too, with ``every_step`` (``Speech.run_requests`` collects
        decoded audio between steps)."""
        return feed_steps(self, requests, lambda: len(self._in_ar), every_step)

    def generate(self, requests: Iterable[StreamRequest]) -> Iterator[StreamOutput]:
        for outputs in self.generate_steps(requests):
            yield from outputs

    def stats(self) -> dict:
        """The AR engine's counters, the NAR stage's (``nar_*``) and the step timing (``timing``)."""
        return {**self.ar.stats(), **{f"nar_{k}": v for k, v in self.nar.stats.items()}, **self.timing}

    def shutdown(self) -> None:
        nar = self.__dict__.get("nar")
        if nar is not None:
            nar.close()
        self.ar.shutdown()
