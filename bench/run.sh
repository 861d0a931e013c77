#!/usr/bin/env bash
# The towers training-step benchmarks with the host check the anchors use.
#
#   bench/run.sh              # full: 300 MLP steps, 40 conv steps per configuration
#   TOWERS_BENCH_QUICK=1 bench/run.sh
#   TOWERS_BENCH_PROFILE=1 bench/run.sh   # also print per-kernel time per step
#
#   TOWERS_SIMD=avx2 TOWERS_BENCH_CARGO_FLAGS=--no-default-features bench/run.sh
#                             # what an AVX2-only CPU runs, on an AVX-512 one
#
# The host sometimes runs both vCPUs on one physical core; a 2-tower result is
# then meaningless. Like ../shared/bench/anchors, this runs a 0.1 s FMA probe (at the
# width of the SIMD path the kernels run) on 1 and 2 threads before and after the benchmark and flags a run in
# which 2 threads got less than 1.5x one thread. It also prints the
# cross-core probe (bench/probes/xcore.c) before and after: the two-tower
# speed-ups follow how fast one core reads what the other wrote, which the
# host's placement of the vCPUs changes (docs/performance.md, "two-tower
# modes"). Compare the figures with the
# anchors measured on the same machine (../shared/bench/anchors/run.sh; its
# report lists single-1t / single / towers2 step times of the same models).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/probe.sh

before=$(probe)
check "$before" before || true
echo "cross-core probe (before): $(xcore)"
read -r _ peak1 _ <<<"$before"
# The SIMD path (TOWERS_SIMD=avx2 forces AVX2 on an AVX-512 CPU; add
# --no-default-features to run the GEMM's AVX2 kernels too, as on such a CPU).
TOWERS_BENCH_PEAK_1T="$peak1" cargo bench --bench step ${TOWERS_BENCH_CARGO_FLAGS:-}
after=$(probe)
echo "cross-core probe (after): $(xcore)"
check "$after" after || { echo "shared core detected after the run" >&2; exit 2; }
