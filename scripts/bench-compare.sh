#!/usr/bin/env bash
# Compares zero-train's training step of the working tree with that of another revision, on
# this machine, runs alternating so that both see the same load:
#
#   bash scripts/bench-compare.sh REV [-- ZERO-TRAIN FLAGS]
#   bash scripts/bench-compare.sh main
#   REPS=7 STEPS=12 bash scripts/bench-compare.sh 9a06996 -- --world-size 2 --zero-stage 3
#   TREE_EXTRA="--offload-optimizer" bash scripts/bench-compare.sh . -- --zero-stage 2
#
# REV `.` is the working tree itself: with TREE_EXTRA (flags added to the tree side only) it
# measures what a flag costs, against the same build without it.
# 1. REV is checked out in a scratch worktree (target/bench-compare/rev) and built in release
#    mode in a target folder of its own (target/bench-compare/target-rev, kept for the next
#    comparison), the working tree in the project's; both binaries are copied beside them.
# 2. A generated corpus of GPT-2 tokens is prepared once (no download).
# 3. REPS times (default 5), in the order REV, tree, tree, REV, ... (ABBA, so neither side
#    always runs first), each binary trains STEPS steps (default 8) with the flags (default:
#    --model small --seq-len 64 --world-size 1 --batch-size 4 --micro-batch-size 4); a run's
#    time is the median step time of its steps after the first two (warm-up).
# 4. Prints each side's median over the runs, the ratio tree / REV (above 1: the tree is
#    slower) and whether the two sides' losses are equal to the bit.
# Exit status: 0 when it measured (a slowdown is reported, not failed), 1 when a build or run
# failed, 2 on a usage error.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

usage() {
    echo "usage: $0 REV [-- ZERO-TRAIN FLAGS]   (REPS, STEPS: counts, default 5 and 8)" >&2
    exit 2
}
[ $# -ge 1 ] || usage
rev="$1"
shift
if [ $# -gt 0 ]; then
    [ "$1" = -- ] || usage
    shift
fi
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(--model small --seq-len 64 --world-size 1 --batch-size 4
    --micro-batch-size 4)
read -r -a tree_extra <<<"${TREE_EXTRA:-}"
[ "$rev" != . ] || [ ${#tree_extra[@]} -gt 0 ] ||
    { echo "bench-compare: REV . compares the tree with itself; give TREE_EXTRA" >&2; exit 2; }
reps="${REPS:-5}" steps="${STEPS:-8}"
for n in "$reps" "$steps"; do
    [[ "$n" =~ ^[0-9]{1,3}$ ]] && [ "$n" -ge 1 ] || {
        echo "bench-compare: REPS and STEPS are counts from 1 to 999" >&2
        exit 2
    }
done
[ "$steps" -ge 3 ] || { echo "bench-compare: STEPS must be at least 3 (two are warm-up)" >&2; exit 2; }
if [ "$rev" != . ]; then
    commit=$(git rev-parse --verify --quiet "$rev^{commit}") ||
        { echo "bench-compare: $rev is not a revision of this repository" >&2; exit 2; }
fi

work="$root/target/bench-compare"
mkdir -p "$work"

# Builds zero-train from the tree at $1 in the target folder $2 and copies it to $3. Each
# side has its own target folder: cargo names a workspace crate's artefacts by its path
# inside the workspace, so two checkouts sharing one folder can link each other's crates.
# The binary is named without its package: before the crate split (9a06996 and older) it
# belonged to the package `zero`, since then to `zero-train`.
build() {
    (cd "$1" && CARGO_TARGET_DIR="$2" cargo build --release --quiet --bin zero-train)
    cp "$2/release/zero-train" "$3"
}

if [ "$rev" = . ]; then
    echo "== building the working tree (both sides; the tree side adds: ${tree_extra[*]})"
    build "$root" "${CARGO_TARGET_DIR:-$root/target}" "$work/zero-train-tree"
    cp "$work/zero-train-tree" "$work/zero-train-rev"
else
    echo "== building $rev ($commit) and the working tree"
    git worktree remove --force "$work/rev" >/dev/null 2>&1 || rm -rf "$work/rev"
    git worktree add --detach "$work/rev" "$commit" >/dev/null
    trap 'git worktree remove --force "$work/rev" >/dev/null 2>&1 || true' EXIT
    build "$work/rev" "$work/target-rev" "$work/zero-train-rev"
    build "$root" "${CARGO_TARGET_DIR:-$root/target}" "$work/zero-train-tree"
fi

if [ ! -f "$work/data/train.bin" ]; then
    for i in $(seq 1 20000); do
        echo "Line $i: the quick brown fox $((i % 17)) jumps over the lazy dog $((i * 7 % 23))."
    done >"$work/corpus.txt"
    "$work/zero-train-tree" prepare --text "$work/corpus.txt" --out "$work/data" >/dev/null
fi

# Trains with binary $1, metrics to $2, the flags and then the rest of its arguments; prints
# the median step time in ms (steps 3 and on).
one_run() {
    local bin="$1" metrics="$2"
    shift 2
    "$bin" --data "$work/data" "${flags[@]}" "$@" --steps "$steps" --eval-every 0 \
        --sample-tokens 0 --metrics "$metrics" >"$metrics.log" 2>&1 ||
        { cat "$metrics.log" >&2; return 1; }
    python3 - "$metrics" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step_ms"' in l]
print(f"{statistics.median(r['step_ms'] for r in rows[2:]):.2f}")
PY
}

echo "== ${reps} runs each of: zero-train ${flags[*]} --steps $steps (tree side adds: ${tree_extra[*]:-nothing})"
rev_ms=() tree_ms=()
for i in $(seq 1 "$reps"); do
    order=(rev tree)
    [ $((i % 2)) -eq 0 ] && order=(tree rev)
    for side in "${order[@]}"; do
        extra=()
        [ "$side" = rev ] || extra=("${tree_extra[@]}")
        ms=$(one_run "$work/zero-train-$side" "$work/$side-$i.jsonl" "${extra[@]}")
        if [ "$side" = rev ]; then rev_ms+=("$ms"); else tree_ms+=("$ms"); fi
        echo "run $i $side: $ms ms/step"
    done
done

label="$rev"
[ "$rev" != . ] || label="tree without '${tree_extra[*]}'"
python3 - "$label" "${rev_ms[*]}" "${tree_ms[*]}" "$work/rev-1.jsonl" "$work/tree-1.jsonl" <<'PY'
import json, statistics, sys
rev, a, b = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
ma, mb = statistics.median(a), statistics.median(b)
losses = lambda p: [json.loads(l)["loss"] for l in open(p) if '"step_ms"' in l]
same = losses(sys.argv[4]) == losses(sys.argv[5])
print(f"median step: {rev} {ma:.2f} ms, working tree {mb:.2f} ms; tree / {rev} = {mb / ma:.3f}")
print(f"losses: {'equal to the bit' if same else 'DIFFERENT'} ({len(losses(sys.argv[4]))} steps)")
PY
