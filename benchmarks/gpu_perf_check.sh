#!/usr/bin/env bash
# Hardening tests of every kernel on the GPU, then the lesson-6 forward ablation.
# Run from the repository root; writes logs and JSON under $OUT (default ./out).
# Optional: BASELINE=<older triton_attention.py> for the ablation's "old" rows.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
    | tee "$OUT/gpu.txt"
# the big-tensor tests with one fixed configuration (autotuning them would only add time)
COURSE_TRITON_AUTOTUNE=0 timeout 330 python3 -m pytest -p no:cacheprovider -q -rs \
    tests/test_kernel_hardening.py -k "not sweep" 2>&1 | tee "$OUT/hardening.log"
timeout 200 python3 -m pytest -p no:cacheprovider -q -rs tests/test_hopper_kernels.py \
    tests/test_kernel_hardening.py -k "sweep or real_size or bench" 2>&1 | tee -a "$OUT/hardening.log"
if [ "${SKIP_ABLATION:-0}" != 1 ]; then
    python3 benchmarks/ablation_fwd.py ${BASELINE:+--baseline "$BASELINE"} \
        --out "$OUT/ablation_fwd.json" ${ABL_ARGS:-} 2>&1 | tee "$OUT/ablation_fwd.log"
fi
