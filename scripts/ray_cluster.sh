#!/usr/bin/env bash
# A Ray cluster: Ray places one worker process per GPU and supervises them;
# the server on the head talks to them through Ray and JAX carries the data.
#
#   scripts/ray_cluster.sh head                  # on the head host
#   scripts/ray_cluster.sh worker HEAD_IP        # on every other host
#   scripts/ray_cluster.sh serve MODEL [flags]   # on the head, once all joined
#   scripts/ray_cluster.sh stop                  # on each host, at the end
#
# serve splits the cluster's GPUs as TP (default: GPUs per host) x PP
# (default: hosts). JAXINFER_RAY_DEVICES_PER_WORKER=8 gives each worker a
# whole 8-GPU host instead of one GPU (fewer processes, NVLink collectives
# inside each). A worker that dies fails every request at once, /health
# says which, and the server exits 1 for its supervisor to restart.
set -euo pipefail
cmd=${1:?usage: $0 head | worker HEAD_IP | serve MODEL [flags] | stop}
shift
port=${RAY_PORT:-6379}
case "$cmd" in
    head) exec ray start --head --port "$port" ;;
    worker) exec ray start --address "${1:?HEAD_IP}:$port" ;;
    stop) exec ray stop ;;
    serve)
        model=${1:?usage: $0 serve MODEL [flags]}
        shift
        read -r gpus hosts < <(python3 - <<'PY'
import ray
ray.init(address="auto", log_to_driver=False)
nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")]
print(int(sum(n["Resources"]["GPU"] for n in nodes)), max(len(nodes), 1))
PY
        )
        pp=${PP:-$hosts}
        tp=${TP:-$(( gpus / pp ))}
        exec jaxinfer serve "$model" --distributed-executor-backend ray \
            --tensor-parallel-size "$tp" --pipeline-parallel-size "$pp" \
            --host "${HOST:-0.0.0.0}" --port "${PORT:-8000}" "$@" ;;
    *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
