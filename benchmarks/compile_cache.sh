#!/usr/bin/env bash
# The compile caches of a device call, brought back and carried into the next one. On the H200 an
# engine start compiles for ~50-65 s when the caches are cold (tiny Llama 72 s cold vs 23 s warm,
# CSM 94 vs 29, sixteenth session's lifecycle test), and every machine starts bare, so most of a
# CUDA test call is compilation.
#   bash benchmarks/compile_cache.sh save DEST [PARTS]   there, at a call's end: vLLM's compile cache
#       (its inductor and Triton artifacts live under it), inductor's and Triton's own, as
#       DEST/compile-cache.tar.xz.partNN of < 16 MiB, at most PARTS of them (default 4; a call
#       brings back 8 files): larger, nothing is kept and the size is said
#   bash benchmarks/compile_cache.sh load SRC            there, before the stages: SRC's parts (carried
#       from a folder here) unpacked where they came from
# A stale cache costs nothing: vLLM keys its artifacts by a hash of the model's config, code and
# path (the tests' checkpoints live under h200.sh's fixed --basetemp for that), inductor and Triton
# by their kernels' source. COMPILE_CACHE_DIRS (space-separated absolute paths) overrides what is
# saved (tests).
set -euo pipefail
DIRS=${COMPILE_CACHE_DIRS:-"${VLLM_CACHE_ROOT:-$HOME/.cache/vllm}/torch_compile_cache /tmp/torchinductor_$(id -un) $HOME/.triton/cache"}
PART_BYTES=$((15 * 1024 * 1024))
case "${1:?usage: compile_cache.sh save DEST [PARTS] | load SRC}" in
  save)
    DEST=${2:?save DEST [PARTS]}
    PARTS=${3:-4}
    present=()
    for d in $DIRS; do [ -d "$d" ] && present+=("${d#/}"); done
    [ ${#present[@]} -gt 0 ] || { echo "compile cache: nothing to save"; exit 0; }
    du -sh "${present[@]/#//}" || true
    mkdir -p "$DEST"
    tmp=$(mktemp -d)
    tar -cf - -C / "${present[@]}" | xz -6 -T0 | split -b "$PART_BYTES" -d - "$tmp/compile-cache.tar.xz.part"
    n=$(ls "$tmp" | wc -l)
    size=$(du -cb "$tmp"/* | tail -1 | cut -f1)
    if [ "$n" -gt "$PARTS" ]; then
      echo "compile cache: $((size / 1048576)) MiB packed, $n parts > $PARTS: not kept"
    else
      mv "$tmp"/* "$DEST/"
      echo "compile cache: $((size / 1048576)) MiB packed in $n part(s) in $DEST"
    fi
    rm -rf "$tmp"
    ;;
  load)
    SRC=${2:?load SRC}
    if ls "$SRC"/compile-cache.tar.xz.part* > /dev/null 2>&1; then
      cat "$SRC"/compile-cache.tar.xz.part* | xz -dc | tar -xf - -C /
      echo "compile cache: loaded from $SRC"
    else
      echo "compile cache: none carried in $SRC"
    fi
    ;;
  *) echo "usage: compile_cache.sh save DEST [PARTS] | load SRC" >&2; exit 2 ;;
esac
