#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: set up .venv, start the local SLURM cluster (if it is not
# up already), lint, type-check, run every test. Extra arguments go to pytest (e.g. -k slurm, -x).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

# Three nodes: 2-node jobs, plus a spare for the test that loses a node. `up` is a no-op when the
# cluster already runs with this configuration.
export SWIFTSLURM_SLURM_NODES=3
started_cluster=0
if ! bash scripts/slurm-local.sh status >/dev/null 2>&1; then
  started_cluster=1
fi
bash scripts/slurm-local.sh up
# Stop the cluster again only if this script started it.
trap '[[ $started_cluster == 1 ]] && bash scripts/slurm-local.sh down' EXIT

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# The SLURM tests must run here, not skip: fail if the cluster is unreachable.
SWIFTSLURM_REQUIRE_SLURM=1 .venv/bin/python -m pytest "$@"
