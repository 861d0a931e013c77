#!/usr/bin/env bash
# The accuracy sweep (a script, not a timed test): each documented recipe,
# trained for seeds 0-4 under every SIMD path this CPU has plus scalar, with
# fusion on and off (--no-fusion); prints min / median / max test accuracy
# per recipe, path and fusion as a markdown table (also written to
# target/accuracy.md).
#
#   bench/accuracy.sh                      # every recipe, path and seed
#   ACC_SEEDS="0 1" ACC_PATHS="avx2" ACC_RECIPES="digits-convnet" bench/accuracy.sh
#   ACC_EXTRA="--lr-schedule cosine" bench/accuracy.sh   # try other flags on every recipe
#   ACC_NO_BUILD=1 bench/accuracy.sh       # with the binaries already built
#   # NEON rows on an x86 machine: the aarch64 binary under qemu-user
#   ACC_NO_BUILD=1 ACC_PATHS="neon scalar" ACC_BIN=target/aarch64-unknown-linux-gnu/release/towers \
#     ACC_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu" bench/accuracy.sh
#
# The paths below AVX-512 run a binary built with --no-default-features, so
# that the GEMM runs its AVX2 micro-kernels as it does on an AVX2-only CPU
# (kernels/src/simd.rs); "scalar" forces towers' own kernels to one lane (the
# GEMM keeps its AVX2 kernels: it has no switch below that).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

declare -A RECIPE=(
  [digits-mlp]="train"
  [digits-convnet]="train --model convnet"
  [mnist5k-convnet]="train --data mnist5k --model convnet"
)
RECIPES=${ACC_RECIPES:-"digits-mlp digits-convnet mnist5k-convnet"}
SEEDS=${ACC_SEEDS:-"0 1 2 3 4"}

# The paths this CPU has, widest first, and scalar.
flags=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null || true)
detected=""
[[ " $flags " == *" avx512f "* ]] && detected+="avx512 "
[[ " $flags " == *" avx2 "* && " $flags " == *" fma "* ]] && detected+="avx2 "
[[ " $flags " == *" asimd "* ]] && detected+="neon "
detected+="scalar"
PATHS=${ACC_PATHS:-$detected}

if [ -z "${ACC_NO_BUILD:-}" ]; then # ACC_NO_BUILD=1: use the binaries built before
  cargo build --release --quiet
  cargo build --release --quiet --no-default-features --target-dir target/no-avx512-gemm
fi
bin_for() {
  if [ -n "${ACC_BIN:-}" ]; then echo "$ACC_BIN"; return; fi
  [ "$1" = avx512 ] && echo target/release/towers || echo target/no-avx512-gemm/release/towers
}

stats() { # min median max of the numbers on stdin
  sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.4f | %.4f | %.4f", a[1], m, a[NR]}'
}

out=target/accuracy.md
mkdir -p target
{
  echo "| recipe | SIMD path | fusion | seeds | min | median | max |"
  echo "|---|---|---|---|---|---|---|"
} | tee "$out"
for r in $RECIPES; do
  for p in $PATHS; do
    for fusion in on off; do
      extra=""; [ "$fusion" = off ] && extra="--no-fusion"
      accs=()
      for s in $SEEDS; do
        # shellcheck disable=SC2086 # ACC_RUNNER and the recipe split into words
        a=$(TOWERS_SIMD=$p ${ACC_RUNNER:-} "$(bin_for "$p")" ${RECIPE[$r]} --seed "$s" $extra ${ACC_EXTRA:-} 2>/dev/null \
              | awk '/^test accuracy:/{print $3}')
        accs+=("${a:-nan}")
      done
      row="| $r | $p | $fusion | ${SEEDS// /,} | $(printf '%s\n' "${accs[@]}" | stats) |"
      echo "$row" | tee -a "$out"
    done
  done
done
