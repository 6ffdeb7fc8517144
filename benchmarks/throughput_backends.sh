#!/usr/bin/env bash
# One H200: `jaxinfer bench throughput` on llama3-8b (dummy weights) once per
# attention backend, so the engine's kernels are compared at model scale in
# the same lease. From a checkout, with PYTHONPATH=$PWD:
#
#   bash benchmarks/throughput_backends.sh OUT_DIR TOKENIZER_DIR [backend ...]
#
# Writes OUT_DIR/throughput-<backend>.json and the log's tail. With
# DUMP_HLO=1, a backend whose run fails also leaves XLA's optimized HLO and
# buffer assignment of the step program (OUT_DIR/hlo-<backend>.tgz), to find
# which operand broke (dumping slows every compile, so it is off by default).
set -uo pipefail
out=$1; tok=$2; shift 2
backends=("$@")
[ $# -eq 0 ] && backends=(pallas pallas_triton)
status=0
for b in "${backends[@]}"; do
  dump=/tmp/xla-dump-$b; rm -rf "$dump"
  flags=${XLA_FLAGS:-}
  [ "${DUMP_HLO:-0}" = 1 ] && flags="$flags --xla_dump_to=$dump --xla_dump_hlo_module_re=.*_step.*"
  XLA_FLAGS="$flags" \
  python3 -m jaxinfer.entrypoints.cli bench throughput \
    --model benchmarks/models/llama3-8b --load-format dummy --tokenizer "$tok" \
    --dtype bfloat16 --max-model-len 1024 --max-num-seqs 64 \
    --max-num-batched-tokens 4096 --num-prompts 64 --input-len 512 \
    --output-len 256 --warmup dry-run --disable-detokenize \
    --attention-backend "$b" --output-json "$out/throughput-$b.json" \
    2>&1 | tail -40 | tee "$out/throughput-$b.log"
  if [ ! -s "$out/throughput-$b.json" ]; then
    status=1
    [ -d "$dump" ] && (cd "$dump" && tar czf "$out/hlo-$b.tgz" $(ls | grep -E 'after_optimizations(\.txt|-buffer-assignment\.txt)$' | head -8))
  fi
done
exit $status
