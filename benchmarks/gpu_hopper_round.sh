#!/usr/bin/env bash
# The Gluon kernels on an sm90 GPU, in one call, the steps named on the command line:
# the backward's tests and lesson 8 under nbval (installed from ./.wheelhouse as in
# gpu_verify.sh), Nsight Compute on one backward launch at D = 64 and D = 128 with
# per-instruction sampling, the backward probe's gradient check, other versions of the
# backward module timed against it and cuDNN, the forward's schedules timed side by side,
# the forward's GPU tests, the whole table.
#     bash benchmarks/gpu_hopper_round.sh OUT_DIR [check] [variants FILE,...] [tests]
#         [profile] [lesson8] [fwdprobe NAME VARIANT,...] [fwdtests] [table]
# (steps run in the order given; check: the probe's gradient check of the module; lesson8:
# lesson 8 executed alone and saved with its outputs into OUT_DIR/executed, as
# gpu_verify.sh's site step does for every lesson; fwdprobe: gluon_consumers_probe.py
# with those variants into OUT_DIR/NAME.json; table: python -m course_utils.bench table
# --rep 30, its file copied into OUT_DIR)
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1; shift
mkdir -p "$out"
extra=/tmp/course-extra
python3 -m pip install -q --no-index --find-links .wheelhouse --target "$extra" nbclient \
    nbformat ipykernel ipywidgets nbval nbconvert "pytest<9.2" pytest-timeout hypothesis \
    jupyter_client tqdm latex2mathml \
    >"$out/install.log" 2>&1 || echo "install failed (see install.log)"
export PATH="$extra/bin:$PATH" JUPYTER_PATH="$extra/share/jupyter" MPLBACKEND=Agg
export PYTHONPATH="$extra:$PWD"
while [ $# -gt 0 ]; do
    case "$1" in
    tests)
        python3 -m pytest -q -p no:cacheprovider tests/test_gluon_backward.py \
            >"$out/test_gluon_backward.txt" 2>&1 &
        python3 -m pytest -q -p no:cacheprovider --nbval-lax --nbval-cell-timeout 300 \
            notebooks/08_hopper.ipynb >"$out/nbval_08.txt" 2>&1
        wait
        tail -n 2 "$out/test_gluon_backward.txt" "$out/nbval_08.txt";;
    profile)
        ncu --profile-from-start off --clock-control none -k regex:_attn_bwd_gluon \
            --section SpeedOfLight --section LaunchStats --section WarpStateStats \
            --section SourceCounters \
            --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,regex:sm__pipe_tensor.*pct_of_peak_sustained_active" \
            -o "$out/bwd" -f python3 benchmarks/gpu_profile.py --only gluon_bwd_d64,gluon_bwd_d128 \
            >"$out/ncu.log" 2>&1 || tail -n 20 "$out/ncu.log"
        python3 benchmarks/gpu_profile.py --report "$out/bwd.ncu-rep" | tee "$out/bwd_report.txt"
        python3 benchmarks/gpu_profile.py --source "$out/bwd.ncu-rep" >"$out/bwd_source.txt" 2>&1
        head -n 30 "$out/bwd_source.txt";;
    lesson8)
        python3 -m course_utils.site build --out /tmp/site-08 --no-cache --jobs 1 --on machine \
            --lessons 08 --save-executed "$out/executed" >"$out/lesson8.txt" 2>&1
        tail -n 3 "$out/lesson8.txt";;
    check)
        python3 benchmarks/gluon_bwd_probe.py --check-only --out "$out/check.json" 2>&1 \
            | tail -n 30;;
    variants)
        shift
        python3 benchmarks/gluon_bwd_probe.py --variants 2 --baseline "$1" --rep 30 \
            --out "$out/variants.json" 2>&1 | tail -n 20;;
    fwdprobe)
        python3 benchmarks/gluon_consumers_probe.py --variants "$3" --rep 30 \
            --out "$out/$2.json" >"$out/$2.log" 2>&1; tail -n 12 "$out/$2.log" | cut -c1-400
        shift 2;;
    fwdtests)
        python3 -m pytest -q -p no:cacheprovider tests/test_kernel_hardening.py \
            tests/test_hopper_kernels.py -k "gluon or hopper_forwards" \
            >"$out/test_gluon_forward.txt" 2>&1
        tail -n 3 "$out/test_gluon_forward.txt";;
    table)
        python3 -m course_utils.bench table --rep 30 >"$out/table.log" 2>&1
        cp benchmarks/nvidia-h100-80gb-hbm3/table.json "$out/" 2>/dev/null
        tail -n 40 "$out/table.log" | cut -c1-300;;
    esac
    shift
done
