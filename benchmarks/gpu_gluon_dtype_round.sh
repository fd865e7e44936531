#!/usr/bin/env bash
# Lesson 8's Gluon backward in float16 against bfloat16: the backward alone at D = 128,
# both dtypes point by point beside cuDNN's (benchmarks/gluon_bwd_probe.py --variants 2),
# then one launch of each under Nsight Compute (benchmarks/gpu_profile.py, workloads
# gluon_bwd_d128 and gluon_bwd_d128_bf16): the report, the hottest instructions and the
# raw metrics (instruction mix, clock) as CSV, in one device run.
#   bash benchmarks/gpu_gluon_dtype_round.sh OUTDIR [TIMING_SECONDS] [PROFILE_SECONDS]
set -u
out=${1:?OUTDIR}; secs=${2:-200}; psecs=${3:-240}
mkdir -p "$out"
timeout "$secs" python3 benchmarks/gluon_bwd_probe.py --variants 2 --d 128 --dtype fp16,bf16 \
    --settle 300 --out "$out/gluon_bwd_dtype.json" > "$out/gluon_bwd_dtype.log" 2>&1
echo "timing rc=$?"; grep '^{' "$out/gluon_bwd_dtype.log"
timeout "$psecs" ncu --profile-from-start off --clock-control none -k regex:_attn_bwd_gluon \
    --section SpeedOfLight --section LaunchStats --section WarpStateStats \
    --section InstructionStats --section SourceCounters \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,regex:sm__pipe_tensor.*pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second,smsp__inst_executed.sum,sass__inst_executed_per_opcode" \
    -o "$out/bwd_dtype" -f python3 benchmarks/gpu_profile.py \
    --only gluon_bwd_d128,gluon_bwd_d128_bf16 > "$out/ncu.log" 2>&1
echo "ncu rc=$?"; tail -n 3 "$out/ncu.log"
python3 benchmarks/gpu_profile.py --report "$out/bwd_dtype.ncu-rep" | tee "$out/bwd_dtype_report.txt"
python3 benchmarks/gpu_profile.py --source "$out/bwd_dtype.ncu-rep" > "$out/bwd_dtype_source.txt" 2>&1
ncu -i "$out/bwd_dtype.ncu-rep" --page raw --csv > "$out/bwd_dtype_raw.csv" 2>&1
ncu -i "$out/bwd_dtype.ncu-rep" --page details --csv --print-details all \
    > "$out/bwd_dtype_details.csv" 2>&1
ls -la "$out"
