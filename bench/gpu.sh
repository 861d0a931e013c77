#!/usr/bin/env bash
# Everything towers checks and times on a GPU, as one call on a machine with
# an NVIDIA GPU and no Rust toolchain (the device machine): the binaries are
# built elsewhere with bench/gpu-build.sh and carried in gpu/.
#
#   1. every CUDA twin against its CPU body (kernels/tests/cuda_twins);
#   2. the CUDA backend against the CPU backend, CUDA graphs against eager
#      steps bit for bit, and step times (runtime/tests/cuda_backend.rs);
#   3. NCCL on the GPU (runtime/tests/nccl.rs, world size 1);
#   4. `towers train --backend cuda`: the main job, and mnist5k convnet
#      training with graphs on and off, one device and two towers;
#   5. the PyTorch and JAX anchors on the same GPU (bench/gpu_anchors.py).
# Logs go to $OUT (or /tmp/towers-gpu); the tail of each part is printed.
set -u
OUTD="${OUT:-/tmp/towers-gpu}"
mkdir -p "$OUTD"
B="${TOWERS_GPU_BIN:-gpu}"
export TOWERS_CUBIN_CACHE=/tmp/towers-cubin
# Every GPU test fails instead of skipping when the GPU, the driver or NVRTC
# cannot be used (kernels/src/require_gpu.rs): this run cannot pass silently.
export TOWERS_REQUIRE_GPU=1

# cudarc opens libcuda.so.1, libnvrtc.so.13, libcublas.so.13 and libnccl.so
# by bare name: put the folders holding them (the driver's, the Python
# wheels') on LD_LIBRARY_PATH, with libnccl.so linked to the wheel's .so.2.
dirs=""
for f in $(find /usr/local/nvidia /usr/lib/x86_64-linux-gnu /opt /usr/local/lib /usr/lib/python3 \
    \( -name 'libcuda.so.1' -o -name 'libnvrtc.so.13' -o -name 'libcublas.so.13' -o -name 'libnccl.so.2' \) 2>/dev/null); do
  d=$(dirname "$f")
  case ":$dirs:" in *":$d:"*) ;; *) dirs="$dirs:$d" ;; esac
done
mkdir -p /tmp/nccl-link
nccl=$(find /opt /usr -name 'libnccl.so.2' 2>/dev/null | head -1)
[ -n "$nccl" ] && ln -sf "$nccl" /tmp/nccl-link/libnccl.so
export LD_LIBRARY_PATH="/tmp/nccl-link${dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv 2>&1 | tee "$OUTD/gpu.txt"
nproc

part() { echo; echo "===== $1 ($(date +%T))"; }

part "1. CUDA twins"
timeout 240 "$B/cuda_twins" --nocapture >"$OUTD/twins.log" 2>&1
grep -E "device 0|FAIL|test result|panicked|worst|checks" "$OUTD/twins.log" | tail -20

part "2. CUDA backend"
timeout 300 "$B/cuda_backend" --nocapture --test-threads 1 >"$OUTD/backend.log" 2>&1
grep -E "^test |test result|panicked|MAX REL|STEP TIME|PROFILE|TRACE|graph run|eager run|max rel diff" "$OUTD/backend.log" \
  | sed -e 's/ (feed + run + loss fetch)//' | cut -c1-330

part "3. NCCL"
TOWERS_REQUIRE_NCCL=1 timeout 60 "$B/nccl" --nocapture >"$OUTD/nccl.log" 2>&1
grep -E "^test |test result|panicked|all-reduce|NCCL" "$OUTD/nccl.log" | tail -12

part "4. towers train --backend cuda"
{
  timeout 60 "$B/towers" train --backend cuda
  for g in "" "--no-cuda-graphs"; do
    for t in "" "--towers 2"; do
      echo "--- mnist5k convnet adam 15 epochs $t $g"
      timeout 90 "$B/towers" train --backend cuda --data mnist5k --model convnet --optimizer adam --epochs 15 $t $g
    done
  done
} >"$OUTD/train.log" 2>&1
grep -vE "^step [0-9]+ loss" "$OUTD/train.log" | tail -60

part "4b. a traced convnet step on the GPU (towers train --trace)"
timeout 60 "$B/towers" train --backend cuda --data mnist5k --model convnet --batch 256 --steps 30 \
  --trace "$OUTD/trace-convnet.json" --trace-steps 3 >"$OUTD/trace.log" 2>&1
tail -2 "$OUTD/trace.log"
python3 - "$OUTD/trace-convnet.json" <<'PY' | tee "$OUTD/trace-summary.txt"
import collections, json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
by = collections.Counter()
for e in ev:
    if e.get("ph") == "X":
        by[e.get("cat", e.get("name"))] += e.get("dur", 0) / 3
print("per traced step (us):", ", ".join(f"{k} {v:.1f}" for k, v in by.most_common(12)))
PY

part "5. PyTorch and JAX on this GPU"
PYTHONUNBUFFERED=1 timeout 300 python3 bench/gpu_anchors.py >"$OUTD/anchors.log" 2>&1
grep -E "^ANCHOR|^torch |^jax |Error|error" "$OUTD/anchors.log" | tail -20
part "done"
