#!/usr/bin/env bash
# The chaos run: a 50-step training run under `zero-train launch` (2 TCP ranks, saving every
# step) meets seeded random faults of every kind, one failing fault per attempt (kill, hang,
# corrupt with --comm-checksums, diverge) plus slow ranks along the way, and must
#   1. finish (the launcher restarts it from the newest complete state each time),
#   2. name every fault in its log: the rank's "injecting fault SPEC" line, and for each
#      failing one the error that names it,
#   3. end with the parameters and Adam moments of the unbroken run (local backend, no
#      faults), byte for byte, and its last loss.
#
#   bash scripts/chaos.sh [SEED] [FAULTS]     (defaults: seed 1, 12 faults; at least 5;
#                                              50 gives 10 of each kind)
#
# Bounded in time: each attempt is bounded by --comm-timeout (2 s) and the launcher's
# 5 s grace, and the whole run by `timeout`.
set -euo pipefail
cd "$(dirname "$0")/.."

seed=${1:-1}
faults=${2:-12}
if ((faults < 5)); then
  echo "chaos.sh: at least 5 faults (one of each kind)" >&2
  exit 1
fi
RANDOM=$seed

zt=$(bash scripts/cargo-exe.sh bin zero-train --workspace)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for i in $(seq 1 3000); do
  echo "Line $i: the quick brown fox $((i % 17)) jumps over the lazy dog $((i * 7 % 23))."
done >"$work/corpus.txt"
"$zt" prepare --text "$work/corpus.txt" --out "$work/data" >/dev/null 2>&1

steps=50
flags=(--data "$work/data" --layers 2 --heads 2 --dim 64 --seq-len 32 --steps "$steps"
  --batch-size 4 --micro-batch-size 1 --sample-tokens 0 --eval-every 0 --save-every 1
  --keep-last 2 --comm-timeout 2 --comm-checksums --fingerprint-every 5)

# The faults: the five kinds in turn (50 faults: 10 of each), slow ones with random pauses;
# steps random, sorted, so that each attempt's fault lies at or after the step the attempt
# resumes from. Failing faults go to attempts 0, 1, 2, ... in order; a slow rank rides along
# in the attempt of the next failing one.
kinds=()
for ((i = 0; i < faults; i++)); do
  case $((i % 5)) in 0) kinds+=(kill) ;; 1) kinds+=(hang) ;; 2) kinds+=(corrupt) ;;
    3) kinds+=(diverge) ;; *) kinds+=("slow=$((10 + RANDOM % 40))") ;; esac
done
# Shuffle the kinds, draw sorted steps in 1..steps-1.
mapfile -t kinds < <(for k in "${kinds[@]}"; do echo "$RANDOM $k"; done | sort -n | cut -d' ' -f2)
mapfile -t at < <(for ((i = 0; i < faults; i++)); do echo $((1 + RANDOM % (steps - 1))); done |
  sort -n)
specs=()
attempt=0
for ((i = 0; i < faults; i++)); do
  spec="${kinds[$i]}:rank=$((RANDOM % 2)),step=${at[$i]},attempt=$attempt"
  specs+=("$spec")
  [[ ${kinds[$i]} == slow=* ]] || attempt=$((attempt + 1))
done
restarts=$attempt
echo "chaos.sh: seed $seed, $faults faults, $restarts failing:"
printf '  %s\n' "${specs[@]}"
inject=()
for s in "${specs[@]}"; do inject+=(--inject-fault "$s"); done

echo "== the unbroken run (local backend, 2 ranks)"
timeout 600 "$zt" "${flags[@]}" --backend local --world-size 2 --save "$work/unbroken" \
  --metrics "$work/unbroken.jsonl" >"$work/unbroken.log" 2>&1 ||
  { cat "$work/unbroken.log"; exit 1; }

echo "== the chaos run (zero-train launch, 2 TCP ranks, --max-restarts $restarts)"
began=$(date +%s)
status=0
timeout 1800 "$zt" launch --nproc-per-node 2 --max-restarts "$restarts" -- "${flags[@]}" \
  "${inject[@]}" --save "$work/chaos" --metrics "$work/chaos.jsonl" >"$work/chaos.log" 2>&1 ||
  status=$?
echo "chaos.sh: the launch took $(($(date +%s) - began)) s and exited with $status"
fail() { grep -E "zero-train launch|injecting|error" "$work/chaos.log" >&2 || true; echo "chaos.sh: $1" >&2; exit 1; }
((status == 0)) || fail "the run did not finish"

# 2. Every fault named.
for s in "${specs[@]}"; do
  grep -qF "injecting fault $s" "$work/chaos.log" || fail "no injection line for $s"
  rank=${s#*rank=}; rank=${rank%%,*}
  case $s in
    kill:*) needle="injected fault kill on rank $rank at" ;;
    hang:*) needle="timed out after" ;;
    corrupt:*) needle="payload checksums differ" ;;
    diverge:*) needle="rank $rank ran a program it did not declare" ;;
    slow=*) continue ;;
  esac
  grep -qF "$needle" "$work/chaos.log" || fail "$s was not named ($needle)"
done
summaries=$(grep -c "^zero-train launch: attempt" "$work/chaos.log" || true)
((summaries == restarts)) || fail "$summaries restart summaries, expected $restarts"

# 3. The unbroken run's final state and loss.
for piece in "$work/unbroken/step-0000$steps"/rank-*.bin; do
  cmp -s "$piece" "$work/chaos/step-0000$steps/$(basename "$piece")" ||
    fail "$(basename "$piece") of step $steps differs from the unbroken run's"
done
want=$(grep -o '"loss":[^,]*' "$work/unbroken.jsonl" | tail -n1)
got=$(grep -o '"loss":[^,]*' "$work/chaos.jsonl" | tail -n1)
[[ -n $want && $want == "$got" ]] || fail "last loss $got, unbroken $want"
echo "chaos.sh: finished after $restarts restarts; every fault named; step $steps's states" \
  "and last loss ($want) equal the unbroken run's to the bit"
