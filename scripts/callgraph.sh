#!/usr/bin/env bash
# The call graph between the .c files of rpc/, rref/ and runtime/ (all
# folders below them too) has no circle. Each function defined in those
# files is mapped to its file (universal-ctags); an edge A -> B is a call,
# found by cscope, from a function of A to a non-static function of B
# (A != B). A circle is a strongly connected component of more than one
# file: the script prints each one with the calls that make it and exits 1;
# with none it prints a summary and exits 0.
#
# Calls through function pointers (hooks, vtables) are not edges: a
# subsystem's start-up file registers its parts' hooks, and the parts never
# call the start-up file back. Calls hidden in macros are not seen.
#
# Usage: scripts/callgraph.sh [--edges]   (--edges also lists every edge)
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's universal-ctags also installs itself as ctags-universal, which
# another ctags package cannot take over.
ctags=ctags
command -v ctags-universal >/dev/null && ctags=ctags-universal
for tool in cscope "$ctags"; do
  command -v "$tool" >/dev/null ||
    { echo "callgraph: $tool not found (scripts/deps.sh installs it)"; exit 1; }
done
"$ctags" --version 2>/dev/null | grep -q 'Universal Ctags' ||
  { echo "callgraph: $ctags is not universal-ctags"; exit 1; }
show_edges=0
[[ ${1:-} == --edges ]] && show_edges=1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export LC_ALL=C
find rpc rref runtime -name '*.c' | sort >"$tmp/files"

# Definitions: name, file, "static" or "-".
"$ctags" -x --kinds-C=f --language-force=C \
  --_xformat='%N	%F	%{C.properties}' -L "$tmp/files" |
  awk -F'\t' '{ print $1 "\t" $2 "\t" ($3 ~ /static/ ? "static" : "-") }' |
  sort -u >"$tmp/defs"

# Callers of every non-static function, one cscope process for all queries.
awk -F'\t' '$3 == "-" { print $1 }' "$tmp/defs" >"$tmp/queries"
cscope -b -q -k -i "$tmp/files" -f "$tmp/db"
sed 's/^/3/' "$tmp/queries" | cscope -d -l -f "$tmp/db" >"$tmp/callers"

# Edges, then circles (mutual reachability over the transitive closure).
awk -v show_edges="$show_edges" '
  FILENAME ~ /files$/ { names[++n] = $0; next }
  FILENAME ~ /defs$/ {
    if ($3 == "static") {
      stat[$2 SUBSEP $1] = 1
    } else if ($1 in glob) { # two programs may; the library may not
      printf "callgraph: %s is defined in %s and %s\n", $1, glob[$1], $2
      dup = 1
    } else {
      glob[$1] = $2
    }
    next
  }
  FILENAME ~ /queries$/ { queries[++nqueries] = $0; next }
  # Each query answers ">> cscope: N lines" and N lines, or ">> Unable to
  # search database" when the name is called nowhere.
  /^>> / { q = queries[++nq]; next }
  {
    file = $1; caller = $2; line = $3
    callee = q; to = glob[callee]
    if (to == "" || file == to || file !~ /\.c$/) next
    if ((file SUBSEP callee) in stat) next
    edge[file SUBSEP to] = 1
    why[file SUBSEP to] = why[file SUBSEP to] sprintf("    %s:%s %s() -> %s()\n",
                                                       file, line, caller, callee)
  }
  END {
    if (nq != nqueries + 1 && nq != nqueries) {
      printf "callgraph: cscope answered %d of %d queries\n", nq, nqueries
      exit 2
    }
    if (dup)
      exit 2
    # names[] is sorted (the file list is): the output does not depend on
    # the order of awk arrays.
    for (i = 1; i <= n; i++) idx[names[i]] = i
    for (e in edge) { split(e, p, SUBSEP); r[idx[p[1]], idx[p[2]]] = 1; ne++ }
    for (k = 1; k <= n; k++)
      for (i = 1; i <= n; i++)
        if ((i, k) in r)
          for (j = 1; j <= n; j++)
            if ((k, j) in r) r[i, j] = 1
    if (show_edges)
      for (i = 1; i <= n; i++)
        for (j = 1; j <= n; j++)
          if ((names[i] SUBSEP names[j]) in edge)
            printf "edge %s -> %s\n%s", names[i], names[j], why[names[i] SUBSEP names[j]]
    circles = 0
    for (i = 1; i <= n; i++) {
      if (i in done) continue
      members = names[i]; m = 1; set[1] = i
      for (j = i + 1; j <= n; j++)
        if (((i, j) in r) && ((j, i) in r)) { set[++m] = j; done[j] = 1 }
      if (m < 2) continue
      circles++
      printf "callgraph: circle %d, %d files:", circles, m
      for (a = 1; a <= m; a++) printf " %s", names[set[a]]
      printf "\n"
      for (a = 1; a <= m; a++)
        for (b = 1; b <= m; b++)
          if ((names[set[a]] SUBSEP names[set[b]]) in edge)
            printf "  %s -> %s\n%s", names[set[a]], names[set[b]],
                   why[names[set[a]] SUBSEP names[set[b]]]
    }
    if (circles) {
      printf "callgraph: %d circle(s) between files\n", circles
      exit 1
    }
    printf "callgraph: no circle (%d files, %d edges)\n", n, ne
  }
' "$tmp/files" "$tmp/defs" "$tmp/queries" "$tmp/callers"
