#!/usr/bin/env bash
# The same `jaxinfer bench throughput` command on an older commit and on this
# checkout, one after the other on one GPU, so a refactor's effect on speed
# is read from one run. GPU machine, repo root:
#
#   git archive <old commit> | tar -x -C .before      # here, before the call
#   bash benchmarks/throughput_before_after.sh .before .tok $OUT [bench flags]
#
# .before and .tok travel as carried paths (.tok: the embedded tokenizer
# saved with save_pretrained, plus the model's config.json). Trees from
# before the package links (they have benchmarks/package_layout.sh) are
# laid out as the installed package first. Extra arguments replace the
# default workload (the issue's first row: 256 x 512/256, max_model_len
# 1024, a dry run first). Writes $OUT/before.json and $OUT/after.json
# (each bench's --output-json) and prints both output rates.
set -uo pipefail
before=$(realpath "$1"); tok=$(realpath "$2"); out=$(realpath "$3"); shift 3
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--input-len 512 --output-len 256
                               --num-prompts 256 --max-model-len 1024
                               --warmup dry-run)
here=$(pwd)

bench() {  # bench NAME TREE
    local name=$1 tree=$2 path
    if [ -f "$tree/benchmarks/package_layout.sh" ]; then
        path=$(cd "$tree" && bash benchmarks/package_layout.sh "/tmp/layout-$name")
    else
        path=$tree
    fi
    (cd "$path" && PYTHONPATH=$path python3 -c \
        'import sys; from jaxinfer.entrypoints.cli import main; sys.exit(main())' \
        bench throughput --model "$here/benchmarks/models/llama3-8b" \
        --load-format dummy --dtype bfloat16 --tokenizer "$tok" \
        "${args[@]}" --output-json "$out/$name.json")
    echo "$name: rc $?"
}

bench before "$before"
bench after "$here"
python3 - "$out" <<'EOF'
import json, os, sys
for name in ("before", "after"):
    p = os.path.join(sys.argv[1], name + ".json")
    if os.path.exists(p):
        d = json.load(open(p))
        rate = d.get("output_tokens_per_s") or d.get("output_throughput")
        print(f"{name}: {d.get('elapsed_s', d.get('elapsed_time'))} s, "
              f"{rate} output tok/s")
    else:
        print(f"{name}: no result")
EOF
