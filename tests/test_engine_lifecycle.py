"""Engines give everything back when they shut down: a user who opens models one after another
in one process (the Python API, chat's three engines, a notebook) must not run out of memory.

On CUDA each engine takes vLLM's default share of the GPU (0.85 of its memory for weights and
KV cache), so a second engine starts only if the first one's memory came back; on the CPU the
check is that the model and its runner were collected."""

import gc
import weakref

import pytest
import torch

from speechctl.engine import vllm_compat
from speechctl.engine.config import EngineConfig
from speechctl.engine.engine import SpeechEngine

pytestmark = pytest.mark.engine
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def csm_path(tmp_path_factory):
    from speechctl.models.csm.checkpoint import CsmRecipe, create_csm_checkpoint

    return create_csm_checkpoint(tmp_path_factory.mktemp("csm") / "csm", CsmRecipe())


def _free_bytes() -> int:
    return torch.cuda.mem_get_info()[0] if CUDA else 0


def _free() -> str:
    return f" ({_free_bytes() / 2**30:.1f} GiB free)" if CUDA else ""


def _run_and_drop(path, progress) -> tuple[weakref.ref, weakref.ref]:
    # On CUDA the default memory share: the next engine starts only if this one's came back.
    memory = {} if CUDA else {"kv_cache_bytes": 1 << 26}
    progress(f"{path.name}: starting an engine{_free()}")
    engine = SpeechEngine(path, EngineConfig(max_model_len=256, max_num_seqs=4, dtype="float32", **memory))
    progress(f"{path.name}: started{_free()}")
    # the share's room for the steps' activations, which a codec beside it leaves alone (CUDA)
    share = 0.85 * torch.cuda.get_device_properties(0).total_memory if CUDA else 0
    assert 0 < engine.step_room_bytes < share if CUDA else engine.step_room_bytes == 0
    prompts = engine.prompt_builder()
    outs = list(engine.generate(prompts.tts(f"text {i}", max_frames=5, tag=i) for i in range(2)))
    assert [o.error for o in outs] == [None, None]
    runner = vllm_compat.worker_runner(engine._vllm.model_executor.driver_worker)
    refs = weakref.ref(runner.get_model()), weakref.ref(runner)
    del runner
    engine.shutdown()
    del engine
    gc.collect()
    progress(f"{path.name}: shut down{_free()}")
    return refs


def test_engines_of_two_families_start_stop_and_start_again(tiny_checkpoint, csm_path, progress):
    free_at_start = _free_bytes()
    for _ in range(2):
        for path in (tiny_checkpoint, csm_path):
            model, runner = _run_and_drop(path, progress)
            assert model() is None, f"{path.name}: the shut-down engine's model is still alive"
            assert runner() is None, f"{path.name}: the shut-down engine's runner is still alive"
            if CUDA:  # what the engine took came back (CUDA's context and the codec's kernels aside)
                held = (free_at_start - _free_bytes()) / 2**30
                assert held < 2, (f"{path.name}: {held:.1f} GiB held after shutdown (allocated "
                                  f"{torch.cuda.memory_allocated() / 2**30:.1f}, reserved {torch.cuda.memory_reserved() / 2**30:.1f} GiB)")


@pytest.mark.parametrize("client", ["as installed", "without a finalizer (as 0.26's)"])
def test_a_shut_down_engines_kv_cache_goes_while_its_config_lives_on(tiny_checkpoint, client):
    """On CUDA, what outlives the runner and reaches vLLM's config (compiled graphs, CUDA graph
    wrappers) kept the whole KV cache through the config's attention layers: on the H200 (0.26,
    whose in-process client has no finalizer) 119 GiB stayed after the model and the runner were
    collected. The shutdown lets go of the cache itself (``vllm_compat.release_engine``), whoever
    keeps the config."""
    memory = {} if CUDA else {"kv_cache_bytes": 1 << 26}
    engine = SpeechEngine(tiny_checkpoint, EngineConfig(max_model_len=256, max_num_seqs=4, dtype="float32", **memory))
    inproc = engine._vllm.engine_core
    if client != "as installed" and getattr(inproc, "_finalizer", None) is not None:
        inproc._finalizer.detach()
        del inproc._finalizer
    del inproc
    (out,) = engine.generate([engine.prompt_builder().tts("hello", max_frames=3)])
    assert out.error is None
    runner = vllm_compat.worker_runner(engine._vllm.model_executor.driver_worker)
    kept = runner.vllm_config  # as a compiled graph's cache would keep it
    layers = kept.compilation_config.static_forward_context
    caches = [weakref.ref(t) for t in runner.kv_caches]
    assert caches and any(getattr(layer, "kv_cache", None) is not None for layer in layers.values())
    del runner, layers
    engine.shutdown()
    del engine
    gc.collect()
    assert all(cache() is None for cache in caches), "the shut-down engine's KV cache is still alive"
    assert kept.model_config is not None


def test_drop_engine_lets_go_of_the_holders_reference_before_collecting(monkeypatch):
    """``drop_engine`` clears the owner's attribute, releases the engine inside what it held and
    collects with no reference of its own left (what the three closers share)."""
    class Engine:
        pass

    class Holder:
        def __init__(self):
            self.llm_engine = Engine()

    owner = Holder()
    owner.llm = Holder()
    alive = weakref.ref(owner.llm)
    seen = []
    monkeypatch.setattr(vllm_compat, "release_engine", lambda e: seen.append(("release", type(e).__name__)))
    monkeypatch.setattr(vllm_compat, "collect_dropped_engines", lambda: seen.append(("collect", alive() is None)))
    vllm_compat.drop_engine(owner, "llm", lambda held: held.llm_engine)
    assert owner.llm is None and seen == [("release", "Engine"), ("collect", True)]
    vllm_compat.drop_engine(owner, "llm")  # nothing held: nothing done
    vllm_compat.drop_engine(owner, "missing")
    assert len(seen) == 2


def test_an_engines_step_room_is_what_its_steps_may_still_need(monkeypatch):
    """What a codec beside the engine leaves alone: the larger of the engine's share of the GPU
    less what its start took (weights, KV cache, graphs) and the activations' peak vLLM's memory
    profile measured; the share counts only where vLLM sized the KV cache by it; nothing on the
    CPU."""
    import types

    from speechctl.engine import engine as engine_module

    gib = 2**30
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(total_memory=80 * gib))
    in_use = {"bytes": 70 * gib}
    monkeypatch.setattr(engine_module, "device_bytes_in_use", lambda: in_use["bytes"])
    peaks = [None]  # what each worker's memory profile measured (None: the CPU's workers)
    vllm = types.SimpleNamespace(vllm_config=types.SimpleNamespace(cache_config=types.SimpleNamespace(gpu_memory_utilization=0.85)),
                                 collective_rpc=lambda fn: [fn(types.SimpleNamespace(peak_activation_memory=p)) for p in peaks])
    stub = types.SimpleNamespace(config=EngineConfig(), _vllm=vllm)
    room = SpeechEngine._step_room
    assert room(stub, 4 * gib) == int(0.85 * 80 * gib) - 66 * gib  # 68 GiB of share, 66 taken
    in_use["bytes"] = 75 * gib
    assert room(stub, 4 * gib) == 0
    peaks[:] = [3 * gib]  # the start took more than the share (graphs): the steps still need their peak
    assert room(stub, 4 * gib) == 3 * gib
    in_use["bytes"] = 60 * gib
    assert room(stub, 4 * gib) == int(0.85 * 80 * gib) - 56 * gib  # the larger of the two
    assert room(stub, None) == 0  # (the CPU)
    stub.config = EngineConfig(kv_cache_bytes=1 << 30)
    assert room(stub, 4 * gib) == 3 * gib
    peaks[:] = [None]
    assert room(stub, 4 * gib) == 0
