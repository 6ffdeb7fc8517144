#!/usr/bin/env bash
# Several benchmark scripts in one device call, in the order given, each
# under what is left of one deadline, their outputs packed into one archive
# (the device tool brings back a few files only). GPU machine, repo root:
#
#   bash benchmarks/gpu_call.sh SECONDS $OUT 'name: command' ['name: command' ...]
#
# Each command runs with $PWD first on PYTHONPATH and its own output folder in
# $PART_OUT; its log is $OUT/parts/NAME.log. A part that would start with
# under 30 s left is skipped. Writes $OUT/parts.tgz (again after each part)
# and prints each part's exit status and the last lines of its log.
set -uo pipefail
budget=$1; out=$2; shift 2
start=$(date +%s)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$out/parts"
for spec in "$@"; do
    name=${spec%%:*}; cmd=${spec#*:}
    left=$((budget - ($(date +%s) - start)))
    if [ "$left" -lt 30 ]; then echo "[$name] skipped: ${left}s left"; continue; fi
    export PART_OUT="$out/parts/$name"; mkdir -p "$PART_OUT"
    t0=$(date +%s)
    timeout "$left" bash -c "$cmd" > "$out/parts/$name.log" 2>&1
    rc=$?
    echo "[$name] rc=$rc in $(( $(date +%s) - t0 ))s"
    tail -n 12 "$out/parts/$name.log"
    # Packed after every part: a call cut off by the device's limit still
    # brings back what the finished parts wrote.
    tar -czf "$out/parts.tgz.tmp" -C "$out" parts && mv "$out/parts.tgz.tmp" "$out/parts.tgz"
done
rm -rf "$out/parts"
