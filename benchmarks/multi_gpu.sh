#!/usr/bin/env bash
# Two GPUs (device kind nvidia-h200-x2), vLLM 0.26 bundle staged (docs/gpu.md). One stage per call
# so that each fits the device tool's 10-minute limit:
#   source .gpu/unpack.sh && bash benchmarks/multi_gpu.sh tests      # TP=2 and DP=2 tests on CUDA
#   source .gpu/unpack.sh && bash benchmarks/multi_gpu.sh parallel   # 1 GPU vs TP=2 vs DP=2, higgs-3b, c=64
#   source .gpu/unpack.sh && bash benchmarks/multi_gpu.sh bench-tp   # `speechctl bench` throughput at TP=2
# MODES=one,tp2 (etc.) runs fewer modes of `parallel` if one call cannot hold all three.
# Logs and JSON under $OUT; copy the JSON to docs/benchmarks/.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export SPEECHCTL_CACHE=${SPEECHCTL_CACHE:-/tmp/speechctl-cache}
source "$(dirname "$0")/plugin_entry_point.sh"
for stage in "$@"; do
  case "$stage" in
    tests)
      nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$OUT/env-multi-gpu.txt" 2>&1
      python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, 'gpus', torch.cuda.device_count())" >> "$OUT/env-multi-gpu.txt" 2>&1
      # PYTEST_ARGS=-s: vLLM's worker processes' own tracebacks into the log (uncaptured)
      timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest -q -p no:cacheprovider -rfEs ${PYTEST_ARGS:-} tests/test_tensor_parallel.py \
        tests/test_data_parallel.py ${TESTS_K:+-k "$TESTS_K"} > "$OUT/pytest-multi-gpu.log" 2>&1
      tail -5 "$OUT/pytest-multi-gpu.log"
      ;;
    parallel)
      timeout "${PAR_TIMEOUT:-560}" python3 benchmarks/multi_gpu.py --shape higgs-3b --concurrency "${CONC:-64}" --frames "${FRAMES:-256}" \
        --repeats "${REPEATS:-2}" --modes "${MODES:-one,tp2,dp2}" --out "$OUT/multi-gpu-higgs-3b.json" > "$OUT/multi-gpu.log" 2>&1
      grep -E "frames/s|Error|error" "$OUT/multi-gpu.log" | tail -10
      ;;
    bench-tp)
      timeout "${TP_TIMEOUT:-560}" python3 -m speechctl.cli bench --shape higgs-3b -tp 2 --concurrency "${CONC:-64}" --frames "${FRAMES:-256}" \
        --repeats "${REPEATS:-2}" --no-eager --codec-requests 0 --out "$OUT/throughput-higgs-3b-tp2.json" 2> "$OUT/bench-tp2.log" | tail -3
      grep -E "^c=|Error" "$OUT/bench-tp2.log"
      ;;
  esac
done
