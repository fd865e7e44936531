#!/usr/bin/env bash
# Every correctness check that needs a CUDA GPU, in one go, from the repository root:
#
#     bash benchmarks/gpu_verify.sh [LOG_DIR]
#
# 1. the environment report (python -m course_utils doctor);
# 2. the Triton attention kernels of lessons 6-7 at real sizes, one fixed config, then
#    the large cases again through the autotuner;
# 3. the GPU-marked pytest tests (lessons 6-9);
# 4. the decoding (lesson 9) and Hopper (lesson 8) checks at real sizes.
# Each step's log goes to LOG_DIR (default: artifacts/gpu); the summary is printed last
# and the exit status is non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${1:-artifacts/gpu}
mkdir -p "$logs"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
summary=()
step() {
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$logs/$name.log" 2>&1
    local rc=$?
    summary+=("$(printf '%-22s %-6s %4ss  %s' "$name" "$([ $rc = 0 ] && echo ok || echo FAIL:$rc)" $((SECONDS - t0)) "$*")")
    tail -n 4 "$logs/$name.log"
}
step doctor python3 -m course_utils doctor
step attention env COURSE_TRITON_AUTOTUNE=0 python3 benchmarks/gpu_check_attention.py
step attention_tuned env COURSE_TRITON_AUTOTUNE=1 python3 benchmarks/gpu_check_attention.py --quick
step pytest_gpu python3 -m pytest -q -p no:cacheprovider -m "gpu or hopper" \
    tests/test_triton_attention.py tests/test_decoding.py tests/test_hopper_kernels.py
step decode python3 benchmarks/check_decode_gpu.py
step hopper python3 benchmarks/check_hopper_gpu.py
echo
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -q FAIL
