#!/usr/bin/env bash
# The Gluon backward on an sm90 GPU, in one call, the steps named on the command line:
# its tests and lesson 8 under nbval (installed from ./.wheelhouse as in gpu_verify.sh),
# Nsight Compute on one launch at D = 64 and D = 128 with per-instruction sampling, the
# probe's gradient check, other versions of the module timed against it and cuDNN.
#     bash benchmarks/gpu_bwd_round.sh OUT_DIR [check] [variants FILE,...] [tests] [profile]
#                                              [lesson8]
# (steps run in the order given; check: the probe's gradient check of the module; lesson8:
# lesson 8 executed alone and saved with its outputs into OUT_DIR/executed, as
# gpu_verify.sh's site step does for every lesson)
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
    esac
    shift
done
