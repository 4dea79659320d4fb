"""How a SpeechEngine runs vLLM: one dataclass, turned into vLLM's ``EngineArgs``."""

from __future__ import annotations

from dataclasses import dataclass, replace

from speechctl.accelerator import gpu_memory_share, has_cuda
from speechctl.errors import EngineError

DEFAULT_CONTEXT = 4096  # positions per request when a checkpoint takes more (KV memory per request)
# A speech prompt is hundreds of tokens (Higgs' byte tokenizer: 132-429 for 3-60 words), past vLLM's
# default largest graph at 64 or 128 requests (128 / 256 tokens): every step that admitted one ran
# eagerly. At 512, real Higgs 3B, H100, the workload bench at 0.7 of saturation, two runs against
# vLLM's default (docs/benchmarks/throughput.md, fifty-second session): a step after a submission
# 17-22 ms at p50 against 55-63, streamed TTFA p95 465-474 ms against 913-1059, 150-157 audio-s/s
# against 127-138, start-up about 4 s longer. (1024: p95s a little lower, start-up ~45 s longer.)
DEFAULT_GRAPH_TOKENS = 512


@dataclass
class EngineConfig:
    """How to run vLLM. ``None`` means vLLM's default for the platform."""

    max_model_len: int | None = None  # None: the checkpoint's limit, at most DEFAULT_CONTEXT
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float | None = None
    block_size: int | None = None  # KV block size in tokens (vLLM's default: 16 GPU, 128 CPU)
    num_kv_blocks: int | None = None  # override the KV cache size (tests force preemption)
    kv_cache_bytes: int | None = None  # default: 1 GiB on CPU (a fraction of free memory there
    # would count other engines of this process against this one); GPU: gpu_memory_utilization
    enforce_eager: bool | None = None  # default: eager on CPU (fast start), CUDA graphs on GPU
    # The most tokens a step may hold and still replay vLLM's CUDA graphs (vLLM's
    # ``max_cudagraph_capture_size``, at most max_num_batched_tokens; None: vLLM's default,
    # min(2 x max_num_seqs, 512)). A step that admits a prompt holds its tokens beside one per
    # running request; past the largest graph it runs eagerly, launching the whole forward op by
    # op from the host.
    max_graph_tokens: int | None = DEFAULT_GRAPH_TOKENS
    # vLLM's ``cudagraph_mode`` on a GPU (None: its default, "full_and_piecewise": whole-forward
    # graphs for decode-only steps, piecewise ones, attention eager between the pieces, for steps
    # that prefill). "full" records whole-forward graphs for those too, where the attention
    # backend allows it (FlashAttention 3 on Hopper): a step that admits a prompt then replays
    # one graph. Under measurement (issue 21 item 6), not a default: such graphs serve decode-only
    # steps too, so Higgs' DualFFN takes its fused MoE there as well (its audio MLP alone needs
    # vLLM's separate decode graphs), and an encoder-decoder family cannot use them (below).
    graph_mode: str | None = None
    dtype: str = "auto"
    seed: int = 0
    tensor_parallel_size: int = 1
    # Engine replicas over the devices, whole jobs each (speechctl.api.Speech runs them through
    # engine/data_parallel.py); a SpeechEngine is one replica and vLLM runs it at DP=1.
    data_parallel_size: int = 1
    max_audio_items: int = 4  # audio items per prompt
    load_progress: bool = False  # vLLM's progress bar while loading weights
    load_format: str = "auto"  # "dummy": random weights without reading any (benchmarks)

    def for_checkpoint(self, context_limit: int, dtype: str | None = None, encoder_decoder: bool = False) -> "EngineConfig":
        """This config settled against a checkpoint that takes ``context_limit`` positions and
        stores its weights in ``dtype``: ``max_model_len`` its limit (at most DEFAULT_CONTEXT)
        when unset, and an explicit value past the limit refused here, in one line, rather than
        by vLLM; ``dtype`` "auto" the checkpoint's own (vLLM's CPU platform would run a float32
        checkpoint in bfloat16, and its tokens would no longer be the reference's). vLLM's
        encoder-decoder path has no prefix cache (its cross-attention blocks cannot be shared)."""
        config = replace(self, enable_prefix_caching=False) if encoder_decoder else self
        if encoder_decoder and config.graph_mode == "full":
            # its forward gathers the step's auxiliary inputs from Python, which a whole-forward
            # graph of a mixed batch would run once, at capture (vllm_compat.forward_is_one_token_per_row)
            raise EngineError("graph_mode 'full' needs a decoder-only family: an encoder-decoder forward reads the step's batch from Python")
        if config.max_model_len is None:
            config = replace(config, max_model_len=min(context_limit, DEFAULT_CONTEXT))
        elif config.max_model_len > context_limit:
            raise EngineError(f"max_model_len {config.max_model_len} exceeds the checkpoint's {context_limit} positions (max_position_embeddings)")
        if config.dtype == "auto" and dtype in ("float32", "bfloat16", "float16"):
            config = replace(config, dtype=dtype)
        return config

    def engine_args(self, model: str) -> dict:
        from speechctl.engine.pairs import pair_scheduler_class

        on_gpu = has_cuda()
        args = dict(
            model=model,
            tokenizer=model,
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            enable_prefix_caching=self.enable_prefix_caching,
            gpu_memory_utilization=self._memory_fraction(on_gpu),
            enforce_eager=(not on_gpu) if self.enforce_eager is None else self.enforce_eager,
            seed=self.seed,
            tensor_parallel_size=self.tensor_parallel_size,
            limit_mm_per_prompt={"audio": self.max_audio_items},
            use_tqdm_on_load=self.load_progress,
            load_format=self.load_format,
            # vLLM's per-request metrics cost host time every step; nothing here reads them
            # (vLLM's own LLM class turns them off too).
            disable_log_stats=True,
            # CFG pairs need a scheduler that keeps them in lock-step; without pairs it is
            # vLLM's own (async on GPU, where vLLM defaults to async scheduling).
            async_scheduling=on_gpu,
            scheduler_cls=pair_scheduler_class(async_scheduling=on_gpu),
        )
        if self.max_num_batched_tokens is not None:
            args["max_num_batched_tokens"] = self.max_num_batched_tokens
        if self.enable_chunked_prefill is not None:
            args["enable_chunked_prefill"] = self.enable_chunked_prefill
        if self.kv_cache_bytes is not None or not on_gpu:
            args["kv_cache_memory_bytes"] = self.kv_cache_bytes or (1 << 30)
        if self.num_kv_blocks is not None:
            args["num_gpu_blocks_override"] = self.num_kv_blocks
        if self.block_size is not None:
            args["block_size"] = self.block_size
        if on_gpu:
            graphs = {"max_cudagraph_capture_size": self.max_graph_tokens, "cudagraph_mode": self.graph_mode}
            graphs = {k: v for k, v in graphs.items() if v is not None}
            if graphs:
                args["compilation_config"] = graphs
        return args

    def _memory_fraction(self, on_gpu: bool) -> float:
        if self.gpu_memory_utilization:
            return self.gpu_memory_utilization
        if not on_gpu:
            return 0.3
        share = gpu_memory_share(0.85)
        if self.kv_cache_bytes is None:
            return share
        # With the KV cache given in bytes vLLM sizes nothing by the fraction, but refuses to start
        # unless fraction x device memory is free: ask for the cache's share, so that engines with
        # a byte budget start beside other engines of the process.
        from speechctl.accelerator import device_bytes_total

        return min(share, max(0.01, self.kv_cache_bytes / device_bytes_total()))
