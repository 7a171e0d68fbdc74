"""What ms-swift logged about training in a run directory: the latest loss and step times, for `status` and plots."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swiftslurm.rundir.jsonio import read_json, read_jsonl, read_jsonl_backwards
from swiftslurm.rundir.layout import METRICS, leader_logs, output_dir


@dataclass(frozen=True)
class Metrics:
    """From ms-swift's logging.jsonl: the latest loss and how fast the latest steps went."""

    step: int | None = None
    max_steps: int | None = None
    loss: float | None = None
    seconds_per_step: float | None = None
    losses: tuple[tuple[int, float], ...] = ()  # (step, loss) over every attempt, for the plots
    speeds: tuple[tuple[int, float], ...] = ()  # (step, seconds per step)


TRAINER_STATE = "trainer_state.json"  # in a Transformers checkpoint: its step, max_steps and log history
_LOG_RECORD = re.compile(r"\{'loss': [^{}]*\}")  # ms-swift's progress line in a node log (a dict's repr)


def _metric_records(run_dir: Path) -> list[dict[str, Any]]:
    """ms-swift's per-step records: output/logging.jsonl, or, while it has none yet (it can lag behind),
    the progress lines of node 0's logs, oldest attempt first."""
    records: list[dict[str, Any]] = read_jsonl(output_dir(run_dir) / METRICS)  # skips a line being written
    if any("loss" in r for r in records if isinstance(r, dict)):
        return records
    logs = sorted(leader_logs(run_dir), key=lambda p: p.stat().st_mtime)
    for log in logs:
        for match in _LOG_RECORD.finditer(log.read_text(errors="replace")):
            try:
                records.append(ast.literal_eval(match.group(0)))
            except (ValueError, SyntaxError):
                continue
    if not any("loss" in r for r in records if isinstance(r, dict)):
        records += _checkpoint_history(run_dir)
    return records


def _checkpoint_history(run_dir: Path) -> list[dict[str, Any]]:
    """The Trainer's log history saved in the newest checkpoint (trainer_state.json), as ms-swift's records: a
    run dir that restored another one's checkpoint from object storage has no logs of those steps of its own."""
    states = sorted(output_dir(run_dir).glob(f"checkpoint-*/{TRAINER_STATE}"), key=lambda p: _step_of(p.parent))
    state = read_json(states[-1]) if states else None
    if not state:
        return []
    total = state.get("max_steps")
    history = [e for e in state.get("log_history", []) if isinstance(e, dict) and "loss" in e and "step" in e]
    return [{"loss": e["loss"], "global_step/max_steps": f"{e['step']}/{total}"} for e in history]


def _step_of(checkpoint: Path) -> int:
    tail = checkpoint.name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else -1


def _progress(record: dict[str, Any]) -> tuple[int, int] | None:
    """(step, max_steps) of a per-step record; None for the summary lines."""
    try:
        done, total = (int(x) for x in str(record["global_step/max_steps"]).split("/"))
    except (KeyError, TypeError, ValueError):
        return None
    return done, total


def _speed(record: dict[str, Any]) -> float | None:
    """Seconds per step of a per-step record (the final summary's is the whole run's average: not one)."""
    if "train_speed(s/it)" in record and "train_runtime" not in record:
        return float(record["train_speed(s/it)"])
    return None


def read_latest(run_dir: Path) -> Metrics:
    """What `status` shows: the newest step, loss and step time, read from the end of logging.jsonl (a few KiB,
    however long the run: a folder of a thousand runs is not a thousand parses of whole logs). Only while
    logging.jsonl has no loss yet does it read what read_metrics reads; no history (that is the plots')."""
    found: dict[str, Any] = {}
    for record in read_jsonl_backwards(output_dir(run_dir) / METRICS):
        if (progress := _progress(record)) is None:
            continue
        found.setdefault("progress", progress)
        if "loss" in record:
            found.setdefault("loss", float(record["loss"]))
        if (speed := _speed(record)) is not None:
            found.setdefault("speed", speed)
        if "loss" in found and "speed" in found:
            break
    if "loss" not in found:
        full = read_metrics(run_dir)
        return Metrics(full.step, full.max_steps, full.loss, full.seconds_per_step)
    step, max_steps = found["progress"]
    return Metrics(step, max_steps, found["loss"], found.get("speed"))


def read_metrics(run_dir: Path) -> Metrics:
    losses: dict[int, float] = {}
    speeds: dict[int, float] = {}
    step = max_steps = None
    for record in _metric_records(run_dir):
        if (progress := _progress(record)) is None:
            continue
        done, total = progress
        step, max_steps = done, total
        if "loss" in record:
            losses[done] = float(record["loss"])  # a resumed attempt logs its steps again: the latest wins
        if (speed := _speed(record)) is not None:
            speeds[done] = speed
    ordered = sorted(losses.items())
    return Metrics(
        step=step,
        max_steps=max_steps,
        loss=ordered[-1][1] if ordered else None,
        seconds_per_step=speeds[max(speeds)] if speeds else None,
        losses=tuple(ordered),
        speeds=tuple(sorted(speeds.items())),
    )
