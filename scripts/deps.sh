#!/usr/bin/env bash
# Installs the Debian packages axon needs, only when some are missing
# (idempotent; run as root on Debian 12).
set -euo pipefail
# gnuplot-nox draws the plots of scripts/convergence.sh.
pkgs=(build-essential cmake pkg-config zlib1g-dev libgrpc-dev protobuf-c-compiler
      libprotobuf-c-dev libevent-dev libcmocka-dev libopenblas-dev libssl-dev openssl
      dataset-fashion-mnist dict-gcide gnuplot-nox
      iproute2 # the many-hosts test bed (tests/netns/netbed.sh)
      clang libfuzzer-14-dev libomp-dev # the fuzz build (tests/fuzz, make fuzz)
      clang-format # make format and its check (scripts/check_format.sh)
      cscope universal-ctags) # the call graph check (scripts/callgraph.sh)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
