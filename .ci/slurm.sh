#!/usr/bin/env bash
# CI on a real SLURM cluster. Starts a private one-node cluster (munged, slurmctld,
# slurmd -N localhost; two GRES "gpus" that are placeholders, so GPU requests schedule),
# runs the workflow on workflow/presets/test.yaml locally and through the users' SLURM
# profile plus the CI overrides (workflow/profiles/ci-slurm), then checks that every
# non-local job ran as a SLURM job that completed, and that both runs give identical
# numbers (entropy stores, tables, training hashes). The SLURM run analyses every sample in
# a job of its own (jobs.batch_max_entries 0), the local run the small models' samples in
# one job per stage: identical numbers also show that batching changes nothing. The daemons it started are stopped
# by PID on exit. Needs root: it may install slurm-wlm and munge, and it writes
# /etc/slurm/slurm.conf and gres.conf (restored or removed on exit), because the job
# step plugin clears SLURM_* variables, SLURM_CONF included, before its inner srun, which
# then reads the default location. Do not run it on a machine that is part of a cluster.
#   .ci/slurm.sh            (KEEP=1 keeps the temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
CONFIG=workflow/presets/test.yaml
t_start=$SECONDS
say() { printf '[slurm-ci %4ds] %s\n' $((SECONDS - t_start)) "$*"; }

# -- software --------------------------------------------------------------------------
[ -x .venv/bin/snakemake ] || make .venv/.installed
SMK="$ROOT/.venv/bin/snakemake"
PY="$ROOT/.venv/bin/python"
need=()
command -v slurmctld >/dev/null || need+=(slurm-wlm)
command -v munged >/dev/null || need+=(munge)
if ((${#need[@]})); then
    say "installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# -- cleanup: cancel our jobs, stop our daemons (newest first), by PID -------------------
WORK=$(mktemp -d /tmp/oattn-slurm-ci.XXXXXX)
chmod 755 "$WORK"
PIDS=()
ETC=/etc/slurm
CONF_FILES=(slurm.conf gres.conf)
restore_conf() {
    local f
    for f in "${CONF_FILES[@]}"; do
        if [ -e "$WORK/etc-backup/$f" ]; then
            cp -p "$WORK/etc-backup/$f" "$ETC/$f"
        elif [ -e "$WORK/etc-backup/.written" ]; then
            rm -f "$ETC/$f"
        fi
    done
}
LOCAL_PID=
cleanup() {
    local rc=$? pid i
    trap - EXIT
    if [ -n "$LOCAL_PID" ]; then kill "$LOCAL_PID" 2>/dev/null || true; wait "$LOCAL_PID" 2>/dev/null || true; fi
    if ((${#PIDS[@]})); then
        # the cluster is this script's own, so "every job" means its jobs
        scancel --quiet --user "$(id -un)" 2>/dev/null || true
        for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
            pid=${PIDS[i]}
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -9 "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        done
        say "stopped daemons ${PIDS[*]}"
    fi
    restore_conf
    if ((rc == 0)) && [ -z "${KEEP:-}" ]; then
        rm -rf "$WORK"
    else
        say "kept $WORK (daemon logs in $WORK/log)"
    fi
    say "exit $rc after $((SECONDS - t_start)) s"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit=$1 what=$2 t0=$SECONDS
    shift 2
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS - t0 >= limit)); then
            say "timed out after ${limit}s waiting for $what"
            tail -n 20 "$WORK"/log/*.log >&2 || true
            return 1
        fi
        sleep 0.5
    done
}

# -- cluster ---------------------------------------------------------------------------
for d in slurmctld slurmd; do
    if pgrep -x "$d" >/dev/null; then
        echo "a $d is already running on this machine; not touching its cluster" >&2
        exit 1
    fi
done
mkdir -p "$WORK"/{munge,log,spool/slurmd,spool/slurmctld}
chmod 755 "$WORK/munge"
SOCKET=$WORK/munge/munge.socket
dd if=/dev/urandom of="$WORK/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$WORK/munge/munge.key"
munged --foreground --force --socket="$SOCKET" --key-file="$WORK/munge/munge.key" \
    --pid-file="$WORK/munge/munged.pid" --seed-file="$WORK/munge/munged.seed" \
    --log-file="$WORK/log/munged.log" >>"$WORK/log/munged.out" 2>&1 &
PIDS+=($!)
wait_for 20 munged bash -c "munge -S '$SOCKET' -n | unmunge -S '$SOCKET'"

read -r CTLD_PORT SLURMD_PORT < <("$PY" -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
CPUS=$(nproc)
MEM_MB=$(awk '/MemTotal/ {m = int($2 / 1024 * 0.85); print (m < 20000 ? m : 20000)}' /proc/meminfo)
mkdir -p "$WORK/etc-backup" "$ETC"
for f in "${CONF_FILES[@]}"; do
    if [ -e "$ETC/$f" ]; then cp -p "$ETC/$f" "$WORK/etc-backup/$f"; fi
done
touch "$WORK/etc-backup/.written"
export SLURM_CONF=$ETC/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=local
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge=3600
SlurmdSpoolDir=$WORK/spool/slurmd
StateSaveLocation=$WORK/spool/slurmctld
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/log/slurmctld.log
SlurmdLogFile=$WORK/log/slurmd.log
GresTypes=gpu
NodeName=localhost CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
# two placeholder GPUs (no devices behind them): `--gpus` requests of the GPU rules
# schedule as on a GPU node; the test config runs on the CPU
cat >"$ETC/gres.conf" <<EOF
AutoDetect=off
NodeName=localhost Name=gpu File=/dev/null
NodeName=localhost Name=gpu File=/dev/zero
EOF
slurmctld -D -i >>"$WORK/log/slurmctld.out" 2>&1 &
PIDS+=($!)
wait_for 30 slurmctld scontrol ping
slurmd -D -N localhost >>"$WORK/log/slurmd.out" 2>&1 &
PIDS+=($!)
wait_for 60 "node localhost to be idle" bash -c '[ "$(sinfo -h -n localhost -o %T)" = idle ]'
say "cluster up: $CPUS CPUs, $MEM_MB MB, 2 GRES gpus; ports $CTLD_PORT/$SLURMD_PORT; SLURM_CONF=$SLURM_CONF"
say "smoke step: $(srun --gpus=1 bash -c 'echo "$(hostname), job $SLURM_JOB_ID, CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"')"

# -- the two runs, side by side ----------------------------------------------------------
# Same working directory (the repo), separate results dirs; --drop-metadata keeps the
# repo's .snakemake free of records about files in $WORK. The local run fills the CPU
# while the SLURM run waits between status checks.
COMMON=(--configfile "$CONFIG" --drop-metadata)
t0=$SECONDS
(   # records its own wall time; passes a TERM from the cleanup on to snakemake
    s=$SECONDS
    "$SMK" --profile workflow/profiles/default "${COMMON[@]}" --config "results=$WORK/local" \
        >"$WORK/log/local-run.log" 2>&1 &
    child=$!
    trap 'kill $child 2>/dev/null; wait $child; exit 143' TERM
    rc=0
    wait $child || rc=$?
    echo $((SECONDS - s)) >"$WORK/log/local-run.seconds"
    exit $rc
) &
LOCAL_PID=$!
slurm_rc=0
"$SMK" --profile workflow/profiles/slurm --workflow-profile workflow/profiles/ci-slurm \
    "${COMMON[@]}" --config "results=$WORK/slurm" "jobs={batch_max_entries: 0}" --slurm-logdir "$WORK/slurm_logs" \
    >"$WORK/log/slurm-run.log" 2>&1 || slurm_rc=$?
t_slurm=$((SECONDS - t0))
local_rc=0
wait "$LOCAL_PID" || local_rc=$?
LOCAL_PID=
t_local=$(cat "$WORK/log/local-run.seconds" 2>/dev/null || echo "?")
((local_rc == 0)) || { tail -n 40 "$WORK/log/local-run.log"; say "local run failed"; exit 1; }
((slurm_rc == 0)) || { tail -n 60 "$WORK/log/slurm-run.log"; say "SLURM run failed"; exit 1; }
say "side by side: SLURM run ${t_slurm}s, local run ${t_local}s"

# -- checks ----------------------------------------------------------------------------
"$PY" - "$WORK" <<'EOF'
"""Jobs ran as SLURM jobs; the SLURM run's numbers equal the local run's."""
import json, re, subprocess, sys
from pathlib import Path

import numpy as np

from oattn_lib.store import read_store

work = Path(sys.argv[1])
local, slurm = work / "local", work / "slurm"
fail = []

# 1. one plugin log per non-local job, named <SLURM job id>.log, every job COMPLETED
logs = sorted((work / "slurm_logs").rglob("*.log"))
jobs = {}
for log in logs:
    if not re.fullmatch(r"\d+", log.stem):
        fail.append(f"{log}: not named by a SLURM job id")
        continue
    rule = log.relative_to(work / "slurm_logs").parts[0].removeprefix("rule_")
    jobs[log.stem] = rule
expected = sorted(p.relative_to(slurm / "logs") for p in (slurm / "logs").rglob("*.log"))
# the users' profile groups each sample's organize and decompose, up to 10 samples per SLURM
# job (groups, group-components): every other job is a SLURM job of its own
grouped = [p for p in expected if re.fullmatch(r"(organize|decompose)_sample\d+\.log", p.name)]
samples = sum(1 for p in grouped if p.name.startswith("organize_"))
want = len(expected) - len(grouped) + -(-samples // 10)
if not samples or len(jobs) != want:
    fail.append(f"{len(jobs)} SLURM jobs for {len(expected)} jobs of the workflow, {len(grouped)} of them in "
                f"groups of at most 10 samples ({samples} samples): expected {want}")
states = {}  # job id -> (state, TRES); MinJobAge=3600 keeps finished jobs listed
for line in subprocess.run(["scontrol", "-o", "show", "job"], check=True,
                           capture_output=True, text=True).stdout.splitlines():
    fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
    if "JobId" in fields:
        states[fields["JobId"]] = (fields.get("JobState", "?"), fields.get("JobName", ""),
                                   " ".join(fields.get(k, "") for k in ("TRES", "TresPerJob", "TresPerNode")))
run_id = re.search(r"SLURM run ID: (\S+)", (work / "log" / "slurm-run.log").read_text()).group(1)
for jid, rule in sorted(jobs.items(), key=lambda kv: int(kv[0])):
    state, name, _ = states.get(jid, ("unknown", "", ""))
    if state != "COMPLETED" or name != run_id:
        fail.append(f"SLURM job {jid} ({rule}): {state}, name {name!r} (this run: {run_id})")
gpu_jobs = sorted({r for j, r in jobs.items() if "gpu" in states.get(j, ("", "", ""))[2]})
by_rule = {}
for rule in jobs.values():
    by_rule[rule] = by_rule.get(rule, 0) + 1
print(f"{len(jobs)} SLURM jobs of run {run_id}: {dict(sorted(by_rule.items()))}; "
      f"rules with GPU requests: {gpu_jobs}")
if not {"train", "extract"} <= set(gpu_jobs):
    fail.append(f"train and extract should request GPUs (profile set-resources), got {gpu_jobs}")

# 2. identical numbers: entropy stores, tables, training hashes
models = sorted(p.parent.name for p in local.glob("*/entropy.zarr"))
if not models:
    fail.append("the local run wrote no entropy store")
for m in models:
    a, b = read_store(local / m / "entropy.zarr"), read_store(slurm / m / "entropy.zarr")
    for name in sorted(set(a.data_vars) | set(b.data_vars)):
        if name not in a or name not in b or not np.array_equal(a[name].values, b[name].values,
                                                                 equal_nan=True):
            fail.append(f"{m}/entropy.zarr: {name} differs")
    for t in sorted((local / m / "tables").iterdir()):
        if t.read_bytes() != (slurm / m / "tables" / t.name).read_bytes():
            fail.append(f"{m}/tables/{t.name} differs")
    metrics = local / m / "model" / "metrics.json"
    if metrics.exists():
        ha = json.loads(metrics.read_text())["state_sha256"]
        hb = json.loads((slurm / m / "model" / "metrics.json").read_text())["state_sha256"]
        if ha != hb:
            fail.append(f"{m}: trained weights differ ({ha[:12]} vs {hb[:12]})")
    print(f"{m}: entropy store ({len(a.data_vars)} variables) and tables identical"
          if not any(f.startswith(m) for f in fail) else f"{m}: DIFFERENT")
if (local / "summary.md").read_bytes() != (slurm / "summary.md").read_bytes():
    fail.append("summary.md differs")
if fail:
    print("FAILED:\n  " + "\n  ".join(fail))
    sys.exit(1)
EOF
say "OK: SLURM run ${t_slurm}s, local run ${t_local}s (side by side), total $((SECONDS - t_start))s"
