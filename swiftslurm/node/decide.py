"""What happens after an attempt ends: why it ended (`classify`), then finish, requeue or stop (`decide`).

An attempt is one run of the SLURM job; a requeued job keeps its id and starts the next attempt. The
wrapper on node 0 gathers `AttemptFacts`, classifies them, folds the result into `History` with
`history_after` and acts on `decide`. Everything here is pure: no clock, no files, no environment.
"""

from __future__ import annotations

import math
import re
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swiftslurm.rundir.records import AttemptRecord

RESUBMIT = "rerun your `python -m swiftslurm ...` command with the same run_dir (it resumes from the last checkpoint)"
OOM_HINT = (
    "HINT: lower `micro_batch_size`, add GPUs (`cluster.nodes`), "
    "or shard more (`strategy=zero3`, `strategy=zero3_offload`)"
)


class Reason(str, Enum):
    """Why an attempt ended."""

    FINISHED = "finished"  # a committed checkpoint of the last step exists (engine adapter: reached_last_step)
    PREEMPTED = "preempted"  # SLURM's signal (or a manual one) arrived well before the time limit
    TIMED_OUT = "timed_out"  # the signal arrived near the time limit
    UNKNOWN_STOP = "unknown_stop"  # a stop signal when SLURM could not say when the time limit ends
    INFRA = "infra"  # collective timeout, lost peer or node, killed process, hang: worth another attempt
    USER_ERROR = "user_error"  # bad input or a config that cannot fit: another attempt would fail the same way
    CANCELLED = "cancelled"  # scancel, Ctrl-C or `swiftslurm cancel`: a person stopped it
    DISK_FULL = "disk_full"  # a save did not fit on the disk: retried after a back-off, in case space comes back
    STRAGGLER = "straggler"  # node 0 stopped every trainer at a checkpoint to swap a straggler for a spare (swap.py)


class Action(str, Enum):
    DONE = "done"  # the run is complete
    REQUEUE = "requeue"  # start another attempt of the same job after Decision.delay_s
    RESTART = "restart"  # start the trainer again on the same nodes, inside the same allocation (no requeue)
    STOP = "stop"  # give up; Decision.why tells a person what to do


def classify_signal(now: float, end_time: float | None, lead_s: int, slack_s: int = 60) -> Reason:
    """TIMED_OUT when the stop signal is SLURM's time-limit warning (`--signal=USR2@lead_s`), else PREEMPTED.

    The default slack is 60 s because sbatch(1) says the signal "may be sent up to 60 seconds earlier than
    specified". Without an end time (not under SLURM, or no limit) a signal can only be a preemption.
    """
    if end_time is None:
        return Reason.PREEMPTED
    return Reason.TIMED_OUT if end_time - now <= lead_s + slack_s else Reason.PREEMPTED


@dataclass(frozen=True)
class SaveSpace:
    """The disk as the trainer left it, while its newest checkpoint was unfinished (no manifest)."""

    unfinished: str  # that checkpoint's path
    free_bytes: int  # free on its filesystem when the trainer ended
    needed_bytes: int  # what a checkpoint takes
    basis: str  # where that figure comes from: "the size of checkpoint-10", "the plan's estimate ..."

    def did_not_fit(self) -> bool:
        return self.free_bytes < self.needed_bytes

    def line(self) -> str:
        return (
            f"saving {self.unfinished} did not fit: {size_text(self.free_bytes)} free on its filesystem when the "
            f"trainer ended, a checkpoint needs about {size_text(self.needed_bytes)} ({self.basis})"
        )


def size_text(n: int) -> str:
    """Bytes for people: 0 B, 512 B, 3.4 kB, 270.0 MB, 1.2 GB (powers of 1000, as `df -H`)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class AttemptFacts:
    """What the wrapper on node 0 observed about one attempt."""

    exit_code: int  # the trainer's; negative: killed by that signal (-9 = SIGKILL)
    signal_reason: Reason | None  # classify_signal's verdict if a stop signal arrived, else None
    steps_done: int  # training steps logged in this attempt
    reached_last_step: bool
    hung: bool  # our progress watchdog fired
    log_tail: str  # the last ~200 lines of this node's training log
    elapsed_s: float
    failed_host: str | None  # a host with positive evidence of failing (see `blame`), if any
    unrestored: str | None = None  # why no trainer started: the object store could not be read (node/resume.py)
    # The run trained before this attempt: it resumed from a committed checkpoint, or an earlier attempt logged a
    # step. Then the same input has worked, and an error at start-up is the machine's, not the user's.
    trained_before: bool = False
    save_space: SaveSpace | None = None  # the trainer ended with its newest checkpoint unfinished
    restored_from: str | None = None  # the resume point was downloaded from object storage (s3://.../checkpoint-N)
    straggler: str | None = None  # node 0 stopped the attempt to swap a straggler for a spare: who (node/swap.py)


# Matched against single log lines, as the libraries print them (case-sensitive).
_CUDA_OOM = re.compile(r"torch\.(?:cuda\.)?OutOfMemoryError|CUDA out of memory")
_INFRA = re.compile(
    "|".join(
        (
            r"NCCL error|ncclSystemError|ncclRemoteError|NCCL communicator was aborted",
            r"Watchdog caught collective operation timeout|ProcessGroupNCCL",
            r"Connection closed by peer|Connection reset by peer|Gloo connectFullMesh failed",
            r"\[\.\./third_party/gloo|ProcessGroupGloo",
            r"DistStoreError|RendezvousTimeoutError|TCPStore|Socket Timeout",
            r"CUDA error: an illegal memory access|CUDA error: unspecified launch failure|ECC error|\bXid\b",
            r"\bKilled\b|oom[-_]kill",
        )
    )
)
# A fault of the host's own GPU or driver, as opposed to a peer's symptom (a lost connection, a collective
# timeout), which is how every healthy node reports a failure elsewhere.
_DEVICE_FAULT = re.compile(
    r"CUDA error: an illegal memory access|CUDA error: unspecified launch failure|ECC error|\bXid\b"
)
# How a healthy node reports a failure elsewhere: its connections to the peer that died break, its collectives
# time out or are aborted. A node whose earliest failure is one of these is a witness, not the cause.
_PEER_SYMPTOM = re.compile(
    r"Connection closed by peer|Connection reset by peer|Gloo connectFullMesh failed|ncclRemoteError"
    r"|NCCL communicator was aborted|Watchdog caught collective operation timeout|remote process exited"
    r"|DistStoreError|Socket Timeout"
)
# SLURM node states (`scontrol show node`, `sinfo %T`) that say the node itself is at fault. DRAIN is set by
# an admin or a health check; a node merely allocated, idle or completing proves nothing.
_NODE_DOWN = frozenset({"DOWN", "NOT_RESPONDING", "FAIL", "FAILING", "DRAIN", "DRAINING", "DRAINED"})
# torchrun reports a child killed by a signal as "exitcode  : -9 (pid: 1234)" and
# "traceback : Signal 9 (SIGKILL) received by PID 1234".
_TORCHRUN_KILLED = re.compile(r"exitcode\s*:\s*-(\d+)|Signal (\d+) \(SIG\w+\) received by PID")
# torchrun prefixes worker lines: "[rank0]: Traceback ...", "[rank0]:   File ...", "[rank0]:[W110 ...".
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]: ?")
# torch's info/warning lines ("[W110 12:00:00.1 ProcessGroupNCCL.cpp:1168] Warning: ...", "W0110 ...",
# "[W socket.cpp:...]") and NCCL's INFO lines: normal runs print these too (a process group destructor
# warning at every exit, store connection retries at start-up), so they prove nothing.
_CHATTER = re.compile(r"^(?:\[?[IWD]\d{3,4}\s|\[[IWD]\s)|\bNCCL INFO\b")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?::.*)?$")
_WRAPPER_EXCEPTION = re.compile(r"ChildFailedError|CalledProcessError")  # torchrun/swift reporting a child
_USAGE_ERROR = re.compile(r"^[\w.\-]+: error: .+")  # argparse: "swift: error: unrecognized arguments: --lr"


@dataclass(frozen=True)
class LogFailure:
    kind: str  # "infra", "cuda_oom" or "exception"
    line: str


def one_line(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def evidence_lines(log_tail: str) -> list[str]:
    """Lines that can show a failure. Indented ones are traceback frames: `store = TCPStore(...)` is no failure."""
    lines = (_RANK_PREFIX.sub("", raw).rstrip() for raw in log_tail.splitlines())
    return [line for line in lines if line and not line[0].isspace() and not _CHATTER.search(line)]


def first_log_failure(log_tail: str) -> LogFailure | None:
    """The earliest failure in the log, which is taken as the root cause.

    Earliest, because one rank's error makes its peers fail next: a FileNotFoundError on rank 0 is
    followed by "Connection closed by peer" on rank 1, and that attempt is a user error, not infrastructure.
    """
    awaiting_exception = False
    for line in evidence_lines(log_tail):
        if _CUDA_OOM.search(line):
            return LogFailure("cuda_oom", line)
        if _INFRA.search(line):
            return LogFailure("infra", line)
        if line.startswith("Traceback (most recent call last)"):
            awaiting_exception = True
        elif awaiting_exception and _EXCEPTION.match(line):
            awaiting_exception = False
            if not _WRAPPER_EXCEPTION.search(line):
                return LogFailure("exception", line)
        elif _USAGE_ERROR.match(line):
            return LogFailure("exception", line)
    return None


@dataclass(frozen=True)
class NodeEnd:
    """How one node's trainer ended (its wrapper's result) and the last lines of its log."""

    node: int
    host: str
    exit_code: int
    ended_at: float | None  # when its wrapper saw it exit (the wrappers' clocks agree to well under a second)
    ended_by_wrapper: bool  # its own wrapper ended it: another node's trainer failed, the run hung, a stop
    log_tail: str

    def named(self) -> str:
        return f"node {self.node} ({self.host})" if self.host else f"node {self.node}"


def first_failure(ends: Iterable[NodeEnd]) -> NodeEnd | None:
    """The node whose trainer failed first: the attempt's root cause, whose log and exit code are classified.

    A trainer its own wrapper ended (because another node's failed, or the run hung) did not fail by itself,
    so it is never the one. Of the others, a node whose earliest log failure is its own comes before one whose
    log shows only a peer's symptom (a lost connection, a collective time-out: how every healthy node reports a
    failure elsewhere, often within the same second), then the earliest to exit. None: no trainer failed."""
    failed = [end for end in ends if end.exit_code != 0 and not end.ended_by_wrapper]
    return min(failed, key=lambda e: (peer_symptom(e.log_tail), _or_inf(e.ended_at), e.node), default=None)


def peer_symptom(log_tail: str) -> bool:
    """Whether the earliest failure in the log is how a node sees another fail (_PEER_SYMPTOM)."""
    failure = first_log_failure(log_tail)
    return failure is not None and bool(_PEER_SYMPTOM.search(failure.line))


def _or_inf(value: float | None) -> float:
    return math.inf if value is None else value


def own_fault(log_tail: str) -> str | None:
    """The host's own GPU or driver fault in its log (the first one), or None."""
    return next((one_line(line) for line in evidence_lines(log_tail) if _DEVICE_FAULT.search(line)), None)


def node_down(state: str) -> bool:
    """Whether a SLURM node state ("IDLE+NOT_RESPONDING", "down*", "ALLOCATED+DRAIN") blames the node."""
    flags = state.upper().split("+")
    return state.endswith("*") or any(flag.rstrip("*") in _NODE_DOWN for flag in flags)


def blame(silent: Mapping[str, str], own_faults: Mapping[str, str]) -> tuple[str, str] | None:
    """The failing host and the evidence against it, or None. A host is blamed on positive evidence only: SLURM
    says a host that wrote no result is down (`silent`: host -> SLURM's state of it), or a host's own log shows
    a fault of its GPU (`own_faults`: host -> that line). A missing result alone is no evidence: a peer still
    inside a collective timeout, or a shared file system's attribute cache, looks the same."""
    for host, state in silent.items():
        if node_down(state):
            return host, f"SLURM reports {host} as {state} and it wrote no result"
    for host, line in own_faults.items():
        return host, f"{host}'s own log: {line}"
    return None


def signal_in_exit_code(exit_code: int) -> int | None:
    """The signal that an exit code reports: -N (Popen), 128+N (a shell), or 256-N.

    256-N because `swift` ends with `sys.exit(child.returncode)`: a child killed by SIGKILL (-9) makes
    swift exit with 247. 255 stays an ordinary error: it is also `exit(-1)`.
    """
    if exit_code < 0:
        return -exit_code
    if 128 < exit_code <= 128 + 64:
        return exit_code - 128
    if 192 < exit_code < 255:
        return 256 - exit_code
    return None


def killing_signal(exit_code: int, log_tail: str) -> str | None:
    """How the trainer was killed by a signal, from its exit code or from torchrun's report of a worker."""
    names = {s.value: s.name for s in signal.Signals}
    if (number := signal_in_exit_code(exit_code)) is not None:
        return f"{names.get(number, f'signal {number}')} (exit code {exit_code})"
    if match := _TORCHRUN_KILLED.search(log_tail):
        number = int(match.group(1) or match.group(2))
        return f"{names.get(number, f'signal {number}')} (torchrun: a training process died of it)"
    return None


def steps_phrase(steps_done: int) -> str:
    return "before any training step" if steps_done == 0 else f"after {steps_done} training steps"


def classify(facts: AttemptFacts, user_error_window_s: float = 300) -> tuple[Reason, str]:
    """Why the attempt ended, and one line for humans. The rules are tried in order; the first match wins."""
    steps = steps_phrase(facts.steps_done)
    if facts.reached_last_step:  # committed at its last step: a kill or crash after that loses nothing
        if facts.steps_done == 0 and facts.restored_from:
            return (
                Reason.FINISHED,
                f"nothing left to train: its last step was restored from {facts.restored_from}",
            )
        return Reason.FINISHED, f"training reached its last step ({facts.steps_done} steps this attempt)"
    if facts.save_space is not None and facts.save_space.did_not_fit():  # whatever ended the trainer after
        return Reason.DISK_FULL, facts.save_space.line()
    if facts.signal_reason is not None:  # saving and exiting after the signal is normal, whatever the exit code
        return facts.signal_reason, f"{facts.signal_reason.value.replace('_', ' ')} {steps}"
    if facts.straggler is not None:  # the trainers were ended once the stop checkpoint was committed
        return Reason.STRAGGLER, f"{facts.straggler}; stopped at a checkpoint {steps}"
    if facts.unrestored is not None:  # an outage, not the input: retried with back-off like any infra failure
        return infra(facts, f"no trainer started: {facts.unrestored}")
    if facts.hung:
        return infra(facts, f"no training step logged within the progress watchdog's limit ({steps})")
    killed = killing_signal(facts.exit_code, facts.log_tail)
    if killed:
        return infra(facts, f"trainer killed by {killed} {steps}")
    return classify_log(facts, user_error_window_s)


def classify_log(facts: AttemptFacts, user_error_window_s: float) -> tuple[Reason, str]:
    """The part of `classify` that reads the log, for an attempt that ended on its own and was not killed."""
    steps = steps_phrase(facts.steps_done)
    failure = first_log_failure(facts.log_tail)
    if failure is None:
        if facts.exit_code == 0:
            return infra(facts, f"trainer stopped early without a signal (exit code 0 {steps})")
        return infra(facts, f"trainer exited with code {facts.exit_code} {steps}; no known error in the log")
    line = one_line(failure.line)
    if failure.kind == "infra":
        return infra(facts, f"{line} ({steps})")
    if failure.kind == "cuda_oom":  # the same batch on the same GPUs runs out of memory again
        short = one_line(failure.line, limit=100)
        return Reason.USER_ERROR, f"{short} ({steps}): the config does not fit in GPU memory. {OOM_HINT}"
    if facts.steps_done == 0 and facts.elapsed_s < user_error_window_s and not facts.trained_before:
        return Reason.USER_ERROR, f"{line} ({steps})"
    # After training started (in this attempt or an earlier one), or after a long start-up, the same input
    # worked: more likely the machine (a stale file handle, the hub unreachable).
    trained = "; the run trained before" if facts.trained_before and facts.steps_done == 0 else ""
    return infra(facts, f"{line} ({steps}, {facts.elapsed_s:.0f}s in{trained})")


def infra(facts: AttemptFacts, explanation: str) -> tuple[Reason, str]:
    host = f" [failing host: {facts.failed_host}]" if facts.failed_host else ""
    return Reason.INFRA, explanation + host


@dataclass(frozen=True)
class Budget:
    """How much retrying a run may do (the node side's copy of the run's configuration)."""

    max_attempts: int = 50  # ceiling for attempts of every reason but PREEMPTED (preemptions are unlimited)
    max_timeouts: int = 20  # time-outs that are requeued; one more stops the run
    max_unknown_stops: int = 5  # stop signals of unknown cause (SLURM could not say the end time) requeued
    max_consecutive_failures: int = 3  # INFRA attempts in a row without a new checkpoint that are requeued
    max_stops_without_progress: int = 10  # stop signals in a row whose attempt committed nothing, requeued
    backoff_base_s: float = 30  # wait after the first infrastructure failure; doubles with each one in a row
    backoff_max_s: float = 600
    exclude_host_s: float = 21600  # how long a failed host stays excluded, in seconds
    max_restarts: int = 5  # in-place restarts in one allocation; the failure after them is requeued


@dataclass(frozen=True)
class History:
    """Counts over the run's attempts so far, the one just ended included."""

    attempts: int
    timeouts: int
    consecutive_failures: int  # INFRA attempts in a row; 0 after any attempt that committed a checkpoint or finished
    failed_hosts: tuple[tuple[str, float], ...] = ()  # (host, when it last failed), oldest failure first
    preemptions: int = 0  # not counted against Budget.max_attempts
    unknown_stops: int = 0
    # Attempts in a row that a stop signal ended (SIGNAL_REASONS) without a new committed checkpoint; 0 after
    # any attempt that committed one or finished. Other attempts without progress neither add nor clear it.
    stops_without_progress: int = 0


def history_after(
    previous: History | None,
    reason: Reason,
    committed_new_checkpoint: bool,
    failed_host: str | None,
    at: float = 0.0,
    slow_hosts: Iterable[str] = (),
) -> History:
    """`previous` with the attempt that just ended (at `at`, seconds since the epoch) added (None before the
    first attempt). `slow_hosts`: stragglers the run excludes (resilience.straggler_action=exclude) or swapped
    out (swap), avoided as failed hosts are."""
    before = previous or History(attempts=0, timeouts=0, consecutive_failures=0)
    hosts = before.failed_hosts
    for host in (*slow_hosts, *([failed_host] if failed_host else [])):
        # a host that fails again moves to the end with its new time
        hosts = (*((h, t) for h, t in hosts if h != host), (host, at))
    return History(
        attempts=before.attempts + 1,
        timeouts=before.timeouts + (reason is Reason.TIMED_OUT),
        consecutive_failures=failures_after(before.consecutive_failures, reason, committed_new_checkpoint),
        failed_hosts=hosts,
        preemptions=before.preemptions + (reason is Reason.PREEMPTED),
        unknown_stops=before.unknown_stops + (reason is Reason.UNKNOWN_STOP),
        stops_without_progress=stops_after(before.stops_without_progress, reason, committed_new_checkpoint),
    )


def history_of(attempts: Iterable[AttemptRecord]) -> History | None:
    """The history of recorded attempts (attempts.jsonl). An attempt that was stopped ends that history: if
    the run has attempts after it, a person resubmitted it (`swiftslurm resume`, the same command again) after
    fixing what stopped it, so the counts start over. The hosts that failed stay known."""
    history: History | None = None
    for record in attempts:
        at = record.end or record.start or 0.0
        slow = [str(s["host"]) for s in record.stragglers if (s.get("exclude") or s.get("swap")) and s.get("host")]
        history = history_after(history, Reason(record.reason), bool(record.progressed), record.failed_host, at, slow)
        if record.decision == Action.STOP.value:
            history = History(attempts=0, timeouts=0, consecutive_failures=0, failed_hosts=history.failed_hosts)
    return history


def failures_after(previous: int, reason: Reason, committed_new_checkpoint: bool) -> int:
    """Progress resets the count; a preemption or time-out without progress neither adds to it nor clears it."""
    if committed_new_checkpoint or reason is Reason.FINISHED:
        return 0
    return previous + 1 if reason in (Reason.INFRA, Reason.DISK_FULL) else previous


def stops_after(previous: int, reason: Reason, committed_new_checkpoint: bool) -> int:
    """Progress resets the count; a stop signal without progress adds to it; anything else leaves it."""
    if committed_new_checkpoint or reason is Reason.FINISHED:
        return 0
    return previous + 1 if reason in SIGNAL_REASONS else previous


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: Reason
    why: str  # one line for humans: what happened and what happens next
    delay_s: float = 0
    exclude_hosts: tuple[str, ...] = ()
    nodes: int | None = None  # the node count the requeued job asks for; None: leave the job's as it is
    # A restart onto spares: the next attempt's training hosts in node-rank order, and the spares left after it.
    roster: tuple[str, ...] = ()
    spares: tuple[str, ...] = ()


def nodes_for_next(planned: int, min_nodes: int, usable: int | None) -> int:
    """How many nodes the next attempt asks for when the run may shrink (`resilience.min_nodes`): the planned
    count when the partition has that many usable nodes (back to full size as soon as they are there), else
    as many as it has, never fewer than `min_nodes` (the job then waits for nodes to come back). `usable`:
    the partition's nodes that SLURM does not report down or drained and the job does not exclude; None
    (SLURM could not say): the planned count, as without `min_nodes`."""
    if usable is None:
        return planned
    return max(min_nodes, min(planned, usable))


def with_node_count(
    decision: Decision, planned: int, min_nodes: int, healthy: Iterable[str] | None, excluded: Iterable[str]
) -> Decision:
    """A requeue with the node count its next attempt asks for (see `nodes_for_next`). `healthy`: the
    partition's nodes SLURM does not report down or drained (None: unknown); `excluded`: the hosts the job
    avoids (the cluster config's and the decision's). Other actions stand as they are."""
    if decision.action is not Action.REQUEUE:
        return decision
    usable = None if healthy is None else len(set(healthy) - set(excluded))
    nodes = nodes_for_next(planned, min_nodes, usable)
    if nodes == planned:
        return replace(decision, nodes=nodes)
    shape = (
        f"on {nodes} of {planned} nodes: the partition has {usable} usable (resilience.min_nodes={min_nodes}"
        f"{', so it waits for nodes to come back' if usable is not None and usable < nodes else ''}); the global "
        f"batch stays, gradient accumulation grows; the next requeue asks for {planned} again"
    )
    return replace(decision, nodes=nodes, why=f"{decision.why}; {shape}")


# What a stop signal alone makes of an attempt; under a cancel, that signal is the cancel's own (it sends USR2 so
# the run saves first), so none of them describes what happened.
SIGNAL_REASONS = frozenset({Reason.PREEMPTED, Reason.TIMED_OUT, Reason.UNKNOWN_STOP})


def cancelled(how: str, reason: Reason, explanation: str, steps_done: int) -> Decision:
    """A person stopped the run (`how`: "swiftslurm cancel", "TERM/INT"): never requeued. `reason` and
    `explanation` are what `classify` made of the attempt: kept when they tell something besides the cancel
    (a failure in the log), dropped when they only describe the cancel's own stop signal."""
    why = f"cancelled ({how}) {steps_phrase(steps_done)}"
    if reason not in SIGNAL_REASONS:
        why = f"{why}; {explanation}"
    return Decision(Action.STOP, Reason.CANCELLED, why)


def exclusions(history: History, budget: Budget, now: float, spare_nodes: int) -> tuple[str, ...]:
    """The hosts the next attempt avoids: those that failed within `budget.exclude_host_s` before `now`, the
    most recent first, at most `spare_nodes` of them (the nodes the partition has beyond what the job needs
    and what the cluster config excludes already), so that excluding never makes the job unschedulable."""
    fresh = [host for host, at in reversed(history.failed_hosts) if now - at < budget.exclude_host_s]
    return tuple(sorted(fresh[: max(0, spare_nodes)]))


@dataclass(frozen=True)
class Allocation:
    """The allocation the attempt ran in, as node 0 sees it once the attempt ended."""

    all_alive: bool  # every node's wrapper wrote its result and no host is blamed (see `blame`)
    restarts: int = 0  # in-place restarts already made in this allocation
    roster: tuple[str, ...] = ()  # the attempt's training hosts, in node-rank order (roster[0]: node 0)
    spares: tuple[str, ...] = ()  # the hosts standing by (`resilience.spare_nodes`) that have not trained yet
    lost: tuple[str, ...] = ()  # training hosts lost with evidence (`blame`); every other one wrote its result
    # Spares never called in: (host, seconds its wrapper has not beaten), from `live_spares`; still left after.
    silent_spares: tuple[tuple[str, float], ...] = ()


def live_spares(
    spares: tuple[str, ...], silences: Mapping[str, float], stale_s: float
) -> tuple[tuple[str, ...], tuple[tuple[str, float], ...]]:
    """The spares whose wrapper beat within ``stale_s`` (in their order), and the others with their silence: SLURM
    reports a node up whatever became of the wrapper on it, and a spare without one would fail the restart it was
    called into. ``silences``: seconds since each spare's last beat; a spare it does not name counts as live."""
    live = tuple(host for host in spares if silences.get(host, 0.0) <= stale_s)
    return live, tuple((host, silences[host]) for host in spares if host not in live)


# Reasons that may restart in place: a crash, a NCCL error, a hang (classified INFRA). A stop signal means
# SLURM wants the nodes back (requeue); a user error fails the same way again.
RESTARTABLE = frozenset({Reason.INFRA})
# Reasons that may restart in place onto spares: a lost node, and a straggler node 0 stopped the attempt to swap
# out (straggler_action=swap), whose whole point is the restart on a spare.
SWAPPABLE = RESTARTABLE | {Reason.STRAGGLER}


def decide(
    reason: Reason,
    explanation: str,
    history: History,
    budget: Budget,
    now: float = 0.0,
    spare_nodes: int = 0,
    allocation: Allocation | None = None,
) -> Decision:
    """Finish, restart in place, requeue or stop after an attempt ended for `reason` (see `classify`). `now`
    and `spare_nodes` bound the exclusions (see `exclusions`); without them nothing is excluded. Without
    `allocation` (nothing known about the nodes) nothing restarts in place."""
    exclude = exclusions(history, budget, now, spare_nodes)
    decision = decide_by_reason(reason, explanation, history, budget, exclude)
    counted = history.attempts - history.preemptions
    if decision.action is Action.REQUEUE and reason is not Reason.PREEMPTED and counted >= budget.max_attempts:
        why = (
            f"{explanation}; stopped: ceiling of {budget.max_attempts} attempts reached (preemptions not counted); "
            f"if the run still makes progress, raise `resilience.max_attempts` and {RESUBMIT}"
        )
        return Decision(Action.STOP, reason, why)
    if allocation is None:
        return decision
    if allocation.lost:  # a training node is gone: only a spare can take its place inside this allocation
        return swap_in_spares(decision, allocation, budget)
    return restart_in_place(decision, allocation, budget)


def next_roster(roster: tuple[str, ...], lost: tuple[str, ...], spares: tuple[str, ...]) -> tuple[str, ...] | None:
    """The roster with each lost host replaced, in its place, by the next spare (the survivors keep their node
    ranks, the spare takes the lost one's: its data shard and random state); None when the spares do not
    cover the loss or node 0 is lost (it leads: without it the job is gone anyway)."""
    if not roster or roster[0] in lost or len(spares) < sum(host in lost for host in roster):
        return None
    standing = iter(spares)
    return tuple(next(standing) if host in lost else host for host in roster)


def swap_in_spares(decision: Decision, allocation: Allocation, budget: Budget) -> Decision:
    """A requeue after a lost training node (or a straggler swapped out: `lost` names it) turned into a restart in
    place onto spares, at the same world size, when that is safe: the reason is SWAPPABLE, every other training
    node wrote its result, spares cover the loss, node 0 is not lost, and the allocation's restart budget is not
    spent. Otherwise the decision stands (a requeue, with the lost host excluded; or fewer nodes with
    `resilience.min_nodes`)."""
    if decision.action is not Action.REQUEUE or decision.reason not in SWAPPABLE:
        return decision
    roster = next_roster(allocation.roster, allocation.lost, allocation.spares)
    silent = silent_phrase(allocation.silent_spares)
    if roster is None:
        short = f"{len(allocation.spares)} spare(s) left for {len(allocation.lost)} lost node(s)"
        return replace(decision, why=f"{decision.why}; no restart onto a spare: {short}{silent}")
    if allocation.restarts >= budget.max_restarts:
        spent = f"the {budget.max_restarts} restarts in place of this allocation are spent (`resilience.max_restarts`)"
        return replace(decision, why=f"{decision.why}; {spent}")
    joined = tuple(host for host in roster if host not in allocation.roster)
    # A silent spare stays among those left: node 0 asks again at the next loss (its wrapper may beat again).
    quiet = tuple(host for host, _ in allocation.silent_spares)
    left = tuple(host for host in (*allocation.spares, *quiet) if host not in joined)
    swaps = ", ".join(f"{old} -> {new}" for old, new in zip(allocation.roster, roster, strict=True) if old != new)
    why = decision.why.partition("; requeued")[0]
    number = allocation.restarts + 1
    how = f"restarted in place on a spare ({swaps}; {len(left)} spare(s) left; {number} of {budget.max_restarts})"
    return Decision(Action.RESTART, decision.reason, f"{why}; {how}{silent}", roster=roster, spares=left)


def silent_phrase(silent_spares: tuple[tuple[str, float], ...]) -> str:
    """'; spare not called in, its wrapper silent: n3 for 200 s' (empty without silent spares)."""
    named = ", ".join(f"{host} for {seconds:.0f} s" for host, seconds in silent_spares)
    return f"; spare not called in, its wrapper silent: {named}" if named else ""


def restart_in_place(decision: Decision, allocation: Allocation, budget: Budget) -> Decision:
    """A requeue turned into a restart inside the same allocation, when that is safe: the reason is
    RESTARTABLE, every node is alive, and the allocation's restart budget is not spent. Otherwise the
    decision stands: a lost node, a spent budget or SLURM's own request (preemption, time limit) requeue.
    No back-off: the nodes are known good, and a failure that repeats without progress stops the run
    (`decide_infra`), whichever way it was retried."""
    if decision.action is not Action.REQUEUE or decision.reason not in RESTARTABLE or not allocation.all_alive:
        return decision
    if allocation.restarts >= budget.max_restarts:
        spent = f"the {budget.max_restarts} restarts in place of this allocation are spent (`resilience.max_restarts`)"
        return replace(decision, why=f"{decision.why}; {spent}")
    number = allocation.restarts + 1
    why = decision.why.partition("; requeued")[0]
    return Decision(
        Action.RESTART,
        decision.reason,
        f"{why}; every node is alive: restarted in place ({number} of {budget.max_restarts})",
    )


def decide_by_reason(
    reason: Reason, explanation: str, history: History, budget: Budget, exclude: tuple[str, ...]
) -> Decision:
    # Every requeue carries the hosts to exclude, so whoever applies it replaces the exclusion list.
    if reason is Reason.FINISHED:
        return Decision(Action.DONE, reason, f"{explanation}; done")
    if reason is Reason.USER_ERROR:
        return Decision(Action.STOP, reason, f"user error: {explanation}; not retried: fix it, then {RESUBMIT}")
    if reason in SIGNAL_REASONS and history.stops_without_progress > budget.max_stops_without_progress:
        return stalled_by_stops(reason, explanation, history, budget)
    if reason is Reason.DISK_FULL:
        return decide_disk_full(explanation, history, budget, exclude)
    if reason is Reason.STRAGGLER:
        return decide_straggler(explanation, exclude)
    if reason is Reason.PREEMPTED:
        return Decision(Action.REQUEUE, reason, f"{explanation}; requeued (preemptions are unlimited)", 0, exclude)
    if reason is Reason.TIMED_OUT:
        return decide_timeout(explanation, history, budget, exclude)
    if reason is Reason.UNKNOWN_STOP:
        return decide_unknown_stop(explanation, history, budget, exclude)
    return decide_infra(explanation, history, budget, exclude)


def stalled_by_stops(reason: Reason, explanation: str, history: History, budget: Budget) -> Decision:
    """Stop signals keep ending attempts before anything is committed: the save after the signal does not fit
    in the time SLURM gives it, and the periodic saves come rarer than the stops. Requeued again, the run
    would only repeat the same steps (preemptions are otherwise unlimited)."""
    stops = history.stops_without_progress
    why = (
        f"stopped: no progress: the last {stops} attempts were ended by a stop signal (preemption or time limit) "
        f"before a new checkpoint was committed, the last: {explanation}; the save after the signal does not fit "
        "in the lead SLURM gives it, and periodic saves come rarer than the stops. HINT: raise "
        "`cluster.signal_lead_s` (on a preemption the partition's GraceTime is the limit), save more often "
        f"(`swift.save_steps`), or raise `resilience.max_stops_without_progress`, then {RESUBMIT}"
    )
    return Decision(Action.STOP, reason, why)


def decide_timeout(explanation: str, history: History, budget: Budget, exclude: tuple[str, ...]) -> Decision:
    fix = "raise `resilience.max_timeouts` or the time limit `cluster.time`"
    return decide_counted(
        Reason.TIMED_OUT, explanation, (history.timeouts, budget.max_timeouts, "time-outs"), fix, exclude
    )


def decide_unknown_stop(explanation: str, history: History, budget: Budget, exclude: tuple[str, ...]) -> Decision:
    """A stop signal whose cause SLURM could not tell (preemption or time limit): requeued, but not for ever."""
    fix = "check that `scontrol show job` works on the nodes (or raise `resilience.max_unknown_stops`)"
    count = (history.unknown_stops, budget.max_unknown_stops, "stops of unknown cause")
    return decide_counted(Reason.UNKNOWN_STOP, explanation, count, fix, exclude)


def decide_counted(
    reason: Reason, explanation: str, count: tuple[int, int, str], fix: str, exclude: tuple[str, ...]
) -> Decision:
    """Requeue at once while the count (this attempt included) is within its budget; else stop, naming the fix.
    `count`: (how many so far, the budget, what is counted)."""
    used, limit, what = count
    if used <= limit:
        return Decision(Action.REQUEUE, reason, f"{explanation}; requeued ({used} of {limit} {what})", 0, exclude)
    why = f"{explanation}; stopped: {used} {what} exceed the budget of {limit}: {fix}, then {RESUBMIT}"
    return Decision(Action.STOP, reason, why)


def decide_infra(explanation: str, history: History, budget: Budget, exclude: tuple[str, ...]) -> Decision:
    failures = history.consecutive_failures
    if failures > budget.max_consecutive_failures:
        why = (
            f"stopped: no progress: the committed step has not advanced across {failures} infrastructure "
            f"failures in a row (restarts and requeues), the last: {explanation}; not requeued: check the nodes "
            f"and the node logs, then {RESUBMIT} (or raise `resilience.max_consecutive_failures`)"
        )
        return Decision(Action.STOP, Reason.INFRA, why)
    delay = backoff_s(failures, budget)
    excluding = f", excluding {','.join(exclude)}" if exclude else ""
    why = (
        f"infrastructure failure: {explanation}; requeued in {delay:.0f}s "
        f"({failures} of {budget.max_consecutive_failures} failures in a row without progress{excluding})"
    )
    return Decision(Action.REQUEUE, Reason.INFRA, why, delay, exclude)


def decide_straggler(explanation: str, exclude: tuple[str, ...]) -> Decision:
    """The attempt was stopped at a checkpoint to swap a straggler for a spare: `decide` turns this into a restart
    in place onto the spare (swap_in_spares). Should no spare be up by then (SLURM reports it down) or the restart
    budget be spent, the run is requeued at once without the straggler, as `straggler_action=exclude` would (its
    host is among `exclude`: history_after counts it as a failed host)."""
    excluding = f", excluding {','.join(exclude)}" if exclude else ""
    return Decision(Action.REQUEUE, Reason.STRAGGLER, f"{explanation}; requeued{excluding}", 0, exclude)


def decide_disk_full(explanation: str, history: History, budget: Budget, exclude: tuple[str, ...]) -> Decision:
    """A save that did not fit: requeued after the back-off, since the space may come back (another job's files
    deleted, a purge; the next start deletes what this attempt set aside), and counted like an infrastructure
    failure: once it repeats without progress beyond `max_consecutive_failures`, the run stops."""
    failures = history.consecutive_failures
    fix = "free that much on that filesystem (fewer checkpoints kept: keep_checkpoints=N) or move run_dir"
    if failures > budget.max_consecutive_failures:
        stopped = f"stopped: full again after {failures} attempt(s) in a row without progress"
        return Decision(Action.STOP, Reason.DISK_FULL, f"disk full: {explanation}; {stopped}: {fix}, then {RESUBMIT}")
    delay = backoff_s(failures, budget)
    count = (
        f"{failures} of {budget.max_consecutive_failures} attempts in a row without progress"
        if failures
        else "it committed a new checkpoint first"
    )
    why = f"disk full: {explanation}; requeued in {delay:.0f}s ({count}; the run stops once they are spent): {fix}"
    return Decision(Action.REQUEUE, Reason.DISK_FULL, why, delay, exclude)


def backoff_s(failures: int, budget: Budget) -> float:
    """Exponential back-off after ``failures`` in a row; an attempt that still committed a checkpoint (count 0)
    waits the base time."""
    return min(budget.backoff_max_s, budget.backoff_base_s * 2 ** max(failures - 1, 0))
