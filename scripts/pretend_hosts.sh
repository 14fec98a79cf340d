#!/usr/bin/env bash
# Runs an MPI program across pretend hosts on this one machine: each pretend host is a network
# namespace (its own network stack, linked to the others by veth pairs and a bridge) plus a UTS
# namespace (its own host name, which is how kusari groups ranks into hosts: Note [Topology]).
# Open MPI starts its daemons in the other hosts through a launcher agent that enters their
# namespaces (no sshd), and the ranks talk over TCP only (--mca btl tcp,self), so every message
# between two pretend hosts crosses a virtual Ethernet link.
#
#   scripts/pretend_hosts.sh 2,2 -- ./build/examples/mnist/train_mnist -e 1 -u 100
#       2 pretend hosts with 2 ranks each (ranks 0-1 on the first, 2-3 on the second)
#   scripts/pretend_hosts.sh 1,2 -- <program> [args...]
#       uneven: rank 0 alone on the first host, ranks 1-2 on the second
#
# Options (before the host list):
#   --min-bytes N   fail unless every host's link received and sent at least N bytes
#   --timeout S     end the job after S seconds (default 500), so the namespaces are still cleaned
#
# $MPIEXEC names the mpiexec to use (default: the one on PATH). Needs root with the right to
# create namespaces (CAP_SYS_ADMIN, CAP_NET_ADMIN), iproute2 (ip) and util-linux (unshare);
# prints why and exits 3 when it cannot create them. Exits with the
# job's status otherwise (1 when the link check fails). Namespaces and links carry this script's
# process id, so parallel runs do not clash, and are removed on exit, also after a failure;
# namespaces left by a run that was killed (SIGKILL) are removed by the next run.
set -euo pipefail

die() { echo "pretend_hosts.sh: $*" >&2; exit 2; }
min_bytes=0
limit=500
while [ $# -gt 0 ]; do
  case "$1" in
    --min-bytes) [ $# -ge 2 ] || die "--min-bytes needs a number"; min_bytes=$2; shift 2 ;;
    --timeout) [ $# -ge 2 ] || die "--timeout needs a number of seconds"; limit=$2; shift 2 ;;
    -*) die "unknown option '$1' (expected --min-bytes N, --timeout S, then the ranks per host, e.g. 2,2)" ;;
    *) break ;;
  esac
done
[ $# -ge 3 ] && [ "$2" = "--" ] || die "usage: pretend_hosts.sh [--min-bytes N] [--timeout S] <ranks per host, e.g. 2,2 or 1,2> -- <program> [args...]"
[[ "$min_bytes" =~ ^[0-9]+$ ]] || die "--min-bytes must be a number of bytes, got '$min_bytes'"
[[ "$limit" =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a positive number of seconds, got '$limit'"
[[ "$1" =~ ^[1-9][0-9]*(,[1-9][0-9]*)+$ ]] ||
  die "the ranks per host must be two or more positive counts separated by commas (e.g. 2,2 or 1,2), got '$1'"
IFS=, read -r -a slots <<<"$1"
shift 2
if [ "${KUSARI_CHECK_ARGS:-0}" != 0 ]; then echo "pretend_hosts.sh: arguments accepted"; exit 0; fi  # (the docs' commands are checked so)
(( ${#slots[@]} <= 200 )) || die "at most 200 pretend hosts"

cannot() { echo "pretend_hosts.sh: cannot create pretend hosts: $*" >&2; exit 3; }
[ "$(id -u)" = 0 ] || cannot "network namespaces need root (this runs as uid $(id -u))"
mpiexec=${MPIEXEC:-mpiexec}
for tool in ip unshare "$mpiexec" timeout; do
  command -v "$tool" >/dev/null || cannot "'$tool' is not installed (ip: iproute2, unshare: util-linux, mpiexec: openmpi-bin)"
done
"$mpiexec" --version 2>&1 | grep -q -E "Open MPI|OpenRTE" || cannot "the launcher agent is written for Open MPI's mpiexec"

# --- names ---------------------------------------------------------------------------------------
prefix=kusari-ph
tag="$prefix-$$"
ns_of() { echo "$tag-h$1"; }
switch_ns="$tag-sw"
subnet=10.250.0
# Namespaces of earlier runs whose script is gone (killed before its cleanup ran).
for old in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix-[0-9]*-" || true); do
  pid=${old#"$prefix"-}
  pid=${pid%%-*}
  if ! kill -0 "$pid" 2>/dev/null; then ip netns del "$old" 2>/dev/null || true; fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/kusari-pretend-hosts.XXXXXX")
made=()
cleanup() {
  local ns pid
  for ns in "${made[@]}"; do
    # The job's processes still inside (a job that timed out): end them by their ids.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- the network: one bridge in a switch namespace, one veth pair per host -------------------------
ip netns add "$switch_ns" 2>"$work/err" || cannot "'ip netns add' failed: $(cat "$work/err")"
made+=("$switch_ns")
ip -n "$switch_ns" link add br0 type bridge
ip -n "$switch_ns" link set br0 up
hosts=()
for i in "${!slots[@]}"; do
  ns=$(ns_of "$i")
  ip netns add "$ns" 2>"$work/err" || cannot "'ip netns add $ns' failed: $(cat "$work/err")"
  made+=("$ns")
  ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$switch_ns" 2>"$work/err" ||
    cannot "cannot create a veth pair: $(cat "$work/err")"
  ip -n "$switch_ns" link set "p$i" master br0 up
  ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  hosts+=("host$i-$$")
done

# --- Open MPI: a hostfile and a launcher agent that enters a host's namespaces ---------------------
total=0
for i in "${!slots[@]}"; do
  echo "${hosts[$i]} slots=${slots[$i]}" >>"$work/hostfile"
  total=$((total + slots[i]))
done
# mpiexec calls the agent as "<agent> <host> <daemon command words...>" and expects it to run the
# words as a remote shell would (joined, then read by sh), as ssh does.
{
  echo '#!/bin/sh'
  echo 'host=$1; shift'
  echo 'case "$host" in'
  for i in "${!slots[@]}"; do echo "  ${hosts[$i]}) ns=$(ns_of "$i") ;;"; done
  echo '  *) echo "pretend_hosts.sh agent: unknown host $host" >&2; exit 1 ;;'
  echo 'esac'
  echo 'exec ip netns exec "$ns" unshare --uts -- /bin/sh -c '\''hostname "$0" && exec /bin/sh -c "$1"'\'' "$host" "$*"'
} >"$work/agent"
chmod +x "$work/agent"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=("$mpiexec" -n "$total" --hostfile "$work/hostfile"
     --mca plm_rsh_agent "$work/agent" --mca plm_rsh_no_tree_spawn 1
     --mca btl tcp,self --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24"
     --mca pml ob1 --oversubscribe)
echo "pretend_hosts.sh: ${#slots[@]} hosts (${hosts[*]}) with ${slots[*]} ranks, linked by TCP over veth ($subnet.0/24)"
echo "pretend_hosts.sh: ${mpi[*]} $*"
# In the background, so that a signal to this script is handled at once (bash runs traps only
# between commands, and "wait" is one): the EXIT trap then ends the job's processes.
timeout --kill-after=10 "$limit" ip netns exec "$(ns_of 0)" unshare --uts -- \
  /bin/sh -c 'hostname "$0" && exec "$@"' "${hosts[0]}" "${mpi[@]}" "$@" &
status=0
wait $! || status=$?
if [ "$status" = 124 ] || [ "$status" = 137 ]; then
  echo "pretend_hosts.sh: the job ran past ${limit} s and was ended" >&2
fi

# --- what crossed each host's link ----------------------------------------------------------------
short=0
for i in "${!slots[@]}"; do
  ns=$(ns_of "$i")
  rx=$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/rx_bytes)
  tx=$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/tx_bytes)
  echo "pretend_hosts.sh: ${hosts[$i]} ($subnet.$((i + 1))): received $rx bytes, sent $tx bytes over its link"
  if [ "$rx" -lt "$min_bytes" ] || [ "$tx" -lt "$min_bytes" ]; then short=1; fi
done
if [ "$status" = 0 ] && [ "$short" = 1 ]; then
  echo "pretend_hosts.sh: a host's link carried less than --min-bytes $min_bytes bytes in one direction: the ranks did not talk over TCP between the hosts" >&2
  status=1
fi
exit "$status"
