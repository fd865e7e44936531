#!/usr/bin/env bash
# Every check that needs a CUDA GPU, from the repository root. Two bundles, each within
# ten minutes on an H100, so the whole verification is two runs:
#
#     bash benchmarks/gpu_verify.sh checks  [LOG_DIR]   # four chains at once (none times
#                                                        # anything): kernels; the GPU-marked
#                                                        # tests; hopper; grading, then the
#                                                        # exercises
#     bash benchmarks/gpu_verify.sh outputs [LOG_DIR]   # site (every lesson alone on the
#                                                        # GPU, outputs kept), then nbval on
#                                                        # every solution and on the lesson
#                                                        # whose outputs nbval compares
#     bash benchmarks/gpu_verify.sh all     [LOG_DIR]   # both, one after the other
#     bash benchmarks/gpu_verify.sh suite   [LOG_DIR]   # the whole pytest suite (less the
#                                                        # browser tests) as a learner with a
#                                                        # GPU runs it: about eight minutes
#
# The parts, one at a time (in order; join them with commas):
#     kernels   doctor, lessons 6-7 kernels at real sizes (both backward designs)
#     gputests  the GPU- and Hopper-marked tests
#     hopper    decoding and Hopper kernels at real sizes
#     problems  every lesson and solution under nbval; every exercise must fail its checks
#     grading   every problem set graded by course-grade with its wrong answers
#     suite     every test in tests/, the unmarked ones too, on this machine's GPU (they
#               had run on a CPU only until 2026-11-29; nine of them failed on an H200 then)
#     site      every lesson executed alone on the GPU and saved with its outputs (for the
#               static site: python -m course_utils.site build --outputs-from
#               LOG_DIR/executed); a cell that raises fails this step, as under nbval
#
# A GPU machine without Jupyter, nbval or ipywidgets (and no package index) can take them
# from a folder of wheels, ./.wheelhouse, made beforehand on a machine with an index:
#     python -m pip download --only-binary=:all: --python-version 3.12 ... -d .wheelhouse \
#         nbclient nbformat ipykernel ipywidgets nbval nbconvert "pytest<9.2" pytest-timeout \
#         pytest-xdist hypothesis tqdm jupyter_client latex2mathml "numpy<2.4"
# (numpy < 2.4 for tests that run lessons through Triton's CPU interpreter, which up to
# Triton 3.6 fails with a newer numpy; it is installed only where the wheelhouse has it)
# They are installed into a side folder on PYTHONPATH, so the machine's own torch and
# Triton stay in use.
#
# Each step's log goes to LOG_DIR (default: artifacts/gpu). Each step adds its line to
# LOG_DIR/summary.txt as it ends, the run's lines are printed last, and the exit status is
# non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:-all}
logs=${2:-artifacts/gpu}
for p in ${part//,/ }; do
    case "$p" in kernels|gputests|hopper|problems|grading|site|suite|checks|outputs|all) ;;
        *) echo "usage: $0 checks|outputs|all|suite|kernels|gputests|hopper|problems|grading|site[,...] [LOG_DIR]" >&2
           exit 2;; esac
done
mkdir -p "$logs"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
extra=${COURSE_EXTRA_SITE:-/tmp/course-extra}
if ! python3 -c "import nbval, ipywidgets, nbclient" 2>/dev/null; then
    if [ -d .wheelhouse ]; then
        python3 -m pip install -q --no-index --find-links .wheelhouse --target "$extra" \
            nbclient nbformat ipykernel ipywidgets nbval nbconvert "pytest<9.2" pytest-timeout \
            pytest-xdist hypothesis tqdm jupyter_client latex2mathml \
            $(ls .wheelhouse | grep -q '^numpy-2\.[0-3]\.' && echo "numpy<2.4") >"$logs/install.log" 2>&1 \
            || { echo "installing from .wheelhouse failed: see $logs/install.log"; exit 1; }
        export PATH="$extra/bin:$PATH" JUPYTER_PATH="$extra/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
        PYTHONPATH="$extra${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "nbval/ipywidgets/nbclient are missing and there is no .wheelhouse folder" >&2
    fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mine="$logs/.steps.$$"
: >"$mine"
step() {
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$logs/$name.log" 2>&1
    local rc=$?
    local line
    line=$(printf '%-23s %-6s %4ss  %s' "$name" "$([ $rc = 0 ] && echo ok || echo FAIL:$rc)" \
        $((SECONDS - t0)) "$*")
    printf '%s\n' "$line" >>"$logs/summary.txt"
    printf '%s\n' "$line" >>"$mine"
    tail -n 3 "$logs/$name.log"
}
nb="-p no:cacheprovider -q -n 8 --dist loadfile --nbval-cell-timeout 300"
{ nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "bash benchmarks/gpu_verify.sh $part"; } >>"$logs/summary.txt" 2>&1

kernels() {
    step doctor python3 -m course_utils doctor
    step attention env COURSE_TRITON_AUTOTUNE=0 python3 benchmarks/gpu_check_attention.py
    step attention_tuned env COURSE_TRITON_AUTOTUNE=1 python3 benchmarks/gpu_check_attention.py --quick
    step attention_atomic_dq env COURSE_TRITON_AUTOTUNE=1 python3 benchmarks/gpu_check_attention.py \
        --quick --bwd atomic_dq
}
gputests() {
    # the GPU-marked tests, less those that run the cases of the check scripts again
    step pytest_gpu python3 -m pytest -q -p no:cacheprovider -m "gpu or hopper" tests \
        --ignore=tests/browser -k "not test_real_sizes_on_the_gpu and not test_atomic_dq_at_real_sizes"
}
hopper() {
    step decode python3 benchmarks/check_decode_gpu.py
    step hopper python3 benchmarks/check_hopper_gpu.py
}
exercises() {
    step exercises_fail python3 -m pytest -p no:cacheprovider -q -n ${1:-8} tests/test_exercises.py
}
problems() {
    step nbval_lessons_solutions python3 -m pytest --nbval-lax notebooks solutions $nb
    exercises
}
grading() {
    step grading python3 -m pytest -p no:cacheprovider -q -n ${1:-10} --dist load \
        tests/test_wrong_answers.py -k "scores_right_and_wrong"
}
suite() {
    step suite python3 -m pytest tests -q -p no:cacheprovider --ignore=tests/browser \
        -n ${1:-14} --dist loadgroup --timeout 400
}
site() {
    # one lesson at a time, so the timings the lessons print are not shared with another
    step executed_lessons python3 -m course_utils.site build --out artifacts/gpu-site --no-cache \
        --jobs 1 --on machine --save-executed "$logs/executed"
}
checks() {
    # nothing here times anything, so the four chains share the GPU
    kernels &
    gputests &
    hopper &
    { grading 6; exercises 4; } &
    wait
}
outputs() {
    site
    # lessons 01-09 ran in the site step (a raising cell fails it); nbval runs the solutions
    # and lesson 00, whose outputs it compares with the stored ones
    step nbval_solutions python3 -m pytest --nbval-lax solutions notebooks/00_setup.ipynb $nb
}

for p in ${part//,/ }; do
    case "$p" in
        all) checks; outputs;;
        *) "$p";;
    esac
done
echo
cat "$mine"
! grep -q FAIL "$mine"
status=$?
rm -f "$mine"
exit $status
