#!/usr/bin/env bash
# Every check that needs a CUDA GPU, from the repository root, in parts that each fit in ten
# minutes on an H100:
#
#     bash benchmarks/gpu_verify.sh kernels  [LOG_DIR]   # doctor, lessons 6-7 kernels at
#                                                         # real sizes (both backward
#                                                         # designs), GPU-marked tests
#     bash benchmarks/gpu_verify.sh hopper   [LOG_DIR]   # decoding and Hopper kernels at
#                                                         # real sizes
#     bash benchmarks/gpu_verify.sh problems [LOG_DIR]   # every lesson and solution under
#                                                         # nbval, every exercise must fail its
#                                                         # checks
#     bash benchmarks/gpu_verify.sh grading  [LOG_DIR]   # every problem set graded by
#                                                         # course-grade with its wrong answers
#     bash benchmarks/gpu_verify.sh site     [LOG_DIR]   # every lesson executed alone on the
#                                                         # GPU and saved with its outputs
#     bash benchmarks/gpu_verify.sh all      [LOG_DIR]
#
# Parts can be combined with commas (problems,site). The third saves what readers of the
# static site see.
#
# A GPU machine without Jupyter, nbval or ipywidgets (and no package index) can take them
# from a folder of wheels, ./.wheelhouse, made beforehand on a machine with an index:
#     python -m pip download --only-binary=:all: --python-version 3.12 ... -d .wheelhouse \
#         nbclient nbformat ipykernel ipywidgets nbval nbconvert "pytest<9.2" pytest-timeout \
#         pytest-xdist hypothesis tqdm jupyter_client latex2mathml
# They are installed into a side folder on PYTHONPATH, so the machine's own torch and
# Triton stay in use.
#
# Each step's log goes to LOG_DIR (default: artifacts/gpu); lessons executed on the GPU
# (outputs kept, for the static site: python -m course_utils.site build --no-execute
# --src LOG_DIR/executed, or --outputs-from LOG_DIR/executed) go to LOG_DIR/executed. Each step adds its line to
# LOG_DIR/summary.txt as it ends, the summary is printed last, and the exit status is
# non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:-all}
logs=${2:-artifacts/gpu}
for p in ${part//,/ }; do
    case "$p" in kernels|hopper|problems|grading|site|all) ;;
        *) echo "usage: $0 kernels|hopper|problems|grading|site|all[,...] [LOG_DIR]" >&2; exit 2;; esac
done
want() { [[ ",$part," == *",$1,"* || ",$part," == *",all,"* ]]; }
mkdir -p "$logs"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
extra=${COURSE_EXTRA_SITE:-/tmp/course-extra}
if ! python3 -c "import nbval, ipywidgets, nbclient" 2>/dev/null; then
    if [ -d .wheelhouse ]; then
        python3 -m pip install -q --no-index --find-links .wheelhouse --target "$extra" \
            nbclient nbformat ipykernel ipywidgets nbval nbconvert "pytest<9.2" pytest-timeout \
            pytest-xdist hypothesis tqdm jupyter_client latex2mathml >"$logs/install.log" 2>&1 \
            || { echo "installing from .wheelhouse failed: see $logs/install.log"; exit 1; }
        export PATH="$extra/bin:$PATH" JUPYTER_PATH="$extra/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
        PYTHONPATH="$extra${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "nbval/ipywidgets/nbclient are missing and there is no .wheelhouse folder" >&2
    fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
summary=()
step() {
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$logs/$name.log" 2>&1
    local rc=$?
    summary+=("$(printf '%-22s %-6s %4ss  %s' "$name" "$([ $rc = 0 ] && echo ok || echo FAIL:$rc)" $((SECONDS - t0)) "$*")")
    printf '%s\n' "${summary[-1]}" >>"$logs/summary.txt"
    tail -n 3 "$logs/$name.log"
}
nb="-p no:cacheprovider -q -n 8 --dist loadfile --nbval-cell-timeout 300"
{ nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "bash benchmarks/gpu_verify.sh $part"; } >>"$logs/summary.txt" 2>&1
if want kernels; then
    step doctor python3 -m course_utils doctor
    step attention env COURSE_TRITON_AUTOTUNE=0 python3 benchmarks/gpu_check_attention.py
    step attention_tuned env COURSE_TRITON_AUTOTUNE=1 python3 benchmarks/gpu_check_attention.py --quick
    step attention_atomic_dq env COURSE_TRITON_AUTOTUNE=1 python3 benchmarks/gpu_check_attention.py \
        --quick --bwd atomic_dq
    # the GPU-marked tests, less those that run the cases of the check scripts again
    step pytest_gpu python3 -m pytest -q -p no:cacheprovider -m "gpu or hopper" tests \
        --ignore=tests/browser -k "not test_real_sizes_on_the_gpu and not test_atomic_dq_at_real_sizes \
        and not test_declared_cases_match_the_reference"
fi
if want hopper; then
    step decode python3 benchmarks/check_decode_gpu.py
    step hopper python3 benchmarks/check_hopper_gpu.py
fi
if want site; then
    # one lesson at a time, so the timings the lessons print are not shared with another
    step executed_lessons python3 -m course_utils.site build --out artifacts/gpu-site --no-cache \
        --jobs 1 --on machine --save-executed "$logs/executed"
fi
if want problems; then
    step nbval_lessons_solutions python3 -m pytest --nbval-lax notebooks solutions $nb
    step exercises_fail python3 -m pytest -p no:cacheprovider -q -n 8 tests/test_exercises.py
fi
if want grading; then
    step grading python3 -m pytest -p no:cacheprovider -q -n 10 --dist load \
        tests/test_wrong_answers.py -k "scores_right_and_wrong"
fi
echo
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -q FAIL
