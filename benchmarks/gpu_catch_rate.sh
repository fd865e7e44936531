#!/usr/bin/env bash
# How often the checks catch each wrong answer on a GPU, where Triton's kernels are compiled
# and float32 dot products run in TF32: tests/wrong_answers/catch_rate.py for the sets named,
# side by side, each with DRAWS fresh draws (official and honest answers must pass them all).
#     bash benchmarks/gpu_catch_rate.sh LOG_DIR DRAWS SET...      (e.g. ... 5 06 07 08)
# Packages the GPU machine lacks come from ./.wheelhouse, as in gpu_verify.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=$1 draws=$2
shift 2
mkdir -p "$logs"
extra=${COURSE_EXTRA_SITE:-/tmp/course-extra}
if ! python3 -c "import nbformat" 2>/dev/null; then
    python3 -m pip install -q --no-index --find-links .wheelhouse --target "$extra" nbformat \
        >"$logs/install_catch_rate.log" 2>&1 || { echo "install failed"; exit 1; }
fi
export PYTHONPATH="$PWD:$extra${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
for s in "$@"; do
    timeout "${CATCH_TIMEOUT:-400}" python3 -m tests.wrong_answers.catch_rate "$s" --draws "$draws" >"$logs/catch_rate_$s.txt" 2>&1 &
done
wait
status=0
for s in "$@"; do
    f="$logs/catch_rate_$s.txt"
    bad=$(grep -c " BAD " "$f")
    echo "catch_rate $s ($draws draws): $(grep -c " ok " "$f") ok, $bad not always right; $(tail -n 1 "$f")" \
        | tee -a "$logs/summary.txt"
    grep " BAD " "$f" | cut -c1-400
    [ "$bad" -eq 0 ] && grep -q "^# " "$f" || status=1
done
exit $status
