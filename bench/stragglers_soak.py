"""Benchmark: no false straggler over a long run with periodic saves and evaluations, and the margin to the
threshold (issue 30, part 2), on the local SLURM cluster with real ms-swift (the tiny Qwen3, LoRA, 2 nodes).

    bash scripts/slurm-local.sh up
    SWIFTSLURM_TEST_NODE_GROUP=2 .venv/bin/python -m bench.stragglers_soak --minutes 30 \
        --out bench/results/stragglers-soak-DATE.json [--arms quiet slow] [--forward-s 0.1]

Arms (one run each, in the order given):

    quiet  no node slowed: every node at its own pace; a save every SAVE_STEPS and an evaluation every EVAL_STEPS
    slow   the same, with tests/cluster/slow_node_plugin.py slowing node 1's forwards 50 % from SLOW_FROM

Every step lasts at least 0.5 s (bench/goodput_plugin.py), so ``--minutes`` of training is a step count, not
this machine's speed. With ``--forward-s S`` (default 0.1; 0: the tiny model's own ~10 ms) every node's training
forwards last at least S (slow_node_plugin.py: a sleep, as while a GPU computes), so that the scheduler's noise
on the 2 shared cores (one lost time slice doubles a 10 ms forward) does not stand for a GPU's.
With the defaults (resilience.straggler_ratio=1.2, straggler_s=300) the bench reads every
node's pace as node 0 does, every 5 s (rundir/pace.py), and records per node the highest ratio to the other
nodes' median and the longest time it stayed at or above the threshold, and what `status --json` named: for
`quiet`, nothing must be named and the longest streak says how far from straggler_s the run stayed; for `slow`,
how long after SLOW_FROM node 1 was named.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from swiftslurm.node.stragglers import peer_median
from swiftslurm.rundir.layout import attempt_dir, pace_dir
from swiftslurm.rundir.pace import PUBLISH_S, read_paces
from swiftslurm.rundir.records import read_open_attempt
from swiftslurm.testing.cli import swiftslurm
from swiftslurm.testing.cluster import attempts, final_state, submit

REPO = Path(__file__).resolve().parents[1]
STEP_FLOOR_S = 0.5  # bench/goodput_plugin.STEP_FLOOR_S
SAVE_STEPS, EVAL_STEPS, SLOW_FROM = 240, 300, 200
RATIO = 1.2  # resilience.straggler_ratio's default: what a streak is counted against


def overrides(arm: str, steps: int, forward_s: float) -> list[str]:
    plugins = [str(REPO / "bench" / "goodput_plugin.py")]
    callbacks = ["goodput_step_floor"]
    extra = []
    if arm == "slow" or forward_s > 0:
        plugins.append(str(REPO / "tests" / "cluster" / "slow_node_plugin.py"))
        callbacks.append("slow_node")
    if forward_s > 0:
        extra.append(f"+cluster.env.SWIFTSLURM_TEST_FORWARD_S='{forward_s}'")
    if arm == "slow":
        extra += ["+cluster.env.SWIFTSLURM_TEST_SLOW_NODE='1'", f"+cluster.env.SWIFTSLURM_TEST_SLOW_FROM='{SLOW_FROM}'"]
    return [
        f"swift.max_steps={steps}",
        f"swift.save_steps={SAVE_STEPS}",
        "swift.split_dataset_ratio=0.05",
        "swift.eval_strategy=steps",
        f"swift.eval_steps={EVAL_STEPS}",
        f"swift.external_plugins=[{','.join(plugins)}]",
        f"swift.callbacks=[{','.join(callbacks)}]",
        "cluster.time=2:00:00",
        *extra,
    ]


def follow(run_dir: Path, job: str) -> dict[str, Any]:
    """Read the paces as node 0 does until the job ends: per node the highest ratio and the longest streak at
    or above RATIO (seconds, by this clock)."""
    highest: dict[int, float] = {}
    longest: dict[int, float] = {}
    since: dict[int, float] = {}
    while final_state(job) is None:
        time.sleep(PUBLISH_S)
        running = read_open_attempt(run_dir)
        paces = read_paces(pace_dir(attempt_dir(run_dir, running.attempt))) if running else {}
        now = time.time()
        for node, pace in paces.items():
            if (median := peer_median(node, paces)) is None:
                continue
            ratio = pace.forward_s / median
            highest[node] = max(highest.get(node, 0.0), ratio)
            if ratio >= RATIO:
                since.setdefault(node, now)
                longest[node] = max(longest.get(node, 0.0), now - since[node])
            else:
                since.pop(node, None)
    return {"highest_ratio": highest, "longest_slow_s": longest}


def run_arm(arm: str, minutes: float, root: Path, forward_s: float) -> dict[str, Any]:
    run_dir = root / arm
    steps = int(minutes * 60 / STEP_FLOOR_S)
    started = time.time()
    job = submit(run_dir, *overrides(arm, steps, forward_s))
    seen = follow(run_dir, job)
    status = json.loads(swiftslurm("status", str(run_dir), "--json", "--no-slurm", cwd=root).stdout)["runs"][0]
    return {
        "arm": arm,
        "forward_s": forward_s,
        "job": job,
        "steps": steps,
        "wall_s": round(time.time() - started, 1),
        "state": final_state(job),
        "named": status["stragglers"],
        "attempts": [(a["reason"], a["decision"], a.get("stragglers")) for a in attempts(run_dir)],
        **seen,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="training minutes per arm (at 0.5 s a step)")
    parser.add_argument("--arms", nargs="+", default=["quiet", "slow"], choices=["quiet", "slow"])
    parser.add_argument("--root", type=Path, default=Path("/tmp/stragglers-soak"))
    parser.add_argument("--forward-s", type=float, default=0.1, help="every training forward's floor (0: none)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    results = []
    for arm in args.arms:  # written after each arm: an interrupted bench keeps the arms it finished
        results.append(run_arm(arm, args.minutes, args.root, args.forward_s))
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
