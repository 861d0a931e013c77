#!/usr/bin/env bash
# The towers training-step benchmarks with the host check the anchors use.
#
#   bench/run.sh              # full: 300 MLP steps, 40 conv steps per configuration
#   TOWERS_BENCH_QUICK=1 bench/run.sh
#   TOWERS_BENCH_PROFILE=1 bench/run.sh   # also print per-kernel time per step
#
# The host sometimes runs both vCPUs on one physical core; a 2-tower result is
# then meaningless. Like ../shared/bench/anchors, this runs a 0.1 s AVX-512 FMA
# probe on 1 and 2 threads before and after the benchmark and flags a run in
# which 2 threads got less than 1.5x one thread. Compare the figures with the
# anchors measured on the same machine (../shared/bench/anchors/run.sh; its
# report lists single-1t / single / towers2 step times of the same models).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/probe.sh

before=$(probe)
check "$before" before || true
cargo bench --bench step
after=$(probe)
check "$after" after || { echo "shared core detected after the run" >&2; exit 2; }
