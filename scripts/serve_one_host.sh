#!/usr/bin/env bash
# One multi-GPU host: one process drives every GPU through one JAX mesh.
#
#   scripts/serve_one_host.sh MODEL [extra jaxinfer serve flags]
#
# TP (default: every visible GPU), PP and DP (default 1) split the GPUs:
# TP x PP devices per replica, DP replicas on disjoint GPUs, TP x PP x DP
# GPUs in all. PORT (8000) and HOST (127.0.0.1) set where it listens.
#   TP=8 scripts/serve_one_host.sh /models/llama3-70b
#   TP=4 PP=2 scripts/serve_one_host.sh /models/llama3-70b
#   TP=1 DP=8 scripts/serve_one_host.sh /models/llama3-8b      # 8 replicas
set -euo pipefail
model=${1:?usage: $0 MODEL [jaxinfer serve flags]}
shift
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l || true)
pp=${PP:-1}
dp=${DP:-1}
tp=${TP:-$(( gpus > 0 ? gpus / (pp * dp) : 1 ))}
exec jaxinfer serve "$model" \
    --tensor-parallel-size "$tp" --pipeline-parallel-size "$pp" \
    --data-parallel-size "$dp" \
    --host "${HOST:-127.0.0.1}" --port "${PORT:-8000}" "$@"
