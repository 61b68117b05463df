#!/usr/bin/env bash
# The C sources follow the checked-in .clang-format (Debian 12's
# clang-format 14). `scripts/check_format.sh` lists every file that does
# not and fails; `scripts/check_format.sh --fix` (make format) rewrites them.
set -euo pipefail
cd "$(dirname "$0")/.."
cf=${CLANG_FORMAT:-clang-format}
command -v "$cf" >/dev/null || { echo "check_format: $cf not found (apt-get install clang-format)"; exit 1; }
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh' 2>/dev/null ||
  find kernels models rpc rref runtime agents examples tests \
    -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh')
if [[ ${1:-} == --fix ]]; then
  "$cf" -i --style=file "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! "$cf" --style=file --dry-run --Werror "$f" >/dev/null 2>&1; then
    echo "check_format: $f is not formatted (make format)"
    bad=1
  fi
done
exit $bad
