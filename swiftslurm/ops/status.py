"""`python -m swiftslurm.ops.status PATH [--json] [--plot]` (also `swiftslurm status PATH`): one row per run,
and the goodput ledger (where the allocated GPU-hours went; swiftslurm/ops/ledger.py) of the run, or of all runs.

PATH is a run directory, a sweep directory (sweep.jsonl) or a folder of run directories. The facts come
from each run directory and from SLURM, asked once for all the runs however many there are: one squeue for the
jobs of runs that have not ended, and one `sacct --duplicates` for accounting that can still change (cached in
each run dir: accounting.py), which also says how the jobs that left the queue ended; with SLURM unreachable the
table still comes, from the run directories alone, and says so.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from swiftslurm.errors import SwiftSlurmError, report
from swiftslurm.ops import accounting
from swiftslurm.ops.ledger import CATEGORIES, LABELS, Ledger
from swiftslurm.ops.runs import FINAL_STATES, RunFacts, SlurmView, ask_queue, gather, slurm_job_ids
from swiftslurm.rundir.records import read_status
from swiftslurm.rundir.sweepdir import is_sweep, run_dirs

COLUMNS = ("run", "state", "job", "attempts", "step", "loss", "samples/s", "goodput", "storage")


def collect(path: Path, use_slurm: bool = True) -> tuple[list[RunFacts], SlurmView | None]:
    """Every run's facts, SLURM asked once for all of them: one squeue for the jobs of runs that have not ended,
    and at most one sacct (accounting.refresh), which also says how the jobs that left the queue ended. With
    the controller unreachable sacct is not asked either: the ledger comes from the cache."""
    dirs = run_dirs(path)
    # A run whose leader wrote a final state is shown in that state whatever SLURM says: not asked about.
    ended = [d for d in dirs if _ended(d)]
    live = slurm_job_ids([d for d in dirs if d not in ended]) if use_slurm else []
    queue = ask_queue(live) if live else None
    left = [job for job in live if queue is not None and queue.available and job not in queue.states]
    asker = accounting.ask_sacct if use_slurm and (queue is None or queue.available) else None
    # An ended run's jobs are done too: accounting cached while they ran (no End yet) is asked again at once,
    # or the ledger would charge them up to now until the cache expired. Final rows are never asked again.
    done = slurm_job_ids(ended) if use_slurm else []
    jobs, error = accounting.refresh(dirs, asker, left_queue=[*left, *done])
    slurm = queue
    if queue is not None and left and not error:  # sacct unreachable: those runs show their run dir's word
        slurm = replace(queue, states={**queue.states, **accounting.newest_states(jobs, left)})
    if error:
        slurm = replace(slurm or SlurmView(available=True), accounting_error=error)
    return [gather(d, slurm, jobs.get(d)) for d in dirs], slurm


def _ended(run_dir: Path) -> bool:
    return (read_status(run_dir) or {}).get("state") in FINAL_STATES


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def _storage(facts: RunFacts) -> str:
    sync = facts.storage
    if not sync:
        return "-"
    text = f"{len(sync.get('remote', []))} up, {len(sync.get('pending', []))} pending"
    text += f", {len(refused)} refused" if (refused := sync.get("refused")) else ""
    return text + (f", {sync['failures']} failed tries" if sync.get("failures") else "")


def straggler_line(straggler: dict[str, Any]) -> str:
    """'straggler: node 1 (gpu-017), its training forwards 1.50× the other nodes' median since step 12 (14:02:11
    UTC); excluded from the next requeue'."""
    since = time.strftime("%H:%M:%S UTC", time.gmtime(float(straggler.get("since", 0))))
    text = (
        f"straggler: node {straggler.get('node')} ({straggler.get('host')}), its training forwards "
        f"{float(straggler.get('ratio', 0)):.2f}× the other nodes' median since step {straggler.get('since_step')} "
        f"({since})"
    )
    if straggler.get("swap"):
        return f"{text}; swapped for a spare"
    if not_swapped := straggler.get("not_swapped"):
        return f"{text}; not swapped: {not_swapped}"
    return text + ("; excluded from the next requeue" if straggler.get("exclude") else "")


# A node's data-loader wait worth a line under the table: below it (a prefetching loader's usual few ms) says nothing.
DATA_WAIT_SHOWN_S = 0.05


def data_wait_line(facts: RunFacts) -> str | None:
    """'data-loader wait per step (median of recent steps; shown, not judged): node 0 0.002 s, node 1 0.310 s',
    once any node's is at least DATA_WAIT_SHOWN_S."""
    waits = [(pace["node"], pace["data_s"]) for pace in facts.paces if pace.get("data_s") is not None]
    if not any(seconds >= DATA_WAIT_SHOWN_S for _, seconds in waits):
        return None
    each = ", ".join(f"node {node} {seconds:.3f} s" for node, seconds in waits)
    return f"data-loader wait per step (median of recent steps; shown, not judged): {each}"


def last_not_uploaded(facts: RunFacts) -> bool:
    """Whether the run's newest committed checkpoint waits for its upload (sync.json lists it pending)."""
    return facts.committed_step is not None and facts.committed_step in (facts.storage or {}).get("pending", [])


def labels(path: Path, facts: list[RunFacts]) -> list[str]:
    """What names each row: the run name, or, where several runs share it (a folder of runs started with one
    name), the run dir relative to ``path`` (its full path outside it), which is what tells them apart."""
    names = [f.run_name for f in facts]
    return [f.run_name if names.count(f.run_name) == 1 else _relative(Path(f.run_dir), path) for f in facts]


def _relative(run_dir: Path, path: Path) -> str:
    try:
        inside = run_dir.resolve().relative_to(path.resolve())
    except ValueError:  # a sweep's points live outside the sweep dir
        return str(run_dir)
    return str(inside) if inside != Path(".") else run_dir.name


def row(facts: RunFacts, label: str | None = None) -> list[str]:
    steps = f"{facts.committed_step or 0}/{facts.max_steps}" if facts.max_steps else str(facts.committed_step or "-")
    reasons = ", ".join(facts.attempt_reasons)
    return [
        label or facts.run_name,
        facts.state,
        facts.job_id or "-",
        f"{facts.attempts}" + (f" ({reasons})" if reasons else ""),
        steps,
        _fmt(facts.loss, ".4f"),
        _fmt(facts.samples_per_s, ".1f"),
        _fmt(facts.goodput, ".0%"),
        _storage(facts),
    ]


def spares_line(facts: RunFacts) -> str | None:
    """The run's spares (`resilience.spare_nodes`): how many still stand by (while it runs, each one's
    heartbeat), and each swap so far."""
    if facts.spares_left is None:
        return None
    swaps = ", ".join(f"{old} -> {spare} ({why})" for old, spare, why in facts.swaps) or "none"
    beats = ", ".join(map(spare_beat_phrase, facts.spare_beats))
    standing = f"{facts.spares_left} standing by" + (f" ({beats})" if beats else "")
    return f"spares: {standing}; nodes replaced by a spare: {swaps}"


def spare_beat_phrase(beat: dict[str, Any]) -> str:
    """'node3: beat 4 s ago', or 'node3: SILENT for 240 s, not called in'."""
    seconds = float(beat.get("silent_s", 0))
    if beat.get("alive"):
        return f"{beat.get('host')}: beat {seconds:.0f} s ago"
    return f"{beat.get('host')}: SILENT for {seconds:.0f} s, not called in"


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def render(facts: list[RunFacts], slurm: SlurmView | None, path: Path | None = None) -> str:
    names = labels(path, facts) if path is not None else [f.run_name for f in facts]
    rows = [row(f, name) for f, name in zip(facts, names, strict=True)]
    lines = [table([list(COLUMNS), *rows])] if facts else ["(no runs found)"]
    for f, name in zip(facts, names, strict=True):
        if (f.state not in ("finished", "running") or last_not_uploaded(f)) and f.why:
            lines.append(f"  {name}: {f.why}")
        if (spares := spares_line(f)) is not None:
            lines.append(f"  {name}: {spares}")
        lines += [f"  {name}: {straggler_line(s)}" for s in f.stragglers]
        if (waits := data_wait_line(f)) is not None:
            lines.append(f"  {name}: {waits}")
    if slurm is not None and not slurm.available:
        lines.append(f"SLURM unavailable ({slurm.error}): states come from the run directories only.")
    if slurm is not None and slurm.accounting_error:
        lines.append(f"SLURM accounting unavailable ({slurm.accounting_error}): the ledger uses what was cached.")
    if (total := total_ledger(facts)) is not None:
        title = facts[0].run_name if len(facts) == 1 else f"all {len(facts)} runs"
        lines.append(ledger_table(total, title))
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
        "ledger": total.as_dict() if (total := total_ledger(facts)) else None,
    }


def total_ledger(facts: list[RunFacts]) -> Ledger | None:
    """The runs' ledgers together (a sweep's, a folder's); None when no run has held an allocation yet."""
    ledgers = [f.ledger for f in facts if f.ledger is not None]
    if not ledgers:
        return None
    total = ledgers[0]
    for more in ledgers[1:]:
        total = total.plus(more)
    return total


def ledger_table(ledger: Ledger, title: str) -> str:
    """Where the allocated device-hours went: one line per category, its amount and share, then the waits."""
    hours = ledger.allocated_s >= 3600
    unit = f"{ledger.unit}-{'hours' if hours else 'seconds'}"

    def amount(seconds: float) -> str:
        return f"{seconds / 3600:.2f}" if hours else f"{seconds:.0f}"

    def share(seconds: float) -> str:
        return f"{seconds / ledger.allocated_s:.1%}" if ledger.allocated_s else "-"

    rows = [["category", unit, "share"]]
    rows += [[LABELS[c], amount(ledger.spent_s.get(c, 0.0)), share(ledger.spent_s.get(c, 0.0))] for c in CATEGORIES]
    rows += [["unaccounted (allocated - the above)", amount(ledger.unaccounted_s), share(ledger.unaccounted_s)]]
    rows += [["allocated", amount(ledger.allocated_s), "100.0%"]]
    waits = f"queue wait {ledger.queue_wait_s:.0f} s, requeue hold {ledger.requeue_hold_s:.0f} s (wall clock)"
    return "\n".join(
        [
            f"goodput ledger of {title} ({ledger.job_runs} job run(s); allocated from {ledger.allocated_from}):",
            *("  " + line for line in table(rows).splitlines()),
            f"  not allocated: {waits}",
            *_rounding(ledger),
        ]
    )


def _rounding(ledger: Ledger) -> list[str]:
    """How the split meets SLURM's whole seconds: what the records held outside Start..End is in no category
    (nothing to say where every allocation is an attempt's own span)."""
    if ledger.own_spans >= ledger.job_runs:
        return []
    outside = f"{ledger.outside_s:.1f} {ledger.unit}-seconds"
    return [f"  rounding: SLURM's Start/End are whole seconds; the records outside them ({outside}) are not counted"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="swiftslurm status", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="run dir, sweep dir, or a folder of run dirs")
    parser.add_argument("--json", action="store_true", help="the same facts as JSON")
    parser.add_argument("--plot", action="store_true", help="also write loss/throughput PNGs (sweep: final loss)")
    parser.add_argument("--no-slurm", action="store_true", help="do not ask SLURM: the run directories only")
    args = parser.parse_args(argv)
    if not args.path.exists():
        return report(f"{args.path} does not exist. HINT: give a run dir, a sweep dir or a folder of run dirs.")
    try:
        facts, slurm = collect(args.path, use_slurm=not args.no_slurm)
    except SwiftSlurmError as err:
        return report(err)
    if args.plot:
        from swiftslurm.ops.plots import plot_path

        for written in plot_path(args.path, facts):
            print(f"wrote {written}", file=sys.stderr)
    print(json.dumps(as_json(args.path, facts, slurm), indent=1) if args.json else render(facts, slurm, args.path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
