#!/usr/bin/env bash
# bench/gpu_cost.sh [DIR]: the cost model's table on a lent GPU (issue 21
# items 5 and 8): the prebuilt bench binary DIR/cost_gpu (default
# target/gpu-check; built here by `cargo bench --bench cost_gpu --no-run`,
# copied and stripped by bench/gpu_build.sh) run once, no Rust toolchain
# needed. For the seed models at batch 256 and 1024, 1/2/4 towers,
# variables cpu / gpu0 / round-robin on --backend cuda: the predicted step,
# the step with every GPU stream serialized, the measured step (a context
# per GPU, graphs on) and with one context, and their ratio (COST GPU lines).
#
# Exit: the binary's (0 done; 1 a failure, TOWERS_REQUIRE_GPU=1 without a
# GPU included; 2 no GPU and TOWERS_REQUIRE_GPU unset; 124 timed out).
#   GPU_COST_SECONDS  time limit (default 240)
#   GPU_COST_FULL=1   time 10 traced / 30 measured steps a row (default:
#                     TOWERS_BENCH_QUICK=1, 5 / 10)
# Output: $OUT (else /tmp/towers-gpu-check)/cost_gpu.log and cost_gpu.jsonl.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin="${1:-target/gpu-check}"
outd="${OUT:-/tmp/towers-gpu-check}"
mkdir -p "$outd"
if [ ! -x "$bin/cost_gpu" ]; then
  echo "gpu_cost: $bin/cost_gpu is missing: build it here with bash bench/gpu_build.sh, then carry $bin" >&2
  exit 1
fi
# The libraries cudarc opens by bare name, as bench/gpu_check.sh finds them
# (a no-op when it already did).
for f in $(find /usr/local/nvidia /usr/lib/x86_64-linux-gnu /usr/local/cuda* /opt /usr/local/lib /usr/lib/python3* \
  \( -name 'libcuda.so.1' -o -name 'libnvrtc.so.13' -o -name 'libcublas.so.13' \) 2>/dev/null); do
  d=$(dirname "$f")
  case ":${LD_LIBRARY_PATH:-}:" in *":$d:"*) ;; *) LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;; esac
done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
export TOWERS_REQUIRE_GPU="${TOWERS_REQUIRE_GPU:-1}"
export TOWERS_CUBIN_CACHE="${TOWERS_CUBIN_CACHE:-/tmp/towers-cubin}"
export TOWERS_BENCH_OUT="$outd/cost_gpu.jsonl"
[ "${GPU_COST_FULL:-0}" = 1 ] || export TOWERS_BENCH_QUICK=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "===== cost_gpu ($(date -u +%T), at most ${GPU_COST_SECONDS:-240}s) on ${gpu:-no GPU}"
timeout "${GPU_COST_SECONDS:-240}" "$bin/cost_gpu" >"$outd/cost_gpu.log" 2>&1
rc=$?
grep -E "^\| |^machine:|^device:|predictions within|cost_gpu:|panicked" "$outd/cost_gpu.log" | cut -c1-400 | sed "s/^/COST GPU [${gpu:-no GPU}] /"
case $rc in
  0) echo "cost_gpu: PASSED (exit 0) on ${gpu:-no GPU}" ;;
  2) echo "cost_gpu: NO GPU (exit 2): nothing measured" ;;
  124) echo "cost_gpu: TIMED OUT after ${GPU_COST_SECONDS:-240}s (the rows above are the ones done)" ;;
  *) echo "cost_gpu: FAILED (exit $rc), see $outd/cost_gpu.log" ;;
esac
exit "$rc"
