# The FMA probe and shared-core check of the benchmarks (sourced by
# bench/run.sh and bench/mpi.sh from the repository root): a 0.1 s AVX-512
# FMA probe on 1 and 2 threads (../shared/bench/anchors/peak/fma_peak.c);
# `check` flags a run in which 2 threads got less than 1.5x one thread (the
# host ran both vCPUs on one physical core: 2-way figures are meaningless).
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

