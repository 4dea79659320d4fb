"""Frames/s of the encoder-decoder families whose reference guides (Dia, MusicGen) on speechctl
(vLLM) beside transformers' ``generate`` with its guidance, at real size with random weights.

Each family runs as its ``generation_config.json`` says (Dia 1.6B: temperature 1.2, top-k 45,
top-p 0.95, CFG 3 with its CFG filter; MusicGen-small: sampling, CFG 3) on both sides, and every
request makes exactly ``frames`` frames: speechctl with ``min_frames = max_frames``;
transformers with the steps its ``generate`` needs for that many frames and, for Dia, channel 0's
end-of-speech logit held at 0 (random weights would otherwise end a batch of one early about one
run in four; the steps it made are checked). Per concurrency c the rows are: speechctl with CFG
(c pairs), speechctl without CFG at c and 2c rows — the **CFG efficiency** CFG(c) ÷ (R(2c)/2) of
``bench --cfg`` (DESIGN.md §4) — and transformers with CFG (its batch of 2c rows, as it guides).
transformers' MusicGen decodes its EnCodec inside ``generate``; that decode is left out here
(the language model alone on both sides). Each speechctl row also says what each timed repeat did
beside its time (``repeat_counters``: graph captures, resumptions, pair steps plain / checked).

    python -m speechctl.bench.guided --family dia --concurrency 1,16,64 --out out/dia.json
    python -m speechctl.bench.guided --family musicgen --concurrency 1,16,64 --out out/musicgen.json
    python -m speechctl.bench.guided --replot out/dia.json --plot out/dia.png   # a result's plot, again
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

from speechctl.bench.families import rate_row, time_requests
from speechctl.bench.report import environment, plot_rates_and_ratio, result_writer
from speechctl.errors import EngineError

TEXTS = {"dia": "[S1] The quick brown fox jumps over the lazy dog, number {i}. [S2] Indeed.",
         "musicgen": "lo-fi piano with soft rain, take {i}"}
# engine.stats() counters recorded per timed repeat: per-step graphs captured after start-up,
# requests resumed after preemption, pair steps checked request by request (issue 21 item 4: a
# 64-pair repeat took 3.43 s beside 2.29 and 2.59 in one run)
REPEAT_COUNTERS = ("graph_captures", "resumed", "pair_steps_plain", "pair_steps_checked")


def _dia(tmp: Path, size: str):
    from speechctl.models.dia.checkpoint import DIA_1_6B, DiaRecipe, create_dia_checkpoint

    recipe = DIA_1_6B if size == "full" else DiaRecipe(init_std=0.02, generation=dict(DIA_1_6B.generation), codec=None)
    return create_dia_checkpoint(tmp / f"dia-{size}", recipe), recipe.dtype


def _musicgen(tmp: Path, size: str):
    from speechctl.models.musicgen.checkpoint import MUSICGEN_SMALL, MusicgenRecipe, create_musicgen_checkpoint

    recipe = MUSICGEN_SMALL if size == "full" else MusicgenRecipe(init_std=0.02, generation=dict(MUSICGEN_SMALL.generation))
    return create_musicgen_checkpoint(tmp / f"musicgen-{size}", recipe), recipe.dtype


# family -> (checkpoint maker, transformers class, steps transformers' generate runs for n frames)
FAMILIES = {
    "dia": (_dia, "DiaForConditionalGeneration", lambda n, config: n + max(config["delay_pattern"]) + 1),
    "musicgen": (_musicgen, "MusicgenForConditionalGeneration", lambda n, config: n + config["decoder"]["num_codebooks"] - 1),
}


def run_guided_bench(family: str = "dia", size: str = "full", concurrencies=(1, 16, 64), frames: int = 256,
                     repeats: int = 3, transformers_too: bool = True, log=print, partial=None) -> dict:
    from speechctl.engine.engine import EngineConfig, SpeechEngine
    from speechctl.engine.params import NO_GUIDANCE
    from speechctl.models.families import open_checkpoint

    make, _, _ = FAMILIES[family]
    with tempfile.TemporaryDirectory() as tmp:
        path, dtype = make(Path(tmp), size)
        top = max(concurrencies)
        limit = open_checkpoint(path).context_limit  # (room for the encoder's input in a step, as the families bench)
        config = EngineConfig(max_num_seqs=2 * top, max_model_len=min(frames + 512, limit), dtype=dtype,
                              load_format="dummy" if size == "full" else "auto")
        started = time.perf_counter()
        engine = SpeechEngine(path, config)
        startup = time.perf_counter() - started
        checkpoint, prompts = engine.checkpoint, engine.prompt_builder()
        audio = checkpoint.defaults.audio
        guided = checkpoint.guidance(None, audio)
        if not guided.enabled:
            raise EngineError(f"{path}: its generation_config.json does not guide")

        def run(count: int, guidance) -> float:
            return time_requests(engine, [
                prompts.tts(TEXTS[family].format(i=i % 10), audio_sampling=audio, guidance=guidance, seed=i,
                            max_frames=frames, min_frames=frames, tag=i) for i in range(count)])

        rows = []
        result = {"family": family, "size": size, "frames_per_request": frames, "config": checkpoint.config,
                  "sampling": {"audio": asdict(audio), "guidance": asdict(guided)},
                  "startup_s": round(startup, 1), "warm_up_s": engine.warm_up_s,
                  "start_up_graphs_s": engine.stats()["start_up_graphs_s"], "rows": rows,
                  "cfg_efficiency": {}, "environment": environment()}

        def add(row: dict) -> dict:
            rows.append(row)
            log(row)
            if partial is not None:
                partial(result)
            return row

        def measure(system: str, count: int, guidance) -> dict:
            run(count, guidance)  # warm-up at this batch size
            times, counts = [], []
            for _ in range(repeats):  # what each repeat did beside its time: a slow one says why
                before = engine.stats()
                times.append(run(count, guidance))
                after = engine.stats()
                counts.append({name: after[name] - before[name] for name in REPEAT_COUNTERS})
            return add({**rate_row(system, count, frames, times), "repeat_counters": counts})

        plain = {}
        for count in concurrencies:
            cfg = measure("speechctl cfg", count, guided)
            for rows_of in (count, 2 * count):
                if rows_of not in plain:
                    plain[rows_of] = measure("speechctl", rows_of, NO_GUIDANCE)
            result["cfg_efficiency"][str(count)] = round(cfg["frames_per_s"] / (plain[2 * count]["frames_per_s"] / 2), 3)
        prompt_ids = [prompts.tts(TEXTS[family].format(i=i % 10), max_frames=frames).encoder_ids.tolist()
                      for i in range(top)]
        engine.shutdown()
        if transformers_too:
            for count in concurrencies:
                times, steps = _transformers_times(family, path, dtype, prompt_ids[:count], frames, repeats)
                add({**rate_row("transformers cfg", count, frames, times), "steps": steps})
        return result


def _transformers_times(family, path, dtype, prompt_ids, frames, repeats) -> tuple[list[float], int]:
    """transformers' own model and ``generate`` with its generation config (guidance included),
    random weights of the same shape; (times, steps it made)."""
    import torch
    import transformers
    from transformers import AutoConfig, GenerationConfig

    _, class_name, steps_for = FAMILIES[family]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = AutoConfig.from_pretrained(path)
    with torch.device(device):  # built on the device in its dtype (minutes on the host otherwise)
        model = getattr(transformers, class_name)._from_config(config, dtype=getattr(torch, dtype)).eval()
    generation = GenerationConfig.from_pretrained(path)
    steps = steps_for(frames, config.to_dict())
    if family == "dia":
        with torch.no_grad():  # channel 0's end-of-speech row: its logit 0, never the top of 1028 random ones
            model.logits_dense.weight[config.decoder_config.eos_token_id].zero_()
    else:  # the language model alone: EnCodec's decode left out
        model.audio_encoder.decode = lambda codes, *a, **k: SimpleNamespace(audio_values=codes)
    width = max(len(p) for p in prompt_ids)
    ids = torch.tensor([list(p) + [0] * (width - len(p)) for p in prompt_ids], device=device)
    mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompt_ids], device=device)

    def once(new_tokens: int) -> tuple[float, int]:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=generation, max_new_tokens=new_tokens)
        if device == "cuda":
            torch.cuda.synchronize()
        # Dia: [B, steps, C] as generated; MusicGen: the [1, B, K, frames] codes it would decode
        made = out.shape[1] if family == "dia" else out.shape[-1]
        return time.perf_counter() - start, made

    once(8)  # warm-up
    runs = [once(steps) for _ in range(repeats)]
    made, want = min(m for _, m in runs), (steps if family == "dia" else frames)
    if made < want:
        raise EngineError(f"transformers' {class_name} made {made} of {want} {'steps' if family == 'dia' else 'frames'}: "
                          "its requests ended early")
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return [t for t, _ in runs], steps


def plot_guided(result: dict, path: str | Path) -> None:
    """Frames/s per concurrency (speechctl with CFG, without at c and the limit R(2c)/2,
    transformers with CFG) and the CFG efficiency (needs matplotlib)."""
    by_c: dict[int, dict] = {}
    names = {"speechctl cfg": "cfg", "speechctl": "plain", "transformers cfg": "transformers"}
    for row in result["rows"]:
        by_c.setdefault(row["concurrency"], {"concurrency": row["concurrency"]})[names[row["system"]]] = row["frames_per_s"]
    rows = []
    for c, row in sorted(by_c.items()):
        if "cfg" in row:  # (c and 2c rows without CFG are there for the pairs' concurrencies)
            limit = by_c.get(2 * c, {}).get("plain")
            rows.append(dict(row, limit=limit / 2 if limit else None, cfg_efficiency=result["cfg_efficiency"].get(str(c))))
    rates = [("cfg", "s-", "speechctl, CFG (c pairs)"), ("plain", "o-", "speechctl, no CFG (c requests)"),
             ("limit", "^:", "limit R(2c)/2"), ("transformers", "x--", "transformers generate, CFG")]
    config = result["config"]
    decoder = config.get("decoder_config") or config.get("decoder") or {}
    shown = {"model": {"shape": f"{result['family']} ({result['size']}, {result['frames_per_request']} frames a request)",
                       "layers": decoder.get("num_hidden_layers"), "hidden": decoder.get("hidden_size"),
                       "codebooks": decoder.get("num_channels") or decoder.get("num_codebooks")},
             "environment": result["environment"]}
    goals = [(0.95, "--", "g", "goal 0.95")]
    plot_rates_and_ratio(shown, path, [r for r in rates if all(row.get(r[0]) for row in rows)], "audio frames / s",
                         ("cfg_efficiency", "concurrent requests (pairs)", "CFG efficiency: CFG(c) / (R(2c)/2)", goals), rows=rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="dia", choices=sorted(FAMILIES))
    parser.add_argument("--size", default="full", choices=["full", "tiny"])
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--frames", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path, help="also draw the result (needs matplotlib)")
    parser.add_argument("--replot", type=Path, metavar="JSON", help="only draw this result to --plot")
    args = parser.parse_args(argv)
    if args.replot:
        plot_guided(json.loads(args.replot.read_text()), args.plot or args.replot.with_suffix(".png"))
        return
    write = result_writer(args.out, "speechctl.bench.guided", argv)

    result = run_guided_bench(args.family, args.size, tuple(int(c) for c in args.concurrency.split(",")), args.frames,
                              args.repeats, transformers_too=not args.no_transformers, partial=write)
    write(result)
    if args.plot:
        plot_guided(result, args.plot)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
