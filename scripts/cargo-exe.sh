#!/usr/bin/env bash
# Prints the path of the executable `cargo test ARGS --no-run` builds for target NAME of kind
# KIND (`test`: an integration test; `bin`: a binary, built beside the integration tests
# that run it), building it first when it is stale.
#
#   bash scripts/cargo-exe.sh bin zero-train --workspace
#   bash scripts/cargo-exe.sh test mpi_staging -p zero-train --features mpi --test mpi_staging
#
# Why not `cargo build -p PKG --bin NAME`: cargo resolves the dependencies' features per
# selection of packages and targets, so a build of one package without its tests enables
# fewer features than `cargo test --workspace` did and compiles the dependencies a second time
# (minutes on the CI machine). Asking `cargo test` with the selection the caller already built
# reuses what it compiled. Cargo's own output goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 2 || ( $1 != test && $1 != bin ) ]]; then
  echo "usage: cargo-exe.sh test|bin NAME [CARGO-TEST-ARGS...]" >&2
  exit 2
fi
kind=$1 name=$2
shift 2
# A binary appears twice: its own unit tests (profile "test":true) and the program ("test":false).
if [[ $kind == bin ]]; then profile='"test":false}'; else profile='"test":true}'; fi
# (A failed build leaves `exe` empty: cargo has said why on stderr.)
exe=$(cargo test "$@" --no-run --message-format=json |
  grep -F "\"kind\":[\"$kind\"]" | grep -F "\"name\":\"$name\"," | grep -F "$profile" |
  grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | tail -n1 || true)
if [[ -z "$exe" || ! -x "$exe" ]]; then
  echo "cargo-exe.sh: cargo test $* --no-run built no $kind target named $name" >&2
  exit 1
fi
echo "$exe"
