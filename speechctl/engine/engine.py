"""SpeechEngine: one in-process vLLM engine running a multi-stream model, stepped by us.

The driver submits ``StreamRequest``s (token-id prompts with audio items as codec codes), steps
vLLM, and turns finished requests into ``StreamOutput``s carrying all streams: the primary token
ids from vLLM and the auxiliary tokens that the model sampled on the device (read once per step
for every request that finished in it).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np

from speechctl.accelerator import device_bytes_in_use, device_bytes_total, has_cuda
from speechctl.engine import vllm_compat
from speechctl.engine.admission import Admission
from speechctl.engine.config import EngineConfig
from speechctl.engine.feed import feed_steps
from speechctl.engine.params import DEFAULT_AUDIO, Sampling
from speechctl.engine.requests import StreamOutput, StreamRequest
from speechctl.engine.runtime import compile_per_step_work, slot_capacity
from speechctl.errors import EngineError
from speechctl.models import register
from speechctl.models.families import open_checkpoint
from speechctl.models.family import Checkpoint

log = logging.getLogger(__name__)


def priority_stream_enabled() -> bool:
    """``SPEECHCTL_PRIORITY_STREAM=1``: on CUDA, the engine's work runs on a high-priority
    stream, the codec's decodes (their own stream) below it (``vllm_compat.run_on_priority_stream``).
    Off by default until measured (issue 21: steps beside a codec decode took twice a step
    without, 7.6 against 3.8 ms at p50 under the real Higgs 3B's workload on an H100)."""
    setting = os.environ.get("SPEECHCTL_PRIORITY_STREAM", "0")
    if setting not in ("0", "1"):
        raise EngineError(f"SPEECHCTL_PRIORITY_STREAM={setting!r}: use 1 (the engine's work above the codec's) or 0")
    return setting == "1" and has_cuda()


class SpeechEngine:
    """Owns one vLLM engine in this process and drives its step loop."""

    def __init__(self, checkpoint, config: EngineConfig | None = None):
        """``checkpoint``: a ``speechctl.models.family.Checkpoint`` or a checkpoint directory."""
        vllm_compat.check_vllm_version()
        self.config = config or EngineConfig()
        if self.config.data_parallel_size != 1:
            raise EngineError("a SpeechEngine is one replica: run data_parallel_size > 1 through speechctl.api.Speech")
        self.checkpoint = checkpoint if isinstance(checkpoint, Checkpoint) else open_checkpoint(checkpoint)
        self.model_dir = self.checkpoint.path
        self.spec = self.checkpoint.spec
        encoder_positions = self.checkpoint.family.encoder_positions(self.checkpoint.config)
        self.config = self.config.for_checkpoint(self.checkpoint.context_limit, self.checkpoint.dtype,
                                                 encoder_decoder=encoder_positions is not None)
        vllm_compat.apply_engine_environment(self.config.tensor_parallel_size, on_gpu=has_cuda())
        from vllm.engine.arg_utils import EngineArgs

        from speechctl.engine.runtime.tracker import StreamTracker

        register()  # vLLM's plugin entry point does it too, where speechctl is installed
        if self.config.load_format != "dummy":
            self.checkpoint.weights  # a checkpoint without weights: its one-line error, not vLLM's
        overrides = self.checkpoint.hf_overrides
        args = EngineArgs(
            logits_processors=[StreamTracker],
            **self.config.engine_args(str(self.checkpoint.engine_dir)),
            **({"hf_overrides": overrides} if overrides else {}),
        )
        compiled = compile_per_step_work()  # checks SPEECHCTL_COMPILE before vLLM starts
        used_before = device_bytes_in_use() if has_cuda() else None
        if priority_stream_enabled():
            vllm_compat.run_on_priority_stream()
        self._vllm = vllm_compat.offline_engine(args)
        vllm_compat.check_independent_replica(self._vllm)  # no DP lock-step: step only with work
        capacities = self._vllm.collective_rpc(vllm_compat.attach_runtime)
        self.capacity = min(capacities)
        if self.capacity < slot_capacity(self.config.max_num_seqs):
            raise EngineError("stream runtime smaller than the engine's batch")
        self.admission = Admission(self.spec, self.config.max_model_len, self._vllm.vllm_config, encoder_positions)
        self._ids = itertools.count()
        self._live: dict[str, StreamRequest] = {}  # vLLM request id -> request (both CFG members)
        self._partner: dict[str, str] = {}  # CFG pairs, both directions
        self._unconditional: set[str] = set()
        self._emitted: dict[str, int] = {}  # streamed requests: tokens reported so far
        self._queue: deque[StreamRequest] = deque()
        self._done: list[StreamOutput] = []
        self.warm_up_s: float | None = None  # start-up's share spent compiling the per-step work
        if compiled:
            started = time.perf_counter()
            self.warm_up()
            self.warm_up_s = round(time.perf_counter() - started, 3)
            log.info("warm-up (compiling the per-step work) took %.1f s", self.warm_up_s)
        self.step_room_bytes = self._step_room(used_before)

    def _step_room(self, used_before: int | None) -> int:
        """Device memory the engine's steps may still need beyond what its start took: the
        larger of its share of the GPU (``gpu_memory_utilization``) less what the start took, and
        the activations' peak vLLM measured (it sized the KV cache to leave that much; its CUDA
        graphs and speechctl's, recorded after, can eat into the share's rest). A prefill of
        thousands of tokens takes hundreds of MiB of it. Memory the driver reports free is not all
        free to others: a codec that recorded its decode graphs into it ran the real Higgs 3B's
        next large prefill out of memory (thirty-sixth session, H100). 0 on the CPU."""
        if used_before is None:
            return 0
        peaks = [p for p in self._vllm.collective_rpc(vllm_compat.peak_activation_bytes) if p is not None]
        share_left = 0
        if self.config.kv_cache_bytes is None:  # (KV cache given in bytes: vLLM sized nothing by the share)
            share = self._vllm.vllm_config.cache_config.gpu_memory_utilization
            taken = device_bytes_in_use() - used_before
            share_left = int(share * device_bytes_total()) - taken
        return max(0, share_left, *peaks)

    def warm_up(self, audio_sampling: Sampling = DEFAULT_AUDIO) -> None:
        """Decode a two-frame request alone, then two at once, and drop them: what compiles on
        first use (``compile_per_step_work``: the runtime's per-step functions, where one row and
        more rows are separate compiles, for these sampling settings) compiles at start-up
        instead of in the first requests' steps."""
        for count in (1, 2):
            for seed in range(count):
                self.submit(self.prompt_builder().tts("Warm up.", audio_sampling=audio_sampling, seed=seed, max_frames=2))
            while self.has_work():
                self.step()

    @property
    def tokenizer(self):
        return self._vllm.get_tokenizer()

    def prompt_builder(self):
        """Prompts in the format of the checkpoint's family (``speechctl.models.prompting``)."""
        return self.checkpoint.prompt_builder(self.tokenizer)

    # -- request lifecycle ---------------------------------------------------------------------

    def submit(self, request: StreamRequest) -> None:
        """Queue a request; it enters vLLM when a stream slot is free."""
        self._queue.append(request)

    def _admit(self) -> None:
        while self._queue and len(self._live) + 2 <= self.capacity:
            req = self._queue.popleft()
            try:
                members = self.admission.members(req, f"r{next(self._ids)}")
            except EngineError as e:
                self._fail(req, str(e))
                continue
            try:
                for member in members:
                    self._vllm.add_request(member.key, member.prompt, member.sampling(req))
                    self._live[member.key] = req
                    if member.partner is not None:
                        self._partner[member.key] = member.partner
                    if not member.conditional:
                        self._unconditional.add(member.key)
            except vllm_compat.REQUEST_ERRORS as e:  # vLLM rejects what admission did not foresee
                self._drop([member.key for member in members])
                self._fail(req, str(e).splitlines()[0])

    def _drop(self, keys: list[str]) -> None:
        """Abort requests inside vLLM (if they got there) and free their slots."""
        live = [k for k in keys if k in self._live]
        if live:
            self._vllm.abort_request(live)
            self._rpc("release", live)
            for k in live:
                del self._live[k]
                self._emitted.pop(k, None)
                self._partner.pop(k, None)
                self._unconditional.discard(k)

    def _fail(self, req: StreamRequest, error: str) -> None:
        empty = np.zeros((0, self.spec.num_codebooks), dtype=np.int32)
        self._done.append(StreamOutput(req.tag, [], empty, None, error=error))

    def step(self) -> list[StreamOutput]:
        """Admit what fits, run one engine step, return the requests that finished in it (and
        the new pieces of streamed requests)."""
        self._admit()
        outputs = self._vllm.step() if self._live else []
        results, self._done = self._done, []
        pieces = [out for out in outputs if not out.finished and out.outputs[0].token_ids]
        finished = [out for out in outputs if out.finished]
        if not finished and not pieces:
            return results
        # (key, start, end) of the tokens each output carries: streamed requests get deltas
        spans = []
        for out in pieces + finished:
            start = self._emitted.get(out.request_id, 0)
            spans.append((out.request_id, start, start + len(out.outputs[0].token_ids)))
        collected = dict(zip((key for key, _, _ in spans), self._rpc("collect", spans)))
        for out in pieces:
            key = out.request_id
            self._emitted[key] = self._emitted.get(key, 0) + len(out.outputs[0].token_ids)
            aux, _ = collected[key]
            results.append(StreamOutput(self._live[key].tag, list(out.outputs[0].token_ids), aux, None, finished=False,
                                        request_id=key))
        if not finished:
            return results
        for out in finished:
            self._emitted.pop(out.request_id, None)
        self._rpc("release", [out.request_id for out in finished])
        streams = {out.request_id: collected[out.request_id] for out in finished}
        ended = set(streams)
        partners = {key: self._partner.pop(key, None) for key in ended}
        cached = {out.request_id: out.num_cached_tokens or 0 for out in finished}
        orphaned = []
        for out in finished:
            key, partner = out.request_id, partners[out.request_id]
            req = self._live.pop(key)
            if key in self._unconditional:
                self._unconditional.discard(key)
                if partner not in ended:
                    orphaned.append(partner)  # its conditional member is still running
                continue  # the conditional member reports the pair
            aux, desync = streams[key]
            error = None
            if partner is not None and partner not in ended:
                orphaned.append(partner)
                error = "CFG pair out of step: one member finished without the other"
            elif partner is not None:
                desync += streams[partner][1]
            if desync and error is None:
                error = f"CFG pair out of step at {desync} step(s): output would be unguided"
            completion = out.outputs[0]
            results.append(
                StreamOutput(
                    req.tag,
                    list(completion.token_ids),
                    aux,
                    completion.finish_reason,
                    error=error,
                    num_cached_tokens=cached[key],
                    partner_cached_tokens=cached.get(partner, 0),
                )
            )
        for key in orphaned:  # fail the rest of a broken pair loudly, never run it unguided
            req = self._live.get(key)
            conditional = key not in self._unconditional
            self._drop([key])
            if req is not None and conditional:
                self._fail(req, "CFG pair out of step: one member finished without the other")
        return results

    def report_after(self, piece: StreamOutput, tokens: int) -> None:
        """Hand out the next piece of ``piece``'s streamed request only once ``tokens`` (at least
        2) new tokens came; its end comes as always, with every token held back. A reader that
        can use a request's audio only a chunk at a time saves vLLM, this engine and itself a
        piece per request per step (at 64 streamed requests, most of what streaming cost the
        engine over one-shot). Once called, a request's pieces never come every step again."""
        if piece.request_id is not None and piece.request_id in self._live:
            vllm_compat.report_after(self._vllm, piece.request_id, tokens)

    def has_work(self) -> bool:
        return bool(self._queue or self._live or self._done)

    def forget_cached_prompts(self) -> None:
        """Empty vLLM's prefix cache, so that prompts seen before are prefilled again as new
        ones are (benchmarks: a round that repeats an earlier round's prompts would otherwise
        skip most of their prefill). Only while nothing runs."""
        if self.has_work() or not self._vllm.reset_prefix_cache():
            raise EngineError("the prefix cache can be emptied only while no request runs")

    def tags(self) -> list[object]:
        """The tags of the requests queued or running (not yet reported finished)."""
        return [r.tag for r in self._queue] + list({id(r): r.tag for r in self._live.values()}.values())

    def abort(self, tags: Iterable[object]) -> None:
        tags = set(map(id, tags))
        self._queue = deque(r for r in self._queue if id(r.tag) not in tags)
        self._drop([k for k, r in self._live.items() if id(r.tag) in tags])

    def generate_steps(self, requests: Iterable[StreamRequest], every_step: bool = False) -> Iterator[list[StreamOutput]]:
        """Run requests with continuous batching; yield the outputs finished by each step (every
        step's, empty ones too, with ``every_step``: the caller does work between steps).

        ``requests`` is pulled lazily, keeping at most twice the slot capacity queued."""
        return feed_steps(self, requests, lambda: len(self._queue) + len(self._live), every_step)

    def generate(self, requests: Iterable[StreamRequest]) -> Iterator[StreamOutput]:
        for outputs in self.generate_steps(requests):
            yield from outputs

    def stats(self) -> dict[str, float]:
        """Counters: live stream slots, resumptions after preemption, CFG pairs out of step, and
        the steps with pairs that the pair scheduler left to vLLM's own allocation or checked
        request by request; and the seconds start-up spent recording (and compiling) the
        per-step graphs (``start_up_graphs_s``, 0 without them)."""
        scheduler = vllm_compat.engine_scheduler(self._vllm)
        pairs = {name: getattr(scheduler, name, 0) for name in ("pair_violations", "pair_steps_plain", "pair_steps_checked")}
        return {**self._rpc("stats"), **pairs}

    def scheduler(self):
        """vLLM's scheduler of this engine (speechctl's pair scheduler where CFG pairs run); for
        benchmarks and diagnostics, never for features (those go through vllm_compat)."""
        return vllm_compat.engine_scheduler(self._vllm)

    def scheduler_requests(self) -> int:
        """Requests vLLM's scheduler still holds (0 once everything finished or was aborted)."""
        return len(vllm_compat.engine_scheduler(self._vllm).requests)

    def _rpc(self, method: str, *args):
        # Every worker holds the same stream state (TP ranks sample identically); read rank 0.
        return self._vllm.collective_rpc(vllm_compat.call_runtime, args=(method, *args))[0]

    def rank_digests(self) -> list[str]:
        """Each worker's (tensor-parallel rank's) ``StreamRuntime.state_digest``."""
        return self._vllm.collective_rpc(vllm_compat.call_runtime, args=("state_digest",))

    def set_step_graphs(self, enabled: bool) -> bool:
        """Per-step CUDA graphs on (the default on CUDA) or off (eager); returns whether on."""
        return bool(self._rpc("set_step_graphs", enabled))

    def shutdown(self) -> None:
        vllm_compat.drop_engine(self, "_vllm")

