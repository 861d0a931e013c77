#!/usr/bin/env bash
# bench/gpu_build.sh [DIR]: builds here (a Rust toolchain; no GPU needed) the
# test binaries that bench/gpu_check.sh runs on a lent GPU machine, which has
# no Rust toolchain and no network, and copies them, stripped, into DIR
# (default target/gpu-check, under the ignored target/) with a manifest.
# Fails if DIR is over 64 MiB, the most the device tool's `carry` takes
# (together with the working tree).
#
# The binaries (found by `cargo test --no-run --message-format=json`, each
# test target's "executable"):
#   cuda_twins    kernels/tests/cuda_twins   every CUDA twin through the
#                 backend's lowering against its CPU body, and the recorded
#                 argument lists (snapshots, read from the checkout there)
#   cuda_backend  runtime/tests/cuda_backend the CUDA backend against the CPU
#                 backend (seed models, 1 and 2 towers, every other kernel),
#                 CUDA graphs against eager steps, in-place feeds, a traced
#                 step, and the step-time benchmark (STEP TIME lines)
#   cuda_mixed    runtime/tests/cuda_mixed   the CUDA backend as a mixed
#                 session's part beside a pinned host part (issue 21): exact
#                 against the CPU backend (1/2/4 towers x variables cpu,
#                 gpu0, round-robin), and the placements' step times
#                 (MIXED STEP lines)
#   cubin_cache   runtime/tests/cubin_cache  the on-disk cubin cache, real NVRTC
#   cuda_probe    runtime/tests/cuda_probe   issue 21's measurements (PROBE
#                 lines): host/GPU crossings by mechanism, memops in a CUDA
#                 graph, 2 and 4 contexts on GPU 0 (peer copies, event
#                 waits, foreign pointers, capture)
#   nccl          runtime/tests/nccl         only with GPU_BUILD_NCCL=1
#                 (--features nccl: rebuilds the runtime and its dependents)
#
# Environment:
#   GPU_BUILD_PROFILE=release  build with --release (default: the test
#                 profile, which already optimizes the kernels, the runtime
#                 and every dependency at opt-level 3; the workspace's other
#                 crates, host-side planning only, at 1)
#   GPU_BUILD_NCCL=1           also the NCCL test
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest="${1:-target/gpu-check}"
limit=$((64 * 1024 * 1024))
profile=()
[ "${GPU_BUILD_PROFILE:-}" = release ] && profile=(--release)

# `cargo test --no-run --message-format=json` prints one JSON object a line;
# a test binary is a "compiler-artifact" whose target kind is "test" and
# which names its "executable". Prints "name path" per binary.
executables() {
  cargo test "${profile[@]}" --no-run --message-format=json "$@" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])
'
}

list=$(mktemp)
trap 'rm -f "$list"' EXIT
executables -p towers-kernels --test cuda_twins >>"$list"
executables -p towers-runtime --test cuda_backend --test cuda_mixed --test cubin_cache --test cuda_probe >>"$list"
if [ "${GPU_BUILD_NCCL:-0}" = 1 ]; then
  executables -p towers-runtime --features nccl --test nccl >>"$list"
fi
# The cost model's GPU table (a bench: `cargo bench` has its own profile).
cargo bench --bench cost_gpu --no-run --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])
' >>"$list"

rm -rf "$dest"
mkdir -p "$dest"
want="cuda_twins cuda_backend cuda_mixed cubin_cache cuda_probe cost_gpu"
[ "${GPU_BUILD_NCCL:-0}" = 1 ] && want="$want nccl"
for name in $want; do
  path=$(awk -v n="$name" '$1 == n { p = $2 } END { print p }' "$list")
  if [ -z "$path" ] || [ ! -x "$path" ]; then
    echo "gpu_build: cargo named no executable for the test target $name" >&2
    exit 1
  fi
  cp "$path" "$dest/$name"
  strip "$dest/$name"
done

total=$(du -cb "$dest"/* | tail -1 | cut -f1)
{
  echo "built $(date -u +%FT%TZ) from $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "profile ${GPU_BUILD_PROFILE:-test}; $(rustc --version)"
  for f in "$dest"/*; do
    [ "$(basename "$f")" = manifest.txt ] && continue
    printf '%-14s %10d bytes  sha256 %s\n' "$(basename "$f")" "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -c1-16)"
  done
  echo "total $total bytes"
} >"$dest/manifest.txt"
cat "$dest/manifest.txt"
if [ "$total" -gt "$limit" ]; then
  echo "gpu_build: $dest holds $total bytes, over the 64 MiB ($limit) a carry takes" >&2
  exit 1
fi
echo "gpu_build: $dest ready ($((total / 1024 / 1024)) MiB of 64); carry it and run: bash bench/gpu_check.sh $dest"
