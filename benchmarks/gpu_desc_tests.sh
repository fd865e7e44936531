#!/usr/bin/env bash
# The GPU tests of the descriptor paths (lesson 6's forward, lesson 7's backward), with
# pytest installed from a wheelhouse beside the machine's torch; the log goes to OUTDIR.
#   bash benchmarks/gpu_desc_tests.sh OUTDIR WHEELHOUSE
set -u
out=${1:?OUTDIR}; wh=${2:?WHEELHOUSE}
mkdir -p "$out"
python3 -m pip install -q --no-index --find-links "$wh" --target /tmp/extra \
    "pytest<9.2" pytest-timeout hypothesis > "$out/pip.log" 2>&1
PYTHONPATH=/tmp/extra:$PWD timeout 150 python3 -m pytest -q -p no:cacheprovider \
    tests/test_kernel_hardening.py -k "descriptor" > "$out/test_desc.txt" 2>&1
echo "tests rc=$?" >> "$out/test_desc.txt"
tail -3 "$out/test_desc.txt"
