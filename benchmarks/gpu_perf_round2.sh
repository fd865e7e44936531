#!/usr/bin/env bash
# Second GPU round: the Gluon kernel (one kernel for the plain and the ping-pong
# schedule) checked at every stage count, at real size and past 2**31 elements; the
# Gluon rows of the Hopper benchmark; the compiler's resource report of the lesson-6
# forward; Nsight Compute on the lesson-6 forward (causal and not) and cuDNN.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
COURSE_TRITON_AUTOTUNE=0 timeout 200 python3 -m pytest -p no:cacheprovider -q -rs \
    tests/test_kernel_hardening.py tests/test_hopper_kernels.py \
    -k "gluon or hopper_forwards or real_size" 2>&1 | tee "$OUT/gluon_tests.log"
timeout 150 python3 -m course_utils.bench hopper --n 8192 16384 --dtype fp16 \
    --providers sdpa_cudnn sdpa_flash gluon_ws_serial gluon_ws_pipe gluon_pingpong \
    gluon_pingpong_s3 2>&1 | grep -v "^ " | tee "$OUT/gluon_bench.log"
timeout 60 python3 benchmarks/kernel_resources.py 2>&1 | tee "$OUT/resources.log"
timeout 200 ncu --profile-from-start off --clock-control none --section SpeedOfLight \
    --section LaunchStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,regex:sm__pipe_tensor.*pct_of_peak_sustained_active" \
    -o "$OUT/prof" -f python3 benchmarks/gpu_profile.py > "$OUT/ncu.log" 2>&1
python3 benchmarks/gpu_profile.py --report "$OUT/prof.ncu-rep" 2>&1 | tee "$OUT/profile.txt"
rm -f "$OUT/prof.csv"
