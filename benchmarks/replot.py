"""Redraw a committed benchmark result's PNG from its JSON (after a change to the plots, without
re-running the benchmark): python3 benchmarks/replot.py docs/benchmarks/RESULT.json [OUT.png]."""

import json
import sys
from pathlib import Path

from speechctl.bench.cfg import plot_cfg
from speechctl.bench.stream import plot_stream
from speechctl.bench.throughput import plot_throughput

PLOTS = {"throughput": plot_throughput, "cfg": plot_cfg, "stream": plot_stream}

if __name__ == "__main__":
    source = Path(sys.argv[1])
    target = Path(sys.argv[2]) if len(sys.argv) > 2 else source.with_suffix(".png")
    result = json.loads(source.read_text())
    PLOTS[result["benchmark"]](result, target)
    print(target)
