#!/usr/bin/env bash
# On the GPU machine (where pip cannot install and the repo's own jaxinfer/
# folder would shadow an editable install), lay the four source folders out
# as the installed package under $1 (default /tmp/pp) and print the
# PYTHONPATH to use. From the repo root:
#
#   export PYTHONPATH=$(bash benchmarks/package_layout.sh) && cd "$PYTHONPATH"
#   python3 benchmarks/decode_step.py --out $OUT
set -euo pipefail
dest=${1:-/tmp/pp}
rm -rf "$dest" && mkdir -p "$dest/jaxinfer"
cp -r jaxinfer/. "$dest/jaxinfer/"
cp -r models "$dest/jaxinfer/models"
cp -r pallas_kernels "$dest/jaxinfer/pallas_kernels"
cp -r sharding "$dest/jaxinfer/sharding"
cp -r benchmarks "$dest/benchmarks"
echo "$dest"
