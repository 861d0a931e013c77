#!/usr/bin/env bash
# Builds what bench/gpu.sh runs on a GPU machine without a Rust toolchain:
# the CUDA test binaries and `towers` (feature nccl), release, stripped,
# into gpu/ (ignored by git; carry it to the GPU machine).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p gpu
bin() { # the executable a `cargo test --no-run` names
  sed -n 's/.*Executable .*(\(target\/[^)]*\)).*/\1/p' | grep "/$1-" | tail -1
}
log=$(cargo test --release -p towers-kernels --test cuda_twins --no-run 2>&1)
cp "$(echo "$log" | bin cuda_twins)" gpu/cuda_twins
log=$(cargo test --release -p towers-runtime --features nccl --test cuda_backend --test nccl --no-run 2>&1)
cp "$(echo "$log" | bin cuda_backend)" gpu/cuda_backend
cp "$(echo "$log" | bin nccl)" gpu/nccl
cargo build --release --features nccl --bin towers
cp target/release/towers gpu/towers
strip gpu/*
ls -la gpu
