#!/usr/bin/env bash
# zero-train across emulated hosts (scripts/cluster.sh) against the local backend, to the bit,
# and cluster.sh's answers to bad input. scripts/test.sh runs it; it skips (exit 0, saying
# why) where network namespaces cannot be made.
#
#   scripts/cluster-check.sh ZERO_TRAIN_BINARY
#
# The binary must be built with --features mpi. The check uses its own cluster (`zt`, subnet
# 10.78.0), so a cluster a developer has up (`zc`, 10.77.0) is left alone, and removes it at
# the end whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
zt=${1:?usage: cluster-check.sh ZERO_TRAIN_BINARY}
export ZERO_CLUSTER=zt ZERO_CLUSTER_SUBNET=10.78.0 ZERO_TRAIN=$zt ZERO_CLUSTER_TIMEOUT=300
cluster=scripts/cluster.sh

fail() {
  echo "cluster-check: $*" >&2
  exit 1
}

# `$@` must fail, saying `$expect`, and leave the cluster as it was (same namespaces).
must_refuse() {
  local expect=$1 before out
  shift
  before=$(ip netns list | sort)
  if out=$("$@" 2>&1); then fail "'$*' succeeded; expected an error ($expect)"; fi
  grep -q -- "$expect" <<<"$out" || fail "'$*' said: $out (expected: $expect)"
  [[ $(ip netns list | sort) == "$before" ]] || fail "'$*' left namespaces behind or removed some"
  echo "refused as expected: $* -> $(tail -n1 <<<"$out")"
}

if [[ -e /run/zero-cluster/zt ]]; then "$cluster" down >/dev/null; fi
status=0
out=$("$cluster" up 2 1gbit 2>&1) || status=$?
if ((status == 3)); then
  echo "cluster-check: skipped: $out"
  exit 0
fi
((status == 0)) || fail "up 2 1gbit failed: $out"
trap '"$cluster" down >/dev/null' EXIT
echo "$out"

# --- bad input ------------------------------------------------------------------------------
must_refuse "exists already" "$cluster" up 2 1gbit
must_refuse "cannot parse the rate" env ZERO_CLUSTER=zu "$cluster" up 2 fastgbit
must_refuse "give a number of hosts" env ZERO_CLUSTER=zu "$cluster" up 0 1gbit
work=$(mktemp -d)
trap 'rm -rf "$work"; "$cluster" down >/dev/null' EXIT
printf '10.78.0.1 slots=1\n10.78.0.9 slots=1\n' >"$work/hosts"
must_refuse "host '10.78.0.9' is not a host of cluster 'zt'" \
  "$cluster" run --hostfile "$work/hosts" -- --help
# A host of the list whose namespace has gone: the launcher must not try it.
ip netns add zt-h9
printf '10.78.0.10 zt-h9\n' >>/run/zero-cluster/zt/hosts
printf '10.78.0.10 slots=1\n' >"$work/gone"
must_refuse "does not answer" "$cluster" run --hostfile "$work/gone" -- --help
ip netns delete zt-h9
sed -i '/zt-h9/d' /run/zero-cluster/zt/hosts

# --- zero-train across two hosts, to the bit of the local backend ---------------------------
for i in $(seq 1 3000); do
  echo "Line $i: the quick brown fox $((i % 17)) jumps over the lazy dog $((i * 7 % 23))."
done >"$work/corpus.txt"
"$zt" prepare --text "$work/corpus.txt" --out "$work/data" >/dev/null 2>&1
args=(--data "$work/data" --layers 2 --heads 2 --dim 64 --seq-len 64 --steps 3
  --batch-size 4 --micro-batch-size 2 --sample-tokens 0 --eval-every 0)
for run in "fp32 0" "fp32 1" "fp32 2" "fp32 3" "bf16 3"; do
  read -r precision stage <<<"$run"
  one=("${args[@]}" --precision "$precision" --zero-stage "$stage")
  timeout 300 "$zt" "${one[@]}" --backend local --world-size 2 \
    --metrics "$work/local.jsonl" >"$work/log" 2>&1 || { cat "$work/log"; fail "local run failed"; }
  into_host0=/sys/class/net/zt-v0/statistics/tx_bytes # the bridge's end: what host 0 receives
  before=$(cat "$into_host0")
  "$cluster" run -- "${one[@]}" --metrics "$work/hosts.jsonl" >"$work/log" 2>&1 ||
    { cat "$work/log"; fail "run across the hosts failed"; }
  # The collectives' bytes crossed host 0's emulated link (no shared memory between hosts):
  # at least what rank 0's communicator counted as received over the 3 steps.
  link=$(($(cat "$into_host0") - before))
  counted=$(grep -o '"bytes_received":[0-9.e+]*' "$work/hosts.jsonl" | head -n1 | cut -d: -f2)
  awk -v l="$link" -v c="$counted" 'BEGIN { exit !(c > 0 && l >= 3 * c) }' ||
    fail "$precision stage $stage: host 0's link carried $link bytes, less than the $counted x 3 its rank received"
  local_losses=$(grep -o '"loss":[^,]*' "$work/local.jsonl")
  host_losses=$(grep -o '"loss":[^,]*' "$work/hosts.jsonl")
  if [[ -z $local_losses || $local_losses != "$host_losses" ]]; then
    diff <(echo "$local_losses") <(echo "$host_losses") >&2 || true
    fail "$precision stage $stage: losses across 2 hosts differ from the local backend"
  fi
  echo "$precision stage $stage: $(wc -l <<<"$host_losses") losses across 2 emulated hosts equal to the bit; host 0's link carried $link bytes (its rank counted $counted received per step)"
done
