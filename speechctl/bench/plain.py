"""Plain vLLM on the backbone of a bench shape: a ``LlamaForCausalLM`` with the same layers,
widths and vocabulary, random weights, decoding a fixed number of tokens per request. It is the
baseline of ``speechctl bench``'s multi-stream overhead ratio, run in its own process so that each
engine has the whole device.

    python -m speechctl.bench.plain --shape higgs-3b --concurrency 1,64 --tokens 264 --out plain.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from speechctl.bench.report import environment
from speechctl.bench.shapes import SHAPES, shape_checkpoint


def plain_checkpoint(shape: str) -> Path:
    """The ``LlamaForCausalLM`` config of a bench shape's backbone (random weights: vLLM makes
    them), built once into speechctl's cache (``shapes.shape_checkpoint``)."""
    return shape_checkpoint(shape, write_plain_config)


def write_plain_config(directory: str | Path, recipe) -> None:
    from transformers import LlamaConfig

    LlamaConfig(
        vocab_size=plain_vocab(recipe),
        hidden_size=recipe.hidden_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        intermediate_size=recipe.intermediate_size,
        max_position_embeddings=recipe.max_position_embeddings,
    ).save_pretrained(directory)


def plain_llm(recipe, directory: str | Path, max_num_seqs: int, max_model_len: int, engine_overrides=None):
    """vLLM's own ``LLM`` on the ``LlamaForCausalLM`` config in ``directory`` (``plain_checkpoint``),
    random weights, engine settings as speechctl's."""
    from vllm import LLM

    from speechctl.engine import vllm_compat
    from speechctl.engine.config import EngineConfig

    vllm_compat.apply_engine_environment()  # in-process engine, V1 runner: as speechctl's

    config = EngineConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len, dtype=recipe.dtype,
                          load_format="dummy", **(engine_overrides or {}))
    args = config.engine_args(str(directory))
    for key in ("tokenizer", "limit_mm_per_prompt", "scheduler_cls"):
        args.pop(key)
    return LLM(skip_tokenizer_init=True, **args)


def plain_vocab(recipe) -> int:
    return recipe.vocab_size or 264


def run_plain(shape: str, concurrencies, tokens: int, prompt_len: int, repeats: int, engine_overrides=None) -> list[dict]:
    recipe = SHAPES[shape]
    if recipe.backbone != "llama":
        raise ValueError(f"plain baseline: only llama backbones, {shape} is {recipe.backbone}")
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    vocab = plain_vocab(recipe)
    llm = plain_llm(recipe, plain_checkpoint(shape), max(concurrencies), prompt_len + tokens + 16, engine_overrides)
    # The speechctl bench samples audio at temperature 0.9, top-k 50: the same sampler work here.
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.9, top_k=50, detokenize=False)

    def timed(count: int) -> float:
        prompts = [TokensPrompt(prompt_token_ids=[(7 * i + j) % vocab for j in range(prompt_len)]) for i in range(count)]
        # prefilled anew each repeat, as speechctl's rows are (``SpeechEngine.forget_cached_prompts``)
        if not llm.reset_prefix_cache():
            raise RuntimeError("plain vLLM: the prefix cache could not be emptied")
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        if any(len(o.outputs[0].token_ids) != tokens for o in outs):
            raise RuntimeError("plain vLLM did not decode the fixed length")
        return elapsed

    rows = []
    for count in concurrencies:
        timed(count)  # warm-up at this batch size
        times = [timed(count) for _ in range(repeats)]
        rows.append({"concurrency": count, "tokens": tokens, "seconds": [round(t, 4) for t in times],
                     "tokens_per_s": round(count * tokens / statistics.median(times), 1)})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--overrides", default="{}", help="EngineConfig fields as JSON")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = run_plain(args.shape, [int(c) for c in args.concurrency.split(",")], args.tokens, args.prompt_len,
                     args.repeats, json.loads(args.overrides))
    # this process's environment too: its host speed may differ from the speechctl process's
    args.out.write_text(json.dumps({"rows": rows, "environment": environment(speechctl=False)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
