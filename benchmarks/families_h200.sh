#!/usr/bin/env bash
# Published families at real size (Higgs Audio v2 3B, CSM 1B; random weights) on the H200, vLLM 0.26 bundle staged (docs/gpu.md):
#   source .gpu/unpack.sh && bash benchmarks/families_h200.sh tests   # the family parity suites on CUDA
#   source .gpu/unpack.sh && bash benchmarks/families_h200.sh bench   # frames/s, speechctl beside transformers
#     (CODEC=1: also end to end, text to waveform with the family's codec at its published shape)
#     (GENERIC=1: first the generic shape of the family's backbone size in the same process and settings:
#     vs_generic, issue 21's real-architecture ratio, side by side)
#     (PLAIN=1: before all, plain vLLM on that backbone in its own process: vs_plain)
#   source .gpu/unpack.sh && bash benchmarks/families_h200.sh guided  # Dia 1.6B, MusicGen-small with their CFG:
#     speechctl beside transformers' generate with guidance, and the CFG efficiency (speechctl/bench/guided.py)
#   source .gpu/unpack.sh && bash benchmarks/families_h200.sh tests-guided  # the Dia / MusicGen parity suites on CUDA
#     (TESTS=tests/test_dia.py: one of them; both take ~10 minutes with their engine starts;
#      TESTS_K="a or b": pytest's -k)
# Writes $OUT/families-<family>.json (frames/s at concurrency $CONC for both systems); copy them
# to docs/benchmarks/ with the command line and record the table in docs/benchmarks/families.md.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
# each test's outcome and each failure's traceback as it happens (tests/conftest.py): a run that
# a call's time limit kills still says what failed and why
export SPEECHCTL_TEST_LOG=${SPEECHCTL_TEST_LOG:-$OUT/tests-progress.log}
export SPEECHCTL_CACHE=${SPEECHCTL_CACHE:-/tmp/speechctl-cache}
source "$(dirname "$0")/plugin_entry_point.sh"
source "$(dirname "$0")/gpu_machine.sh"  # vLLM's MoE kernels and compile caches, where calls carried them
case "${1:-bench}" in
  tests)
    python3 -m pytest -q -p no:cacheprovider -rA tests/test_higgs_audio_v2.py tests/test_csm.py 2>&1 | tee "$OUT/pytest-families.log" | tail -40
    ;;
  bench)
    for family in ${FAMILIES:-higgs_audio_v2 csm}; do
      python3 -m speechctl.bench.families --family "$family" --size full --concurrency "${CONC:-1,64}" \
        --frames "${FRAMES:-256}" --repeats "${REPEATS:-3}" --out "$OUT/families-$family${SUFFIX:-}.json" \
        $([ "${TRANSFORMERS:-1}" = 0 ] && echo --no-transformers) $([ "${CODEC:-0}" = 1 ] && echo --codec) \
        $([ "${GENERIC:-0}" = 1 ] && echo --generic) $([ "${PLAIN:-0}" = 1 ] && echo --plain) \
        2>&1 | tee "$OUT/bench-$family.log" | grep -E "^\{'(system|vs_|end_to_end)|Error|Traceback" 
    done
    ;;
  guided)
    for family in ${FAMILIES:-dia musicgen}; do
      python3 -m speechctl.bench.guided --family "$family" --size full --concurrency "${CONC:-1,16,64}" \
        --frames "${FRAMES:-256}" --repeats "${REPEATS:-3}" --out "$OUT/guided-$family${SUFFIX:-}.json" \
        $([ "${TRANSFORMERS:-1}" = 0 ] && echo --no-transformers) \
        2>&1 | tee "$OUT/bench-$family.log" | grep -E "^\{'system'|Error|Traceback"
    done
    ;;
  tests-guided)
    # shellcheck disable=SC2086
    # TESTS_K: a -k expression (spaces and all; TESTS itself is split on spaces)
    python3 -m pytest -q -p no:cacheprovider -rA ${TESTS:-tests/test_dia.py tests/test_musicgen.py} ${TESTS_K:+-k "$TESTS_K"} \
      2>&1 | tee "$OUT/pytest-guided.log" | tail -40
    ;;
esac
