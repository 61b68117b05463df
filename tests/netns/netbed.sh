#!/usr/bin/env bash
# The many-hosts test bed: N network namespaces on this machine, each a
# "host" with one address (10.77.0.1 ...), joined by links that
# axon-linkemu shapes (delay, jitter, rate, loss: this kernel has no netem,
# see tests/netns/axon_linkemu.c). One agent per host, the master on the
# first; everything runs on the namespaces' addresses only, with a token.
#
#   tests/netns/netbed.sh test BUILD_DIR        the tests (ctest test_netns)
#   tests/netns/netbed.sh shell BUILD_DIR PROFILE N   a bed to try things in:
#                                               prints how to reach it, and
#                                               removes it on Enter
#   tests/netns/netbed.sh compare BUILD_DIR [PROFILE...]  the timing model
#                                               against the bed: probe, plan,
#                                               then train the plan's choice
#                                               and two other modes; a table
#                                               of predicted and measured
#                                               ms per step (NETBED_STEPS,
#                                               NETBED_PLAN_ARGS)
# NETBED_PROFILES picks test's profiles; NETBED_KEEP=1 keeps the logs.
#
# Profiles (one-way delay, rate, loss; every link the same unless said):
#   lan     0.1 ms, 10 Gbit
#   dc      0.5 ms, 25 Gbit
#   wan     20 ms, 1 Gbit, 0.01% loss
#   skewed  lan, but the link between the last two hosts 2 ms, 200 Mbit
#   none    no shaping (what the emulator itself costs; not in test)
#
# Before the tests on a profile, the bed checks its own shaping with
# `axon-run probe` (every pair of agents: round trip of a small call, and
# Gbit/s): a round trip below twice the link's delay, or a rate above the
# link's, means the shaping does not hold, and the test fails. The tests:
# pipeline training over 4 hosts in several modes, the parameter server,
# the data-parallel ring, and a link cut in the middle of a run (`ip link
# set down`), which must end the run with a dead peer within its deadline.
# Needs root, `ip` (iproute2) and /dev/net/tun; exits 77 (skip) without
# them. The namespaces, the emulator and every process go away at the end,
# also after a failure (trap).
set -uo pipefail

cmd=${1:-}
build=$(cd "${2:-build}" 2>/dev/null && pwd) || { echo "netbed: no build dir" >&2; exit 2; }
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tag=axb$$ # namespace names: unique per run
work=$(mktemp -d /tmp/axon-netbed.XXXXXX)
hosts=0
emu_pid=
pids=()
failures=0

skip() { echo "netbed: skipped: $*"; rm -rf "$work"; exit 77; }

prereq() {
  [[ $(id -u) -eq 0 ]] || skip "needs root (network namespaces)"
  command -v ip >/dev/null || skip "needs ip (Debian package iproute2)"
  [[ -c /dev/net/tun ]] || skip "needs /dev/net/tun"
  ip netns add "$tag-probe" 2>/dev/null || skip "cannot create network namespaces here"
  ip netns del "$tag-probe"
  for b in axon-agent axon-run axon-linkemu param_server data_parallel; do
    [[ -x $build/$b ]] || { echo "netbed: $build/$b missing" >&2; exit 2; }
  done
}

cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  pkill -KILL -P $$ 2>/dev/null # whatever else this script started
  [[ -n $emu_pid ]] && kill "$emu_pid" 2>/dev/null && wait "$emu_pid" 2>/dev/null
  for ((i = 0; i < hosts; i++)); do ip netns del "$tag-h$i" 2>/dev/null; done
  if [[ -n ${NETBED_KEEP:-} ]]; then echo "netbed: logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

addr() { echo "10.77.0.$(($1 + 1))"; }
# On host H: ip netns exec "$tag-hH" CMD. Started with & directly (not
# through a shell function, which would run in a subshell), $! is CMD
# itself (ip execs it), so it can be signalled.
inns() { local h=$1; shift; ip netns exec "$tag-h$h" "$@"; }

# profile_spec PROFILE: "DELAY_MS RATE_MBIT LOSS" of its links.
profile_spec() {
  case $1 in
    lan) echo "0.1 10000 0" ;;
    dc) echo "0.5 25000 0" ;;
    wan) echo "20 1000 0.0001" ;;
    skewed) echo "0.1 10000 0" ;;
    none) echo "0 0 0" ;; # no shaping: the emulator's own cost
    *) echo "netbed: unknown profile $1" >&2; exit 2 ;;
  esac
}

# bed_up PROFILE N: N namespaces, their links shaped as PROFILE.
bed_up() {
  local prof=$1 n=$2 spec delay rate loss extra=()
  spec=$(profile_spec "$prof") || return 1
  read -r delay rate loss <<<"$spec"
  spec="delay_ms=$delay,rate_mbit=$rate,loss=$loss"
  [[ $prof == skewed ]] && extra=(--link "$((n - 2))-$((n - 1)):delay_ms=2,rate_mbit=200")
  local args=()
  for ((i = 0; i < n; i++)); do
    ip netns add "$tag-h$i" || return 1
    hosts=$((i + 1))
    ip -n "$tag-h$i" link set lo up
    args+=("$tag-h$i:$(addr "$i")")
  done
  rm -f "$work/emu.ready"
  "$build/axon-linkemu" --ready "$work/emu.ready" --default "$spec" "${extra[@]}" \
    "${args[@]}" 2>"$work/emu.log" &
  emu_pid=$!
  for _ in $(seq 100); do [[ -s $work/emu.ready ]] && break; sleep 0.05; done
  [[ -s $work/emu.ready ]] || { cat "$work/emu.log"; return 1; }
  for ((i = 0; i < n; i++)); do
    ip -n "$tag-h$i" addr add "$(addr "$i")/24" dev ax0 &&
      ip -n "$tag-h$i" link set ax0 mtu 65000 up || return 1
  done
  echo "netbed: $n hosts, profile $prof ($spec${extra[*]:+; ${extra[*]}})"
}

bed_down() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  pids=()
  [[ -n $emu_pid ]] && { kill "$emu_pid"; wait "$emu_pid" 2>/dev/null; }
  emu_pid=
  for ((i = 0; i < hosts; i++)); do ip netns del "$tag-h$i"; done
  hosts=0
}

# The hosts share this machine's cores: host I's processes run on core
# I mod cores, with one compute thread (as --local agents do), so that no
# two OpenMP pools spin on one core.
cores=$(nproc)
pin() { # pin HOST: the taskset prefix of that host's processes
  command -v taskset >/dev/null && echo taskset -c $(($1 % cores))
}
export AXON_THREADS=1

# agents_up N: agent hI on host I (h0 the master, world of N agents and one
# coordinator).
agents_up() {
  local n=$1
  for ((i = 0; i < n; i++)); do
    local extra=(--master "$(addr 0):29500")
    ((i == 0)) && extra=(--world-size $((n + 1)))
    # shellcheck disable=SC2046  # pin's words on purpose
    ip netns exec "$tag-h$i" $(pin "$i") "$build/axon-agent" --name "h$i" \
      --listen "$(addr "$i"):29500" "${extra[@]}" --threads 4 \
      >"$work/agent-h$i.log" 2>&1 &
    pids+=($!)
  done
}

agents_down() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  pids=()
}

# coord ARGS...: axon-run on host 0 against the agents.
coord_args=(--agents h0,h1,h2,h3 --master "$(addr 0):29500" --listen "$(addr 0):29600")
coord() {
  local sub=$1
  shift
  inns 0 "$build/axon-run" "$sub" "${coord_args[@]}" "$@"
}

check() { # check NAME CMD...: runs, reports, counts failures
  local name=$1
  shift
  local t0=$SECONDS
  if "$@"; then
    echo "netbed: PASS $name ($((SECONDS - t0)) s)"
  else
    echo "netbed: FAIL $name ($((SECONDS - t0)) s)"
    failures=$((failures + 1))
  fi
}

# verify PROFILE: probe every pair; round trips >= 2 x delay, rates <= the
# link's (+10%), and slow links (<= 1 Gbit) at >= 30% of their rate.
verify() {
  local prof=$1 delay rate loss
  read -r delay rate loss <<<"$(profile_spec "$prof")"
  agents_up 4
  coord probe --iters 20 --bytes 16M --out "$work/probe.txt" >"$work/probe.log" 2>&1 ||
    { cat "$work/probe.log"; agents_down; return 1; }
  agents_down
  grep -- '->' "$work/probe.log"
  awk -v d="$delay" -v r="$rate" -v prof="$prof" '
    /^#/ { next }
    {
      ld = d; lr = r
      if (prof == "skewed" && (($1 == "h2" && $2 == "h3") || ($1 == "h3" && $2 == "h2"))) { ld = 2; lr = 200 }
      rtt_ms = $3 / 1000; mbit = $4 * 1000
      bad = ""
      if (rtt_ms < 2 * ld * 0.95) bad = bad " round trip below 2 x " ld " ms"
      if (mbit > lr * 1.10) bad = bad " rate above " lr " Mbit"
      if (lr <= 1000 && mbit < lr * 0.30) bad = bad " rate below 30% of " lr " Mbit"
      printf "  %s -> %s: %.2f ms (link %.1f ms one way), %.0f Mbit/s (link %d)%s\n", $1, $2, rtt_ms, ld, mbit, lr, bad ? " BAD:" bad : ""
      if (bad) fail = 1
    }
    END { exit fail }' "$work/probe.txt"
}

train() { # train MODE [more axon-run options]
  local mode=$1
  shift
  agents_up 4
  coord train --model mlp --model-config widths=784/256/256/128/10 --mode "$mode" --steps 20 --batch 64 --eval-limit 500 \
    --quiet "$@" >"$work/train-$mode.log" 2>&1
  local rc=$?
  agents_down
  grep -E "samples/s|accuracy" "$work/train-$mode.log" | tail -2
  ((rc == 0)) || tail -20 "$work/train-$mode.log"
  return $rc
}

param_server() { # a server on h0 and a trainer on each of h1..h3
  local n=3
  ip netns exec "$tag-h0" "$build/param_server" --rank 0 --world-size $((n + 1)) \
    --master "$(addr 0):29700" --steps 30 --eval-limit 500 \
    >"$work/ps-0.log" 2>&1 &
  local server=$!
  local tp=()
  for ((i = 1; i <= n; i++)); do
    ip netns exec "$tag-h$i" "$build/param_server" --rank "$i" --world-size $((n + 1)) \
      --master "$(addr 0):29700" --listen "$(addr "$i"):29700" --steps 30 \
      --eval-limit 500 >"$work/ps-$i.log" 2>&1 &
    tp+=($!)
  done
  local rc=0
  for p in "${tp[@]}" "$server"; do wait "$p" || rc=1; done
  tail -2 "$work/ps-0.log"
  return $rc
}

data_parallel() { # the ring all-reduce over 4 hosts
  local rp=() rc=0
  for ((i = 0; i < 4; i++)); do
    ip netns exec "$tag-h$i" "$build/data_parallel" --rank "$i" --world-size 4 \
      --master "$(addr 0):29800" --listen "$(addr "$i"):29800" --steps 30 \
      --eval-limit 500 --quiet >"$work/dp-$i.log" 2>&1 &
    rp+=($!)
  done
  for p in "${rp[@]}"; do wait "$p" || rc=1; done
  tail -2 "$work/dp-0.log"
  return $rc
}

# link_cut: h2's link goes down 3 s into a long run; the run must end with
# a dead peer named, within the peer timeout and some slack (15 s).
link_cut() {
  agents_up 4
  ip netns exec "$tag-h0" "$build/axon-run" train "${coord_args[@]}" \
    --model mlp --model-config widths=784/256/256/128/10 --mode 1f1b \
    --epochs 100 --quiet >"$work/cut.log" 2>&1 &
  local run=$!
  pids+=("$run")
  sleep 3
  local t0=$SECONDS
  ip -n "$tag-h2" link set ax0 down
  local waited=0
  while kill -0 "$run" 2>/dev/null && ((waited < 150)); do
    sleep 0.1
    waited=$((waited + 1))
  done
  local dt=$((SECONDS - t0)) rc=0
  if kill -0 "$run" 2>/dev/null; then
    kill -9 "$run"
    rc=1
  fi
  wait "$run"
  local exit_rc=$?
  ip -n "$tag-h2" link set ax0 up
  agents_down
  echo "  run ended ${dt} s after the cut (exit $exit_rc): $(grep -m1 -iE 'down|lost' "$work/cut.log")"
  ((rc == 0 && exit_rc != 0)) && grep -qiE "h2.*(down|lost)|(down|lost).*h2" "$work/cut.log"
}

run_tests() {
  prereq
  local tok="$work/token"
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tok"
  export AXON_TOKEN_FILE=$tok
  export AXON_BIN_DIR=$build
  for prof in ${NETBED_PROFILES:-lan dc wan skewed}; do
    bed_up "$prof" 4 || { echo "netbed: cannot build the bed"; exit 1; }
    check "$prof: shaping (axon-run probe)" verify "$prof"
    case $prof in
      lan)
        check "lan: pipeline gpipe, K = 4" train gpipe
        check "lan: pipeline 1f1b, K = 4" train 1f1b
        check "lan: pipeline pipedream, K = 4" train pipedream
        check "lan: parameter server, 3 trainers" param_server
        check "lan: data-parallel ring, 4 replicas" data_parallel
        check "lan: a link cut mid-run is a dead peer" link_cut
        ;;
      dc) check "dc: pipeline zb-h1, K = 4" train zb-h1 ;;
      wan) check "wan: pipeline 1f1b, K = 4" train 1f1b ;;
      skewed) # the partitioner weighs the slow link (axon-run probe's file)
        check "skewed: pipeline gpipe, K = 4, balanced over the links" \
          train gpipe --partition balanced --links "$work/probe.txt" ;;
    esac
    bed_down
  done
  echo "netbed: $failures failure(s)"
  ((failures == 0))
}

# compare PROFILE: probe, plan, then the plan's choice and two more modes
# trained for real; rows "profile mode predicted measured ratio".
compare_one() {
  local prof=$1 steps=${NETBED_STEPS:-200}
  local model=(--model mlp --model-config widths=784/1024/1024/1024/10 --batch 256
    --microbatches 4 --optim opt=sgd,lr=0.05,momentum=0.9)
  agents_up 4
  coord probe --iters 20 --bytes 16M --out "$work/probe-$prof.txt" >/dev/null 2>&1 ||
    { agents_down; return 1; }
  agents_down
  # shellcheck disable=SC2086  # word splitting on purpose
  # 4 hosts on this machine's cores: each computes at cores / 4 of a core
  # when all are busy (--compute-scale)
  "$build/axon-run" plan --stages 4 --agents h0,h1,h2,h3 --links "$work/probe-$prof.txt" \
    --compute-scale "$(awk -v c="$cores" 'BEGIN { s = 4 / c; print s < 1 ? 1 : s }')" \
    "${model[@]}" ${NETBED_PLAN_ARGS:-} >"$work/plan-$prof.txt" 2>&1 || { cat "$work/plan-$prof.txt"; return 1; }
  local best
  best=$(sed -n 's/^plan: mode=\([a-z0-9-]*\) .*/\1/p' "$work/plan-$prof.txt")
  local modes=("$best") m
  for m in 1f1b gpipe pipedream ddg; do
    [[ ${#modes[@]} -lt 3 && $m != "$best" ]] && modes+=("$m")
  done
  for m in "${modes[@]}"; do
    local pred meas
    pred=$(awk -v m="$m" '$1 == m && $2 == "uniform" { print $4 }' "$work/plan-$prof.txt")
    agents_up 4
    coord train "${model[@]}" --mode "$m" --steps "$steps" --eval-limit 100 --quiet \
      >"$work/cmp-$prof-$m.log" 2>&1
    agents_down
    meas=$(sed -n 's/.* ms_per_step=\([0-9.]*\).*/\1/p' "$work/cmp-$prof-$m.log")
    [[ -n $meas && -n $pred ]] || { tail -5 "$work/cmp-$prof-$m.log"; return 1; }
    awk -v p="$prof" -v m="$m" -v a="$pred" -v b="$meas" -v best="$best" \
      'BEGIN { printf "| %s | %s%s | %.2f | %.2f | %.2f |\n", p, m, m == best ? " (plan)" : "", a, b, b / a }' \
      | tee -a "$work/compare.md"
  done
}

run_compare() {
  prereq
  local tok="$work/token"
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tok"
  export AXON_TOKEN_FILE=$tok AXON_BIN_DIR=$build
  echo "| profile | mode | predicted ms/step | measured ms/step | measured / predicted |"
  echo "|---|---|---|---|---|"
  local profs=("$@")
  ((${#profs[@]})) || profs=(lan dc wan skewed)
  for prof in "${profs[@]}"; do
    bed_up "$prof" 4 >/dev/null || exit 1
    compare_one "$prof" || echo "netbed: compare on $prof failed"
    bed_down
  done
}

case $cmd in
  test) run_tests ;;
  compare) shift 2; run_compare "$@" ;;
  shell)
    prereq
    bed_up "${3:-lan}" "${4:-4}" || exit 1
    echo "netbed: hosts $tag-h0.. at 10.77.0.1..; run: ip netns exec $tag-h0 CMD"
    read -r -p "Enter removes the bed " _
    ;;
  *) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
