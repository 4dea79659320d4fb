# Sourced by the GPU scripts (h200.sh, families_h200.sh) after vLLM is unpacked: what earlier
# calls of the session carried, put in place once per machine.
# vLLM's MoE kernels (benchmarks/gpu_moe.sh), where a call carried them: without them Higgs'
# DualFFN computes both MLPs
bash "$(dirname "${BASH_SOURCE[0]}")/gpu_moe.sh" install || true
# compile caches an earlier call brought back (benchmarks/compile_cache.sh): an engine start then
# reads its compiled code instead of compiling it (nineteenth session: the per-step work's compile
# 14.2 s -> 0.8 s)
if [ -d .gpu/compile-cache ] && [ ! -f /tmp/compile-cache.loaded ]; then
  bash "$(dirname "${BASH_SOURCE[0]}")/compile_cache.sh" load .gpu/compile-cache && touch /tmp/compile-cache.loaded
fi
