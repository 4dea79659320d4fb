"""Frames/s of a published family on speechctl (vLLM) beside transformers' ``generate`` on the
same device, at real size with random weights (speed does not depend on their values).

Both sides make exactly ``frames`` audio frames per request: speechctl with
``min_frames = max_frames``; transformers with no stop token and ``max_new_tokens`` covering the
same frames (its per-step work does not depend on the tokens). Sampling: temperature 0.9,
top-k 50 on both. transformers runs the whole batch as one padded ``generate`` call (equal
prompts, so no padding waste).

    python -m speechctl.bench.families --family higgs_audio_v2 --concurrency 1,64 --out out/higgs.json
    python -m speechctl.bench.families --family csm --concurrency 1,64 --out out/csm.json

``--generic`` also times, first and in the same process, speechctl's generic multi-stream model
with the family's backbone size (``speechctl.bench.shapes``: Higgs' "higgs-3b", CSM's
"llama-1b") on the same engine settings and workload: ``vs_generic`` is the family's frames/s
over the generic shape's at each concurrency, side by side in one run (issue 21: the real
architectures at >= 0.95 of the generic shape). The generic shape's prompts are lengthened to
the family's prompt length (Higgs' chat-format prompt is ~3x the generic one's, and attention
over the longer context was 145 us of a 4.3 ms step at 64 rows on an H100): the ratio then
compares the architectures on the same context, not the prompt formats.

``--plain`` times, before anything else and in a process of its own (the device to itself),
plain vLLM on the ``LlamaForCausalLM`` of that backbone (``speechctl.bench.plain``): one token
a step where the family makes a frame, ``frames`` tokens a request on prompts of the family's
length: ``vs_plain`` is the family's frames/s over its tokens/s, all three in one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from speechctl.bench.report import environment, result_writer
from speechctl.engine.params import Sampling
from speechctl.errors import EngineError

AUDIO_SAMPLING = Sampling(temperature=0.9, top_k=50)
TEXT = "The quick brown fox jumps over the lazy dog, number {i}."
FILLER = "Then it naps. "  # lengthens a prompt to a token count (lengthened)


def _higgs(tmp: Path, size: str, codec: bool = False):
    from speechctl.models.higgs.checkpoint import HIGGS_3B, HIGGS_3B_WITH_TOKENIZER, HiggsRecipe, create_higgs_checkpoint

    if size == "full":  # with codec: the tokenizer at its published shape, random weights
        recipe = HIGGS_3B_WITH_TOKENIZER if codec else HIGGS_3B
    else:
        recipe = HiggsRecipe(codec=codec)
    return create_higgs_checkpoint(tmp / f"higgs-{size}", recipe), recipe.dtype


def _csm(tmp: Path, size: str, codec: bool = False):
    from speechctl.models.csm.checkpoint import CSM_1B, CsmRecipe, create_csm_checkpoint

    recipe = CSM_1B if size == "full" else CsmRecipe()
    path = create_csm_checkpoint(tmp / f"csm-{size}", recipe)
    if size == "full" and codec:  # Mimi's published shape, random weights, inside the checkpoint
        from safetensors.torch import save_file
        from transformers import MimiConfig, MimiModel

        mimi = MimiModel(MimiConfig(num_quantizers=recipe.num_codebooks)).eval()
        save_file({f"codec_model.{k}": v.contiguous() for k, v in mimi.state_dict().items()}, str(path / "model.safetensors"))
    return path, recipe.dtype


# family -> (checkpoint maker, transformers class, extra generate() arguments)
FAMILIES = {
    "higgs_audio_v2": (_higgs, "HiggsAudioV2ForConditionalGeneration", {}),
    "csm": (_csm, "CsmForConditionalGeneration", dict(
        depth_decoder_do_sample=True, depth_decoder_temperature=AUDIO_SAMPLING.temperature,
        depth_decoder_top_k=AUDIO_SAMPLING.top_k,
    )),
}
# family -> the generic shape (speechctl.bench.shapes) of its backbone's size, at full size
GENERIC_SHAPES = {"higgs_audio_v2": "higgs-3b", "csm": "llama-1b"}


def run_family_bench(
    family: str = "higgs_audio_v2",
    size: str = "full",
    concurrencies=(1, 64),
    frames: int = 256,
    repeats: int = 3,
    transformers_too: bool = True,
    codec: bool = False,
    engine_overrides: dict | None = None,
    log=print,
    partial=None,
    generic: bool = False,
    plain: bool = False,
) -> dict:
    """``partial(result)`` is called with the result so far after every row (a run cut short by
    a time limit still leaves its measured rows). ``codec``: also end to end, text to waveform
    with the family's codec on the device (``Speech.run_requests``: decodes off the step loop),
    beside the LM alone in the same engine (``end_to_end_vs_lm``). ``generic``: the generic shape of the family's
    backbone size first, on the same settings (``vs_generic``). ``plain``: before both, plain
    vLLM on that backbone in its own process (``vs_plain``)."""
    from speechctl.engine.engine import EngineConfig, SpeechEngine
    from speechctl.models.weights import read_config

    with tempfile.TemporaryDirectory() as tmp:
        path, dtype = FAMILIES[family][0](Path(tmp), size, codec)
        top = max(concurrencies)
        config = EngineConfig(
            max_num_seqs=top,
            max_model_len=frames + 512,
            dtype=dtype,
            load_format="dummy" if size == "full" else "auto",
            **(engine_overrides or {}),
        )
        rows = []
        generic_result = plain_result = None
        shape = GENERIC_SHAPES[family] if size == "full" else "tiny"
        prompt_tokens = family_prompt_tokens(path) if plain or generic else 0  # (loads the tokenizer)
        if plain:
            plain_result = _plain_rows(shape, concurrencies, frames, repeats, prompt_tokens, engine_overrides, log)
            rows += plain_result.pop("rows")
        if generic:
            generic_result = _generic_rows(shape, config, concurrencies, frames, repeats, log, prompt_tokens=prompt_tokens)
            rows += generic_result.pop("rows")
        started = time.perf_counter()
        if codec:
            from speechctl.api import Speech
            from speechctl.threads import prompt_workers

            speech = Speech(path, engine_config=config)
            engine = speech.engine
            # The codec's worker lowers Python's switch interval for the process at its first
            # decode: lowered now, every row (the LM alone's too) runs at the interval that the
            # environment below records, not the first at 5 ms and the rest at 0.5.
            prompt_workers()
        else:
            engine = SpeechEngine(path, config)
        startup = time.perf_counter() - started
        prompts = engine.prompt_builder()

        def workload(count: int):
            return tts_requests(prompts, count, frames)

        result = {
            "family": family,
            "size": size,
            "frames_per_request": frames,
            "prompt_tokens": len(workload(1)[0].prompt_ids),
            "config": read_config(path),
            "startup_s": round(startup, 1),
            "warm_up_s": engine.warm_up_s,  # of which compiling the per-step work
            "start_up_graphs_s": engine.stats()["start_up_graphs_s"],  # and recording (compiling) the per-step graphs
            "codec_frame_rate": speech.codec.frame_rate if codec else None,
            "codec_decode_graphs": speech.codec.decode_graphs if codec else None,  # None: eager
            "codec_compiled": speech.codec.compiled if codec else None,  # None: transformers' eager modules
            "rows": rows,
            "generic": generic_result,  # the generic shape's engine (its rows are among ``rows``)
            "plain": plain_result,  # plain vLLM's process (its rows too)
            "environment": environment(),
        }
        if family == "higgs_audio_v2":  # without vLLM's MoE kernels its DualFFN runs both MLPs
            from speechctl.models.higgs.model import one_mlp_per_token

            grouped = one_mlp_per_token(bool(result["config"].get("mlp_bias", False)))
            result["dual_ffn"] = ("one MLP per token: the audio MLP alone in uniform decode steps, fused MoE in others"
                                  if grouped else "both MLPs")

        def add(row: dict) -> None:
            rows.append(row)
            log(row)
            if partial is not None:
                partial(result)

        def end_to_end(count: int, parts: list) -> float:
            from speechctl.jobs import TtsJob

            reqs = workload(count)
            for i, req in enumerate(reqs):
                req.tag = TtsJob(id=str(i), text="")
            engine.forget_cached_prompts()  # (as time_requests)
            timings = {}
            start = time.perf_counter()
            results = list(speech.run_requests(reqs, timings=timings))
            end = time.perf_counter()
            for r in results:
                if r.error or r.codes.shape[1] < frames:
                    raise EngineError(f"benchmark request failed: {r.error or r.codes.shape}")
            parts.append(end_to_end_parts(timings, start, end))
            return end - start

        frame_rate = result["codec_frame_rate"]
        for count in concurrencies:
            add(timed_row("speechctl", lambda: time_requests(engine, workload(count)), count, frames, repeats, frame_rate))
            if codec:
                parts = []
                row = timed_row("speechctl+codec", lambda: end_to_end(count, parts), count, frames, repeats, frame_rate)
                timed = parts[-repeats:]  # (before them, timed_row's warm-up)
                row["parts_s"] = {k: round(statistics.median(p[k] for p in timed), 4) for k in timed[0]}
                add(row)
        fps = {(r["system"], r["concurrency"]): r["frames_per_s"] for r in rows}
        for key, baseline in (("vs_plain", "plain vLLM"), ("vs_generic", "generic shape")):
            if (baseline, concurrencies[0]) in fps:
                result[key] = {str(c): round(fps["speechctl", c] / fps[baseline, c], 3) for c in concurrencies}
                log({key: result[key]})
        if codec:
            result["end_to_end_vs_lm"] = {str(c): round(fps["speechctl+codec", c] / fps["speechctl", c], 3) for c in concurrencies}
            log({"end_to_end_vs_lm": result["end_to_end_vs_lm"]})
        prompt_ids = workload(1)[0].prompt_ids
        if codec:
            speech.close()
        else:
            engine.shutdown()
        if transformers_too:
            for count in concurrencies:
                times = _transformers_times(family, path, dtype, prompt_ids, count, frames, engine.spec, repeats)
                add(rate_row("transformers", count, frames, times))
        return result


def end_to_end_parts(timings: dict, start: float, end: float) -> dict:
    """Where an end-to-end run's time went beside the LM alone's (``Speech.run_requests``'
    ``timings``; ``start``, ``end``: the run's ``perf_counter`` times): the steps until the
    last one's outputs (slower beside the codec?), and the tail after them, split into the host
    turning those outputs into codes (``finish_s``), the wait until the last decode started
    (``last_decode_waited_s``: a decode still running, the worker's turn for Python's lock), that
    decode (``last_decode_s``) and the handing out after it (``after_last_decode_s``)."""
    last_step, (first, last) = timings["last_step_at"], timings["decode_spans"][-1]
    return {"steps": timings["steps"], "steps_s": last_step - start, "after_last_step_s": end - last_step,
            "finish_s": timings["last_submitted_at"] - last_step,
            "last_decode_waited_s": first - timings["last_submitted_at"], "last_decode_s": last - first,
            "after_last_decode_s": end - last, "codec_busy_s": timings["codec_busy_s"]}


def family_prompt_tokens(path: Path) -> int:
    """The length of the bench's prompt (``tts_requests``) in the family's own format."""
    from transformers import AutoTokenizer

    from speechctl.models.families import open_checkpoint

    prompts = open_checkpoint(path).prompt_builder(AutoTokenizer.from_pretrained(str(path)))
    return len(tts_requests(prompts, 1, 1)[0].prompt_ids)


def _generic_rows(shape: str, config, concurrencies, frames: int, repeats: int, log, prompt_tokens: int = 0) -> dict:
    """speechctl's generic multi-stream model of bench shape ``shape`` (random weights) on the
    family's engine settings and workload: rows "generic shape", timed as the family's are, its
    prompts lengthened to at least ``prompt_tokens`` (the family's)."""
    from dataclasses import replace

    from speechctl.bench.shapes import SHAPES, describe, shape_checkpoint
    from speechctl.engine.engine import SpeechEngine
    from speechctl.models.generic.checkpoint import create_multistream_checkpoint

    recipe = SHAPES[shape]
    path = shape_checkpoint(shape, create_multistream_checkpoint)
    started = time.perf_counter()
    engine = SpeechEngine(path, replace(config, dtype=recipe.dtype, load_format="auto" if recipe.weights else "dummy"))
    startup = time.perf_counter() - started
    prompts = engine.prompt_builder()
    text = lengthened(prompts, TEXT, prompt_tokens)
    rows = []
    try:
        for count in concurrencies:
            rows.append(timed_row("generic shape", lambda: time_requests(engine, tts_requests(prompts, count, frames, text)),
                                  count, frames, repeats))
            log(rows[-1])
    finally:
        engine.shutdown()
    return {"shape": describe(shape), "startup_s": round(startup, 1), "rows": rows,
            "prompt_tokens": len(tts_requests(prompts, 1, 1, text)[0].prompt_ids)}


def _plain_rows(shape: str, concurrencies, frames: int, repeats: int, prompt_tokens: int, engine_overrides,
                log) -> dict:
    """Rows "plain vLLM": ``speechctl.bench.plain`` on bench shape ``shape``'s backbone in a child
    process (it exits before speechctl's engines start, so neither shares the device), ``frames``
    tokens a request on ``prompt_tokens``-token prompts, timed as the family's rows are."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plain.json"
        subprocess.run([sys.executable, "-m", "speechctl.bench.plain", "--shape", shape,
                        "--concurrency", ",".join(map(str, concurrencies)), "--tokens", str(frames),
                        "--prompt-len", str(prompt_tokens), "--repeats", str(repeats),
                        "--overrides", json.dumps(engine_overrides or {}), "--out", str(out)], check=True)
        plain = json.loads(out.read_text())
    rows = [{"system": "plain vLLM", "concurrency": r["concurrency"], "seconds": r["seconds"],
             "frames_per_s": r["tokens_per_s"]} for r in plain["rows"]]  # a token a step: a frame's place
    for row in rows:
        log(row)
    return {"shape": shape, "prompt_tokens": prompt_tokens, "rows": rows, "environment": plain["environment"]}


def lengthened(prompts, text: str, tokens: int, at_end: bool = False) -> str:
    """``text`` with ``FILLER`` added before it (``at_end``: after it) until its TTS prompt holds
    at least ``tokens`` tokens (the family's own tokenizer and prompt format). Before, a run's
    requests share the filler's prefix-cache blocks, as the family's own prompts share their
    template's; after, texts that differ at their start keep prompts that share no block."""
    while len(tts_requests(prompts, 1, 1, text)[0].prompt_ids) < tokens:
        text = text + " " + FILLER.strip() if at_end else FILLER + text
    return text


def tts_requests(prompts, count: int, frames: int, text: str = TEXT) -> list:
    """The bench's workload: ``count`` requests of exactly ``frames`` frames, each its own seed."""
    return [prompts.tts(text.format(i=i % 10), audio_sampling=AUDIO_SAMPLING, seed=i, max_frames=frames,
                        min_frames=frames, tag=i)
            for i in range(count)]


def timed_row(system: str, run, count: int, frames: int, repeats: int, frame_rate: float | None = None) -> dict:
    """``run()`` once untimed (a warm-up at this batch size), then ``repeats`` times: its row."""
    run()
    return rate_row(system, count, frames, [run() for _ in range(repeats)], frame_rate)


def time_requests(engine, requests) -> float:
    """Seconds for ``engine`` to generate ``requests`` (all of them, none failed), their prompts
    prefilled anew (not from the last repeat's prefix cache: transformers' rows have none)."""
    engine.forget_cached_prompts()
    start = time.perf_counter()
    outs = list(engine.generate(requests))
    elapsed = time.perf_counter() - start
    for out in outs:
        if out.error:
            raise EngineError(f"benchmark request failed: {out.error}")
    return elapsed


def rate_row(system: str, count: int, frames: int, times: list[float], frame_rate: float | None = None) -> dict:
    median = statistics.median(times)
    row = {"system": system, "concurrency": count, "seconds": [round(t, 3) for t in times],
           "frames_per_s": round(count * frames / median, 1)}
    if frame_rate:
        row["audio_s_per_s"] = round(count * frames / frame_rate / median, 2)
    return row


def _transformers_times(family, path, dtype, prompt_ids, count, frames, spec, repeats) -> list[float]:
    """transformers' own model and ``generate``, random weights of the same shape, no stop token
    (CSM's end frame, 31 zero codes, does not come from random weights)."""
    import torch
    import transformers
    from transformers import AutoConfig

    _, class_name, extra = FAMILIES[family]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = AutoConfig.from_pretrained(path)
    # built on the device in its dtype: a 3B model initialised in float32 on the host takes
    # minutes (the first H200 run ran out of time there)
    with torch.device(device):
        model = getattr(transformers, class_name)._from_config(config, dtype=getattr(torch, dtype)).eval()
    model.generation_config.eos_token_id = None
    ids = torch.tensor([prompt_ids] * count, device=device)
    # the steps speechctl runs for `frames` frames: Higgs adds its BOS frame and the flush
    steps = frames + (spec.num_codebooks + 2 if family == "higgs_audio_v2" else 1)

    def once(new_tokens: int) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                           do_sample=True, temperature=AUDIO_SAMPLING.temperature, top_k=AUDIO_SAMPLING.top_k,
                           pad_token_id=spec.pad_id, **extra)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    once(8)  # warm-up
    times = [once(steps) for _ in range(repeats)]
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="higgs_audio_v2", choices=sorted(FAMILIES))
    parser.add_argument("--size", default="full", choices=["full", "tiny"])
    parser.add_argument("--concurrency", default="1,64")
    parser.add_argument("--frames", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--codec", action="store_true", help="also end to end: text to waveform with the family's codec")
    parser.add_argument("--generic", action="store_true",
                        help="first the generic shape of the family's backbone size, same settings (vs_generic)")
    parser.add_argument("--plain", action="store_true",
                        help="before all, plain vLLM on that backbone in its own process (vs_plain)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    write = result_writer(args.out, "speechctl.bench.families", argv)

    result = run_family_bench(
        args.family, args.size, tuple(int(c) for c in args.concurrency.split(",")), args.frames,
        args.repeats, transformers_too=not args.no_transformers, codec=args.codec, partial=write, generic=args.generic,
        plain=args.plain,
    )
    write(result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
