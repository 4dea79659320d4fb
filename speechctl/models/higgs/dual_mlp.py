"""Higgs Audio v2's DualFFN at the cost of one MLP, on CUDA.

A DualFFN layer has two MLPs, the text one (``mlp``) and the audio one (``audio_mlp``); a token
needs one of them. Computing both and picking with ``where`` (static shapes, CUDA graphs) does
twice the MLP work, and every decode position is audio. Here the two are the two experts of a
top-1 mixture routed by the audio mask: vLLM's fused MoE kernel (``vllm_compat.grouped_mlp``)
runs each token through its own expert only, reads only the weights of experts that have tokens
(a decode step reads the audio MLP's alone), and stays inside vLLM's full CUDA graphs (its
routing is data, not control flow) for any mix of text and audio tokens, prefill included.

The weights live stacked, ``w13`` [2, 2I/tp, H] (gate; up) and ``w2`` [2, H, I/tp], expert 0 the
text MLP and 1 the audio MLP, loaded from the checkpoint's ``mlp.*`` / ``audio_mlp.*`` names
(``load``) with tensor parallelism's column/row split; the output is all-reduced across ranks
as ``RowParallelLinear`` would. On the CPU the layer keeps vLLM's two ``LlamaMLP``s and
``where`` (vLLM-CPU's GEMMs, exactly the numbers the parity tests compare).

**Decode steps: the audio MLP alone, as dense GEMMs.** The fused MoE kernel at two experts costs
1.2-1.35x one dense MLP at up to 64 tokens (H100, fortieth session), most of the real Higgs 3B's
gap to a plain Llama of its size. In vLLM's uniform decode batches every token is generated,
so audio (``vllm_compat.uniform_decode_only_past_prompts`` keeps a prompt's last token out of
them), and there the layer runs the audio expert's weights as two plain GEMMs (cuBLAS), as a
dense Llama MLP does. The choice is made where the step's batch descriptor is known: in a
custom op (``speechctl::dual_mlp``) that torch.compile leaves opaque, whose Python runs when
vLLM captures a graph (uniform decode graphs record the dense path, mixed ones the mixture) and
in eager steps; a replay runs what its capture recorded.

**No compiles mid-run.** Triton compiles the fused MoE kernel on first use for each tile set vLLM
picks by token count and each specialization of its integer arguments (a count divisible by 16
or not). vLLM's graph captures meet the kinds of their sizes; a mixed step past the largest
runs the layer eagerly at whatever count its prefills make, and a kind not met before stalled
that step for a compile: the Higgs workload's load round compiled 6 kernels mid-run (H100,
forty-ninth session). ``warm_grouped_kernels`` runs every kind once at start-up, after the
captures (``eager_token_counts``; the model's ``warm_kernels``); Triton's on-disk cache keeps
them for later starts.
"""

from __future__ import annotations

import logging
import re
import time

import torch
from torch import nn

from speechctl.engine import vllm_compat

logger = logging.getLogger(__name__)

# checkpoint name tail -> (expert, which part)
_PARTS = {"mlp.gate_proj": (0, "gate"), "mlp.up_proj": (0, "up"), "mlp.down_proj": (0, "down"),
          "audio_mlp.gate_proj": (1, "gate"), "audio_mlp.up_proj": (1, "up"), "audio_mlp.down_proj": (1, "down")}
_NAME = re.compile(r"(.*\.layers\.\d+)\.((?:audio_)?mlp\.(?:gate|up|down)_proj)\.weight$")


class DualMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, tp_rank: int, tp_size: int):
        super().__init__()
        if intermediate_size % tp_size:
            raise ValueError(f"intermediate size {intermediate_size} does not split over {tp_size} ranks")
        self.hidden, self.local = hidden_size, intermediate_size // tp_size
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.w13 = nn.Parameter(torch.empty(2, 2 * self.local, hidden_size), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(2, hidden_size, self.local), requires_grad=False)

    def forward(self, text: torch.Tensor, audio: torch.Tensor, is_audio: torch.Tensor) -> torch.Tensor:
        """[n, H] normed inputs of both branches, [n, 1] audio mask -> [n, H]."""
        out = torch.ops.speechctl.dual_mlp(text, audio, is_audio, self.w13, self.w2)
        return vllm_compat.all_reduce(out) if self.tp_size > 1 else out

    def load(self, part_name: str, weight: torch.Tensor) -> None:
        """One checkpoint tensor (``mlp.gate_proj`` ... ``audio_mlp.down_proj``), full size: this
        rank's slice goes into its place."""
        expert, part = _PARTS[part_name]
        I, r = self.local, self.tp_rank
        if part == "down":  # [H, I]: row parallel, this rank's columns
            self.w2.data[expert].copy_(weight[:, r * I : (r + 1) * I])
        else:  # [I, H]: column parallel, this rank's rows; gate first, then up
            rows = slice(0, I) if part == "gate" else slice(I, 2 * I)
            self.w13.data[expert, rows].copy_(weight[r * I : (r + 1) * I])


@torch.library.custom_op("speechctl::dual_mlp", mutates_args=())
def dual_mlp(text: torch.Tensor, audio: torch.Tensor, is_audio: torch.Tensor, w13: torch.Tensor,
             w2: torch.Tensor) -> torch.Tensor:
    """Each row through its own expert: ``audio`` [n, H] where ``is_audio`` [n, 1] (the audio MLP,
    expert 1), ``text`` elsewhere (expert 0); in a uniform decode step, where every row is audio,
    ``audio`` through the audio expert as dense GEMMs (no pick, no routing)."""
    if vllm_compat.step_is_uniform_decode():
        return audio_mlp(audio, w13[1], w2[1])
    x = torch.where(is_audio, audio, text)
    return vllm_compat.grouped_mlp(x, w13, w2, is_audio.to(torch.int32))


@dual_mlp.register_fake
def _(text, audio, is_audio, w13, w2):
    return torch.empty_like(audio)


def audio_mlp(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One SiLU MLP of ``w13`` [2I, H] (gate; up) and ``w2`` [H, I], as dense GEMMs with vLLM's
    fused SiLU-and-multiply between them (as its ``LlamaMLP``; inside this opaque op inductor
    cannot fuse the two)."""
    return torch.nn.functional.linear(vllm_compat.silu_and_mul(torch.nn.functional.linear(x, w13)), w2)


def load_dual_weights(weights, layers, loaded: set[str]):
    """The weights without the ``mlp.*`` / ``audio_mlp.*`` projections of the decoder layers
    (``layers``, by index), which go into each layer's ``dual_mlp`` as they pass (their names
    added to ``loaded``). A generator: the checkpoint streams through."""
    for name, tensor in weights:
        match = _NAME.match(name)
        if match is None:
            yield name, tensor
            continue
        layers[int(match.group(1).rsplit(".", 1)[1])].dual_mlp.load(match.group(2), tensor)
        loaded.update({f"{match.group(1)}.dual_mlp.w13", f"{match.group(1)}.dual_mlp.w2"})


def eager_token_counts(first: int, last: int, tiles_at) -> list[int]:
    """One token count in [``first``, ``last``] for each fused MoE kernel the grouped path can
    compile there: per tile set (``tiles_at(n)``, vLLM's choice at n tokens) and residue of n
    modulo 16 (Triton specializes integer arguments on divisibility by 16; the kernel's padded
    row count is n plus a constant of the tiles), n = 1 apart."""
    seen, counts = set(), []
    for n in range(first, last + 1):
        kind = (tuple(sorted(tiles_at(n).items())), n % 16, n == 1)
        if kind not in seen:
            seen.add(kind)
            counts.append(n)
    return counts


def warm_grouped_kernels(mlp: DualMLP, first: int, last: int) -> list[int]:
    """Run ``mlp``'s grouped path once at each of ``eager_token_counts(first, last)`` (zeros,
    both experts), so that Triton compiles (or reads from its cache) every kernel a step of
    ``first`` to ``last`` tokens can meet now, not in that step. Every layer has the same shapes,
    so one layer warms them all. Returns the counts run."""
    started = time.perf_counter()
    counts = eager_token_counts(first, last, lambda n: vllm_compat.grouped_mlp_tiles(n, mlp.w13, mlp.w2))
    for n in counts:
        x = torch.zeros(n, mlp.hidden, dtype=mlp.w13.dtype, device=mlp.w13.device)
        experts = (torch.arange(n, device=x.device) % 2).to(torch.int32)[:, None]
        vllm_compat.grouped_mlp(x, mlp.w13, mlp.w2, experts)
    if counts:
        torch.cuda.synchronize()
        logger.info("fused MoE kernel warmed at %d token counts from %d to %d in %.1f s",
                    len(counts), first, last, time.perf_counter() - started)
    return counts
