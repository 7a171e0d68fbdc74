#!/usr/bin/env bash
# Create .venv with everything swiftslurm needs, in the order that keeps torch a CPU build:
# torch 2.13.0 first (pip takes the CPU wheel from local disk; an unpinned torch would pull
# a multi-GB CUDA build), then ms-swift and the rest, then deepspeed built without its ops.
# Idempotent: a second run only checks that the pins are satisfied.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }

pip install -q --upgrade 'pip>=24' wheel setuptools
pip install -q torch==2.13.0
# ms-swift 4.6 needs these upper bounds (newer releases break it at import or at train time).
pip install -q -c constraints.txt 'ms-swift==4.6.0'
# deepspeed compiles nothing with DS_BUILD_OPS=0; --no-build-isolation lets it see our torch.
DS_BUILD_OPS=0 pip install -q -c constraints.txt --no-build-isolation 'deepspeed==0.18.9'
# DeepSpeed compiles its CPU ops (Adam, shared-memory all-reduce) on first use, under a lock file in
# ~/.cache/torch_extensions. A job killed mid-build (preempted, cancelled) leaves the lock behind and every
# later DeepSpeed job waits on it for ever: build them here, once, so jobs never do.
"$VENV/bin/python" - <<'PY'
from deepspeed.ops.op_builder.cpu import CPUAdamBuilder, ShareMemCommBuilder

for builder in (CPUAdamBuilder(), ShareMemCommBuilder()):
    builder.load(verbose=False)
PY
pip install -q -c constraints.txt -e '.[dev]'
# matplotlib builds its font cache on first use, asking fc-list for the system's fonts: build it here, so that the
# first plot (a unit test's, whose guard refuses child processes) finds it made.
"$VENV/bin/python" -c 'import matplotlib.font_manager'
"$VENV/bin/python" -c 'import torch, swift, deepspeed, submitit, hydra, boto3; print("setup ok: torch", torch.__version__)'
