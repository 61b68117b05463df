#!/usr/bin/env bash
# Open MPI: one axon-agent per rank (mpirun), rank 0's agent the master on
# the first host, and the coordinator (axon-run) here, on the first host.
#   scripts/launch/axon-mpirun.sh HOST1,HOST2,... [axon-run train flags]
# Needs axon on every host (the axon and libaxon0 packages, or AXON_BIN)
# and this script at the same path there. AXON_TOKEN_FILE (the world's
# secret) must exist at the same path on every host.
set -euo pipefail
hosts=${1:?usage: axon-mpirun.sh HOST1,HOST2,... [axon-run train flags]}
shift
launch=$(dirname "$(readlink -f "$0")")
run=axon-run
[[ -n ${AXON_BIN:-} ]] && run=$AXON_BIN/axon-run
IFS=, read -r -a list <<<"$hosts"
n=${#list[@]}
export AXON_MASTER_ADDR=${AXON_MASTER_ADDR:-${list[0]}}
export AXON_MASTER_PORT=${AXON_MASTER_PORT:-29500}
export AXON_WORLD_SIZE=$((n + 1)) # the agents and the coordinator
vars=(-x AXON_MASTER_ADDR -x AXON_MASTER_PORT -x AXON_WORLD_SIZE)
[[ -n ${AXON_BIN:-} ]] && vars+=(-x AXON_BIN)
[[ -n ${AXON_TOKEN_FILE:-} ]] && vars+=(-x AXON_TOKEN_FILE)
mpirun -np "$n" --host "$hosts" "${vars[@]}" bash "$launch/axon-agent-task.sh" &
launcher=$!
agents=$(seq -s, -f 'w%g' 0 $((n - 1)))
if [[ $# -eq 0 ]]; then
  set -- --model resnet20 --dataset fashion-mnist --mode pipedream \
    --steps 300 --batch 32 --csv pipeline_metrics.csv
fi
rc=0
"$run" train --agents "$agents" --master "$AXON_MASTER_ADDR:$AXON_MASTER_PORT" "$@" || rc=$?
# The agents serve until told to stop: mpirun passes SIGTERM on to them, and
# each then shuts down and exits 0 (mpirun's own status after the signal says
# nothing more: the coordinator's is the job's).
kill -TERM "$launcher" 2>/dev/null || true
wait "$launcher" || true
exit "$rc"
