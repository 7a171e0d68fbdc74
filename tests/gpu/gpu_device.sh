#!/usr/bin/env bash
# One call on the lent GPU machine (docs/gpu.md). Installs the wheels carried in .whl/ into /tmp/site, builds
# the 0.44B random Qwen3 into /tmp/gpu-assets (both only once per machine), then runs the steps named:
#
#   [OVERHEAD_ARGS="--max-steps 80 ..."] bash tests/gpu/gpu_device.sh BUDGET_S STEP...
#   STEP: matrix[=CASE,CASE] (MATRIX_ARGS: more tests/gpu/gpu_matrix.py options)
#         | overhead=FIRST_PAIR:PAIRS (OVERHEAD_ARGS: more bench/gpu_overhead.py options)
# swiftslurm's own preflight runs inside each job with MATRIX_ARGS="--override preflight=true".
# The wheels: scripts/build-gpu-wheels.sh, on your machine. Run from the repository root.
#
# Results go to $OUT (at most 8 files come back): device.log, matrix.json, overhead.jsonl, versions.json and
# the run logs as .tgz. No overhead pair starts that would end after BUDGET_S.
set -uo pipefail
budget_s=$1
shift
out=${OUT:-/tmp/out}
mkdir -p "$out"
deadline=$(($(date +%s) + budget_s))
exec > >(tee -a "$out/device.log") 2>&1

site=/tmp/site
if [[ ! -f $site/.installed ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
    && touch "$site/.installed" || exit 1
fi
# The plan's `swift` is the one beside cluster.python: a python in /tmp/site/bin, where pip put `swift`.
printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" >"$site/bin/python"
chmod +x "$site/bin/python"
export PYTHONPATH=$site:$PWD PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
# This workplace's rule for shared GPU hosts: no NVLink multicast.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# ASSETS_PRESET=qwen3-1.6b: the 1.6B model of the save-budget run (pass MATRIX_ARGS="--params-b 1.61").
preset=${ASSETS_PRESET:-qwen3-0.5b}
assets=/tmp/gpu-assets-$preset
python3 -m swiftslurm.tiny --preset "$preset" --cache-dir "$assets" || exit 1
common=(--assets "$assets" --out "$out" --override "cluster.python=$site/bin/python")
# Checkpoints are GBs: keep them off a RAM-backed /tmp.
runs=/tmp
[[ $(stat -f -c %T /tmp) == tmpfs ]] && runs=/var/tmp
df -h / /tmp /var/tmp | sed 's/^/  /'
# DeepSpeedCPUAdam (ZeRO offload) is compiled at first use: it needs a C++ compiler and Python's headers.
include=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
echo "  g++: $(command -v g++ || echo missing); Python.h: $(ls "$include/Python.h" 2>/dev/null || echo missing)"
nvidia-smi && nvidia-smi topo -m

for step in "$@"; do
  echo "== $step ($(date +%T), $((deadline - $(date +%s))) s left)"
  case $step in
    matrix*)
      cases=${step#matrix}
      read -ra extra <<<"${MATRIX_ARGS:-}"
      python3 -m tests.gpu.gpu_matrix "${common[@]}" --runs "$runs/gpu-matrix" --case-timeout-s 420 --cases "${cases#=}" \
        "${extra[@]}"
      tar -czf "$out/matrix-logs.tgz" --exclude=output "$runs/gpu-matrix" 2>/dev/null
      ;;
    overhead=*)
      spec=${step#overhead=}
      read -ra extra <<<"${OVERHEAD_ARGS:-}"
      python3 -m bench.gpu_overhead "${common[@]}" --first-pair "${spec%:*}" --pairs "${spec#*:}" \
        --runs "$runs/gpu-overhead" --deadline-at "$deadline" "${extra[@]}"
      tar -czf "$out/overhead-logs.tgz" --exclude=output "$runs/gpu-overhead" 2>/dev/null
      ;;
    *) echo "unknown step $step" ;;
  esac
done
echo "== done ($(date +%T), $((deadline - $(date +%s))) s left)"
