#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: set up .venv, lint, type-check, then the three tiers of
# tests/README.md, cheapest first, each within its time budget; the local SLURM cluster (started in the
# background if it is not up already) serves the cluster tier only. Extra arguments go to every tier's pytest (e.g. -x, -k storage).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each tier's budget in seconds on the reference machine, here and nowhere else: a tier that runs longer fails
# (tests/conftest.py), even when every test passed, so growth shows up as a failure rather than a slower CI.
# Measured by scripts/test.sh on the 2-core machine (tests/README.md, 2026-12-03, slowdown 1.06-1.19): unit
# 152-211 s, component 198-209 s beside cluster-alone 316-318 s, cluster (two processes) 1595-1761 s; 2191-2277 s
# in all. The unit and
# component budgets leave room for a busy machine (they took 362 s and 300 s beside other work); the cluster ones
# about 35 %, since a busy machine slows those tests most. Each is multiplied by this machine's measured slowdown
# against the reference (swiftslurm/testing/speed.py, measured below before the tiers): a machine slower this hour
# is not growth.
UNIT_BUDGET_S=300
COMPONENT_BUDGET_S=600
CLUSTER_BUDGET_S=2400
CLUSTER_ALONE_BUDGET_S=600

# Two groups of three nodes: 2-node jobs, plus a spare for the tests that lose a node, for each of the cluster
# tier's two pytest processes (pytest-xdist, one group each: swiftslurm/testing/node_group.py). The cluster starts
# in the background while setup and the cheaper tiers run (on a fresh machine its apt install takes minutes);
# `up` is a no-op when the cluster already runs with this configuration. It is stopped again only if this script
# started it.
CLUSTER_PROCESSES=2
export SWIFTSLURM_SLURM_NODES=$((3 * CLUSTER_PROCESSES)) SWIFTSLURM_SLURM_GROUPS=$CLUSTER_PROCESSES
started_cluster=0
if ! bash scripts/slurm-local.sh status >/dev/null 2>&1; then
  started_cluster=1
fi
logs=$(mktemp -d)
cleanup() {
  local status=$?  # the script's: what cleaning up returns must not replace it
  [[ -n ${cluster_pid:-} ]] && kill "$cluster_pid" 2>/dev/null && wait "$cluster_pid" 2>/dev/null
  # A tier still running in the background (another failed first): its `timeout` passes the TERM to pytest.
  # shellcheck disable=SC2046  # one PID per word
  [[ -n ${alone_pid:-} ]] && kill $(ps -o pid= --ppid "$alone_pid") 2>/dev/null && wait "$alone_pid" 2>/dev/null
  [[ $started_cluster == 1 ]] && bash scripts/slurm-local.sh down
  rm -rf "$logs"
  exit "$status"
}
trap cleanup EXIT
bash scripts/slurm-local.sh up >"$logs/cluster" 2>&1 &
cluster_pid=$!

# background_ok PID LOG NAME: wait for a background step, print what it said, fail if it failed.
background_ok() {
  local status=0
  wait "$1" || status=$?
  cat "$2"
  if [[ $status != 0 ]]; then
    echo "$3 failed (exit $status)" >&2
    exit "$status"
  fi
}

bash scripts/setup.sh
# The budgets' scale: how much slower than the reference machine this one is now (never below 1).
slowdown=$(.venv/bin/python -m swiftslurm.testing.speed | sed -n 's/^SWIFTSLURM_MACHINE_SLOWDOWN=//p')
export SWIFTSLURM_MACHINE_SLOWDOWN=$slowdown

.venv/bin/ruff check .
.venv/bin/ruff format --check .
# mypy (half a minute on a cold cache) runs beside the unit tier: each takes one of CI's two cores.
.venv/bin/mypy >"$logs/mypy" 2>&1 &
mypy_pid=$!

# tier NAME BUDGET_S PATH [pytest args]: the budget is checked when the tier ends; a tier still running at
# twice its budget (a hang) is interrupted, and pytest still prints what ran. With arguments of the caller's
# (`-k storage`), a tier they leave without tests (pytest's exit 5) passes.
selected_by_caller=$#
tier() {
  local name=$1 base=$2 budget status=0
  budget=$(awk -v b="$base" -v f="$slowdown" 'BEGIN { printf "%d", b * f }')
  shift 2
  echo "=== $name tier (budget ${budget} s: ${base} s x ${slowdown}, this machine's slowdown)"
  SWIFTSLURM_TIER_BUDGET_S=$budget timeout --signal=INT --kill-after=60 $((2 * budget)) \
    .venv/bin/python -m pytest --durations=15 "$@" || status=$?
  if [[ $status == 5 && $selected_by_caller != 0 ]]; then
    status=0
  fi
  return "$status"
}

tier unit "$UNIT_BUDGET_S" tests/unit "$@"
background_ok "$mypy_pid" "$logs/mypy" mypy

background_ok "$cluster_pid" "$logs/cluster" "starting the SLURM cluster (scripts/slurm-local.sh up)"
cluster_pid=
# The SLURM tests must run here, not skip: fail if the cluster is unreachable. The uninterrupted reference run
# that many of them compare with is trained once for all their processes (tests/cluster/conftest.py).
export SWIFTSLURM_REQUIRE_SLURM=1 SWIFTSLURM_TEST_SHARED=$logs/shared
mkdir -p "$SWIFTSLURM_TEST_SHARED"
# The cluster tests that freeze slurmctld (every job shares it) run with no other cluster test, beside the
# component tier, which never calls SLURM; most of their time is waiting out the faults they force.
tier cluster-alone "$CLUSTER_ALONE_BUDGET_S" tests/cluster -m whole_cluster "$@" >"$logs/alone" 2>&1 &
alone_pid=$!
tier component "$COMPONENT_BUDGET_S" tests/component "$@"
background_ok "$alone_pid" "$logs/alone" "the cluster tier's whole_cluster tests"
alone_pid=
# The rest as two processes side by side, each on its own nodes: most of their time is waiting too (for SLURM,
# signals, time limits, steps held at a pace).
tier cluster "$CLUSTER_BUDGET_S" tests/cluster -n "$CLUSTER_PROCESSES" --dist worksteal -m "not whole_cluster" "$@"
