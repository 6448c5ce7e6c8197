#!/usr/bin/env bash
# Compiles every CUDA kernel source with NVRTC for sm_80 and sm_90, on any machine (no GPU,
# no CUDA toolkit): NVRTC comes from the PyPI wheel nvidia-cuda-nvrtc-cu12, installed once
# into a cache folder. Where pip cannot get the wheel, says why and exits 0 (skipped). First
# it runs the unit tests of the feature-`cuda` code that need no GPU.
#
#   bash scripts/nvrtc-check.sh
#
# scripts/nvrtc-lib.sh finds or installs the library (ZERO_RS_NVRTC_DIR: its cache folder).
set -euo pipefail
cd "$(dirname "$0")/.."

# Every cargo call below selects the same packages and features: cargo resolves the
# dependencies' features per selection, so one selection compiles them once.
sel=(-p zero-alloc -p zero-comm -p zero-gpt -p zero --features cuda)

# The unit tests of the code that exists only under feature `cuda` and needs no GPU (the
# device views and the arena's device-view ranges and claims, the context owner, the cuBLAS
# handle's drop policy, NCCL's abort settling, the engine's kernel grids and launch segments):
# plain `cargo test` never compiles them.
cargo test "${sel[@]}" --lib -- context:: cuda:: pinned:: view:: nccl:: device_local::

if ! lib=$(bash scripts/nvrtc-lib.sh); then
    echo "nvrtc-check: SKIPPED: no NVRTC library (above: why)"
    exit 0
fi
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The test fails instead of skipping when it cannot load NVRTC: here it must compile.
export ZERO_GPT_REQUIRE_NVRTC=1
cargo test "${sel[@]}" --test nvrtc --test nvrtc_compile --test device_local_nvrtc \
  --test kernels_nvrtc -- --nocapture --test-threads 1
