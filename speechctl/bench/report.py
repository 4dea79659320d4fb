"""What every bench result carries and draws: the software and device it ran on, and a figure of
rates against concurrency beside a ratio with its reference lines."""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path


def result_writer(out: Path | None, module: str, argv: list[str] | None):
    """For a bench run as ``python -m MODULE ARGV``: a function that writes a result to ``out``
    (atomically, with the command that made it; nothing without ``out``)."""
    import shlex
    import sys

    command = shlex.join(["python3", "-m", module, *(sys.argv[1:] if argv is None else argv)])

    def write(result: dict) -> None:
        if out:
            from speechctl.audio import write_json_atomic

            out.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(out, {"command": command, **result})

    return write


def source_commit() -> str | None:
    """The commit of speechctl's checkout, with ``+changes`` when tracked files differ from it
    (a device call runs the working tree, which may hold what is not yet committed); None
    outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+changes" if dirty else "")


def environment(speechctl: bool = True) -> dict:
    """The software, device and host speed of this process; ``speechctl``: also how speechctl's
    engines run here (not for a plain-vLLM baseline's process)."""
    import torch
    import transformers
    import vllm

    env = {"vllm": vllm.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
           "python": platform.python_version(),
           # how long a thread holds Python's lock while another waits (the step loop beside the
           # codec's thread): an A/B sets it before the run (docs/gpu.md, fiftieth entry)
           "switch_interval_s": sys.getswitchinterval()}
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name(0)
        if torch.cuda.device_count() > 1:
            env["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    else:
        env["device"] = platform.processor() or "cpu"
    env["host"] = host_probe()
    env["commit"] = source_commit()
    if speechctl:
        from speechctl.engine.engine import priority_stream_enabled
        from speechctl.engine.runtime import compile_per_step_work

        env["per_step_work_compiled"] = compile_per_step_work()
        env["engine_on_priority_stream"] = priority_stream_enabled()
    return env


def host_probe(launches: int = 2000, iterations: int = 200_000) -> dict:
    """How fast this process's host side runs: microseconds to queue one tiny device op (nothing
    waits for it) and nanoseconds per iteration of a plain Python loop. On the lent H200 whole
    processes have run the same host-bound decode step at 7 or at 12 ms, whatever the commit
    (docs/benchmarks/throughput.md); each result records this to tell such a process apart."""
    import torch

    cuda = torch.cuda.is_available()
    x = torch.zeros(1, device="cuda" if cuda else "cpu")
    for _ in range(100):  # warm-up: the kernel's first launch loads it
        x.add_(1)
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(launches):
        x.add_(1)
    launch = (time.perf_counter() - start) / launches
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    total = 0
    for i in range(iterations):
        total += i
    loop = (time.perf_counter() - start) / iterations
    return {"launch_us": round(launch * 1e6, 2), "python_loop_ns": round(loop * 1e9, 1)}


def plot_rates_and_ratio(result: dict, path: str | Path, rates, rates_label: str, ratio, *, rows=None, third=None) -> None:
    """Left: ``rates`` [(row key, style, label)] per concurrency, log-log, each where the rows
    have it. Middle: ``ratio`` (row key, x label, y label, [(y, line style, colour, label)]), if
    the rows have it. ``third(axes, rows, concurrencies)`` draws a third panel. ``rows``: the
    result's ``results`` unless given. Titled with the model shape, device and vLLM version
    (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"] if rows is None else rows
    c = [r["concurrency"] for r in rows]
    fig, axes = plt.subplots(1, 3 if third else 2, figsize=(15 if third else 10, 4))
    left, right = axes[0], axes[1]
    for key, style, label in rates:
        if key in rows[0]:
            left.plot(c, [r[key] for r in rows], style, label=label)
    left.set(xscale="log", yscale="log", xlabel="concurrent requests", ylabel=rates_label)
    left.legend()
    key, xlabel, ylabel, lines = ratio
    if key in rows[0]:
        values = [r[key] for r in rows]
        right.plot(c, values, "o-")
        for y, style, colour, label in lines:
            right.axhline(y, ls=style, c=colour, label=label)
        right.set(xscale="log", ylim=(0, max(1.1, 1.1 * max(values))), xlabel=xlabel, ylabel=ylabel)
        right.legend()
    if third:
        third(axes[2], rows, c)
    m, env = result["model"], result["environment"]
    fig.suptitle(f"{m['shape']} ({m['layers']}L, {m['hidden']}h, {m['codebooks']} codebooks), {env['device']}, vLLM {env['vllm']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
