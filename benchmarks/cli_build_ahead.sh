#!/usr/bin/env bash
# Alternating runs of the README's first command with build-ahead on and off
# (JAXINFER_BUILD_AHEAD), warm caches and an empty compilation cache:
#   bash benchmarks/cli_build_ahead.sh OUT.json
out=$1
echo "[" > $out
first=1
for i in 1 2 3 4 5; do for v in 1 0; do
  for cache in warm cold; do
    if [ $cache = cold ]; then
      [ $i -gt 3 ] && continue
      d=$(mktemp -d); export JAXINFER_COMPILATION_CACHE_DIR=$d
    else unset JAXINFER_COMPILATION_CACHE_DIR; fi
    s=$(date +%s.%N)
    line=$(JAXINFER_BUILD_AHEAD=$v jaxinfer generate --prompt "The capital of France is" --max-tokens 32 2>&1 >/dev/null | tail -1)
    e=$(date +%s.%N)
    [ $first = 1 ] || echo "," >> $out; first=0
    echo "{\"build_ahead\": $v, \"cache\": \"$cache\", \"wall_s\": $(echo "$e - $s" | bc), \"stderr\": \"$line\"}" >> $out
    [ $cache = cold ] && rm -rf $d
  done
done; done
echo "]" >> $out
