#!/usr/bin/env bash
# What a new user pays: the README's two commands (make run, make test) on a fresh clone, nothing cached.
#
# Clones the current commit of this repository into a temporary folder (one clone per
# command), with empty caches: pip (PIP_NO_CACHE_DIR), and through XDG_CACHE_HOME numba's
# user-wide cache, Snakemake's source cache and matplotlib's font cache (numba's in-tree cache
# starts empty in a new clone). Then times, separately:
#   make .venv/.installed   the set-up both commands begin with
#   make run                the workflow on the embedded default, with the report
#   make test               the test suite (in a second clone, its own set-up timed too)
# and prints one line per step and a summary, and appends a row per command to
# bench/fresh_clone.csv (the history; the docs' measurements page shows it). Run it on an idle machine.
#
#   bench/fresh_clone.sh            # both commands (about 25 minutes on 2 cores)
#   bench/fresh_clone.sh run        # or: test
#   KEEP=1 bench/fresh_clone.sh     # keep the temporary folder
#   RECORD=1 bench/fresh_clone.sh   # and write the measured CPU breakdowns into bench/budget.yaml
# Each command's CPU time is checked against bench/budget.yaml (bench/budget.py) as CI does.
set -euo pipefail
SRC=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
WHAT=${1:-both}
case $WHAT in run | test | both) ;; *) echo "usage: $0 [run|test|both]" >&2; exit 2 ;; esac
WORK=$(mktemp -d /tmp/oattn-fresh.XXXXXX)
cleanup() { if [ -z "${KEEP:-}" ]; then rm -rf "$WORK"; else echo "kept $WORK"; fi; }
trap cleanup EXIT
export PIP_NO_CACHE_DIR=1 MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
unset NUMBA_CACHE_DIR MPLCONFIGDIR
COMMIT=$(git -C "$SRC" rev-parse --short HEAD)
[ -z "$(git -C "$SRC" status --porcelain --untracked-files=no)" ] || echo "note: uncommitted changes in $SRC are not in the clone"
echo "fresh clone of $COMMIT in $WORK; $(nproc) cores; $(uname -m); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"

declare -A SECONDS_OF
step() {  # step NAME DIR COMMAND...: run, time, keep the output in $WORK/NAME.log
    local name=$1 dir=$2 t0 rc=0
    shift 2
    t0=$EPOCHREALTIME
    (cd "$dir" && "$@") >"$WORK/$name.log" 2>&1 || rc=$?
    SECONDS_OF[$name]=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    printf '%-14s %8.1f s  (exit %d; log %s)\n' "$name" "${SECONDS_OF[$name]}" "$rc" "$WORK/$name.log"
    if ((rc != 0)); then tail -n 30 "$WORK/$name.log"; exit "$rc"; fi
}
CPU_NAME=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
record() {  # record COMMAND SETUP_S COMMAND_S TESTS JOB_CPU_S: one row of bench/fresh_clone.csv
    printf '%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n' "$(date -u +%F)" "$COMMIT" "$1" "${CPU_NAME//,/ }" "$(nproc)" \
        "$2" "$3" "$(add "$2" "$3")" "$4" "$5" "fresh clone" >>"$SRC/bench/fresh_clone.csv"
}
mmss() { awk -v s="$1" 'BEGIN { printf "%d min %02d s", int(s / 60), int(s) % 60 }'; }
add() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a + b }'; }

if [[ $WHAT != test ]]; then
    export XDG_CACHE_HOME=$WORK/cache-run  # each command's own caches: its set-up from nothing
    git clone -q "$SRC" "$WORK/run"
    step setup-run "$WORK/run" make .venv/.installed
    step run "$WORK/run" make run
    total=$(add "${SECONDS_OF[setup-run]}" "${SECONDS_OF[run]}")
    echo "make run on a fresh clone: $(mmss "$total") (set-up $(mmss "${SECONDS_OF[setup-run]}"), workflow and report $(mmss "${SECONDS_OF[run]}"))"
    summary=$("$WORK/run/.venv/bin/python" "$WORK/run/bench/stages.py" "$WORK/run/results" | tail -n 1)
    echo "$summary"
    record run "${SECONDS_OF[setup-run]}" "${SECONDS_OF[run]}" "" "$(grep -oP 'CPU \K[0-9.]+' <<<"$summary" | head -n 1)"
    "$WORK/run/.venv/bin/python" "$SRC/bench/budget.py" run "$WORK/run/results" || true
    if [ -n "${RECORD:-}" ]; then "$WORK/run/.venv/bin/python" "$SRC/bench/budget.py" record run "$WORK/run/results"; fi
fi
if [[ $WHAT != run ]]; then
    export XDG_CACHE_HOME=$WORK/cache-test
    git clone -q "$SRC" "$WORK/test"
    step setup-test "$WORK/test" make .venv/.installed
    export OATTN_TEST_CPU_DIR=$WORK/test-cpu
    step test "$WORK/test" make test
    unset OATTN_TEST_CPU_DIR
    total=$(add "${SECONDS_OF[setup-test]}" "${SECONDS_OF[test]}")
    echo "make test on a fresh clone: $(mmss "$total") (set-up $(mmss "${SECONDS_OF[setup-test]}"), suite $(mmss "${SECONDS_OF[test]}")): $(grep -E '(passed|failed)' "$WORK/test.log" | tail -n 1)"
    record test "${SECONDS_OF[setup-test]}" "${SECONDS_OF[test]}" "$(grep -oP '[0-9]+(?= passed)' "$WORK/test.log" | tail -n 1)" ""
    "$WORK/test/.venv/bin/python" "$SRC/bench/budget.py" test "$WORK/test-cpu" || true
    if [ -n "${RECORD:-}" ]; then "$WORK/test/.venv/bin/python" "$SRC/bench/budget.py" record test "$WORK/test-cpu"; fi
fi
