#!/usr/bin/env bash
# Start/stop a real, local SLURM 22.05 cluster for swiftslurm's tests and CI.
#
#   scripts/slurm-local.sh up [--force]  install what is missing, start everything, self-check; a
#                                    healthy cluster with other settings is replaced only with --force
#   scripts/slurm-local.sh down      stop what `up` started and remove its network setup
#   scripts/slurm-local.sh restart   down + up
#   scripts/slurm-local.sh status    daemons, nodes, sinfo; exit 1 if not healthy
#   scripts/slurm-local.sh env       KEY=VALUE lines (SWIFTSLURM_BRIDGE_IP, ...)
#   scripts/slurm-local.sh exec NODE [CMD...]   run CMD (default bash) inside NODE's namespaces
#
# A filesystem mounted under $STATE/mnt while the cluster runs is seen by every node (a shared
# mount point the nodes' namespaces receive mounts from), e.g. a small tmpfs for a run dir that
# fills up; one mounted inside a node (`exec NODE mount ...`) stays that node's own.
#
# Layout: munged, MariaDB, slurmdbd and slurmctld run on the host; each compute node is a
# slurmd in its own network + UTS namespace (hostname nodeN, IP SUBNET.(10+N)) attached by a
# veth pair to a Linux bridge holding SUBNET.1. Jobs therefore see distinct hostnames and IPs,
# like a real multi-node cluster, while sharing the host's filesystem. See docs/local-slurm.md.
#
# Needs root (apt, namespaces, /etc/hosts, /etc/slurm). Environment overrides:
#   SWIFTSLURM_SLURM_STATE   state dir (configs, logs, pids, spool, DB)  [/tmp/swiftslurm-slurm]
#   SWIFTSLURM_SLURM_NODES   number of compute nodes, >= 2                [6]
#   SWIFTSLURM_SLURM_SUBNET  first three octets of the /24 for the bridge [10.77.0]
#   SWIFTSLURM_SLURM_BRIDGE  bridge interface name                        [sslurm0]
#   SWIFTSLURM_SLURM_CPUS    CPUs each node advertises                    [nproc]
#   SWIFTSLURM_SLURM_MEM_MB  RealMemory each node advertises (MB)         [8192]
#   SWIFTSLURM_SLURM_GRACE   GraceTime (s) of a preempted `debug` job     [30]
#   SWIFTSLURM_SLURM_DB_PORT loopback TCP port of the private MariaDB     [13306]
#   SWIFTSLURM_SLURM_GROUPS  node groups G: besides debug/urgent on every node, partitions
#                            debugK/urgentK (K = 1..G) on the K-th NODES/G nodes, so G test
#                            processes can run side by side without sharing a node     [2]
set -euo pipefail

STATE=${SWIFTSLURM_SLURM_STATE:-/tmp/swiftslurm-slurm}
NNODES=${SWIFTSLURM_SLURM_NODES:-6}
SUBNET=${SWIFTSLURM_SLURM_SUBNET:-10.77.0}
BRIDGE=${SWIFTSLURM_SLURM_BRIDGE:-sslurm0}
NODE_CPUS=${SWIFTSLURM_SLURM_CPUS:-$(nproc)}
NODE_MEM_MB=${SWIFTSLURM_SLURM_MEM_MB:-8192}
GRACE=${SWIFTSLURM_SLURM_GRACE:-30}
DB_PORT=${SWIFTSLURM_SLURM_DB_PORT:-13306}
GROUPS_=${SWIFTSLURM_SLURM_GROUPS:-2}

CLUSTER=swiftslurm
BRIDGE_IP=$SUBNET.1
NS_PREFIX=sslurm-          # network namespaces are sslurm-node1, sslurm-node2, ...
MOUNTS=$STATE/mnt          # mounts made here reach every node (shared_mounts)
HOSTS_MARK='# swiftslurm-local'
SLURM_ETC=/etc/slurm       # where Debian's sbatch/squeue/sacct/... read slurm.conf
PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server iproute2 util-linux procps fuse3 runc)
SLURM_PORTS=(6817 6818 6819)

log() { printf '[slurm-local] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

node_names() {
  local i
  for ((i = 1; i <= NNODES; i++)); do echo "node$i"; done
}
node_ip() { echo "$SUBNET.$((10 + ${1#node}))"; }

# ---------------------------------------------------------------- validation / recorded settings

validate_settings() {
  if ! [[ $NNODES =~ ^[0-9]+$ ]] || ((NNODES < 2 || NNODES > 200)); then
    die "SWIFTSLURM_SLURM_NODES must be an integer >= 2 (got '$NNODES')"
  fi
  if ! [[ $GROUPS_ =~ ^[0-9]+$ ]] || ((GROUPS_ < 1 || NNODES % GROUPS_ != 0 || NNODES / GROUPS_ < 2)); then
    die "SWIFTSLURM_SLURM_GROUPS must divide SWIFTSLURM_SLURM_NODES into groups of >= 2 (got '$GROUPS_')"
  fi
  [[ $SUBNET =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] ||
    die "SWIFTSLURM_SLURM_SUBNET must be three octets like 10.77.0 (got '$SUBNET')"
  # The state path ends up in slurm.conf and in rm -rf: keep it absolute, simple, not /.
  [[ $STATE =~ ^/[A-Za-z0-9._/-]+$ && $STATE != / ]] ||
    die "SWIFTSLURM_SLURM_STATE must be an absolute path without spaces (got '$STATE')"
  ((${#BRIDGE} <= 15)) || die "bridge name '$BRIDGE' longer than 15 characters"
}

# `down` must undo what the last `up` did even if the caller's environment changed since, so
# `up` records the settings that shape the network, and `down`/`status` read them back.
save_settings() {
  printf 'NNODES=%q\nSUBNET=%q\nBRIDGE=%q\n' "$NNODES" "$SUBNET" "$BRIDGE" >"$STATE/cluster.env"
}
load_settings() {
  if [[ -f $STATE/cluster.env ]]; then
    # shellcheck source=/dev/null
    source "$STATE/cluster.env"
    BRIDGE_IP=$SUBNET.1
  fi
}

# ---------------------------------------------------------------- packages

missing_packages() {
  local p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"
  done
}

# Installs in a subshell so the temporary policy-rc.d is removed even if apt fails. The
# policy-rc.d (exit 101) stops package scripts from starting munge/mariadb/slurm services that
# we did not ask for and could not track; images made for containers often ship one already.
ensure_packages() {
  local missing
  missing=$(missing_packages | tr '\n' ' ')
  [[ -z ${missing// /} ]] && return 0
  log "installing: $missing"
  (
    policy=/usr/sbin/policy-rc.d
    if [[ ! -e $policy ]]; then
      printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy"
      trap 'rm -f "$policy"' EXIT
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086  # word splitting of the package list is intended
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
  )
}

# ---------------------------------------------------------------- process bookkeeping

# Every daemon we start gets $STATE/pids/NAME.pid = "PID PROGRAM". PROGRAM (argv[0]'s basename)
# is re-checked before any kill so that a recycled PID is never signalled.
pid_alive() { # NAME -> 0 if the recorded process is running the recorded program
  local f=$STATE/pids/$1.pid pid prog argv0
  [[ -f $f ]] || return 1
  read -r pid prog <"$f" || return 1
  [[ -r /proc/$pid/cmdline ]] || return 1
  argv0=$(tr '\0' '\n' <"/proc/$pid/cmdline" | head -n1)
  [[ ${argv0##*/} == "$prog" ]]
}
recorded_pid() { local pid _; read -r pid _ <"$STATE/pids/$1.pid"; echo "$pid"; }

# start_daemon NAME PROGRAM CMD... : run CMD (which must end up exec'ing PROGRAM, in the
# foreground) detached in a new session with output in $STATE/log/NAME.out. bash does not use
# job control in scripts, so the background child is no process-group leader and `setsid`
# execs instead of forking: $! is the daemon's own PID, and so are nsenter/unshare's below.
start_daemon() {
  local name=$1 prog=$2
  shift 2
  (
    close_inherited_fds
    exec setsid "$@" >>"$STATE/log/$name.out" 2>&1 </dev/null
  ) &
  echo "$! $prog" >"$STATE/pids/$name.pid"
}

# Closes every descriptor above stderr in this (sub)shell: a daemon must not inherit a lock's fd, neither
# take_lock's (9) nor the caller's (`flock FILE bash scripts/slurm-local.sh up`), or it holds that lock for as
# long as it runs, and every later `flock FILE` waits for ever.
close_inherited_fds() {
  local fd
  for fd in /proc/"$BASHPID"/fd/*; do
    fd=${fd##*/}
    if ((fd > 2)); then
      eval "exec $fd>&-"
    fi
  done
}

# Sends TERM to the given PIDs, waits up to 15 s, then KILLs survivors.
terminate_pids() {
  local pid left i
  (($# == 0)) && return 0
  kill -TERM "$@" 2>/dev/null || true
  for ((i = 0; i < 30; i++)); do
    left=()
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && left+=("$pid"); done
    ((${#left[@]} == 0)) && return 0
    sleep 0.5
  done
  kill -KILL "${left[@]}" 2>/dev/null || true
}

recorded_alive_pids() { # NAME... -> PIDs of those recorded daemons that still run
  local name
  for name in "$@"; do
    if pid_alive "$name"; then recorded_pid "$name"; fi
  done
}

# ---------------------------------------------------------------- waiting

# wait_for SECONDS DESCRIPTION CMD... : poll CMD every 0.5 s.
wait_for() {
  local secs=$1 what=$2 i
  shift 2
  for ((i = 0; i < secs * 2; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  show_logs
  die "timed out after ${secs}s waiting for $what (logs: $STATE/log)"
}

# CI shows only our output: print the tails of the daemon logs when something fails.
show_logs() {
  local f
  for f in "$STATE"/log/*; do
    [[ -s $f ]] || continue
    log "---- tail of $f"
    tail -n 15 "$f" >&2
  done
}

# ---------------------------------------------------------------- network

port_in_use() { ss -Hltn "sport = :$1" | grep -q .; }

check_network_free() {
  local p
  for p in "${SLURM_PORTS[@]}" "$DB_PORT"; do
    port_in_use "$p" && die "TCP port $p is already in use (another slurm/mariadb running?)"
  done
  # A foreign interface already in our /24 would make routing ambiguous.
  if ip -4 -o addr show | awk -v b="$BRIDGE" '$2 != b {print $4}' | grep -q "^${SUBNET//./\\.}\."; then
    die "subnet $SUBNET.0/24 is already used on this host; set SWIFTSLURM_SLURM_SUBNET"
  fi
}

setup_bridge() {
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip addr replace "$BRIDGE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
}

# One namespace per node: veth sslurmvN (host side, on the bridge) <-> eth0 (inside).
setup_node_net() {
  local node=$1 ns=$NS_PREFIX$1 veth=sslurmv${1#node}
  ip netns add "$ns"
  ip link add "$veth" type veth peer name eth0 netns "$ns"
  ip link set "$veth" master "$BRIDGE" up
  ip -n "$ns" addr add "$(node_ip "$node")/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
}

# Jobs find each other through the node names of the hostlist (MASTER_ADDR=node1, ...):
# make them resolvable on the host and in the namespaces (same /etc/hosts file).
add_hosts_entries() {
  local node
  remove_hosts_entries
  # A name for the host's bridge address too (services for jobs bind there).
  printf '%s %s %s\n' "$BRIDGE_IP" swiftslurm-host "$HOSTS_MARK" >>/etc/hosts
  for node in $(node_names); do
    printf '%s %s %s\n' "$(node_ip "$node")" "$node" "$HOSTS_MARK" >>/etc/hosts
  done
}

# Rewrites /etc/hosts in place (cat >, not sed -i) because in containers it is often a bind mount
# that cannot be replaced by rename.
remove_hosts_entries() {
  local kept
  grep -q "$HOSTS_MARK\$" /etc/hosts 2>/dev/null || return 0
  kept=$(grep -v "$HOSTS_MARK\$" /etc/hosts)
  printf '%s\n' "$kept" >/etc/hosts
}

teardown_network() {
  local ns veth
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$NS_PREFIX" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  # Deleting a namespace destroys its eth0 and so the host-side veth, unless a dying process still holds
  # the namespace: such a veth would make the next `up` fail ("File exists"). The bridge goes last.
  for veth in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep '^sslurmv' || true); do
    ip link del "$veth" 2>/dev/null || true
  done
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
  remove_hosts_entries
}

# Everything still running inside our node namespaces: slurmd, and the slurmstepd's and job
# tasks that would outlive it.
namespace_pids() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$NS_PREFIX" || true); do
    ip netns pids "$ns" 2>/dev/null || true
  done
}

# ---------------------------------------------------------------- configuration

write_slurm_conf() {
  local node
  cat <<EOF
# Generated by scripts/slurm-local.sh -- edits are lost on the next \`up\`.
ClusterName=$CLUSTER
# Must be the host's real short name (slurmctld checks it); the address is the bridge IP so
# slurmd's in the namespaces can reach it.
SlurmctldHost=$(hostname -s)($BRIDGE_IP)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# The requeue delay of a job is cred_expire + 1 s: 10 keeps requeue tests quick (default 120).
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
# No cgroups in a container: track processes by parent PID, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
MpiDefault=none
SwitchType=switch/none
# Nodes declare CPUs/RealMemory below; trust that over what slurmd detects on the shared host.
SlurmdParameters=config_overrides
ReturnToService=2
# A node whose slurmd stops answering is marked DOWN after this many seconds (default 300), so tests
# of a lost node see the job end and come back on the remaining nodes within a minute.
SlurmdTimeout=20
SchedulerType=sched/backfill
# Short scheduling intervals so requeued/preempted jobs restart within seconds (tiny cluster).
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Preemption: jobs of partition urgent (higher PriorityTier) requeue jobs of debug; the victim
# first gets its --signal (preempt_send_user_signal), then GraceTime seconds to checkpoint.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
JobRequeue=1
KillWait=10
MinJobAge=300
InactiveLimit=0
Waittime=0
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$BRIDGE_IP
AccountingStoragePort=6819
JobCompType=jobcomp/none
EOF
  for node in $(node_names); do
    echo "NodeName=$node NodeHostname=$node NodeAddr=$(node_ip "$node") CPUs=$NODE_CPUS RealMemory=$NODE_MEM_MB State=UNKNOWN"
  done
  cat <<EOF
PartitionName=debug Nodes=ALL Default=YES PriorityTier=1 MaxTime=INFINITE State=UP GraceTime=$GRACE
PartitionName=urgent Nodes=ALL PriorityTier=10 MaxTime=INFINITE State=UP PreemptMode=OFF
EOF
  if ((GROUPS_ > 1)); then
    local k size=$((NNODES / GROUPS_)) nodes
    for ((k = 1; k <= GROUPS_; k++)); do
      nodes="node[$(((k - 1) * size + 1))-$((k * size))]"
      echo "PartitionName=debug$k Nodes=$nodes PriorityTier=1 MaxTime=INFINITE State=UP GraceTime=$GRACE"
      echo "PartitionName=urgent$k Nodes=$nodes PriorityTier=10 MaxTime=INFINITE State=UP PreemptMode=OFF"
    done
  fi
}

write_slurmdbd_conf() {
  cat <<EOF
# Generated by scripts/slurm-local.sh -- edits are lost on the next \`up\`.
AuthType=auth/munge
DbdHost=$(hostname -s)
DbdAddr=$BRIDGE_IP
DbdPort=6819
SlurmUser=root
LogFile=$STATE/log/slurmdbd.log
PidFile=$STATE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
}

# SLURM's OCI containers (`srun --container=BUNDLE`, swiftslurm's container=oci) run through runc as root.
# The container's id names the node, job, step and task; a requeued job's step has the same id, so a container
# a killed step left behind is deleted before the new one runs (RunTime* lines are run by /bin/sh).
write_oci_conf() {
  local runc="runc --root=$STATE/run/runc" id="%n.%u.%j.%s.%t"
  cat <<EOF
# Generated by scripts/slurm-local.sh -- edits are lost on the next \`up\`.
RunTimeQuery="$runc state $id"
RunTimeKill="$runc kill -a $id SIGTERM"
RunTimeDelete="$runc delete --force $id"
RunTimeRun="$runc delete --force $id 2>/dev/null; exec $runc run $id -b %b"
EOF
}

# Links /etc/slurm/{slurm,slurmdbd}.conf to our files: the daemons, the Python tool, submitit
# and srun inside jobs all use Debian's default path without any SLURM_CONF. A foreign regular
# file is kept as *.swiftslurm-orig and put back by `down`.
link_configs() {
  local f
  mkdir -p "$SLURM_ETC"
  for f in slurm.conf slurmdbd.conf oci.conf; do
    if [[ -e $SLURM_ETC/$f && ! -L $SLURM_ETC/$f ]]; then
      mv "$SLURM_ETC/$f" "$SLURM_ETC/$f.swiftslurm-orig"
    fi
    ln -sfn "$STATE/etc/$f" "$SLURM_ETC/$f"
  done
}

unlink_configs() {
  local f
  for f in slurm.conf slurmdbd.conf oci.conf; do
    if [[ -L $SLURM_ETC/$f && $(readlink "$SLURM_ETC/$f") == "$STATE/etc/$f" ]]; then
      rm -f "$SLURM_ETC/$f"
      [[ -e $SLURM_ETC/$f.swiftslurm-orig ]] && mv "$SLURM_ETC/$f.swiftslurm-orig" "$SLURM_ETC/$f"
    fi
  done
  return 0
}

# Fresh state every start: stale StateSaveLocation/spool from a killed session makes reused job
# ids fail ("Job credential revoked"), and a fresh DB keeps sacct from showing old jobs with the
# same ids. The previous logs are kept in log.prev for post-mortems.
reset_state() {
  mkdir -p "$STATE"
  rm -rf "$STATE/log.prev"
  [[ -d $STATE/log ]] && mv "$STATE/log" "$STATE/log.prev"
  rm -rf "${STATE:?}/etc" "$STATE/ctld" "$STATE/spool" "$STATE/mysql" "$STATE/run" "$STATE/pids"
  mkdir -p "$STATE/etc" "$STATE/ctld" "$STATE/spool" "$STATE/mysql" "$STATE/run" "$STATE/pids" "$STATE/log"
  write_slurm_conf >"$STATE/etc/slurm.conf"
  write_slurmdbd_conf >"$STATE/etc/slurmdbd.conf"
  write_oci_conf >"$STATE/etc/oci.conf"
  chmod 600 "$STATE/etc/slurmdbd.conf" # slurmdbd refuses a readable-by-all config
  save_settings
}

# ---------------------------------------------------------------- daemons

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

# Reuses a munged that already answers (not ours: `down` leaves it alone); otherwise starts one
# as user munge (munged refuses keys/dirs it does not own).
start_munge() {
  if munge_works; then
    log "munged: using the one already running"
    return 0
  fi
  if [[ ! -s /etc/munge/munge.key ]]; then
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
  start_daemon munged munged setpriv --reuid=munge --regid=munge --init-groups munged -F -f
  wait_for 20 munged munge_works
}

sql() { mariadb --no-defaults --socket="$STATE/run/mysqld.sock" -u root "$@"; }

# MariaDB as a plain process: datadir under $STATE, TCP on loopback only (slurmdbd connects by
# TCP), a socket in $STATE for the root setup below. A fresh datadir takes ~2 s to create.
start_mariadb() {
  mariadb-install-db --no-defaults --user=root --datadir="$STATE/mysql" \
    --auth-root-authentication-method=normal --skip-test-db >"$STATE/log/mariadb-install.out" 2>&1
  start_daemon mariadb mariadbd mariadbd --no-defaults --user=root --datadir="$STATE/mysql" \
    --socket="$STATE/run/mysqld.sock" --pid-file="$STATE/run/mysqld.pid" \
    --bind-address=127.0.0.1 --port="$DB_PORT" --skip-name-resolve --skip-log-bin \
    --log-error="$STATE/log/mariadb.log" --innodb-buffer-pool-size=128M \
    --innodb-lock-wait-timeout=900
  wait_for 60 mariadb sql -e 'SELECT 1'
  sql -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
}

# slurmdbd, then the cluster row in the accounting DB (without it slurmctld cannot register
# and sacct shows nothing). No AccountingStorageEnforce: jobs need no user association.
start_slurmdbd() {
  start_daemon slurmdbd slurmdbd slurmdbd -D
  wait_for 60 slurmdbd sacctmgr -n list cluster
  sacctmgr -i add cluster "$CLUSTER" >/dev/null
}

ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }

# By its plain name: Debian's slurmctld-wlm name crashes with accounting enabled.
start_slurmctld() {
  start_daemon slurmctld slurmctld slurmctld -D
  wait_for 60 slurmctld ctld_up
}

# The nodes' mount namespaces are slaves of the host's, but the host's own mounts here are private
# (no propagation): a bind mount of MOUNTS onto itself, made shared before the nodes start, is the
# one place whose later mounts reach them.
shared_mounts() {
  mkdir -p "$MOUNTS"
  mountpoint -q "$MOUNTS" || mount --bind "$MOUNTS" "$MOUNTS"
  mount --make-shared "$MOUNTS"
}

unmount_shared() {
  mountpoint -q "$MOUNTS" 2>/dev/null || return 0
  umount -R -l "$MOUNTS" || true
}

# nsenter --net (not `ip netns exec`, which remounts /sys and hides /sys/fs/cgroup), then a
# fresh UTS namespace so `hostname` in jobs is the node name, and a mount namespace of its own
# (a slave of the host's: it sees the host's mounts, its own stay inside) so a test can give one
# node a mount the others lack, e.g. a run dir that node does not share.
start_slurmd() {
  local node=$1
  # shellcheck disable=SC2016  # $1 is expanded by the inner sh
  start_daemon "slurmd-$node" slurmd nsenter --net="/run/netns/$NS_PREFIX$node" -- \
    unshare --uts --mount --propagation slave -- sh -c 'hostname "$1" && exec slurmd -D -N "$1"' sh "$node"
}

# All nodes responding and schedulable (idle, or busy with jobs).
nodes_ready() {
  local states
  states=$(sinfo -h -N -p debug -o '%N %T' 2>/dev/null) || return 1
  [[ $(grep -cE ' (idle|mixed|allocated|completing)$' <<<"$states") -eq $NNODES ]]
}

# The best end-to-end check: one task on every node prints its own hostname through srun,
# and the job then shows up in sacct (slurmctld -> slurmdbd -> MariaDB works).
self_check() {
  local got want
  want=$(node_names | sort)
  got=$(timeout 60 srun -N"$NNODES" --ntasks-per-node=1 -J swiftslurm-selfcheck -t 1 hostname | sort) || true
  if [[ $got != "$want" ]]; then
    show_logs
    die "self-check: srun -N$NNODES hostname printed '$got', expected '$want'"
  fi
  wait_for 30 "the self-check job in sacct" \
    bash -c 'sacct -n -X -P --name=swiftslurm-selfcheck -o State | grep -q COMPLETED'
}

# ---------------------------------------------------------------- health

daemon_names() {
  local node
  [[ -f $STATE/pids/munged.pid ]] && echo munged
  echo mariadb slurmdbd slurmctld
  for node in $(node_names); do echo "slurmd-$node"; done
}

config_unchanged() {
  [[ -f $STATE/etc/slurm.conf ]] && diff -q <(write_slurm_conf) "$STATE/etc/slurm.conf" >/dev/null
}

healthy() {
  local name
  for name in $(daemon_names); do pid_alive "$name" || return 1; done
  mountpoint -q "$MOUNTS" && munge_works && ctld_up && nodes_ready
}

# ---------------------------------------------------------------- commands

print_env() {
  echo "SWIFTSLURM_BRIDGE_IP=$BRIDGE_IP"
  echo "SWIFTSLURM_SLURM_STATE=$STATE"
  echo "SWIFTSLURM_SLURM_NODES=$NNODES"
  echo "SWIFTSLURM_SLURM_NODE_NAMES=$(node_names | paste -sd, -)"
  echo "SWIFTSLURM_SLURM_LOGS=$STATE/log"
  echo "SWIFTSLURM_SLURM_MOUNTS=$MOUNTS"
}

cmd_up() {
  local t0=$SECONDS node running
  validate_settings
  ensure_packages
  if healthy && config_unchanged; then
    log "already up and healthy"
    print_env
    return 0
  fi
  # Replacing a healthy cluster wipes its job ids, accounting and queue: only when asked to.
  # In a subshell: the running cluster is judged by the settings it recorded, which must not replace ours.
  if [[ ${1:-} != --force ]] && (load_settings && [[ -f $STATE/cluster.env ]] && healthy); then
    running=$(load_settings && echo "$NNODES")
    die "a healthy cluster of $running nodes runs with other settings than these ($NNODES nodes," \
      "$GROUPS_ group(s)); replacing it would wipe its job ids and accounting. HINT: run with its settings" \
      "(SWIFTSLURM_SLURM_NODES=$running and its SWIFTSLURM_SLURM_GROUPS), or \`up --force\` (or \`restart\`) to replace it"
  fi
  [[ -f $STATE/cluster.env ]] && log "stale or changed cluster found: cleaning it first"
  # In a subshell: cmd_down loads the recorded settings, which must not replace ours.
  (cmd_down)
  check_network_free
  reset_state
  setup_bridge
  for node in $(node_names); do setup_node_net "$node"; done
  add_hosts_entries
  link_configs
  # Daemons inherit our cwd; a CI checkout may be deleted while they run.
  cd "$STATE"
  start_munge
  start_mariadb
  start_slurmdbd
  start_slurmctld
  shared_mounts
  for node in $(node_names); do start_slurmd "$node"; done
  wait_for 90 "all $NNODES nodes idle in sinfo" nodes_ready
  self_check
  log "up in $((SECONDS - t0))s: $NNODES nodes on $BRIDGE ($BRIDGE_IP/24), logs in $STATE/log"
  sinfo >&2
  print_env
}

# Stops everything at once (TERM, then KILL after 15 s): the next `up` wipes all state anyway,
# so no shutdown order matters, and serial shutdowns cost ~2 s per daemon.
cmd_down() {
  local node names=(slurmctld slurmdbd mariadb munged) pids
  load_settings
  for node in $(node_names); do names+=("slurmd-$node"); done
  mapfile -t pids < <(recorded_alive_pids "${names[@]}"; namespace_pids)
  terminate_pids "${pids[@]}"
  rm -f "$STATE"/pids/*.pid
  teardown_network
  unmount_shared
  unlink_configs
  rm -f "$STATE/cluster.env"
  log "down: stopped ${#pids[@]} process(es), removed namespaces/bridge/hosts entries"
}

cmd_status() {
  local name ok=0
  load_settings
  if [[ ! -f $STATE/cluster.env ]]; then
    echo "not up (no $STATE/cluster.env)"
    return 1
  fi
  for name in $(daemon_names); do
    if pid_alive "$name"; then
      echo "$name: running (pid $(recorded_pid "$name"))"
    else
      echo "$name: NOT running"
      ok=1
    fi
  done
  munge_works || { echo "munge: credentials do NOT work"; ok=1; }
  ctld_up || { echo "slurmctld: does NOT answer scontrol ping"; ok=1; }
  nodes_ready || { echo "nodes: not all $NNODES responding"; ok=1; }
  sinfo 2>&1 || true
  print_env
  return "$ok"
}

cmd_exec() {
  local node=${1:?usage: slurm-local.sh exec NODE [CMD...]}
  shift
  load_settings
  pid_alive "slurmd-$node" || die "slurmd of $node is not running"
  (($# > 0)) || set -- bash
  exec nsenter --target "$(recorded_pid "slurmd-$node")" --net --uts --mount -- "$@"
}

# Serialises concurrent up/down calls (e.g. two test sessions starting at once).
take_lock() {
  local dir=/run/lock
  [[ -d $dir ]] || dir=/tmp
  exec 9>"$dir/swiftslurm-slurm.lock"
  flock 9
}

main() {
  local cmd=${1:-}
  [[ -n $cmd ]] && shift
  case $cmd in
    up | down | restart) [[ $EUID -eq 0 ]] || die "must run as root" ;;
  esac
  case $cmd in
    up) take_lock && cmd_up "$@" ;;
    down) take_lock && cmd_down ;;
    restart) take_lock && (cmd_down) && cmd_up --force ;;
    status) cmd_status ;;
    env) load_settings && print_env ;;
    exec) cmd_exec "$@" ;;
    *)
      sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2
      exit 2
      ;;
  esac
}

main "$@"
