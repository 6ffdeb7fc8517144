#!/usr/bin/env bash
# GPU machine, repo root, .tok carried: bash benchmarks/int4_batch1_trace.sh (OUT defaults to /tmp/out).
# int4 (AWQ layout) and bf16 at batch 1 through the engine under the JAX
# profiler: kernel busy time against the span between the first and last
# kernel says whether the step waits on the host.
export PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
python3 -c "from benchmarks.speed_targets import awq_folder; awq_folder('/tmp/awq', '.tok')"
for spec in "int4 /tmp/awq" "bf16 benchmarks/models/llama3-8b"; do
  set -- $spec
  timeout ${PER:-230} python3 -m jaxinfer bench latency --model $2 --tokenizer .tok \
    --load-format dummy --dtype bfloat16 --max-num-seqs 16 --input-len 128 \
    --output-len 16 --batch-size 1 --num-iters 1 --num-iters-warmup 1 \
    --profile-steps $OUT/$1.steps.jsonl --profile-trace /tmp/trace-$1 > $OUT/$1.log 2>&1
  echo "[$1] rc=$?"; tail -2 $OUT/$1.log
  python3 benchmarks/step_breakdown.py --trace /tmp/trace-$1 --steps 16 > $OUT/$1-trace.json 2>&1
  head -c 1200 $OUT/$1-trace.json; echo
done
