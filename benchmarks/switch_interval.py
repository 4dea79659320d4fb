"""Run ``speechctl`` with Python's thread switch interval set first (an A/B on the GPU: do the
engine's steps wait for Python's lock while the codec's thread decodes? The default holds it
5 ms; docs/gpu.md, fiftieth entry):

    python3 benchmarks/switch_interval.py 0.0005 bench --workload --model /tmp/higgs-3b ...
"""

import sys

from speechctl.cli import main

if __name__ == "__main__":
    sys.setswitchinterval(float(sys.argv[1]))
    sys.argv = ["speechctl", *sys.argv[2:]]
    main()
