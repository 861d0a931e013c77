#!/usr/bin/env bash
# Training across MPI processes against one process (benches/processes.rs),
# with the host check the anchors use.
#
#   bench/mpi.sh
#   TOWERS_BENCH_QUICK=1 bench/mpi.sh
#   TOWERS_BENCH_PS_ONLY=1 TOWERS_BIN=target/debug/towers bench/mpi.sh   (the ps rows alone, a built binary)
#
# Needs Open MPI (apt-get install libopenmpi-dev openmpi-bin libclang-dev).
# Compare with PyTorch DDP over gloo, 2 ranks on this machine
# (../shared/bench/anchors/RESULTS.md, mode towers2, impl ddp-gloo-2proc).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/probe.sh
if [ -z "${TOWERS_BENCH_PS_ONLY:-}" ]; then
  before=$(probe)
  check "$before" before || true
  cargo bench --features mpi --bench processes
  after=$(probe)
  check "$after" after || { echo "shared core detected after the run" >&2; exit 2; }
fi

# Parameter servers (--variables ps, ZeRO-1) against the all-reduce, 2 ranks,
# on the seed models: the step time (from examples/s), the bytes crossing
# processes per step per rank (the gradient payload this rank sends, and the
# sums it receives: every all-reduced bucket, and under ps only the buckets
# reduced to it, its own variables' gradients; then the owners' value
# broadcasts sent and received; the collective's own traffic on top of the
# payload depends on MPI's algorithm) and the optimizer-state bytes each
# rank holds (Adam: two slots per variable).
# Rank 0's figures; ps-greedy balances the owners by bytes (round-robin puts
# every weight matrix of the seed models on task 0). ps-ranks: 3 processes,
# 2 workers and a parameter-server rank that runs no towers (--ps-ranks 1,
# the variables and every slot on rank 2): rank 0 is a worker, it sends
# every gradient, receives only the loss's sum and every value, and holds
# no slot.
bin="${TOWERS_BIN:-target/release/towers}"
[ -n "${TOWERS_BIN:-}" ] || cargo build --release --features mpi --bin towers
steps="${TOWERS_BENCH_PS_STEPS:-200}"
[ -n "${TOWERS_BENCH_QUICK:-}" ] && steps=20
batch=64
printf '%-8s %-10s %12s %14s %14s %14s %14s %14s\n' model mode step_ms grad_B/step sums_B/step sent_B/step recv_B/step slots_B/rank
for model in mlp convnet; do
  for mode in all-reduce ps ps-greedy ps-ranks; do
    vars=(--variables cpu)
    np=2
    [ "$mode" = ps ] && vars=(--variables ps)
    [ "$mode" = ps-greedy ] && vars=(--variables ps --ps-strategy greedy)
    [ "$mode" = ps-ranks ] && { vars=(--variables ps --ps-ranks 1); np=3; }
    err=$(mktemp)
    out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np "$np" --oversubscribe \
      "$bin" train --model "$model" --towers 1 --batch "$batch" --optimizer adam \
      --steps "$steps" --log-every "$steps" "${vars[@]}" 2>"$err")
    eps=$(cat "$err" - <<<"$out" | sed -n 's/^[0-9]* steps, \([0-9.]*\) examples\/s.*$/\1/p' | head -1)
    line=$(grep '^exchange: rank 0 ' "$err" || true)
    rm -f "$err"
    nums=($(grep -o '[0-9][0-9]*' <<<"$line"))
    # exchange: rank R sends G B ... (all-reduces A B in N bucket(s), reduces D B ... in M bucket(s))
    #   and receives H B of sums, broadcasts S B ... receives V B; ... holds O B
    step_ms=$(awk -v e="$eps" -v b="$batch" 'BEGIN { if (e > 0) printf "%.3f", 1000 * b / e; else print "n/a" }')
    printf '%-8s %-10s %12s %14s %14s %14s %14s %14s\n' "$model" "$mode" "$step_ms" "${nums[1]:-?}" "${nums[6]:-?}" "${nums[7]:-?}" "${nums[8]:-?}" "${nums[9]:-?}"
  done
done
