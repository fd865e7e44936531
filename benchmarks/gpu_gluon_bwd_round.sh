#!/usr/bin/env bash
# Lesson 8's Gluon backward after a change: its gradients against float64 autograd
# (benchmarks/gluon_bwd_probe.py --check-only), then the backward alone timed beside
# other versions of course_utils/hopper/gluon_bwd.py (BASELINES, comma-separated files)
# and cuDNN's, point by point in one run; given a wheelhouse, tests/test_gluon_backward.py.
#   bash benchmarks/gpu_gluon_bwd_round.sh OUTDIR [DTYPES] [HEAD_DIMS] [BASELINES] [WHEELHOUSE] [SETTLE_MS]
set -u
out=${1:?OUTDIR}; dtypes=${2:-fp16}; dims=${3:-64,128}; base=${4:-}; wh=${5:-}; settle=${6:-300}
mkdir -p "$out"
timeout 240 python3 benchmarks/gluon_bwd_probe.py --check-only --out "$out/gluon_bwd_check.json" \
    > "$out/gluon_bwd_check.log" 2>&1
echo "check rc=$?"; tail -n 2 "$out/gluon_bwd_check.log"
timeout 330 python3 benchmarks/gluon_bwd_probe.py --variants 2 --dtype "$dtypes" --d "$dims" \
    --settle "$settle" ${base:+--baseline "$base"} --out "$out/gluon_bwd_variants.json" \
    > "$out/gluon_bwd_variants.log" 2>&1
echo "timing rc=$?"; grep '^{' "$out/gluon_bwd_variants.log"
grep -v '^{' "$out/gluon_bwd_variants.log" | tail -3
if [ -n "$wh" ] && [ -d "$wh" ]; then
    source "$(dirname "$0")/gpu_test_env.sh"
    gpu_test_env "$wh" "$out" && timeout 200 python3 -m pytest -q -p no:cacheprovider -x \
        -n 4 tests/test_gluon_backward.py > "$out/test_gluon_backward.txt" 2>&1
    tail -n 3 "$out/test_gluon_backward.txt"
fi
