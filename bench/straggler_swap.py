"""Benchmark: a straggler swapped for a hot spare (`resilience.straggler_action=swap`, issue 30 part 2): the run's
steps/s before one host is slowed, while it is slowed (until node 0 names it and every node stops at a
checkpoint), and after the spare took its place; on the local SLURM cluster with real ms-swift (the tiny Qwen3,
LoRA, 3 nodes: 2 training + 1 spare).

    bash scripts/slurm-local.sh up
    SWIFTSLURM_TEST_NODE_GROUP=2 .venv/bin/python -m bench.straggler_swap --runs 2 \
        --out bench/results/straggler-swap-DATE.json

Every node's training forwards last at least FORWARD_S (tests/cluster/slow_node_plugin.py: a sleep, as while a
GPU computes), so a step's time is mostly its forward, as on a GPU, not the 2 shared cores' noise; from step
SLOW_FROM the forwards of the host at node rank 1 take 1.5 times as long (SWIFTSLURM_TEST_SLOW_HOST: by host, so
the spare that takes rank 1 runs at full speed). No step floor: the slowdown must show in the steps/s. Global rank
0 logs each step's end (bench/step_times_plugin.py); the windows, in steps of that log:

    before   steps WARM .. SLOW_FROM of the first attempt (its first WARM steps are start-up)
    slowed   steps SLOW_FROM + WARM .. the stop step (the pace turns slow, the window passes, node 0 names it)
    after    the resumed attempt's steps from its WARM-th on
    swap     the stop step's end -> the first resumed step's end: the stop checkpoint, the restart in place onto
             the spare, ms-swift's start-up and the checkpoint's load
    named    the first slowed step's end -> node 0's swap request (swap.json): the pace's window, straggler_s
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from swiftslurm.rundir.jsonio import read_json, read_jsonl
from swiftslurm.rundir.layout import attempt_dir, swap_file
from swiftslurm.testing.cluster import (
    attempts,
    cancel_if_active,
    job_hosts,
    run_over,
    submit,
    wait_for_run_end,
    wait_until,
)
from swiftslurm.testing.node_group import group_nodes

REPO = Path(__file__).resolve().parents[1]
FORWARD_S, SLOW_FROM, WARM, MAX_STEPS, STRAGGLER_S = 0.1, 40, 5, 600, 30


def overrides(slow_host: str, step_times: Path, pinned: list[str]) -> list[str]:
    plugins = [REPO / "tests" / "cluster" / "slow_node_plugin.py", REPO / "bench" / "step_times_plugin.py"]
    return [
        f"swift.max_steps={MAX_STEPS}",
        f"swift.save_steps={MAX_STEPS}",
        "resilience.spare_nodes=1",
        "resilience.straggler_action=swap",
        f"resilience.straggler_s={STRAGGLER_S}",
        f"swift.external_plugins=[{','.join(str(p) for p in plugins)}]",
        "swift.callbacks=[slow_node,step_times]",
        f"+cluster.env.SWIFTSLURM_TEST_SLOW_HOST='{slow_host}'",
        f"+cluster.env.SWIFTSLURM_TEST_SLOW_FROM='{SLOW_FROM}'",
        f"+cluster.env.SWIFTSLURM_TEST_FORWARD_S='{FORWARD_S}'",
        f"+cluster.env.SWIFTSLURM_BENCH_STEP_TIMES='{step_times}'",
        *pinned,
    ]


def run_once(root: Path, index: int) -> dict[str, Any]:
    nodes = group_nodes()
    slow, pinned = nodes[1], [f"cluster.exclude={','.join(nodes[3:])}"] if len(nodes) > 3 else []
    run_dir = root / f"run{index}"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    step_times = root / f"steps{index}.jsonl"
    job = submit(run_dir, *overrides(slow, step_times, pinned))
    try:
        hosts = wait_until(lambda: job_hosts(job), 120, f"job {job}'s nodes", over=run_over(run_dir, job))
        state = wait_for_run_end(run_dir, job, timeout_s=900)
    finally:
        cancel_if_active(job)
    records = attempts(run_dir)
    return {
        "job": job,
        "state": state,
        "hosts": hosts,
        "slow_host": slow,
        "attempts": records,
        "swap": read_json(swap_file(attempt_dir(run_dir, records[0]["attempt"]))),
        "steps": read_jsonl(step_times),
    }


def rate(steps: list[dict[str, Any]], first: int, last: int) -> float | None:
    """Steps per second over the steps first..last of this log (None: fewer than two of them)."""
    inside = [s for s in steps if first <= s["step"] <= last]
    if len(inside) < 2 or inside[-1]["t"] <= inside[0]["t"]:
        return None
    return (inside[-1]["step"] - inside[0]["step"]) / (inside[-1]["t"] - inside[0]["t"])


def windows(result: dict[str, Any]) -> dict[str, float | None]:
    """The run's steps/s before, while slowed and after the swap, and the swap's and the naming's seconds."""
    hit, resumed = result["attempts"][0], result["attempts"][1]
    stop, last = int(hit["committed_step"]), int(result["attempts"][-1]["committed_step"])
    steps = sorted(result["steps"], key=lambda s: s["t"])
    first_run = [s for s in steps if s["t"] <= float(hit["end"])]
    second_run = [s for s in steps if s["t"] > float(hit["end"])]
    at = {s["step"]: s["t"] for s in first_run}
    slowed_from = at.get(SLOW_FROM)
    return {
        "before": rate(first_run, WARM, SLOW_FROM),
        "slowed": rate(first_run, SLOW_FROM + WARM, stop),
        "after": rate(second_run, int(resumed["resume_step"]) + WARM, last),
        "swap_s": second_run[0]["t"] - at[stop] if second_run and stop in at else None,
        "named_s": float(result["swap"]["at"]) - slowed_from if result["swap"] and slowed_from else None,
        "stop_step": stop,
    }


def spread(values: list[float | None], unit: str) -> str:
    """min / median / max of the runs' figures."""
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    return f"{min(known):.2f} / {statistics.median(known):.2f} / {max(known):.2f}{unit}"


def table(results: list[dict[str, Any]]) -> str:
    cut = [windows(r) for r in results]
    ratio = [(c["slowed"] / c["before"]) if c["slowed"] and c["before"] else None for c in cut]
    back = [(c["after"] / c["before"]) if c["after"] and c["before"] else None for c in cut]
    rows = [
        ("steps/s before the slowdown", spread([c["before"] for c in cut], "")),
        ("steps/s slowed, before the swap", spread([c["slowed"] for c in cut], "")),
        ("steps/s after the swap", spread([c["after"] for c in cut], "")),
        ("slowed / before", spread(ratio, "")),
        ("after / before", spread(back, "")),
        ("slowdown -> swap request", spread([c["named_s"] for c in cut], " s")),
        ("stop step -> first resumed step", spread([c["swap_s"] for c in cut], " s")),
    ]
    head = f"| figure (min / median / max of {len(results)} runs) | value |\n|---|---|"
    return head + "\n" + "\n".join(f"| {name} | {value} |" for name, value in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--root", type=Path, default=Path("/tmp") / f"bench-swap-{datetime.now():%Y%m%d-%H%M%S}")
    parser.add_argument("--report", action="store_true", help="only print the table of the results in --out")
    args = parser.parse_args(argv)
    if args.report:
        print(table(json.loads(args.out.read_text())["results"]))
        return 0
    results: list[dict[str, Any]] = []
    for index in range(args.runs):
        results.append(run_once(args.root, index))
        doc = {"date": f"{datetime.now():%Y-%m-%d %H:%M}", "results": results}
        args.out.write_text(json.dumps(doc, indent=1))  # each run's results as it ends
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
