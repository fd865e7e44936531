# Sourced by the GPU rounds that run tests: gpu_test_env WHEELHOUSE OUTDIR [MORE PACKAGES]
# installs the test tools (pytest and its plugins, nbval and Jupyter's kernel machinery)
# from a folder of wheels into a side folder on PYTHONPATH, so the machine's own torch and
# Triton stay in use, and starts OUTDIR/summary.txt with the GPU and the versions. The GPU
# machine has no package index: the wheels come from ../shared/tools/gpu-wheelhouse, plus
# nbconvert and latex2mathml, which lesson runs under nbval need and that list lacks:
#   python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#       --abi cp312 --platform manylinux2014_x86_64 -d WHEELHOUSE nbconvert latex2mathml
gpu_test_env() {
    local wh=$1 out=$2 extra=/tmp/course-extra
    shift 2
    python3 -m pip install -q --no-index --find-links "$wh" --target "$extra" \
        nbclient nbformat ipykernel ipywidgets nbval nbconvert "pytest<9.2" pytest-timeout \
        pytest-xdist hypothesis tqdm jupyter_client latex2mathml "$@" > "$out/pip.log" 2>&1 \
        || { echo "install failed"; tail -5 "$out/pip.log"; return 1; }
    export PATH="$extra/bin:$PATH" JUPYTER_PATH="$extra/share/jupyter"
    export PYTHONPATH="$extra:$PWD" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
    { nvidia-smi --query-gpu=name --format=csv,noheader | head -1
      python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    } > "$out/summary.txt" 2>&1
    return 0                  # what the GPU and versions lines say is for the summary
}
