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
SRC=../shared/bench/anchors/peak/fma_peak.c
PROBE=target/fma_peak
mkdir -p target
if [ -f "$SRC" ] && command -v gcc >/dev/null; then
  [ -x "$PROBE" ] && [ "$PROBE" -nt "$SRC" ] || gcc -O2 -mavx512f -mfma -pthread "$SRC" -o "$PROBE"
else
  echo "warning: $SRC or gcc missing: no shared-core check" >&2
  PROBE=""
fi

probe() {
  [ -n "$PROBE" ] || { echo "0 0"; return; }
  local one two
  one=$("$PROBE" 1 0.1 quick | awk -F'gflops=' '/threads=1/{print $2}')
  two=$("$PROBE" 2 0.1 quick | awk -F'gflops=' '/threads=2/{print $2}')
  echo "$one $two"
}

check() {
  read -r one two <<<"$1"
  if [ -n "$PROBE" ] && awk -v a="$one" -v b="$two" 'BEGIN{exit !(b < 1.5*a)}'; then
    echo "WARNING ($2): 2 threads gave ${two} GFLOP/s vs ${one} on 1: the vCPUs share a core; discard 2-tower figures" >&2
    return 1
  fi
  echo "FMA probe ($2): 1 thread ${one} GFLOP/s, 2 threads ${two} GFLOP/s" >&2
}

before=$(probe)
check "$before" before || true
cargo bench --bench step
after=$(probe)
check "$after" after || { echo "shared core detected after the run" >&2; exit 2; }
