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

``tests/test_vllm_compat.py`` fails loudly when any of these assumptions stops holding.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# The engine core runs in this process, so the driver reads the model's stream state directly
# and steps the engine itself; Model Runner V2 (0.26's GPU default) has no custom logits
# processors, so the V1 runner is used. Set before vLLM reads its environment.
_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_V2_MODEL_RUNNER": "0"}
os.environ.update(_ENGINE_ENV)

import vllm  # noqa: E402
from transformers import BatchFeature  # noqa: E402

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


def apply_engine_environment() -> None:
    """Re-assert the engine environment (something may have changed it since import)."""
    os.environ.update(_ENGINE_ENV)


class StepView:
    """Read-only view of the V1 runner's buffers for the step being prepared."""

    def __init__(self, runner):
        self._runner = runner

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
    return runtime.capacity


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
