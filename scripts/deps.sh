#!/usr/bin/env bash
# Installs the Debian packages nabla builds against (idempotent: skips the
# install when every package is already there).
set -euo pipefail
pkgs=(build-essential cmake pkg-config clang libclang-rt-14-dev libopenblas-dev libzstd-dev libxxhash-dev
      libpcre2-dev libcjson-dev libyaml-dev libutf8proc-dev libmicrohttpd-dev python3 python3-venv
      libopenmpi-dev openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
