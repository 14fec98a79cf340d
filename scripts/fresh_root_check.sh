#!/usr/bin/env bash
# Proves the README's two commands on a fresh Debian 12 machine: builds (once, then cached) a
# minimal Debian 12 root with debootstrap, copies it, puts this checkout's committed tree into the
# copy, and runs the README's commands there as a new user would, as root inside a chroot:
#
#   scripts/run_mnist.sh [-- <train_mnist flags>]     the main job (CPUs, mpiexec -n 2)
#   scripts/test.sh                                   every test
#   /usr/bin/python3 -c "import kusari"               the Python package, from any folder
#
# A machine that earlier installed packages by hand cannot hide a missing install step here: the
# root starts with Debian's minimal package set and nothing else. Anything that fails — the
# base root cannot be built, a mount fails, a command fails — ends this script non-zero; it never
# skips.
#
#   scripts/fresh_root_check.sh                       both commands (main job: -e 1)
#   KUSARI_FRESH_MNIST_ARGS="-e 2" scripts/fresh_root_check.sh
#   scripts/fresh_root_check.sh --first-model         only the main job's first model, timed as a new
#        user meets it: `scripts/run_mnist.sh -- -e 1` with an empty package cache (every package
#        downloaded), from the command to the trained model; prints the minutes it took
#   KUSARI_FRESH_INSTALL=<prefix> scripts/fresh_root_check.sh
#        also copies an install of kusari made on this machine (cmake --install) into the root
#        and builds and runs tests/install_consumer against it there: one install serves a
#        machine without CUDA libraries
#
# Needs root (debootstrap, mount, chroot) and the distribution's package archive. The base root
# and the package cache live in $KUSARI_FRESH_CACHE (default /var/cache/kusari-fresh-root); delete
# it to start from nothing.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${KUSARI_FRESH_CACHE:-/var/cache/kusari-fresh-root}
suite=bookworm
mnist_args=${KUSARI_FRESH_MNIST_ARGS:--e 1}
first_model=0
for arg in "$@"; do
  case "$arg" in
    --first-model) first_model=1 ;;
    *) echo "fresh_root_check.sh: unknown argument '$arg' (expected --first-model)" >&2; exit 2 ;;
  esac
done
if [ "${KUSARI_CHECK_ARGS:-0}" != 0 ]; then echo "fresh_root_check.sh: arguments accepted"; exit 0; fi  # (the docs' commands are checked so)

die() { echo "fresh_root_check.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, mount and chroot); run it as root"

# --- the archive this machine's apt uses (the root must reach the same one) -------------------
mirror=""
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' \
    /etc/apt/sources.list)
fi
[ -n "$mirror" ] || die "cannot tell which Debian archive this machine uses (no URIs in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list)"

if ! command -v debootstrap >/dev/null; then
  echo "fresh_root_check.sh: installing debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

# --- the cached base root ------------------------------------------------------------------------
mkdir -p "$cache/apt-archives/partial"
base="$cache/debian12-minbase.tar"
if [ ! -s "$base" ]; then
  echo "fresh_root_check.sh: building a Debian 12 base root from $mirror (cached in $base)"
  tmp_base=$(mktemp -d "$cache/base.XXXXXX")
  if ! debootstrap --variant=minbase "$suite" "$tmp_base" "$mirror" >"$cache/debootstrap.log" 2>&1; then
    tail -n 30 "$cache/debootstrap.log" >&2
    rm -rf "$tmp_base"
    die "debootstrap of Debian 12 ($suite) from $mirror failed (log: $cache/debootstrap.log)"
  fi
  tar -C "$tmp_base" -cf "$base.part" .
  mv "$base.part" "$base"
  rm -rf "$tmp_base"
fi

# --- a fresh copy for this run -----------------------------------------------------------------
root=$(mktemp -d /tmp/kusari-fresh-root.XXXXXX)
mounts=()
cleanup() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[$i]}" 2>/dev/null || true; done
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT
tar -C "$root" -xf "$base"

# The same archive (and security archive) as this machine, name resolution, and a package cache
# kept between runs (only downloads are kept: every package is still installed from nothing).
rm -f "$root/etc/apt/sources.list"
mkdir -p "$root/etc/apt/sources.list.d"
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] && cp "$f" "$root$f"
done
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
# Debian's installer (and every cloud image) writes /etc/hosts with localhost and the machine's
# name; debootstrap writes none. Without it, Open MPI's start-up of three or more ranks waits
# 5 s for the resolver on every launch (dozens of the tests: minutes of CI), which no real
# machine shows. The root shares this machine's name (same UTS namespace).
if [ ! -e "$root/etc/hosts" ]; then
  printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
    "$(hostname)" >"$root/etc/hosts"
fi
for f in /etc/apt/apt.conf.d/*proxy* /etc/apt/apt.conf.d/*Proxy*; do
  [ -f "$f" ] && cp "$f" "$root$f"
done
# The package cache is a directory of this machine's, which the root's _apt user cannot write.
echo 'APT::Sandbox::User "root";' >"$root/etc/apt/apt.conf.d/90kusari-cache"

bind() {  # bind <source> <target inside the root> [mount options...]
  local src=$1 dst=$root$2
  shift 2
  mkdir -p "$dst"
  mount "$@" "$src" "$dst" || die "cannot mount $src on $dst"
  mounts+=("$dst")
}
# The root is made a mount point of its own (private, so nothing mounted inside reaches this
# machine): the multi-host test (mn_multi_host_tcp) enters network namespaces with
# "ip netns exec", which needs "/" to be a mount point and fails in a plain directory chroot;
# the namespaces' mounts (/run/netns) are detached with the root at the end.
mount --bind "$root" "$root" || die "cannot bind-mount $root onto itself"
mounts+=("$root")
mount --make-private "$root" || die "cannot make the mount of $root private"
bind proc /proc -t proc
bind sysfs /sys -t sysfs
bind /dev /dev --bind
bind devpts /dev/pts -t devpts
bind tmpfs /dev/shm -t tmpfs
if [ "$first_model" = 0 ]; then
  bind "$cache/apt-archives" /var/cache/apt/archives --bind
  # This machine's compiler cache, where it has one (scripts/setup.sh uses ccache where it is
  # installed): the root's build of the same sources then compiles only what differs (the
  # files that see the root's other configuration, e.g. no CUDA). The root still installs every
  # package itself, and a missing header still fails its compile: ccache checks every header of
  # a cached object.
  if command -v ccache >/dev/null && [ "${KUSARI_CCACHE:-1}" != 0 ]; then
    ccache_dir=$(ccache -k cache_dir 2>/dev/null || true)
    if [ -n "$ccache_dir" ]; then
      mkdir -p "$ccache_dir"
      bind "$ccache_dir" /root/.cache/ccache --bind
    fi
  fi
fi

# The committed tree, as a clean clone would have it.
mkdir -p "$root/root/kusari"
git -C "$here" archive --format=tar HEAD | tar -C "$root/root/kusari" -xf -

consumer=""
if [ -n "${KUSARI_FRESH_INSTALL:-}" ]; then
  [ -d "$KUSARI_FRESH_INSTALL/lib/cmake/kusari" ] || die "KUSARI_FRESH_INSTALL=$KUSARI_FRESH_INSTALL holds no kusari install (no lib/cmake/kusari)"
  mkdir -p "$root/opt/kusari"
  cp -a "$KUSARI_FRESH_INSTALL/." "$root/opt/kusari/"
  consumer="tests/install_consumer/check.sh /opt/kusari"
fi

# shellcheck disable=SC2016
script='set -euo pipefail
cd /root/kusari
echo "fresh root: $(. /etc/os-release && echo "$PRETTY_NAME"), $(dpkg-query -W -f="\${binary:Package}\n" | wc -l) packages"
echo "fresh root: scripts/run_mnist.sh -- '"$mnist_args"'"
scripts/run_mnist.sh -- '"$mnist_args"' -o /tmp/mnist_result
test -s /tmp/mnist_result/log || { echo "fresh root: the main job wrote no log"; exit 1; }
echo "fresh root: scripts/test.sh"
scripts/test.sh
echo "fresh root: the Python package, imported from another folder by Debian'"'"'s python3"
(cd /tmp && /usr/bin/python3 -c "import kusari; print(\"fresh root: import kusari:\", kusari.__file__, kusari.build_info()[\"version\"])")
'
if [ "$first_model" = 1 ]; then
  # shellcheck disable=SC2016
  script='set -euo pipefail
cd /root/kusari
start=$(date +%s)
scripts/run_mnist.sh -- -e 1 -o /tmp/mnist_result
test -s /tmp/mnist_result/log || { echo "fresh root: the main job wrote no log"; exit 1; }
echo "fresh root: time to a first trained model (scripts/run_mnist.sh -- -e 1, every package downloaded): $(( $(date +%s) - start )) s"
'
elif [ -n "$consumer" ]; then
  script+="echo 'fresh root: an install made elsewhere, used by an out-of-tree project'
$consumer
"
fi

echo "fresh_root_check.sh: running the README's commands in a fresh Debian 12 root ($root)"
start=$(date +%s)
chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  DEBIAN_FRONTEND=noninteractive /bin/bash -c "$script"
if [ "$first_model" = 1 ]; then
  echo "fresh_root_check.sh: the main job trained a first model in a fresh Debian 12 root in $(( $(date +%s) - start )) s"
else
  echo "fresh_root_check.sh: both README commands passed in a fresh Debian 12 root in $(( $(date +%s) - start )) s"
fi
