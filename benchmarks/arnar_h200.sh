#!/usr/bin/env bash
# The AR+NAR family (issue 24) on the H200, vLLM 0.26 bundle staged (docs/gpu.md). One stage per call:
#   source .gpu/unpack.sh && bash benchmarks/arnar_h200.sh tests   # tests/test_valle.py on CUDA (~2 min)
#   source .gpu/unpack.sh && bash benchmarks/arnar_h200.sh bench   # 1B AR+NAR beside the 1B delay model (~6 min)
# BENCH_ARGS adds to the bench's command line (e.g. "--nar shared"); ARNAR_CONC the concurrencies,
# ARNAR_FRAMES the frames per request. Writes $OUT/arnar-llama-1b.{json,png} and the logs; copy
# the JSON and PNG to docs/benchmarks/.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
# each test's outcome and each failure's traceback as it happens (tests/conftest.py): a run that
# a call's time limit kills still says what failed and why
export SPEECHCTL_TEST_LOG=${SPEECHCTL_TEST_LOG:-$OUT/tests-progress.log}
export SPEECHCTL_CACHE=${SPEECHCTL_CACHE:-/tmp/speechctl-cache}
source "$(dirname "$0")/plugin_entry_point.sh"
case "${1:-bench}" in
  tests)
    timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_valle.py > "$OUT/pytest-valle.log" 2>&1
    tail -15 "$OUT/pytest-valle.log"
    ;;
  bench)
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-570}" python3 -m speechctl.cli bench --arnar --shape llama-1b --concurrency "${ARNAR_CONC:-1,16,64}" \
      --frames "${ARNAR_FRAMES:-256}" --repeats "${REPEATS:-3}" --out "$OUT/arnar-llama-1b.json" --plot "$OUT/arnar-llama-1b.png" \
      ${BENCH_ARGS:-} > "$OUT/arnar-llama-1b.out" 2> "$OUT/arnar-llama-1b.log"
    grep -E '^\{"model"|rows in|Error|Traceback' "$OUT/arnar-llama-1b.log" | tail -20
    cat "$OUT/arnar-llama-1b.out"
    ;;
esac
