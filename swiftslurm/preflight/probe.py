"""`python -m swiftslurm.preflight.probe facts|allreduce ...`: what preflight asks torch, in a child process.

A child, so that the node wrapper never imports torch or creates a CUDA context that would stay on GPU 0 for
the whole training run, and so that a hung rendezvous is ended by killing a process. Prints one JSON line that
starts with RESULT_MARK: NCCL writes its own log (NCCL_DEBUG=INFO, which people set exactly when they debug a
cluster) to the same stdout, also after the result, so the parent looks for the mark, not the last line.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any

RESULT_MARK = "swiftslurm-probe-result: "


def facts() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    return {
        "torch": torch.__version__,
        "cuda_devices": torch.cuda.device_count(),
        "distributed": dist.is_available(),
        "nccl": dist.is_available() and dist.is_nccl_available(),
    }


def allreduce(addr: str, port: int, rank: int, world: int, backend: str, timeout_s: float) -> dict[str, Any]:
    """Join a process group of one process per node and all-reduce [rank + 1, 1]."""
    import torch
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(addr, port, world, is_master=rank == 0, timeout=timeout, wait_for_workers=True)
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", 0)  # one process per node: the node's first GPU carries the test
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        value = torch.tensor([rank + 1.0, 1.0], device=device)
        dist.all_reduce(value)
        return {"result": value.cpu().tolist()}
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    try:
        if argv[0] == "facts":
            out = facts()
        else:
            addr, port, rank, world, backend, timeout = argv[1:7]
            out = allreduce(addr, int(port), int(rank), int(world), backend, float(timeout))
    except Exception as err:  # reported to the parent as a failed check, not a traceback
        out = {"error": f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"}
    print(RESULT_MARK + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
