#!/usr/bin/env bash
# A real Slurm cluster on one machine, for chapter 04 and its tests: one controller and two
# emulated compute nodes (n1, n2: two slurmd daemons on 127.0.0.1), from Debian's slurm-wlm
# and munge packages.  Needs root.  Both commands are idempotent.
#
#   scripts/slurm_cluster.sh up      install (if missing) and start; waits until both nodes are idle
#   scripts/slurm_cluster.sh down    stop the daemons (the packages stay installed)
#   scripts/slurm_cluster.sh status  exit 0 when the cluster answers
#
# APT_TIMEOUT (seconds, default 180) bounds the package install, SLURM_WAIT (default 30) the start.
set -uo pipefail

CONF_DIR=/etc/slurm
STATE=/var/spool/slurm-course
LOGS=/var/log/slurm-course
NODES=(n1 n2)
APT_TIMEOUT=${APT_TIMEOUT:-180}
SLURM_WAIT=${SLURM_WAIT:-30}

die() { echo "slurm_cluster: $*" >&2; exit 1; }

need_root() { [ "$(id -u)" -eq 0 ] || die "needs root (it installs packages and starts daemons); try: sudo $0 $*"; }

install_packages() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && return 0
  command -v apt-get >/dev/null || die "slurm-wlm and munge are missing and this is not a Debian/Ubuntu system"
  echo "slurm_cluster: installing slurm-wlm and munge (at most ${APT_TIMEOUT} s)"
  export DEBIAN_FRONTEND=noninteractive
  timeout "$APT_TIMEOUT" apt-get install -y --no-install-recommends slurm-wlm munge >/dev/null \
    || { timeout "$APT_TIMEOUT" apt-get update >/dev/null && \
         timeout "$APT_TIMEOUT" apt-get install -y --no-install-recommends slurm-wlm munge >/dev/null; } \
    || die "could not install slurm-wlm and munge within ${APT_TIMEOUT} s"
}

write_config() {
  local cpus mem
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 4 ))  # each node claims a quarter
  mkdir -p "$CONF_DIR" "$STATE" "$LOGS"
  for node in "${NODES[@]}"; do mkdir -p "$STATE/$node"; done
  cat > "$CONF_DIR/slurm.conf" <<EOF
# Written by scripts/slurm_cluster.sh: two emulated nodes on this machine.
ClusterName=course
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/%n
SlurmctldPidFile=/run/slurmctld-course.pid
SlurmdPidFile=/run/slurmd-course-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
SlurmctldPort=6817
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
InactiveLimit=0
KillWait=5
MinJobAge=600
NodeName=n[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[17001-17002] CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=course Nodes=n[1-2] Default=YES MaxTime=15 State=UP OverSubscribe=YES
EOF
  mkdir -p "$STATE/ctld"
}

start_munge() {
  pgrep -x munged >/dev/null && return 0
  [ -s /etc/munge/munge.key ] || mungekey --create >/dev/null 2>&1 || \
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
  chown munge:munge /etc/munge/munge.key 2>/dev/null; chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null
  if id munge >/dev/null 2>&1; then
    su -s /bin/sh munge -c "munged" 2>/dev/null || munged --force
  else
    munged --force
  fi
}

running() { pgrep -f "slurmctld" >/dev/null && [ "$(pgrep -fc 'slurmd -N n')" -ge "${#NODES[@]}" ]; }

up() {
  need_root up
  install_packages
  if running && timeout 5 sinfo >/dev/null 2>&1; then echo "slurm_cluster: already up"; sinfo; return 0; fi
  write_config
  start_munge || die "munged did not start"
  pgrep -x slurmctld >/dev/null || slurmctld -i || die "slurmctld did not start (see $LOGS/slurmctld.log)"
  for node in "${NODES[@]}"; do
    pgrep -f "slurmd -N $node" >/dev/null || slurmd -N "$node" || die "slurmd $node did not start (see $LOGS)"
  done
  local waited=0
  until [ "$(timeout 5 sinfo -h -o '%t' -p course 2>/dev/null | grep -c idle)" -ge 1 ] && \
        [ "$(timeout 5 sinfo -h -N -o '%t' -p course 2>/dev/null | grep -c idle)" -ge "${#NODES[@]}" ]; do
    sleep 1; waited=$((waited + 1))
    [ "$waited" -ge "$SLURM_WAIT" ] && die "the nodes did not become idle within ${SLURM_WAIT} s: $(sinfo -N 2>&1)"
  done
  echo "slurm_cluster: up"; sinfo -N
}

down() {
  need_root down
  for pidfile in /run/slurmd-course-*.pid /run/slurmctld-course.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null
  done
  for _ in $(seq 20); do pgrep -f "slurmd -N n|slurmctld" >/dev/null || break; sleep 0.5; done
  rm -f /run/slurmd-course-*.pid /run/slurmctld-course.pid
  echo "slurm_cluster: down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) timeout 5 sinfo -h >/dev/null 2>&1 ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
