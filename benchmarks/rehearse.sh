#!/usr/bin/env bash
# The device calls' Python paths, rehearsed here on the CPU before a session spends GPU minutes on
# them: every queued H200 command of docs/gpu.md at its real shapes (random weights, as there) but
# at one request and a few frames, with transformers' side left out. Speed means nothing here;
# what it finds is a command that would stop at its first line on the GPU (the seventeenth
# session's throughput call ended at "no weights" after the machine had been staged for it).
#
#   bash benchmarks/rehearse.sh [ITEM...]     items: throughput cfg families guided workload stream-real asr arnar
#                                             (default: all; ~20 minutes on two cores, ~10 GB of memory)
# One line per item: ok / FAILED with the seconds and the log's path ($REHEARSE_OUT, default
# /tmp/speechctl-rehearsal). Exit status: the number of items that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
R=${REHEARSE_OUT:-/tmp/speechctl-rehearsal}
mkdir -p "$R"
export SPEECHCTL_CACHE=${SPEECHCTL_CACHE:-$R/cache}
SMALL=(--concurrency 1 --frames 4 --repeats 1)
failed=0

run() {  # run NAME COMMAND...: the command's output in $R/NAME.log
  local name=$1 started=$SECONDS; shift
  if timeout "${REHEARSE_TIMEOUT:-1500}" "$@" > "$R/$name.log" 2>&1; then
    echo "ok      $name ($((SECONDS - started)) s)"
  else
    echo "FAILED  $name ($((SECONDS - started)) s): $(grep -E "Error|error:" "$R/$name.log" | tail -1) — $R/$name.log"
    failed=$((failed + 1))
  fi
}

for item in ${@:-throughput cfg families guided workload stream-real asr arnar}; do
  case "$item" in
    throughput)  # h200.sh throughput: the higgs-3b shape beside plain vLLM
      run throughput "$PY" -m speechctl.cli bench --shape higgs-3b "${SMALL[@]}" --no-eager --codec-requests 0 --plain-runs 1 \
        --out "$R/throughput.json" ;;
    cfg)
      run cfg "$PY" -m speechctl.cli bench --cfg --shape higgs-3b "${SMALL[@]}" --out "$R/cfg.json" ;;
    families)  # families_h200.sh bench (CODEC=1: the family's codec at its published shape too)
      for family in higgs_audio_v2 csm; do
        run "families-$family" "$PY" -m speechctl.bench.families --family "$family" --size full "${SMALL[@]}" \
          --no-transformers --codec --out "$R/families-$family.json"
      done ;;
    guided)  # families_h200.sh guided
      for family in dia musicgen; do
        run "guided-$family" "$PY" -m speechctl.bench.guided --family "$family" --size full "${SMALL[@]}" \
          --no-transformers --out "$R/guided-$family.json"
      done ;;
    workload)  # h200.sh workload: the real Higgs 3B checkpoint (random weights, its codec)
      run workload-checkpoint "$PY" benchmarks/family_checkpoint.py higgs_audio_v2 "$R/higgs-3b"
      run workload "$PY" -m speechctl.cli bench --workload --model "$R/higgs-3b" --random-weights --requests 3 --rates 0.5 \
        --out "$R/workload.json" ;;
    stream-real)  # h200.sh stream-real: Higgs 3B with its tokenizer, CSM 1B with Mimi
      for family in higgs_audio_v2 csm; do
        run "stream-checkpoint-$family" "$PY" benchmarks/family_checkpoint.py $family "$R/$family-full"
        run "stream-real-$family" "$PY" -m speechctl.cli bench --stream --no-turn --model "$R/$family-full" --random-weights \
          "${SMALL[@]}" --out "$R/stream-$family.json"
      done ;;
    asr)  # docs/asr.md's H200 speed table: speechctl beside transformers and CTranslate2, greedy and beam 5
      run asr "$PY" benchmarks/asr_speed.py --model whisper-tiny.en --batch 1,2 --files 2 --modes greedy,beam5 \
        --systems speechctl,transformers,ctranslate2 --dtype auto --max-tokens 32 --out "$R/asr-speed.json" ;;
    arnar)  # arnar_h200.sh bench
      run arnar "$PY" -m speechctl.cli bench --arnar --shape llama-1b "${SMALL[@]}" --out "$R/arnar.json" ;;
    *) echo "unknown item $item (throughput cfg families guided workload stream-real asr arnar)" >&2; exit 2 ;;
  esac
done
exit $failed
