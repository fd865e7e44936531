#!/usr/bin/env bash
# The answer guards, the problem-set checks and course-grade's sandbox on a GPU machine, in
# one call: the guard tests, a CUDA probe under each isolation level, problem sets 6 and 9 under nbval (Triton compiling inside
# guarded answers, the checks' GPU tolerances), and course-grade grading problem set 6's
# official answers with the isolation a GPU machine gets (namespaces; as root, each run
# under its own unprivileged id). Installs nbval & co from ./.wheelhouse as gpu_verify.sh.
#     bash benchmarks/gpu_guard_round.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1
mkdir -p "$out"
extra=${COURSE_EXTRA_SITE:-/tmp/course-extra}
export MPLBACKEND=Agg
# installed once: a second round on the same machine (or one started beside
# gpu_verify.sh, which installs into the same folder) uses what is there
if ! python3 -c "import nbval, ipywidgets, nbclient, hypothesis" 2>/dev/null; then
    python3 -m pip install -q --no-index --find-links .wheelhouse --target "$extra" nbclient \
        nbformat ipykernel ipywidgets nbval nbconvert "pytest<9.2" pytest-timeout pytest-xdist \
        hypothesis jupyter_client tqdm latex2mathml >"$out/install.log" 2>&1 || echo "install failed"
    export PATH="$extra/bin:$PATH" JUPYTER_PATH="$extra/share/jupyter"
    export PYTHONPATH="$extra:$PWD"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -m pytest -q -p no:cacheprovider tests/test_guard_escapes.py tests/test_kernel_loads.py \
    >"$out/test_guards.txt" 2>&1
tail -n 2 "$out/test_guards.txt"
python3 benchmarks/gpu_sandbox_probe.py >"$out/sandbox_probe.txt" 2>&1
cut -c1-400 "$out/sandbox_probe.txt" | tail -n 12
python3 -m pytest -q -p no:cacheprovider --nbval-lax --nbval-cell-timeout 300 \
    solutions/06_triton_forward.ipynb solutions/09_decoding.ipynb >"$out/nbval.txt" 2>&1
tail -n 3 "$out/nbval.txt"
cls=$(mktemp -d)
cp solutions/06_triton_forward.ipynb "$cls/official.ipynb"
python3 -m course_utils.grading 06_triton_forward "$cls" -o "$out/grades" >"$out/grade.txt" 2>&1
tail -n 5 "$out/grade.txt"
cat "$out/grades/scores.csv" 2>/dev/null | cut -c1-300
