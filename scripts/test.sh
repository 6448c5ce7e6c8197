#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what is missing, then runs every test.
# `.ci/run` calls exactly this script.
#
#   1. cargo test --workspace              (no MPI needed: the `mpi` feature is off), and no
#      function over 80 lines (scripts/long-functions.sh)
#   2. every CUDA kernel compiled by NVRTC for sm_80 and sm_90 (scripts/nvrtc-check.sh: the
#      NVRTC library comes from a PyPI wheel; no GPU needed), and scripts/gpu-check.sh's
#      packaging checked without a GPU (scripts/check-gpu-dry-run.sh)
#   3. zero-train's safetensors export read back by Hugging Face's `safetensors` package and
#      numpy (from PyPI, into a cache folder) and compared with its llm.c export
#   4. the MPI backend (feature `mpi`): OpenMPI, its headers and libclang (rsmpi's bindgen)
#      are installed from apt when missing, then the shared conformance suite runs as one
#      process and under `mpirun -np 2` and `-np 4`, each bounded by `timeout`; then the
#      engine's staging check (mpi_staging), zero-train over MPI against the local backend,
#      each injected fault over MPI named in the output, and `zero-train launch` restarting an
#      MPI job to the local backend's states (docs/faults.md; about 45 s); then zero-train
#      across 2 emulated hosts (scripts/cluster-check.sh: network namespaces with rate-limited
#      links; skipped, saying why, where namespaces cannot be made) and scripts/cluster.sh's
#      answers to bad input.
#
# ZERO_SKIP_MPI=1 skips step 4 (for machines where MPI cannot be installed). Steps 2 and 3 say
# why they skipped where pip cannot fetch their packages.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "test.sh: cargo is required (https://rustup.rs)" >&2
  exit 1
fi

# cargo test runs every unit, integration, property and doc test of the workspace.
cargo test --workspace

echo "== no function over 80 lines (scripts/long-functions.sh)"
bash scripts/long-functions.sh

echo "== NVRTC: every CUDA kernel source"
bash scripts/nvrtc-check.sh

echo "== the GPU check's packaging, without a GPU (dry run, spent budget, stand-in binaries)"
bash scripts/check-gpu-dry-run.sh

echo "== safetensors export read by Hugging Face's reader"
bash scripts/check-export.sh

if [[ "${ZERO_SKIP_MPI:-0}" == 1 ]]; then
  echo "test.sh: ZERO_SKIP_MPI=1: skipping the MPI backend"
  exit 0
fi

# --- MPI -------------------------------------------------------------------------------
# iproute2 (ip, tc) for the emulated hosts of scripts/cluster-check.sh.
mpi_packages=(openmpi-bin libopenmpi-dev libclang-dev iproute2)
missing=()
for p in "${mpi_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  sudo=()
  if [[ "$(id -u)" != 0 ]]; then sudo=(sudo); fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: install ${missing[*]} (OpenMPI, its headers, libclang, iproute2) or set ZERO_SKIP_MPI=1" >&2
    exit 1
  fi
  echo "== installing ${missing[*]}"
  "${sudo[@]}" apt-get update
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y "${missing[@]}"
fi

# 4 ranks on a 2-core CI machine need --oversubscribe; root needs --allow-run-as-root.
# Launcher flags belong here, not in the code.
mpirun_flags=(--oversubscribe)
if [[ "$(id -u)" == 0 ]]; then mpirun_flags+=(--allow-run-as-root); fi

echo "== zero-comm --features mpi: the mpi module's unit tests, the MPI suite as one process"
# (The rest of zero-comm's tests do not depend on the feature and ran in step 1.)
cargo test -p zero-comm --features mpi --lib -- mpi::
mpi_comm=(-p zero-comm --features mpi --test mpi_conformance --test mpi_bench)
cargo test "${mpi_comm[@]}"

bin=$(bash scripts/cargo-exe.sh test mpi_conformance "${mpi_comm[@]}")

for np in 2 4; do
  echo "== mpirun -np $np mpi_conformance"
  # A hang fails CI in minutes: the suite takes seconds, and each case's own timeout is 60 s.
  timeout --kill-after=10 300 mpirun "${mpirun_flags[@]}" -np "$np" "$bin"
done

# A rank that dies: by default OpenMPI kills the whole job (no hang either); with
# --enable-recovery the survivors stay alive and must report the collective within the
# communicator's timeout (5 s here) instead of hanging.
echo "== a rank dies mid-job: survivors report the collective (mpirun --enable-recovery -np 3)"
out=$(timeout --kill-after=10 120 mpirun "${mpirun_flags[@]}" --enable-recovery -np 3 \
  "$bin" --rank-dies 2>&1 || true)
if ! grep -q "^rank 0: after .*all_reduce #1" <<<"$out"; then
  echo "$out" >&2
  echo "test.sh: the survivors of a dead rank did not report the collective" >&2
  exit 1
fi
grep "^rank [0-9]: after" <<<"$out"

# --- the engine over MPI: the backend's staging lies in the rank's arena --------------------
# Every stage, f32 and bf16: no staging byte outside the block the engine lends the backend,
# and the arena's peak equals the plan (which counts the block).
# One selection builds the test and, beside it, the zero-train the later checks launch.
mpi_train=(-p zero-train --features mpi --test mpi_staging)
staging_bin=$(bash scripts/cargo-exe.sh test mpi_staging "${mpi_train[@]}")
for np in 2 4; do
  echo "== mpirun -np $np mpi_staging"
  timeout --kill-after=10 600 mpirun "${mpirun_flags[@]}" -np "$np" "$staging_bin"
done

# --- zero-train over MPI: the same losses, to the bit, as the local backend ------------------
# A tiny model on a generated corpus (no download), 2 ranks, every ZeRO stage, f32 and bf16.
echo "== zero-train --backend mpi (mpirun -np 2) against --backend local --world-size 2"
zt=$(bash scripts/cargo-exe.sh bin zero-train "${mpi_train[@]}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 1 3000); do
  echo "Line $i: the quick brown fox $((i % 17)) jumps over the lazy dog $((i * 7 % 23))."
done >"$work/corpus.txt"
"$zt" prepare --text "$work/corpus.txt" --out "$work/data" >/dev/null
args=(--data "$work/data" --layers 2 --heads 2 --dim 64 --seq-len 64 --steps 4
  --batch-size 4 --micro-batch-size 2 --sample-tokens 0 --eval-every 0)
# Trains NAME with FLAGS on NP ranks, local threads then mpirun; the losses must be equal.
same_as_local() { # NAME NP FLAGS...
  local name=$1 np=$2 file=${1//[^a-zA-Z0-9]/_}
  shift 2
  timeout 300 "$zt" "$@" --backend local --world-size "$np" \
    --metrics "$work/local-$file.jsonl" >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
  timeout 300 mpirun "${mpirun_flags[@]}" -np "$np" "$zt" "$@" --backend mpi \
    --metrics "$work/mpi-$file.jsonl" >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
  local local_losses mpi_losses
  local_losses=$(grep -o '"loss":[^,]*' "$work/local-$file.jsonl")
  mpi_losses=$(grep -o '"loss":[^,]*' "$work/mpi-$file.jsonl")
  if [[ -z "$local_losses" || "$local_losses" != "$mpi_losses" ]]; then
    echo "zero-train $name: MPI losses differ from local" >&2
    diff <(echo "$local_losses") <(echo "$mpi_losses") >&2 || true
    exit 1
  fi
  echo "$name: $(echo "$mpi_losses" | wc -l) losses equal to the bit"
}
for precision in fp32 bf16; do
  for stage in 0 1 2 3; do
    same_as_local "$precision stage $stage" 2 "${args[@]}" --precision "$precision" \
      --zero-stage "$stage"
  done
done
# Tensor parallelism: 4 ranks in 2 groups of 2 (T x DP = 2 x 2).
echo "== zero-train --backend mpi --tensor-parallel-size 2 (mpirun -np 4) against local"
for stage in 0 3; do
  same_as_local "fp32 stage $stage, T = 2" 4 "${args[@]}" --zero-stage "$stage" \
    --tensor-parallel-size 2
done
# P_a: the slices' gathers run on a second communicator split from the group's.
same_as_local "fp32 stage 3, T = 2, partitioned activations" 4 "${args[@]}" --zero-stage 3 \
  --tensor-parallel-size 2 --activation-checkpointing --partition-activations

# --- injected faults over MPI: each named (docs/faults.md) -----------------------------------
# Under --enable-recovery the survivors outlive a dead rank; mpirun's own exit status is then
# not the ranks', so the checks read the output. MPI cannot tell which rank did not arrive:
# the survivor's timeout names the op and number, the faulty rank's line names itself.
echo "== zero-train --backend mpi: injected faults are named (mpirun --enable-recovery)"
fault_base=(--data "$work/data" --layers 2 --heads 2 --dim 64 --seq-len 64 --steps 3
  --micro-batch-size 2 --sample-tokens 0 --eval-every 0 --comm-timeout 5)
fault_args=("${fault_base[@]}" --backend mpi)
mpi_fault() { # NP EXPECTED-TEXT... -- FLAGS...
  local np=$1 out needles=()
  shift
  while [[ $1 != -- ]]; do needles+=("$1"); shift; done
  shift
  out=$(timeout --kill-after=10 120 mpirun "${mpirun_flags[@]}" --enable-recovery -np "$np" \
    "$zt" "${fault_args[@]}" "$@" 2>&1 || true)
  for needle in "${needles[@]}"; do
    if ! grep -qF -- "$needle" <<<"$out"; then
      echo "$out" >&2
      echo "test.sh: mpirun -np $np zero-train $*: no \"$needle\"" >&2
      exit 1
    fi
  done
  echo "$* : named"
}
mpi_fault 2 "injected fault kill on rank 1 at" "timed out after 5" "on rank 0" -- \
  --batch-size 4 --inject-fault kill:rank=1,step=1
mpi_fault 2 "injected fault hang on rank 1 at" "timed out after 5" "on rank 0" -- \
  --batch-size 4 --inject-fault hang:rank=1,step=1
mpi_fault 3 "payload checksums differ" "ranks [1] hold a result" -- --batch-size 6 \
  --comm-checksums --inject-fault corrupt:rank=1,step=1,op=all_gather
mpi_fault 2 "rank 1 ran a program it did not declare" -- --batch-size 4 \
  --inject-fault diverge:rank=1,step=1
# A slow rank is survived: the losses are the local backend's, to the bit.
timeout 300 "$zt" "${fault_base[@]}" --batch-size 4 --backend local --world-size 2 \
  --metrics "$work/slow-local.jsonl" >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
timeout 300 mpirun "${mpirun_flags[@]}" -np 2 "$zt" "${fault_args[@]}" --batch-size 4 \
  --inject-fault slow=50:rank=1,step=1 --metrics "$work/slow-mpi.jsonl" >"$work/log" 2>&1 ||
  { cat "$work/log"; exit 1; }
if [[ "$(grep -o '"loss":[^,]*' "$work/slow-local.jsonl")" != \
  "$(grep -o '"loss":[^,]*' "$work/slow-mpi.jsonl")" ]]; then
  echo "test.sh: a slow MPI rank changed the losses" >&2
  exit 1
fi
echo "slow=50:rank=1,step=1 : survived with the local backend's losses"

# --- zero-train launch over MPI: a rank killed at step 3 of 6, restarted from the newest state,
# ends with the local backend's states to the bit (docs/faults.md) --------------------------
echo "== zero-train launch --backend mpi: kill at step 3 of 6, one restart"
restart_args=(--data "$work/data" --layers 2 --heads 2 --dim 64 --seq-len 64 --steps 6
  --batch-size 4 --micro-batch-size 2 --sample-tokens 0 --eval-every 0 --comm-timeout 10
  --save-every 1)
timeout 300 "$zt" "${restart_args[@]}" --backend local --world-size 2 --save "$work/unbroken" \
  >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
timeout 600 "$zt" launch --nproc-per-node 2 --max-restarts 1 --mpirun "mpirun ${mpirun_flags[*]}" \
  -- "${restart_args[@]}" --backend mpi --save "$work/restarted" \
  --inject-fault kill:rank=1,step=3 >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
grep -q "restart 1 of 1 with 2 ranks from .*step-000003" "$work/log" ||
  { cat "$work/log"; echo "test.sh: no restart from step 3" >&2; exit 1; }
for piece in "$work/unbroken/step-000006"/rank-*.bin; do
  cmp "$piece" "$work/restarted/step-000006/$(basename "$piece")" ||
    { echo "test.sh: $(basename "$piece") differs after the MPI restart" >&2; exit 1; }
done
grep "^zero-train launch" "$work/log"

# --- zero-train across emulated hosts: namespaces, 1 Gbit/s links, OpenMPI's TCP transport --
echo "== zero-train across 2 emulated hosts (scripts/cluster.sh) against the local backend"
bash scripts/cluster-check.sh "$zt"
