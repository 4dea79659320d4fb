#!/usr/bin/env bash
# GPU smoke on the device machine (vLLM 0.26 bundle staged, see DEVELOPERS notes in docs/gpu.md):
#   source .gpu/unpack.sh && bash benchmarks/gpu_smoke.sh
# Writes logs under $OUT (or ./out).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
# each test's outcome and each failure's traceback as it happens (tests/conftest.py): a run that
# a call's time limit kills still says what failed and why
export SPEECHCTL_TEST_LOG=${SPEECHCTL_TEST_LOG:-$OUT/tests-progress.log}
export SPEECHCTL_CACHE=/tmp/speechctl-cache
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/env.txt"
python3 -m pytest -q -p no:cacheprovider tests/test_streams.py tests/test_sampling.py tests/test_vllm_compat.py tests/test_parity.py \
  ${SMOKE_PYTEST_ARGS:-} 2>&1 | tee "$OUT/pytest.log"
echo "pytest exit: ${PIPESTATUS[0]}" | tee -a "$OUT/pytest.log"
if [ "${SMOKE_CLI:-1}" = 1 ]; then
  python3 -m speechctl.cli tts "Hello world" -o "$OUT/hello.wav" 2>&1 | tail -20 | tee "$OUT/tts.log"
  echo "tts exit: ${PIPESTATUS[0]}" | tee -a "$OUT/tts.log"
fi
if [ "${SMOKE_CLI:-1}" = 1 ]; then
  printf 'Hello world.\nA second sentence, spoken from stdin.\n' | python3 -m speechctl.cli tts - -o "$OUT/stdin.flac" 2>&1 | tail -5 | tee -a "$OUT/tts.log"
  python3 -m speechctl.cli asr "$OUT/hello.wav" --format json 2>&1 | tail -8 | tee -a "$OUT/tts.log"
  python3 -m speechctl.cli batch samples/broken.jsonl --out-dir "$OUT/batch" 2>&1 | tail -8 | tee -a "$OUT/tts.log"
  cp "$OUT/batch/results.jsonl" "$OUT/batch-results.jsonl" 2>/dev/null
fi
