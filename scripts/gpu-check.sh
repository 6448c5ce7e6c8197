#!/usr/bin/env bash
# The GPU check: zero-gpt's CUDA kernels, the engine's CUDA kernels, zero-comm's device-local
# and NCCL communicators, ZeRO stages on one GPU, and zero-train --device cuda (a smoke run and
# the GPT-2 124M benchmark), in two modes (docs/gpu.md):
#
#   bash scripts/gpu-check.sh build   # here, with cargo: release test binaries -> gpu-bin/
#   bash scripts/gpu-check.sh run     # on the GPU machine (no Rust toolchain): runs them
#
# `build` compiles the CUDA test binaries (cargo test --release --no-run --features cuda, for
# -p zero-gpt, -p zero-comm, -p zero and -p zero-train) and zero-train and zero-bench, strips
# them into the git-ignored gpu-bin/ with a copy of this script and of the Shakespeare token
# files (data/shakespeare, from scripts/train.sh). `run` makes the
# CUDA 13 libraries loadable by cudarc (built with cuda-12080, it looks for libX.so and
# libX.so.12: a folder of libX.so -> libX.so.13 symlinks goes first on LD_LIBRARY_PATH),
# then runs every test binary with ZERO_GPT_REQUIRE_GPU=1 (a missing GPU fails instead of
# skipping) and writes one log per binary, nvidia-smi's report and summary.txt under $OUT
# (default target/gpu-check). Exit status: 0 when every binary passed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mode="${1:-}"
TESTS=(cuda_kernels cuda_model gpt_generic nvrtc_compile)   # zero-gpt
COMM_TESTS=(nccl_device device_local_cuda device_local_nvrtc)   # zero-comm
ENGINE_TESTS=(kernels_cuda kernels_nvrtc)        # zero: the engine's kernels
TRAIN_TESTS=(cuda_stages cuda_offload)           # zero-train: stages 0-3, activation offload
ALL_TESTS=("${TESTS[@]}" "${COMM_TESTS[@]}" "${ENGINE_TESTS[@]}" "${TRAIN_TESTS[@]}")

build() {
    cd "$here/.."
    local bin=gpu-bin
    rm -rf "$bin"
    mkdir -p "$bin"
    local json
    json=$(cargo test --release -p zero-gpt --features cuda --no-run --message-format=json \
        "${TESTS[@]/#/--test=}"
        cargo test --release -p zero-comm --features cuda --no-run --message-format=json \
        "${COMM_TESTS[@]/#/--test=}"
        cargo test --release -p zero --features cuda --no-run --message-format=json \
        "${ENGINE_TESTS[@]/#/--test=}"
        cargo test --release -p zero-train --features cuda --no-run --message-format=json \
        "${TRAIN_TESTS[@]/#/--test=}")
    for t in "${ALL_TESTS[@]}"; do
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
    cargo build --release -p zero-train --features cuda --bin zero-train
    local target
    target=$(cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    strip -o "$bin/zero-bench" "$target/release/zero-bench"
    strip -o "$bin/zero-train" "$target/release/zero-train"
    mkdir -p "$bin/data"
    if [ -f data/shakespeare/train.bin ] && [ -f data/shakespeare/val.bin ]; then
        cp data/shakespeare/train.bin data/shakespeare/val.bin "$bin/data/"
    else
        echo "gpu-check: no data/shakespeare token files (run bash scripts/train.sh once): the zero-train runs will be skipped" >&2
    fi
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
    # Every step has its own timeout (150 s a test binary or training run, 120 s a bench), so
    # one hang costs that step, not the device tool's whole 600 s call.
    for t in "${ALL_TESTS[@]}"; do
        local rc=0
        (cd "$OUT" && timeout 150 "$bin/$t" --test-threads 1 --nocapture) >"$OUT/$t.log" 2>&1 || rc=$?
        echo "$t: exit $rc ($(grep -E '^test result' "$OUT/$t.log" | tail -n 1))" | tee -a "$OUT/summary.txt"
        [ "$rc" -eq 0 ] || failed=1
    done
    # nccl-tests' all_reduce_perf beside ours: one rank (torchrun's variables), 1 KiB to 1 GiB.
    local rc=0
    RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 \
        timeout 120 "$bin/zero-bench" all_reduce --backend nccl -b 1K -e 1G -f 4 -n 20 -w 5 \
        >"$OUT/zero-bench-nccl.log" 2>&1 || rc=$?
    echo "zero-bench --backend nccl: exit $rc ($(grep -E '^# Avg bus' "$OUT/zero-bench-nccl.log" || tail -n 1 "$OUT/zero-bench-nccl.log"))" |
        tee -a "$OUT/summary.txt"
    [ "$rc" -eq 0 ] || failed=1
    # The device-local backend: 4 rank threads sharing the GPU, the same table.
    rc=0
    timeout 120 "$bin/zero-bench" all_reduce --device cuda --ranks 4 -b 1K -e 1G -f 4 -n 20 -w 5 \
        >"$OUT/zero-bench-device-local.log" 2>&1 || rc=$?
    echo "zero-bench --device cuda --ranks 4: exit $rc ($(grep -E '^# Avg bus' "$OUT/zero-bench-device-local.log" || tail -n 1 "$OUT/zero-bench-device-local.log"))" |
        tee -a "$OUT/summary.txt"
    [ "$rc" -eq 0 ] || failed=1
    train_runs "$bin" || failed=1
    echo "gpu-check: logs in $OUT"
    return "$failed"
}

# zero-train --device cuda: a smoke run of the default model at N_d = 2, stage 3 (and one with
# its activation checkpoints offloaded to pinned host memory), then GPT-2
# 124M (bf16, T = 1024) at stage 0 with one rank and at stage 3 with four ranks on the GPU,
# each with its tokens/s, MFU and peak arena bytes per rank in summary.txt.
train_runs() {
    local bin="$1" failed=0
    if [ ! -f "$bin/data/train.bin" ]; then
        echo "zero-train --device cuda: skipped (no token files in $bin/data)" | tee -a "$OUT/summary.txt"
        return 0
    fi
    local common=(--device cuda --data "$bin/data" --eval-every 0 --sample-tokens 0)
    train_one smoke "$bin" "${common[@]}" --world-size 2 --zero-stage 3 --steps 20 || failed=1
    train_one smoke-offload "$bin" "${common[@]}" --world-size 2 --zero-stage 3 --steps 20 \
        --activation-checkpointing --offload-activations || failed=1
    # The engine over NCCL (one rank, torchrun's variables, control traffic over TCP) against
    # the device-local backend at the same world size: the losses side by side.
    local n1=(--world-size 1 --zero-stage 2 --steps 10)
    train_one device-local-n1 "$bin" "${common[@]}" "${n1[@]}" || failed=1
    RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29518 \
        train_one nccl-n1 "$bin" "${common[@]}" "${n1[@]}" --backend nccl || failed=1
    compare_losses device-local-n1 nccl-n1 || failed=1
    local gpt2=(--model gpt2 --seq-len 1024 --precision bf16 --steps 8 --warmup-steps 0)
    train_one gpt2-stage0-n1 "$bin" "${common[@]}" "${gpt2[@]}" --world-size 1 --zero-stage 0 \
        --micro-batch-size 16 --batch-size 16 || failed=1
    train_one gpt2-stage3-n4 "$bin" "${common[@]}" "${gpt2[@]}" --world-size 4 --zero-stage 3 \
        --micro-batch-size 4 --batch-size 16 || failed=1
    return "$failed"
}

# One zero-train run named $1; its metrics summarised (steps after the first two).
train_one() {
    local name="$1" bin="$2" rc=0
    shift 2
    (cd "$OUT" && timeout 150 "$bin/zero-train" "$@" --metrics "$OUT/$name.jsonl") \
        >"$OUT/$name.log" 2>&1 || rc=$?
    local line
    line=$(python3 - "$OUT/$name.jsonl" "$OUT/$name.log" <<'PY' 2>&1
import json, os, sys
if not os.path.exists(sys.argv[1]):
    log = open(sys.argv[2]).read().strip().splitlines()
    print("no metrics: " + (log[-1] if log else "empty log")); sys.exit(0)
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r for r in rows if "tokens_per_s" in r]
if not steps:
    print("no steps"); sys.exit(0)
tail = steps[2:] or steps
tok = sum(r["tokens_per_s"] for r in tail) / len(tail)
# GPT-2 124M (llm.c's count: 6N + 6LCT FLOPs per token) over the H200's dense bf16 peak.
L, C, T, V = 12, 768, 1024, 50257
N = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
mfu = tok * (6 * N + 6 * L * C * T) / 989.4e12
peak = max(r.get("peak_bytes", 0) for r in steps)
print(f"first loss {steps[0]['loss']:.4f}, last {steps[-1]['loss']:.4f}, {tok:.0f} tok/s, "
      f"step {tail[-1]['step_ms']:.0f} ms, MFU {100 * mfu:.1f}% (if GPT-2 124M), "
      f"peak arena {peak / 2**20:.0f} MiB")
PY
)
    echo "zero-train $name: exit $rc ($line)" | tee -a "$OUT/summary.txt"
    return "$rc"
}

# The losses of runs $1 and $2, step by step; fails unless every pair is within 1e-5 relative.
compare_losses() {
    python3 - "$OUT/$1.jsonl" "$OUT/$2.jsonl" <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import json, os, sys
def losses(path):
    if not os.path.exists(path):
        return []
    return [json.loads(l)["loss"] for l in open(path) if '"tokens_per_s"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = max((abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b)), default=float("inf"))
same = len(a) == len(b) > 0 and worst <= 1e-5
print(f"losses {os.path.basename(sys.argv[1])} vs {os.path.basename(sys.argv[2])}: "
      f"{len(a)} and {len(b)} steps, worst relative difference {worst:.3g}: "
      f"{'equal within 1e-5' if same else 'DIFFERENT'}")
sys.exit(0 if same else 1)
PY
    return "${PIPESTATUS[0]}"
}

case "$mode" in
    build) build ;;
    run) run ;;
    *) echo "usage: $0 build|run" >&2; exit 2 ;;
esac
