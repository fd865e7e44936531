#!/usr/bin/env bash
# The load watch and the graded answers on a GPU after a change to either: the watch's own
# tests (libdevice kernels among them), every honest answer graded for full marks, and
# every set graded with its wrong answers (gpu_verify.sh's grading step).
#     bash benchmarks/gpu_recheck.sh [LOG_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${1:-artifacts/gpu}
mkdir -p "$logs"
bash benchmarks/gpu_verify.sh grading "$logs"
status=$?
extra=${COURSE_EXTRA_SITE:-/tmp/course-extra}
export PATH="$extra/bin:$PATH" JUPYTER_PATH="$extra/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
export PYTHONPATH="$PWD:$extra${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
python3 -m pytest -p no:cacheprovider -q tests/test_kernel_loads.py >"$logs/kernel_loads.txt" 2>&1
s1=$?
python3 -m pytest -p no:cacheprovider -q -n 6 --dist load tests/test_honest_answers.py \
    >"$logs/honest_answers.txt" 2>&1
s2=$?
echo "kernel_loads rc=$s1: $(tail -1 "$logs/kernel_loads.txt")" | tee -a "$logs/summary.txt"
echo "honest_answers rc=$s2: $(tail -1 "$logs/honest_answers.txt")" | tee -a "$logs/summary.txt"
[ $status -eq 0 ] && [ $s1 -eq 0 ] && [ $s2 -eq 0 ]
