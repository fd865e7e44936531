#!/usr/bin/env bash
# The course's whole pytest suite (tests/, less the browser tests) on a GPU, as a learner
# with a GPU runs it, each outcome logged as it comes (benchmarks/pytest_progress_log.py)
# so a run cut by its time limit still reports; beside it, lesson 7 and its solution under
# nbval. Logs go to OUTDIR. TESTS (default: tests) narrows the run to some files;
# NBVAL=0 leaves the notebooks out; EXTRA_PKGS names more packages to take from the
# wheelhouse (such as "numpy<2.4", which Triton 3.6's interpreter needs).
#   bash benchmarks/gpu_suite_round.sh OUTDIR WHEELHOUSE [SECONDS] [WORKERS] [PYTEST ARGS...]
set -u
out=${1:?OUTDIR}; wh=${2:?WHEELHOUSE}; secs=${3:-540}; workers=${4:-14}
shift 4 2>/dev/null || shift $#
mkdir -p "$out"
source "$(dirname "$0")/gpu_test_env.sh"
gpu_test_env "$wh" "$out" ${EXTRA_PKGS:-} || exit 1
export OMP_NUM_THREADS=1
PROGRESS_LOG="$out/progress.txt" timeout "$secs" python3 -m pytest ${TESTS:-tests} -q -p no:cacheprovider \
    -p benchmarks.pytest_progress_log --ignore=tests/browser -n "$workers" --dist loadgroup \
    --timeout 400 "$@" > "$out/suite.txt" 2>&1 &
[ "${NBVAL:-1}" = 0 ] || timeout "$secs" python3 -m pytest -q -p no:cacheprovider -n 2 \
    --dist loadfile --nbval-lax --nbval-cell-timeout 300 notebooks/07_triton_backward.ipynb \
    solutions/07_triton_backward.ipynb > "$out/nbval_07.txt" 2>&1 &
wait
for f in suite nbval_07; do [ -f "$out/$f.txt" ] && echo "$f: $(grep -E 'passed|failed' "$out/$f.txt" | tail -1)"; done >> "$out/summary.txt"
touch "$out/progress.txt"
echo "progress: $(grep -c '^PASSED' "$out/progress.txt") passed, $(grep -c '^FAILED' "$out/progress.txt") failed, $(grep -c '^SKIPPED' "$out/progress.txt") skipped" >> "$out/summary.txt"
grep '^FAILED' "$out/progress.txt" | head -40 >> "$out/summary.txt"
cat "$out/summary.txt"
