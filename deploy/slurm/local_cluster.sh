#!/bin/bash
# A one-node Slurm on this machine, from the distribution's packages, to run the templates for
# real (`make test-slurm` uses it). Needs root (Debian/Ubuntu: installs slurmctld, slurmd,
# slurm-client and munge with apt-get when missing).
#
#   deploy/slurm/local_cluster.sh start   # prints: export SLURM_CONF=...
#   deploy/slurm/local_cluster.sh stop
#
# Auth: Slurm before 23.11 has no auth/slurm (a shared key, no extra daemon), so this uses
# munge: the package's /etc/munge/munge.key and a munged started here. Everything else lives in
# $SLURM_DIR (default /tmp/arealite-slurm): slurm.conf, state, spool, logs, pid files. The
# daemons bind the address this host's name resolves to (CommunicationParameters=NoInAddrAny).
set -euo pipefail

SLURM_DIR=${SLURM_DIR:-/tmp/arealite-slurm}
CONF=$SLURM_DIR/slurm.conf
CTLD_PORT=${SLURMCTLD_PORT:-6817}
SLURMD_PORT=${SLURMD_PORT:-6818}

die() { echo "local_cluster.sh: $*" >&2; exit 2; }

install_packages() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
    && command -v munged >/dev/null && return
  command -v apt-get >/dev/null || die "install slurmctld, slurmd, slurm-client and munge first"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    slurmctld slurmd slurm-client munge
}

start_munge() {
  [ -s /etc/munge/munge.key ] || { mungekey --create 2>/dev/null || create-munge-key; }
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return  # already running
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged
  mkdir -p "$SLURM_DIR" && touch "$SLURM_DIR/munged.ours"  # so that `stop` stops it too
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.1; done
  die "munged did not start"
}

write_conf() {
  local host node
  host=$(hostname)
  # this node as slurmd sees it (CPUs, sockets, memory), reached at loopback
  node=$(slurmd -C | head -1)
  mkdir -p "$SLURM_DIR"/{state,spool,log}
  cat > "$CONF" <<EOF
ClusterName=arealite
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
CommunicationParameters=NoInAddrAny
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmdTimeout=60
KillWait=10
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

pid_of() { [ -s "$SLURM_DIR/$1.pid" ] && cat "$SLURM_DIR/$1.pid"; }

running() { local p; p=$(pid_of "$1") && kill -0 "$p" 2>/dev/null; }

start() {
  [ "$(id -u)" = 0 ] || die "needs root (slurmd runs jobs as their users)"
  install_packages
  start_munge
  write_conf
  export SLURM_CONF=$CONF
  running slurmctld || slurmctld -f "$CONF" -c  # -c: clear state left by an earlier start
  running slurmd || slurmd -f "$CONF"
  local node
  node=$(hostname)
  for _ in $(seq 120); do
    state=$(sinfo -h -n "$node" -o %T 2>/dev/null || true)
    case "$state" in
      idle*|mixed*|allocated*) echo "export SLURM_CONF=$CONF"; return 0;;
      down*|drain*) scontrol update nodename="$node" state=resume 2>/dev/null || true;;
    esac
    sleep 0.5
  done
  tail -20 "$SLURM_DIR"/log/*.log >&2
  die "node $node not idle after 60 s (state: ${state:-none}); logs above"
}

stop() {
  local name p
  for name in slurmd slurmctld; do
    p=$(pid_of "$name") || continue
    kill "$p" 2>/dev/null || continue
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  if [ -f "$SLURM_DIR/munged.ours" ] && [ -s /run/munge/munged.pid ]; then
    kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true
    rm -f "$SLURM_DIR/munged.ours"
  fi
}

case "${1:-}" in
  start) start;;
  stop) stop;;
  *) die "usage: $0 start|stop";;
esac
