"""The wrapper's phase observers (swiftslurm/node/observers.py): files named in SWIFTSLURM_PHASE_OBSERVERS are
imported once and told of every phase an attempt enters, before it runs; a name that is no such file is refused
with the fix. In this process: the trainer is never started."""

from __future__ import annotations

import signal
from dataclasses import replace
from pathlib import Path

import pytest

from swiftslurm.errors import NodeError
from swiftslurm.node import attempt, observers
from swiftslurm.node.observers import OBSERVERS_ENV, PhaseEntered
from swiftslurm.slurm_env import SlurmEnv
from tests.conftest import plan_for

LOCAL = SlurmEnv.from_environ({})

# Writes each phase it is told of, with whether a stop signal had come; stops the run on entering PREPARE.
RECORDER = """
import signal
from pathlib import Path

LOG = Path({log!r})

def on_phase(event):
    with LOG.open("a") as log:
        log.write(f"{{event.phase}} {{event.attempt.startswith('local-')}} {{event.stopped()}}\\n")
    if event.phase == "prepare":
        signal.raise_signal(signal.SIGTERM)  # a person stops the run: a cancel, no trainer
"""


def observer_file(tmp_path: Path, source: str, name: str = "observer.py") -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path


def test_nothing_is_imported_unless_the_variable_names_files() -> None:
    assert observers.load({}) == [] and observers.load({OBSERVERS_ENV: ""}) == []


def test_each_named_file_is_imported_once_and_in_order(tmp_path: Path) -> None:
    one = observer_file(tmp_path, "COUNT = [0]\ndef on_phase(event):\n    COUNT[0] += 1\n", "one.py")
    (tmp_path / "other").mkdir()  # a file of the same name elsewhere stays a module of its own
    two = observer_file(tmp_path / "other", "def on_phase(event):\n    raise RuntimeError('two')\n", "one.py")
    environ = {OBSERVERS_ENV: f"{one}:{two}"}
    first, second = observers.load(environ)
    assert observers.load(environ) == [first, second]  # the same functions: each file imported once
    event = PhaseEntered("prepare", "a1", LOCAL, lambda: False)
    with pytest.raises(RuntimeError, match="two"):
        observers.notify([first, second], event)
    assert first.__globals__["COUNT"] == [1]


def test_a_name_that_is_no_file_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(NodeError, match=rf"names {tmp_path}/missing.py, which is not a Python file\. HINT: "):
        observers.load({OBSERVERS_ENV: str(tmp_path / "missing.py")})


def test_a_file_without_on_phase_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = observer_file(tmp_path, "def on_start(event):\n    pass\n")
    with pytest.raises(NodeError, match=r"defines no function `on_phase\(event\)`\. HINT: "):
        observers.load({OBSERVERS_ENV: str(path)})


def test_an_observer_is_told_every_phase_the_attempt_enters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "phases"
    monkeypatch.setenv(OBSERVERS_ENV, str(observer_file(tmp_path, RECORDER.format(log=str(log)))))
    monkeypatch.setattr(attempt, "train", lambda *_: pytest.fail("no trainer should start"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    plan = replace(plan_for(f"run_dir={run_dir}", "swift.max_steps=20", "swift.save_steps=10"), tiny_cache=None)

    result = attempt.run(run_dir, plan, LOCAL)

    assert result.decision == "stop"  # the TERM the observer sent: a cancel
    told = log.read_text().splitlines()
    assert told == ["prepare True False", "signalled True True", "conclude True True", "act True True"]


def test_the_signal_an_observer_waits_for_is_the_wrappers(tmp_path: Path) -> None:
    """What a holding observer (tests/cluster/hold_plugin.py) relies on: ``stopped`` turns true when a stop
    signal reaches the wrapper."""
    from swiftslurm.signals import SignalLog

    log = SignalLog()
    run_dir = tmp_path / "run"
    plan = plan_for(f"run_dir={run_dir}")
    a = attempt.Attempt(run_dir, plan, LOCAL, "a1", log)
    event = a.entering()
    with log.installed():
        assert (event.phase, event.stopped()) == ("prepare", False)
        signal.raise_signal(signal.SIGUSR2)
        assert event.stopped()


def test_the_cluster_tests_hold_loads_by_its_path_and_holds_only_the_first_leader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/cluster/hold_plugin.py as the wrapper loads it: by path, importing nothing of tests/."""
    from tests.cluster.hold_plugin import HOLD_MARKER, HOLD_PHASE, PLUGIN

    [hold] = observers.load({OBSERVERS_ENV: str(PLUGIN)})
    marker = tmp_path / "held"
    monkeypatch.setenv(HOLD_PHASE, "prepare")
    monkeypatch.setenv(HOLD_MARKER, str(marker))
    follower, requeued = replace(LOCAL, node_id=1, num_nodes=2), replace(LOCAL, restart_count=1)
    for phase, where in (("agree_on_resume", LOCAL), ("prepare", follower), ("prepare", requeued)):
        hold(PhaseEntered(phase, "7", where, lambda: pytest.fail("no hold here")))
    assert not marker.exists()
    hold(PhaseEntered("prepare", "7", LOCAL, lambda: True))
    assert marker.read_text().startswith("prepare ")


def test_a_phase_that_raises_leaves_the_run_failed_with_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wrapper dying before training wrote nothing: status said "job failed without a final record" and the
    next job closed the attempt as lost ("a node was lost, or the job was killed; requeued"). Node 0 records the
    attempt and the run as failed, with the error and the phase it came in."""
    from swiftslurm.rundir.records import read_attempts, read_status

    failing = "def on_phase(event):\n    if event.phase == 'agree_on_resume':\n        raise OSError(5, 'disk gone')\n"
    monkeypatch.setenv(OBSERVERS_ENV, str(observer_file(tmp_path, failing)))
    monkeypatch.setattr(attempt, "train", lambda *_: pytest.fail("no trainer should start"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    plan = replace(plan_for(f"run_dir={run_dir}", "swift.max_steps=20", "swift.save_steps=10"), tiny_cache=None)

    with pytest.raises(OSError, match="disk gone"):
        attempt.run(run_dir, plan, LOCAL)

    status = read_status(run_dir) or {}
    assert status.get("state") == "failed", status
    assert "failed in phase agree_on_resume of attempt local-" in status["why"] and "disk gone" in status["why"]
    [record] = read_attempts(run_dir)
    assert (record.reason, record.decision) == ("infra", "stop")
