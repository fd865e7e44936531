#!/usr/bin/env bash
# Lesson 7's backward kernels with descriptor tiles against pointer loads, per tile shape
# and autotuned (benchmarks/bwd_desc_probe.py), then, given a wheelhouse, the GPU tests of
# the descriptor paths, in one device run.
#   bash benchmarks/gpu_bwd_probe_round.sh OUTDIR HEAD_DIMS [SECONDS] [WHEELHOUSE] [PROBE ARGS...]
set -u
out=${1:?OUTDIR}; dims=${2:?HEAD_DIMS}; secs=${3:-400}; wh=${4:-}
shift 4 2>/dev/null || shift $#
mkdir -p "$out"
timeout "$secs" python3 benchmarks/bwd_desc_probe.py --d "$dims" --out "$out/bwd_desc_probe.json" \
    "$@" > "$out/bwd_desc_probe.log" 2>&1
echo "probe rc=$?" >> "$out/bwd_desc_probe.log"
if [ -n "$wh" ] && [ -d "$wh" ]; then
    bash benchmarks/gpu_desc_tests.sh "$out" "$wh"
fi
python3 - "$out/bwd_desc_probe.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except Exception as e:
    sys.exit(f"no rows: {e}")
for r in rows:
    what = r.get("kernel", r.get("design", "")) + " " + r.get("shape", "")
    print(r["d"], r["n"], int(r["causal"]), r["part"], what.strip(), "desc" if r.get("desc") else "",
          r.get("tflops", r.get("error", "")), r.get("picked_dkdv", ""), r.get("picked_dq", ""),
          r.get("picked_atomic_dq", ""))
PY
tail -3 "$out/bwd_desc_probe.log"
