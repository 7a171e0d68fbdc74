"""The leader's account of an attempt with SLURM faked at its one seam (slurm_cli.runner): how a stop signal is
classified when `scontrol` cannot say the time limit, and when a host is blamed and excluded."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from swiftslurm import slurm as slurm_cli
from swiftslurm.ckpt.checkpoint import ResumePoint, commit
from swiftslurm.node import conclude as conclude_mod
from swiftslurm.node import decide
from swiftslurm.node import requeue as requeue_mod
from swiftslurm.node.decide import Action, Decision, Reason
from swiftslurm.node.watch import PEER_FAILED, Observed
from swiftslurm.plan import JobPlan
from swiftslurm.rundir import records
from swiftslurm.rundir.beat import ProgressWatch
from swiftslurm.rundir.layout import ATTEMPTS, CANCELLED, attempt_dir, node_log, node_result, progress_file
from swiftslurm.rundir.records import AttemptRecord
from swiftslurm.slurm_env import SlurmEnv
from tests.conftest import plan_for

HOSTS = ("node1", "node2")
ATTEMPT = "77.0"
USR2 = int(signal.SIGUSR2)
ILLEGAL_ACCESS = "RuntimeError: CUDA error: an illegal memory access was encountered\n"


SOCKET_TIMED_OUT = slurm_cli.Answer(1, stderr="slurm_load_jobs error: Socket timed out on send/recv operation")


class FakeSlurm:
    """Answers SLURM's commands (slurm_cli.runner) like SLURM would: the job's times, node states, the
    partition's nodes."""

    def __init__(self, end_in_s: float | None = 3600, node_state: str = "ALLOCATED", partition: int = 4) -> None:
        self.end_in_s = end_in_s  # None: `scontrol show job` fails
        self.job_failures_left = 10**6 if end_in_s is None else 0
        self.node_state = node_state
        self.partition = partition  # nodes in the partition; 0: sinfo fails
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], timeout_s: float) -> slurm_cli.Answer:
        self.calls.append(list(argv))
        if argv[:3] == ["scontrol", "show", "job"]:
            return self._job()
        if argv[:3] == ["scontrol", "show", "node"]:
            return slurm_cli.Answer(
                0,
                "\n".join(
                    f"NodeName={h} Arch=x86_64 State={self.node_state} Partitions=debug" for h in argv[4].split(",")
                ),
            )
        if argv[0] == "sinfo" and self.partition:
            return slurm_cli.Answer(0, "".join(f"gpu{i} debug*\n" for i in range(self.partition)))
        return SOCKET_TIMED_OUT

    def _job(self) -> slurm_cli.Answer:
        if self.job_failures_left > 0:
            self.job_failures_left -= 1
            return SOCKET_TIMED_OUT
        start = datetime.fromtimestamp(time.time() - 600).isoformat(timespec="seconds")
        limit = int(600 + (self.end_in_s or 0))
        limit_text = f"{limit // 3600:02d}:{limit % 3600 // 60:02d}:00"
        return slurm_cli.Answer(0, f"JobId=77 JobName=x StartTime={start} TimeLimit={limit_text}\n")

    def job_reads(self) -> int:
        return sum(argv[:3] == ["scontrol", "show", "job"] for argv in self.calls)


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    fake = FakeSlurm()
    monkeypatch.setattr(slurm_cli, "runner", fake)
    monkeypatch.setattr(slurm_cli, "sleep", lambda _s: None)
    monkeypatch.setattr(time, "sleep", lambda _s: None)
    monkeypatch.setattr(conclude_mod, "SILENT_HOST_WAIT_S", 0.0)
    monkeypatch.setattr(conclude_mod, "NODE_STATE_WAIT_S", 0.0, raising=False)
    return fake


def a_plan(tmp_path: Path) -> JobPlan:
    plan = plan_for("+cluster=local-slurm")
    return replace(plan, run_dir=str(tmp_path / "run"))


def conclude(
    tmp_path: Path,
    *,
    exit_code: int = 0,
    signals: list[tuple[int, float]] | None = None,
    results: tuple[int, ...] = (0,),
    restarts: int = 0,
    hang: dict[str, object] | None = None,
    ended_by: str | None = None,
    ended_at: float | None = None,
    stop: dict[str, object] | None = None,
    resume: ResumePoint | None = None,
    started_s_ago: float = 3600,
) -> Decision:
    """Node 0's wrapper concluding attempt 77.0 on two nodes; `results`: the nodes that wrote their result
        (with `exit_code`; a result written before leaves it); `restarts`: the restarts in place the allocation has
        made (5 spends the default budget: a requeue); `ended_by`, `ended_at`: why node 0's wrapper ended its trainer,
    and when it saw it exit (now by default); `resume`: where the attempt resumed (default: from scratch)."""
    plan = a_plan(tmp_path)
    run_dir = Path(plan.run_dir)
    here = attempt_dir(run_dir, ATTEMPT)
    here.mkdir(parents=True, exist_ok=True)
    plan.output_dir.mkdir(exist_ok=True)
    ended = time.time() if ended_at is None else ended_at
    for node in results:
        if not node_result(here, node).is_file():
            records.write_node_result(here, node, HOSTS[node], exit_code, ended, ended_by if node == 0 else None)
    where = SlurmEnv(job_id="77", hosts=HOSTS, node_id=0, num_nodes=2, proc_id=0, num_tasks=2)
    watch = ProgressWatch(progress_file(here), time.time())
    started = time.time() - started_s_ago
    observed = Observed(
        exit_code, signals or [], hang is not None, watch, started, ended, ended_by, hang=hang, stop=stop
    )
    return conclude_mod.conclude(plan, where, run_dir, ATTEMPT, resume or ResumePoint(None, 0), observed, restarts)


def recorded(tmp_path: Path) -> dict[str, object]:
    lines = (tmp_path / "run" / ATTEMPTS).read_text().splitlines()
    return dict(json.loads(lines[-1]))


def past_attempts(tmp_path: Path, *entries: dict[str, object]) -> None:
    (tmp_path / "run").mkdir(parents=True, exist_ok=True)
    for entry in entries:
        records.append_attempt(
            tmp_path / "run", AttemptRecord.from_dict({"progressed": False, "failed_host": None, **entry})
        )


# --- 7. a stop signal when scontrol cannot say the time limit ------------------------------------------------


def test_usr2_with_unreadable_time_limit_is_an_unknown_stop_not_a_preemption(tmp_path: Path, slurm: FakeSlurm) -> None:
    slurm.end_in_s, slurm.job_failures_left = None, 10**6
    decision = conclude(tmp_path, exit_code=0, signals=[(USR2, time.time())])
    assert (decision.reason.value, decision.action) == ("unknown_stop", Action.REQUEUE)
    assert "time limit could not be read after 3 tries" in decision.why and "Socket timed out" in decision.why
    assert "preemptions are unlimited" not in decision.why
    assert slurm.job_reads() >= 3
    assert "Socket timed out" in str(recorded(tmp_path)["end_time_error"])


def test_unknown_stops_stop_the_run_once_their_budget_is_spent(tmp_path: Path, slurm: FakeSlurm) -> None:
    slurm.end_in_s, slurm.job_failures_left = None, 10**6
    past_attempts(
        tmp_path, *[{"attempt": f"77.{i}", "reason": "unknown_stop", "decision": "requeue"} for i in range(5)]
    )
    decision = conclude(tmp_path, exit_code=0, signals=[(USR2, time.time())])
    assert decision.action is Action.STOP
    assert "resilience.max_unknown_stops" in decision.why


def test_a_time_limit_read_on_a_second_try_still_classifies_the_signal(tmp_path: Path, slurm: FakeSlurm) -> None:
    slurm.end_in_s, slurm.job_failures_left = 90, 1  # scontrol fails once, then says the limit is 90 s away
    decision = conclude(tmp_path, exit_code=0, signals=[(USR2, time.time())])
    assert (decision.reason.value, decision.action) == ("timed_out", Action.REQUEUE)
    assert recorded(tmp_path)["end_time_error"] is None


def test_the_record_says_which_step_was_agreed_and_which_deadline_was_used(tmp_path: Path, slurm: FakeSlurm) -> None:
    deadline = {"at": 1030.0, "basis": "slurm_end_time", "kill_at": 1060.0, "source": "scontrol"}
    conclude(tmp_path, exit_code=0, signals=[(USR2, time.time())], stop={"step": 12, "deadline": deadline})
    assert recorded(tmp_path)["stop"] == {"step": 12, "deadline": deadline}


# --- 8. blame needs positive evidence; exclusions expire and never make the job unschedulable -----------------


def test_a_host_without_a_result_that_slurm_reports_up_is_not_blamed(tmp_path: Path, slurm: FakeSlurm) -> None:
    slurm.node_state = "ALLOCATED"  # e.g. still inside a 30-minute collective timeout
    decision = conclude(tmp_path, exit_code=1, results=(0,))
    record = recorded(tmp_path)
    assert (decision.reason.value, decision.action) == ("infra", Action.REQUEUE)
    assert record["failed_host"] is None and decision.exclude_hosts == ()


@pytest.mark.parametrize("state", ["IDLE+NOT_RESPONDING", "DOWN+NOT_RESPONDING", "ALLOCATED+DRAIN", "FAIL"])
def test_a_host_without_a_result_that_slurm_reports_down_is_blamed_and_excluded(
    tmp_path: Path, slurm: FakeSlurm, state: str
) -> None:
    slurm.node_state = state
    decision = conclude(tmp_path, exit_code=1, results=(0,))
    record = recorded(tmp_path)
    assert record["failed_host"] == "node2" and decision.exclude_hosts == ("node2",)
    assert f"SLURM reports node2 as {state}" in str(record["failed_host_evidence"])


def test_a_host_whose_own_log_shows_a_gpu_fault_is_blamed(tmp_path: Path, slurm: FakeSlurm) -> None:
    here = attempt_dir(tmp_path / "run", ATTEMPT)
    here.mkdir(parents=True)
    node_log(here, 1).write_text("[rank1]: Traceback (most recent call last):\n[rank1]: " + ILLEGAL_ACCESS)
    node_log(here, 0).write_text("[rank0]: RuntimeError: Connection closed by peer [10.0.0.2]:29500\n")
    decision = conclude(tmp_path, exit_code=1, results=(0, 1))
    record = recorded(tmp_path)
    assert record["failed_host"] == "node2" and decision.exclude_hosts == ("node2",)
    assert "illegal memory access" in str(record["failed_host_evidence"])


def test_an_exclusion_expires(tmp_path: Path, slurm: FakeSlurm) -> None:
    seven_hours_ago = time.time() - 7 * 3600
    failed = {"reason": "infra", "decision": "requeue", "failed_host": "node9", "end": seven_hours_ago}
    past_attempts(tmp_path, {"attempt": "77.0x", **failed})
    decision = conclude(tmp_path, exit_code=1, results=(0, 1), restarts=5)
    assert decision.action is Action.REQUEUE and decision.exclude_hosts == ()


def test_a_recent_exclusion_is_kept(tmp_path: Path, slurm: FakeSlurm) -> None:
    failed = {"reason": "infra", "decision": "requeue", "failed_host": "node9", "end": time.time() - 600}
    past_attempts(tmp_path, {"attempt": "77.0x", **failed})
    decision = conclude(tmp_path, exit_code=1, results=(0, 1), restarts=5)
    assert decision.exclude_hosts == ("node9",)


@pytest.mark.parametrize("partition", [2, 0], ids=["no-spare-node", "sinfo-fails"])
def test_exclusions_never_leave_fewer_nodes_than_the_job_needs(
    tmp_path: Path, slurm: FakeSlurm, partition: int
) -> None:
    slurm.node_state, slurm.partition = "DOWN+NOT_RESPONDING", partition
    decision = conclude(tmp_path, exit_code=1, results=(0,))
    assert recorded(tmp_path)["failed_host"] == "node2"  # still named: a person reads it
    assert decision.action is Action.REQUEUE and decision.exclude_hosts == ()


def requeue_without_exclusions(tmp_path: Path, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signal, "signal", lambda *_: None)
    monkeypatch.setattr(slurm_cli, "run", lambda argv: slurm.calls.append(argv) or "")
    where = SlurmEnv(job_id="77", hosts=HOSTS, node_id=0, num_nodes=2, proc_id=0, num_tasks=2)
    with pytest.raises(requeue_mod.Requeued):
        requeue_mod.requeue(where, a_plan(tmp_path), Decision(Action.REQUEUE, conclude_mod.decide.Reason.INFRA, "x"))


def test_a_requeue_without_exclusions_clears_the_jobs_old_ones(
    tmp_path: Path, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    past_attempts(tmp_path, {"attempt": "77.0x", "reason": "infra", "decision": "requeue", "exclude_hosts": ["node9"]})
    requeue_without_exclusions(tmp_path, slurm, monkeypatch)
    assert ["scontrol", "update", "JobId=77", "ExcNodeList="] in slurm.calls


def test_a_requeue_of_a_run_that_never_excluded_a_host_asks_slurm_nothing_more(
    tmp_path: Path, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    past_attempts(tmp_path, {"attempt": "77.0x", "reason": "preempted", "decision": "requeue"})
    requeue_without_exclusions(tmp_path, slurm, monkeypatch)
    assert slurm.calls == [["scontrol", "requeue", "77"]]


def test_the_old_attempt_ends_as_soon_as_the_requeue_is_accepted(
    tmp_path: Path, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No hold until SLURM's KILL (KillWait): the process ends with 0 and no result for submitit to record
    (a SystemExit passes its `except Exception` around the job)."""

    def held(_s: float) -> None:
        raise AssertionError("the wrapper waits for SLURM to KILL it after the requeue")

    monkeypatch.setattr(time, "sleep", held)
    monkeypatch.setattr(signal, "signal", lambda *_: None)
    monkeypatch.setattr(slurm_cli, "run", lambda argv: slurm.calls.append(argv) or "")
    where = SlurmEnv(job_id="77", hosts=HOSTS, node_id=0, num_nodes=2, proc_id=0, num_tasks=2)
    with pytest.raises(SystemExit) as ended:
        requeue_mod.requeue(where, a_plan(tmp_path), Decision(Action.REQUEUE, conclude_mod.decide.Reason.INFRA, "x"))
    assert ended.value.code == 0 and not isinstance(ended.value, Exception)
    assert slurm.calls[0] == ["scontrol", "requeue", "77"]


# --- restart in place: only with every node alive -------------------------------------------------------------


def test_a_failure_with_every_node_alive_restarts_in_place(tmp_path: Path, slurm: FakeSlurm) -> None:
    decision = conclude(tmp_path, exit_code=1, results=(0, 1))
    assert (decision.action, decision.delay_s) == (Action.RESTART, 0)
    assert (recorded(tmp_path)["decision"], records.read_status(tmp_path / "run")["state"]) == ("restart", "restarting")  # type: ignore[index]


def test_a_node_without_a_result_is_not_alive_enough_to_restart_in_place(tmp_path: Path, slurm: FakeSlurm) -> None:
    """SLURM does not call node2 down (no blame, no exclusion), but its wrapper wrote nothing: requeue."""
    decision = conclude(tmp_path, exit_code=1, results=(0,))
    assert decision.action is Action.REQUEUE and decision.exclude_hosts == ()


def test_a_blamed_host_requeues_without_it(tmp_path: Path, slurm: FakeSlurm) -> None:
    here = attempt_dir(tmp_path / "run", ATTEMPT)
    here.mkdir(parents=True)
    node_log(here, 1).write_text("[rank1]: Traceback (most recent call last):\n[rank1]: " + ILLEGAL_ACCESS)
    decision = conclude(tmp_path, exit_code=1, results=(0, 1))
    assert decision.action is Action.REQUEUE and decision.exclude_hosts == ("node2",)


def test_a_stop_signal_requeues_even_with_every_node_alive(tmp_path: Path, slurm: FakeSlurm) -> None:
    decision = conclude(tmp_path, exit_code=0, signals=[(USR2, time.time())], results=(0, 1))
    assert decision.action is Action.REQUEUE


def test_a_hung_attempt_restarts_in_place_saying_its_window_and_where_the_stacks_are(
    tmp_path: Path, slurm: FakeSlurm
) -> None:
    hang = {"detected_at": 1.0, "step": 26, "stalled_s": 12.3, "window_s": 10.0, "basis": "5 × p95 of 20 step gaps"}
    hang |= {"stacks": "/runs/x/logs/77.0/stacks", "stacks_missing": [3]}
    decision = conclude(tmp_path, exit_code=-9, results=(0, 1), hang=hang)
    assert decision.action is Action.RESTART and decision.reason.value == "infra"
    record = recorded(tmp_path)
    assert record["hang"] == hang
    assert "no new step for 12 s after step 26 (window 10 s: 5 × p95 of 20 step gaps)" in decision.why
    assert "stacks in /runs/x/logs/77.0/stacks, none from ranks [3] (not started yet, or not answering)" in decision.why


# --- issue 25, item 16: the cause is the node whose trainer failed first, whichever node it is ---------------

OOM_ON_NODE_1 = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/opt/conda/lib/python3.11/site-packages/megatron/core/pipeline_parallel/schedules.py", line 401
[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total capacity of \
139.72 GiB of which 1.02 GiB is free.
"""


def a_failed_peer(tmp_path: Path, log: str, exited_s_ago: float = 2.0) -> Path:
    """Node 1 (host node2): its trainer failed by itself (exit 1), ``exited_s_ago``, with ``log``."""
    here = attempt_dir(tmp_path / "run", ATTEMPT)
    here.mkdir(parents=True)
    node_log(here, 1).write_text(log)
    records.write_node_result(here, 1, HOSTS[1], 1, time.time() - exited_s_ago)
    return here


def test_an_oom_on_another_node_is_the_attempts_cause_not_node_0s_kill(tmp_path: Path, slurm: FakeSlurm) -> None:
    """The last pipeline stage (node 1) ran out of GPU memory; node 0's wrapper then ended its own trainer
    (SIGKILL): that was classified as infrastructure and retried, four times."""
    here = a_failed_peer(tmp_path, OOM_ON_NODE_1)
    node_log(here, 0).write_text("{'loss': '2.1', 'global_step/max_steps': '3/100'}\n")
    decision = conclude(tmp_path, exit_code=-9, results=(0, 1), ended_by=PEER_FAILED)
    assert (decision.reason, decision.action) == (Reason.USER_ERROR, Action.STOP), decision.why
    assert "node 1 (node2) failed first: torch.OutOfMemoryError: CUDA out of memory" in decision.why
    assert "does not fit in GPU memory" in decision.why and "SIGKILL" not in decision.why
    assert recorded(tmp_path)["why"] == decision.why and recorded(tmp_path)["failed_host"] is None


def test_a_node_that_only_lost_its_peer_is_a_witness_even_when_it_exits_first(tmp_path: Path, slurm: FakeSlurm) -> None:
    here = a_failed_peer(tmp_path, OOM_ON_NODE_1, exited_s_ago=1.0)
    node_log(here, 0).write_text("[rank0]: RuntimeError: Connection closed by peer [10.0.0.2]:29500\n")
    decision = conclude(tmp_path, exit_code=1, results=(0, 1), ended_at=time.time() - 1.5)  # half a second earlier
    assert decision.reason is Reason.USER_ERROR and "node 1 (node2) failed first" in decision.why, decision.why


def test_node_0s_own_failure_is_named_when_it_came_first(tmp_path: Path, slurm: FakeSlurm) -> None:
    here = a_failed_peer(tmp_path, "[rank1]: RuntimeError: Connection closed by peer [10.0.0.1]:29500\n")
    node_log(here, 0).write_text("[rank0]: RuntimeError: NCCL error: unhandled system error, ncclSystemError\n")
    decision = conclude(tmp_path, exit_code=1, results=(0, 1))
    assert decision.reason is Reason.INFRA and "node 0 (node1) failed first: RuntimeError: NCCL error" in decision.why


def test_old_node_results_without_an_exit_time_still_read(tmp_path: Path) -> None:
    (tmp_path / "node1.json").write_text('{"node": 1, "host": "node2", "exit_code": 1}')
    assert records.read_node_result(tmp_path, 1) == records.TrainerEnd(1, "node2", 1)
    assert records.read_node_result(tmp_path, 2) is None


# --- issue 17, item 10: a cancel is not a preemption ------------------------------------------------------------


def test_a_swiftslurm_cancel_is_not_described_as_a_preemption(tmp_path: Path, slurm: FakeSlurm) -> None:
    """`swiftslurm cancel` sends USR2 (save first) long before the time limit: the attempt read "cancelled
    (swiftslurm cancel); preempted after 225 training steps"."""
    (tmp_path / "run").mkdir(parents=True)
    (tmp_path / "run" / CANCELLED).write_text("{}")
    decision = conclude(tmp_path, exit_code=0, signals=[(USR2, time.time())])
    assert (decision.reason.value, decision.action) == ("cancelled", Action.STOP)
    assert decision.why == "cancelled (swiftslurm cancel) before any training step"
    assert recorded(tmp_path)["why"] == decision.why


@pytest.mark.parametrize(
    ("reason", "explanation", "why"),
    [
        (
            Reason.PREEMPTED,
            "preempted after 225 training steps",
            "cancelled (swiftslurm cancel) after 225 training steps",
        ),
        (
            Reason.TIMED_OUT,
            "timed out after 225 training steps",
            "cancelled (swiftslurm cancel) after 225 training steps",
        ),
        (
            Reason.UNKNOWN_STOP,
            "unknown stop after 225 training steps (...)",
            "cancelled (swiftslurm cancel) after 225 training steps",
        ),
        (
            Reason.INFRA,
            "NCCL error (after 225 training steps)",
            "cancelled (swiftslurm cancel) after 225 training steps; NCCL error (after 225 training steps)",
        ),
    ],
)
def test_a_cancel_keeps_only_what_its_own_signal_did_not_cause(reason: Reason, explanation: str, why: str) -> None:
    decision = decide.cancelled("swiftslurm cancel", reason, explanation, 225)
    assert (decision.action, decision.reason, decision.why) == (Action.STOP, Reason.CANCELLED, why)


# --- issue 25: finished means the last step is committed; start-up errors; stops that never commit -----------

STALE_HANDLE = "[rank0]: Traceback (most recent call last):\n[rank0]: OSError: [Errno 116] Stale file handle\n"


def committed(tmp_path: Path, step: int, last_step: int = 20) -> Path:
    folder = tmp_path / "run" / "output" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    commit(folder, world_size=2, swift_version="4.6.0", last_step=last_step)
    return folder


def test_a_trainer_that_logged_its_summary_but_never_committed_its_last_step_has_not_finished(
    tmp_path: Path, slurm: FakeSlurm
) -> None:
    """Transformers logs the summary before on_train_end joins the last commit: a commit that hits ENOSPC, loses
    a peer or is killed leaves the summary behind, and exit code 0 before issue 25."""
    committed(tmp_path, 10)
    (tmp_path / "run" / "output" / "checkpoint-20").mkdir()  # saved, never committed
    summary = {"train_runtime": 30.2, "train_loss": 6.3, "global_step/max_steps": "20/20"}
    (tmp_path / "run" / "output" / "logging.jsonl").write_text(json.dumps(summary) + "\n")
    decision = conclude(tmp_path, exit_code=0, results=(0, 1), resume=ResumePoint(None, 0))
    assert decision.reason is Reason.INFRA and decision.action is Action.RESTART, decision.why
    assert records.read_status(tmp_path / "run")["state"] == "restarting"  # type: ignore[index]


@pytest.mark.parametrize(
    ("trained", "reason", "state"),
    [
        (None, Reason.USER_ERROR, "failed"),  # a new run: the input is wrong until shown otherwise
        ("resumed", Reason.INFRA, "requeued"),  # resumed after days of training: the same input worked
        ("logged-a-step", Reason.INFRA, "requeued"),  # an earlier attempt trained, committed nothing
    ],
)
def test_an_error_at_start_up_stops_only_a_run_that_never_trained(
    tmp_path: Path, slurm: FakeSlurm, trained: str | None, reason: Reason, state: str
) -> None:
    here = attempt_dir(tmp_path / "run", ATTEMPT)
    here.mkdir(parents=True)
    node_log(here, 0).write_text(STALE_HANDLE)
    resume = ResumePoint(committed(tmp_path, 10), 10) if trained == "resumed" else ResumePoint(None, 0)
    if trained == "logged-a-step":
        past_attempts(tmp_path, {"attempt": "76", "reason": "infra", "decision": "requeue", "first_step_at": 5.0})
    decision = conclude(tmp_path, exit_code=1, results=(0,), resume=resume, started_s_ago=40)
    assert decision.reason is reason, decision.why
    assert records.read_status(tmp_path / "run")["state"] == state  # type: ignore[index]


def test_stop_signals_that_never_let_a_checkpoint_commit_stop_the_run_and_status_says_why(
    tmp_path: Path, slurm: FakeSlurm
) -> None:
    stalled = {"reason": "preempted", "decision": "requeue", "progressed": False}
    past_attempts(tmp_path, *[{"attempt": f"77.r{i}", **stalled} for i in range(10)])
    decision = conclude(tmp_path, exit_code=0, signals=[(USR2, time.time())])
    assert (decision.reason, decision.action) == (Reason.PREEMPTED, Action.STOP)
    status = records.read_status(tmp_path / "run")
    assert status is not None and status["state"] == "failed"
    assert str(status["why"]).startswith("stopped: no progress: the last 11 attempts were ended by a stop signal")
    assert "cluster.signal_lead_s" in str(status["why"])


def test_a_stop_signal_that_let_the_run_commit_keeps_it_going(tmp_path: Path, slurm: FakeSlurm) -> None:
    stalled = {"reason": "preempted", "decision": "requeue", "progressed": False}
    past_attempts(tmp_path, *[{"attempt": f"77.r{i}", **stalled} for i in range(10)])
    committed(tmp_path, 10)  # the stop-save of this attempt
    decision = conclude(tmp_path, exit_code=0, signals=[(USR2, time.time())])
    assert decision.action is Action.REQUEUE


@pytest.mark.parametrize(
    ("pending", "action", "noted"),
    [
        ([10, 20], Action.DONE, True),  # the drain was cut (SLURM's end), or the store refused every try
        ([10], Action.DONE, False),  # the last one is in the store: a restore gets the result
        ([20], Action.REQUEUE, False),  # the next attempt uploads it
    ],
)
def test_a_finished_run_whose_last_checkpoint_is_not_uploaded_says_so(
    tmp_path: Path, pending: list[int], action: Action, noted: bool
) -> None:
    run_dir = tmp_path / "run"
    committed(tmp_path, 10), committed(tmp_path, 20)
    records.write_status(run_dir, "finished", why="training reached its last step; done")
    storage = {
        "url": "s3://b/runs/x/",
        "remote": [],
        "pending": pending,
        "last_failure": "upload of checkpoint-20 failed",
    }
    conclude_mod.record_uploads(
        run_dir, run_dir / "output", Decision(action, Reason.FINISHED, "training reached its last step; done"), storage
    )
    status = records.read_status(run_dir)
    assert status is not None and status["state"] == "finished" and status["storage"] == storage
    assert ("is not uploaded" in status["why"]) is noted, status["why"]
    if noted:
        assert status["why"] == (
            "training reached its last step; done, but checkpoint-20, the last, is not uploaded to s3://b/runs/x/ "
            f"(upload of checkpoint-20 failed); it is committed in {run_dir / 'output' / 'checkpoint-20'}. HINT: "
            f"`python -m swiftslurm.ops.storage_cli upload --run-dir {run_dir}` uploads it"
        )
