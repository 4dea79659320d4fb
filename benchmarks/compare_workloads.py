"""Workload results of one load, side by side: several `speechctl bench --workload` JSONs that differ
in one setting (e.g. `--max-graph-tokens`), each labelled, drawn as grouped bars of the streamed
TTFA (p50, p95) and of the steps after a submission against the others (p50, p95):

    python3 benchmarks/compare_workloads.py --out docs/benchmarks/X.png \
        "512, call 1=docs/benchmarks/A.json" "vLLM's, call 1=docs/benchmarks/B.json" ...
"""

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="LABEL=RESULT.json (the first load row of each is drawn)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    runs = []
    for item in args.runs:
        label, _, path = item.rpartition("=")
        if not label:
            raise SystemExit(f"{item}: expected LABEL=RESULT.json")
        result = json.loads(Path(path).read_text())
        runs.append((label, result["results"][0], result))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / len(runs)
    for i, (label, row, _) in enumerate(runs):
        shift = (i - (len(runs) - 1) / 2) * width  # this run's bar beside the others in each group
        left.bar([j + shift for j in range(2)], [row["streamed_ttfa_p50_ms"], row["streamed_ttfa_p95_ms"]], width, label=label)
        steps = row["step_ms"]
        right.bar([j + shift for j in range(4)],
                  [steps["after_submit"]["p50"], steps["after_submit"]["p95"], steps["no_submit"]["p50"], steps["no_submit"]["p95"]],
                  width, label=label)
    left.axhline(250, ls=":", c="r", label="goal: p95 250 ms (H200)")
    left.set(xticks=range(2), xticklabels=["streamed TTFA p50", "streamed TTFA p95"], ylabel="ms")
    right.set(xticks=range(4), xticklabels=["after a submission\np50", "p95", "other steps\np50", "p95"], ylabel="ms a step")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    _, first_row, first = runs[0]
    env = first["environment"]
    fig.suptitle(f"{first['model']['family']}, load {first_row['load']} of saturation, {first['requests_per_rate']} requests "
                 f"— {env.get('device', '')}, vLLM {env.get('vllm', '')}, tree {env.get('commit', '')}")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
