"""Benchmark: signal -> committed against checkpoint size; one rank hashing all vs the ranks hashing together.

    .venv/bin/python -m bench.save_budget [--sizes-gb 1 10 50] [--ranks 4] [--repeats 3] [--dir DIR]

--ranks processes join a real gloo group (torch.distributed, CPU) and write a checkpoint laid out as DeepSpeed
ZeRO-3 writes a full fine-tune's: 14 bytes per parameter, of which 2 are the 16-bit weights rank 0 gathers into
`model.safetensors` and 12 the fp32 master weights and Adam moments, split evenly into each rank's
`global_stepN/zero_pp_rank_R_mp_rank_00_optim_states.pt` (plus a small `..._model_states.pt` per rank and the
configs). Contents are random: each rank repeats one 64 MiB block of os.urandom (too slow to draw 50 GB from,
on this machine 0.15 GB/s) with a counter in front of every copy, so no two blocks are alike.

Then, --repeats times, in alternating order (A B, B A, ...: the page cache and the load from elsewhere on the
machine hit both alike), the manifest is removed and the checkpoint committed:

  one-rank   what hooks.Committer did before: global rank 0 alone checksums (SHA-256 + fsync) every file
             (`checkpoint.commit`), the other ranks wait.
  shared     hooks.Committer as it is: every rank hashes its own shards and a share of the rest
             (shared_commit.py), the digests are gathered to rank 0, which writes the manifest.

Each is timed on rank 0 from a barrier before to a barrier after (the manifest is on disk). The write is timed
the same way, once per size (the files are written once; rewriting 50 GB per repeat would take the disk for
minutes). With long steps the stop vote is read at the step the signal came in (stop_vote.py), so signal ->
committed = the rest of that step + write + commit; the table gives write + commit. GB are 10^9 bytes.
Prints a markdown table and writes bench/results/save-budget-DATE.json. The files are deleted at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from swiftslurm.ckpt import checkpoint

REPO = Path(__file__).resolve().parents[1]

BLOCK = 64 << 20
WEIGHTS_SHARE = 2 / 14  # bf16 weights of 14 bytes per parameter (plan.CHECKPOINT_GB_PER_B_PARAMS["full"])
METHODS = ("one-rank", "shared")


def layout(total_bytes: int, ranks: int, step: int) -> dict[int, list[tuple[str, int]]]:
    """Which files each rank writes (relative path, bytes): a ZeRO-3 full fine-tune checkpoint of that size."""
    weights = int(total_bytes * WEIGHTS_SHARE)
    per_rank = (total_bytes - weights) // ranks
    files: dict[int, list[tuple[str, int]]] = {}
    for rank in range(ranks):
        shard = f"global_step{step}/zero_pp_rank_{rank}_mp_rank_00"
        files[rank] = [(f"{shard}_optim_states.pt", per_rank - (1 << 20)), (f"{shard}_model_states.pt", 1 << 20)]
    files[0] += [("model.safetensors", weights), ("config.json", 1000), ("trainer_state.json", 2000)]
    return files


def write_file(path: Path, size: int, block: bytearray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:
        written, copy = 0, 0
        while written < size:
            block[:8] = copy.to_bytes(8, "little")  # every block differs
            chunk = memoryview(block)[: min(BLOCK, size - written)]
            out.write(chunk)
            written, copy = written + len(chunk), copy + 1


def timed(fn: Any) -> float:
    """Seconds from a barrier before ``fn`` to a barrier after it, as every rank sees them."""
    import torch.distributed as dist

    dist.barrier()
    started = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - started


def worker(rank: int, port: int, ranks: int, sizes: list[float], repeats: int, root: str, results: Any) -> None:
    import torch.distributed as dist

    from swiftslurm.engines.hooks import Committer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(ranks), RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    block = bytearray(os.urandom(BLOCK))
    committer = Committer(engine="swift")
    for step, size_gb in enumerate(sizes, start=1):
        folder = Path(root) / f"checkpoint-{step}"
        mine = layout(int(size_gb * 1e9), ranks, step)[rank]
        write_s = timed(lambda: [write_file(folder / rel, size, block) for rel, size in mine])  # noqa: B023
        row: dict[str, Any] = {"size_gb": size_gb, "write_s": write_s, "one-rank": [], "shared": []}
        for repeat in range(repeats):
            for method in METHODS if repeat % 2 == 0 else METHODS[::-1]:
                if rank == 0:  # only rank 0 touches the manifest, between barriers
                    (folder / checkpoint.MANIFEST).unlink(missing_ok=True)
                row[method].append(timed(lambda m=method: commit_by(m, folder, ranks, committer)))  # noqa: B023
                if rank == 0 and checkpoint.problems(folder):
                    raise RuntimeError(f"{method} left {folder} uncommitted: {checkpoint.problems(folder)}")
        if rank == 0:
            results.append(row)
            print(summary_line(row), flush=True)
        dist.barrier()
        if rank == 0:
            shutil.rmtree(folder)
    dist.destroy_process_group()


def commit_by(method: str, folder: Path, ranks: int, committer: Any) -> None:
    import torch.distributed as dist

    if method == "shared":
        committer.after_save(folder, last_step=None)
        committer.wait()
    elif dist.get_rank() == 0:
        checkpoint.commit(folder, ranks, "bench", last_step=None)


def stats(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summary_line(row: dict[str, Any]) -> str:
    one, shared = statistics.median(row["one-rank"]), statistics.median(row["shared"])
    return (
        f"{row['size_gb']:g} GB: write {row['write_s']:.1f} s, commit one-rank {one:.1f} s, "
        f"shared {shared:.1f} s (x{one / shared:.2f})"
    )


def table(rows: list[dict[str, Any]], ranks: int) -> str:
    lines = [
        f"| size | write ({ranks} ranks) | commit, rank 0 hashes all: min / median / max | commit, {ranks} ranks "
        "share: min / median / max | commit ratio (medians) | signal -> committed, medians: before -> now |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        one, shared = stats(row["one-rank"]), stats(row["shared"])
        lines.append(
            f"| {row['size_gb']:g} GB | {row['write_s']:.1f} s ({row['size_gb'] / row['write_s']:.2f} GB/s) "
            f"| {one['min']:.1f} / {one['median']:.1f} / {one['max']:.1f} s "
            f"| {shared['min']:.1f} / {shared['median']:.1f} / {shared['max']:.1f} s "
            f"| {one['median'] / shared['median']:.2f} x "
            f"| {row['write_s'] + one['median']:.0f} s -> {row['write_s'] + shared['median']:.0f} s |"
        )
    return "\n".join(lines)


def sha256_rate_gbps(seconds: float = 2.0) -> float:
    """One core's SHA-256 rate on bytes in memory, GB/s: the ceiling of one process hashing all."""
    block, digest, done, started = os.urandom(BLOCK), hashlib.sha256(), 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        digest.update(block)
        done += BLOCK
    return done / 1e9 / (time.perf_counter() - started)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-gb", type=float, nargs="+", default=[1.0, 10.0, 50.0])
    parser.add_argument("--ranks", type=int, default=4, help="processes, one per simulated GPU rank")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="where the checkpoints are written")
    parser.add_argument("--out", type=Path, help="the JSON results (default bench/results/save-budget-DATE.json)")
    args = parser.parse_args()
    need = max(args.sizes_gb) * 1e9 + 2e9
    if shutil.disk_usage(args.dir).free < need:
        sys.exit(f"{args.dir} has {shutil.disk_usage(args.dir).free / 1e9:.0f} GB free, needs {need / 1e9:.0f} GB.")
    import torch.multiprocessing as mp

    root = Path(tempfile.mkdtemp(prefix="save-budget-", dir=args.dir))
    started = datetime.now()
    try:
        with mp.Manager() as manager:
            rows = manager.list()
            spawn = (free_port(), args.ranks, args.sizes_gb, args.repeats, str(root), rows)
            mp.spawn(worker, args=spawn, nprocs=args.ranks, join=True)
            rows = [dict(row) for row in rows]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    info = {
        "date": started.isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "mem_gb": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9,
        "dir": str(args.dir),
        "ranks": args.ranks,
        "repeats": args.repeats,
        "sha256_one_core_gbps": sha256_rate_gbps(),
        "loadavg_after": os.getloadavg(),
        "rows": rows,
    }
    print(table(rows, args.ranks))
    print(f"SHA-256 on one core, in memory: {info['sha256_one_core_gbps']:.2f} GB/s")
    out = args.out or REPO / "bench" / "results" / f"save-budget-{started:%Y-%m-%d}.json"
    out.write_text(json.dumps(info, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
