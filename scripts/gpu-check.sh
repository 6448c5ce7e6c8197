#!/usr/bin/env bash
# The GPU check: zero-gpt's CUDA kernels, the engine's CUDA kernels, zero-comm's device-local
# and NCCL communicators, ZeRO stages on one GPU, and zero-train --device cuda (a smoke run and
# the GPT-2 124M benchmark), in two modes (docs/gpu.md):
#
#   bash scripts/gpu-check.sh build                 # here, with cargo: binaries -> gpu-bin/
#   OUT=DIR bash gpu-bin/gpu-check.sh run [TIER]    # on the GPU machine (no Rust toolchain)
#
# `build` compiles the CUDA test binaries (cargo test --release --no-run --features cuda, for
# -p zero-gpt, -p zero-comm, -p zero and -p zero-train), zero-train and zero-bench, strips them
# into the git-ignored gpu-bin/ with a copy of this script, the Shakespeare token files
# (data/shakespeare, prepared when missing) and cubin/: every kernel program compiled ahead
# for sm_80 and sm_90 by zero-cubins (NVRTC from the PyPI wheel, no GPU needed).
#
# `run` makes the CUDA 13 libraries loadable by cudarc (link_libs), points ZERO_CUBIN_DIR at
# cubin/, then runs the steps of TIER: `first` (what matters most: the kernels against the
# CPU, NCCL at world size 1, the stages equal on the GPU, one GPT-2 training step), `rest`
# (everything else), or `all` (the default: first, then the rest as far as time goes). One
# budget, GPU_CHECK_BUDGET_S (default 360 s, so a second call still fits the machine's
# time), cuts each step's own limit. A step is passed, FAILED, TIMED OUT, skipped (no GPU: a
# dry run, which finishes in seconds) or not run (the budget is spent); only FAILED and TIMED
# OUT make the exit status 1. The logs go to GPU_CHECK_WORK (default $TMPDIR/zero-gpu-check);
# $OUT (default target/gpu-check) gets at most four files: summary.txt (a line a step, written
# as it ends, with each training run's figures), failures.txt (the first panics and the
# last 40 lines of each failed step's log), bench.txt (zero-bench's tables) and logs.tar.gz (every log, metrics
# file, progress.txt, nvidia-smi.txt, gpu-usage.csv, libs.txt, env.txt; rewritten after each
# step, so a run killed at any moment leaves one).
# Test hooks: GPU_CHECK_DRY_RUN=1 skips every GPU step even on a GPU; GPU_CHECK_ASSUME_GPU=1
# runs them without asking nvidia-smi, and GPU_CHECK_BIN names the binaries' folder
# (scripts/check-gpu-dry-run.sh runs stand-in binaries that way).
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
    cargo build --release -p zero-benches --features cuda --bin zero-bench --bin zero-cubins
    cargo build --release -p zero-train --features cuda --bin zero-train
    local target
    target=$(cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    strip -o "$bin/zero-bench" "$target/release/zero-bench"
    strip -o "$bin/zero-train" "$target/release/zero-train"
    # Every kernel program compiled ahead for sm_80 and sm_90 (NVRTC needs no GPU), so no
    # process on the GPU machine compiles them again.
    local nvrtc
    if nvrtc=$(bash scripts/nvrtc-lib.sh); then
        LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
            "$target/release/zero-cubins" --out "$bin/cubin"
    else
        echo "gpu-check: WARNING: no NVRTC here: the GPU machine's processes compile the kernels" >&2
    fi
    mkdir -p "$bin/data"
    local data=data/shakespeare
    if [ ! -f "$data/train.bin" ] || [ ! -f "$data/val.bin" ]; then
        # Without them every zero-train run (the GPT-2 figures among them) is skipped.
        echo "gpu-check: preparing $data (fetch-shakespeare.sh, zero-train prepare)" >&2
        { bash scripts/fetch-shakespeare.sh "$data" &&
            "$target/release/zero-train" prepare --text "$data"/texts/*.txt --out "$data"; } ||
            echo "gpu-check: WARNING: no $data token files: the zero-train runs will be skipped" >&2
    fi
    if [ -f "$data/train.bin" ] && [ -f "$data/val.bin" ]; then
        cp "$data/train.bin" "$data/val.bin" "$bin/data/"
    fi
    cp "$here/gpu-check.sh" "$bin/gpu-check.sh"
    du -sh "$bin"/*
    echo "gpu-check: built into $bin/; on the GPU machine run: bash gpu-bin/gpu-check.sh run"
}

# Folders that may hold the CUDA user-space libraries, best first: the Python wheels'
# nvidia/*/lib (CUDA 13's wheels put cuBLAS and NVRTC in nvidia/cu13/lib, NCCL in
# nvidia/nccl/lib) as every Python on the machine sees them, the usual site-packages globs
# (for a Python that is not on PATH), then the toolkit and the system folder.
lib_dirs() {
    local py
    for py in python3 python /opt/conda/bin/python /usr/bin/python3; do
        command -v "$py" >/dev/null 2>&1 || continue
        timeout 20 "$py" - <<'PY' 2>/dev/null || true
import glob, os
try:
    import nvidia
    for root in nvidia.__path__:
        for d in sorted(glob.glob(os.path.join(root, "*", "lib"))):
            print(d)
except ImportError:
    pass
PY
    done
    local d
    for d in /usr/local/lib/python3*/*-packages/nvidia/*/lib /usr/lib/python3/dist-packages/nvidia/*/lib \
        /opt/conda/lib/python3*/site-packages/nvidia/*/lib /opt/*/lib/python3*/site-packages/nvidia/*/lib \
        "$HOME"/.local/lib/python3*/site-packages/nvidia/*/lib /usr/local/cuda/lib64 \
        /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-1[0-9]*/lib64 /usr/lib/x86_64-linux-gnu; do
        [ -d "$d" ] && echo "$d"
    done
}

# The first lib$1.so.N* in the folders $2... (folder order, then name order), preferring major $CUDA_MAJOR (cuBLAS, NVRTC) and
# the folder where an earlier library was found ($PREFERRED_DIR), so cuBLAS and cuBLASLt come
# from one install.
find_lib() {
    local name="$1" d f best="" best_rank=9
    shift
    for d in "$@"; do
        for f in "$d/lib$name.so".[0-9]*; do
            [ -e "$f" ] || continue
            local rank=3
            case "$f" in *".so.$CUDA_MAJOR"*) rank=1 ;; esac
            [ "$d" = "${PREFERRED_DIR:-}" ] && rank=$((rank - 1))
            if [ "$rank" -lt "$best_rank" ]; then best="$f" best_rank=$rank; fi
        done
    done
    echo "$best"
}

# NVRTC's PTX is JIT-compiled by the driver, which refuses PTX from a newer CUDA than its own
# (a 13.0 driver and a 13.1 NVRTC: CUDA_ERROR_UNSUPPORTED_PTX_VERSION on every kernel). Of
# the libnvrtc.so.N* files in the folders $@, the newest the driver supports (its CUDA version
# from cuDriverGetVersion, or DRIVER_CUDA_VERSION, such as 13.0); the versions go to stderr.
pick_nvrtc() {
    local driver="${DRIVER_CUDA_VERSION:-}" d f v
    if [ -z "$driver" ]; then
        driver=$(timeout 20 python3 -c 'import ctypes
v = ctypes.c_int()
ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v))
print(f"{v.value // 1000}.{v.value % 1000 // 10}")' 2>/dev/null)
    fi
    echo "driver CUDA version: ${driver:-unknown}" >&2
    for d in "$@"; do
        for f in "$d"/libnvrtc.so.[0-9]*; do
            [ -e "$f" ] || continue
            # One process per file: two libnvrtc.so.13 files share a soname.
            v=$(timeout 20 python3 -c 'import ctypes, sys
a, b = ctypes.c_int(), ctypes.c_int()
ctypes.CDLL(sys.argv[1]).nvrtcVersion(ctypes.byref(a), ctypes.byref(b))
print(f"{a.value}.{b.value}")' "$f" 2>/dev/null)
            echo "NVRTC ${v:-unreadable}: $f" >&2
            [ -n "$v" ] && echo "$v $f"
        done
    done | python3 -c 'import sys
driver = sys.argv[1]
key = lambda v: tuple(int(x) for x in v.split("."))
found = [line.split(" ", 1) for line in sys.stdin.read().splitlines()]
fits = [(v, f) for v, f in found if not driver or key(v) <= key(driver)]
best = max(fits, key=lambda vf: key(vf[0]), default=None)
print(best[1] if best else "")' "$driver"
}

# cudarc (built with cuda-12080) dlopens, for each library, lib$X.so, then ... lib$X.so.12,
# .so.11, .so.10, .so.9, .so.1 (cudarc/src/lib.rs, get_lib_name_candidates): the driver's
# libcuda.so.1 is found as it is; CUDA 13's libcublas.so.13, libcublasLt.so.13,
# libnvrtc.so.13 and NCCL's libnccl.so.2 are not. A folder of lib$X.so -> real file links goes
# first on LD_LIBRARY_PATH, then the real files' folders (for their own dependencies, such as
# NVRTC's libnvrtc-builtins, and cuBLAS's cuBLASLt).
link_libs() {
    local links="$1" dirs lib found
    rm -rf "$links"
    mkdir -p "$links"
    mapfile -t dirs < <(lib_dirs | awk '!seen[$0]++')
    echo "searched: ${dirs[*]}"
    CUDA_MAJOR=13 PREFERRED_DIR=""
    local path=""
    for lib in cublas cublasLt nvrtc nccl; do
        found=""
        [ "$lib" = nvrtc ] && found=$(pick_nvrtc "${dirs[@]}")
        [ -n "$found" ] || found=$(find_lib "$lib" "${dirs[@]}")
        if [ -z "$found" ]; then
            echo "lib$lib.so: NOT FOUND"
            continue
        fi
        ln -sf "$found" "$links/lib$lib.so"
        echo "lib$lib.so -> $found"
        [ "$lib" = cublas ] && PREFERRED_DIR="$(dirname "$found")"
        case ":$path:" in *":$(dirname "$found"):"*) ;; *) path="$path:$(dirname "$found")" ;; esac
    done
    # An inherited toolkit stubs folder would give cudarc the stub libcuda.so (every call
    # then fails with CUDA_ERROR_STUB_LIBRARY): dropped.
    local inherited
    inherited=$(printf '%s' "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | grep -v -e '/stubs/*$' -e '^$' |
        paste -sd ':' -)
    export LD_LIBRARY_PATH="$links$path${inherited:+:$inherited}"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    echo "libcuda (driver): $(ldconfig -p 2>/dev/null | grep -E 'libcuda\.so' | tr -s ' \t' ' ' | paste -sd ';' -)"
    # What cudarc's first candidates resolve to, in a process started with this environment.
    timeout 30 python3 - <<'PY' || echo "dlopen check failed to run"
import ctypes
for name in ["libcuda.so", "libcuda.so.1", "libcublas.so", "libcublasLt.so", "libnvrtc.so", "libnccl.so"]:
    try:
        ctypes.CDLL(name)
        print(f"dlopen {name}: ok")
    except OSError as e:
        print(f"dlopen {name}: FAILED: {e}")
maps = open("/proc/self/maps").read().split()
for path in sorted({p for p in maps if p.startswith("/") and ".so" in p
                    and any(k in p for k in ("cuda", "cublas", "nvrtc", "nccl"))}):
    print("  loaded", path)
PY
}

stamp() { echo "+$SECONDS s ($(date -u +%H:%M:%S))"; }
note() { echo "$*" | tee -a "$OUT/summary.txt"; }

# Packs every log, metrics file and the summary into $OUT/logs.tar.gz, replacing the last
# archive only once the new one is whole: a run killed at any moment leaves one.
pack() {
    tar -czf "$OUT/logs.tar.gz.part" -C "$WORK" . -C "$OUT" summary.txt 2>/dev/null &&
        mv -f "$OUT/logs.tar.gz.part" "$OUT/logs.tar.gz"
}

# Runs step $1 with its log in $WORK/$1.log, in $WORK, for at most $2 seconds, cut to what
# the whole run's budget has left. Sets STEP_STATE (passed, failed, timed-out, skipped,
# not-run), STEP_RC and STEP_HOW (the words for the summary). Only failed and timed-out set
# FAILED: a step skipped for want of a GPU, or not run for want of time, is no failure.
step() {
    local name="$1" limit="$2" left start
    shift 2
    left=$((BUDGET_S - SECONDS - 15))
    if [ "$left" -lt 20 ]; then
        STEP_STATE=not-run STEP_RC=125 STEP_HOW="not run (the ${BUDGET_S} s budget is spent)"
        echo "$(stamp) $name: not run" >>"$WORK/progress.txt"
        return 125
    fi
    if [ -n "$NO_GPU" ]; then
        STEP_STATE=skipped STEP_RC=0 STEP_HOW="skipped: $NO_GPU"
        echo "$(stamp) $name: skipped" >>"$WORK/progress.txt"
        return 0
    fi
    [ "$limit" -le "$left" ] || limit=$left
    echo "$(stamp) $name: started (limit $limit s)" >>"$WORK/progress.txt"
    start=$SECONDS
    STEP_RC=0
    (cd "$WORK" && exec timeout -k 10 "$limit" "$@") >"$WORK/$name.log" 2>&1 || STEP_RC=$?
    local took=$((SECONDS - start))
    case "$STEP_RC" in
        0) STEP_STATE=passed STEP_HOW="passed in $took s" ;;
        124 | 137) STEP_STATE=timed-out STEP_HOW="TIMED OUT after $took s (limit $limit s)" ;;
        *) STEP_STATE=failed STEP_HOW="FAILED, exit $STEP_RC, after $took s" ;;
    esac
    echo "$(stamp) $name: $STEP_HOW" >>"$WORK/progress.txt"
    if [ "$STEP_STATE" != passed ]; then
        FAILED=1
        {
            echo "== $name: $STEP_HOW"
            # The first panics say why; the tail says where it stopped.
            grep -m 3 -A 4 'panicked at' "$WORK/$name.log" && echo "-- log ends:"
            tail -n 40 "$WORK/$name.log"
            echo
        } >>"$OUT/failures.txt"
        STEP_HOW="$STEP_HOW (log ends: $(tail -c 2000 "$WORK/$name.log" | tr '\r' '\n' |
            grep -v '^[[:space:]]*$' | tail -n 1 | cut -c 1-200))"
    fi
    return "$STEP_RC"
}

# Test binary $1 (limit $2 s; more harness flags, such as a filter, in $4...) as step $3
# (default $1): its verdict, the harness's result line and the names of failed tests.
test_step() {
    local t="$1" limit="$2" name="${3:-$1}"
    shift 3 2>/dev/null || shift $#
    step "$name" "$limit" "$BIN/$t" --test-threads 1 --nocapture "$@"
    local result="" failed=""
    if [ -f "$WORK/$name.log" ]; then
        result=$(grep -E '^test result' "$WORK/$name.log" | tail -n 1)
        failed=$(grep -E '^test .* \.\.\. FAILED$' "$WORK/$name.log" |
            sed -E 's/^test (.*) \.\.\. FAILED$/\1/' | paste -sd ' ' -)
    fi
    # The harness's result line says what the log's last line would.
    [ -z "$result" ] || STEP_HOW="${STEP_HOW%% (log ends:*}"
    note "test $name: $STEP_HOW${result:+; $result}${failed:+; failed: $failed}"
    pack
}

# A zero-bench run: its verdict and the table's closing line; the table goes to bench.txt.
bench_step() {
    local name="$1" limit="$2"
    shift 2
    step "$name" "$limit" "$@"
    local avg=""
    if [ "$STEP_STATE" = passed ] || [ "$STEP_STATE" = failed ]; then
        avg=$(grep -E '^# Avg bus' "$WORK/$name.log" || tail -n 1 "$WORK/$name.log")
        { echo "== $name: $*"; cat "$WORK/$name.log"; echo; } >>"$OUT/bench.txt"
    fi
    note "$name: $STEP_HOW${avg:+; $avg}"
    pack
}

# Whether this machine has a GPU to check: NO_GPU is empty when it has, else the reason.
detect_gpu() {
    NO_GPU=""
    if [ "${GPU_CHECK_DRY_RUN:-0}" = 1 ]; then
        NO_GPU="dry run (GPU_CHECK_DRY_RUN=1)"
    elif [ "${GPU_CHECK_ASSUME_GPU:-0}" = 1 ]; then
        NO_GPU=""
    # grep -c reads all of nvidia-smi's output: an early exit (grep -q) could fail the
    # pipeline with SIGPIPE under pipefail and hide a GPU.
    elif [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" = 0 ]; then
        NO_GPU="no GPU (nvidia-smi lists none)"
    fi
}

# The folder of the binaries gpu-check.sh build made: GPU_CHECK_BIN, this script's own
# folder (gpu-bin/), or gpu-bin/ beside scripts/. Empty when none holds them.
find_bin() {
    local d
    for d in "${GPU_CHECK_BIN:-}" "$here" "$here/../gpu-bin"; do
        if [ -n "$d" ] && [ -f "$d/${TESTS[0]}" ]; then
            (cd "$d" && pwd)
            return
        fi
    done
}

# The steps that matter most, for a first call of at most 6 minutes: the kernels against
# the CPU, NCCL at world size 1, the stages equal on the GPU, one GPT-2 training step.
first_steps() {
    step preflight 20 "$BIN/zero-train" --version
    note "preflight (zero-train --version runs here): $STEP_HOW"
    test_step cuda_kernels 60
    test_step cuda_model 45
    test_step kernels_cuda 45
    local never_joins=a_group_whose_peer_never_joins_fails_within_its_timeout
    test_step nccl_device 60 nccl_device --skip "$never_joins"
    if data_ready; then
        train_one gpt2-step 60 "${GPT2[@]}" --steps 2 --world-size 1 --zero-stage 0 \
            --micro-batch-size 16 --batch-size 16
    fi
    # The longest, last: a hang here costs no other step of the tier.
    test_step cuda_stages 150
}

# The rest, in order of value, as far as the budget goes.
rest_steps() {
    local never_joins=a_group_whose_peer_never_joins_fails_within_its_timeout
    # The join-timeout test waits out its 5 s timeout: a step of its own, so a hang in
    # NCCL's abort costs that step only.
    test_step nccl_device 45 nccl_device-peer-never-joins --exact "$never_joins"
    test_step device_local_cuda 60
    train_runs
    bench_step zero-bench-nccl 90 env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 \
        MASTER_PORT=29517 "$BIN/zero-bench" all_reduce --backend nccl -b 1K -e 1G -f 4 -n 20 -w 5
    test_step cuda_offload 90
    test_step gpt_generic 60
    later_train_runs
    bench_step zero-bench-device-local 90 "$BIN/zero-bench" all_reduce --device cuda --ranks 4 \
        -b 1K -e 1G -f 4 -n 20 -w 5
    gpt2_more_stages
    expect_memory_refusal
    test_step nvrtc_compile 45
    test_step kernels_nvrtc 30
    test_step device_local_nvrtc 30
}

# What the GPU steps need from the machine: the CUDA libraries where cudarc finds them, the
# tests' strictness, reproducible cuBLAS, NCCL on one node, and the load sampled each second.
prepare_gpu() {
    { nvidia-smi || echo "nvidia-smi failed"; } >"$WORK/nvidia-smi.txt" 2>&1
    # Not in a subshell: link_libs exports LD_LIBRARY_PATH for the steps below.
    link_libs "${TMPDIR:-/tmp}/zero-gpu-check-libs" >"$WORK/libs.txt" 2>&1
    export ZERO_GPT_REQUIRE_GPU=1 ZERO_GPT_REQUIRE_NVRTC=1 ZERO_COMM_REQUIRE_GPU=1 RUST_BACKTRACE=1
    # cuBLAS is bitwise reproducible run to run only with a fixed workspace configuration
    # (cuBLAS docs, "Results reproducibility"); the stage tests compare runs bit for bit.
    export CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"
    # One node: NCCL's bootstrap on loopback, no InfiniBand probing; its warnings in the logs.
    export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}" NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}"
    export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
    nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu,power.draw --format=csv -l 1 \
        >"$WORK/gpu-usage.csv" 2>&1 &
    SAMPLER=$!
}

run() {
    set +e # every step runs whatever the earlier ones did
    local tier="${1:-all}"
    case "$tier" in
        first | rest | all) ;;
        *) echo "usage: $0 run [first|rest|all]" >&2; exit 2 ;;
    esac
    BUDGET_S="${GPU_CHECK_BUDGET_S:-360}"
    if ! [[ "$BUDGET_S" =~ ^[0-9]{1,6}$ ]]; then
        echo "gpu-check: GPU_CHECK_BUDGET_S=$BUDGET_S: expected whole seconds" >&2
        exit 2
    fi
    detect_gpu
    BIN=$(find_bin)
    if [ -z "$BIN" ] && [ -z "$NO_GPU" ]; then
        echo "gpu-check: no test binaries in $here or $here/../gpu-bin: run" \
            "'bash scripts/gpu-check.sh build' first (it needs cargo; the GPU machine has none)" >&2
        exit 2
    fi
    OUT="${OUT:-target/gpu-check}"
    WORK="${GPU_CHECK_WORK:-${TMPDIR:-/tmp}/zero-gpu-check}"
    mkdir -p "$OUT" && rm -rf "$WORK" && mkdir -p "$WORK" || exit 2
    OUT="$(cd "$OUT" && pwd)" WORK="$(cd "$WORK" && pwd)"
    rm -f "$OUT"/summary.txt "$OUT"/failures.txt "$OUT"/bench.txt "$OUT"/logs.tar.gz*
    : >"$OUT/summary.txt"
    : >"$WORK/progress.txt"
    FAILED=0 SAMPLER=""
    local gpu
    gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
        head -n 1)
    note "gpu-check run $tier $(date -u '+%Y-%m-%d %H:%M:%S UTC'), budget ${BUDGET_S} s; GPU: ${gpu:-${NO_GPU:-see nvidia-smi.txt}}"
    [ -n "$BIN" ] || note "binaries: none built here (a dry run needs none)"
    # A copy that lost the executable bits must not fail every step.
    [ -z "$BIN" ] || chmod u+x "$BIN"/zero-* "${ALL_TESTS[@]/#/$BIN/}" 2>/dev/null
    if [ -n "$BIN" ] && [ -d "$BIN/cubin" ]; then
        # Kernels compiled ahead by `build`: no process compiles them again (zero-alloc's
        # nvrtc::prebuilt; another architecture still compiles with NVRTC).
        export ZERO_CUBIN_DIR="$BIN/cubin"
        note "prebuilt kernels: $(find "$BIN/cubin" -name '*.cubin' | wc -l) CUBINs in $BIN/cubin"
    fi
    # The GPU machine's memory reads small at first and grows as it is used (128 GiB in all),
    # so the host-memory checks read this figure instead of MemAvailable.
    export ZERO_HOST_MEMORY="${GPU_CHECK_HOST_MEMORY:-100G}"
    [ -n "$NO_GPU" ] || prepare_gpu
    { env | grep -E '^(LD_LIBRARY_PATH|CUDA|CUBLAS|NCCL|ZERO)' | sort; ldd --version 2>&1 | head -n 1; } \
        >"$WORK/env.txt"
    pack
    case "$tier" in first | all) first_steps ;; esac
    case "$tier" in rest | all) rest_steps ;; esac
    [ -z "$SAMPLER" ] || kill "$SAMPLER" 2>/dev/null
    local verdict="no step failed"
    [ "$FAILED" -eq 0 ] || verdict="SOME STEPS FAILED (their log tails: failures.txt)"
    note "gpu-check: finished at $(stamp): $verdict; every log in logs.tar.gz"
    pack
    return "$FAILED"
}

# zero-train --device cuda, in order of value: the engine over NCCL (one rank, torchrun's
# variables, control traffic over TCP) beside the device-local backend at the same world size,
# their losses compared; then GPT-2 124M (bf16, T = 1024, 8 steps) at stage 0 with one rank
# and at stage 3 with four ranks on the GPU, the same 16 sequences a step.
TORCHRUN_ONE=(env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29518)
GPT2=(--model gpt2 --seq-len 1024 --precision bf16 --warmup-steps 0)
# Each zero-train run's state (passed, failed, ...), for the comparisons between runs.
declare -A RUN_STATE=()

train_runs() {
    data_ready || return
    local n1=(--world-size 1 --zero-stage 2 --steps 10)
    train_one device-local-n1 45 "${n1[@]}"
    train_one nccl-n1 60 "${n1[@]}" --backend nccl
    compare_losses device-local-n1 nccl-n1
    train_one gpt2-stage0-n1 120 "${GPT2[@]}" --steps 8 --world-size 1 --zero-stage 0 \
        --micro-batch-size 16 --batch-size 16
    train_one gpt2-stage3-n4 120 "${GPT2[@]}" --steps 8 --world-size 4 --zero-stage 3 \
        --micro-batch-size 4 --batch-size 16
    compare_step_times gpt2-stage0-n1 gpt2-stage3-n4
}

# The default model at N_d = 2, stage 3, 20 steps, and the same with its activation
# checkpoints offloaded to pinned host memory.
later_train_runs() {
    data_ready || return
    local smoke=(--world-size 2 --zero-stage 3 --steps 20)
    train_one smoke 60 "${smoke[@]}"
    train_one smoke-offload 60 "${smoke[@]}" --activation-checkpointing --offload-activations
}

# GPT-2 124M at stages 1 and 2 with four ranks (peak memory per rank at every stage), stage 2
# again with the optimizer offloaded to the host (ZeRO-Offload: same losses, its peak and its
# cost in step time), then stage 0 at micro-batch 32 (is a larger micro-batch faster, and does
# it fit).
gpt2_more_stages() {
    data_ready || return
    local stage
    for stage in 1 2; do
        train_one "gpt2-stage$stage-n4" 90 "${GPT2[@]}" --steps 8 --world-size 4 --zero-stage "$stage" \
            --micro-batch-size 4 --batch-size 16
    done
    train_one gpt2-stage2-n4-offload 90 "${GPT2[@]}" --steps 8 --world-size 4 --zero-stage 2 \
        --micro-batch-size 4 --batch-size 16 --offload-optimizer
    compare_losses gpt2-stage2-n4 gpt2-stage2-n4-offload
    compare_step_times gpt2-stage2-n4 gpt2-stage2-n4-offload \
        "no target: the cost of the host AdamW and the copies"
    train_one gpt2-stage0-n1-mb32 90 "${GPT2[@]}" --steps 8 --world-size 1 --zero-stage 0 \
        --micro-batch-size 32 --batch-size 32
}

# GPT-2 XL at stage 0 on 8 ranks sharing the GPU plans far beyond its memory (16 bytes a
# parameter, 1.56 B parameters, per rank): zero-train must refuse at start-up, naming the GPU's
# memory and what fits, instead of failing in an allocation. Passes only on that refusal.
expect_memory_refusal() {
    data_ready || return
    local failed_before=$FAILED name=gpu-memory-refusal
    step "$name" 60 "$BIN/zero-train" --device cuda --data "$BIN/data" --model gpt2-xl \
        --seq-len 1024 --world-size 8 --zero-stage 0 --micro-batch-size 1 --batch-size 8 \
        --steps 1 --eval-every 0 --sample-tokens 0
    local log="$WORK/$name.log" hint
    case "$STEP_STATE" in
        skipped | not-run) note "zero-train $name: $STEP_HOW" ;;
        failed)
            if grep -q "the GPU's total memory" "$log"; then
                FAILED=$failed_before
                hint=$(grep -o "[^;]*; [^.]*fits[^.]*" "$log" | head -n 1 | sed 's/.*; //')
                note "zero-train $name: passed: refused at start-up (${hint:-see $name.log})"
            else
                note "zero-train $name: FAILED: its error names no GPU memory ($STEP_HOW)"
            fi
            ;;
        *)
            FAILED=1
            note "zero-train $name: FAILED: no start-up refusal naming the GPU's memory ($STEP_HOW)"
            ;;
    esac
    pack
}

# True when the zero-train runs can start: the token files travelled with the binaries (or,
# in a dry run, the steps are skipped anyway).
data_ready() {
    [ -n "$NO_GPU" ] && return 0
    [ -f "$BIN/data/train.bin" ] && return 0
    note "zero-train --device cuda: not run (no token files in $BIN/data)"
    return 1
}

# zero-train run $1 (limit $2 s, flags $3...) on the GPU; its metrics summarised in summary.txt.
train_one() {
    local name="$1" limit="$2"
    shift 2
    local launch=()
    case " $* " in *" --backend nccl "*) launch=("${TORCHRUN_ONE[@]}") ;; esac
    rm -f "$WORK/$name.jsonl"
    step "$name" "$limit" "${launch[@]}" "$BIN/zero-train" --device cuda --data "$BIN/data" \
        --eval-every 0 --sample-tokens 0 "$@" --metrics "$WORK/$name.jsonl"
    RUN_STATE[$name]=$STEP_STATE
    case "$STEP_STATE" in skipped | not-run) note "zero-train $name: $STEP_HOW"; pack; return ;; esac
    local line
    line=$(timeout 30 python3 - "$WORK/$name.jsonl" "$name" "${GPU_PEAK_FLOPS:-989.4e12}" <<'PY' 2>&1
import json, os, sys
path, name, peak_flops = sys.argv[1], sys.argv[2], float(sys.argv[3])
rows = []
if os.path.exists(path):
    for line in open(path):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass  # a line cut by a timeout
steps = [r for r in rows if "tokens_per_s" in r]
if not steps:
    print("no steps recorded")
    sys.exit(0)
tail = steps[2:] or steps  # the first steps pay for NVRTC, cuBLAS heuristics, arena growth
tok = sum(r["tokens_per_s"] for r in tail) / len(tail)
step_ms = sum(r["step_ms"] for r in tail) / len(tail)
text = (f"{len(steps)} steps, loss {steps[0]['loss']:.4f} -> {steps[-1]['loss']:.4f}, "
        f"{tok:.0f} tok/s, {step_ms:.1f} ms/step (mean of steps {tail[0]['step']}-{tail[-1]['step']})")
summary = next((r for r in rows if r.get("summary")), None)
if name.startswith("gpt2"):
    # llm.c's count: 6N + 6LCT FLOPs per token, GPT-2 124M's L, C, T, over the dense bf16 peak.
    L, C, T = 12, 768, 1024
    n = summary["num_params"] if summary else 50304 * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    mfu = tok * (6 * n + 6 * L * C * T) / peak_flops
    text += f", MFU {100 * mfu:.1f}% (N = {n}, peak {peak_flops / 1e12:.1f} TFLOP/s)"
if summary:
    peaks = ", ".join(f"r{r['rank']} {r['peak_bytes'] / 2**20:.0f}" for r in summary["ranks"])
    text += f", peak arena MiB per rank: {peaks}"
else:
    text += f", peak arena rank 0: {max(r.get('peak_bytes', 0) for r in steps) / 2**20:.0f} MiB (no summary line)"
print(text)
PY
)
    note "zero-train $name: $STEP_HOW; $line"
    pack
}

# The losses of runs $1 and $2, step by step: equal within 1e-5 relative, or the check fails.
compare_losses() {
    local line rc=0
    if [ "${RUN_STATE[$1]:-}" != passed ] || [ "${RUN_STATE[$2]:-}" != passed ]; then
        note "losses $1 vs $2: not compared ($1 ${RUN_STATE[$1]:-not run}, $2 ${RUN_STATE[$2]:-not run})"
        return
    fi
    line=$(timeout 30 python3 - "$WORK/$1.jsonl" "$WORK/$2.jsonl" <<'PY' 2>&1
import json, os, sys
def losses(path):
    out = []
    if os.path.exists(path):
        for line in open(path):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "tokens_per_s" in r:
                out.append(r["loss"])
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
if not a or not b:
    print(f"not compared: {len(a)} and {len(b)} steps recorded")
    sys.exit(1)
worst = max((abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b)), default=float("inf"))
same = len(a) == len(b) > 0 and worst <= 1e-5
print(f"{len(a)} and {len(b)} steps, worst relative difference {worst:.3g}: "
      f"{'equal within 1e-5' if same else 'DIFFERENT'}")
sys.exit(0 if same else 1)
PY
) || rc=$?
    [ "$rc" -eq 0 ] || FAILED=1
    note "losses $1 vs $2: $line"
}

# Run $2's mean step time against run $1's, with the target $3 (default: the issue's, stage 3
# at N_d = 4 within 30% of stage 0).
compare_step_times() {
    local line target="${3:-target: at most 1.30x}"
    if [ "${RUN_STATE[$1]:-}" != passed ] || [ "${RUN_STATE[$2]:-}" != passed ]; then
        note "step time $2 / $1: not compared ($1 ${RUN_STATE[$1]:-not run}, $2 ${RUN_STATE[$2]:-not run})"
        return
    fi
    line=$(timeout 30 python3 - "$WORK/$1.jsonl" "$WORK/$2.jsonl" "$target" <<'PY' 2>&1
import json, os, sys
def mean_step_ms(path):
    rows = []
    if os.path.exists(path):
        for line in open(path):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    ms = [r["step_ms"] for r in rows if "step_ms" in r][2:]
    return sum(ms) / len(ms) if ms else None
a, b = mean_step_ms(sys.argv[1]), mean_step_ms(sys.argv[2])
if a is None or b is None:
    print("not comparable (a run has fewer than 3 steps)")
else:
    print(f"{b:.1f} ms / {a:.1f} ms = {b / a:.2f}x ({sys.argv[3]})")
PY
)
    note "step time $2 / $1: $line"
}

case "$mode" in
    build) build ;;
    run) run "${2:-all}" ;;
    *) echo "usage: $0 build | run [first|rest|all]" >&2; exit 2 ;;
esac
