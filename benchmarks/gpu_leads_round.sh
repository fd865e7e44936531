#!/usr/bin/env bash
# Two prepared changes measured in one GPU call (each part under its own time limit, each
# writing its JSON as it goes):
#   1. a copy of lesson 8's Gluon backward (GLUON) checked against the course's gradients
#      (benchmarks/gluon_bwd_compare.py), then timed beside BASELINE (the course's kernel,
#      copied) by benchmarks/gluon_bwd_probe.py at head dims GDIMS;
#   2. a copy of lesson 7's module (TRITON) timed against the course's backward by
#      benchmarks/triton_bwd_variants.py at head dims TDIMS, with 16-byte aligned inputs
#      (descriptors where sm90 may use them) and, with UNALIGNED=1, the pointer path.
#   bash benchmarks/gpu_leads_round.sh OUTDIR GLUON BASELINE GDIMS TRITON TDIMS DTYPES [UNALIGNED]
set -u
out=${1:?OUTDIR}; gluon=${2:-}; base=${3:-}; gdims=${4:-64}; triton=${5:-}; tdims=${6:-64,128}
dtypes=${7:-fp16}; unal=${8:-0}
mkdir -p "$out"
if [ -n "$gluon" ]; then
    timeout 150 python3 benchmarks/gluon_bwd_compare.py "$gluon" --d "$gdims" --dtype "$dtypes" \
        > "$out/gluon_compare.log" 2>&1
    echo "compare rc=$?"; grep -c '^ok' "$out/gluon_compare.log"; grep -v '^ok' "$out/gluon_compare.log" | tail -4
    timeout 170 python3 benchmarks/gluon_bwd_probe.py --variants 2 --d "$gdims" --dtype "$dtypes" \
        --settle 200 --baseline "$gluon,$base" --out "$out/gluon_variants.json" \
        > "$out/gluon_variants.log" 2>&1
    echo "gluon timing rc=$?"; grep '^{' "$out/gluon_variants.log" | cut -c1-400
fi
if [ -n "$triton" ]; then
    for dt in ${dtypes//,/ }; do
        for u in 0 $([ "$unal" = 1 ] && echo 1); do
            tag=$dt$([ "$u" = 1 ] && echo _unaligned)
            timeout 200 python3 benchmarks/triton_bwd_variants.py --variants "$triton" --d "$tdims" \
                --dtype "$dt" --settle 200 $([ "$u" = 1 ] && echo --unaligned) \
                --out "$out/triton_variants_$tag.json" > "$out/triton_variants_$tag.log" 2>&1
            echo "triton $tag rc=$?"; grep '^{' "$out/triton_variants_$tag.log" | cut -c1-400
        done
    done
fi
