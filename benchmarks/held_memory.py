"""What keeps a shut-down engine's memory: start an engine per family, run a few requests, shut it
down, and report whether its model and runner were freed (device memory on CUDA) and, if not,
the chain of references that holds the model, from a module-level root down.

    python benchmarks/held_memory.py [--families multistream,csm,higgs_audio_v2] [--out DIR]

Diagnostic, not a benchmark: it times nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import types
import weakref
from pathlib import Path


def build(family: str, root: Path) -> Path:
    if family == "multistream":
        from speechctl.models.generic.checkpoint import MultiStreamRecipe, create_multistream_checkpoint

        return create_multistream_checkpoint(root / family, MultiStreamRecipe(seed=3))
    if family == "csm":
        from speechctl.models.csm.checkpoint import CsmRecipe, create_csm_checkpoint

        return create_csm_checkpoint(root / family, CsmRecipe())
    from speechctl.models.higgs.checkpoint import HiggsRecipe, create_higgs_checkpoint

    return create_higgs_checkpoint(root / family, HiggsRecipe())


def referrer_chain(target, max_depth: int = 12) -> list[str]:
    """A path of referrers from ``target`` up to a module (or as far as ``max_depth``), each as
    ``type: short repr``; breadth-first, frames and this function's own lists skipped."""
    seen = {id(target)}
    frontier = [(target, [])]
    ignore = {id(frontier), id(seen)}
    for _ in range(max_depth):
        nxt = []
        for obj, path in frontier:
            for ref in gc.get_referrers(obj):
                if id(ref) in seen or id(ref) in ignore or isinstance(ref, types.FrameType) or ref is frontier:
                    continue
                seen.add(id(ref))
                step = path + [f"{type(ref).__module__}.{type(ref).__qualname__}: {_short(ref)}"]
                if isinstance(ref, types.ModuleType):
                    return step
                nxt.append((ref, step))
        ignore.add(id(nxt))
        frontier = nxt[:2000]
        if not frontier:
            break
    return frontier[0][1] if frontier else []


def live_cuda_tensors(top: int = 3) -> list[dict]:
    """The largest CUDA tensors still alive, with what holds each."""
    import torch

    from torch._subclasses.fake_tensor import FakeTensor

    found = []
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and not isinstance(obj, FakeTensor) and obj.is_cuda:
                found.append((int(obj.untyped_storage().nbytes()), obj))
        except Exception:  # tracing leftovers with symbolic sizes
            continue
    found.sort(key=lambda x: x[0], reverse=True)
    return [{"shape": [int(d) for d in t.shape], "dtype": str(t.dtype), "storage_mb": n / 2**20,
             "held_by": referrer_chain(t, max_depth=8)} for n, t in found[:top]]


def _short(obj) -> str:
    try:
        if isinstance(obj, dict):
            return "dict keys " + ", ".join(map(str, list(obj)[:8]))
        text = repr(obj)
    except Exception:
        text = "?"
    return text[:160]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--families", default="multistream,csm,higgs_audio_v2")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import torch

    from speechctl.engine import vllm_compat
    from speechctl.engine.engine import EngineConfig, SpeechEngine

    cuda = torch.cuda.is_available()
    report = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families.split(","):
            path = build(family, Path(tmp))
            before = torch.cuda.memory_allocated() if cuda else 0
            engine = SpeechEngine(path, EngineConfig(max_model_len=512, max_num_seqs=8, kv_cache_bytes=1 << 28))
            prompts = engine.prompt_builder()
            list(engine.generate(prompts.tts(f"text {i}", max_frames=6, tag=i) for i in range(3)))
            runner = vllm_compat.worker_runner(engine._vllm.model_executor.driver_worker)
            model, runner_ref = weakref.ref(runner.get_model()), weakref.ref(runner)
            del runner
            during = torch.cuda.memory_allocated() if cuda else 0
            engine.shutdown()
            del engine
            vllm_compat.collect_dropped_engines()
            after = torch.cuda.memory_allocated() if cuda else 0
            row = {"family": family, "model_freed": model() is None, "runner_freed": runner_ref() is None,
                   "allocated_before_mb": before / 2**20, "allocated_running_mb": during / 2**20,
                   "allocated_after_mb": after / 2**20}
            gc.unfreeze()  # vLLM froze the heap: frozen objects are invisible to gc's scans
            if model() is not None:
                row["model_held_by"] = referrer_chain(model())
            if cuda:
                row["live_cuda_tensors"] = live_cuda_tensors()
                # What dynamo keeps in the code objects it compiled (C-level, invisible to gc):
                import torch._dynamo

                torch._dynamo.reset()
                gc.collect()
                torch.cuda.empty_cache()
                row["allocated_after_dynamo_reset_mb"] = torch.cuda.memory_allocated() / 2**20
            gc.freeze()
            report.append(row)
            print(json.dumps(row, indent=1), flush=True)
    if args.out:
        Path(args.out, "held-memory.json").write_text(json.dumps(report, indent=1))
    sys.exit(0 if all(r["model_freed"] for r in report) else 1)


if __name__ == "__main__":
    main()
