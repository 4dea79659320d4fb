"""benchmarks/asr_speed.py (the H200 speed comparison) at a tiny size on the CPU: every system,
greedy and beam 5, two batch sizes; the JSON it writes and the command it records."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
pytestmark = pytest.mark.engine


def test_the_speed_bench_runs_and_records_its_command(tmp_path):
    out, png = tmp_path / "speed.json", tmp_path / "speed.png"
    args = ["--batch", "1,2", "--files", "4", "--max-tokens", "40", "--repeats", "2", "--profile", "speechctl", "--admit-share", "0,0.5",
            "--systems", "speechctl,transformers,ctranslate2",
            "--out", str(out), "--plot", str(png)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}  # this checkout's speechctl
    done = subprocess.run([sys.executable, "benchmarks/asr_speed.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    rows = [r for r in record["results"] if "skipped" not in r]
    systems = {r["system"] for r in rows}
    assert {"speechctl", "transformers"} <= systems
    # greedy and beam 5 at batch 1 and 2; speechctl's at both admission shares
    assert len(rows) == 4 * (len(systems) + 1)
    assert sorted(r["admit_share"] for r in rows if r["system"] == "speechctl") == [0.0] * 4 + [0.5] * 4
    assert all("admit_share" not in r for r in rows if r["system"] != "speechctl")
    for r in rows:
        assert r["files"] == 4 and r["wall_s"] > 0 and r["audio_s_per_s"] > 0 and 0 <= r["wer"] < 70, r
        assert len(r["wall_s_passes"]) == 2 and r["wall_s"] == min(r["wall_s_passes"]), r  # the lower median of two
    for r in rows:  # the encoder ran once per window, whatever the beam
        if r["system"] == "speechctl":
            assert r["encoded_windows"] == 4, r
    for r in rows:  # speechctl says where its time went: steps, our logits processor, beams
        if r["system"] != "speechctl":
            assert "profile" not in r and "steps" not in r, r
            continue
        assert r["steps"] > 0 and 0 < r["apply_s"] < r["step_s"] < r["wall_s"] and r["restarts"] == 0, r
        assert 0 < r["admitting_steps"] <= r["steps"] and 0 < r["admitting_step_s"] <= r["step_s"], r
        assert (r["beam_steps"] > 0 and 0 < r["beam_s"] < r["apply_s"]) if r["mode"] == "beam5" else r["beam_steps"] == 0, r
        profile = r["profile"]  # the untimed profiled run, its main thread's functions
        assert profile["wall_s"] > 0 and len(profile["own"]) == 30
        assert any("engine.py" in f and "(step)" in f for f, _, _ in profile["cumulative"]), profile["cumulative"]
        assert any(f.startswith("asr/decoder.py") and "(apply)" in f for f, _, _ in profile["speechctl"]), profile["speechctl"]
    same = {(r["mode"], r["system"]): r["wer"] for r in rows if r["batch"] == 1 and not r.get("admit_share")}
    grouped = {(r["mode"], r["batch"]): r["wer"] for r in rows if r.get("admit_share")}
    assert grouped == {(r["mode"], r["batch"]): r["wer"] for r in rows if r["system"] == "speechctl" and not r["admit_share"]}
    assert same[("greedy", "speechctl")] == same[("greedy", "transformers")]  # the same greedy tokens
    assert png.stat().st_size > 10_000
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import asr_speed

    recorded = record["command"].split()
    assert recorded[:2] == ["python", "benchmarks/asr_speed.py"]
    assert vars(asr_speed.parse(recorded[2:])) == vars(asr_speed.parse(args))
