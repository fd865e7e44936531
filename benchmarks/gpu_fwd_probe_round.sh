#!/usr/bin/env bash
# Lesson 6's forward and lesson 8's TMA forward in tile shapes that put one, two or three
# programs on a multiprocessor, against the source material's forward, in one device run;
# then the GPU tests of the TMA kernel.
#   bash benchmarks/gpu_fwd_probe_round.sh OUTDIR SOURCE_TEXT [WHEELHOUSE]
set -u
out=${1:?OUTDIR}; src=${2:?SOURCE_TEXT}; wh=${3:-.wheelhouse}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > "$out/smi_start.csv" 2>&1
timeout 200 python3 benchmarks/ablation_fwd.py --d 128,64 \
    --configs 128x128x8x3,128x64x8x3,128x64x4x2,64x64x4x3 --out "$out/ctas_probe.json" \
    > "$out/ctas_probe.log" 2>&1
echo "ctas rc=$?" >> "$out/ctas_probe.log"
timeout 300 python3 benchmarks/source_kernel_probe.py --source "$src" --ws off --d 128,64 \
    --tma-configs 128x128x8x3,128x128x8x2,128x64x4x2,64x64x4x3 \
    --out "$out/source_kernel_probe.json" > "$out/source_kernel_probe.log" 2>&1
echo "source rc=$?" >> "$out/source_kernel_probe.log"
if [ -d "$wh" ]; then
    python3 -m pip install -q --no-index --find-links "$wh" --target /tmp/extra \
        nbclient nbformat ipykernel ipywidgets nbval "pytest<9.2" pytest-timeout hypothesis tqdm \
        > "$out/pip.log" 2>&1
    PYTHONPATH=/tmp/extra:$PWD timeout 120 python3 -m pytest -q -p no:cacheprovider \
        tests/test_hopper_kernels.py tests/test_kernel_hardening.py -k "tma or ahead" \
        > "$out/test_tma.txt" 2>&1
    echo "tests rc=$?" >> "$out/test_tma.txt"
fi
tail -10 "$out/ctas_probe.log"; grep -v '^{' "$out/source_kernel_probe.log" | tail -16
tail -3 "$out/test_tma.txt" 2>/dev/null
