#!/usr/bin/env bash
# One axon-agent for one srun or mpirun task (axon-slurm.sbatch,
# axon-mpirun.sh). The task's rank comes from SLURM_PROCID, else
# OMPI_COMM_WORLD_RANK (the agent reads it itself: ax_node_opts_from_env);
# the agent is named wRANK. Rank 0 is the master: it listens on
# AXON_MASTER_ADDR:AXON_MASTER_PORT (29500 by default); the others listen on
# AXON_AGENT_HOST (default: this host's name) with any port and join it.
#   AXON_WORLD_SIZE  nodes in the world: the agents plus the coordinator
#   AXON_BIN         where axon-agent is (default: the one on PATH)
#   AXON_TOKEN_FILE  the world's shared secret (read by the agent)
# Further arguments go to axon-agent (e.g. --device cuda:0).
set -euo pipefail
rank=${SLURM_PROCID:-${OMPI_COMM_WORLD_RANK:-}}
if [[ -z $rank ]]; then
  echo "axon-agent-task: neither SLURM_PROCID nor OMPI_COMM_WORLD_RANK is set" >&2
  exit 2
fi
: "${AXON_MASTER_ADDR:?axon-agent-task: set AXON_MASTER_ADDR (the first node)}"
port=${AXON_MASTER_PORT:-29500}
if [[ $rank == 0 ]]; then
  listen=$AXON_MASTER_ADDR:$port
else
  listen=${AXON_AGENT_HOST:-$(hostname)}:0
fi
agent=axon-agent
[[ -n ${AXON_BIN:-} ]] && agent=$AXON_BIN/axon-agent
exec "$agent" --name "w$rank" --listen "$listen" \
  --world-size "${AXON_WORLD_SIZE:-1}" "$@"
