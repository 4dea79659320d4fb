"""What every bench result carries and draws: the software and device it ran on, and a figure of
rates against concurrency beside a ratio with its reference lines."""

from __future__ import annotations

import platform
from pathlib import Path


def environment() -> dict:
    import torch
    import transformers
    import vllm

    env = {"vllm": vllm.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
           "python": platform.python_version()}
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name(0)
        if torch.cuda.device_count() > 1:
            env["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    else:
        env["device"] = platform.processor() or "cpu"
    return env


def plot_rates_and_ratio(result: dict, path: str | Path, rates, rates_label: str, ratio) -> None:
    """Left: ``rates`` [(row key, style, label)] per concurrency, log-log, each where the rows
    have it. Right: ``ratio`` (row key, x label, y label, [(y, line style, colour, label)]), if
    the rows have it. Titled with the model shape, device and vLLM version (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"]
    c = [r["concurrency"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for key, style, label in rates:
        if key in rows[0]:
            left.plot(c, [r[key] for r in rows], style, label=label)
    left.set(xscale="log", yscale="log", xlabel="concurrent requests", ylabel=rates_label)
    left.legend()
    key, xlabel, ylabel, lines = ratio
    if key in rows[0]:
        right.plot(c, [r[key] for r in rows], "o-")
        for y, style, colour, label in lines:
            right.axhline(y, ls=style, c=colour, label=label)
        right.set(xscale="log", ylim=(0, 1.1), xlabel=xlabel, ylabel=ylabel)
        right.legend()
    m, env = result["model"], result["environment"]
    fig.suptitle(f"{m['shape']} ({m['layers']}L, {m['hidden']}h, {m['codebooks']} codebooks), {env['device']}, vLLM {env['vllm']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
