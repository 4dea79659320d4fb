"""The vLLM internals that Whisper's beam search and encoder sharing touch.

**These belong in ``speechctl/engine/vllm_compat.py``** (the one module that touches vLLM
internals); they live here only while that module is being restructured, and should move there
as they are. Read against vLLM 0.26 (GPU, source of the 0.26.0 wheel) and 0.32 (CPU, tested);
the V1 model runner and an in-process engine core (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) only,
which ``vllm_compat`` already requires. ``tests/test_asr_beam.py`` checks every assumption here
on 0.32:

* ``engine_runner``: the model runner of an in-process ``LLMEngine``
  (``model_executor.driver_worker.worker.model_runner``; 0.26 and 0.32).
* ``find_logits_processor``: a custom logits processor instance in the runner's persistent
  batch (``input_batch.logitsprocs.all``).
* ``scheduler_budgets``: how many sequences, tokens and encoder inputs one step may schedule
  (``Scheduler.max_num_running_reqs``, ``max_num_scheduled_tokens``,
  ``max_num_encoder_input_tokens``; both versions).
* ``KvCopier``: copies whole KV-cache blocks of the decoder's self-attention from one request
  to another. Reads ``runner.kv_cache_config.kv_cache_groups`` (the self-attention group: not a
  ``CrossAttentionSpec``), the group's block table (``input_batch.block_table[g].block_table.np``,
  [max rows, max blocks], row = batch row), each layer's ``kv_cache`` tensor (bound by vLLM;
  0.26 and 0.32: a tensor) and its block dimension (0.26: the backend's ``get_kv_cache_shape``,
  FlashAttention's ``(blocks, heads, block size, 2 * head size)``; 0.32: always dimension 0 of
  the per-layer view). Prefix caching is off for encoder-decoder models in both, so blocks are
  never shared between requests; a lane's KV can be overwritten.
* ``keep_decoder_prompts``: vLLM prepends the decoder start token (<|startoftranscript|>) to an
  encoder-decoder prompt that does not begin with it (``inputs/engine.py``,
  ``_prepare_decoder_input_ids_for_generation``), which breaks Whisper's
  ``<|startofprev|> previous text <|startoftranscript|>`` prompts; the multimodal processor's
  ``skip_decoder_start_token`` (``BaseMultiModalProcessor``, both versions) turns that off, set
  on Whisper's processor class (speechctl's prompts always carry their own start token).
* ``share_encoder``: wraps the model instance's ``embed_multimodal`` (what the runner calls to
  run the audio encoder, ``_execute_mm_encoder``; both versions) so that identical log-mel inputs
  (the B lanes of one window, a window decoded again at a higher temperature) are encoded once.
  vLLM does not share encoder outputs between encoder-decoder requests
  (``EncoderDecoderCacheManager.check_and_update_cache`` always says "not cached").
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch


def keep_decoder_prompts() -> None:
    from vllm.model_executor.models.whisper import WhisperMultiModalProcessor

    if not hasattr(WhisperMultiModalProcessor, "skip_decoder_start_token"):
        raise RuntimeError("vLLM's multimodal processors lost skip_decoder_start_token: check speechctl/asr/vllm_shims.py")
    WhisperMultiModalProcessor.skip_decoder_start_token = True


def engine_runner(llm_engine):
    """The V1 model runner of an in-process engine."""
    from speechctl.engine import vllm_compat

    executor = llm_engine.model_executor
    worker = getattr(executor, "driver_worker", None)
    if worker is None:
        raise RuntimeError("Whisper beam search needs vLLM's in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    return vllm_compat.worker_runner(worker)


def find_logits_processor(runner, cls):
    found = [lp for lp in runner.input_batch.logitsprocs.all if isinstance(lp, cls)]
    if len(found) != 1:
        raise RuntimeError(f"expected one {cls.__name__} logits processor in the runner, found {len(found)}")
    return found[0]


def scheduler_budgets(llm_engine) -> dict:
    from speechctl.engine import vllm_compat

    scheduler = vllm_compat.engine_scheduler(llm_engine)
    return {
        "sequences": int(scheduler.max_num_running_reqs),
        "tokens": int(scheduler.max_num_scheduled_tokens),
        "encoder_tokens": int(scheduler.max_num_encoder_input_tokens),
    }


class KvCopier:
    """Copies the self-attention KV blocks of batch rows onto other rows (beam lanes that
    continue another lane's history)."""

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
        self.caches, self.dims = [], []
        for name in groups[self.group].layer_names:
            layer = context[name]
            cache = layer.kv_cache
            if isinstance(cache, (list, tuple)):  # per virtual engine in older layouts
                cache = cache[0]
            dim = _block_dim(getattr(layer, "attn_backend", None), self.block_size, spec)
            blocks = getattr(runner.kv_cache_config, "num_blocks", None)
            if blocks is not None and cache.shape[dim] != blocks:
                raise RuntimeError(f"KV cache of {name}: shape {tuple(cache.shape)} has no block dimension {dim} of {blocks}")
            self.caches.append(cache)
            self.dims.append(dim)
        self._runner = runner

    def table(self) -> np.ndarray:
        return self._runner.input_batch.block_table[self.group].block_table.np

    def copy(self, src_rows: list[int], dst_rows: list[int], num_tokens: list[int]) -> None:
        """Row ``dst_rows[i]`` gets row ``src_rows[i]``'s first ``num_tokens[i]`` positions."""
        table = self.table()
        src, dst = [], []
        for s, d, n in zip(src_rows, dst_rows, num_tokens):
            blocks = -(-n // self.block_size)
            src.extend(table[s, :blocks].tolist())
            dst.extend(table[d, :blocks].tolist())
        if not src:
            return
        device = self.caches[0].device
        src_t = torch.tensor(src, dtype=torch.long, device=device)
        dst_t = torch.tensor(dst, dtype=torch.long, device=device)
        for cache, dim in zip(self.caches, self.dims):
            cache.index_copy_(dim, dst_t, cache.index_select(dim, src_t))


def _block_dim(backend, block_size: int, spec) -> int:
    """The block dimension of a layer's KV-cache tensor. 0.26: the backend's
    ``get_kv_cache_shape`` says (probed with a block count no other dimension has); 0.32: the
    per-layer view is always [blocks, heads, block size, content] (``vllm/v1/kv_cache_layout.py``,
    RFC #42082), whatever the physical layout."""
    shape_of = getattr(backend, "get_kv_cache_shape", None)
    if shape_of is None:
        return 0
    probe = 7919
    return list(shape_of(probe, block_size, spec.num_kv_heads, spec.head_size)).index(probe)


class EncoderSharing:
    """Encoder outputs by log-mel input: identical inputs of a step, and inputs seen in the last
    ``capacity`` encodings, reuse one encoder pass. The key is two 64-bit hashes of the input's
    bits (integer arithmetic, so independent of batch and kernel)."""

    def __init__(self, model, capacity: int):
        self.model = model
        self.capacity = capacity
        self.cache: OrderedDict[tuple[int, int], torch.Tensor] = OrderedDict()
        self.encoded = 0  # inputs actually encoded
        self.requested = 0  # inputs asked for
        self._weights: dict[tuple, torch.Tensor] = {}
        self._inner = model.embed_multimodal
        model.embed_multimodal = self

    def _keys(self, features: torch.Tensor) -> list[tuple[int, int]]:
        flat = features.reshape(features.shape[0], -1)
        ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
        bits = flat.view(ints).long()
        key = (bits.shape[1], bits.device)
        if key not in self._weights:
            g = torch.Generator().manual_seed(1234)
            w = torch.randint(-(2**62), 2**62, (2, bits.shape[1]), generator=g, dtype=torch.long)
            self._weights[key] = w.to(bits.device)
        w = self._weights[key]
        h = torch.stack([(bits * w[0]).sum(1), (bits * w[1]).sum(1)], 1).cpu().tolist()
        return [tuple(x) for x in h]

    def __call__(self, **kwargs):
        features = kwargs.get("input_features")
        if features is None or len(kwargs) != 1:
            return self._inner(**kwargs)
        if isinstance(features, (list, tuple)):
            features = torch.stack(list(features))
        keys = self._keys(features)
        self.requested += len(keys)
        missing = []
        for i, k in enumerate(keys):
            if k in self.cache:
                self.cache.move_to_end(k)
            elif k not in [keys[j] for j in missing]:
                missing.append(i)
        if missing:
            outputs = self._inner(input_features=features[missing])
            self.encoded += len(missing)
            for i, out in zip(missing, outputs):
                self.cache[keys[i]] = out
                self.cache.move_to_end(keys[i])
        result = tuple(self.cache[k] for k in keys)
        while len(self.cache) > self.capacity:
            self.cache.popitem(last=False)
        return result


def share_encoder(runner, capacity: int) -> EncoderSharing:
    model = runner.get_model()
    existing = model.__dict__.get("embed_multimodal")
    if isinstance(existing, EncoderSharing):
        return existing
    return EncoderSharing(model, capacity)
