#!/usr/bin/env bash
# Megatron on the lent GPU machine (docs/gpu.md), after ../shared/gpu-megatron's five piece calls:
#   bash tests/gpu/gpu_megatron_device.sh setup matrix      (carry .mg and .whl, from the repository root)
#   bash tests/gpu/gpu_megatron_device.sh overhead           (same warm machine)
# setup: TE + megatron-core + mcore-bridge + ms-swift (.mg/setup.sh) and swiftslurm's own needs (.whl, from
# scripts/build-gpu-wheels.sh --megatron) into /tmp/site, the random Qwen3 and Qwen3-MoE into /tmp/assets.
# Results in $OUT (at most 8 files come back).
# MEGATRON_ARGS: more tests/gpu/gpu_megatron.py options.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
exec > >(tee -a "$out/device.log") 2>&1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
# This workplace's rule for shared GPU hosts: no NVLink multicast.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
read -ra extra <<<"${MEGATRON_ARGS:-}"
common=(--assets /tmp/assets --out "$out" --override "cluster.python=/tmp/site/bin/python")
for step in "$@"; do
  echo "== $step ($(date +%T))"
  case $step in
    setup)
      bash .mg/setup.sh || exit 1
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
      # The plan's `megatron` is the one beside cluster.python: pip put it in /tmp/site/bin.
      printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" >/tmp/site/bin/python
      chmod +x /tmp/site/bin/python
      # pip --target writes no console scripts for ms-swift here: `megatron` is its entry point, by hand.
      printf '#!/bin/sh\nexec python3 -c "import sys; from swift.cli._megatron.main import cli_main; sys.exit(cli_main())" "$@"\n' \
        >/tmp/site/bin/megatron
      chmod +x /tmp/site/bin/megatron
      python3 .mg/make_assets.py --out /tmp/assets && python3 .mg/make_moe.py /tmp/assets || exit 1
      python3 -c "import megatron.core, swift, hydra, submitit; print('versions', megatron.core.__version__, swift.__version__)"
      ;;
    matrix) python3 -m tests.gpu.gpu_megatron matrix "${common[@]}" "${extra[@]}" ;;
    overhead) python3 -m tests.gpu.gpu_megatron overhead "${common[@]}" "${extra[@]}" ;;
    *) echo "unknown step $step" ;;
  esac
done
echo "== done ($(date +%T))"
