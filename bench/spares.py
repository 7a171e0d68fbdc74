"""Benchmark: a lost training node, replaced by a hot spare inside the job (`resilience.spare_nodes=1`) against
the requeue of the same run without one (issue 30, part 1), on the local SLURM cluster with real ms-swift (the
tiny Qwen3, LoRA, 2 training nodes; tests/cluster/conftest.py's LONG run: 120 steps, a save every 50).

    bash scripts/slurm-local.sh up
    SWIFTSLURM_TEST_NODE_GROUP=1 .venv/bin/python -m bench.spares --out bench/results/spares-DATE.json \
        [--arms spare requeue]

Each arm submits the run, waits for its first commit (checkpoint-50), loses training node 1 as if it lost power
(swiftslurm.testing.nodes.lose_node: its slurmd, then everything in its network namespace, killed with -9), brings
it back once the next attempt trains, and waits for the run's end. From the loss to the first resumed step, split
by the attempt records (node 0's clock; the loss on this machine's, the same clock here):

    noticed     the loss -> node 0 concludes the attempt (its trainer's collective fails, the trainer exits)
    decided     -> node 0's decision (swiftslurm waits 10 s for every node's result, then asks SLURM until it
                reports the silent node not responding or down: SlurmdTimeout=20 s on the local cluster).
                A requeue without --no-kill: SLURM may end the job first; then no decision is recorded and these
                columns are empty (the next attempt closes the lost one)
    relaunch    the decision -> the next attempt begins: in place, at once; a requeue: `scontrol requeue`, SLURM
                ending the job run (KillWait), the queue, the batch script starting again on the nodes
    prepare     the next attempt begins -> its trainer starts (swiftslurm: the lease, the resume point)
    load        the trainer starts -> its first resumed step is logged (ms-swift start-up, model and checkpoint)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from swiftslurm.ckpt.checkpoint import checkpoint_step, newest_committed
from swiftslurm.testing.cluster import (
    attempts,
    cancel_if_active,
    job_hosts,
    job_instances,
    logged_step,
    next_attempt,
    run_over,
    submit,
    wait_for_run_end,
    wait_until,
)
from swiftslurm.testing.nodes import cluster_state_dir, lose_node, restore_node

LONG = ("swift.max_steps=120", "swift.save_steps=50")  # tests/cluster/conftest.py's uninterrupted run
ARMS = {"spare": ("resilience.spare_nodes=1",), "requeue": ()}
FIRST_SAVE = 50


def committed_step(run_dir: Path) -> int:
    newest, _ = newest_committed(run_dir / "output")
    return (checkpoint_step(newest) or 0) if newest else 0


def run_arm(arm: str, root: Path) -> dict[str, Any]:
    run_dir = root / arm / "run"
    run_dir.parent.mkdir(parents=True)
    job = submit(run_dir, *LONG, *ARMS[arm])
    lost: str | None = None
    try:
        over = run_over(run_dir, job)
        first = next_attempt(run_dir, [], over=over)
        assert first is not None, f"{arm}: the run ended before its first attempt"
        hosts = job_hosts(job)
        wait_until(lambda: committed_step(run_dir) >= FIRST_SAVE, 300, "the first commit", over=over)
        lost = hosts[1]
        lose_node(lost)
        lost_at = time.time()
        second = next_attempt(run_dir, [first], over=over)
        assert second is not None, f"{arm}: no attempt after the loss"
        # Back only once SLURM has let it go (down, the job resized without it), as a node that lost power comes
        # back: a slurmd that registers again before that finds its step missing, and srun ends the whole step.
        wait_until(lambda: lost not in job_hosts(job), 120, f"SLURM to take {lost} out of job {job}")
        restore_node(lost, cluster_state_dir())
        lost = None
        wait_until(lambda: logged_step(run_dir, second) > FIRST_SAVE, 600, f"{second}'s first resumed step")
        resumed_at = time.time()
        state = wait_for_run_end(run_dir, job, timeout_s=900)
    finally:
        cancel_if_active(job)
        if lost is not None:
            restore_node(lost, cluster_state_dir())
    records = attempts(run_dir)
    return {
        "arm": arm,
        "job": job,
        "state": state,
        "job_runs": len(job_instances(job)),
        "lost_at": lost_at,
        "resumed_seen_at": resumed_at,
        "split": split(records, first, second, lost_at),
        "attempts": records,
    }


def split(records: list[dict[str, Any]], first: str, second: str, lost_at: float) -> dict[str, float | None]:
    """The loss -> first resumed step, in the columns of this module's docstring (seconds)."""
    by_id = {r["attempt"]: r for r in records}
    hit, nxt = by_id[first], by_id[second]
    decided = hit.get("end")
    concluding = (hit.get("phases") or {}).get("conclude")
    phases = nxt.get("phases") or {}
    began = phases.get("prepare") or phases.get("agree_on_resume") or nxt["start"]
    trains, first_step = phases["train"], nxt["first_step_at"]

    def span(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(b - a, 1)

    return {
        "noticed": span(lost_at, concluding),
        "decided": span(concluding, decided),
        "relaunch": span(decided, began),
        "prepare": span(began, trains),
        "load": span(trains, first_step),
        "total": span(lost_at, first_step),
    }


def table(results: list[dict[str, Any]]) -> str:
    columns = ("noticed", "decided", "relaunch", "prepare", "load", "total")
    lines = ["| path | requeues | " + " | ".join(columns) + " |", "|---" * (len(columns) + 2) + "|"]
    for result in results:
        split_ = split(
            result["attempts"], result["attempts"][0]["attempt"], result["attempts"][1]["attempt"], result["lost_at"]
        )
        cells = [f"{v:.1f} s" if v is not None else "-" for v in (split_[c] for c in columns)]
        requeues = max(int(a.get("restart_count") or 0) for a in result["attempts"])
        lines.append(f"| {result['arm']} | {requeues} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=list(ARMS))
    parser.add_argument("--root", type=Path, default=Path("/tmp") / f"bench-spares-{datetime.now():%Y%m%d-%H%M%S}")
    parser.add_argument("--report", action="store_true", help="only print the table of the results in --out")
    args = parser.parse_args(argv)
    if args.report:
        print(table(json.loads(args.out.read_text())["results"]))
        return 0
    results = [run_arm(arm, args.root) for arm in args.arms]
    args.out.write_text(json.dumps({"date": f"{datetime.now():%Y-%m-%d %H:%M}", "results": results}, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
