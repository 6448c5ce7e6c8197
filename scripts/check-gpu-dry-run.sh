#!/usr/bin/env bash
# The GPU check's own packaging, tested on a machine without a GPU (scripts/test.sh runs it):
#   1. a dry run (GPU_CHECK_DRY_RUN=1): every step skipped, exit 0, in seconds; $OUT holds
#      summary.txt and logs.tar.gz only, the archive holds the summary and progress.txt;
#   2. a spent budget (GPU_CHECK_BUDGET_S=10): every step "not run", still exit 0;
#   3. stand-in binaries with GPU_CHECK_ASSUME_GPU=1, one test failing: exit 1, that step
#      FAILED with its failed test named, its log's tail in failures.txt, the others passed,
#      zero-bench's table in bench.txt, at most 8 files in $OUT;
#   4. a tier that does not exist: exit 2.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
    echo "check-gpu-dry-run: $*" >&2
    for f in "$tmp"/out*/summary.txt; do [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }; done
    exit 1
}

# Runs the check with $1 as $OUT (and its own work folder), the rest as env assignments;
# prints the exit status.
check() {
    local out="$1"
    shift
    local rc=0
    env OUT="$out" GPU_CHECK_WORK="$out-work" "$@" bash scripts/gpu-check.sh run "${TIER:-all}" \
        >"$out.log" 2>&1 || rc=$?
    echo "$rc"
}

files_in() { find "$1" -type f | wc -l; }

# 1. Dry run.
start=$SECONDS
rc=$(check "$tmp/out1" GPU_CHECK_DRY_RUN=1)
[ "$rc" = 0 ] || fail "dry run: exit $rc"
[ $((SECONDS - start)) -lt 60 ] || fail "dry run took $((SECONDS - start)) s"
[ "$(files_in "$tmp/out1")" = 2 ] || fail "dry run: $(files_in "$tmp/out1") files in OUT, expected 2"
skipped=$(grep -c ': skipped: dry run' "$tmp/out1/summary.txt" || true)
[ "$skipped" -ge 25 ] || fail "dry run: $skipped skipped steps, expected every step (>= 25)"
! grep -qE 'FAILED|TIMED OUT|passed in' "$tmp/out1/summary.txt" || fail "dry run: a step ran"
listing=$(tar -tzf "$tmp/out1/logs.tar.gz")
grep -qx 'summary.txt' <<<"$listing" || fail "dry run: no summary in the archive"
grep -q 'progress.txt' <<<"$listing" || fail "dry run: no progress.txt in the archive"
echo "dry run: exit 0, $skipped steps skipped, 2 files in OUT"

# 2. Spent budget.
rc=$(check "$tmp/out2" GPU_CHECK_DRY_RUN=1 GPU_CHECK_BUDGET_S=10)
[ "$rc" = 0 ] || fail "spent budget: exit $rc"
notrun=$(grep -c ': not run (the 10 s budget is spent)' "$tmp/out2/summary.txt" || true)
[ "$notrun" -ge 25 ] || fail "spent budget: $notrun steps not run, expected >= 25"
echo "spent budget: exit 0, $notrun steps not run"

# 3. Stand-in binaries, one failing test.
bin="$tmp/bin"
mkdir -p "$bin/data"
: >"$bin/data/train.bin"
: >"$bin/data/val.bin"
for t in cuda_kernels cuda_model gpt_generic nvrtc_compile nccl_device device_local_cuda \
    device_local_nvrtc kernels_cuda kernels_nvrtc cuda_stages cuda_offload; do
    printf '#!/bin/sh\necho "test result: ok. 2 passed; 0 failed"\n' >"$bin/$t"
done
cat >"$bin/cuda_model" <<'SH'
#!/bin/sh
echo "test loss_matches_cpu ... ok"
echo "test gradients_match_cpu ... FAILED"
echo "thread panicked: unit 3 differs"
echo "test result: FAILED. 1 passed; 1 failed"
exit 101
SH
# zero-train: the refusal the memory step expects, else four steps of metrics where
# --metrics points (loss 10 - step/10, 50000 tokens/s, 80 ms a step).
cat >"$bin/zero-train" <<'SH'
#!/bin/sh
case " $* " in
*" gpt2-xl "*) echo "error: the plan needs more than the GPU's total memory; stage 3 fits"; exit 1 ;;
esac
metrics=""
while [ $# -gt 0 ]; do
    [ "$1" = --metrics ] && metrics="$2"
    shift
done
[ -z "$metrics" ] && exit 0
for i in 1 2 3 4; do
    echo "{\"step\":$i,\"loss\":10.$((10 - i)),\"tokens_per_s\":50000,\"step_ms\":80,\"peak_bytes\":1048576}"
done >"$metrics"
SH
printf '#!/bin/sh\necho "#  8  2  float  sum  -1  1.0  1.0  1.0  0"\necho "# Avg bus bandwidth    : 1.5"\n' \
    >"$bin/zero-bench"
chmod +x "$bin"/*
rc=$(check "$tmp/out3" GPU_CHECK_ASSUME_GPU=1 GPU_CHECK_BIN="$bin")
[ "$rc" = 1 ] || fail "one failing test: exit $rc, expected 1"
s="$tmp/out3/summary.txt"
grep -q '^test cuda_model: FAILED, exit 101.*failed: gradients_match_cpu' "$s" ||
    fail "the failing test is not named"
grep -q '^== cuda_model: FAILED' "$tmp/out3/failures.txt" || fail "no cuda_model in failures.txt"
grep -q 'unit 3 differs' "$tmp/out3/failures.txt" || fail "failures.txt lacks the log's tail"
grep -q '^test cuda_kernels: passed' "$s" || fail "cuda_kernels did not pass"
grep -q '^zero-train gpu-memory-refusal: passed: refused' "$s" || fail "the refusal step"
grep -q '^zero-bench-nccl: passed.*Avg bus bandwidth' "$s" || fail "zero-bench's line"
# GPT-2 124M at 50000 tokens/s: 6N + 6LCT = 6 * 124,475,904 + 6 * 12 * 768 * 1024 FLOPs a
# token (N as the summary script counts it without a summary line) over 989.4 TFLOP/s is 4.1%.
grep -q '^zero-train gpt2-step: passed in .* s; 4 steps, loss 10.9000 -> 10.6000, 50000 tok/s, 80.0 ms/step.*MFU 4.1%' "$s" ||
    fail "the GPT-2 run's figures"
grep -q '^losses device-local-n1 vs nccl-n1: 4 and 4 steps.*equal within 1e-5' "$s" ||
    fail "the losses' comparison"
grep -q 'Avg bus bandwidth' "$tmp/out3/bench.txt" || fail "no table in bench.txt"
n=$(files_in "$tmp/out3")
[ "$n" -le 8 ] || fail "$n files in OUT, at most 8 come back from the GPU machine"
failed=$(grep -cE 'FAILED|TIMED OUT' "$s" || true)
[ "$failed" = 2 ] || fail "$failed failing lines, expected 2 (cuda_model and the verdict)"
echo "stand-ins: exit 1, cuda_model FAILED and named, the rest passed, $n files in OUT"

# 4. An unknown tier.
rc=$(TIER=second check "$tmp/out4" GPU_CHECK_DRY_RUN=1)
[ "$rc" = 2 ] || fail "tier 'second': exit $rc, expected 2"
echo "check-gpu-dry-run: passed"
