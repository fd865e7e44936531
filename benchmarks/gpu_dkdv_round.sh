#!/usr/bin/env bash
# Lesson 7's dK/dV kernel with P^T in 16 bits and the added one-warpgroup shapes
# (benchmarks/dkdv_probe.py), then the Gluon backward alone in float16 and bfloat16 in one
# run (benchmarks/gluon_bwd_probe.py --modes bwd), in one device run.
#   bash benchmarks/gpu_dkdv_round.sh OUTDIR [PROBE_SECONDS] [GLUON_SECONDS] [PROBE ARGS...]
set -u
out=${1:?OUTDIR}; secs=${2:-420}; gsecs=${3:-120}
shift 3 2>/dev/null || shift $#
mkdir -p "$out"
timeout "$secs" python3 benchmarks/dkdv_probe.py --out "$out/dkdv_probe.json" "$@" \
    > "$out/dkdv_probe.log" 2>&1
echo "probe rc=$?" >> "$out/dkdv_probe.log"
python3 - "$out/dkdv_probe.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except Exception as e:
    sys.exit(f"no rows: {e}")
for r in rows:
    print(r["d"], r["n"], int(r["causal"]), r["part"], r.get("shape", r.get("list", "")),
          "p16" if r.get("p16") else "", r.get("tflops", r.get("error", "")),
          r.get("picked_dkdv", ""), r.get("err64", ""))
PY
tail -3 "$out/dkdv_probe.log"
for dt in fp16 bf16; do
    timeout "$gsecs" python3 benchmarks/gluon_bwd_probe.py --d 128 --modes bwd --dtype "$dt" \
        --out "$out/gluon_bwd_$dt.json" > "$out/gluon_bwd_$dt.log" 2>&1
    echo "gluon $dt rc=$?"; tail -12 "$out/gluon_bwd_$dt.log"
done
