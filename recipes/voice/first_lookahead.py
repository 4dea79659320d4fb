"""What an early first chunk costs: the first chunk decoded with less than the codec's right
context, against the exact one, on held-out speech.

    python -m recipes.voice.first_lookahead --data .voice/heldout-data --out docs/voice/first-lookahead.json

A streamed request's first chunk normally waits for the decoder's whole right context (its
receptive field, measured at load: every sample is then the one-shot decode's). With
``first_lookahead`` r it goes once r frames past it exist, decoded from just those
(``speechctl.codecs.streaming``). For each held-out utterance, encoded by the codec, this decodes
the first ``first_chunk`` frames from the prefix of ``first_chunk + r`` frames and compares them
with the same frames of the whole utterance's decode: the signal-to-error ratio in dB (the
chunk's own energy over the error's; the start of an utterance is quiet, so this is the strict
reading) and the error's peak in dBFS. Percentiles over the utterances, per r.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def chunk_errors(codec, codes: np.ndarray, first_chunk: int) -> dict[int, tuple[float, float]]:
    """lookahead r -> (signal-to-error dB, error peak dBFS) of the first chunk of ``codes`` [K, T]."""
    hop = codec.hop_length
    right = codec.decode_context[1]
    (whole,) = codec.decode([codes])
    exact = whole[: first_chunk * hop]
    prefixes = codec.decode([codes[:, : first_chunk + r] for r in range(right + 1)])
    out = {}
    for r, prefix in enumerate(prefixes):
        error = prefix[: first_chunk * hop] - exact
        ratio = 10 * np.log10(max(float((exact**2).sum()), 1e-20) / max(float((error**2).sum()), 1e-20))
        out[r] = (ratio, 20 * np.log10(max(float(np.abs(error).max()), 1e-10)))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=".voice/heldout-data", help="the recipe's data directory (its held-out split)")
    p.add_argument("--codec", default=None, help="a codec directory (default: the default voice's)")
    p.add_argument("--utterances", type=int, default=100)
    p.add_argument("--first-chunk", default="2,4", help="first chunk sizes in frames, comma-separated")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    from recipes.voice.data import load_split
    from speechctl import voices
    from speechctl.audio import write_json_atomic
    from speechctl.codecs import load_codec

    codec_path = Path(args.codec) if args.codec else voices.voice_dir() / "codec"
    codec = load_codec(codec_path)
    split = load_split(Path(args.data), "heldout")
    count = min(args.utterances, len(split))
    sizes = [int(x) for x in args.first_chunk.split(",")]
    rows = {n: {} for n in sizes}
    for i in range(count):
        codes = codec.encode([split.wave(i)])[0]
        for n in sizes:
            if codes.shape[1] < n + codec.decode_context[1] + 1:
                continue
            for r, measured in chunk_errors(codec, codes, n).items():
                rows[n].setdefault(r, []).append(measured)
    pct = lambda xs, q: round(float(np.percentile(xs, q)), 1)
    table = [{"first_chunk": n, "lookahead": r, "utterances": len(v),
              "snr_db": {"p5": pct([a for a, _ in v], 5), "p50": pct([a for a, _ in v], 50), "min": pct([a for a, _ in v], 0)},
              "error_peak_dbfs": {"p50": pct([b for _, b in v], 50), "p95": pct([b for _, b in v], 95), "max": pct([b for _, b in v], 100)}}
             for n in sizes for r, v in sorted(rows[n].items())]
    result = {"codec": str(codec_path), "codec_decode_context": list(codec.decode_context), "hop_length": codec.hop_length,
              "sample_rate": codec.sample_rate, "data": args.data, "rows": table}
    write_json_atomic(args.out, result)
    for row in table:
        print(f"first chunk {row['first_chunk']}, lookahead {row['lookahead']:2d}: SNR p50 {row['snr_db']['p50']:6.1f} "
              f"p5 {row['snr_db']['p5']:6.1f} min {row['snr_db']['min']:6.1f} dB; error peak p95 {row['error_peak_dbfs']['p95']:6.1f} dBFS")


if __name__ == "__main__":
    main()
