#!/usr/bin/env bash
# Lesson 6's forward with K and V through tensor descriptors (DESC) against the pointer
# loads, per tile shape; the autotuned forward against the source material's forward; then
# the GPU tests of the lesson 6 forward, in one device run.
#   bash benchmarks/gpu_fwd_probe_round.sh OUTDIR SOURCE_TEXT [WHEELHOUSE]
set -u
out=${1:?OUTDIR}; src=${2:?SOURCE_TEXT}; wh=${3:-.wheelhouse}
mkdir -p "$out"
if [ -d "$wh" ]; then
    python3 -m pip install -q --no-index --find-links "$wh" --target /tmp/extra \
        nbclient nbformat ipykernel ipywidgets nbval "pytest<9.2" pytest-timeout hypothesis tqdm \
        > "$out/pip.log" 2>&1
    PYTHONPATH=/tmp/extra:$PWD timeout 170 python3 -m pytest -q -p no:cacheprovider -x \
        tests/test_kernel_hardening.py tests/test_triton_attention.py \
        -k "not gluon and not hopper" > "$out/test_fwd.txt" 2>&1
    echo "tests rc=$?" >> "$out/test_fwd.txt"
fi
timeout 170 python3 benchmarks/ablation_fwd.py --d 128,64 --desc both \
    --configs 128x128x8x3,128x64x8x3,128x64x4x2 --out "$out/desc_probe.json" \
    > "$out/desc_probe.log" 2>&1
echo "desc rc=$?" >> "$out/desc_probe.log"
timeout 200 python3 benchmarks/source_kernel_probe.py --source "$src" --ws off --d 128,64 \
    --out "$out/source_kernel_probe.json" > "$out/source_kernel_probe.log" 2>&1
echo "source rc=$?" >> "$out/source_kernel_probe.log"
tail -4 "$out/test_fwd.txt" 2>/dev/null
tail -10 "$out/desc_probe.log"; grep -v '^{' "$out/source_kernel_probe.log" | tail -16
