#!/usr/bin/env bash
# Several hosts without Ray: one process per host, one JAX program over all
# of them (jax.distributed). Run the same command on every host; only
# PROCESS_ID differs. Process 0 serves HTTP and schedules; the others run
# its steps and serve nothing.
#
#   COORDINATOR=host0:1234 NUM_HOSTS=2 PROCESS_ID=0 scripts/serve_multi_host.sh MODEL
#   COORDINATOR=host0:1234 NUM_HOSTS=2 PROCESS_ID=1 scripts/serve_multi_host.sh MODEL
#
# Layout (default): tensor parallel over each host's GPUs, one pipeline stage
# per host (TP and PP override it; TP x PP must equal every GPU of every host).
# Under SLURM, Open MPI or Kubernetes leave COORDINATOR/NUM_HOSTS/PROCESS_ID
# unset: JAX detects them (--distributed-executor-backend external_launcher).
set -euo pipefail
model=${1:?usage: $0 MODEL [jaxinfer serve flags]}
shift
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l || true)
hosts=${NUM_HOSTS:-${SLURM_NNODES:-1}}
tp=${TP:-$(( gpus > 0 ? gpus : 1 ))}
pp=${PP:-$hosts}
if [[ -n "${COORDINATOR:-}" ]]; then
    launch=(--distributed-coordinator "$COORDINATOR" --num-processes "$hosts"
            --process-id "${PROCESS_ID:?set PROCESS_ID (0 on the serving host)}")
else
    launch=(--distributed-executor-backend external_launcher)
fi
exec jaxinfer serve "$model" "${launch[@]}" \
    --tensor-parallel-size "$tp" --pipeline-parallel-size "$pp" \
    --host "${HOST:-0.0.0.0}" --port "${PORT:-8000}" "$@"
