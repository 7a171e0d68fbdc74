"""The SLURM seam (swiftslurm/slurm.py) with a scripted runner: the argv of every command, the bounded retry of
transient controller errors, the typed "job gone", and SLURM's time grammar. No SLURM command is started."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

import pytest

from swiftslurm import slurm
from swiftslurm.errors import ConfigError, JobGone, SlurmError, SlurmUnavailable
from swiftslurm.planning.validate import NO_TIME_LIMIT, parse_slurm_time

OK = slurm.Answer(0)
SOCKET_TIMED_OUT = slurm.Answer(
    1, stderr="squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation"
)
NO_CONTROLLER = slurm.Answer(1, stderr="sbatch: error: Batch job submission failed: Unable to contact slurm controller")
INVALID_JOB = slurm.Answer(1, stderr="slurm_load_jobs error: Invalid job id specified")


class Scripted:
    """A runner that gives the scripted answers in turn (the last one from then on; an exception is raised), and
    a clock that only the pauses and each command's ``takes_s`` (at most its timeout) move."""

    def __init__(self, *answers: slurm.Answer | Exception, takes_s: float = 0.0) -> None:
        self.answers = list(answers)
        self.takes_s = takes_s
        self.calls: list[list[str]] = []
        self.timeouts: list[float] = []
        self.pauses: list[float] = []
        self.now = 0.0

    def __call__(self, argv: Sequence[str], timeout_s: float) -> slurm.Answer:
        self.calls.append(list(argv))
        self.timeouts.append(timeout_s)
        self.now += min(self.takes_s, timeout_s)  # a command that takes longer is cut off at its timeout
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Scripted]:
    def install(*answers: slurm.Answer | Exception, takes_s: float = 0.0) -> Scripted:
        fake = Scripted(*answers, takes_s=takes_s)
        monkeypatch.setattr(slurm, "runner", fake)
        monkeypatch.setattr(slurm, "sleep", fake.sleep)
        monkeypatch.setattr(slurm, "clock", fake.clock)
        return fake

    return install


# --- every argv is built here ---------------------------------------------------------------------------------

ARGV = [
    (lambda: slurm.submit_batch(Path("/runs/a b/job.sbatch")), ["sbatch", "--parsable", "/runs/a b/job.sbatch"]),
    (lambda: slurm.job_times("7"), ["scontrol", "show", "job", "-o", "7"]),
    (lambda: slurm.job_start("7"), ["scontrol", "show", "job", "-o", "7"]),
    (lambda: slurm.job_alive("7"), ["squeue", "-h", "-j", "7", "-o", "%T"]),
    (lambda: slurm.queue_states(["7", "8"]), ["squeue", "-h", "-r", "-j", "7,8", "-o", "%i %T"]),
    (lambda: slurm.accounted_states(["7", "8"]), ["sacct", "-X", "-n", "-P", "-j", "7,8", "-o", "JobID,State"]),
    (
        lambda: slurm.job_runs(["7", "8"]),
        ["sacct", "-D", "-X", "-n", "-P", "-j", "7,8", "-o", "JobID,JobIDRaw,State,Submit,Start,End,AllocNodes"],
    ),
    (lambda: slurm.requeue("7"), ["scontrol", "requeue", "7"]),
    (
        lambda: slurm.update_job("7", {"ExcNodeList": "n1,n2", "StartTime": "now+30"}),
        ["scontrol", "update", "JobId=7", "ExcNodeList=n1,n2", "StartTime=now+30"],
    ),
    (lambda: slurm.update_job("7", {"ExcNodeList": ""}), ["scontrol", "update", "JobId=7", "ExcNodeList="]),
    (lambda: slurm.cancel(["7", "8"]), ["scancel", "7", "8"]),
    (lambda: slurm.cancel(["7", "8"], signal="USR2"), ["scancel", "--signal=USR2", "7", "8"]),
    (lambda: slurm.partitions(), ["sinfo", "-h", "-o", "%P"]),
    (lambda: slurm.node_states(["n1", "n2"]), ["scontrol", "show", "node", "-o", "n1,n2"]),
    (lambda: slurm.partition_size("debug"), ["sinfo", "-h", "-N", "-o", "%N %P"]),
    (lambda: slurm.partition_node_states("debug"), ["sinfo", "-h", "-N", "-o", "%N %P %T"]),
]


@pytest.mark.parametrize(("call", "argv"), ARGV, ids=[" ".join(argv[:3]) for _, argv in ARGV])
def test_each_question_asks_slurm_with_one_argv(
    call: Callable[[], object], argv: list[str], scripted: Callable[..., Scripted]
) -> None:
    fake = scripted(OK)
    call()
    assert fake.calls == [argv]


def test_answers_are_read_into_values(scripted: Callable[..., Scripted]) -> None:
    scripted(slurm.Answer(0, "4 RUNNING\n5 PENDING\n"))
    assert slurm.queue_states(["4", "5", "6"]) == {"4": "RUNNING", "5": "PENDING"}
    scripted(slurm.Answer(0, "4|COMPLETED\n5|CANCELLED by 0\n"))
    assert slurm.accounted_states(["4", "5"]) == {"4": "COMPLETED", "5": "CANCELLED"}
    scripted(slurm.Answer(0, "n1 debug* idle\nn2 debug* down*\nn3 gpu mixed\n"))
    assert slurm.partition_node_states(None) == {"n1": "idle", "n2": "down*"}
    scripted(slurm.Answer(0, "debug*\ngpu\n"))
    assert slurm.partitions() == {"debug", "gpu"}
    scripted(slurm.Answer(0, "4242;cluster\n"))
    assert slurm.submit_batch(Path("job.sbatch")) == "4242"


# --- transient controller errors: asked again, within bounds ----------------------------------------------------


def test_a_transient_error_is_asked_again_after_a_pause(scripted: Callable[..., Scripted]) -> None:
    fake = scripted(SOCKET_TIMED_OUT, slurm.Answer(0, "RUNNING\n"))
    assert slurm.job_alive("7") is True
    assert len(fake.calls) == 2 and fake.pauses == [slurm.RETRY.first_pause_s]


def test_a_controller_that_never_answers_is_asked_a_few_times_then_named(scripted: Callable[..., Scripted]) -> None:
    fake = scripted(SOCKET_TIMED_OUT)
    with pytest.raises(SlurmUnavailable) as err:
        slurm.job_alive("7")
    assert len(fake.calls) == slurm.RETRY.tries == err.value.tries == 3
    assert fake.pauses == [2.0, 4.0]  # back-off: doubled
    assert "`squeue -h -j 7 -o %T` failed (3 times in 6 s)" in str(err.value) and "Socket timed out" in str(err.value)
    assert "HINT" in str(err.value) and err.value.argv == ("squeue", "-h", "-j", "7", "-o", "%T")


def test_the_retries_end_within_their_time_budget(scripted: Callable[..., Scripted]) -> None:
    """Each try takes its whole timeout (slurmctld does not answer): the tries stop before the budget runs out,
    and no try may wait past it."""
    fake = scripted(TimeoutError("squeue did not answer"), takes_s=25.0)
    with pytest.raises(SlurmUnavailable, match="did not answer within"):
        slurm.run(["squeue"], slurm.Retry(timeout_s=25.0, tries=10, first_pause_s=2.0, budget_s=60.0))
    assert fake.timeouts == [25.0, 25.0, 4.0]  # 25 + 2 + 25 + 4: the third try gets what is left
    assert fake.now == 60.0 and fake.pauses == [2.0, 4.0]


def test_a_try_never_waits_past_the_budget(scripted: Callable[..., Scripted]) -> None:
    fake = scripted(SOCKET_TIMED_OUT, OK, takes_s=10.0)
    slurm.run(["sinfo"], slurm.Retry(timeout_s=30.0, tries=3, first_pause_s=2.0, budget_s=20.0))
    assert fake.timeouts == [20.0, 8.0]  # the second try gets what is left: 20 - 10 - 2


def test_a_failure_that_is_not_transient_is_not_asked_again(scripted: Callable[..., Scripted]) -> None:
    fake = scripted(slurm.Answer(1, stderr="scontrol: error: Invalid node name specified"))
    with pytest.raises(SlurmError, match="Invalid node name") as err:
        slurm.node_states(["nope"])
    assert len(fake.calls) == 1 and fake.pauses == [] and not isinstance(err.value, SlurmUnavailable)


def test_sbatch_is_asked_once_so_a_job_is_never_submitted_twice(scripted: Callable[..., Scripted]) -> None:
    fake = scripted(NO_CONTROLLER, slurm.Answer(0, "4242\n"))
    with pytest.raises(SlurmUnavailable, match="Unable to contact slurm controller"):
        slurm.submit_batch(Path("job.sbatch"))
    assert len(fake.calls) == 1


def test_a_retried_requeue_that_finds_the_job_pending_has_requeued_it(scripted: Callable[..., Scripted]) -> None:
    """The first try's answer was lost, but SLURM requeued the job: the second finds it pending again."""
    pending = slurm.Answer(1, stderr="Requested operation not supported on this job: Job is pending execution")
    fake = scripted(SOCKET_TIMED_OUT, pending)
    slurm.requeue("7")
    assert fake.calls == [["scontrol", "requeue", "7"]] * 2


def test_a_requeue_that_timed_out_here_is_asked_again_within_the_budget(scripted: Callable[..., Scripted]) -> None:
    """A mass preemption: slurmctld does not answer the first try at all; the second is accepted."""
    fake = scripted(TimeoutError("scontrol did not answer within 30 s"), OK)
    slurm.requeue("7")
    assert fake.calls == [["scontrol", "requeue", "7"]] * 2 and fake.pauses == [2.0]


def test_a_requeue_that_slurmctld_never_answers_fails_after_the_retries(scripted: Callable[..., Scripted]) -> None:
    fake = scripted(TimeoutError("scontrol did not answer within 30 s"), takes_s=30.0)
    with pytest.raises(SlurmUnavailable, match=r"`scontrol requeue 7` failed \(2 times in 60 s\)") as err:
        slurm.requeue("7")
    assert len(fake.calls) == err.value.tries == 2  # the 60 s budget: 30 s, a 2 s pause, the rest of it


def test_a_job_no_longer_pending_is_not_taken_for_requeued(scripted: Callable[..., Scripted]) -> None:
    scripted(slurm.Answer(1, stderr="scontrol: error: Job is no longer pending execution for job 7"))
    with pytest.raises(SlurmError, match="no longer pending"):
        slurm.requeue("7")


def test_a_job_between_states_is_asked_again(scripted: Callable[..., Scripted]) -> None:
    """SLURM's own words for a job it cannot change this moment (completing): "try again later"."""
    busy = slurm.Answer(1, stderr="Requeue of job 7 failed: Job can not be altered now, try again later")
    fake = scripted(busy, OK)
    slurm.requeue("7")
    assert len(fake.calls) == 2 and fake.pauses == [2.0]


def test_a_missing_command_says_where_swiftslurm_runs(scripted: Callable[..., Scripted]) -> None:
    fake = scripted(FileNotFoundError(2, "No such file or directory", "sinfo"))
    with pytest.raises(SlurmError, match=r"not on PATH: this machine is not a SLURM login node\. HINT"):
        slurm.partitions()
    assert len(fake.calls) == 1


# --- the controller does not know the job: one typed answer ---------------------------------------------------


def test_a_job_slurm_does_not_know_is_gone(scripted: Callable[..., Scripted]) -> None:
    fake = scripted(INVALID_JOB)
    assert slurm.job_alive("7") is False
    assert slurm.queue_states(["7"]) == {}
    with pytest.raises(JobGone, match="Invalid job id"):
        slurm.job_times("7")
    assert fake.pauses == []  # never asked again: it does not come back


@pytest.mark.parametrize("said", ["Invalid job id specified", "Job/step already completing or completed"])
def test_cancelling_a_job_that_has_ended_is_no_error(said: str, scripted: Callable[..., Scripted]) -> None:
    scripted(slurm.Answer(1, stderr=f"scancel: error: Kill job error on job id 7: {said}"))
    slurm.cancel(["7"])


def test_an_empty_queue_answer_is_a_job_that_left(scripted: Callable[..., Scripted]) -> None:
    scripted(slurm.Answer(0, ""))
    assert slurm.job_alive("7") is False


# --- the job's end: one read of scontrol ----------------------------------------------------------------------


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_a_preempted_job_ends_before_its_time_limit(scripted: Callable[..., Scripted]) -> None:
    fields = "JobId=7 StartTime=2026-12-01T08:00:00 EndTime=2026-12-01T08:30:00 TimeLimit=1-12:00:00"
    scripted(slurm.Answer(0, fields + "\n"))
    times = slurm.job_times("7")
    assert times.limit_ends == at("2026-12-01T08:00:00") + 36 * 3600
    assert times.kill_at == at("2026-12-01T08:30:00")


@pytest.mark.parametrize("limit", ["UNLIMITED", "Partition_Limit", "NONE"])
def test_a_job_without_a_limit_has_no_limit_end(limit: str, scripted: Callable[..., Scripted]) -> None:
    scripted(slurm.Answer(0, f"JobId=7 StartTime=2026-12-01T08:00:00 EndTime=Unknown TimeLimit={limit}\n"))
    assert slurm.job_times("7") == slurm.JobTimes(limit_ends=None, kill_at=None)


def test_a_pending_job_has_no_limit_end(scripted: Callable[..., Scripted]) -> None:
    scripted(slurm.Answer(0, "JobId=7 StartTime=Unknown EndTime=Unknown TimeLimit=00:10:00\n"))
    assert slurm.job_times("7").limit_ends is None


# --- SLURM's time grammar: one parser for cluster.time and scontrol's TimeLimit --------------------------------

SLURM_TIMES = [
    ("90", 90 * 60),  # MM: a bare number is minutes
    ("0", 0),
    ("30:30", 30 * 60 + 30),  # MM:SS
    ("30:00", 1800),
    ("4:00:00", 4 * 3600),  # HH:MM:SS
    ("00:02:00", 120),
    ("1-12", 36 * 3600),  # D-HH
    ("1-0", 86400),
    ("1-12:30", 36 * 3600 + 30 * 60),  # D-HH:MM
    ("2-00:00:01", 2 * 86400 + 1),  # D-HH:MM:SS
    ("2-03:04:05", 183845),
    ("1-00:00:00", 86400),
    (" 45 ", 45 * 60),
    ("UNLIMITED", None),
    ("unlimited", None),
    ("INFINITE", None),
    ("Infinite", None),
]


@pytest.mark.parametrize(("text", "seconds"), SLURM_TIMES)
def test_slurm_times_parse_as_slurm_reads_them(text: str, seconds: int | None) -> None:
    assert slurm.parse_time(text) == seconds


@pytest.mark.parametrize("text", ["", "1:2:3:4", "1-2:3:4:5", "-5", "1-", "4h", "1.5", "Partition_Limit"])
def test_what_is_not_a_slurm_time_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a SLURM time"):
        slurm.parse_time(text)


@pytest.mark.parametrize(("text", "seconds"), [(t, s) for t, s in SLURM_TIMES if s != 0])
def test_cluster_time_reads_the_same_grammar_in_whole_minutes(text: str, seconds: int | None) -> None:
    assert parse_slurm_time(text) == (NO_TIME_LIMIT if seconds is None else -(-seconds // 60))


def test_cluster_time_refuses_zero_and_nonsense_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"is zero\. HINT"):
        parse_slurm_time("0:00")
    with pytest.raises(ConfigError, match=r"is not a SLURM time limit\. HINT"):
        parse_slurm_time("4h")
