"""A spare's heartbeat from a real wrapper process (docs/resilience.md "Hot spares"): standing by, it beats in its
attempt's dir under the name node 0 knows it by; killed with -9 (its node still up to SLURM), it beats no more,
and node 0, concluding a loss once that beat is STALE_S old, requeues rather than calling a dead spare in, and says
so. The unit tier (tests/unit/test_spares.py) tables the judgement; this is the wrapper's own loop, on disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from swiftslurm.node import conclude, decide
from swiftslurm.ops.runs import standing_spares
from swiftslurm.rundir import records
from swiftslurm.rundir.beat import STALE_S
from swiftslurm.rundir.jsonio import peek_json
from swiftslurm.rundir.layout import attempt_dir, spare_beat_file
from tests.unit.test_spares import HOSTS, spares_plan

# Node 2 of a job on n1, n2, n3 (2 training nodes, 1 spare): the spare's wrapper, as srun starts it.
SPARE = """
import sys
from pathlib import Path
from swiftslurm.node import attempt
from swiftslurm.plan import JobPlan
from swiftslurm.signals import SignalLog
from swiftslurm.slurm_env import JOB_RUN_ENV, SlurmEnv

hosts = sys.argv[3].split(",")
env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": ",".join(hosts), "SLURM_JOB_NUM_NODES": str(len(hosts)),
       "SLURM_NODEID": "2", "SLURM_PROCID": "2", "SLURM_NTASKS": str(len(hosts)), JOB_RUN_ENV: "77@1"}
attempt.run(Path(sys.argv[1]), JobPlan.load(Path(sys.argv[2])), SlurmEnv.from_environ(env), SignalLog())
"""


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def beat_at(path: Path) -> float | None:
    return (peek_json(path) or {}).get("updated")


def test_a_killed_spares_wrapper_beats_no_more_and_node_0_requeues_instead_of_calling_it_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    plan = replace(spares_plan(f"run_dir={run_dir}"), tiny_cache=None)
    plan_json = tmp_path / "plan.json"
    plan_json.write_text(plan.to_json())
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    argv = [sys.executable, "-c", SPARE, str(run_dir), str(plan_json), ",".join(HOSTS)]
    spare = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    here, started = attempt_dir(run_dir, "77"), time.time()
    beat = spare_beat_file(here, HOSTS[2])
    try:
        wait_for(lambda: beat_at(beat) is not None or spare.poll() is not None, 120, "the spare's first beat")
        first = beat_at(beat)
        assert first is not None, spare.communicate()[0]
        wait_for(lambda: beat_at(beat) != first or spare.poll() is not None, 60, "the spare's second beat")
        assert spare.poll() is None, spare.communicate()[0]
    finally:
        spare.send_signal(signal.SIGKILL)
        output = spare.communicate()[0]
    assert f"attempt 77: {HOSTS[2]} stands by as a spare" in output, output

    # Node 0 concludes that n2 is lost: first with the beat fresh, then once it is STALE_S old.
    monkeypatch.setattr(conclude.records, "silent_hosts", lambda *_: [HOSTS[1]])
    monkeypatch.setattr(conclude, "_node_states", lambda hosts: dict.fromkeys(hosts, "IDLE"))  # the node is up
    blamed = (HOSTS[1], f"SLURM reports {HOSTS[1]} as DOWN and it wrote no result")
    lost = decide.Decision(decide.Action.REQUEUE, decide.Reason.INFRA, "n2 lost; requeued")

    def conclusion() -> decide.Decision:
        found = conclude._allocation(here, HOSTS[:2], decide.Reason.INFRA, blamed, 0, HOSTS[2:], started)
        assert found is not None
        return decide.swap_in_spares(lost, found, decide.Budget())

    assert conclusion().roster == (HOSTS[0], HOSTS[2])  # just killed: its last beat is seconds old
    later = time.time() + STALE_S + 1
    monkeypatch.setattr(conclude, "time", SimpleNamespace(time=lambda: later))
    requeued = conclusion()
    assert requeued.action is decide.Action.REQUEUE, requeued
    assert f"spare not called in, its wrapper silent: {HOSTS[2]} for " in requeued.why, requeued.why

    # `status` says the same of the spare node 0 names in status.json.
    records.open_attempt(run_dir, records.AttemptRecord("77", "77", start=started))
    records.write_status(run_dir, "running", job_id="77", attempt="77", spares=[HOSTS[2]])
    [alive] = standing_spares(run_dir, "running", time.time())
    [silent] = standing_spares(run_dir, "running", later)
    assert (alive["alive"], silent["alive"]) == (True, False), (alive, silent)
