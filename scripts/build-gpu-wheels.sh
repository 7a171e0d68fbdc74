#!/usr/bin/env bash
# Builds .whl/ (git-ignored): the wheels the lent GPU machines install into /tmp/site
# (tests/gpu/gpu_device.sh, tests/gpu/gpu_megatron_device.sh), for their image's CPython 3.12 on x86-64.
# Everything else (torch, transformers, accelerate, safetensors, tokenizers, ...) is the image's own.
#
#   bash scripts/build-gpu-wheels.sh             # HF-Trainer runs: ms-swift 4.6 and what it needs beyond the
#                                                # image, swiftslurm's own needs, deepspeed, bitsandbytes
#   bash scripts/build-gpu-wheels.sh --megatron  # beside ../shared/gpu-megatron's .mg/ (which carries ms-swift
#                                                # and Megatron): swiftslurm's own needs only
#
# Run from anywhere; needs the package index. PYTHON: a python with pip and torch (deepspeed's setup.py imports
# torch), default .venv/bin/python. One GPU call carries at most 64 MiB in all (the checkout, .whl/, and in
# Megatron mode .mg/): the script fails if what it built would not fit.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
out=$repo/.whl
limit_mib=64

# What ms-swift 4.6 needs beyond the image (peft: the image's 0.21 is too new for ms-swift 4.6).
swift_stack=(
  ms-swift==4.6.0 peft==0.20.0 trl==0.29.1 datasets==4.8.4 dill==0.4.1 multiprocess==0.70.19
  modelscope==1.40.2 modelscope_hub==0.5.1 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
  pydantic==2.14.4 pydantic_core==2.50.5 annotated_types==0.8.0 typing_inspection==0.4.5
  json_repair==0.64.6 hjson==3.1.0
)
# swiftslurm's own needs (pyproject.toml) that the image lacks.
own_wheels=(hydra-core==1.3.8 omegaconf==2.3.1 submitit==1.5.4)
own_sdists=(antlr4-python3-runtime==4.9.3 python-hostlist==2.3.0)  # published as sdists only
deepspeed=deepspeed==0.18.9      # an sdist; built without its ops (compiled at first use on the machine)
bitsandbytes=bitsandbytes==0.50.2  # 43 MB on PyPI; repacked with the CPU and CUDA 13.x libraries only
bnb_keep='^bitsandbytes/libbitsandbytes_(cpu|cuda130|cuda132)\.so$'

megatron=false
case ${1:-} in
  "") ;;
  --megatron) megatron=true ;;
  *)
    echo "usage: bash scripts/build-gpu-wheels.sh [--megatron]" >&2
    exit 2
    ;;
esac

"$python" -m pip --version >/dev/null 2>&1 || {
  echo "error: no pip in $python; set PYTHON to a python with pip (and torch, for deepspeed)" >&2
  exit 1
}

# Binary wheels for the machine's CPython 3.12 on x86-64 (pip matches each manylinux_2_N tag exactly).
download() {
  local platforms=() n
  for n in 17 24 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$stage" "$@"
}

# Sdists built into wheels here: pure Python, so the wheel fits any CPython 3. --no-binary names them alone:
# their build requirements (setuptools) may come as wheels.
build_sdists() {
  local names
  names=$(printf '%s,' "${@%%==*}")
  "$python" -m pip wheel -q --no-deps --no-binary "${names%,}" -w "$stage" "$@"
}

build_deepspeed() {
  "$python" -c "import torch" 2>/dev/null || {
    echo "error: deepspeed's build imports torch, which $python lacks; set PYTHON to one that has it" >&2
    exit 1
  }
  DS_BUILD_OPS=0 "$python" -m pip wheel -q --no-deps --no-build-isolation --no-binary deepspeed -w "$stage" "$deepspeed"
}

# Keep the CPU and CUDA 13.0/13.2 libraries (the machines run CUDA 13) and drop the rest from the wheel and
# its RECORD, which pip reads when it installs.
repack_bitsandbytes() {
  local wheel
  download "$bitsandbytes"
  wheel=$(ls "$stage"/bitsandbytes-*.whl)
  "$python" - "$wheel" "$bnb_keep" <<'EOF'
import re
import sys
import zipfile
from pathlib import Path

wheel, keep = Path(sys.argv[1]), re.compile(sys.argv[2])
slim = wheel.with_suffix(".slim")
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
    dropped = {n for n in src.namelist() if re.match(r"^bitsandbytes/libbitsandbytes_.*\.so$", n) and not keep.match(n)}
    for item in src.infolist():
        if item.filename in dropped:
            continue
        data = src.read(item)
        if item.filename.endswith(".dist-info/RECORD"):
            lines = data.decode().splitlines(keepends=True)
            data = "".join(line for line in lines if line.split(",", 1)[0] not in dropped).encode()
        dst.writestr(item, data, zipfile.ZIP_DEFLATED)
slim.replace(wheel)
EOF
}

# Only wheels the machine can install: pure Python, or CPython 3.12 (or abi3) for manylinux x86-64.
check_tags() {
  local wheel name python_abi='((py3|py2\.py3|py312)-none|cp312-(cp312|none)|cp3[0-9]+-abi3)'
  local platform='(any|manylinux[0-9_]*x86_64([.]manylinux[0-9_]*x86_64)*)'
  for wheel in "$stage"/*.whl; do
    name=$(basename "$wheel")
    [[ $name =~ -${python_abi}-${platform}\.whl$ ]] || {
      echo "error: $name does not install on the GPU machines (CPython 3.12, manylinux x86-64)" >&2
      exit 1
    }
  done
}

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
size_of() { du -sb "$1" | cut -f1; }

# What one GPU call carries: the checkout's tracked files, .whl/ and, for Megatron, .mg/ beside it.
check_size() {
  local wheels tree mg=0 total parts
  wheels=$(size_of "$1")
  tree=$(git -C "$repo" ls-files -z | (cd "$repo" && du -cb --files0-from=- 2>/dev/null || true) | tail -1 | cut -f1)
  parts=".whl/ $(mib "$wheels") MiB + tracked files $(mib "$tree") MiB"
  if $megatron && [[ -d $repo/.mg ]]; then
    mg=$(size_of "$repo/.mg")
    parts+=" + .mg/ $(mib "$mg") MiB"
  fi
  total=$((wheels + tree + mg))
  if ((total > limit_mib * 1048576)); then
    echo "error: one GPU call would carry $(mib "$total") MiB ($parts), over its $limit_mib MiB:" \
      "drop a wheel from the list or carry it in a call of its own" >&2
    exit 1
  fi
  echo "one GPU call carries $(mib "$total") of $limit_mib MiB: $parts"
}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
download "${own_wheels[@]}"
build_sdists "${own_sdists[@]}"
if ! $megatron; then
  download "${swift_stack[@]}"
  build_deepspeed
  repack_bitsandbytes
fi
check_tags
ls -1 "$stage"
check_size "$stage"  # before .whl/ is replaced: it only ever holds a set that fits
rm -rf "$out"
mv "$stage" "$out"
trap - EXIT
echo "$(find "$out" -type f -name '*.whl' | wc -l) wheels in $out ($(mib "$(size_of "$out")") MiB)"
