#!/usr/bin/env bash
# Installs the default English training corpus from Debian's own packages and
# writes it as plain text: data/corpus/kjv.txt (the King James Bible, public
# domain, ~4.2 MB). Idempotent: skips the install and the build when done.
# See docs/corpus.md for the choice and the license.
set -euo pipefail
cd "$(dirname "$0")/.."
out=data/corpus/kjv.txt
if [ -s "$out" ]; then
  echo "corpus: $out already there ($(wc -c <"$out") bytes)"
  exit 0
fi
if ! command -v bible >/dev/null 2>&1 || ! dpkg-query -W -f='${Status}' bible-kjv-text 2>/dev/null | grep -q "install ok installed"; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "corpus: installing bible-kjv (and bible-kjv-text)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq bible-kjv bible-kjv-text >/dev/null
fi
mkdir -p data/corpus
tmp=$(mktemp "$out.XXXXXX")
# Every verse from Genesis 1:1 to Revelation 22:21, one verse a line (a very
# long line width disables wrapping), the verse numbers dropped; book and
# chapter headings ("Genesis 1") and blank lines between chapters are kept.
bible -l100000 'gen1:1-rev22:21' </dev/null | sed -E -e '1{/^$/d}' -e 's/^ *[0-9]+ //' >"$tmp"
size=$(wc -c <"$tmp")
if [ "$size" -lt 4000000 ]; then
  rm -f "$tmp"
  echo "corpus: expected about 4.2 MB of text, got $size bytes" >&2
  exit 1
fi
mv "$tmp" "$out"
echo "corpus: wrote $out ($size bytes)"
