#!/usr/bin/env bash
# CFG on the H200 (vLLM 0.26 bundle staged; see docs/gpu.md):
#   source .gpu/unpack.sh && bash benchmarks/gpu_cfg.sh tests     # CFG + parity tests
#   source .gpu/unpack.sh && bash benchmarks/gpu_cfg.sh bench     # the throughput ratio
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export SPEECHCTL_CACHE=/tmp/speechctl-cache
case "${1:-tests}" in
  tests)
    python3 -m pytest -q -p no:cacheprovider -rA tests/test_cfg.py tests/test_parity.py 2>&1 | tee "$OUT/pytest-cfg.log" | tail -40
    ;;
  bench)
    python3 -m speechctl.cli bench --cfg --shape "${SHAPE:-higgs-3b}" --concurrency "${CONC:-1,16,64,256}" \
      --frames "${FRAMES:-256}" --repeats "${REPEATS:-3}" \
      --out "$OUT/cfg-${SHAPE:-higgs-3b}.json" --plot "$OUT/cfg-${SHAPE:-higgs-3b}.png" 2>&1 | tee "$OUT/bench-cfg.log" | tail -60
    ;;
esac
