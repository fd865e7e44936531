#!/usr/bin/env bash
# The guards' own tests on a GPU machine (compiled Triton launch paths, not the interpreter's),
# beside the catch rates of the sets named: the guard, hostile-class and escape tests, and
# problem set 2's checks (its set-up cell's notebook-wide refusal), with pytest-xdist, while
# tests/wrong_answers/catch_rate.py draws DRAWS fresh cases for each set.
#     bash benchmarks/gpu_guard_tests.sh LOG_DIR DRAWS SET...      (e.g. ... 2 02 04 08 09)
# Packages the GPU machine lacks come from ./.wheelhouse, as in gpu_verify.sh.
set -uo pipefail
cd "$(dirname "$0")/.." && mkdir -p "$1"
logs=$1 extra=${COURSE_EXTRA_SITE:-/tmp/course-extra}
if ! python3 -c "import nbval, ipywidgets, nbclient, xdist" 2>/dev/null; then
    python3 -m pip install -q --no-index --find-links .wheelhouse --target "$extra" nbclient \
        nbformat ipykernel ipywidgets nbval nbconvert "pytest<9.2" pytest-timeout pytest-xdist \
        hypothesis jupyter_client tqdm latex2mathml >"$logs/install.log" 2>&1 \
        || { echo "install failed: see $logs/install.log"; exit 1; }
fi
export PATH="$extra/bin:$PATH" JUPYTER_PATH="$extra/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
export PYTHONPATH="$PWD:$extra${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
python3 -m pytest -p no:cacheprovider -q -n 6 --dist load tests/test_guards.py \
    tests/test_guard_escapes.py tests/test_hostile_class.py tests/test_softmax.py \
    tests/test_widgets_machine.py >"$logs/guard_tests.txt" 2>&1 &
tests=$!
CATCH_TIMEOUT=${CATCH_TIMEOUT:-400} bash benchmarks/gpu_catch_rate.sh "$@"   # LOG_DIR DRAWS SET...
catch=$?
wait $tests
t=$?
echo "guard tests rc=$t: $(tail -n 1 "$logs/guard_tests.txt")" | tee -a "$logs/summary.txt"
grep -E "^(FAILED|ERROR)" "$logs/guard_tests.txt" | cut -c1-300
[ $t -eq 0 ] && [ $catch -eq 0 ]
