#!/usr/bin/env bash
# Lesson 7's kernels on the GPU after a change to them, as three chains at once (nothing
# here times anything, so they share the GPU): the kernel test files whole (GPU-marked
# tests included: tensors past 2**31 elements, the descriptor shapes), the real-size check
# with the autotuner on, and lesson 7 with its solution under nbval. Logs go to OUTDIR.
#   bash benchmarks/gpu_bwd_verify.sh OUTDIR WHEELHOUSE [SECONDS]
set -u
out=${1:?OUTDIR}; wh=${2:?WHEELHOUSE}; secs=${3:-540}
mkdir -p "$out"
source "$(dirname "$0")/gpu_test_env.sh"
gpu_test_env "$wh" "$out" || exit 1
chain() {
    local name=$1; shift
    local t0=$SECONDS
    timeout "$secs" "$@" > "$out/$name.txt" 2>&1
    local rc=$?
    printf '%-16s rc=%-3s %4ss  %s\n' "$name" "$rc" $((SECONDS - t0)) \
        "$(grep -E 'passed|failed|error|of [0-9]+ ' "$out/$name.txt" | tail -1)" >> "$out/summary.txt"
}
chain kernel_tests python3 -m pytest -q -p no:cacheprovider -n 6 tests/test_triton_attention.py \
    tests/test_kernel_hardening.py tests/test_triton_backward_designs.py &
chain check_tuned env COURSE_TRITON_AUTOTUNE=1 python3 benchmarks/gpu_check_attention.py --quick &
chain nbval_07 python3 -m pytest -q -p no:cacheprovider -n 2 --nbval-lax \
    --dist loadfile --nbval-cell-timeout 300 notebooks/07_triton_backward.ipynb solutions/07_triton_backward.ipynb &
wait
cat "$out/summary.txt"
