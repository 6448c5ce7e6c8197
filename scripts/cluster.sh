#!/usr/bin/env bash
# Several hosts on one machine: network namespaces on one bridge, each host's link limited to
# a rate by a token bucket, and OpenMPI starting its daemons inside them, so that
# `mpirun --hostfile` runs ranks that share no network stack and talk only over the emulated
# links (OpenMPI's TCP transport; its shared-memory transport is off).
#
#   scripts/cluster.sh up N RATE            N hosts (1-64), each link limited to RATE
#                                           (tc units: 1gbit, 250mbit, 100mbps; or unlimited)
#   scripts/cluster.sh bench OP [FLAGS]     zero-bench OP --backend mpi, one rank per host
#                                           (default sizes 1M..64M x4, -n 5 -w 1; FLAGS override)
#   scripts/cluster.sh run -- ARGS          zero-train --backend mpi ARGS, one rank per host
#   scripts/cluster.sh status               the hosts, their addresses and link rate
#   scripts/cluster.sh down                 removes everything `up` made
#
# bench and run take `--hostfile FILE` before their other arguments (default: the one `up`
# wrote) and `--np K` (default: one rank per host of the hostfile).
#
# Requires root (or CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 and OpenMPI; `up` exits with
# status 3, having made nothing, where network namespaces cannot be created.
#
# Environment: ZERO_CLUSTER names the cluster (default `zc`; lower-case letters and digits, at
# most 6) so that several can coexist; ZERO_CLUSTER_SUBNET its /24 (default 10.77.0: hosts are
# .1 to .N, the bridge .254); ZERO_BENCH / ZERO_TRAIN the binaries (default target/release/,
# built with --features mpi); ZERO_CLUSTER_TIMEOUT the seconds a bench or run may take (3600).
#
# Everything made is named after the cluster: namespaces NAME-h0.., bridge NAME-br, host links
# NAME-v0.. (root side) / eth0 (host side), state in /run/zero-cluster/NAME. The script only
# ever addresses those: the launch agent refuses any host that is not in the cluster's list.
set -eEuo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
name=${ZERO_CLUSTER:-zc}
subnet=${ZERO_CLUSTER_SUBNET:-10.77.0}
state=/run/zero-cluster/$name
bridge=$name-br

die() {
  echo "cluster.sh: $*" >&2
  exit 1
}

[[ $name =~ ^[a-z][a-z0-9]{0,5}$ ]] ||
  die "ZERO_CLUSTER='$name': use 1-6 lower-case letters or digits, starting with a letter"
[[ $subnet =~ ^(10|192\.168|172\.(1[6-9]|2[0-9]|3[01]))(\.[0-9]{1,3}){1,2}$ ]] &&
  [[ $(tr -cd . <<<"$subnet" | wc -c) == 2 ]] ||
  die "ZERO_CLUSTER_SUBNET='$subnet': give the first three octets of a private /24, e.g. 10.77.0"

# Bits per second of a tc rate (`1gbit`, `250mbit`, `12.5mbps`; k/m/g/t are powers of 1000
# as in tc(8)); prints nothing for a rate it cannot parse.
rate_bits() {
  local re='^([0-9]+)(\.[0-9]+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$'
  [[ ${1,,} =~ $re ]] || return 0
  awk -v n="${BASH_REMATCH[1]}${BASH_REMATCH[2]}" -v u="${BASH_REMATCH[3]}" 'BEGIN {
    m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
    m["bps"] = 8; m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9; m["tbps"] = 8e12
    b = n * m[u]; if (b >= 8000 && b <= 1e12) printf "%.0f\n", b }'
}

# True when cluster `name` has anything on this machine.
exists() {
  [[ -e $state ]] || ip link show "$bridge" >/dev/null 2>&1 ||
    ip netns list | grep -q "^$name-h[0-9]" ||
    ip -o link show | awk -F': ' '{print $2}' | grep -q "^$name-v[0-9]"
}

# Removes whatever `up` made (each step tolerates its part being absent already). Processes
# still running inside the cluster's namespaces (a run that was interrupted: its daemons
# would wait for an mpirun that is gone) are stopped first, TERM then KILL after 2 s.
teardown() {
  local ns namespaces pids
  namespaces=$(ip netns list | awk '{print $1}' | grep -E "^$name-h[0-9]+$" || true)
  for signal in TERM KILL; do
    pids=$(for ns in $namespaces; do ip netns pids "$ns" 2>/dev/null || true; done)
    [[ -z $pids ]] && break
    # shellcheck disable=SC2086 # one pid per word
    kill -s "$signal" $pids 2>/dev/null || true
    if [[ $signal == TERM ]]; then sleep 2; fi
  done
  for ns in $namespaces; do
    ip netns delete "$ns" 2>/dev/null || true
  done
  # Deleting a namespace deletes its end of the veth pair, and with it the outer end, once
  # the namespace is gone; one still held by a process keeps them, so they go here.
  local link
  for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^$name-v[0-9]+$" || true); do
    ip link delete "$link" 2>/dev/null || true
  done
  ip link delete "$bridge" 2>/dev/null || true
  rm -rf "$state"
}

# Makes host $1 (0-based) with link rate $2 (tc syntax, or `unlimited`).
make_host() {
  local rate=$2 ns=$name-h$1 outer=$name-v$1 ip=$subnet.$(($1 + 1))
  ip netns add "$ns"
  ip link add "$outer" type veth peer name eth0 netns "$ns"
  ip link set "$outer" master "$bridge" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$ip/24" dev eth0
  ip -n "$ns" link set eth0 up
  # TCP on the host's link is CUBIC where the kernel has it: this machine's default, BBR, paced
  # itself under the token bucket to 60-92% of a 250 Mbit/s link, varying run to run, where
  # CUBIC holds 92-95% at 16-64 MiB (docs/mpi.md). The route's `congctl` sets it for this
  # namespace alone; the sysctl is not writable here.
  if grep -qw cubic /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null; then
    ip -n "$ns" route replace "$subnet.0/24" dev eth0 proto kernel scope link src "$ip" \
      congctl cubic ||
      echo "cluster.sh: warning: $ns keeps the default congestion control (congctl refused)" >&2
  fi
  if [[ $rate != unlimited ]]; then
    # Both directions of the host's link: what it sends leaves eth0, what it receives leaves
    # the bridge through its outer end. A bucket of 10 ms at the rate (at least 64 KiB, so a
    # GSO segment fits) holds sustained traffic to the rate; a message of about the bucket's
    # size can pass above it (1 MiB all-reduces at 103-105% of 1 Gbit/s). Rejected: a 1 ms
    # bucket, which holds every size under the rate but cost 20-35% of the link at every size
    # (docs/mpi.md). netem's delay is not used.
    local burst=$(($(rate_bits "$rate") / 800))
    ((burst >= 65536)) || burst=65536
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms
    tc qdisc add dev "$outer" root tbf rate "$rate" burst "$burst" latency 50ms
  fi
  echo "$ip $ns" >>"$state/hosts"
  echo "$ip slots=1" >>"$state/hostfile"
}

# The launch agent OpenMPI calls as `AGENT [ssh options] HOST COMMAND...`: it runs the
# command (a shell line, as ssh would) inside HOST's namespace, for hosts of this cluster only.
write_agent() {
  cat >"$state/agent" <<EOF
#!/usr/bin/env bash
while [[ \$# -gt 0 && \$1 == -* ]]; do shift; done
host=\${1:?no host}; shift
ns=\$(awk -v h="\$host" '\$1 == h {print \$2}' "$state/hosts")
if [[ -z \$ns ]]; then
  echo "cluster.sh agent: \$host is not a host of cluster $name (see $state/hosts)" >&2
  exit 1
fi
# Each host has its own temporary directory, as separate machines would: OpenMPI keeps its
# session directories there, named after the hostname, which all namespaces share.
mkdir -p "$state/tmp/\$ns"
export TMPDIR="$state/tmp/\$ns"
exec ip netns exec "\$ns" /bin/sh -c "\$*"
EOF
  chmod +x "$state/agent"
}

cmd_up() {
  [[ $# == 2 ]] || die "usage: cluster.sh up N RATE (e.g. up 2 1gbit)"
  local n=$1 rate=$2 probe=$name-probe
  [[ $n =~ ^[0-9]{1,3}$ ]] && ((10#$n >= 1 && 10#$n <= 64)) ||
    die "up: N='$n': give a number of hosts from 1 to 64"
  n=$((10#$n))
  if [[ ${rate,,} != unlimited && -z $(rate_bits "$rate") ]]; then
    die "up: cannot parse the rate '$rate': give a number and a tc unit (bit, kbit, mbit, gbit, bps, kbps, mbps, gbps; 8kbit to 1tbit), e.g. 1gbit or 250mbit, or unlimited"
  fi
  exists && die "up: cluster '$name' exists already ($(cmd_status_line)); run 'cluster.sh down' first"
  local err
  if ! err=$(ip netns add "$probe" 2>&1); then
    echo "cluster.sh: cannot create network namespaces here (root or CAP_SYS_ADMIN needed): $err" >&2
    exit 3
  fi
  ip netns delete "$probe"
  command -v mpirun >/dev/null || die "up: mpirun not found (apt-get install openmpi-bin)"
  # From here a failure removes everything made so far.
  trap 'echo "cluster.sh: up failed; removing what it made" >&2; teardown' ERR
  trap 'teardown; exit 130' INT TERM
  mkdir -p "$state"
  echo "${rate,,}" >"$state/rate"
  : >"$state/hosts"
  : >"$state/hostfile"
  ip link add "$bridge" type bridge
  ip addr add "$subnet.254/24" dev "$bridge"
  ip link set "$bridge" up
  local i
  for ((i = 0; i < n; i++)); do make_host "$i" "${rate,,}"; done
  write_agent
  trap - ERR INT TERM
  echo "cluster '$name': $n hosts ($subnet.1-$subnet.$n), links at ${rate,,}; hostfile $state/hostfile"
}

cmd_status_line() {
  if [[ -f $state/hosts ]]; then
    echo "$(wc -l <"$state/hosts") hosts at $(cat "$state/rate")"
  else
    echo "partly made"
  fi
}

cmd_down() {
  exists || {
    echo "cluster '$name': nothing to remove"
    return 0
  }
  teardown
  echo "cluster '$name' removed"
}

# Checks every host of hostfile $1: a host of this cluster whose namespace exists and holds
# its address; prints the number of hosts.
check_hostfile() {
  local file=$1 count=0 host ns
  [[ -f $file ]] || die "hostfile '$file' does not exist"
  while read -r host _; do
    if [[ -z $host || $host == \#* ]]; then continue; fi
    ns=$(awk -v h="$host" '$1 == h {print $2}' "$state/hosts")
    [[ -n $ns ]] || die "hostfile $file: host '$host' is not a host of cluster '$name' ($(awk '{print $1}' "$state/hosts" | paste -sd' ')); it cannot be reached"
    ip -n "$ns" -4 addr show dev eth0 2>/dev/null | grep -q "inet $host/" ||
      die "hostfile $file: host '$host' does not answer (namespace $ns or its address is gone); run 'cluster.sh down' and 'up' again"
    count=$((count + 1))
  done <"$file"
  ((count > 0)) || die "hostfile $file names no host"
  echo "$count"
}

# Runs `$@` under mpirun on the cluster: hostfile and rank count from the leading
# --hostfile / --np options (already parsed into $hostfile / $np).
#
# The TCP transport's flags are its defaults less `put`: with OpenMPI's emulated RDMA put,
# two hosts exchanging 2 MiB each way (a 4 MiB all-gather) took 118-130 ms on a 250 Mbit/s
# link against 67 ms at the rate; with sends only, 70-82 ms, and a 4 MiB all-reduce reaches
# 95% of the link instead of 67% (docs/mpi.md).
launch() {
  local flags=(--hostfile "$hostfile" -np "$np" --map-by node
    --mca plm_rsh_agent "$state/agent" --mca plm_rsh_no_tree_spawn 1
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_flags send,inplace,need-ack,need-csum
    --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24")
  if [[ $(id -u) == 0 ]]; then flags+=(--allow-run-as-root); fi
  # The ranks' thread count and logging, when set, reach every host.
  local var
  for var in RAYON_NUM_THREADS RUST_LOG RUST_BACKTRACE; do
    if [[ -n ${!var:-} ]]; then flags+=(-x "$var"); fi
  done
  # More ranks than hosts share a host: they still use TCP (no shared memory), as asked.
  if ((np > hosts)); then flags+=(--oversubscribe); fi
  # mpirun's own session directory apart too (the launching machine's /tmp is shared with
  # every other mpirun on it).
  mkdir -p "$state/tmp/mpirun"
  TMPDIR=$state/tmp/mpirun timeout --kill-after=10 "${ZERO_CLUSTER_TIMEOUT:-3600}" \
    mpirun "${flags[@]}" "$@"
}

# Parses the leading --hostfile / --np options of bench and run into globals; the rest of
# the arguments are left in `rest`.
launch_options() {
  [[ -f $state/hosts ]] || die "cluster '$name' is not up (cluster.sh up N RATE)"
  hostfile=$state/hostfile
  np=
  while [[ $# -gt 0 ]]; do
    case $1 in
      --hostfile) hostfile=${2:?--hostfile needs a file}; shift 2 ;;
      --np) np=${2:?--np needs a number}; shift 2 ;;
      *) break ;;
    esac
  done
  rest=("$@")
  hosts=$(check_hostfile "$hostfile") || exit 1
  np=${np:-$hosts}
  [[ $np =~ ^[0-9]{1,4}$ ]] && ((10#$np >= 1 && 10#$np <= 1024)) ||
    die "--np '$np': give a number of ranks from 1 to 1024"
  np=$((10#$np))
}

binary() {
  local var=$1 default=$2 bin
  bin=${!var:-$repo/target/release/$default}
  [[ -x $bin ]] || die "$bin not found: cargo build --release --features mpi --bin $default (or set $var)"
  echo "$bin"
}

cmd_bench() {
  launch_options "$@"
  set -- "${rest[@]}"
  [[ $# -ge 1 ]] || die "usage: cluster.sh bench OP [zero-bench flags]"
  local bin
  bin=$(binary ZERO_BENCH zero-bench)
  # Defaults for the sizes and iterations the caller did not give (zero-bench, like clap,
  # refuses a flag given twice).
  local defaults=() flag short long value given arg
  for flag in "-b --minbytes 1M" "-e --maxbytes 64M" "-f --stepfactor 4" "-n --iters 5" \
    "-w --warmup_iters 1"; do
    read -r short long value <<<"$flag"
    given=0
    for arg in "${@:2}"; do
      [[ $arg == "$short" || $arg == "$long" || $arg == "$long="* ]] && given=1
    done
    ((given)) || defaults+=("$short" "$value")
  done
  echo "# cluster '$name': $np ranks on $hosts hosts, links at $(cat "$state/rate")"
  launch "$bin" "$1" "${defaults[@]}" "${@:2}" --backend mpi
}

cmd_run() {
  launch_options "$@"
  set -- "${rest[@]}"
  [[ ${1:-} == -- ]] && shift
  local bin
  bin=$(binary ZERO_TRAIN zero-train)
  echo "# cluster '$name': $np ranks on $hosts hosts, links at $(cat "$state/rate")"
  launch "$bin" --backend mpi "$@"
}

cmd_status() {
  [[ -f $state/hosts ]] || {
    echo "cluster '$name' is not up"
    return 0
  }
  echo "cluster '$name': links at $(cat "$state/rate"), hostfile $state/hostfile"
  cat "$state/hosts"
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down ;;
  bench) shift; cmd_bench "$@" ;;
  run) shift; cmd_run "$@" ;;
  status) cmd_status ;;
  rate-bits) rate_bits "${2:-}" ;;
  *) die "usage: cluster.sh up N RATE | bench OP [FLAGS] | run -- ARGS | status | down" ;;
esac
