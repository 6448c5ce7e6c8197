#!/usr/bin/env bash
# The main job: fetch and prepare the Shakespeare corpus when missing, then run zero-train
# with its defaults (extra arguments are passed through, e.g. --zero-stage 3 --steps 50).
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=data/shakespeare
# Built first, with cargo's progress shown: the first build takes minutes on a small machine.
echo "train.sh: building zero-train (release)" >&2
cargo build --release -p zero-train --bin zero-train
zero_train() { cargo run --quiet --release -p zero-train --bin zero-train -- "$@"; }

if [[ ! -f "$DATA/train.bin" || ! -f "$DATA/val.bin" ]]; then
  bash scripts/fetch-shakespeare.sh "$DATA"
  zero_train prepare --text "$DATA"/texts/*.txt --out "$DATA"
fi
zero_train --data "$DATA" "$@"
