"""SLURM's accounting for the ledger: parsed from sacct, asked once for many runs, cached so that `status` does
not ask about jobs whose accounting can no longer change; and `status` showing a run's ledger (--json too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from swiftslurm import slurm as slurm_cli
from swiftslurm.errors import SubmitError
from swiftslurm.ops import accounting, status
from swiftslurm.plan import PlanGlance
from swiftslurm.rundir.layout import attempt_dir, trainer_timeline
from swiftslurm.rundir.records import AttemptRecord, append_attempt, record_submission
from swiftslurm.rundir.timeline import TIMELINE_ENV, TimelineWriter, read_timeline


def test_sacct_rows_of_a_requeued_job_give_one_run_each(monkeypatch: pytest.MonkeyPatch) -> None:
    out = (
        "39|39|REQUEUED|2026-12-01T08:53:13|2026-12-01T08:53:14|2026-12-01T08:53:44|2\n"
        "39|39|RUNNING|2026-12-01T08:53:53|2026-12-01T08:54:05|Unknown|2\n"
        "52|52|CANCELLED by 0|2026-12-01T09:06:03|None|2026-12-01T09:06:03|0\n"
    )
    asked: list[list[str]] = []
    monkeypatch.setattr(slurm_cli, "run", lambda argv, timeout_s=30: asked.append(argv) or out)
    rows = slurm_cli.job_runs(["39", "52"])
    assert asked[0][:3] == ["sacct", "-D", "-X"] and "39,52" in asked[0]
    assert [(r["job_id"], r["state"], r["nodes"]) for r in rows] == [
        ("39", "REQUEUED", 2),
        ("39", "RUNNING", 2),
        ("52", "CANCELLED", 0),
    ]
    assert rows[0]["end"] - rows[0]["start"] == 30 and rows[1]["end"] is None and rows[2]["start"] is None


def test_sacct_rows_of_an_array_task_carry_its_raw_job_id(monkeypatch: pytest.MonkeyPatch) -> None:
    # sacct names an array task `<array>_<i>`; inside the task SLURM_JOB_ID is its raw id (JobIDRaw).
    out = "11_2|14|COMPLETED|2026-12-01T08:53:13|2026-12-01T08:53:20|2026-12-01T08:53:36|2\n"
    monkeypatch.setattr(slurm_cli, "run", lambda argv, timeout_s=30: out)
    rows = slurm_cli.job_runs(["11_2", "14"])
    assert [(r["job_id"], r["raw_id"], r["nodes"]) for r in rows] == [("11_2", "14", 2)]
    assert rows[0]["end"] - rows[0]["start"] == 16


def row(job: str, state: str, start: float, end: float | None) -> dict[str, Any]:
    return {"job_id": job, "raw_id": job, "state": state, "submit": start - 5, "start": start, "end": end, "nodes": 2}


class FakeSacct:
    """What sacct answers, and which jobs it was asked about."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.asked: list[list[str]] = []

    def __call__(self, job_ids: list[str]) -> list[dict[str, Any]]:
        self.asked.append(job_ids)
        return [r for r in self.rows if r["job_id"] in job_ids or r.get("raw_id") in job_ids]


def a_run(run_dir: Path, job: str) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text(json.dumps({"run_name": run_dir.name, "topology": {"nodes": 2}}))
    record_submission(run_dir, job, "slurm")
    return run_dir


def test_status_asks_once_for_all_runs_and_never_again_about_jobs_that_ended(tmp_path: Path) -> None:
    ended, running = a_run(tmp_path / "a", "7"), a_run(tmp_path / "b", "8")
    sacct = FakeSacct([row("7", "REQUEUED", 10, 40), row("7", "COMPLETED", 50, 90), row("8", "RUNNING", 60, None)])
    jobs, error = accounting.refresh([ended, running], sacct, now=100)
    assert sacct.asked == [["7", "8"]] and error == ""
    assert [r["state"] for r in jobs[ended]["7"]] == ["REQUEUED", "COMPLETED"]
    accounting.refresh([ended, running], sacct, now=100 + accounting.ACCOUNTING_TTL_S / 2)
    assert len(sacct.asked) == 1  # both cached: one ended for good, one asked about a moment ago
    accounting.refresh([ended, running], sacct, now=100 + accounting.ACCOUNTING_TTL_S)
    assert sacct.asked[1:] == [["8"]]  # only the running job, once its cache is older than the TTL


def test_sacct_unreachable_keeps_the_cached_rows_and_says_why(tmp_path: Path) -> None:
    run_dir = a_run(tmp_path / "a", "8")
    accounting.refresh([run_dir], FakeSacct([row("8", "RUNNING", 60, None)]), now=100)

    def unreachable(job_ids: list[str]) -> list[dict[str, Any]]:
        raise SubmitError("`sacct ...` did not answer within 10 s: is slurmctld up?")

    jobs, error = accounting.refresh([run_dir], unreachable, now=1000)
    assert "did not answer" in error
    assert jobs[run_dir]["8"][0]["state"] == "RUNNING"


def test_a_job_sacct_has_forgotten_keeps_its_cached_rows(tmp_path: Path) -> None:
    run_dir = a_run(tmp_path / "a", "8")
    accounting.refresh([run_dir], FakeSacct([row("8", "RUNNING", 60, None)]), now=100)
    jobs, error = accounting.refresh([run_dir], FakeSacct([]), now=100 + accounting.ACCOUNTING_TTL_S)  # purged
    assert error == "" and jobs[run_dir]["8"][0]["start"] == 60


def timeline(run_dir: Path, attempt: str, events: list[dict[str, Any]]) -> None:
    folder = attempt_dir(run_dir, attempt)
    folder.mkdir(parents=True, exist_ok=True)
    trainer_timeline(folder).write_text("".join(json.dumps(e) + "\n" for e in events) + '{"torn')


def test_status_of_a_run_shows_its_ledger_and_json_carries_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = a_run(tmp_path / "run", "7")
    (run_dir / "status.json").write_text(json.dumps({"state": "finished", "why": "done"}))
    phases = {"prepare": 12, "agree_on_resume": 13, "train": 14, "conclude": 80}
    append_attempt(
        run_dir,
        AttemptRecord("7", "7", hosts=("a", "b"), end=81, decision="done", phases=phases),
    )
    timeline(
        run_dir,
        "7",
        [
            {"event": "train_begin", "t": 20, "step": 0},
            {"event": "save", "step": 5, "started": 70, "t": 74},
            {"event": "committed", "step": 5, "t": 75},
            {"event": "train_end", "started": 74, "t": 75},
        ],
    )
    accounting.refresh([run_dir], FakeSacct([row("7", "COMPLETED", 10, 90)]), now=100)
    facts, slurm = status.collect(run_dir, use_slurm=False)  # the cached accounting, no SLURM call
    text = status.render(facts, slurm)
    assert "goodput ledger of run (1 job run(s); allocated from SLURM accounting)" in text
    assert "training, committed" in text and "queue wait 5 s" in text
    assert "rounding: SLURM's Start/End are whole seconds; the records outside them (0.0 CPU process-seconds)" in text
    assert status.main([str(run_dir), "--json", "--no-slurm"]) == 0
    out = json.loads(capsys.readouterr().out)
    spent = out["runs"][0]["ledger"]["spent_s"]
    assert out["runs"][0]["ledger"]["allocated_s"] == 80 * 2  # 2 nodes × 1 CPU process
    assert spent["committed"] == 50 * 2 and spent["save"] == 5 * 2 and spent["finish"] == 15 * 2
    assert sum(spent.values()) == out["ledger"]["allocated_s"]
    assert out["runs"][0]["goodput"] == pytest.approx(50 / 80)


def array_task(run_dir: Path, task: str, raw: str, start: float) -> dict[str, Any]:
    """A point of a job array: job.json names it as submitit did (`11_2`), its attempt as SLURM_JOB_ID does
    inside the task (the raw id); it held 2 nodes for 16 s, training from 6 s after its Start."""
    a_run(run_dir, task)
    phases = {"prepare": start + 2, "agree_on_resume": start + 3, "train": start + 4, "conclude": start + 15}
    append_attempt(run_dir, AttemptRecord(raw, raw, hosts=("a", "b"), end=start + 15.5, decision="done", phases=phases))
    events = [{"event": "train_begin", "t": start + 6, "step": 0}, {"event": "save", "step": 5, "started": start + 12}]
    timeline(
        run_dir, raw, [*events[:1], events[1] | {"t": start + 13}, {"event": "committed", "step": 5, "t": start + 13}]
    )
    return {
        "job_id": task,
        "raw_id": raw,
        "state": "COMPLETED",
        "submit": 0,
        "start": start,
        "end": start + 16,
        "nodes": 2,
    }


def test_an_array_task_is_one_job_run_allocated_its_own_row_and_started_only_before_its_attempt(
    tmp_path: Path,
) -> None:
    rows = [array_task(tmp_path / "p1", "11_1", "13", 100), array_task(tmp_path / "p2", "11_2", "14", 120)]
    jobs, _ = accounting.refresh([tmp_path / "p1", tmp_path / "p2"], FakeSacct(rows), now=200)
    plan = PlanGlance.read(tmp_path / "p2")
    spent = accounting.run_ledger(tmp_path / "p2", plan, jobs[tmp_path / "p2"], now=200)
    assert spent.job_runs == 1 and spent.from_slurm  # not again as an attempt SLURM could not account for
    assert spent.allocated_s == 16 * 2  # the task's own row: 16 s × 2 nodes, not the array's
    assert spent.spent_s["startup"] == 3 * 2  # Start -> the wrapper chooses its resume point, nothing after it
    assert spent.spent_s["committed"] == (12 - 6) * 2 and spent.unaccounted_s == 0


def test_an_array_task_seen_running_under_its_raw_id_ends_when_its_name_is_asked(tmp_path: Path) -> None:
    """Asked while it ran, the task's row went under both ids; once it left the queue only its name (job.json's
    `11_2`) is stale enough to ask: the fresh row must replace the RUNNING one under the raw id too, else the
    ledger keeps an allocation without an End and charges it up to now (seen in the cluster tier: 82 s
    allocated against sacct's 70 s)."""
    done = array_task(tmp_path / "p", "11_2", "14", 100)
    running = done | {"state": "RUNNING", "end": None}
    accounting.refresh([tmp_path / "p"], FakeSacct([running]), now=110)
    jobs, _ = accounting.refresh([tmp_path / "p"], FakeSacct([done]), now=115, left_queue={"11_2"})
    assert jobs[tmp_path / "p"]["14"] == [done]
    spent = accounting.run_ledger(tmp_path / "p", PlanGlance.read(tmp_path / "p"), jobs[tmp_path / "p"], now=500)
    assert spent.allocated_s == 16 * 2


def test_accounting_cached_before_raw_job_ids_were_read_is_asked_again(tmp_path: Path) -> None:
    run_dir = a_run(tmp_path / "a", "11_2")
    old = {k: v for k, v in row("11_2", "COMPLETED", 10, 40).items() if k != "raw_id"}
    accounting.refresh([run_dir], FakeSacct([old]), now=100)  # final, but cached without a raw id
    sacct = FakeSacct([row("11_2", "COMPLETED", 10, 40) | {"raw_id": "14"}])
    jobs, _ = accounting.refresh([run_dir], sacct, now=101)
    assert sacct.asked == [["11_2"]] and jobs[run_dir]["11_2"][0]["raw_id"] == "14"


def test_the_trainer_timeline_is_written_by_rank_zero_only_where_the_wrapper_asks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "trainer.jsonl"
    monkeypatch.setenv(TIMELINE_ENV, str(path))
    TimelineWriter.from_environ(rank_zero=False).event("train_begin", step=0)
    assert not path.exists()
    writer = TimelineWriter.from_environ(rank_zero=True)
    writer.event("train_begin", step=0)
    writer.step_ended()
    step_end = writer.step_ended_at
    writer.saved(10)
    events = read_timeline(path)
    assert [e["event"] for e in events] == ["train_begin", "save"]
    assert events[1]["step"] == 10 and events[1]["started"] == pytest.approx(step_end, abs=1e-3)
    assert events[1]["t"] >= events[1]["started"]


def test_the_commit_hook_records_the_loop_each_save_and_commit_in_the_timeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from swiftslurm.ckpt.checkpoint import is_committed
    from swiftslurm.engines.hooks import Committer

    path = tmp_path / "trainer.jsonl"
    monkeypatch.setenv(TIMELINE_ENV, str(path))
    folder = tmp_path / "output" / "checkpoint-10"
    folder.mkdir(parents=True)
    (folder / "adapter.bin").write_bytes(b"weights")
    committer = Committer(engine="swift")
    committer.train_begun(0)
    committer.timeline.step_ended()
    committer.after_save(folder, last_step=20)
    committer.finish()
    assert is_committed(folder)
    events = read_timeline(path)
    assert [e["event"] for e in events] == ["train_begin", "save", "committed", "train_end"]
    assert events[1]["started"] <= events[1]["t"] <= events[2]["t"] <= events[3]["t"]
    assert events[2]["step"] == 10 and events[3]["started"] <= events[3]["t"]
