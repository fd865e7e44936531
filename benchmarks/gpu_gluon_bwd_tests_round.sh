#!/usr/bin/env bash
# Lesson 8's Gluon backward on an sm90 GPU in one call: the tests named in TESTS (default:
# lesson 8 under nbval, the Gluon compile check and the backward's tests against float64
# autograd), then (given two module copies) one more timing run of the backward alone at
# head dims DIMS.
#   bash benchmarks/gpu_gluon_bwd_tests_round.sh OUTDIR WHEELHOUSE [A.py,B.py DIMS DTYPES]
#   TESTS="tests/test_gluon_backward.py" TEST_SECONDS=300 bash benchmarks/gpu_gluon_bwd_tests_round.sh ...
set -u
out=${1:?OUTDIR}; wh=${2:?WHEELHOUSE}; pair=${3:-}; dims=${4:-64}; dtypes=${5:-fp16,bf16}
tests=${TESTS:-notebooks/08_hopper.ipynb tests/test_gluon_compiles.py tests/test_gluon_backward.py}
secs=${TEST_SECONDS:-330}
mkdir -p "$out"
source benchmarks/gpu_test_env.sh
gpu_test_env "$wh" "$out" || exit 1
cmd="python3 -m pytest -q -p no:cacheprovider -rs -n 4 --dist loadfile --nbval-lax --nbval-cell-timeout 200 $tests"
{ echo "# $(head -1 "$out/summary.txt"), $(sed -n 2p "$out/summary.txt")"
  echo "# timeout $secs $cmd"
  timeout "$secs" $cmd; echo "rc=$?"; } > "$out/tests.txt" 2>&1
tail -4 "$out/tests.txt"
if [ -n "$pair" ]; then
    timeout 200 python3 benchmarks/gluon_bwd_probe.py --variants 2 --d "$dims" --dtype "$dtypes" \
        --settle 200 --baseline "$pair" --out "$out/gluon_variants.json" > "$out/gluon_variants.log" 2>&1
    echo "gluon timing rc=$?"; grep '^{' "$out/gluon_variants.log" | cut -c1-300
fi
