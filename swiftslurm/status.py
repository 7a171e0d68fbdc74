"""`python -m swiftslurm.status PATH [--json] [--plot]` (also `swiftslurm status PATH`): one row per run.

PATH is a run directory, a sweep directory (sweep.jsonl) or a folder of run directories. The facts come
from each run directory and from one squeue + one sacct call for all jobs; with SLURM unreachable the
table still comes, from the run directories alone, and says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from swiftslurm.runs import RunFacts, SlurmView, ask_slurm, gather, slurm_job_ids
from swiftslurm.sweep import is_sweep, run_dirs

COLUMNS = ("run", "state", "job", "attempts", "step", "loss", "samples/s", "goodput", "storage")


def collect(path: Path, use_slurm: bool = True) -> tuple[list[RunFacts], SlurmView | None]:
    dirs = run_dirs(path)
    slurm_jobs = slurm_job_ids(dirs) if use_slurm else []
    slurm = ask_slurm(slurm_jobs) if slurm_jobs else None
    return [gather(d, slurm) for d in dirs], slurm


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def _storage(facts: RunFacts) -> str:
    sync = facts.storage
    if not sync:
        return "-"
    text = f"{len(sync.get('remote', []))} up, {len(sync.get('pending', []))} pending"
    return text + (f", {sync['failures']} failed tries" if sync.get("failures") else "")


def row(facts: RunFacts) -> list[str]:
    steps = f"{facts.committed_step or 0}/{facts.max_steps}" if facts.max_steps else str(facts.committed_step or "-")
    reasons = ", ".join(facts.attempt_reasons)
    return [
        facts.run_name,
        facts.state,
        facts.job_id or "-",
        f"{facts.attempts}" + (f" ({reasons})" if reasons else ""),
        steps,
        _fmt(facts.loss, ".4f"),
        _fmt(facts.samples_per_s, ".1f"),
        _fmt(facts.goodput, ".0%"),
        _storage(facts),
    ]


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def render(facts: list[RunFacts], slurm: SlurmView | None) -> str:
    lines = [table([list(COLUMNS), *(row(f) for f in facts)])] if facts else ["(no runs found)"]
    for f in facts:
        if f.state not in ("finished", "running") and f.why:
            lines.append(f"  {f.run_name}: {f.why}")
    if slurm is not None and not slurm.available:
        lines.append(f"SLURM unavailable ({slurm.error}): states come from the run directories only.")
    counts: dict[str, int] = {}
    for f in facts:
        counts[f.state] = counts.get(f.state, 0) + 1
    lines.append(f"{len(facts)} run(s): " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    return "\n".join(lines)


def as_json(path: Path, facts: list[RunFacts], slurm: SlurmView | None) -> dict[str, Any]:
    return {
        "path": str(path),
        "sweep": is_sweep(path),
        "slurm": {"available": slurm.available, "error": slurm.error} if slurm else None,
        "runs": [f.as_dict() for f in facts],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="swiftslurm status", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="run dir, sweep dir, or a folder of run dirs")
    parser.add_argument("--json", action="store_true", help="the same facts as JSON")
    parser.add_argument("--plot", action="store_true", help="also write loss/throughput PNGs (sweep: final loss)")
    parser.add_argument("--no-slurm", action="store_true", help="do not ask SLURM: the run directories only")
    args = parser.parse_args(argv)
    if not args.path.exists():
        print(f"swiftslurm status: {args.path} does not exist", file=sys.stderr)
        return 2
    facts, slurm = collect(args.path, use_slurm=not args.no_slurm)
    if args.plot:
        from swiftslurm.plots import plot_path

        for written in plot_path(args.path, facts):
            print(f"wrote {written}", file=sys.stderr)
    print(json.dumps(as_json(args.path, facts, slurm), indent=1) if args.json else render(facts, slurm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
