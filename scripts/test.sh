#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what is missing, then runs every test.
# `.ci/run` calls exactly this script.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "test.sh: cargo is required (https://rustup.rs)" >&2
  exit 1
fi

# cargo test runs every unit, integration, property and doc test of the workspace.
cargo test --workspace
