#!/usr/bin/env bash
# The voice recipe on the GPU machine, one stage per device call (README.md beside this file
# gives the calls, what each carries and what comes back):
#
#   recipes/voice/gpu.sh data|codec|lm|codes|export|codec-speed [resume]
#   recipes/voice/gpu.sh codec+lm [resume]
#
# codec+lm trains both at once on the one GPU, as two processes: the codec resumed with its codes
# frozen (codec_train.freeze_codes=true: its decoder trains on, its codes stay) and the LM on
# those codes, a new run or, with `resume`, resumed. Their packs (gzip'd, 3 + 2 parts and a hash
# each) fit in one call's 8 files.
#
# Runs from the repository root (it cds there) with PYTHONPATH=$PWD; what must come back goes to
# $OUT (at most 8 files of < 16 MiB). Settings by environment:
#   MINUTES     wall-clock budget of the stage from this script's start, setup included (default 9;
#               a call may run 10; the stage keeps 45 s of it for saving and packing: 9.5 fits)
#   VOICE_WORK  where data and checkpoints live on the machine (default /root/voice)
#   VOICE_SCALE full (default) or tiny
#   VOICE_SET   space-separated overrides, e.g. "lm.num_layers=6 lm_train.lr=0.001"
#   VOICE_BATCHES  codec-speed: the batch sizes to time (default 32,64,128,256)
#   VOICE_LM_SET  codec+lm: overrides for the LM alone, e.g. "data.hours=200" (a new LM reads that
#               many hours of the codec's voice)
#   VOICE_CARRIED  where the carried packs are (default .voice)
#   VOICE_MAX_STEPS  training steps at most (tests)
#   PYTHON      the interpreter (default python3: the one that holds torch there)
#   ESPEAK_DIR  the carried espeak-ng bundle (default .gpu/espeak: make it with
#               ../shared/gpu/espeak/make-espeak-bundle.sh)
set -euo pipefail
# The stage's clock starts here, not when Python does (a fresh machine takes a minute or more to
# import torch): the device call's time limit counts from its command's start.
export VOICE_STARTED=${VOICE_STARTED:-$(date +%s.%N)}
STAGE=${1:?usage: recipes/voice/gpu.sh data|codec|lm|codes|export|codec-speed|codec+lm [resume]}
MODE=${2:-}
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")  # codec+lm runs it twice more, from the root
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-${VOICE_WORK:-/root/voice}/out}
mkdir -p "$OUT"

# espeak-ng: Debian 12's packages unpacked once per machine, with the no-audio libpcaudio stand-in
if [ "$STAGE" != export ] && ! command -v espeak-ng >/dev/null; then
  ESPEAK_DIR=${ESPEAK_DIR:-.gpu/espeak}
  L=/opt/espeak/usr/lib/x86_64-linux-gnu
  if [ ! -x /opt/espeak/usr/bin/espeak-ng ]; then
    ls "$ESPEAK_DIR"/*.deb >/dev/null 2>&1 || { echo "no espeak-ng bundle in $ESPEAK_DIR: carry it (README.md)" >&2; exit 2; }
    mkdir -p /opt/espeak
    for f in "$ESPEAK_DIR"/*.deb; do dpkg -x "$f" /opt/espeak; done
    cp "$ESPEAK_DIR/libpcaudio.so.0" "$L/"
  fi
  export LD_LIBRARY_PATH=$L${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export ESPEAK_NG=/opt/espeak/usr/bin/espeak-ng ESPEAK_NG_DATA=$L
fi

if [ "$STAGE" = codec+lm ]; then
  # The LM's data and codes are made on the CPU and GPU while the codec trains; each stage keeps
  # to MINUTES and saves before it, and either failing fails the call (after both have ended).
  VOICE_SET="${VOICE_SET:-} codec_train.freeze_codes=true" bash "$SELF" codec resume & codec=$!
  VOICE_SET="${VOICE_SET:-} ${VOICE_LM_SET:-}" bash "$SELF" lm "$MODE" & lm=$!
  status=0
  wait $codec || status=$?
  wait $lm || status=$?
  exit $status
fi

ARGS=(--work "${VOICE_WORK:-/root/voice}" --out "$OUT" --carried "${VOICE_CARRIED:-.voice}" --minutes "${MINUTES:-9}"
      --scale "${VOICE_SCALE:-full}")
for s in ${VOICE_SET:-}; do ARGS+=(--set "$s"); done
if [ "$MODE" = resume ]; then ARGS+=(--resume); fi
if [ -n "${VOICE_BATCHES:-}" ]; then ARGS+=(--batches "$VOICE_BATCHES"); fi
if [ -n "${VOICE_MAX_STEPS:-}" ]; then ARGS+=(--max-steps "$VOICE_MAX_STEPS"); fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
exec "${PYTHON:-python3}" -m recipes.voice stage "$STAGE" "${ARGS[@]}"
