#!/usr/bin/env bash
# test_launch: runs scripts/launch/axon-mpirun.sh and axon-slurm.sbatch on
# this machine, with stand-ins for mpirun and srun (on PATH first) that
# start every task here with OMPI_COMM_WORLD_RANK or SLURM_PROCID set, as
# the real ones do. The agents get their rank and the master's address
# from the environment only; the coordinator trains a small MLP over them
# and the launcher stops the agents; every agent must exit 0.
#   tests/launch_check.sh SOURCE BUILD
set -euo pipefail
src=${1:?usage: launch_check.sh SOURCE BUILD}
build=$(readlink -f "${2:?usage: launch_check.sh SOURCE BUILD}")
fail() { echo "launch_check: FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d /tmp/axon-launch.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"

# The stand-ins: `run_tasks N VAR TAG CMD ARGS` starts N copies of CMD here,
# copy i with VAR=i, its output in $LAUNCH_LOG.TAGi and its exit status in
# $LAUNCH_LOG.status.TAGi; SIGTERM is passed on to the copies, as mpirun
# and srun do.
cat >"$tmp/bin/run_tasks" <<'SH'
#!/usr/bin/env bash
n=$1 var=$2 tag=$3
shift 3
pids=()
for ((i = 0; i < n; i++)); do
  (
    trap 'kill -TERM $c 2>/dev/null' TERM
    env "$var=$i" "$@" >"$LAUNCH_LOG.$tag$i" 2>&1 &
    c=$!
    while :; do
      wait $c && st=0 || st=$?
      kill -0 $c 2>/dev/null || break # else the trap interrupted the wait
    done
    echo $st >"$LAUNCH_LOG.status.$tag$i"
  ) &
  pids+=($!)
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM
for p in "${pids[@]}"; do
  while kill -0 "$p" 2>/dev/null; do wait "$p" || true; done
done
SH
# mpirun -np N --host H -x VAR ... CMD ARGS: rank i in OMPI_COMM_WORLD_RANK.
cat >"$tmp/bin/mpirun" <<'SH'
#!/usr/bin/env bash
n=1
while [[ $# -gt 0 ]]; do
  case $1 in
  -np) n=$2; shift 2 ;;
  --host | -x) shift 2 ;;
  *) break ;;
  esac
done
exec run_tasks "$n" OMPI_COMM_WORLD_RANK mpi "$@"
SH
# srun [--flags] CMD ARGS: SLURM_NTASKS copies, rank i in SLURM_PROCID.
cat >"$tmp/bin/srun" <<'SH'
#!/usr/bin/env bash
while [[ $1 == --* ]]; do shift; done
exec run_tasks "$SLURM_NTASKS" SLURM_PROCID slurm "$@"
SH
chmod +x "$tmp/bin/run_tasks" "$tmp/bin/mpirun" "$tmp/bin/srun"
export PATH=$tmp/bin:$PATH AXON_BIN=$build AXON_MASTER_ADDR=127.0.0.1
export AXON_AGENT_HOST=127.0.0.1 LAUNCH_LOG=$tmp/log
# A fresh secret for these worlds.
export AXON_TOKEN_FILE=$tmp/token
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$AXON_TOKEN_FILE"
chmod 600 "$AXON_TOKEN_FILE"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
train=(--model mlp --dataset synthetic --steps 20 --batch 16 --eval-limit 64)

check() { # NAME LOGPREFIX OUT
  grep -q "summary" "$3" || { cat "$3" "$2"[0-9]* >&2; fail "$1: no summary from the coordinator"; }
  for f in "$2"[0-9]*; do
    grep -q "rank [0-9] of " "$f" || { cat "$f" >&2; fail "$1: $f did not join"; }
    st=$(cat "${f/log./log.status.}" 2>/dev/null || echo none)
    [[ $st == 0 ]] || { cat "$f" >&2; fail "$1: agent ${f##*.} exited with status $st"; }
  done
  echo "launch_check: $1 ok ($(ls "$2"[0-9]* | wc -l) agents joined from the environment)"
}

AXON_MASTER_PORT=$(free_port) timeout 120 \
  bash "$src/scripts/launch/axon-mpirun.sh" h1,h2,h3 "${train[@]}" >"$tmp/mpi.out" 2>&1 ||
  { cat "$tmp/mpi.out" "$tmp"/log.mpi* >&2; fail "axon-mpirun.sh"; }
check mpirun "$tmp/log.mpi" "$tmp/mpi.out"

AXON_MASTER_PORT=$(free_port) SLURM_NTASKS=2 SLURM_JOB_NODELIST=n[1-2] timeout 120 \
  bash "$src/scripts/launch/axon-slurm.sbatch" "${train[@]}" >"$tmp/slurm.out" 2>&1 ||
  { cat "$tmp/slurm.out" "$tmp"/log.slurm* >&2; fail "axon-slurm.sbatch"; }
check slurm "$tmp/log.slurm" "$tmp/slurm.out"
