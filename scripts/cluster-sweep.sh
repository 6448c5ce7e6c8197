#!/usr/bin/env bash
# Traffic against time on emulated hosts (docs/mpi.md, "Several hosts, emulated"): zero-train
# over MPI across 2 and 4 hosts of scripts/cluster.sh at each link rate, every stage, stage 3
# also without prefetch; beside each run the compute-only step time (one rank alone), the
# traffic's time at the link rate, zero-train plan's estimate, and whether the run's losses equal
# the local backend's to the bit. Prints a markdown table.
#
#   scripts/cluster-sweep.sh [RATE...]          (default: 1gbit 250mbit)
#
# ZERO_TRAIN: the zero-train binary (built with --features mpi; default target/release).
# Uses its own cluster (`zs`, subnet 10.79.0), made and removed here. The model: 2 blocks,
# width 256, vocabulary 512 (1.73M parameters), micro-batch 4 x 64 tokens per rank, fp32,
# 6 steps; step time is the median of steps 2-6 as rank 0 reports it; one thread per rank.
set -euo pipefail
cd "$(dirname "$0")/.."
export ZERO_CLUSTER=zs ZERO_CLUSTER_SUBNET=10.79.0 ZERO_CLUSTER_TIMEOUT=300
# One compute thread per rank: a host of the 2-core machine each, when there are 2.
export RAYON_NUM_THREADS=1
zt=${ZERO_TRAIN:-$PWD/target/release/zero-train}
export ZERO_TRAIN=$zt
rates=("$@")
((${#rates[@]})) || rates=(1gbit 250mbit)
work=$(mktemp -d)
trap 'rm -rf "$work"; scripts/cluster.sh down >/dev/null 2>&1 || true' EXIT

# A token file of vocabulary 512 (a repeating pattern with noise), in llm.c's format.
python3 scripts/synthetic-tokens.py "$work" 512
model=(--model tiny --layers 2 --dim 256 --heads 4 --vocab 512 --seq-len 64
  --micro-batch-size 4 --steps 6 --sample-tokens 0 --eval-every 0 --data "$work")

# Median step_ms of steps 2-6, and rank 0's bytes sent / received per step, of metrics $1.
summary() {
  python3 - "$1" <<'EOF'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
ms = [l["step_ms"] for l in lines if "step_ms" in l and l["step"] >= 2]
rank0 = next(l for l in lines if l.get("summary"))["ranks"][0]["comm_bytes_per_step"]
print(f'{statistics.median(ms):.1f} {rank0["bytes_sent"]:.0f} {rank0["bytes_received"]:.0f}')
EOF
}

# The plan's time for stage $1 at rate $2 on $3 ranks (the `time at the link rate` column).
plan_ms() {
  "$zt" plan "${model[@]}" --world-size "$3" --link-rate "$2" --zero-stage "$1" |
    awk -F' [|] ' -v s="$1" 'found && $1 == s { sub(/ ms.*/, "", $5); print $5; exit }
      /^communication per step/ { found = 1 }'
}

# Compute only, under the CPU sharing of an N-host run: N single-rank runs at once (no
# communication), one thread each like the ranks; the median step of the first.
compute_only() {
  local i pids=()
  for ((i = 0; i < $1; i++)); do
    "$zt" "${model[@]}" --world-size 1 --batch-size 4 --metrics "$work/alone-$i.jsonl" \
      >/dev/null 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  summary "$work/alone-0.jsonl" | cut -d' ' -f1
}
declare -A alone local_losses
for hosts in 2 4; do
  alone[$hosts]=$(compute_only "$hosts")
  echo "compute only, $hosts single-rank runs at once (micro-batch 4 x 64): ${alone[$hosts]} ms per step"
done
echo
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| hosts | link | stage | prefetch | sent/rank/step (MB) | received (MB) | on paper (ms) | plan (ms) | step (ms) | compute only (ms) | step - compute (ms) | hidden | losses = local |"
echo "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
for rate in "${rates[@]}"; do
  scripts/cluster.sh up 4 "$rate" >/dev/null
  bits=$(scripts/cluster.sh rate-bits "$rate")
  for hosts in 2 4; do
    head -n "$hosts" /run/zero-cluster/zs/hostfile >"$work/hostfile"
    for run in "0 2" "1 2" "2 2" "3 2" "3 0"; do
      read -r stage prefetch <<<"$run"
      scripts/cluster.sh run --hostfile "$work/hostfile" -- "${model[@]}" \
        --batch-size $((4 * hosts)) --zero-stage "$stage" --prefetch-units "$prefetch" \
        --metrics "$work/run.jsonl" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
      read -r step sent received < <(summary "$work/run.jsonl")
      # The same run on the local backend (once per configuration): losses equal to the bit?
      key="$hosts-$stage-$prefetch"
      if [[ -z ${local_losses[$key]:-} ]]; then
        "$zt" "${model[@]}" --world-size "$hosts" --batch-size $((4 * hosts)) \
          --zero-stage "$stage" --prefetch-units "$prefetch" --metrics "$work/local.jsonl" \
          >/dev/null 2>&1
        local_losses[$key]=$(grep -o '"loss":[^,]*' "$work/local.jsonl" | paste -sd' ')
      fi
      same=NO
      [[ $(grep -o '"loss":[^,]*' "$work/run.jsonl" | paste -sd' ') == "${local_losses[$key]}" ]] &&
        same=yes
      plan=$(plan_ms "$stage" "$rate" "$hosts")
      awk -v h="$hosts" -v r="$rate" -v st="$stage" -v p="$prefetch" -v s="$sent" \
        -v v="$received" -v b="$bits" -v plan="$plan" -v step="$step" -v c="${alone[$hosts]}" -v same="$same" 'BEGIN {
        paper = (s > v ? s : v) * 8 / b * 1e3
        printf "| %d | %s | %d | %s | %.2f | %.2f | %.1f | %s | %.1f | %.1f | %.1f | %.0f%% | %s |\n",
          h, r, st, (p > 0 ? "on" : "off"), s / 1e6, v / 1e6, paper, plan, step, c,
          step - c, 100 * (c + paper - step) / paper, same }'
    done
  done
  scripts/cluster.sh down >/dev/null
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
