#!/usr/bin/env bash
# Re-measure the JSON files the lessons read, after the kernel changes: lessons 6-7
# (attention.json), lesson 8 (hopper.json), lesson 9 (decode.json), after the decode
# kernel's GPU checks. Results are packed into $OUT/results.tar. The attention and hopper
# suites settle every provider for a second before timing it (their --settle default), so
# they take a few minutes longer than before.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
DEV=benchmarks/nvidia-h100-80gb-hbm3
COURSE_TRITON_AUTOTUNE=0 timeout 60 python3 -m pytest -p no:cacheprovider -q -rs \
    tests/test_kernel_hardening.py -k "decode" 2>&1 | tail -3 | tee "$OUT/decode_tests.log"
timeout 600 python3 -m course_utils.bench attention --rep 50 2>&1 | grep -v "^ " \
    | tee "$OUT/attention.log"
timeout 320 python3 -m course_utils.bench hopper 2>&1 | grep -v "^ " | tee "$OUT/hopper.log"
timeout 90 python3 -m course_utils.bench decode 2>&1 | tee "$OUT/decode.log"
tar cf "$OUT/results.tar" $DEV/attention.json $DEV/attention_*.png $DEV/hopper.json \
    $DEV/hopper.png $DEV/decode.json $DEV/decode.png
