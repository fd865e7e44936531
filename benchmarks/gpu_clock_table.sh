#!/usr/bin/env bash
# sm90: optionally the Gluon GPU tests (TESTS=1), the clock probe (benchmarks/clock_probe.py
# with PROBE_ARGS, nvidia-smi sampling the SM clock, power and clock-event reasons every
# 50 ms; PROBE=0 leaves it out), and optionally the one-command table (TABLE=1,
# TABLE_ARGS). Results land in $OUT.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee "$OUT/smi_info.txt"
if [ "${TESTS:-0}" = 1 ]; then
  python3 -m pip install -q --no-index --find-links .wheelhouse --target /tmp/ce \
      "pytest<9.2" pytest-timeout pytest-xdist hypothesis > /dev/null 2>&1
  PYTHONPATH=$PWD:/tmp/ce timeout ${TESTS_S:-240} python3 -m pytest -p no:cacheprovider -q -n 8 \
      tests/test_kernel_hardening.py tests/test_hopper_kernels.py tests/test_gluon_backward.py \
      -k "gluon or hopper_forwards or fp8 or persistent" 2>&1 | tail -4 | tee "$OUT/tests.log"
fi
FIELDS=timestamp,clocks.sm,power.draw,clocks_event_reasons.active
nvidia-smi --query-gpu=$FIELDS --format=csv,noheader,nounits >/dev/null 2>&1 \
    || FIELDS=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active
nvidia-smi --query-gpu=$FIELDS --format=csv,noheader,nounits -lms 50 > "$OUT/smi.csv" 2>&1 &
SMI=$!
if [ "${PROBE:-1}" = 1 ]; then
  timeout ${PROBE_S:-300} python3 benchmarks/clock_probe.py ${PROBE_ARGS:-} \
      --smi "$OUT/smi.csv" --out "$OUT/clock_probe.json" > "$OUT/clock_probe.log" 2>&1
  echo "probe rc=$?" | tee -a "$OUT/clock_probe.log"
  grep -v "^{" "$OUT/clock_probe.log" | tail -${PROBE_TAIL:-40}
fi
if [ "${TABLE:-0}" = 1 ]; then
  timeout ${TABLE_S:-400} python3 -m course_utils.bench table ${TABLE_ARGS:---rep 30} \
      > "$OUT/table.log" 2>&1
  echo "table rc=$?" >> "$OUT/table.log"
  tail -5 "$OUT/table.log"
  for f in benchmarks/nvidia-h*/table*.json; do      # one name per device's file
    cp "$f" "$OUT/$(basename "$(dirname "$f")")_$(basename "$f")"
  done
fi
kill $SMI
gzip "$OUT/smi.csv"
