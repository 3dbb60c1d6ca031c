#!/usr/bin/env bash
# Installs the Debian packages deltaserve needs to build and test (idempotent: packages
# already present are skipped, apt runs only when something is missing).
set -euo pipefail

PACKAGES=(
  cmake g++ ninja-build pkg-config
  nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev
  clang  # libFuzzer for the safetensors fuzz target
  libpcre2-dev libutf8proc-dev  # tokenizer: Unicode regex classes, NFC
  libcpp-httplib-dev  # server: HTTP (pulls libssl-dev, zlib1g-dev, libbrotli-dev)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present" >&2
fi
