#!/usr/bin/env bash
# After a change to the Gluon forward (its arguments, its FP8 schedule): the Hopper kernel
# and hardening tests of the Gluon paths, then lesson 8 under nbval, on an sm90 GPU.
#     bash benchmarks/gpu_gluon_recheck.sh [LOG_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${1:-artifacts/gpu}
mkdir -p "$logs"
extra=${COURSE_EXTRA_SITE:-/tmp/course-extra}
if ! python3 -c "import nbval, xdist" 2>/dev/null && [ -d .wheelhouse ]; then
    python3 -m pip install -q --no-index --find-links .wheelhouse --target "$extra" \
        nbclient nbformat ipykernel ipywidgets nbval nbconvert "pytest<9.2" pytest-timeout \
        pytest-xdist hypothesis tqdm jupyter_client latex2mathml >"$logs/install.log" 2>&1
fi
export PATH="$extra/bin:$PATH" JUPYTER_PATH="$extra/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
export PYTHONPATH="$PWD:$extra${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
python3 -m pytest -p no:cacheprovider -q -n 6 --dist load tests/test_hopper_kernels.py \
    tests/test_kernel_hardening.py -k "gluon or hopper_forwards or fp8" >"$logs/gluon_tests.txt" 2>&1
s1=$?
python3 -m pytest -p no:cacheprovider -q --nbval-lax notebooks/08_hopper.ipynb \
    >"$logs/nbval_08.txt" 2>&1
s2=$?
echo "gluon tests rc=$s1: $(tail -1 "$logs/gluon_tests.txt")" | tee -a "$logs/summary.txt"
echo "nbval lesson 08 rc=$s2: $(tail -1 "$logs/nbval_08.txt")" | tee -a "$logs/summary.txt"
[ $s1 -eq 0 ] && [ $s2 -eq 0 ]
