#!/usr/bin/env bash
# Lesson 8's Gluon backward in float16 against bfloat16: the backward alone, both dtypes
# point by point beside cuDNN's (benchmarks/gluon_bwd_probe.py --variants 2, with
# BASELINES, other versions of course_utils/hopper/gluon_bwd.py, timed in the same run),
# then one launch of each dtype at D = 128 under Nsight Compute (benchmarks/gpu_profile.py,
# workloads gluon_bwd_d128 and gluon_bwd_d128_bf16): the report and the hottest
# instructions with the instruction mix; given a wheelhouse, tests/test_gluon_backward.py.
#   bash benchmarks/gpu_gluon_dtype_round.sh OUTDIR [HEAD_DIMS] [BASELINES] [WHEELHOUSE]
set -u
out=${1:?OUTDIR}; dims=${2:-128}; base=${3:-}; wh=${4:-}
mkdir -p "$out"
timeout 300 python3 benchmarks/gluon_bwd_probe.py --variants 2 --d "$dims" --dtype fp16,bf16 \
    --settle 300 ${base:+--baseline "$base"} --out "$out/gluon_bwd_dtype.json" \
    > "$out/gluon_bwd_dtype.log" 2>&1
echo "timing rc=$?"; grep '^{' "$out/gluon_bwd_dtype.log"; grep -v '^{' "$out/gluon_bwd_dtype.log" | tail -3
timeout 200 ncu --profile-from-start off --clock-control none -k regex:_attn_bwd_gluon \
    --section SpeedOfLight --section LaunchStats --section WarpStateStats \
    --section SourceCounters \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,regex:sm__pipe_tensor.*pct_of_peak_sustained_active" \
    -o "$out/bwd_dtype" -f python3 benchmarks/gpu_profile.py \
    --only gluon_bwd_d128,gluon_bwd_d128_bf16 > "$out/ncu.log" 2>&1
echo "ncu rc=$?"
python3 benchmarks/gpu_profile.py --report "$out/bwd_dtype.ncu-rep" > "$out/bwd_dtype_report.txt"
python3 benchmarks/gpu_profile.py --source "$out/bwd_dtype.ncu-rep" > "$out/bwd_dtype_source.txt" 2>&1
rm -f "$out/bwd_dtype.ncu-rep" "$out/bwd_dtype.source.csv"
cat "$out/bwd_dtype_report.txt"; grep -A12 'instructions executed' "$out/bwd_dtype_source.txt"
if [ -n "$wh" ] && [ -d "$wh" ]; then
    source "$(dirname "$0")/gpu_test_env.sh"
    gpu_test_env "$wh" "$out" && timeout 240 python3 -m pytest -q -p no:cacheprovider \
        tests/test_gluon_backward.py > "$out/test_gluon_backward.txt" 2>&1
    tail -n 3 "$out/test_gluon_backward.txt"
fi
