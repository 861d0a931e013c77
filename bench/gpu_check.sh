#!/usr/bin/env bash
# bench/gpu_check.sh [--preflight | --skip-preflight] [DIR]
#
# The GPU checks of towers, as one short call on a lent GPU machine (no Rust
# toolchain, no network): run from the repository root (the checkout the
# device tool copies), with DIR (default target/gpu-check) built here by
# bench/gpu_build.sh and carried. Every GPU test runs with
# TOWERS_REQUIRE_GPU=1, so none can pass by skipping.
#
#   1. preflight: the binaries and their manifest, the driver, the GPU, the
#      CUDA libraries; without a usable GPU it stops here, at once, exit 2;
#   2. probe (issue 21 items 1 and 2, at most 60 s): runtime/tests/cuda_probe,
#      its PROBE lines: the host/GPU crossings' round trips by mechanism
#      (cuStreamWaitValue32/WriteValue32, cuLaunchHostFunc, events; median
#      and p90 us), whether stream memory operations can be captured, and
#      with 2 and 4 contexts on GPU 0: peer copies (bytes, GB/s), cross-
#      context event waits, a kernel reading another context's pointer (in
#      a child process), capture per context and across contexts;
#   3. cuda_twins: every CUDA twin through the backend's lowering against
#      its CPU body, and the recorded argument lists (insta snapshots, read
#      from this checkout: INSTA_WORKSPACE_ROOT);
#   4. cuda_backend: the CUDA backend against the CPU backend (seed models,
#      1 and 2 towers; every other kernel), CUDA graphs against eager steps
#      bit for bit, in-place feeds, a traced step, and the CUDA step
#      benchmark (its STEP TIME lines);
#   5. cuda_mixed (issue 21): the CUDA backend as a mixed session's part
#      beside a pinned host part, exact against the CPU backend (seed models,
#      1/2/4 towers, variables cpu / gpu0 / round-robin, graphs on), pageable
#      host memory refused, and the placements' step times at batch 256 and
#      1024 (MIXED STEP lines: host or GPU 0 variables, in numbers);
#   6. cubin_cache: the on-disk cubin cache with the real NVRTC;
#   7. nccl (if built: GPU_BUILD_NCCL=1): a bucket through ncclAllReduce;
#   8. cost_gpu: the cost model's table on --backend cuda, predicted beside
#      measured (bench/gpu_cost.sh, COST GPU lines; at most 150 s);
#   9. anchors (if python3 imports torch): bench/gpu_anchors.py torch, the
#      seed models at batch 256 and 1024 in PyTorch, eager and CUDA graph
#      (ANCHOR lines, ANCHOR_STEPS=50), with what time is left.
#
# Every figure is printed with the GPU's name. Logs and summary.txt go to
# $OUT (the device tool brings back at most 8 files: this writes 8 at most), else
# /tmp/towers-gpu-check. Exit 0 only when every part passed.
#
#   --preflight       run the preflight alone and exit (0: ready)
#   --skip-preflight  run the binaries even without a GPU: each must then
#                     fail, naming TOWERS_REQUIRE_GPU (issue 20 item 9)
#   GPU_CHECK_SECONDS total time for the parts (default 540: a run tool call
#                     with timeout_s 600 ends with time to spare)
#   GPU_CHECK_PARTS   the parts to run, e.g. "cuda_mixed anchors" (default:
#                     all); the others are said NOT SELECTED, not failed
set -u
mode=all
case "${1:-}" in
  --preflight) mode=preflight; shift ;;
  --skip-preflight) mode=force; shift ;;
  -h | --help) sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//; /^set -u/d'; exit 0 ;;
esac
bin="${1:-target/gpu-check}"
outd="${OUT:-/tmp/towers-gpu-check}"
mkdir -p "$outd"
summary="$outd/summary.txt"
: >"$summary"
deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-540}))

export TOWERS_REQUIRE_GPU=1
export TOWERS_CUBIN_CACHE=/tmp/towers-cubin
export INSTA_WORKSPACE_ROOT="$PWD" INSTA_UPDATE=no
unset CI

say() { echo "$*" | tee -a "$summary"; }
fail_pre() {
  say "PREFLIGHT FAILED: $*"
  say "nothing was run on a GPU; see bench/gpu_check.sh and docs/cuda.md"
  exit 2
}

# cudarc opens libcuda.so.1, libnvrtc.so.13, libcublas.so.13 (and
# libnccl.so) by bare name: put the folders holding them (the driver's, the
# Python wheels') on LD_LIBRARY_PATH, with libnccl.so linked to the .so.2.
dirs=""
for f in $(find /usr/local/nvidia /usr/lib/x86_64-linux-gnu /usr/local/cuda* /opt /usr/local/lib /usr/lib/python3* \
  \( -name 'libcuda.so.1' -o -name 'libnvrtc.so.13' -o -name 'libcublas.so.13' -o -name 'libnccl.so.2' \) 2>/dev/null); do
  d=$(dirname "$f")
  case ":$dirs:" in *":$d:"*) ;; *) dirs="$dirs:$d" ;; esac
done
mkdir -p /tmp/nccl-link
nccl=$(find /opt /usr -name 'libnccl.so.2' 2>/dev/null | head -1)
[ -n "$nccl" ] && ln -sf "$nccl" /tmp/nccl-link/libnccl.so
export LD_LIBRARY_PATH="/tmp/nccl-link${dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---------------------------------------------------------------- preflight
say "gpu_check $(date -u +%FT%TZ) in $PWD, binaries from $bin"
[ -f "$bin/manifest.txt" ] || fail_pre "no $bin/manifest.txt: build the binaries here first with bash bench/gpu_build.sh, then carry $bin"
sed 's/^/  /' "$bin/manifest.txt" | tee -a "$summary"
for b in cuda_probe cuda_twins cuda_backend cuda_mixed cubin_cache cost_gpu; do
  [ -x "$bin/$b" ] || fail_pre "$bin/$b is missing or not executable (rebuild with bench/gpu_build.sh)"
done
[ -d kernels/tests/cuda_twins/snapshots ] || fail_pre "no kernels/tests/cuda_twins/snapshots here: run from the repository root"
gpu=""
if [ "$mode" != force ]; then
  command -v nvidia-smi >/dev/null || fail_pre "no nvidia-smi: this machine has no NVIDIA driver, so no GPU to check (TOWERS_REQUIRE_GPU=1 would fail every test)"
  q=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1) \
    || fail_pre "nvidia-smi finds no usable GPU: $q"
  gpu=$(echo "$q" | head -1 | cut -d, -f1)
  say "GPU: $q"
  for lib in libcuda.so.1 libnvrtc.so.13 libcublas.so.13; do
    found=""
    for d in ${LD_LIBRARY_PATH//:/ }; do
      if [ -e "$d/$lib" ]; then found="$d/$lib"; break; fi
    done
    if [ -z "$found" ] && ldconfig -p 2>/dev/null | grep -q "$lib"; then found="(ldconfig)"; fi
    [ -n "$found" ] || fail_pre "$lib not found (looked in the driver's folder, /usr/local/cuda*, /opt and the Python wheels)"
    say "  $lib: $found"
  done
fi
[ -z "$gpu" ] && gpu="no GPU"
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
[ "$mode" = preflight ] && { say "preflight passed"; exit 0; }

# ---------------------------------------------------------------- the parts
status=0
# selected NAME: whether GPU_CHECK_PARTS (default: every part) names it.
selected() {
  [ -z "${GPU_CHECK_PARTS:-}" ] && return 0
  case " $GPU_CHECK_PARTS " in *" $1 "*) return 0 ;; esac
  return 1
}
# part NAME[=BINARY] CAP_SECONDS PATTERN ARGS...: run $bin/BINARY (default
# NAME) ARGS with a timeout (CAP, or what is left of the total), log it to
# NAME.log, print the lines matching PATTERN prefixed with the GPU's name,
# and its verdict.
part() {
  local name=${1%%=*} exe=${1#*=} cap=$2 pattern=$3
  shift 3
  if ! selected "$name"; then
    say "$name: NOT SELECTED (GPU_CHECK_PARTS=$GPU_CHECK_PARTS)"
    return
  fi
  local left=$((deadline - SECONDS - 5))
  [ "$left" -lt "$cap" ] && cap=$left
  echo
  echo "===== $name ($(date -u +%T), at most ${cap}s)"
  if [ "$cap" -lt 10 ]; then
    say "$name: NOT RUN (the time for the parts, GPU_CHECK_SECONDS, is spent)"
    status=1
    return
  fi
  local t0=$SECONDS rc
  timeout "$cap" "$bin/$exe" "$@" >"$outd/$name.log" 2>&1
  rc=$?
  grep -E "$pattern" "$outd/$name.log" | cut -c1-400 | sed "s/^/[$gpu] /" | tee -a "$summary"
  local result
  result=$(grep -E "^test result" "$outd/$name.log" | tail -1)
  if [ "$rc" -eq 0 ]; then
    say "$name: PASSED in $((SECONDS - t0))s on $gpu: $result"
  else
    [ "$rc" -eq 124 ] && result="timed out after ${cap}s"
    say "$name: FAILED (exit $rc) in $((SECONDS - t0))s on $gpu: ${result:-see $name.log}"
    grep -E "panicked|^Error: |TOWERS_REQUIRE_GPU is set|FAILED|snapshot assertion" "$outd/$name.log" | head -8 | sed 's/^/    /' | tee -a "$summary"
    status=1
  fi
}

# The probe's binary is cuda_probe; its part is named probe (GPU_CHECK_PARTS).
part probe=cuda_probe 60 "^test |^PROBE " --nocapture --test-threads 1
part cuda_twins 130 "^device 0|kernels checked on the GPU|lowerings of|FAILED$" --nocapture --test-threads 1
part cuda_backend 230 "^test |STEP TIME|MAX REL|max rel|graph run|eager run|CUDA backend on" --nocapture --test-threads 1
part cuda_mixed 150 "^test |MIXED STEP|^CTX|max rel diff" --nocapture --test-threads 1
part cubin_cache 30 "^test |cubin" --nocapture
if [ -x "$bin/nccl" ]; then
  TOWERS_REQUIRE_NCCL=1 part nccl 40 "^test |all-reduce|NCCL" --nocapture --test-threads 1
fi
# The cost model's table (issue 21 items 5 and 8): predicted beside
# measured on --backend cuda (bench/gpu_cost.sh; COST GPU lines).
if selected cost_gpu; then
  left=$((deadline - SECONDS - 60))
  [ "$left" -gt 150 ] && left=150
  if [ "$left" -ge 30 ]; then
    # Its log and JSON stay on the machine (at most 8 files come back); the
    # COST GPU lines go into the summary.
    OUT=/tmp/towers-gpu-cost GPU_COST_SECONDS=$left bash bench/gpu_cost.sh "$bin" | sed "s/^/[$gpu] /" | tee -a "$summary"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  else
    say "cost_gpu: NOT RUN (${left}s left; run it alone: GPU_CHECK_PARTS=cost_gpu)"
  fi
else
  say "cost_gpu: NOT SELECTED (GPU_CHECK_PARTS=$GPU_CHECK_PARTS)"
fi
# The PyTorch anchors (not a check: figures beside the MIXED STEP lines),
# with what time is left; a missing torch is said, not failed.
left=$((deadline - SECONDS - 5))
if ! selected anchors; then
  say "anchors: NOT SELECTED (GPU_CHECK_PARTS=$GPU_CHECK_PARTS)"
elif [ "$left" -ge 20 ] && python3 -c 'import torch' >/dev/null 2>&1; then
  echo
  echo "===== anchors ($(date -u +%T), at most ${left}s)"
  ANCHOR_STEPS=50 timeout "$left" python3 bench/gpu_anchors.py torch >"$outd/anchors.log" 2>&1
  say "anchors: exit $? (bench/gpu_anchors.py torch, 50 steps after 20)"
  grep -E "^ANCHOR|^torch " "$outd/anchors.log" | cut -c1-300 | sed "s/^/[$gpu] /" | tee -a "$summary"
else
  say "anchors: NOT RUN (no torch for python3, or ${left}s left)"
fi

echo
if [ "$status" -eq 0 ]; then say "gpu_check: every part PASSED on $gpu"; else say "gpu_check: FAILED on $gpu (logs in $outd)"; fi
exit "$status"
