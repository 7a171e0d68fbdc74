"""Run the trainer once and watch it: forward stop signals to its workers, end it once the checkpoint of the
stop step they agreed on is committed, kill it when it hangs (after every rank dumped its stacks: stacks.py) or
outlives its save (node/deadline.py says when), and hand each newly committed checkpoint to the background
uploader (leader). Progress is global rank 0's heartbeat (rundir/beat.py); when the run is hung is node/hang.py's:
a window learned from its own pace. With `resilience.straggler_action=swap` node 0's request to swap a straggler
for a spare (node/swap.py) stops every node's trainer the way a stop signal does."""

from __future__ import annotations

import os
import resource
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from swiftslurm.ckpt.checkpoint import ResumePoint, checkpoint_dir, is_committed
from swiftslurm.engines.hooks import STACKS_ENV, STOP_FILE_ENV, agreed_stop_step
from swiftslurm.engines.registry import engine_for
from swiftslurm.node import stacks, swap
from swiftslurm.node.deadline import KILL_MARGIN_S, EndTimes, SaveDeadline, earliest, save_deadline
from swiftslurm.node.hang import HangLimits, StepGaps
from swiftslurm.node.launch import Trainer
from swiftslurm.node.stragglers import StragglerLimits, StragglerWatch
from swiftslurm.plan import STRAGGLER_EXCLUDE, STRAGGLER_SWAP, JobPlan, Resilience
from swiftslurm.render import swift_command
from swiftslurm.rundir import records, reserve
from swiftslurm.rundir.beat import PROGRESS_ENV, STEP, ProgressWatch
from swiftslurm.rundir.jsonio import peek_json, write_json_atomic
from swiftslurm.rundir.layout import (
    attempt_dir,
    node_log,
    pace_dir,
    pace_file,
    progress_file,
    save_deadline_file,
    stacks_dir,
    stop_step_file,
    stragglers_file,
    trainer_timeline,
)
from swiftslurm.rundir.lease import TOKEN_ENV
from swiftslurm.rundir.pace import LOCAL_PACE_ENV, PACE_ENV, PUBLISH_S, local_pace_dir, read_paces
from swiftslurm.rundir.timeline import TIMELINE_ENV
from swiftslurm.signals import SAVE_SIGNAL, SignalLog
from swiftslurm.slurm import JobTimes
from swiftslurm.slurm_env import AttemptShape, SlurmEnv, rank_env
from swiftslurm.storage.sync import NodeSync

POLL_S = 0.5
# A node waiting for another's word (the resume point, the outcome) looks this often for its first FAST_POLL_FOR_S:
# the leader's word usually comes within a fraction of a second, and a 0.5 s sleep cost most of one per attempt.
FAST_POLL_S = 0.05
FAST_POLL_FOR_S = 1.0


# After a stop signal the trainer's end waits on one fact, the stop checkpoint's commit, which every node must see
# before node 0 can requeue: between two ticks a node looks for it this often (one lookup of the manifest on the
# run dir). At POLL_S the slowest of N nodes saw it ~POLL_S late, a delay that grew with N.
STOP_POLL_S = 0.1


def wait_pause(waited_s: float) -> float:
    """How long a node waiting for another's file sleeps before it looks again, ``waited_s`` into the wait."""
    return FAST_POLL_S if waited_s < FAST_POLL_FOR_S else POLL_S


# Node 0 reads the nodes' paces as often as each node writes its own (at most every PUBLISH_S): one listing and
# one small read per node of the run dir, which a 128-node run shares (128 reads in 5 s).
STRAGGLER_READ_S = PUBLISH_S
REFORWARD_S = 5.0  # a worker that had not installed its handler yet gets the signal again
# How long a KILLed trainer's processes may take to be gone once a stop signal came (launch.TREE_EXIT_S otherwise):
# node 0 must still conclude and requeue within KILL_MARGIN_S, and SLURM ends what is left with the job.
TREE_EXIT_AFTER_STOP_S = KILL_MARGIN_S / 3
# Why a wrapper ended its own trainer (Observed.ended_by): then its exit code says nothing of what went wrong.
PEER_FAILED = "peer_failed"  # another node's trainer failed
HUNG = "hung"  # the run was found hung (node 0's watchdog)
STOP_SAVED = "stop_saved"  # the checkpoint a stop signal asked for is committed, or its save overran its lead
LEASE_LOST = "lease_lost"  # another job took the run dir's lease (leader)
# SLURM's end of this job and why it is unknown (conclude.job_times): asked by node 0 when a stop signal comes.
AskEndTimes = Callable[[], tuple[JobTimes | None, str | None]]


def no_end_times() -> tuple[JobTimes | None, str | None]:
    return None, None


@dataclass
class Observed:
    """How one trainer run went, as seen from its node."""

    exit_code: int
    signals: list[tuple[int, float]]
    hung: bool
    watch: ProgressWatch
    started: float
    ended_at: float | None = None  # when the wrapper saw the trainer exit
    ended_by: str | None = None  # why this node's wrapper ended the trainer (PEER_FAILED, HUNG, STOP_SAVED, ...)
    hang: dict[str, Any] | None = None  # hung: when, at which step, the window, where the stacks are
    unrestored: str | None = None  # no trainer started: why the object store could not be restored from
    stop: dict[str, Any] | None = None  # after a stop signal: the agreed step and the save deadline (_Watcher)
    disk_free: int | None = None  # bytes free beside the checkpoints as the trainer left them (reserve held)
    leftovers: tuple[str, ...] = ()  # the trainer's processes still there when the wrapper stopped waiting for them
    stragglers: tuple[dict[str, Any], ...] = ()  # node 0: the nodes named slow when the trainer ended (stragglers.py)
    swap: dict[str, Any] | None = None  # node 0 asked every node to stop for a swap (node/swap.py): when, whom

    @property
    def peer_failed(self) -> bool:
        """This node's trainer was ended because another node's failed."""
        return self.ended_by == PEER_FAILED


def hang_limits(res: Resilience) -> HangLimits:
    return HangLimits(
        res.startup_timeout_s, res.hang_window_factor, res.hang_window_floor_s, res.hang_timeout_s, res.pause_timeout_s
    )


def straggler_limits(res: Resilience) -> StragglerLimits:
    return StragglerLimits(res.straggler_ratio, res.straggler_s)


def node_log_path(run_dir: Path, attempt: str, where: SlurmEnv) -> Path:
    return node_log(attempt_dir(run_dir, attempt), where.node_id)


def trainer_env(
    plan: JobPlan, where: SlurmEnv, run_dir: Path, lease_token: int | None = None, attempt: str | None = None
) -> dict[str, str]:
    return {
        **os.environ,
        **dict(plan.env),
        **rank_env(where, plan),
        "SWIFTSLURM_RUN_DIR": str(run_dir),
        "SWIFTSLURM_KEEP_CHECKPOINTS": str(trainer_keep(plan)),
        "SWIFTSLURM_PLAN_IDENTITY": plan.identity(),
        **({TOKEN_ENV: str(lease_token)} if lease_token is not None else {}),
        **({STACKS_ENV: str(stacks_dir(attempt_dir(run_dir, attempt)))} if attempt is not None else {}),
        **({PROGRESS_ENV: str(progress_file(attempt_dir(run_dir, attempt)))} if attempt is not None else {}),
        **({PACE_ENV: str(pace_file(attempt_dir(run_dir, attempt), where.node_id))} if attempt is not None else {}),
        **({LOCAL_PACE_ENV: str(local_pace_dir(attempt, where.node_id))} if attempt is not None else {}),
        **({STOP_FILE_ENV: str(stop_step_file(attempt_dir(run_dir, attempt)))} if attempt is not None else {}),
    }


def trainer_keep(plan: JobPlan) -> int:
    """`keep_checkpoints` as the trainer's commit hook applies it. With object storage the leader's NodeSync
    owns local retention, since only it knows what is uploaded: the trainer then prunes nothing."""
    return 0 if plan.storage is not None else plan.keep_checkpoints


def train(
    plan: JobPlan,
    where: SlurmEnv,
    run_dir: Path,
    attempt: str,
    resume: ResumePoint,
    sync: NodeSync | None,
    signals: SignalLog,
    lease_token: int | None = None,
    peer_failed: Callable[[], bool] = lambda: False,
    lease_lost: Callable[[], str | None] = lambda: None,
    end_times: AskEndTimes = no_end_times,
    swap_room: tuple[int, int] = (0, 0),
) -> Observed:
    """Run ms-swift once; forward stop signals (recorded in ``signals``, the wrapper's) to its workers and end
    it once the checkpoint they asked for is committed, or at the save's deadline (node 0 asks ``end_times``
    when the signal comes); end it when ``peer_failed()`` (another node's trainer failed), or when
    ``lease_lost()`` says why this leader lost the run dir's lease; the leader kills it if it hangs and hands
    each newly committed checkpoint to the background uploader. ``swap_room``: node 0's spares standing by and
    restarts in place left in this allocation, for `resilience.straggler_action=swap`."""
    engine = engine_for(plan.launcher)
    shape = AttemptShape.of(where, plan)
    extra = resume_args(plan, shape, resume)
    if shape.batch != plan.batch:  # fewer nodes than planned: the same global batch
        extra = (*extra, *engine.reshaped_args(shape.batch))
    log_path = node_log_path(run_dir, attempt, where)
    started = time.time()
    cpu_before = _own_cpu_s()
    # What this node's wrapper cost before its trainer: its CPU is its own, its wall time shares the node's cores.
    print(startup_cost_line(cpu_before, started), flush=True)
    watch = ProgressWatch(progress_file(log_path.parent), started)
    env = trainer_env(plan, where, run_dir, lease_token, attempt)
    env[TIMELINE_ENV] = str(trainer_timeline(log_path.parent))
    if (no_room := reserve.hold(run_dir, where.node_id)) is not None:
        print(f"[swiftslurm] {no_room}", flush=True)
    trainer = Trainer(swift_command(plan, extra), env, log_path, cwd=run_dir)
    watcher = _Watcher(
        plan, where, trainer, engine.stop_recipients, signals, watch, sync, log_path.parent, peer_failed, lease_lost
    )
    watcher.end_times = end_times
    watcher.spares_left, watcher.restarts_left = swap_room
    code, ended = watcher.until_exit(), time.time()
    disk_free = reserve.free_bytes(plan.output_dir if plan.output_dir.is_dir() else run_dir)
    reserve.release(run_dir, where.node_id)  # before anything is written: a save may have filled the disk
    stacks.tidy(log_path.parent, node_ranks(plan, where))
    shutil.rmtree(local_pace_dir(attempt, where.node_id), ignore_errors=True)
    # What watching costs: the trainer's cores are not this process's, but say it (bench/gpu_overhead.py).
    print(wrapper_cost_line(_own_cpu_s() - cpu_before, time.time() - started), flush=True)
    observed = Observed(code, list(signals.received), watcher.hung, watch, started, ended, watcher.ended_by)
    observed = replace(observed, hang=watcher.hang, stop=watcher.stop_record(), disk_free=disk_free)
    observed = replace(observed, stragglers=watcher.straggler_record(), swap=watcher.swap)
    return replace(observed, leftovers=trainer.leftovers)


def resume_args(plan: JobPlan, shape: AttemptShape, resume: ResumePoint) -> tuple[str, ...]:
    """The engine's arguments that resume from ``resume``: when the run may shrink, at this attempt's ranks
    (a ZeRO checkpoint written by another number is loaded from the universal form the leader made)."""
    if resume.checkpoint is None:
        return ()
    engine = engine_for(plan.launcher)
    if (ranks := shape.reshard_ranks) is None:
        return engine.resume_args(resume.checkpoint, plan.swift_argv)
    return engine.resume_args_at(resume.checkpoint, plan.swift_argv, ranks)


def node_ranks(plan: JobPlan, where: SlurmEnv) -> range:
    """The global ranks this node runs (torchrun numbers them node by node)."""
    per_node = plan.topology.procs_per_node
    return range(where.node_id * per_node, (where.node_id + 1) * per_node)


@dataclass
class _Watcher:
    """The main loop's state while the trainer runs; the signal handler only records, this does the work."""

    plan: JobPlan
    where: SlurmEnv
    trainer: Trainer
    stop_recipients: Callable[[int], list[int]]  # the engine's: who may get the stop signal
    signals: SignalLog
    watch: ProgressWatch
    sync: NodeSync | None
    attempt_dir: Path
    peer_failed: Callable[[], bool] = lambda: False
    lease_lost: Callable[[], str | None] = lambda: None  # leader: why another job leads the run now
    hung: bool = False
    ended_by: str | None = None  # why this wrapper ended the trainer, if it did
    forwarded_at: float = 0.0
    gaps: StepGaps = field(default_factory=StepGaps)
    hang: dict[str, Any] | None = None
    dumped: bool = False  # this node's ranks were asked for their stacks
    end_times: AskEndTimes = no_end_times  # node 0: SLURM's end of the job, asked when a stop signal comes
    stop_step: int | None = None  # the step every rank agreed to save and stop at (global rank 0's stop.json)
    deadline: SaveDeadline | None = None  # when a trainer still running after the stop signals is killed
    deadline_signals: int = 0  # how many of the signals the deadline has taken into account
    stragglers: StragglerWatch | None = None  # node 0: which nodes are slower than the others
    paces_read_at: float = float("-inf")
    spares_left: int = 0  # node 0: spares standing by (straggler_action=swap)
    restarts_left: int = 0  # node 0: restarts in place this allocation may still make
    swap: dict[str, Any] | None = None  # node 0's request to stop for a swap (node/swap.py), once made or seen
    not_swapped: dict[int, str] = field(default_factory=dict)  # node 0: named node -> why it is not swapped

    @property
    def stopping(self) -> bool:
        """A stop signal came, or node 0 asked every node to stop for a swap: the trainer saves and is ended."""
        return bool(self.signals.received) or self.swap is not None

    def until_exit(self) -> int:
        while (code := self.trainer.poll()) is None:
            self.wait_for_tick()
            self.tick(time.time())
        return code

    def wait_for_tick(self, sleep: Callable[[float], None] = time.sleep) -> None:
        """POLL_S until the next tick; while stopping, cut short once the stop checkpoint is committed or the
        trainer has ended (looked for every STOP_POLL_S), so that the tick ending it comes at once. The tick's
        other work keeps its pace."""
        if not self.stopping:
            sleep(POLL_S)
            return
        for _ in range(round(POLL_S / STOP_POLL_S)):
            sleep(STOP_POLL_S)
            if self.trainer.poll() is not None or self.stop_committed():
                return

    def tick(self, now: float) -> None:
        if self.end_if_lease_lost() or self.end_leftovers():
            return
        self.follow_swap()
        if self.stopping:
            self.trainer.tree_exit_s = min(self.trainer.tree_exit_s, TREE_EXIT_AFTER_STOP_S)
        self.forward_stop(now)
        self.follow_progress(now)
        self.follow_stragglers(now)
        if self.sync is not None:
            self.sync.poll(now)
        self.dump_if_asked()
        self.kill_if_hung(now)
        self.kill_if_save_overdue(now)
        self.end_once_saved()
        self.end_if_peer_failed()

    def forward_stop(self, now: float) -> None:
        if self.stopping and now - self.forwarded_at >= REFORWARD_S and not self.stop_committed():
            # Whatever stop signal came (USR2 from SLURM, TERM from scancel), the workers get USR2: it
            # makes them save and exit, and torchrun ignores it (TERM would make it SIGKILL them 30 s on).
            # Re-sent until a checkpoint is committed, but only to processes that handle it and have not
            # had it yet (a worker still loading); a second one would kill a rank that saved and is exiting.
            self.trainer.forward(SAVE_SIGNAL, self.stop_recipients)
            self.forwarded_at = now

    def follow_progress(self, now: float) -> None:
        # Node 0's: its watchdog alone judges the run (global rank 0, which beats, runs on node 0).
        if self.where.node_id == 0 and (beat := self.watch.poll()) is not None:
            self.gaps.observe(beat)

    def follow_stragglers(self, now: float) -> None:
        """Node 0: judge the nodes' paces (node/stragglers.py) every STRAGGLER_READ_S; say who is named a
        straggler, or at pace again, in the wrapper's output, node 0's log and stragglers.json (what `status`
        shows)."""
        if self.where.node_id != 0 or now - self.paces_read_at < STRAGGLER_READ_S:
            return
        self.paces_read_at = now
        if self.stragglers is None:
            self.stragglers = StragglerWatch(straggler_limits(self.plan.resilience), self.where.hosts)
        lines = self.stragglers.observe(read_paces(pace_dir(self.attempt_dir)), now)
        for line in lines:
            print(f"[swiftslurm] {line}", flush=True)
            records.note_in_log(node_log(self.attempt_dir, 0), line)
        if self.plan.resilience.straggler_action == STRAGGLER_SWAP:
            lines += self.ask_swap(now)
        if lines or self.stragglers.named:  # while one is named, its ratio and step stay current for `status`
            self.publish_stragglers(now)

    def ask_swap(self, now: float) -> list[str]:
        """Node 0, straggler_action=swap: once a node is named and a spare can take its place (swap.choose), ask
        every node to stop at a checkpoint (swap.json); a named node that is not swapped is said once, with why.
        Returns the lines said."""
        assert self.stragglers is not None
        if self.swap is not None or not (named := self.stragglers.stragglers()):
            return []
        taken, why_not = swap.choose(named, self.spares_left, self.restarts_left)
        said = []
        if taken:
            self.swap = swap.request(self.attempt_dir, taken, now)
            said.append(f"{swap.line(self.swap)}: every node stops at a checkpoint, then the attempt restarts")
        for s in named:
            if s not in taken and why_not and s.node not in self.not_swapped:
                self.not_swapped[s.node] = why_not
                said.append(f"node {s.node} ({s.host}) is not swapped: {why_not}")
        for line in said:
            print(f"[swiftslurm] {line}", flush=True)
            records.note_in_log(node_log(self.attempt_dir, 0), line)
        return said

    def follow_swap(self) -> None:
        """Not node 0, straggler_action=swap: node 0's request to stop for a swap (node/swap.py), looked for at each
        poll until it comes."""
        if self.swap is not None or self.where.node_id == 0 or self.plan.resilience.straggler_action != STRAGGLER_SWAP:
            return
        if (asked := swap.requested(self.attempt_dir)) is not None:
            self.swap = asked
            print(f"[swiftslurm] node 0 asks every node to stop at a checkpoint: {swap.line(asked)}", flush=True)

    def publish_stragglers(self, now: float) -> None:
        res = self.plan.resilience
        report: dict[str, Any] = {"updated": round(now, 3), "ratio": res.straggler_ratio, "window_s": res.straggler_s}
        report |= {"action": res.straggler_action, "stragglers": list(self.straggler_record())}
        try:
            write_json_atomic(stragglers_file(self.attempt_dir), report, durable=False)
        except OSError as err:
            print(f"[swiftslurm] the stragglers cannot be published ({err}); tried at the next change", flush=True)

    def straggler_record(self) -> tuple[dict[str, Any], ...]:
        """The nodes named now; with resilience.straggler_action=exclude each marked for the next requeue to
        avoid (decide.exclusions, as failed hosts); with swap, those swapped for a spare marked "swap" (avoided by a
        requeue as well) and the others with why they are not (`not_swapped`)."""
        if not self.stragglers:
            return ()
        mark = {"exclude": True} if self.plan.resilience.straggler_action == STRAGGLER_EXCLUDE else {}
        swapped = set(swap.hosts(self.swap)) if self.swap else set()
        return tuple(
            s.as_dict() | mark | self.swap_mark(s.node, s.host in swapped) for s in self.stragglers.stragglers()
        )

    def swap_mark(self, node: int, swapped: bool) -> dict[str, Any]:
        if swapped:
            return {"swap": True}
        return {"not_swapped": self.not_swapped[node]} if node in self.not_swapped else {}

    def dump_if_asked(self) -> None:
        """Not node 0: once node 0 found the run hung (hang.json), have this node's ranks dump their stacks,
        then end the trainer as node 0 ends its own (a rank stuck for good would not notice its peers go)."""
        if self.where.node_id != 0 and not self.dumped and stacks.asked(self.attempt_dir):
            self.dumped = True
            stacks.dump_ranks(self.trainer.pid)
            stacks.wait_for_stacks(self.attempt_dir, node_ranks(self.plan, self.where))
            print("[swiftslurm] node 0 found the run hung: stacks dumped, killing the trainer", flush=True)
            self.end(HUNG)

    def kill_if_hung(self, now: float) -> None:
        if self.where.node_id != 0 or self.stopping or self.hung:
            return
        window, stalled = self.gaps.window(hang_limits(self.plan.resilience)), self.watch.stalled_for(now)
        if stalled <= window.seconds:
            return
        self.hung = True
        phase = self.gaps.beat.phase if self.gaps.beat is not None else None
        self.hang = {"detected_at": round(now, 3), "step": self.watch.step, "phase": phase}
        self.hang |= {"stalled_s": round(stalled, 1)}
        self.hang |= {"window_s": round(window.seconds, 1), "basis": window.basis}
        self.hang |= self.collect_stacks()
        print(f"[swiftslurm] hung: {hang_line(self.hang)}; killing the trainer", flush=True)
        self.end(HUNG)

    def collect_stacks(self) -> dict[str, Any]:
        """Every rank's stacks, before the kill: node 0 asks every node (hang.json), dumps its own ranks, and
        waits (bounded) for all of them."""
        assert self.hang is not None
        stacks.ask(self.attempt_dir, self.hang)
        self.dumped = True
        stacks.dump_ranks(self.trainer.pid)
        missing = stacks.wait_for_stacks(self.attempt_dir, range(AttemptShape.of(self.where, self.plan).ranks))
        return {"stacks": str(stacks_dir(self.attempt_dir)), "stacks_missing": missing}

    def kill_if_save_overdue(self, now: float) -> None:
        if self.stopping and now > (deadline := self.save_deadline(now)).at:
            # The save had all the time there is; something (e.g. torchrun's exit barrier waiting for a peer
            # that is gone) keeps the trainer alive: end it while node 0 can still record and requeue.
            print(
                f"[swiftslurm] no stop checkpoint by the save deadline ({deadline.basis}): killing the trainer",
                flush=True,
            )
            self.end(STOP_SAVED)

    def save_deadline(self, now: float) -> SaveDeadline:
        """Node 0 works it out from SLURM's end time, read again at each new signal (a preemption moves it to
        the end of the grace time), and publishes it: every node kills at the same moment. Until its word is
        there, or when node 0 is gone, a node goes by its own signals and SLURM_JOB_END_TIME."""
        received = self.signals.received
        if self.swap is not None and self.deadline is None:  # the swap's save has the time a stop signal's has
            at = float(self.swap["at"])  # node 0's clock: every node kills at the same moment
            self.deadline = save_deadline(at, self.plan.resilience.signal_lead_s, self.exported_end_times())
        if len(received) > self.deadline_signals:
            ends = self.ask_end_times() if self.where.node_id == 0 else self.exported_end_times()
            for _, signalled_at in received[self.deadline_signals :]:
                self.deadline = earliest(
                    self.deadline, save_deadline(signalled_at, self.plan.resilience.signal_lead_s, ends)
                )
            self.deadline_signals = len(received)
            if self.where.node_id == 0:
                self.publish_deadline(now)
        if self.where.node_id != 0 and (
            word := SaveDeadline.from_dict(peek_json(save_deadline_file(self.attempt_dir)) or {})
        ):
            self.deadline = word
        assert self.deadline is not None
        return self.deadline

    def ask_end_times(self) -> EndTimes:
        times, unknown = self.end_times()
        if times is not None:
            return EndTimes(times.kill_at, times.limit_ends, "scontrol")
        if unknown:
            print(f"[swiftslurm] after a stop signal, {unknown}", flush=True)
        return self.exported_end_times()

    def exported_end_times(self) -> EndTimes:
        end = self.where.end_time  # the time limit's end as SLURM projected it at the start
        return EndTimes(end, end, "SLURM_JOB_END_TIME") if end is not None else EndTimes(None, None, None)

    def publish_deadline(self, now: float) -> None:
        assert self.deadline is not None
        d = self.deadline
        basis = f"SLURM ends the job in {d.kill_at - now:.0f} s" if d.kill_at is not None else "no end time known"
        print(
            f"[swiftslurm] stop signal: a trainer still running in {d.at - now:.0f} s is killed ({d.basis}; {basis})",
            flush=True,
        )
        try:
            write_json_atomic(save_deadline_file(self.attempt_dir), d.as_dict(), durable=False)
        except OSError as err:
            print(
                f"[swiftslurm] the save deadline cannot be published ({err}): the other nodes keep their own",
                flush=True,
            )

    def stop_committed(self) -> bool:
        """Whether the checkpoint of the agreed stop step is committed (its manifest is written last). That step
        only: an earlier save's commit runs in the background and may land after the signal, while the stop
        checkpoint is still being written; and steps, unlike node 0's commit time, mean the same on every node."""
        if self.stop_step is None:
            self.stop_step = agreed_stop_step(stop_step_file(self.attempt_dir))
        return self.stop_step is not None and is_committed(checkpoint_dir(self.plan.output_dir, self.stop_step))

    def end_once_saved(self) -> None:
        if self.stopping and self.stop_committed():
            # The checkpoint the stop signal asked for is committed: all the next attempt needs. ms-swift's and
            # torchrun's shutdown after it took 5-60 s (docs/resilience.md, "Measured"), time taken from the
            # requeue; nothing of it is kept.
            print(
                f"[swiftslurm] the stop checkpoint (step {self.stop_step}) is committed: ending the trainer", flush=True
            )
            self.end(STOP_SAVED)

    def stop_record(self) -> dict[str, Any] | None:
        """For the attempt's record: the agreed stop step (None: none was agreed) and the deadline."""
        if not self.stopping:
            return None
        if self.stop_step is None:
            self.stop_step = agreed_stop_step(stop_step_file(self.attempt_dir))
        return {"step": self.stop_step, **({"deadline": self.deadline.as_dict()} if self.deadline else {})}

    def end_if_lease_lost(self) -> bool:
        """Another job took the run dir's lease: this trainer must not save, commit or upload any more. KILL, not
        the save signal (its checkpoint would not count); the attempt then records nothing (attempt.py)."""
        try:
            why = self.lease_lost()
        except OSError as err:  # the run dir's filesystem did not answer just now: the next poll asks again
            print(f"[swiftslurm] could not read the run dir's lease: {err}", flush=True)
            return False
        if why is None:
            return False
        print(f"[swiftslurm] killing the trainer: {why}", flush=True)
        self.end(LEASE_LOST)
        return True

    def end_if_peer_failed(self) -> None:
        # Not after a stop signal: then peers end on their own after their part of the save, and this node's
        # rank 0 may still be committing it.
        if not self.stopping and self.peer_failed():
            print("[swiftslurm] another node's trainer failed: ending this node's", flush=True)
            self.end(PEER_FAILED)

    def end_leftovers(self) -> bool:
        """The trainer's command (`swift`) exited by itself, processes it started still run: without a stop signal
        none of them is needed any more (torchrun, which waits for its ranks, is gone), so they are KILLed, and the
        command's exit code stands. After a stop signal a rank may still be committing its save: the commit or the
        save's deadline ends them, as it ends a running trainer."""
        if self.stopping or self.trainer.command_exit is None:
            return False
        self.trainer.kill()
        return True

    def end(self, why: str) -> None:
        """Kill the trainer, saying why (the first reason stands: what came after was the kill's doing); not when its
        command had exited by itself: its exit code then says what happened."""
        if self.trainer.poll() is None and self.trainer.command_exit is None:
            self.ended_by = self.ended_by or why
        self.trainer.kill()


def nothing_to_train(signals: list[tuple[int, float]] | None = None, started: float | None = None) -> Observed:
    """An attempt that started no trainer: its run was complete, or a stop signal (``signals``) came first."""
    now = time.time() if started is None else started
    return Observed(0, list(signals or []), False, ProgressWatch(Path(os.devnull), now), now, now)


def wrapper_cost_line(cpu_s: float, wall_s: float) -> str:
    """The log line that says what watching the trainer cost (bench/gpu_overhead.py reads it)."""
    return f"[swiftslurm] wrapper: {cpu_s:.2f} CPU-s while training ran {wall_s:.0f} s"


def startup_cost_line(cpu_s: float, at: float) -> str:
    """The wrapper's CPU seconds up to its trainer's launch (imports, preflight, the resume point) and when."""
    return f"[swiftslurm] wrapper start-up: {cpu_s:.3f} CPU-s; trainer launched at {at:.3f}"


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # this process only, not the trainer (a child)
    return usage.ru_utime + usage.ru_stime


def hang_line(hang: dict[str, Any]) -> str:
    """One line for people: how long, after which step, the window and why, where the stacks are."""
    after = "before the first step" if hang["step"] is None else f"after step {hang['step']}"
    stalled = f"no new step for {hang['stalled_s']:.0f} s {after}"
    if (phase := hang.get("phase")) not in (None, STEP):  # a save, evaluation or epoch boundary that never ended
        stalled = f"the {phase} {after} not over after {hang['stalled_s']:.0f} s"
    missing = hang["stacks_missing"]
    stacks = (
        f"stacks in {hang['stacks']}, none from ranks {missing} (not started yet, or not answering)"
        if missing
        else f"stacks of every rank in {hang['stacks']}"
    )
    window = f"window {hang['window_s']:.0f} s: {hang['basis']}"
    return f"{stalled} ({window}); {stacks}"
