#!/usr/bin/env bash
# The GPU check of zero-gpt's CUDA kernels and zero-comm's NCCL communicator, in two modes
# (docs/gpu.md):
#
#   bash scripts/gpu-check.sh build   # here, with cargo: release test binaries -> gpu-bin/
#   bash scripts/gpu-check.sh run     # on the GPU machine (no Rust toolchain): runs them
#
# `build` compiles the CUDA test binaries (cargo test --release --no-run --features cuda, for
# -p zero-gpt and -p zero-comm),
# strips them into the git-ignored gpu-bin/ with a copy of this script. `run` makes the
# CUDA 13 libraries loadable by cudarc (built with cuda-12080, it looks for libX.so and
# libX.so.12: a folder of libX.so -> libX.so.13 symlinks goes first on LD_LIBRARY_PATH),
# then runs every test binary with ZERO_GPT_REQUIRE_GPU=1 (a missing GPU fails instead of
# skipping) and writes one log per binary, nvidia-smi's report and summary.txt under $OUT
# (default target/gpu-check). Exit status: 0 when every binary passed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mode="${1:-}"
TESTS=(cuda_kernels cuda_optim cuda_model gpt_generic nvrtc_compile)   # zero-gpt
COMM_TESTS=(nccl_device)                         # zero-comm: NCCL at world size 1

build() {
    cd "$here/.."
    local bin=gpu-bin
    mkdir -p "$bin"
    local json
    json=$(cargo test --release -p zero-gpt --features cuda --no-run --message-format=json \
        "${TESTS[@]/#/--test=}"
        cargo test --release -p zero-comm --features cuda --no-run --message-format=json \
        "${COMM_TESTS[@]/#/--test=}")
    for t in "${TESTS[@]}" "${COMM_TESTS[@]}"; do
        local exe
        exe=$(printf '%s\n' "$json" | python3 -c '
import json, sys
name = sys.argv[1]
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == name:
        print(m["executable"])' "$t")
        [ -n "$exe" ] || { echo "gpu-check: no executable for test $t" >&2; exit 1; }
        strip -o "$bin/$t" "$exe"
    done
    cargo build --release -p zero-benches --features cuda --bin zero-bench
    strip -o "$bin/zero-bench" "$(cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/zero-bench"
    cp "$here/gpu-check.sh" "$bin/gpu-check.sh"
    du -sh "$bin"/*
    echo "gpu-check: built into $bin/; on the GPU machine run: bash gpu-bin/gpu-check.sh run"
}

# Folders that may hold the CUDA 13 user-space libraries: the Python wheels' nvidia/*/lib,
# then the toolkit.
lib_dirs() {
    python3 - <<'PY' 2>/dev/null || true
import glob, os
try:
    import nvidia
    for root in nvidia.__path__:
        for d in sorted(glob.glob(os.path.join(root, "*", "lib"))):
            print(d)
except ImportError:
    pass
PY
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
        [ -d "$d" ] && echo "$d"
    done
}

link_libs() {
    local links="$1"
    mkdir -p "$links"
    local dirs
    mapfile -t dirs < <(lib_dirs)
    for lib in cublas cublasLt nvrtc nccl; do
        local found=""
        for d in "${dirs[@]}"; do
            found=$(ls "$d/lib$lib.so".[0-9]* 2>/dev/null | sort -V | tail -n 1 || true)
            [ -n "$found" ] && break
        done
        if [ -n "$found" ]; then
            ln -sf "$found" "$links/lib$lib.so"
            echo "lib$lib.so -> $found"
            LD_LIBRARY_PATH="$(dirname "$found"):${LD_LIBRARY_PATH:-}"
        else
            echo "lib$lib.so: not found in ${dirs[*]}"
        fi
    done
    export LD_LIBRARY_PATH="$links:${LD_LIBRARY_PATH:-}"
}

run() {
    local bin="$here"
    [ -x "$bin/${TESTS[0]}" ] || bin="$here/../gpu-bin"
    OUT="${OUT:-target/gpu-check}"
    mkdir -p "$OUT"
    OUT="$(cd "$OUT" && pwd)"
    { nvidia-smi || echo "nvidia-smi failed"; } >"$OUT/nvidia-smi.txt" 2>&1
    # Not in a subshell: link_libs exports LD_LIBRARY_PATH for the tests below.
    link_libs "$OUT/cuda-libs" >"$OUT/libs.txt" 2>&1
    cat "$OUT/libs.txt"
    export ZERO_GPT_REQUIRE_GPU=1 ZERO_GPT_REQUIRE_NVRTC=1 ZERO_COMM_REQUIRE_GPU=1 RUST_BACKTRACE=1
    local failed=0
    : >"$OUT/summary.txt"
    for t in "${TESTS[@]}" "${COMM_TESTS[@]}"; do
        local rc=0
        (cd "$OUT" && timeout 300 "$bin/$t" --test-threads 1 --nocapture) >"$OUT/$t.log" 2>&1 || rc=$?
        echo "$t: exit $rc ($(grep -E '^test result' "$OUT/$t.log" | tail -n 1))" | tee -a "$OUT/summary.txt"
        [ "$rc" -eq 0 ] || failed=1
    done
    # nccl-tests' all_reduce_perf beside ours: one rank (torchrun's variables), 1 KiB to 1 GiB.
    local rc=0
    RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 \
        timeout 300 "$bin/zero-bench" all_reduce --backend nccl -b 1K -e 1G -f 4 -n 20 -w 5 \
        >"$OUT/zero-bench-nccl.log" 2>&1 || rc=$?
    echo "zero-bench --backend nccl: exit $rc ($(grep -E '^# Avg bus' "$OUT/zero-bench-nccl.log"))" |
        tee -a "$OUT/summary.txt"
    [ "$rc" -eq 0 ] || failed=1
    echo "gpu-check: logs in $OUT"
    return "$failed"
}

case "$mode" in
    build) build ;;
    run) run ;;
    *) echo "usage: $0 build|run" >&2; exit 2 ;;
esac
