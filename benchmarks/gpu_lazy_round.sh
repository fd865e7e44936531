#!/usr/bin/env bash
# sm90: lesson 6's forward with and without lazy rescaling (benchmarks/ablation_fwd.py
# --lazy both, every variant settled for a second), then lesson 8 executed on the GPU and kept
# with its outputs (its own-measurement cell runs only there; NOTEBOOKS names others, NB=0 none).
# Results land in $OUT.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee "$OUT/smi_info.txt"
CONFIGS=${CONFIGS:-128x128x8x3,128x64x8x3}
for dt in ${DTYPES:-fp16 bf16}; do                # ABL=0 leaves the probe out
  [ "${ABL:-1}" = 1 ] || break
  timeout ${ABL_S:-240} python3 benchmarks/ablation_fwd.py --lazy both --dtype "$dt" \
      --configs "$CONFIGS" --out "$OUT/lazy_probe_$dt.json" > "$OUT/lazy_probe_$dt.log" 2>&1
  echo "ablation $dt rc=$?" | tee -a "$OUT/lazy_probe_$dt.log"
  sed -n '/best per point/,$p' "$OUT/lazy_probe_$dt.log"
done
if [ "${NB:-1}" = 1 ]; then
  python3 -m pip install -q --no-index --find-links .wheelhouse --target /tmp/extra \
      nbclient nbformat ipykernel ipywidgets nbval "pytest<9.2" pytest-timeout tqdm \
      jupyter_client > /dev/null 2>&1
  for nb in ${NOTEBOOKS:-notebooks/08_hopper.ipynb}; do   # executed and kept with outputs
    PYTHONPATH=/tmp/extra:$PWD PATH=/tmp/extra/bin:$PATH timeout ${NB_S:-240} python3 -c "
import sys, nbformat, nbclient
nb = nbformat.read(sys.argv[1], as_version=4)
try:
    nbclient.NotebookClient(nb, timeout=600, kernel_name='python3',
                            resources={'metadata': {'path': 'notebooks'}}).execute()
    print('executed without error:', sys.argv[1])
finally:
    nbformat.write(nb, sys.argv[2])
" "$nb" "$OUT/$(basename "$nb" .ipynb)_executed.ipynb" 2>&1 | tail -15 | tee -a "$OUT/notebooks.log"
  done
fi
