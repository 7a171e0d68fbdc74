"""`status` at the size users reach (issue 29): SLURM is asked once per `status`, however many runs it shows (one
squeue, at most one sacct), and the per-run reads stay small (the newest metrics from the end of logging.jsonl).
SLURM is faked at its seam (slurm.runner); its calls are counted there. No timing here: bench/status_scale.py."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from swiftslurm import slurm
from swiftslurm.ops import status
from swiftslurm.rundir.layout import METRICS, output_dir
from swiftslurm.rundir.metrics import read_latest, read_metrics
from swiftslurm.rundir.records import record_submission, write_status

ENDED_ROW = "{job}|{job}|COMPLETED|2026-12-01T08:53:13|2026-12-01T08:53:14|2026-12-01T08:53:44|2"


class Cluster:
    """squeue and sacct as a cluster where the jobs in ``running`` are in the queue and every other job has
    completed; every command started is kept."""

    def __init__(self, running: set[str]) -> None:
        self.running = running
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> slurm.Answer:
        self.calls.append(list(argv))
        jobs = argv[list(argv).index("-j") + 1].split(",")
        if argv[0] == "squeue":
            return slurm.Answer(0, "".join(f"{j} RUNNING\n" for j in jobs if j in self.running))
        return slurm.Answer(0, "".join(ENDED_ROW.format(job=j) + "\n" for j in jobs if j not in self.running))

    def counted(self) -> Counter[str]:
        return Counter(argv[0] for argv in self.calls)


def submitted_run(run_dir: Path, job: str, state: str) -> None:
    """A run dir of a 2-node plan, submitted to SLURM as ``job``, whose leader last wrote ``state``."""
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text(json.dumps({"run_name": run_dir.name, "topology": {"nodes": 2}}))
    record_submission(run_dir, job, "slurm")
    write_status(run_dir, state, job_id=job)


def folder_of_runs(folder: Path, runs: int) -> set[str]:
    """``runs`` run dirs: a third finished, a third running, a third whose job ended without a final word.
    Returns the jobs still in the queue."""
    running = set()
    for i in range(runs):
        job = str(1000 + i)
        submitted_run(folder / f"r{i:03d}", job, "finished" if i % 3 == 0 else "running")
        running |= {job} if i % 3 == 1 else set()
    return running


@pytest.mark.parametrize("runs", [3, 60])
def test_status_starts_one_squeue_and_one_sacct_however_many_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runs: int
) -> None:
    cluster = Cluster(folder_of_runs(tmp_path, runs))
    monkeypatch.setattr(slurm, "runner", cluster)
    facts, view = status.collect(tmp_path)
    assert cluster.counted() == {"squeue": 1, "sacct": 1}
    assert view is not None and view.available
    states = Counter(f.state for f in facts)
    # the jobs that left the queue without a final word: their end comes from the same sacct as the ledger's
    assert states == {"finished": (runs + 2) // 3, "running": (runs + 1) // 3, "failed": runs // 3}


def test_a_second_status_asks_only_about_jobs_whose_accounting_can_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = Cluster(folder_of_runs(tmp_path, 30))
    monkeypatch.setattr(slurm, "runner", cluster)
    status.collect(tmp_path)
    cluster.calls.clear()
    status.collect(tmp_path)
    # squeue for the runs without a final word; no sacct: the ended jobs' rows are final and cached, the running
    # ones' were asked a moment ago (accounting.ACCOUNTING_TTL_S)
    assert cluster.counted() == {"squeue": 1}


def test_a_folder_of_finished_runs_costs_no_slurm_call_once_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(20):
        submitted_run(tmp_path / f"r{i}", str(500 + i), "finished")
    cluster = Cluster(running=set())
    monkeypatch.setattr(slurm, "runner", cluster)
    status.collect(tmp_path)
    assert cluster.counted() == {"sacct": 1}  # the ledger's accounting, once
    cluster.calls.clear()
    status.collect(tmp_path)
    assert cluster.calls == []


def test_a_run_that_ended_after_status_saw_its_job_running_is_asked_about_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's leader wrote its final state after the last `status` cached the job RUNNING: the next status
    asks sacct again at once (not after the cache's 30 s), so the ledger ends the job where SLURM did."""
    run_dir = tmp_path / "r"
    submitted_run(run_dir, "700", "running")
    cluster = Cluster(running={"700"})
    monkeypatch.setattr(slurm, "runner", cluster)
    status.collect(tmp_path)
    write_status(run_dir, "finished", job_id="700")
    cluster.running.clear()
    cluster.calls.clear()
    status.collect(tmp_path)
    assert cluster.counted() == {"sacct": 1}


def test_the_controller_unreachable_is_asked_once_and_sacct_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder_of_runs(tmp_path, 9)
    calls: list[str] = []

    def down(argv: Sequence[str], timeout_s: float) -> slurm.Answer:
        calls.append(argv[0])
        return slurm.Answer(1, stderr="slurm_load_jobs error: Unable to contact slurm controller (connect failure)")

    monkeypatch.setattr(slurm, "runner", down)
    monkeypatch.setattr(slurm, "sleep", lambda s: None)
    facts, view = status.collect(tmp_path)
    assert view is not None and not view.available
    assert set(calls) == {"squeue"}  # its retries only (accounting.STATUS_ASKS); the ledger uses the cache
    assert {f.state for f in facts} == {"finished", "running"}  # the run dirs' word


def test_job_lists_fit_one_argument_and_need_one_call_for_thousands_of_jobs() -> None:
    jobs = [str(10_000_000 + i) for i in range(10_000)]
    assert slurm.job_lists(jobs) == [",".join(jobs)]
    split = slurm.job_lists(jobs, limit=1000)
    assert all(len(chunk) <= 1000 for chunk in split) and ",".join(split) == ",".join(jobs)
    assert slurm.job_lists([]) == []


def test_status_reads_the_newest_metrics_from_the_end_of_a_long_log(tmp_path: Path) -> None:
    """The newest loss, step and step time, as read_metrics has them, from a read of the log's end only."""
    lines = [
        {"loss": 3 - i / 1000, "global_step/max_steps": f"{i}/4000", "train_speed(s/it)": 0.5 + i / 1e4}
        for i in range(1, 4001)
    ]
    lines.append({"train_runtime": 9.0, "train_speed(s/it)": 7.0, "global_step/max_steps": "4000/4000"})
    output_dir(tmp_path).mkdir()
    log = output_dir(tmp_path) / METRICS
    log.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"loss": 1.0, "glo')  # one being written
    full, latest = read_metrics(tmp_path), read_latest(tmp_path)
    assert (latest.step, latest.max_steps, latest.loss, latest.seconds_per_step) == (
        full.step,
        full.max_steps,
        full.loss,
        full.seconds_per_step,
    )
    assert latest.losses == ()  # the history is the plots' (read_metrics)


def test_the_newest_metrics_come_from_the_node_log_while_logging_jsonl_has_no_loss(tmp_path: Path) -> None:
    (tmp_path / "logs" / "7.0").mkdir(parents=True)
    (tmp_path / "logs" / "7.0" / "node0.log").write_text("{'loss': 2.25, 'global_step/max_steps': '3/10'}\n")
    assert read_latest(tmp_path).loss == 2.25
