"""GPU preflight for one node of an allocation: what `swift sft` will find before it is started.

    python bench/gpu_preflight.py [--json OUT.json] [--sockets]

Checks, each reported as ok / FAILED with what was seen:
- `nvidia-smi`: the GPUs, the driver, and the link matrix (`nvidia-smi topo -m`: NV# = NVLink);
- torch: its CUDA build, `torch.cuda.device_count()`, each device's name, memory and compute capability,
  and that CUDA_VISIBLE_DEVICES (SLURM's GPU binding) agrees with the count;
- NCCL: one process per GPU, an all-reduce whose sum is checked, then the bus bandwidth of a 256 MiB
  bf16 all-reduce (nccl-tests' busbw: 2 (n-1)/n × bytes / time). With `--sockets` again with NVLink and
  shared memory off and a host id per rank, i.e. the transport two nodes without InfiniBand would use.

A standalone script for now; the `preflight` command (issue 5) can fold it in. Exit status 1 if a check
failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

ALLREDUCE_BYTES = 256 * 2**20
SOCKET_ENV = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"}


def run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return f"FAILED: {err}"


def nvidia_smi() -> dict[str, Any]:
    if shutil.which("nvidia-smi") is None:
        return {"ok": False, "why": "nvidia-smi is not on PATH"}
    query = "index,name,memory.total,driver_version,pcie.link.gen.current"
    gpus = run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"]).strip().splitlines()
    topo = run(["nvidia-smi", "topo", "-m"])
    return {"ok": bool(gpus) and not gpus[0].startswith("FAILED"), "gpus": gpus, "topology": topo}


def torch_devices() -> dict[str, Any]:
    import torch

    count = torch.cuda.device_count()
    devices = []
    for i in range(count):
        p = torch.cuda.get_device_properties(i)
        devices.append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1), "cc": f"{p.major}.{p.minor}"})
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    expected = len(visible.split(",")) if visible else None
    ok = count > 0 and (expected is None or expected == count)
    why = "" if ok else f"torch sees {count} GPU(s), CUDA_VISIBLE_DEVICES={visible!r}"
    return {
        "ok": ok,
        "why": why,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if count else None,
        "count": count,
        "devices": devices,
    }


def _worker(rank: int, world: int, port: int, sockets: bool, results: Any) -> None:
    import torch
    import torch.distributed as dist

    if sockets:
        os.environ.update(SOCKET_ENV)
        os.environ["NCCL_HOSTID"] = f"preflight-host-{rank}"  # NCCL then treats each rank as its own host
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    try:
        x = torch.full((1024,), float(rank + 1), device="cuda")
        dist.all_reduce(x)
        expected = world * (world + 1) / 2
        correct = bool(torch.all(x == expected).item())
        big = torch.randn(ALLREDUCE_BYTES // 2, dtype=torch.bfloat16, device="cuda")
        for _ in range(3):
            dist.all_reduce(big)
        torch.cuda.synchronize()
        repeats = 10
        start = time.perf_counter()
        for _ in range(repeats):
            dist.all_reduce(big)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / repeats
        busbw = 2 * (world - 1) / world * ALLREDUCE_BYTES / seconds / 1e9
        results[rank] = {"correct": correct, "value": float(x[0].item()), "ms": seconds * 1e3, "busbw_gbs": busbw}
    finally:
        dist.destroy_process_group()


def nccl_allreduce(world: int, sockets: bool) -> dict[str, Any]:
    import torch.multiprocessing as mp

    if world < 1:
        return {"ok": False, "why": "no GPU"}
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    results = manager.dict()
    try:
        mp.spawn(_worker, args=(world, port, sockets, results), nprocs=world, join=True)
    except Exception as err:  # a rank that failed: report it, do not crash the other checks
        return {"ok": False, "why": repr(err)[-2000:], "sockets": sockets}
    per_rank = [dict(results[r]) for r in range(world)]
    ok = all(r["correct"] for r in per_rank)
    return {
        "ok": ok,
        "why": "" if ok else "wrong all-reduce sum",
        "sockets": sockets,
        "world": world,
        "busbw_gbs": round(min(r["busbw_gbs"] for r in per_rank), 1),
        "ms_256mib": round(max(r["ms"] for r in per_rank), 3),
        "per_rank": per_rank,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="write the full report here")
    parser.add_argument("--sockets", action="store_true", help="also all-reduce over sockets (as between nodes)")
    args = parser.parse_args()
    report: dict[str, Any] = {"host": socket.gethostname(), "nvidia_smi": nvidia_smi()}
    report["torch"] = torch_devices()
    report["nccl"] = nccl_allreduce(report["torch"]["count"], sockets=False)
    if args.sockets:
        report["nccl_sockets"] = nccl_allreduce(report["torch"]["count"], sockets=True)
    report["env"] = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "CUDA_", "SLURM_", "TORCH_"))}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(report["nvidia_smi"].get("topology", ""))
    failed = False
    for name in ("nvidia_smi", "torch", "nccl", "nccl_sockets"):
        if name not in report:
            continue
        check = report[name]
        failed |= not check["ok"]
        shown = {k: v for k, v in check.items() if k not in ("topology", "per_rank", "ok")}
        print(f"{name:13s} {'ok' if check['ok'] else 'FAILED'}  {json.dumps(shown)[:400]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
