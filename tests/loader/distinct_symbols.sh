#!/usr/bin/env bash
# Fails when two of kusari's shared libraries define the same (non-inline) function or object.
# The GPU and NCCL libraries are loaded at run time beside libkusari; a function defined in both
# (the same name and signature in the same namespace) is resolved by the dynamic linker to the first definition
# loaded, so the plugin's own calls of it land in libkusari instead (a public wrapper that calls
# into the plugin then recurses until the stack overflows).
#
#   distinct_symbols.sh <library>...
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: distinct_symbols.sh <library> <library>..." >&2; exit 2; }
command -v nm >/dev/null || { echo "distinct_symbols.sh: nm (binutils) is needed" >&2; exit 2; }
defined() { nm -D --defined-only "$1" | awk '$2 == "T" || $2 == "D" || $2 == "B" || $2 == "R" {print $3}' | sort -u; }
status=0
libs=("$@")
for ((i = 0; i < ${#libs[@]}; ++i)); do
  for ((j = i + 1; j < ${#libs[@]}; ++j)); do
    both=$(comm -12 <(defined "${libs[$i]}") <(defined "${libs[$j]}") | grep -v -E '^_(init|fini|edata|end|_bss_start)$' || true)
    if [ -n "$both" ]; then
      echo "defined in both $(basename "${libs[$i]}") and $(basename "${libs[$j]}"):"
      echo "$both" | c++filt | sed 's/^/  /'
      status=1
    fi
  done
done
[ $status = 0 ] && echo "no function or object is defined in two of: ${libs[*]##*/}"
exit $status
