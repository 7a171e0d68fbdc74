"""Feedback on long steps (swiftslurm/ops/follow.py): `logs` on a run without logs says why, ms-swift's argument dump
is folded, `logs -f` announces each attempt and the run's end, a closed pipe ends `logs` quietly, a `wait=true`
sweep prints a line per state change, node 0's preflight verdict lands in the log `logs` shows.

Run dirs are fixtures written through swiftslurm/rundir/records.py; where a run changes while it is followed, the
follower's pause hands control to the test (Lockstep), so each change lands between two passes in a fixed order.
"""

from __future__ import annotations

import io
import json
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from swiftslurm.node import attempt
from swiftslurm.ops import control as ops
from swiftslurm.ops import runs, status
from swiftslurm.ops.follow import Folder, current_attempt, show_logs, watch_points
from swiftslurm.preflight import checks as pc
from swiftslurm.preflight import gather as preflight
from swiftslurm.rundir import records
from swiftslurm.rundir.layout import attempt_dir, node_log
from swiftslurm.rundir.records import AttemptRecord, record_submission
from swiftslurm.rundir.sweepdir import record_point
from swiftslurm.slurm_env import SlurmEnv

ARGS_DUMP = ["[INFO:swift] args: SftArguments(", *(f"arg{i}={i}," for i in range(300)), ")"]


def make_run(run_dir: Path, name: str = "tiny") -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text(json.dumps({"run_name": name}))
    return run_dir


def log(run_dir: Path, attempt_id: str, *lines: str) -> None:
    path = node_log(attempt_dir(run_dir, attempt_id), 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as out:
        out.write("".join(line + "\n" for line in lines))


def test_logs_of_a_run_that_never_ran_say_why_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dry = make_run(tmp_path / "dry")
    assert ops.main(["logs", str(dry)]) == 1
    assert (
        "no attempt has started yet (state: planned: never submitted by swiftslurm (dry run)" in capsys.readouterr().err
    )
    stopped = make_run(tmp_path / "stopped")
    records.write_status(stopped, "failed", why="the lease is held by job 9")
    assert ops.main(["logs", str(stopped), "-f"]) == 1
    assert "(state: failed: the lease is held by job 9)" in capsys.readouterr().err


def test_logs_of_a_path_without_a_run_name_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ops.main(["logs", str(tmp_path)]) == 2
    assert "is not a run dir (no plan.json). HINT: `swiftslurm status runs/`" in capsys.readouterr().err


def test_the_argument_dump_is_folded_to_one_line_unless_verbose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = make_run(tmp_path / "run")
    records.write_status(run_dir, "running", attempt="7")
    log(run_dir, "7", "[swiftslurm] exec: swift sft", *ARGS_DUMP, "[INFO:swift] Global seed set to 2", "{'loss': 1.5}")
    assert ops.main(["logs", str(run_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "[7/node0] [INFO:swift] args: SftArguments( … )  [301 lines folded; `logs --verbose` shows them]"
    assert len(lines) == 4 and lines[3] == "[7/node0] {'loss': 1.5}"
    assert ops.main(["logs", "--verbose", str(run_dir)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3 + len(ARGS_DUMP)


def test_a_dump_split_across_reads_is_folded_once() -> None:
    folder = Folder(verbose=False)
    shown = folder.feed(["before", *ARGS_DUMP[:100]]) + folder.feed(ARGS_DUMP[100:]) + folder.feed(["[INFO:swift] x"])
    assert len(shown) == 3 and shown[1].startswith(ARGS_DUMP[0]) and shown[2] == "[INFO:swift] x"


class Lockstep:
    """The follower's pause hands control to the test, which changes the run dir and lets it go on."""

    def __init__(self) -> None:
        self.paused = threading.Semaphore(0)
        self.go_on = threading.Semaphore(0)

    def pause(self) -> None:
        self.paused.release()
        self.go_on.acquire()

    def then(self, change: Callable[[], None]) -> None:
        assert self.paused.acquire(timeout=120), "the follower never finished its pass"
        change()
        self.go_on.release()


def test_logs_follow_announces_a_requeue_and_ends_with_the_run_state(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "run")
    records.write_status(run_dir, "running", attempt="7")
    log(run_dir, "7", "step 1")
    out, step, result = io.StringIO(), Lockstep(), []
    follower = threading.Thread(
        target=lambda: result.append(show_logs(run_dir, ops.facts_of, follow=True, out=out, pause=step.pause))
    )
    follower.start()

    def requeue() -> None:
        log(run_dir, "7", "step 2")  # written before the requeue, read after the next attempt exists
        records.append_attempt(run_dir, AttemptRecord("7", reason="preempted", decision="requeue"))
        log(run_dir, "7.r1", "resumed")
        records.write_status(run_dir, "running", attempt="7.r1")

    def finish() -> None:
        log(run_dir, "7.r1", "step 3")
        records.write_status(run_dir, "finished", attempt="7.r1", why="reached max_steps")

    step.then(requeue)
    step.then(finish)
    follower.join(timeout=120)
    assert result == [0]
    assert out.getvalue().splitlines() == [
        "[swiftslurm logs] attempt 7 started",
        "[7/node0] step 1",
        "[7/node0] step 2",
        "[swiftslurm logs] attempt 7.r1 started (the one before: preempted → requeue)",
        "[7.r1/node0] resumed",
        "[7.r1/node0] step 3",
        "[swiftslurm logs] run finished: reached max_steps",
    ]


def test_a_waiting_sweep_prints_a_line_each_time_a_point_changes_state(tmp_path: Path) -> None:
    points = [make_run(tmp_path / "runs" / f"p{i}", f"p{i}") for i in range(2)]
    for i, run_dir in enumerate(points):
        record_submission(run_dir, str(i + 1), "slurm")
        record_point(tmp_path / "sweep", {"num": i, "run_dir": str(run_dir)})
    changes = [
        lambda: records.write_status(points[0], "running"),
        lambda: (records.write_status(points[0], "finished"), records.write_status(points[1], "failed", why="OOM")),
    ]
    out = io.StringIO()
    facts, _ = watch_points(
        tmp_path / "sweep", lambda p: status.collect(p, use_slurm=False), lambda: changes.pop(0)(), out
    )
    assert [f.state for f in facts] == ["finished", "failed"] and not changes
    assert [re.sub(r"^\d\d:\d\d:\d\d  ", "", line) for line in out.getvalue().splitlines()] == [
        "p0: pending",
        "p1: pending",
        "p0: pending → running",
        "p0: running → finished",
        "p1: pending → failed (OOM)",
    ]


def test_node_0_puts_the_preflight_verdict_into_the_log_logs_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = make_run(tmp_path / "run")
    checks = (pc.Check("run dir writable", True, "yes"),)
    passed = pc.assemble("5", [pc.NodeReport(0, "node1", checks), pc.NodeReport(1, "node2", checks)])
    monkeypatch.setattr(preflight, "run", lambda ctx: passed)  # the checks themselves: tests/cluster
    where = SlurmEnv(job_id="5", hosts=("node1", "node2"), node_id=0, num_nodes=2, proc_id=0, num_tasks=2)
    assert attempt._preflight(run_dir, where, "5") is None
    records.write_status(run_dir, "running", attempt="5")
    capsys.readouterr()
    assert ops.main(["logs", str(run_dir)]) == 0
    assert capsys.readouterr().out == "[5/node0] [swiftslurm] preflight passed on 2 node(s)\n"


def test_the_current_attempt_comes_from_the_records_after_a_restart_in_place(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "run")
    log(run_dir, "7", "first")
    records.append_attempt(run_dir, AttemptRecord("7", reason="crashed", decision="restart"))
    records.write_status(run_dir, "restarting", attempt="7")  # status.json still names the attempt that ended
    log(run_dir, "7.i1", "again")
    assert current_attempt(run_dir) == attempt_dir(run_dir, "7.i1")
    records.append_attempt(run_dir, AttemptRecord("7.i1", reason="finished", decision="done"))
    os.utime(node_log(attempt_dir(run_dir, "7"), 0))  # touched later: the records still decide
    assert current_attempt(run_dir) == attempt_dir(run_dir, "7.i1")


def test_a_waited_sweep_with_a_point_never_submitted_does_not_wait_forever(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "runs" / "p0", "p0")  # planned: no job.json, no word from a wrapper
    record_point(tmp_path / "sweep", {"num": 0, "run_dir": str(run_dir)})

    def never() -> None:
        raise AssertionError("waited for a point nothing will change")

    facts, _ = watch_points(tmp_path / "sweep", lambda p: status.collect(p, use_slurm=False), never, io.StringIO())
    assert [f.state for f in facts] == ["planned"]


def follow(run_dir: Path, pause: Callable[[], None] = lambda: None) -> tuple[int, list[str]]:
    out = io.StringIO()
    code = show_logs(run_dir, ops.facts_of, follow=True, out=out, pause=pause)
    return code, out.getvalue().splitlines()


@pytest.mark.parametrize(
    ("recorded", "state", "announced"),
    [
        # One attempt, cancelled and recorded before `logs -f` first looked: there is no attempt before it.
        ([("44", "cancelled", "stop")], "cancelled", "attempt 44 (ended: cancelled → stop)"),
        # After `resume`: the new attempt ended before `logs -f` first looked; before it, the cancelled one.
        (
            [("44", "cancelled", "stop"), ("45", "finished", "done")],
            "finished",
            "attempt 45 (ended: finished → done; the one before: cancelled → stop)",
        ),
    ],
)
def test_logs_follow_names_the_attempt_before_the_one_shown_not_the_last_record(
    tmp_path: Path, recorded: list[tuple[str, str, str]], state: str, announced: str
) -> None:
    run_dir = make_run(tmp_path / "run")
    for attempt_id, reason, decision in recorded:
        log(run_dir, attempt_id, f"trained in {attempt_id}")
        records.append_attempt(run_dir, AttemptRecord(attempt_id, reason=reason, decision=decision))
    records.write_status(run_dir, state, attempt=recorded[-1][0])
    _, lines = follow(run_dir)
    assert lines[0] == f"[swiftslurm logs] {announced}"


def test_logs_follow_does_not_take_a_new_attempts_own_record_for_its_predecessors(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "run")
    records.write_status(run_dir, "running", attempt="44")
    log(run_dir, "44", "step 1")
    step, result = Lockstep(), []
    follower = threading.Thread(target=lambda: result.append(follow(run_dir, step.pause)))
    follower.start()

    def requeued_and_finished_between_two_looks() -> None:
        records.append_attempt(run_dir, AttemptRecord("44", reason="preempted", decision="requeue"))
        log(run_dir, "44.r1", "step 2")
        records.append_attempt(run_dir, AttemptRecord("44.r1", reason="finished", decision="done"))
        records.write_status(run_dir, "finished", attempt="44.r1", why="reached max_steps")

    step.then(requeued_and_finished_between_two_looks)
    follower.join(timeout=120)
    assert result and result[0][1] == [
        "[swiftslurm logs] attempt 44 started",
        "[44/node0] step 1",
        "[swiftslurm logs] attempt 44.r1 (ended: finished → done; the one before: preempted → requeue)",
        "[44.r1/node0] step 2",
        "[swiftslurm logs] run finished: reached max_steps",
    ]


def wrapper_output(folder: Path, name: str, *lines: str, end: str = "\n") -> None:
    """What a wrapper printed: submitit's (or SLURM's) output file ``name`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / name, "a") as out:
        out.write(end.join(lines) + end)


def run_dir_only(run_dir: Path) -> runs.RunFacts:
    return runs.gather(run_dir)  # no SLURM: the run dir alone


def test_logs_show_each_nodes_wrapper_output_of_the_current_submitit_job(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "run")
    record_submission(run_dir, "44", "slurm")
    records.write_status(run_dir, "running", attempt="44", job_id="44")
    log(run_dir, "44", "{'loss': 1.5}")
    submitit = run_dir / "submitit"
    wrapper_output(submitit, "43_0_log.out", "[swiftslurm] an earlier job's line")
    restored = "[swiftslurm] downloaded checkpoint-10: 12 files, 48.3 MiB in 1.2 s (40.1 MiB/s)"
    wrapper_output(submitit, "44_0_log.out", restored)
    wrapper_output(submitit, "44_0_log.err", "submitit INFO (2026-01-01 00:00:00,000) - Starting with JobEnvironment")
    wrapper_output(submitit, "44_1_log.out", "[swiftslurm] uploaded checkpoint-12")
    out = io.StringIO()
    assert show_logs(run_dir, run_dir_only, out=out) == 0
    assert out.getvalue().splitlines() == [
        f"[wrapper/node0] {restored}",
        "[wrapper/node0/stderr] submitit INFO (2026-01-01 00:00:00,000) - Starting with JobEnvironment",
        "[wrapper/node1] [swiftslurm] uploaded checkpoint-12",
        "[44/node0] {'loss': 1.5}",
    ]
    out = io.StringIO()
    assert show_logs(run_dir, run_dir_only, node=1, out=out) == 0
    assert out.getvalue().splitlines() == ["[wrapper/node1] [swiftslurm] uploaded checkpoint-12"]


@pytest.mark.parametrize("follows", [False, True], ids=["logs", "logs -f"])
def test_a_wrapper_that_crashed_before_any_attempt_began_is_shown(
    tmp_path: Path, follows: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = make_run(tmp_path / "run")
    record_submission(run_dir, "45", "slurm")
    crash = ["Traceback (most recent call last):", "ModuleNotFoundError: No module named 'swiftslurm'"]
    wrapper_output(run_dir / "submitit", "45_0_log.err", *crash)
    slurm_ended = runs.SlurmView(available=True, states={"45": "FAILED"})
    out = io.StringIO()
    assert show_logs(run_dir, lambda d: runs.gather(d, slurm_ended), follow=follows, out=out) == 1
    assert out.getvalue().splitlines() == [f"[wrapper/node0/stderr] {line}" for line in crash]
    assert "no attempt has started yet (state: failed: job failed without a final record" in capsys.readouterr().err


def test_logs_of_a_job_submitted_by_hand_show_slurms_output_file(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "run")  # `sbatch RUN_DIR/job.sbatch`: no job.json, SLURM's output in logs/
    said = ["[swiftslurm] job 46 requeued: this attempt ends now", "srun: error: node2: task 1: Terminated"]
    wrapper_output(run_dir / "logs", "slurm-46.out", *said)
    records.write_status(run_dir, "running", attempt="46", job_id="46")
    log(run_dir, "46", "step 1")
    out = io.StringIO()
    assert show_logs(run_dir, run_dir_only, out=out) == 0
    assert out.getvalue().splitlines() == [
        *(f"[wrapper] {line}" for line in said),
        "[46/node0] step 1",
    ]


def test_logs_of_a_job_array_task_read_its_own_files_in_the_sweeps_submitit_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from swiftslurm.sweep import sweeper

    points = [make_run(tmp_path / "runs" / f"p{i}", f"p{i}") for i in range(11)]
    members = [
        SimpleNamespace(plan=SimpleNamespace(run_dir=str(p)), record=lambda action, job: {"action": action})
        for p in points
    ]
    folders = []

    def submitted(plans: list[object], folder: Path, parallelism: int) -> list[SimpleNamespace]:
        folders.append(folder)
        return [SimpleNamespace(job_id=f"12_{i}") for i in range(len(plans))]

    monkeypatch.setattr(sweeper.submit, "submit_array", submitted)
    sweeper.submit_array(tmp_path / "sweep", members, parallelism=2)  # type: ignore[arg-type]
    [folder] = folders
    for job in ("12_1", "12_10", "12"):  # the array's other tasks, and a job 12 of its own
        wrapper_output(folder, f"{job}_0_log.out", f"[swiftslurm] job {job}")
    records.write_status(points[1], "running", attempt="12_1", job_id="12_1")
    out = io.StringIO()
    assert show_logs(points[1], run_dir_only, out=out) == 0
    assert out.getvalue().splitlines() == ["[wrapper/node0] [swiftslurm] job 12_1"]


def test_logs_follow_interleaves_wrapper_and_node_lines_as_they_are_written(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "run")
    record_submission(run_dir, "47", "slurm")
    submitit = run_dir / "submitit"
    wrapper_output(submitit, "47_0_log.out", "[swiftslurm] downloading checkpoint-10")
    out, step, result = io.StringIO(), Lockstep(), []
    follower = threading.Thread(
        target=lambda: result.append(show_logs(run_dir, run_dir_only, follow=True, out=out, pause=step.pause))
    )
    follower.start()

    def restored_and_training() -> None:
        wrapper_output(submitit, "47_0_log.out", "[swiftslurm] downloaded checkpoint-10")
        wrapper_output(submitit, "47_0_log.out", "[swiftslurm] upl", end="")  # a line still being written
        records.write_status(run_dir, "running", attempt="47", job_id="47")
        log(run_dir, "47", "step 11")

    def saved_and_finished() -> None:
        wrapper_output(submitit, "47_0_log.out", "oaded checkpoint-12")
        log(run_dir, "47", "step 12")
        records.append_attempt(run_dir, AttemptRecord("47", reason="finished", decision="done"))
        records.write_status(run_dir, "finished", attempt="47", job_id="47", why="reached max_steps")

    step.then(restored_and_training)
    step.then(saved_and_finished)
    follower.join(timeout=120)
    assert result == [0]
    assert out.getvalue().splitlines() == [
        "[wrapper/node0] [swiftslurm] downloading checkpoint-10",
        "[swiftslurm logs] no attempt has started yet (state: pending); waiting for the first one",
        "[swiftslurm logs] attempt 47 started",
        "[wrapper/node0] [swiftslurm] downloaded checkpoint-10",
        "[47/node0] step 11",
        "[wrapper/node0] [swiftslurm] uploaded checkpoint-12",
        "[47/node0] step 12",
        "[swiftslurm logs] run finished: reached max_steps",
    ]


class CountedReads:
    """`open` as follow.py sees it, counting the bytes read from each file."""

    def __init__(self) -> None:
        self.read: dict[Path, int] = {}

    def __call__(self, path: Path, mode: str = "r") -> CountedReads.Stream:
        return CountedReads.Stream(open(path, mode), Path(path), self.read)

    class Stream:
        def __init__(self, stream: io.BufferedReader, path: Path, tally: dict[Path, int]) -> None:
            self.stream, self.path, self.tally = stream, path, tally

        def __enter__(self) -> CountedReads.Stream:
            return self

        def __exit__(self, *exc: object) -> None:
            self.stream.close()

        def seek(self, offset: int) -> int:
            return self.stream.seek(offset)

        def read(self) -> bytes:
            data = self.stream.read()
            self.tally[self.path] = self.tally.get(self.path, 0) + len(data)
            return data


def test_logs_follow_of_a_16_node_run_reads_each_byte_of_its_logs_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from swiftslurm.ops import follow as follow_module

    reads = CountedReads()
    monkeypatch.setattr(follow_module, "open", reads, raising=False)
    monkeypatch.setattr(runs, "read_latest", lambda run_dir: pytest.fail("logs -f read the run's metrics"))
    run_dir = make_run(tmp_path / "run")
    records.write_status(run_dir, "running", attempt="9")
    logs = [node_log(attempt_dir(run_dir, "9"), node) for node in range(16)]
    for node, path in enumerate(logs):
        log_line(path, f"node {node} up\n" * 500)  # a long history, read once
    out, step, result = io.StringIO(), Lockstep(), []
    follower = threading.Thread(
        target=lambda: result.append(show_logs(run_dir, runs.state_of, follow=True, out=out, pause=step.pause))
    )
    follower.start()

    def trained() -> None:
        for node, path in enumerate(logs):
            log_line(path, f"node {node} step 1\n")
        log_line(logs[3], "node 3 st")  # a line still being written

    def finished() -> None:
        log_line(logs[3], "ep 2\n")
        records.write_status(run_dir, "finished", attempt="9", why="reached max_steps")

    step.then(lambda: None)  # a pass in which nothing was written
    step.then(trained)
    step.then(finished)
    follower.join(timeout=120)
    assert result == [0]
    assert reads.read == {path: path.stat().st_size for path in logs}  # every byte, and each once
    shown = out.getvalue().splitlines()
    assert shown.count("[9/node3] node 3 step 2") == 1 and "[9/node15] node 15 step 1" in shown


def log_line(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as out:
        out.write(text)


def test_the_state_logs_follow_polls_is_the_one_status_shows(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "run")
    record_submission(run_dir, "61", "slurm")
    records.write_status(run_dir, "failed", job_id="61", why="the trainer exited 1")
    facts, state = runs.gather(run_dir), runs.run_state(run_dir)
    assert (
        (state.state, state.why, state.job_id)
        == (facts.state, facts.why, facts.job_id)
        == (
            "failed",
            "the trainer exited 1",
            "61",
        )
    )
