#!/usr/bin/env bash
# The paper's super-linear mechanism in miniature (docs/zero.md): under one per-rank cap at
# stage 3, the largest micro-batch that fits at N_d = 1, 2, 4, 8 (zero-train plan, confirmed
# by a one-step run under the cap, and the next micro-batch refused by it), and the tokens/s
# one rank reaches alone at that micro-batch. Prints a markdown table.
#
#   scripts/superlinear.sh [CAP]          (default 200M)
#
# ZERO_TRAIN: the zero-train binary (default target/release/zero-train). The model: 4 blocks,
# width 256, vocabulary 16384 (7.37M parameters), T = 64, fp32, local backend.
set -euo pipefail
cd "$(dirname "$0")/.."
zt=${ZERO_TRAIN:-$PWD/target/release/zero-train}
cap=${1:-200M}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 scripts/synthetic-tokens.py "$work" 16384
model=(--model tiny --layers 4 --dim 256 --heads 4 --vocab 16384 --seq-len 64 --precision fp32
  --zero-stage 3 --data "$work" --sample-tokens 0 --eval-every 0)

# True when the plan of micro-batch $2 on $1 ranks fits the cap at stage 3.
fits() {
  "$zt" plan "${model[@]}" --world-size "$1" --micro-batch-size "$2" --memory-limit "$cap" |
    awk -F' [|] ' '$1 == 3 { exit ($NF ~ /^yes/ ? 0 : 1) }'
}

# A one-step run of micro-batch $2 on $1 ranks under the cap; its exit status.
trains() {
  "$zt" "${model[@]}" --world-size "$1" --micro-batch-size "$2" --batch-size $(($1 * $2)) \
    --steps 1 --memory-limit "$cap" >"$work/log" 2>&1
}

# Median tokens/s of steps 2-10 of one rank alone at micro-batch $1 (no cap).
alone() {
  "$zt" "${model[@]}" --world-size 1 --micro-batch-size "$1" --batch-size "$1" --steps 10 \
    --metrics "$work/alone.jsonl" >/dev/null 2>&1
  python3 -c '
import json, statistics, sys
tps = [l["tokens_per_s"] for l in map(json.loads, open(sys.argv[1])) if l.get("step", 0) >= 2]
print(f"{statistics.median(tps):.0f}")' "$work/alone.jsonl"
}

echo "cap $cap per rank, stage 3; load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| N_d | largest micro-batch (plan) | run at it under the cap | run at one more | tokens/s of one rank alone at it | per-rank throughput vs N_d = 1 |"
echo "|---:|---:|---|---|---:|---:|"
base=
for n in 1 2 4 8; do
  b=0
  while ((b < 256)) && fits "$n" $((b + 1)); do b=$((b + 1)); done
  ((b > 0)) || { echo "| $n | none fits | | | | |"; continue; }
  ok=refused
  if trains "$n" "$b"; then ok=trained; else tail -n1 "$work/log" >&2; fi
  over=trained
  if ! trains "$n" $((b + 1)); then
    over="refused"
    grep -q "memory-limit\|needs" "$work/log" || over="failed: $(tail -n1 "$work/log")"
  fi
  tps=$(alone "$b")
  base=${base:-$tps}
  awk -v n="$n" -v b="$b" -v ok="$ok" -v over="$over" -v t="$tps" -v base="$base" \
    'BEGIN { printf "| %d | %d | %s | %s | %d | %.2fx |\n", n, b, ok, over, t, t / base }'
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
