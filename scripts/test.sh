#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what is missing, then runs every test.
# `.ci/run` calls exactly this script.
#
#   1. cargo test --workspace              (no MPI needed: the `mpi` feature is off)
#   2. the MPI backend (feature `mpi`): OpenMPI, its headers and libclang (rsmpi's bindgen)
#      are installed from apt when missing, then the shared conformance suite runs as one
#      process and under `mpirun -np 2` and `-np 4`, each bounded by `timeout`.
#
# ZERO_SKIP_MPI=1 skips step 2 (for machines where MPI cannot be installed).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "test.sh: cargo is required (https://rustup.rs)" >&2
  exit 1
fi

# cargo test runs every unit, integration, property and doc test of the workspace.
cargo test --workspace

if [[ "${ZERO_SKIP_MPI:-0}" == 1 ]]; then
  echo "test.sh: ZERO_SKIP_MPI=1: skipping the MPI backend"
  exit 0
fi

# --- MPI -------------------------------------------------------------------------------
mpi_packages=(openmpi-bin libopenmpi-dev libclang-dev)
missing=()
for p in "${mpi_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  sudo=()
  if [[ "$(id -u)" != 0 ]]; then sudo=(sudo); fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: install ${missing[*]} (OpenMPI, its headers, libclang) or set ZERO_SKIP_MPI=1" >&2
    exit 1
  fi
  echo "== installing ${missing[*]}"
  "${sudo[@]}" apt-get update
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y "${missing[@]}"
fi

# 4 ranks on a 2-core CI machine need --oversubscribe; root needs --allow-run-as-root.
# Launcher flags belong here, not in the code.
mpirun_flags=(--oversubscribe)
if [[ "$(id -u)" == 0 ]]; then mpirun_flags+=(--allow-run-as-root); fi

echo "== zero-comm --features mpi: the mpi module's unit tests, the MPI suite as one process"
# (The rest of zero-comm's tests do not depend on the feature and ran in step 1.)
cargo test -p zero-comm --features mpi --lib -- mpi::
cargo test -p zero-comm --features mpi --test mpi_conformance --test mpi_bench

bin=$(cargo test -p zero-comm --features mpi --test mpi_conformance --no-run \
  --message-format=json 2>/dev/null |
  grep -o '"executable":"[^"]*mpi_conformance[^"]*"' | tail -n1 | cut -d'"' -f4)
if [[ -z "$bin" || ! -x "$bin" ]]; then
  echo "test.sh: cannot find the mpi_conformance test binary" >&2
  exit 1
fi

for np in 2 4; do
  echo "== mpirun -np $np mpi_conformance"
  # A hang fails CI in minutes: the suite takes seconds, and each case's own timeout is 60 s.
  timeout --kill-after=10 300 mpirun "${mpirun_flags[@]}" -np "$np" "$bin"
done
