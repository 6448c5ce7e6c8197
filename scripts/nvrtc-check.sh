#!/usr/bin/env bash
# Compiles every CUDA kernel source with NVRTC for sm_80 and sm_90, on any machine (no GPU,
# no CUDA toolkit): NVRTC comes from the PyPI wheel nvidia-cuda-nvrtc-cu12, installed once
# into a cache folder. Where pip cannot get the wheel, says why and exits 0 (skipped).
#
#   bash scripts/nvrtc-check.sh
#
# ZERO_RS_NVRTC_DIR overrides the cache folder (default ~/.cache/zero-rs/nvrtc).
set -euo pipefail
cd "$(dirname "$0")/.."

dir="${ZERO_RS_NVRTC_DIR:-$HOME/.cache/zero-rs/nvrtc}"
lib="$dir/nvidia/cuda_nvrtc/lib"
if ! ls "$lib"/libnvrtc.so.12 >/dev/null 2>&1; then
    echo "nvrtc-check: installing nvidia-cuda-nvrtc-cu12 into $dir"
    if ! command -v pip >/dev/null 2>&1 && ! command -v pip3 >/dev/null 2>&1; then
        echo "nvrtc-check: SKIPPED: no pip on PATH to fetch the NVRTC wheel"
        exit 0
    fi
    pip_cmd=$(command -v pip || command -v pip3)
    mkdir -p "$dir"
    if ! "$pip_cmd" install --quiet --disable-pip-version-check --no-deps --target "$dir" \
        nvidia-cuda-nvrtc-cu12==12.9.86 2>"$dir/pip.log"; then
        echo "nvrtc-check: SKIPPED: pip could not install nvidia-cuda-nvrtc-cu12:"
        tail -n 5 "$dir/pip.log"
        exit 0
    fi
fi
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The test fails instead of skipping when it cannot load NVRTC: here it must compile.
export ZERO_GPT_REQUIRE_NVRTC=1
cargo test -p zero-alloc --features cuda --test nvrtc -- --nocapture --test-threads 1
cargo test -p zero-gpt --features cuda --test nvrtc_compile -- --nocapture --test-threads 1
cargo test -p zero-comm --features cuda --test device_local_nvrtc -- --nocapture --test-threads 1
cargo test -p zero --features cuda --test kernels_nvrtc -- --nocapture --test-threads 1
