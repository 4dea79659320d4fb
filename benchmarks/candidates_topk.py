"""What the general audio sampling path pays for taking every token through ``topk`` instead of a sort.

The general path (``runtime/sampling.py``, on CUDA) draws its candidates from one ``topk(64)``
while every random row has a top-k of at most 64, and from every token otherwise
(``settings.CANDIDATE_SETS``). Until the thirty-third session "every token" was a sort, a branch
that made the two sets separate compiled variants of the sampling step; now the count reaches
``topk`` as a symbolic size (``torch.sym_min``) in both cases and one compile serves both
(``tests/test_step_graphs.py``). The price is the ``topk`` of the whole codebook in place of the
sort, on the steps where some row needs every token. This
times both, and the whole sampling step of that case for scale, in CUDA graphs at the families'
shapes (codebooks x codebook size) and several batch sizes.

    PYTHONPATH=. python benchmarks/candidates_topk.py --out $OUT/candidates-topk.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import torch

from dualffn_kernels import timed  # microseconds a call: CUDA graph replays on CUDA, a loop on the CPU
from speechctl.engine.runtime.sampling import sample_streams

SHAPES = {"higgs": (8, 1024), "dia": (9, 1028), "musicgen": (4, 2048), "csm-depth": (1, 2051)}


def measure(rows: int, streams: int, vocab: int, repeats: int, device: torch.device) -> dict:
    g = torch.Generator(device=device).manual_seed(rows * 7 + vocab)
    logits = torch.randn(rows, streams, vocab, device=device, generator=g)
    temperature = torch.full((rows,), 0.9, device=device)
    top_k = torch.zeros(rows, dtype=torch.int64, device=device)  # no top-k: every token is a candidate
    top_p = torch.full((rows,), 0.95, device=device)
    seed = torch.arange(rows, device=device)
    step = torch.zeros(rows, dtype=torch.int64, device=device)
    sorted_values, _ = logits.sort(dim=-1, descending=True)
    top_values, _ = logits.topk(vocab, dim=-1)

    def us(fn) -> float:
        return round(timed(lambda _: fn(), logits, 1, repeats), 1)

    return {
        "rows": rows, "streams": streams, "vocab": vocab,
        "sort_us": us(lambda: logits.sort(dim=-1, descending=True)),
        "topk_all_us": us(lambda: logits.topk(vocab, dim=-1)),
        "topk_64_us": us(lambda: logits.topk(64, dim=-1)),
        "sampling_step_every_token_us": us(lambda: sample_streams(logits, temperature, top_k, top_p, seed, step,
                                                                   all_random=True, max_top_k=0)),
        "same_values": bool(torch.equal(sorted_values, top_values)),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,16,128")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results = [{"shape": name, **measure(int(r), k, v, args.repeats, device)}
               for name, (k, v) in SHAPES.items() for r in args.rows.split(",")]
    for r in results:
        print(f"{r['shape']:>9} rows {r['rows']:>4}: sort {r['sort_us']:8.1f} us, topk(all) {r['topk_all_us']:8.1f} us, "
              f"topk(64) {r['topk_64_us']:8.1f} us, sampling step {r['sampling_step_every_token_us']:8.1f} us, "
              f"same values {r['same_values']}")
    command = " ".join(["python", "benchmarks/candidates_topk.py", *(argv if argv is not None else sys.argv[1:])])
    record = {"benchmark": "candidates_topk", "command": command, "device": torch.cuda.get_device_name() if device.type == "cuda"
              else platform.processor() or "cpu", "torch": torch.__version__, "results": results}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2)
    return record


if __name__ == "__main__":
    main()
