#!/usr/bin/env bash
# vLLM's MoE kernel library for the H200 bundle, which leaves it out (../shared/gpu/make-bundle.sh
# trims it; without it Higgs' DualFFN computes both MLPs, vllm_compat.grouped_mlp_available).
#   bash benchmarks/gpu_moe.sh make      here: .gpu/moe.xz (~40 MB) from make-bundle.sh's cached wheel
#   bash benchmarks/gpu_moe.sh install   there, after `source .gpu/unpack.sh`: from .gpu/moe.xz or
#                                        /root/stage/moe.xz (carried by an earlier call) into /opt/site
# It travels alone (a call carries 64 MiB: it fits beside neither site part), so staging takes
# three calls; the first two can run work that needs no vLLM (the voice recipe's training).
set -euo pipefail
NAME=vllm/_moe_C_stable_libtorch.abi3.so
case "${1:?usage: gpu_moe.sh make|install}" in
  make)
    CACHE=${SPEECHCTL_GPU_CACHE:-$HOME/.cache/speechctl-gpu}
    WHEEL=$(ls "$CACHE"/wheels/vllm-0.26.0-*.whl 2>/dev/null | head -1)
    [ -n "$WHEEL" ] || { echo "no vLLM 0.26.0 wheel in $CACHE/wheels: run ../shared/gpu/make-bundle.sh first" >&2; exit 2; }
    mkdir -p .gpu
    python3 -c "import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))" "$WHEEL" "$NAME" \
      | xz -9 -T0 > .gpu/moe.xz.tmp && mv .gpu/moe.xz.tmp .gpu/moe.xz
    ls -la .gpu/moe.xz ;;
  install)
    [ -d /opt/site/vllm ] || { echo "vLLM is not unpacked: source .gpu/unpack.sh first" >&2; exit 2; }
    [ ! -f "/opt/site/$NAME" ] || exit 0
    for f in .gpu/moe.xz /root/stage/moe.xz; do
      if [ -f "$f" ]; then xz -dc "$f" > "/opt/site/$NAME.tmp" && mv "/opt/site/$NAME.tmp" "/opt/site/$NAME"; echo "installed $NAME"; exit 0; fi
    done
    echo "no moe.xz carried: vLLM's MoE kernels stay out" >&2 ;;
esac
