# The FMA probe and shared-core check of the benchmarks (sourced by
# bench/run.sh and bench/mpi.sh from the repository root): a 0.1 s FMA probe
# on 1 and 2 threads (../shared/bench/anchors/peak/fma_peak.c) at the vector
# width the kernels run: `fma512` for AVX-512, `fma256` for AVX2 (also when
# TOWERS_SIMD=avx2 forces it on an AVX-512 CPU). A CPU with neither (ARM,
# old x86) has no probe, and the scripts say so. `check` flags a run in which
# 2 threads got less than 1.5x one thread (the host ran both vCPUs on one
# physical core: 2-way figures are meaningless).
SRC=../shared/bench/anchors/peak/fma_peak.c
PROBE=target/fma_peak
mkdir -p target
# The probe's kernels carry their own target attributes: build it for the
# baseline so that it runs (and says "unsupported") on any x86-64 CPU.
if [ -f "$SRC" ] && command -v gcc >/dev/null && [ "$(uname -m)" = x86_64 ]; then
  [ -x "$PROBE" ] && [ "$PROBE" -nt "$SRC" ] && [ "$PROBE" -nt bench/probe.sh ] \
    || gcc -O2 -pthread "$SRC" -o "$PROBE"
else
  echo "warning: no FMA probe here (needs $SRC, gcc and an x86-64 CPU): no shared-core check" >&2
  PROBE=""
fi

# The cross-core probe (bench/probes/xcore.c): how fast one core reads what
# the other just wrote. A two-tower step moves its gradients and weights
# across cores every step; on a 2-vCPU VM this rate changes about 3x from one
# minute to the next with where the host runs the vCPUs, and the two-tower
# speed-up with it (docs/performance.md), which the FMA probe cannot see.
XCORE=target/xcore
if command -v gcc >/dev/null && [ "$(uname -s)" = Linux ]; then
  [ -x "$XCORE" ] && [ "$XCORE" -nt bench/probes/xcore.c ] \
    || gcc -O2 -pthread bench/probes/xcore.c -o "$XCORE"
else
  XCORE=""
fi

# Prints "xcore cross=G GB/s local=G GB/s", or "xcore none".
xcore() {
  if [ -z "$XCORE" ]; then echo "xcore none (needs gcc on Linux)"; return; fi
  "$XCORE" 1024 300
}

# The width to probe: the one the kernels run (TOWERS_SIMD, else the widest).
probe_width() {
  case "${TOWERS_SIMD:-}" in
    avx512) echo 512 ;;
    avx2) echo 256 ;;
    scalar|neon) echo none ;;
    *) if [ -z "$PROBE" ]; then echo none
       elif "$PROBE" 1 0.01 quick | grep -q "fma512.*gflops"; then echo 512
       else echo 256; fi ;;
  esac
}

# Prints "WIDTH ONE TWO": GFLOP/s on 1 and 2 threads ("none 0 0" without a probe).
probe() {
  local w
  w=$(probe_width)
  if [ -z "$PROBE" ] || [ "$w" = none ]; then echo "none 0 0"; return; fi
  local out one two
  out=$("$PROBE" 2 0.1)
  one=$(awk -F'gflops=' -v w="fma$w" '$1 ~ w && /threads=1/{print $2}' <<<"$out")
  two=$(awk -F'gflops=' -v w="fma$w" '$1 ~ w && /threads=2/{print $2}' <<<"$out")
  if [ -z "$one" ]; then echo "none 0 0"; return; fi
  echo "fma$w $one $two"
}

check() {
  local w one two
  read -r w one two <<<"$1"
  if [ "$w" = none ]; then
    echo "FMA probe ($2): none for this CPU or SIMD path (${TOWERS_SIMD:-widest}): no shared-core check" >&2
    return 0
  fi
  if awk -v a="$one" -v b="$two" 'BEGIN{exit !(b < 1.5*a)}'; then
    echo "WARNING ($2): $w: 2 threads gave ${two} GFLOP/s vs ${one} on 1: the vCPUs share a core; discard 2-tower figures" >&2
    return 1
  fi
  echo "FMA probe ($2): $w: 1 thread ${one} GFLOP/s, 2 threads ${two} GFLOP/s" >&2
}
