#!/usr/bin/env bash
# The course's performance table (course_utils.bench table) and, given a wheelhouse, the
# GPU tests of the descriptor paths, in one device run; the table's JSON lands in OUTDIR.
#   bash benchmarks/gpu_table_round.sh OUTDIR TABLE_SECONDS WHEELHOUSE NAME [TABLE ARGS...]
set -u
out=${1:?OUTDIR}; secs=${2:?TABLE_SECONDS}; wh=${3:-}; name=${4:?NAME}
shift 4
mkdir -p "$out"
rm -f benchmarks/*/"$name".json
timeout "$secs" python3 -m course_utils.bench table --name "$name" "$@" > "$out/table.log" 2>&1
echo "table rc=$?" >> "$out/table.log"
cp benchmarks/*/"$name".json "$out/" 2>/dev/null
if [ -n "$wh" ] && [ -d "$wh" ]; then
    bash benchmarks/gpu_desc_tests.sh "$out" "$wh"
fi
grep -v "^ *$" "$out/table.log" | tail -40
