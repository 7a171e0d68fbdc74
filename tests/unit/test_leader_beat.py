"""The other nodes wait for node 0's resume point as long as node 0's heartbeat is fresh, and no longer.

No test sleeps: time is a fake that each poll advances, and a stale heartbeat is one written with an old
timestamp.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from swiftslurm.errors import NodeError
from swiftslurm.node import resume
from swiftslurm.node.heartbeat import STALE_S, LeaderBeat, leader_silence
from swiftslurm.plan import JobPlan
from swiftslurm.rundir.beat import describe_leader_beat as describe
from swiftslurm.rundir.beat import read_leader_beat as read_beat
from swiftslurm.rundir.jsonio import write_json_atomic
from swiftslurm.rundir.layout import LEADER_BEAT, RESUME
from tests.conftest import plan_for

GiB = 1 << 30
DOWNLOADING = "downloading checkpoint-40 from s3://runs/exp1/"


@pytest.fixture(scope="module")
def plan() -> JobPlan:
    return plan_for("run_dir=/scratch/run")


def beat(attempt_dir: Path, updated: float, done: int = 12 * GiB) -> None:
    """Node 0's heartbeat as its thread writes it, at time ``updated``."""
    record = {"doing": DOWNLOADING, "bytes": done, "total": 250 * GiB, "host": "gpu07", "pid": 4242}
    write_json_atomic(attempt_dir / LEADER_BEAT, record | {"updated": updated})


class Clock:
    """Stands in for the `time` module on a waiting node: each poll's sleep lasts ``step_s``; ``on_sleep``
    is what node 0 does meanwhile."""

    def __init__(self, step_s: float, on_sleep: object = None) -> None:
        self.now = 1_800_000_000.0
        self.step_s = step_s
        self.sleeps = 0
        self.on_sleep = on_sleep

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += self.step_s
        self.sleeps += 1
        if callable(self.on_sleep):
            self.on_sleep(self)


def test_a_follower_waits_past_the_old_900_s_limit_while_the_leader_beats(
    plan: JobPlan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore of ~250 GB takes longer than any fixed limit: 2400 s here, with node 0 beating throughout."""

    def leader_restoring(clock: Clock) -> None:
        beat(tmp_path, clock.now, done=clock.sleeps * 50 * GiB)
        if clock.sleeps == 4:
            write_json_atomic(tmp_path / RESUME, {"checkpoint": "/scratch/run/output/checkpoint-40", "step": 40})

    clock = Clock(step_s=600.0, on_sleep=leader_restoring)
    beat(tmp_path, clock.now)
    monkeypatch.setattr(resume, "time", clock)
    point = resume.agree_on_resume(plan, tmp_path, leader=False)
    assert (point.step, clock.sleeps) == (40, 4)


def test_a_follower_stops_waiting_once_the_heartbeat_is_stale_and_says_what_node_0_was_doing(
    plan: JobPlan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(step_s=5.0)
    beat(tmp_path, clock.now)  # node 0's last beat, as this node begins to wait
    monkeypatch.setattr(resume, "time", clock)
    with pytest.raises(NodeError) as failed:
        resume.agree_on_resume(plan, tmp_path, leader=False)
    message = str(failed.value)
    assert "node 0 (gpu07, pid 4242) stopped its heartbeat 185 s ago" in message
    assert f"{DOWNLOADING} (12.0 of 250.0 GiB)" in message
    assert "node0.log" in message and clock.sleeps == 37


def test_an_earlier_jobs_stale_heartbeat_does_not_end_the_wait(
    plan: JobPlan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Job ids repeat on a new cluster: logs/<job id>/leader.json may be an earlier job's, long stale."""

    def leader_starts(clock: Clock) -> None:
        beat(tmp_path, clock.now)
        if clock.sleeps == 3:
            write_json_atomic(tmp_path / RESUME, {"checkpoint": None, "step": 0, "nonce": None})

    clock = Clock(step_s=30.0, on_sleep=leader_starts)
    beat(tmp_path, clock.now - 86_400)
    monkeypatch.setattr(resume, "time", clock)
    assert resume.agree_on_resume(plan, tmp_path, leader=False).step == 0


def test_a_follower_gives_up_when_node_0_never_beats(
    plan: JobPlan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(step_s=30.0)
    monkeypatch.setattr(resume, "time", clock)
    with pytest.raises(NodeError, match="node 0 has written no heartbeat"):
        resume.agree_on_resume(plan, tmp_path, leader=False)
    assert clock.sleeps == STALE_S // 30 + 1  # waited STALE_S, no more


@pytest.mark.parametrize(
    ("age_s", "waited_s", "alive"),
    [
        (0.0, 0.0, True),
        (STALE_S, 10_000.0, True),
        (STALE_S + 1, STALE_S + 1, False),
        (86_400.0, 0.0, True),  # an earlier job's beat: node 0 still has STALE_S to beat
        (86_400.0, STALE_S + 1, False),
        (None, STALE_S, True),
        (None, STALE_S + 1, False),
    ],
)
def test_leader_silence_is_a_function_of_the_heartbeats_age(
    tmp_path: Path, age_s: float | None, waited_s: float, alive: bool
) -> None:
    now = 1_800_000_000.0
    if age_s is not None:
        beat(tmp_path, now - age_s)
    assert (leader_silence(tmp_path / LEADER_BEAT, now, now - waited_s) is None) is alive


def test_the_leader_heartbeat_carries_the_downloads_bytes(tmp_path: Path) -> None:
    heart = LeaderBeat(tmp_path / "logs" / "1234" / LEADER_BEAT)
    heart.started(DOWNLOADING, 250 * GiB)
    for _ in range(3):
        heart.moved(4 * GiB)  # the download's threads report as their parts land
    heart.write()
    written = read_beat(heart.path)
    assert written is not None and describe(written) == f"{DOWNLOADING} (12.0 of 250.0 GiB)"
    heart.doing("choosing the resume point")
    assert json.loads(heart.path.read_text())["doing"] == "choosing the resume point"


def test_the_leader_beats_while_it_agrees_on_the_resume_point(plan: JobPlan, tmp_path: Path) -> None:
    attempt = tmp_path / "logs" / "1234"
    point = resume.agree_on_resume(replace(plan, run_dir=str(tmp_path)), attempt, leader=True)
    written = read_beat(attempt / LEADER_BEAT)
    assert point.checkpoint is None and written is not None
    assert written["doing"] == "choosing the resume point"
