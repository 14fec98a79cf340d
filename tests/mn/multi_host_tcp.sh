#!/usr/bin/env bash
# CTest mn_multi_host_tcp: multi-host correctness over TCP on one machine. Pretend hosts are
# network namespaces with their own host names (scripts/pretend_hosts.sh); Open MPI runs across
# them over TCP only. Across 2 hosts of 2 ranks, 3 hosts of 1 + 2 + 1 ranks and 2 hosts of 1 + 2
# ranks (uneven), multi_host_check must find the topology the layout implies and write results
# equal, byte for byte, to a run of as many ranks on one host; a short train_mnist must write the
# same log (all but the elapsed time) as on one host.
#
#   multi_host_tcp.sh --check <multi_host_check> --train-mnist <train_mnist or ""> \
#                     --mpiexec <mpiexec> --work <folder>
#
# Needs root and the right to create namespaces. Where the machine cannot give them, the test
# fails and says so, unless KUSARI_TEST_NO_NAMESPACES=1 declares it (a container without
# CAP_SYS_ADMIN, say): then it exits 77, which CTest reports as skipped, with the reason.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
pretend="$here/../../scripts/pretend_hosts.sh"
check="" mnist="" mpiexec="" work=""
while [ $# -gt 0 ]; do
  case "$1" in
    --check) check=$2; shift 2 ;;
    --train-mnist) mnist=$2; shift 2 ;;
    --mpiexec) mpiexec=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    *) echo "multi_host_tcp.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -x "$check" ] && [ -n "$mpiexec" ] && [ -n "$work" ] ||
  { echo "multi_host_tcp.sh: usage: --check <program> --train-mnist <program or \"\"> --mpiexec <mpiexec> --work <folder>" >&2; exit 2; }

fail() { echo "mn_multi_host_tcp: FAILED: $*" >&2; exit 1; }
export MPIEXEC="$mpiexec"  # the pretend hosts' jobs use the same mpiexec

if [ "${KUSARI_TEST_NO_NAMESPACES:-0}" = 1 ]; then
  echo "mn_multi_host_tcp: SKIPPED: KUSARI_TEST_NO_NAMESPACES=1 says this machine cannot create network namespaces; multi-host runs over TCP were not tested"
  exit 77
fi

rm -rf "$work"
mkdir -p "$work"
# Can this machine make pretend hosts? A job of 2 ranks on 2 of them.
probe=0
"$pretend" --timeout 60 1,1 -- true >"$work/probe.log" 2>&1 || probe=$?
if [ "$probe" != 0 ]; then
  cat "$work/probe.log" >&2
  if [ "$probe" = 3 ]; then
    fail "this machine cannot create the pretend hosts (above: root with CAP_SYS_ADMIN and CAP_NET_ADMIN, iproute2 and util-linux are needed). Run the test as root where namespaces are allowed, or set KUSARI_TEST_NO_NAMESPACES=1 to report it as skipped on a machine that cannot"
  fi
  fail "an MPI job of 2 ranks on 2 pretend hosts did not run (exit status $probe; output above)"
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
one_host() {  # one_host <ranks> <command...>: the reference run, every rank on this host
  local n=$1
  shift
  echo "mn_multi_host_tcp: on one host: $mpiexec -n $n --oversubscribe $*"
  timeout --kill-after=10 300 "$mpiexec" -n "$n" --oversubscribe "$@" || fail "the run on one host failed: $mpiexec -n $n $*"
}
across() {  # across <layout> <command...>: the same job across pretend hosts
  local layout=$1
  shift
  # Each host's link must carry at least 1 MB each way: the gradients and data went over TCP.
  "$pretend" --min-bytes 1000000 --timeout 300 "$layout" -- "$@" || fail "the run across pretend hosts $layout failed: $*"
}
same() {  # same <reference> <other> <what>
  diff -u "$1" "$2" >"$work/diff.txt" ||
    { cat "$work/diff.txt" >&2; fail "$3 differ from the run on one host (diff above: - one host, + pretend hosts)"; }
  echo "mn_multi_host_tcp: $3 equal the run on one host"
}

# --- the data-parallel pieces -------------------------------------------------------------------
one_host 4 "$check" --hosts 4 --out "$work/one_host_4.txt"
one_host 3 "$check" --hosts 3 --out "$work/one_host_3.txt"
for layout in 2,2 1,2,1 1,2; do
  across "$layout" "$check" --hosts "$layout" --out "$work/hosts_$layout.txt"
  ranks=$(( $(echo "$layout" | tr ',' '+') ))
  same "$work/one_host_$ranks.txt" "$work/hosts_$layout.txt" "multi_host_check's results on hosts of $layout ranks"
done

# --- a short train_mnist ------------------------------------------------------------------------
if [ -z "$mnist" ]; then
  echo "mn_multi_host_tcp: train_mnist is not built (KUSARI_BUILD_EXAMPLES=OFF): its run across hosts was left out"
  exit 0
fi
# One BLAS thread per process: by default a process takes the cores divided among its host's
# processes, which changes with the layout and, with it, the GEMMs' summation order.
flags=(-e 1 -u 50 -b 100 --threads 1 --noplot --seed 3)
for run in "naive 2,2" "flat 1,2,1"; do
  read -r comm layout <<<"$run"
  one_host 4 "$mnist" "${flags[@]}" --communicator "$comm" -o "$work/mnist_one_host_$comm"
  across "$layout" "$mnist" "${flags[@]}" --communicator "$comm" -o "$work/mnist_hosts_$layout"
  for d in "$work/mnist_one_host_$comm" "$work/mnist_hosts_$layout"; do
    [ -s "$d/log" ] || fail "train_mnist wrote no $d/log"
    grep -v '"elapsed_time"' "$d/log" >"$d/log.compared"
  done
  grep -q '"validation/main/accuracy"' "$work/mnist_one_host_$comm/log.compared" || fail "train_mnist's log has no validation accuracy"
  same "$work/mnist_one_host_$comm/log.compared" "$work/mnist_hosts_$layout/log.compared" \
    "train_mnist's log entries ($comm communicator, hosts of $layout ranks)"
done
echo "mn_multi_host_tcp: passed"
