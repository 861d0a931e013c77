#!/usr/bin/env bash
# Training across MPI processes against one process (benches/processes.rs),
# with the host check the anchors use.
#
#   bench/mpi.sh
#   TOWERS_BENCH_QUICK=1 bench/mpi.sh
#
# Needs Open MPI (apt-get install libopenmpi-dev openmpi-bin libclang-dev).
# Compare with PyTorch DDP over gloo, 2 ranks on this machine
# (../shared/bench/anchors/RESULTS.md, mode towers2, impl ddp-gloo-2proc).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/probe.sh
before=$(probe)
check "$before" before || true
cargo bench --features mpi --bench processes
after=$(probe)
check "$after" after || { echo "shared core detected after the run" >&2; exit 2; }
