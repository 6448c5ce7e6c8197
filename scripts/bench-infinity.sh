#!/usr/bin/env bash
# ZeRO-Infinity's headline on one machine (docs/zero.md, "A model larger than memory"): a
# GPT whose model states exceed the machine's memory trains a few steps with its parameter
# shards and optimizer states in files, beside the disk's own sequential bandwidth measured
# in the same run. Prints a markdown table.
#
#   scripts/bench-infinity.sh [--nvme-path DIR] [--steps N] [--dd-gib G] [-- ZERO_TRAIN_FLAGS]
#
# --nvme-path DIR  folder of the tier files and of dd's probe file (default /work/nvme, or
#                  $TMPDIR/zero-infinity; it needs 14 bytes per parameter free: 29 GB by default)
# --steps N        training steps (default 3; the table's step time is the median of steps
#                  2..N, step 1 pays the first touches)
# --dd-gib G       GiB dd writes and reads back, O_DIRECT in 1 MiB blocks (default 4)
# Flags after -- go to zero-train after the defaults: GPT-2 XL's width at 64 layers
# (2.05B parameters), bf16, stage 3, one rank, one sequence of 64 tokens a step,
# --offload-optimizer nvme --offload-params nvme.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
dir=/work/nvme
[[ -d /work ]] || dir=${TMPDIR:-/tmp}/zero-infinity
steps=3
dd_gib=4
extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --nvme-path) dir=${2:?--nvme-path needs a folder}; shift 2 ;;
    --steps) steps=${2:?--steps needs a number}; shift 2 ;;
    --dd-gib) dd_gib=${2:?--dd-gib needs a number}; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "bench-infinity.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $steps =~ ^[1-9][0-9]*$ && $dd_gib =~ ^[1-9][0-9]*$ ]] ||
  { echo "bench-infinity.sh: --steps and --dd-gib take positive whole numbers" >&2; exit 2; }
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work" "$dir/.dd-probe"' EXIT

# The disk's sequential bandwidth through the page-cache bypass the tier files use.
dd_rate() {
  dd "$@" bs=1M count=$((dd_gib * 1024)) 2>&1 | awk '/copied/ { print $(NF-1), $NF }'
}
echo "bench-infinity.sh: dd, ${dd_gib} GiB each way in $dir" >&2
write=$(dd_rate if=/dev/zero of="$dir/.dd-probe" oflag=direct conv=fsync)
read=$(dd_rate if="$dir/.dd-probe" of=/dev/null iflag=direct)
rm -f "$dir/.dd-probe"

flags=(--model gpt2-xl --layers 64 --precision bf16 --zero-stage 3 --world-size 1
  --batch-size 1 --micro-batch-size 1 --lr 1e-4 --eval-every 0 --sample-tokens 0
  --offload-optimizer nvme --offload-params nvme --nvme-path "$dir" --steps "$steps"
  --metrics "$work/m.jsonl")
bash scripts/train.sh "${flags[@]}" "${extra[@]}" | tee "$work/log" >&2
python3 - "$work/m.jsonl" "$write" "$read" <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = [l for l in lines if "step_ms" in l]
summary = next(l for l in lines if "ranks" in l)
rank = summary["ranks"][0]
io = rank["file_io_per_step"]
states = rank["model_state_bytes"]["total"]
mem = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal"))
later = [s["step_ms"] for s in steps[1:]] or [steps[0]["step_ms"]]
gib, gb = 2**30, 1e9
print("| parameters | model states | machine memory | process peak RSS | step (median of steps 2..) | file read / step | file write / step | tier read | tier write | dd read | dd write |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
print(f"| {summary['num_params'] / 1e9:.3f}B | {states / gib:.2f} GiB | {mem / gib:.2f} GiB "
      f"| {max(s.get('process_rss_peak_bytes') or 0 for s in steps) / gib:.2f} GiB "
      f"| {statistics.median(later) / 1e3:.1f} s "
      f"| {io['read_bytes'] / gib:.2f} GiB in {io['read_seconds']:.1f} s "
      f"| {io['written_bytes'] / gib:.2f} GiB in {io['write_seconds']:.1f} s "
      f"| {io['read_bytes'] / max(io['read_seconds'], 1e-9) / gb:.2f} GB/s "
      f"| {io['written_bytes'] / max(io['write_seconds'], 1e-9) / gb:.2f} GB/s "
      f"| {sys.argv[3]} | {sys.argv[2]} |")
PY
