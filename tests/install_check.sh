#!/usr/bin/env bash
# test_install: installs the already built tree BUILD into a temporary
# prefix (`cmake --install`, no build), then, with nothing but
# `pkg-config --cflags --libs axon`, compiles and runs a program that
# includes every installed public header and uses the library; checks the
# SONAME, that an installed program runs from the prefix (its RUNPATH finds
# the installed libaxon) and that find_package(axon) gives axon::axon.
# Exit 77 (skipped) without pkg-config or a C compiler.
#   tests/install_check.sh BUILD
set -euo pipefail
build=${1:?usage: install_check.sh BUILD}
command -v pkg-config >/dev/null || { echo "install_check: no pkg-config: skipped"; exit 77; }
cc=${CC:-cc}
command -v "$cc" >/dev/null || { echo "install_check: no C compiler: skipped"; exit 77; }
fail() { echo "install_check: FAIL: $*" >&2; exit 1; }

tmp=$(mktemp -d /tmp/axon-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log" >&2; fail "cmake --install $build (build every target first)"; }

# The shared library: a versioned SONAME, with the development symlink.
lib=$(find "$prefix" -name 'libaxon.so' | head -1)
[[ -n $lib ]] || fail "no libaxon.so under $prefix"
soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
[[ $soname =~ ^libaxon\.so\.[0-9]+$ ]] || fail "SONAME is '$soname', want libaxon.so.N"
[[ -f $(dirname "$lib")/$soname ]] || fail "$soname is not installed next to libaxon.so"
for p in axon-agent axon-run axon-bench; do
  [[ -x $prefix/bin/$p ]] || fail "bin/$p is not installed"
done
# The installed agent runs from the prefix alone (RUNPATH $ORIGIN/../lib).
env -u LD_LIBRARY_PATH "$prefix/bin/axon-agent" --help >"$tmp/agent.txt" ||
  fail "installed axon-agent --help failed"
grep -q -- --master "$tmp/agent.txt" || fail "installed axon-agent --help says nothing about --master"
# (ldd's output is kept first: grep -q may close the pipe early, and
# pipefail would then count ldd's SIGPIPE as a failure.)
deps=$(ldd "$prefix/bin/axon-agent")
grep -q "libaxon.so.* => $prefix/" <<<"$deps" || fail "installed axon-agent does not load the installed libaxon"

# A program that includes every public header, compiled with pkg-config only.
headers=$(cat "$build/axon_public_headers.txt")
src=$tmp/prog.c
{
  for h in $headers; do
    [[ -f $prefix/include/axon/$h ]] || fail "include/axon/$h is not installed"
    echo "#include <axon/$h>"
  done
  cat <<'CEOF'
#include <stdio.h>
int main(void) {
  ax_tensor *t = ax_tensor_zeros(AX_F32, 2, (const int64_t[]){3, 4}, AX_CPU);
  if (!t || ax_tensor_numel(t) != 12) return 1;
  ax_tensor_release(t);
  ax_node_opts o;
  ax_node_opts_init(&o);
  printf("axon ok: %zu elements, rank %d, %s\n", (size_t)12, o.rank,
         ax_strerror(AX_ETIMEOUT));
  return 0;
}
CEOF
} >"$src"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
flags=$(pkg-config --cflags --libs axon) || fail "pkg-config --cflags --libs axon"
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Werror -o "$tmp/prog" "$src" $flags || fail "compiling against the prefix: $cc $flags"
out=$(LD_LIBRARY_PATH=$prefix/lib "$tmp/prog") || fail "the program failed"
echo "$out"
[[ $out == "axon ok: 12 elements, rank -1, "* ]] || fail "unexpected output: $out"
deps=$(LD_LIBRARY_PATH=$prefix/lib ldd "$tmp/prog")
grep -q "$soname => $prefix/lib/$soname" <<<"$deps" || fail "the program did not load $prefix/lib/$soname"

# The CMake package: find_package(axon) and axon::axon.
mkdir -p "$tmp/cm"
cat >"$tmp/cm/CMakeLists.txt" <<'CEOF'
cmake_minimum_required(VERSION 3.16)
project(axon_consumer C)
find_package(axon 0.1 REQUIRED)
add_executable(prog prog.c)
target_link_libraries(prog PRIVATE axon::axon)
CEOF
cp "$src" "$tmp/cm/prog.c"
cmake -S "$tmp/cm" -B "$tmp/cm/b" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/cm.log" 2>&1 &&
  cmake --build "$tmp/cm/b" >>"$tmp/cm.log" 2>&1 ||
  { cat "$tmp/cm.log" >&2; fail "find_package(axon) consumer"; }
out=$(LD_LIBRARY_PATH=$prefix/lib "$tmp/cm/b/prog") || fail "the find_package program failed"
[[ $out == "axon ok: "* ]] || fail "unexpected output: $out"
echo "install_check: ok ($soname, $(echo $headers | wc -w) headers, pkg-config and find_package)"
