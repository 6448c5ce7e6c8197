#!/usr/bin/env bash
# Prints the folder holding libnvrtc.so.12, installing the PyPI wheel nvidia-cuda-nvrtc-cu12
# into a cache folder when it is missing (no GPU or CUDA toolkit needed). Messages go to
# stderr; exit status 1, with the reason, when pip cannot get the wheel.
#
#   lib=$(bash scripts/nvrtc-lib.sh) && LD_LIBRARY_PATH="$lib" ...
#
# ZERO_RS_NVRTC_DIR overrides the cache folder (default ~/.cache/zero-rs/nvrtc).
set -euo pipefail

dir="${ZERO_RS_NVRTC_DIR:-$HOME/.cache/zero-rs/nvrtc}"
lib="$dir/nvidia/cuda_nvrtc/lib"
if ! ls "$lib"/libnvrtc.so.12 >/dev/null 2>&1; then
    echo "nvrtc-lib: installing nvidia-cuda-nvrtc-cu12 into $dir" >&2
    pip_cmd=$(command -v pip || command -v pip3 || true)
    if [ -z "$pip_cmd" ]; then
        echo "nvrtc-lib: no pip on PATH to fetch the NVRTC wheel" >&2
        exit 1
    fi
    mkdir -p "$dir"
    if ! "$pip_cmd" install --quiet --disable-pip-version-check --no-deps --target "$dir" \
        nvidia-cuda-nvrtc-cu12==12.9.86 2>"$dir/pip.log"; then
        echo "nvrtc-lib: pip could not install nvidia-cuda-nvrtc-cu12:" >&2
        tail -n 5 "$dir/pip.log" >&2
        exit 1
    fi
fi
echo "$lib"
