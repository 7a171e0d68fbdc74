"""After an attempt: why it ended (from realistic logs) and whether the run finishes, requeues or stops."""

from __future__ import annotations

from dataclasses import replace

import pytest

from swiftslurm.node.decide import (
    Action,
    Allocation,
    AttemptFacts,
    Budget,
    Decision,
    History,
    NodeEnd,
    Reason,
    SaveSpace,
    blame,
    classify,
    classify_signal,
    decide,
    exclusions,
    first_failure,
    history_after,
    history_of,
    node_down,
    own_fault,
    peer_symptom,
)
from swiftslurm.rundir.records import AttemptRecord

# --- log excerpts, as ms-swift / torch / torchrun / SLURM print them --------------------------------------

SWIFT_START = """\
[INFO:swift] Start time of running main: 2025-01-10 12:00:01.123456
[INFO:swift] args: TrainArguments(model='Qwen/Qwen3-8B', dataset=['/data/train.jsonl'], ...)
[INFO:swift] Loading the model using model_dir: /models/Qwen3-8B
"""

MISSING_DATASET = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/swift/cli/sft.py", line 10, in <module>
[rank0]:     sft_main()
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/swift/llm/train/sft.py", line 360, in sft_main
[rank0]:     return SwiftSft(args).main()
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/datasets/load.py", line 2062, in load_dataset
[rank0]:     builder_instance = load_dataset_builder(
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/datasets/data_files.py", line 385, in resolve_pattern
[rank0]:     raise FileNotFoundError(error_msg)
[rank0]: FileNotFoundError: [Errno 2] No such file or directory: '/data/train.jsonl'
[rank0]:[W110 12:00:03.512000 140 ProcessGroupNCCL.cpp:1168] Warning: WARNING: process group has NOT been \
destroyed before we destruct ProcessGroupNCCL. On normal program exit, the application should call \
destroy_process_group to ensure that any pending NCCL operations have finished in this process.
"""


def torchrun_failure(exitcode: int, traceback_line: str) -> str:
    """torchrun's report when a worker dies (torch.distributed.elastic.multiprocessing.errors)."""
    return f"""\
E0110 12:00:05.000000 140 torch/distributed/elastic/multiprocessing/api.py:833] failed (exitcode: {exitcode}) \
local_rank: 0 (pid: 1234) of binary: /opt/conda/bin/python
Traceback (most recent call last):
  File "/opt/conda/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/run.py", line 901, in run
    elastic_launch(
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 263, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/opt/conda/lib/python3.11/site-packages/swift/cli/sft.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-01-10_12:00:05
  host      : gpu-a001
  rank      : 0 (local_rank: 0)
  exitcode  : {exitcode} (pid: 1234)
  error_file: <N/A>
  traceback : {traceback_line}
============================================================
"""


NO_TRACEBACK = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
SIGKILLED = torchrun_failure(-9, "Signal 9 (SIGKILL) received by PID 1234")

GLOO_PEER_CLOSED = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/opt/conda/lib/python3.11/site-packages/swift/llm/train/sft.py", line 204, in _prepare_dataset
[rank1]:     with self.args.main_process_first():
[rank1]:   File "/opt/conda/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4166, in barrier
[rank1]:     work = group.barrier(opts=opts)
[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.77.0.12]:36183
"""

NCCL_WATCHDOG = """\
[rank1]:[E110 12:10:00.000000 140 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600000 milliseconds before \
timing out.
[rank1]:[E110 12:10:00.000000 140 ProcessGroupNCCL.cpp:1785] [PG 0 (default_pg) Rank 1] Exception (either an error \
or timeout) detected by watchdog at work: 5, last enqueued NCCL work: 5, last completed NCCL work: 4.
"""

NCCL_TIMEOUT_TRACEBACK = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/opt/conda/lib/python3.11/site-packages/swift/llm/train/sft.py", line 204, in _prepare_dataset
[rank1]:     with self.args.main_process_first():
[rank1]:   File "/opt/conda/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4166, in barrier
[rank1]:     work.wait()
[rank1]: torch.distributed.DistBackendError: [Rank 1] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600000 milliseconds before \
timing out.
"""

NCCL_REMOTE_ERROR = """\
[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, \
remote process exited or there was a network error, NCCL version 2.21.5
[rank0]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.
"""

CUDA_OOM = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/transformers/trainer.py", line 2481, in _inner_training_loop
[rank0]:     tr_loss_step = self.training_step(model, inputs, num_items_in_batch)
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of \
79.15 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in use.
"""

STARTUP_WARNINGS = """\
W0110 12:00:00.500000 140 torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable for each process \
to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance.
[rank1]:[W110 12:00:01.000000 140 TCPStore.cpp:358] [c10d] TCP client failed to connect/validate to host \
gpu-a001:29500 - retrying (try=0, timeout=1800000ms, delay=1000ms): Connection reset by peer
"""

HF_ARGS_ERROR = """\
Traceback (most recent call last):
  File "/opt/conda/lib/python3.11/site-packages/swift/cli/sft.py", line 10, in <module>
    sft_main()
  File "/opt/conda/lib/python3.11/site-packages/transformers/hf_argparser.py", line 421, in parse_args_into_dataclasses
    raise ValueError(f"Some specified arguments are not used by the HfArgumentParser: {remaining_args}")
ValueError: Some specified arguments are not used by the HfArgumentParser: ['--lr', '1e-4']
"""

ARGPARSE_ERROR = """\
usage: swift sft [-h] [--model MODEL] [--dataset DATASET [DATASET ...]]
swift: error: unrecognized arguments: --lr 1e-4
"""

VALUE_ERROR_MID_TRAINING = """\
{'loss': 1.2345, 'grad_norm': 3.21, 'learning_rate': 9.9e-05, 'epoch': 0.12, 'global_step/max_steps': '12/100'}
[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/swift/llm/dataset/preprocessor/core.py", line 190, in __call__
[rank0]:     raise ValueError(f'row: {row}')
[rank0]: ValueError: row: {'messages': None}
"""

HOST_OOM = """\
slurmstepd: error: Detected 1 oom_kill event in StepId=4242.0. Some of the step tasks have been OOM Killed.
"""

ILLEGAL_MEMORY_ACCESS = """\
[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered
[rank3]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might \
be incorrect.
"""

STORE_TIMEOUT = """\
Traceback (most recent call last):
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/rendezvous.py", line 189, in _create_c10d_store
    return TCPStore(
torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.
"""


def facts(**overrides: object) -> AttemptFacts:
    """An attempt that failed with exit code 1 after a minute, before any step, with an empty log."""
    base = AttemptFacts(
        exit_code=1,
        signal_reason=None,
        steps_done=0,
        reached_last_step=False,
        hung=False,
        log_tail="",
        elapsed_s=60.0,
        failed_host=None,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


# --- issue 25, item 16: the attempt's cause is the node whose trainer failed first ----------------------------


@pytest.mark.parametrize(
    ("log", "witness"),
    [
        (GLOO_PEER_CLOSED, True),
        (NCCL_WATCHDOG, True),
        (NCCL_REMOTE_ERROR, True),
        (STORE_TIMEOUT, True),  # waiting for a node that never joined
        (CUDA_OOM, False),
        (MISSING_DATASET + GLOO_PEER_CLOSED, False),  # its own error came first
        (ILLEGAL_MEMORY_ACCESS, False),
        (SIGKILLED, False),
        ("", False),
    ],
)
def test_a_lost_peer_or_a_collective_timeout_is_a_witness_not_a_cause(log: str, witness: bool) -> None:
    assert peer_symptom(log) is witness


def end(node: int, code: int, at: float | None, log: str = "", by_wrapper: bool = False) -> NodeEnd:
    return NodeEnd(node, f"gpu-{node}", code, at, by_wrapper, log)


@pytest.mark.parametrize(
    ("ends", "first"),
    [
        ([end(0, -9, 100.5, by_wrapper=True), end(1, 1, 100.0, CUDA_OOM)], 1),  # node 0 ended for node 1's sake
        ([end(0, -9, 99.0, by_wrapper=True), end(1, 1, 100.0, CUDA_OOM)], 1),  # even if its exit came first
        ([end(0, 1, 100.0, GLOO_PEER_CLOSED), end(1, 1, 100.4, CUDA_OOM)], 1),  # a witness exits first
        ([end(0, 1, 105.0, MISSING_DATASET), end(1, 1, 100.0, CUDA_OOM)], 1),  # two causes: the earliest
        ([end(0, 1, 100.0, MISSING_DATASET), end(1, 1, 105.0, CUDA_OOM)], 0),
        ([end(0, 1, 100.0, NCCL_WATCHDOG), end(1, 1, 101.0, NCCL_WATCHDOG)], 0),  # all witnesses: the earliest
        ([end(0, 1, None, CUDA_OOM), end(1, 1, 100.0, MISSING_DATASET)], 1),  # a time beats none (old results)
        ([end(0, 0, 100.0), end(1, -9, 100.0, by_wrapper=True)], None),  # nobody failed by itself
    ],
)
def test_the_first_failure_across_the_nodes(ends: list[NodeEnd], first: int | None) -> None:
    found = first_failure(ends)
    assert (found.node if found else None) == first


# --- classify_signal ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds_left", "lead_s", "slack_s", "expected"),
    [
        (120, 120, 60, Reason.TIMED_OUT),  # exactly on time
        (180, 120, 60, Reason.TIMED_OUT),  # SLURM may signal up to 60 s early
        (-5, 120, 60, Reason.TIMED_OUT),  # late: the limit has passed already
        (181, 120, 60, Reason.PREEMPTED),
        (3600, 120, 60, Reason.PREEMPTED),
        (160, 120, 30, Reason.PREEMPTED),  # a tighter slack, if asked for
    ],
)
def test_signal_near_time_limit_is_timeout(seconds_left: int, lead_s: int, slack_s: int, expected: Reason) -> None:
    now = 1_700_000_000.0
    assert classify_signal(now, now + seconds_left, lead_s, slack_s) is expected


def test_signal_without_known_end_time_is_preemption() -> None:
    assert classify_signal(1_700_000_000.0, None, lead_s=120) is Reason.PREEMPTED


# --- classify ----------------------------------------------------------------------------------------------


def test_last_step_with_exit_zero_is_finished() -> None:
    assert classify(facts(exit_code=0, reached_last_step=True, steps_done=40))[0] is Reason.FINISHED


FULL = SaveSpace("/runs/a/output/checkpoint-20", free_bytes=4096, needed_bytes=2_400_000_000, basis="the size of x")


@pytest.mark.parametrize(
    "overrides",
    [{}, {"signal_reason": Reason.PREEMPTED}, {"hung": True}, {"exit_code": -9}, {"exit_code": 0}],
    ids=["crashed", "stop-signal", "hung", "killed", "exit-0"],
)
def test_a_save_that_did_not_fit_is_requeued_after_the_back_off_naming_the_path_and_the_space(
    overrides: dict[str, object],
) -> None:
    """Whatever ended the trainer after its save hit the full disk; the space may come back (another job's files)."""
    reason, why = classify(facts(save_space=FULL, **overrides))
    history = history_after(None, reason, committed_new_checkpoint=False, failed_host=None)
    decision = decide(reason, why, history, Budget(backoff_base_s=30))
    assert (decision.reason, decision.action, decision.delay_s) == (Reason.DISK_FULL, Action.REQUEUE, 30)
    assert decision.why.startswith("disk full: saving /runs/a/output/checkpoint-20 did not fit: 4.1 kB free")
    assert "a checkpoint needs about 2.4 GB (the size of x)" in decision.why
    assert "requeued in 30s (1 of 3 attempts in a row without progress" in decision.why


def test_a_disk_that_stays_full_stops_the_run_once_the_failures_without_progress_are_spent() -> None:
    reason, why = classify(facts(save_space=FULL))
    history = History(attempts=4, timeouts=0, consecutive_failures=4)
    decision = decide(reason, why, history, Budget(max_consecutive_failures=3))
    assert (decision.reason, decision.action) == (Reason.DISK_FULL, Action.STOP)
    assert "stopped: full again after 4 attempt(s) in a row without progress: free that much on that" in decision.why
    assert history_after(history, reason, False, None).consecutive_failures == 5  # counted like infra


def test_an_unfinished_save_with_room_on_the_disk_is_not_a_full_disk() -> None:
    roomy = replace(FULL, free_bytes=FULL.needed_bytes)
    assert classify(facts(save_space=roomy, exit_code=-9))[0] is Reason.INFRA


@pytest.mark.parametrize("exit_code", [0, 1, -15, 143])
@pytest.mark.parametrize("signal_reason", [Reason.PREEMPTED, Reason.TIMED_OUT])
def test_signal_wins_over_exit_code(exit_code: int, signal_reason: Reason) -> None:
    reason, why = classify(facts(exit_code=exit_code, signal_reason=signal_reason, steps_done=27, log_tail=SIGKILLED))
    assert reason is signal_reason
    assert "after 27 training steps" in why


@pytest.mark.parametrize(
    ("log_tail", "expected_line"),
    [
        (SWIFT_START + MISSING_DATASET + torchrun_failure(1, NO_TRACEBACK), "FileNotFoundError: [Errno 2] No such"),
        # rank 0's error makes rank 1 lose its peer; the first failure is the cause
        (SWIFT_START + MISSING_DATASET + GLOO_PEER_CLOSED + torchrun_failure(1, NO_TRACEBACK), "FileNotFoundError"),
        (STARTUP_WARNINGS + HF_ARGS_ERROR, "ValueError: Some specified arguments are not used by the HfArgumentParser"),
        (ARGPARSE_ERROR, "swift: error: unrecognized arguments: --lr 1e-4"),
    ],
    ids=["missing-dataset", "missing-dataset-then-peer-lost", "hf-argparser-after-warnings", "argparse"],
)
def test_missing_dataset_before_first_step_is_user_error_and_not_retried(log_tail: str, expected_line: str) -> None:
    reason, why = classify(facts(log_tail=log_tail, elapsed_s=35.0))
    assert reason is Reason.USER_ERROR
    assert why.startswith(expected_line) and why.endswith("(before any training step)")
    decision = decide(reason, why, History(attempts=1, timeouts=0, consecutive_failures=0), Budget())
    assert decision.action is Action.STOP
    assert "not retried" in decision.why and "python -m swiftslurm" in decision.why


@pytest.mark.parametrize(
    "log_tail",
    [
        NCCL_TIMEOUT_TRACEBACK,
        NCCL_WATCHDOG + NCCL_TIMEOUT_TRACEBACK,
        NCCL_REMOTE_ERROR,
        GLOO_PEER_CLOSED,
        STORE_TIMEOUT,
    ],
    ids=["nccl-timeout-traceback", "nccl-watchdog", "nccl-remote-error", "gloo-peer-closed", "store-timeout"],
)
def test_nccl_timeout_traceback_is_infrastructure_not_user_error(log_tail: str) -> None:
    reason, _why = classify(facts(log_tail=SWIFT_START + log_tail, elapsed_s=30.0))
    assert reason is Reason.INFRA


@pytest.mark.parametrize(
    ("steps_done", "elapsed_s"),
    [(12, 400.0), (1, 30.0), (0, 900.0)],  # training had started, or the start-up was long (a download, say)
)
def test_exception_after_training_started_is_infrastructure(steps_done: int, elapsed_s: float) -> None:
    reason, why = classify(facts(log_tail=VALUE_ERROR_MID_TRAINING, steps_done=steps_done, elapsed_s=elapsed_s))
    assert reason is Reason.INFRA
    assert "ValueError: row:" in why


@pytest.mark.parametrize(
    ("exit_code", "log_tail", "signal_name"),
    [
        (-9, "", "SIGKILL"),
        (137, "", "SIGKILL"),  # the shell's 128+N
        (247, "", "SIGKILL"),  # swift's sys.exit(-9) of a child killed by SIGKILL
        (1, SWIFT_START + SIGKILLED, "SIGKILL"),  # swift passes on torchrun's exit code 1
        (1, torchrun_failure(-9, NO_TRACEBACK), "SIGKILL"),
        (-6, NCCL_WATCHDOG, "SIGABRT"),
        (1, MISSING_DATASET + torchrun_failure(-9, "Signal 9 (SIGKILL) received by PID 1234"), "SIGKILL"),
    ],
)
def test_sigkill_is_infrastructure(exit_code: int, log_tail: str, signal_name: str) -> None:
    reason, why = classify(facts(exit_code=exit_code, log_tail=log_tail))
    assert reason is Reason.INFRA
    assert f"killed by {signal_name}" in why


@pytest.mark.parametrize(
    "log_tail",
    [HOST_OOM, "Out of memory: Killed process 1234 (python) total-vm:123456kB", ILLEGAL_MEMORY_ACCESS],
    ids=["slurm-oom-kill", "kernel-oom-killer", "illegal-memory-access"],
)
def test_host_and_gpu_faults_in_the_log_are_infrastructure(log_tail: str) -> None:
    assert classify(facts(log_tail=log_tail))[0] is Reason.INFRA


@pytest.mark.parametrize("steps_done", [0, 12])
@pytest.mark.parametrize("followed_by", ["", NCCL_REMOTE_ERROR], ids=["alone", "then-peers-fail"])
def test_cuda_oom_is_user_error_with_hint(steps_done: int, followed_by: str) -> None:
    reason, why = classify(facts(log_tail=CUDA_OOM + followed_by, steps_done=steps_done, elapsed_s=900.0))
    assert reason is Reason.USER_ERROR
    assert why.startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert "micro_batch_size" in why and "zero3" in why


def test_hang_is_infrastructure() -> None:
    reason, why = classify(facts(hung=True, exit_code=-9, steps_done=5, failed_host="gpu-a003"))
    assert reason is Reason.INFRA
    assert "no training step logged" in why and "gpu-a003" in why


@pytest.mark.parametrize(
    ("exit_code", "expected"),
    [(0, "trainer stopped early without a signal"), (1, "trainer exited with code 1")],
)
def test_unexplained_exit_is_infrastructure(exit_code: int, expected: str) -> None:
    reason, why = classify(facts(exit_code=exit_code, steps_done=3, log_tail=SWIFT_START))
    assert reason is Reason.INFRA
    assert why.startswith(expected)


# --- decide ------------------------------------------------------------------------------------------------


def history(**overrides: object) -> History:
    return replace(History(attempts=1, timeouts=0, consecutive_failures=0), **overrides)  # type: ignore[arg-type]


def test_finished_attempt_is_done() -> None:
    decision = decide(Reason.FINISHED, "training reached its last step", history(attempts=7), Budget())
    assert decision == Decision(Action.DONE, Reason.FINISHED, "training reached its last step; done")


@pytest.mark.parametrize(
    "past",
    [
        history(),
        history(attempts=500, preemptions=499),
        history(attempts=80, preemptions=30, timeouts=25, consecutive_failures=9),  # every other budget spent
    ],
)
def test_preemption_is_requeued_without_limit(past: History) -> None:
    decision = decide(Reason.PREEMPTED, "preempted after 27 training steps", past, Budget())
    assert (decision.action, decision.delay_s) == (Action.REQUEUE, 0)
    assert decision.why == "preempted after 27 training steps; requeued (preemptions are unlimited)"


@pytest.mark.parametrize(
    ("timeouts", "action"),
    [(1, Action.REQUEUE), (20, Action.REQUEUE), (21, Action.STOP)],
)
def test_timeouts_stop_after_budget(timeouts: int, action: Action) -> None:
    decision = decide(Reason.TIMED_OUT, "timed out after 900 training steps", history(timeouts=timeouts), Budget())
    assert decision.action is action
    if action is Action.STOP:
        assert "resilience.max_timeouts" in decision.why and "cluster.time" in decision.why


@pytest.mark.parametrize(
    ("consecutive_failures", "action", "delay_s"),
    [
        (0, Action.REQUEUE, 30),  # an INFRA attempt that still committed a checkpoint
        (1, Action.REQUEUE, 30),
        (2, Action.REQUEUE, 60),
        (3, Action.REQUEUE, 120),
        (4, Action.STOP, 0),
    ],
)
def test_consecutive_failures_back_off_and_exclude_failed_hosts(
    consecutive_failures: int, action: Action, delay_s: float
) -> None:
    past = history(consecutive_failures=consecutive_failures, failed_hosts=(("gpu-a1", 100.0), ("gpu-b2", 200.0)))
    decision = decide(Reason.INFRA, "NCCL error", past, Budget(), now=300.0, spare_nodes=4)
    assert (decision.action, decision.delay_s) == (action, delay_s)
    if action is Action.REQUEUE:
        assert decision.exclude_hosts == ("gpu-a1", "gpu-b2")
        assert "excluding gpu-a1,gpu-b2" in decision.why
    else:
        assert decision.why.startswith("stopped: no progress: the committed step has not advanced across 4")
        assert "the last: NCCL error" in decision.why


def test_backoff_is_capped() -> None:
    budget = Budget(max_consecutive_failures=10, backoff_base_s=30, backoff_max_s=600)
    assert decide(Reason.INFRA, "NCCL error", history(consecutive_failures=6), budget).delay_s == 600


@pytest.mark.parametrize(
    ("reason", "past", "action"),
    [
        (Reason.INFRA, history(attempts=50, consecutive_failures=1), Action.STOP),
        (Reason.TIMED_OUT, history(attempts=50, timeouts=1), Action.STOP),
        (Reason.TIMED_OUT, history(attempts=49, timeouts=1), Action.REQUEUE),
        (Reason.INFRA, history(attempts=60, preemptions=20, consecutive_failures=1), Action.REQUEUE),
        (Reason.PREEMPTED, history(attempts=50, preemptions=1), Action.REQUEUE),
    ],
)
def test_attempt_ceiling_stops_requeues_but_not_preemptions(reason: Reason, past: History, action: Action) -> None:
    decision = decide(reason, "something happened", past, Budget(max_attempts=50))
    assert decision.action is action
    if action is Action.STOP:
        assert "ceiling of 50 attempts reached" in decision.why


# --- history_after -----------------------------------------------------------------------------------------


def fold(*attempts: tuple[Reason, bool, str | None]) -> History:
    past: History | None = None
    for reason, committed, host in attempts:
        past = history_after(past, reason, committed, host)
    assert past is not None
    return past


@pytest.mark.parametrize(
    ("attempts", "consecutive_failures"),
    [
        ([(Reason.INFRA, False, None)] * 3, 3),
        ([(Reason.INFRA, False, None), (Reason.INFRA, False, None), (Reason.INFRA, True, None)], 0),
        ([(Reason.INFRA, False, None), (Reason.TIMED_OUT, True, None), (Reason.INFRA, False, None)], 1),
        ([(Reason.INFRA, False, None), (Reason.PREEMPTED, False, None), (Reason.INFRA, False, None)], 2),
        ([(Reason.INFRA, False, None), (Reason.FINISHED, False, None)], 0),
    ],
    ids=["no-progress", "checkpoint-resets", "timeout-with-checkpoint-resets", "preemption-keeps", "finish-resets"],
)
def test_progress_resets_consecutive_failures(
    attempts: list[tuple[Reason, bool, str | None]], consecutive_failures: int
) -> None:
    assert fold(*attempts).consecutive_failures == consecutive_failures


def test_history_counts_attempts_timeouts_preemptions_and_failed_hosts() -> None:
    past = fold(
        (Reason.PREEMPTED, True, None),
        (Reason.TIMED_OUT, True, None),
        (Reason.INFRA, False, "gpu-b2"),
        (Reason.INFRA, False, "gpu-a1"),
        (Reason.INFRA, False, "gpu-b2"),
    )
    assert past == History(  # a host that fails again moves to the end (fold() gives every failure time 0)
        attempts=5, timeouts=1, consecutive_failures=3, failed_hosts=(("gpu-a1", 0.0), ("gpu-b2", 0.0)), preemptions=1
    )


def record(reason: Reason, decision: Action, progressed: bool = False, host: str | None = None) -> AttemptRecord:
    return AttemptRecord(reason=reason.value, decision=decision.value, progressed=progressed, failed_host=host)


def test_recorded_history_is_the_fold_of_its_attempts() -> None:
    attempts = [
        record(Reason.PREEMPTED, Action.REQUEUE, True),
        record(Reason.INFRA, Action.REQUEUE, False, "gpu-b2"),
    ]
    assert history_of(attempts) == fold((Reason.PREEMPTED, True, None), (Reason.INFRA, False, "gpu-b2"))
    assert history_of([]) is None


def test_a_stopped_run_that_is_resubmitted_gets_a_fresh_budget_but_remembers_bad_hosts() -> None:
    stopped = [record(Reason.INFRA, Action.REQUEUE, False, "gpu-b2")] * 3 + [
        record(Reason.INFRA, Action.STOP, False, "gpu-a1")
    ]
    assert history_of(stopped) == History(
        attempts=0, timeouts=0, consecutive_failures=0, failed_hosts=(("gpu-b2", 0.0), ("gpu-a1", 0.0))
    )
    cancelled = [record(Reason.TIMED_OUT, Action.REQUEUE, True), record(Reason.CANCELLED, Action.STOP, True)]
    after = history_after(history_of(cancelled), Reason.INFRA, False, None)
    assert after.attempts == 1 and after.timeouts == 0 and after.consecutive_failures == 1


# --- stop signals of unknown cause (SLURM could not say the time limit) -------------------------------------


@pytest.mark.parametrize(("unknown_stops", "action"), [(1, Action.REQUEUE), (5, Action.REQUEUE), (6, Action.STOP)])
def test_unknown_stops_are_requeued_within_their_budget(unknown_stops: int, action: Action) -> None:
    past = history(unknown_stops=unknown_stops)
    decision = decide(Reason.UNKNOWN_STOP, "unknown stop after 3 training steps", past, Budget())
    assert (decision.action, decision.reason) == (action, Reason.UNKNOWN_STOP)
    if action is Action.STOP:
        assert "resilience.max_unknown_stops" in decision.why and "scontrol show job" in decision.why


def test_unknown_stops_count_against_the_attempt_ceiling_unlike_preemptions() -> None:
    past = history(attempts=50, unknown_stops=1)
    assert decide(Reason.UNKNOWN_STOP, "unknown stop", past, Budget(max_attempts=50)).action is Action.STOP


def test_history_counts_unknown_stops() -> None:
    past = fold((Reason.UNKNOWN_STOP, False, None), (Reason.PREEMPTED, False, None), (Reason.UNKNOWN_STOP, True, None))
    assert (past.unknown_stops, past.preemptions, past.timeouts) == (2, 1, 0)


# --- blame and exclusions ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "down"),
    [
        ("ALLOCATED", False),
        ("MIXED", False),
        ("IDLE", False),
        ("COMPLETING", False),
        ("unknown (scontrol failed)", False),
        ("IDLE+NOT_RESPONDING", True),
        ("DOWN", True),
        ("down*", True),  # sinfo's %T: '*' = not responding
        ("allocated*", True),
        ("ALLOCATED+DRAIN", True),
        ("DRAINING", True),
        ("FAIL", True),
        ("FAILING", True),
    ],
)
def test_node_states_that_blame_the_node(state: str, down: bool) -> None:
    assert node_down(state) is down


@pytest.mark.parametrize(
    ("silent", "own_faults", "blamed"),
    [
        ({}, {}, None),
        ({"gpu-b2": "ALLOCATED"}, {}, None),  # no result yet: a peer in a collective timeout, or NFS caching
        ({"gpu-b2": "IDLE+NOT_RESPONDING"}, {}, "gpu-b2"),
        ({"gpu-a1": "ALLOCATED", "gpu-b2": "DOWN+NOT_RESPONDING"}, {}, "gpu-b2"),
        ({}, {"gpu-a1": "RuntimeError: CUDA error: an illegal memory access was encountered"}, "gpu-a1"),
        ({"gpu-b2": "DOWN"}, {"gpu-a1": "Xid 79"}, "gpu-b2"),  # a lost node explains the other's errors
    ],
)
def test_a_host_is_blamed_only_on_positive_evidence(
    silent: dict[str, str], own_faults: dict[str, str], blamed: str | None
) -> None:
    verdict = blame(silent, own_faults)
    assert (verdict[0] if verdict else None) == blamed


@pytest.mark.parametrize(
    ("log_tail", "fault"),
    [
        ("[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered\n", "illegal memory access"),
        ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus\n", "Xid"),
        ("[rank0]: RuntimeError: Connection closed by peer [10.0.0.2]:29500\n", None),  # a peer's symptom
        ("[rank0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)\n", None),
        ("    raise RuntimeError('ECC error')\n", None),  # a traceback frame quoting it is no fault
    ],
)
def test_own_fault_is_a_fault_of_the_hosts_own_gpu(log_tail: str, fault: str | None) -> None:
    found = own_fault(log_tail)
    assert (found is None) if fault is None else (found is not None and fault in found)


HOUR = 3600.0


@pytest.mark.parametrize(
    ("failed_hosts", "spare_nodes", "excluded"),
    [
        ((("gpu-a1", 9 * HOUR), ("gpu-b2", 9.5 * HOUR)), 4, ("gpu-a1", "gpu-b2")),
        ((("gpu-a1", 1 * HOUR), ("gpu-b2", 9.5 * HOUR)), 4, ("gpu-b2",)),  # gpu-a1's exclusion expired
        ((("gpu-a1", 9 * HOUR), ("gpu-b2", 9.5 * HOUR)), 1, ("gpu-b2",)),  # room for one: the latest failure
        ((("gpu-a1", 9 * HOUR), ("gpu-b2", 9.5 * HOUR)), 0, ()),  # excluding would leave too few nodes
        ((("gpu-a1", 9 * HOUR),), -2, ()),  # the partition is already smaller than the job
    ],
)
def test_exclusions_expire_and_never_take_more_than_the_spare_nodes(
    failed_hosts: tuple[tuple[str, float], ...], spare_nodes: int, excluded: tuple[str, ...]
) -> None:
    past = history(failed_hosts=failed_hosts)
    budget = Budget(exclude_host_s=6 * HOUR)
    assert exclusions(past, budget, 10 * HOUR, spare_nodes) == excluded
    assert decide(Reason.INFRA, "NCCL error", past, budget, 10 * HOUR, spare_nodes).exclude_hosts == excluded


def test_history_keeps_when_each_host_last_failed() -> None:
    past = history_after(None, Reason.INFRA, False, "gpu-b2", at=100.0)
    past = history_after(past, Reason.INFRA, False, "gpu-a1", at=200.0)
    past = history_after(past, Reason.INFRA, False, "gpu-b2", at=300.0)
    assert past.failed_hosts == (("gpu-a1", 200.0), ("gpu-b2", 300.0))
    recorded = [
        AttemptRecord(reason="infra", decision="requeue", failed_host="gpu-b2", end=100.0),
        AttemptRecord(reason="infra", decision="requeue", failed_host=None, end=150.0),
    ]
    assert history_of(recorded) == history_after(
        history_after(None, Reason.INFRA, False, "gpu-b2", 100.0), Reason.INFRA, False, None, 150.0
    )


# --- restart in place: every node alive, within the allocation's restart budget ---------------------------

ALIVE = Allocation(all_alive=True, restarts=0)


@pytest.mark.parametrize(
    ("reason", "allocation", "action"),
    [
        (Reason.INFRA, ALIVE, Action.RESTART),  # a worker crash, a NCCL error, a hang: restart on the same nodes
        (Reason.INFRA, Allocation(all_alive=True, restarts=4), Action.RESTART),  # the 5th of 5
        (Reason.INFRA, Allocation(all_alive=True, restarts=5), Action.REQUEUE),  # the budget is spent
        (Reason.INFRA, Allocation(all_alive=False), Action.REQUEUE),  # a node is lost
        (Reason.INFRA, None, Action.REQUEUE),  # nothing known about the nodes
        (Reason.PREEMPTED, ALIVE, Action.REQUEUE),  # SLURM wants the nodes back
        (Reason.TIMED_OUT, ALIVE, Action.REQUEUE),
        (Reason.UNKNOWN_STOP, ALIVE, Action.REQUEUE),
        (Reason.USER_ERROR, ALIVE, Action.STOP),  # fails the same way again
        (Reason.FINISHED, ALIVE, Action.DONE),
    ],
)
def test_restart_in_place_only_when_every_node_is_alive_and_slurm_did_not_ask(
    reason: Reason, allocation: Allocation | None, action: Action
) -> None:
    past = history(consecutive_failures=1 if reason is Reason.INFRA else 0, timeouts=1, unknown_stops=1)
    assert decide(reason, "worker killed", past, Budget(), allocation=allocation).action is action


def test_restart_in_place_has_no_backoff_and_says_which_restart_it_is() -> None:
    decision = decide(Reason.INFRA, "NCCL error", history(consecutive_failures=2), Budget(), allocation=ALIVE)
    assert (decision.delay_s, decision.exclude_hosts) == (0, ())
    assert decision.why == "infrastructure failure: NCCL error; every node is alive: restarted in place (1 of 5)"


def test_a_spent_restart_budget_requeues_and_names_the_setting() -> None:
    spent = Allocation(all_alive=True, restarts=2)
    decision = decide(
        Reason.INFRA, "NCCL error", history(consecutive_failures=1), Budget(max_restarts=2), allocation=spent
    )
    assert (decision.action, decision.delay_s) == (Action.REQUEUE, 30)
    assert "restarts in place of this allocation are spent (`resilience.max_restarts`)" in decision.why


def test_restarts_without_progress_stop_the_run_with_no_progress() -> None:
    """The committed step has not advanced across max_consecutive_failures restarts: stop, never requeue."""
    stuck = history(consecutive_failures=Budget().max_consecutive_failures + 1)
    decision = decide(Reason.INFRA, "trainer killed by SIGKILL", stuck, Budget(), allocation=ALIVE)
    assert decision.action is Action.STOP
    assert decision.why.startswith("stopped: no progress")


def test_restarts_count_in_the_history_like_any_infra_attempt() -> None:
    recorded = [
        AttemptRecord(reason="infra", decision="restart", progressed=False, end=1.0),
        AttemptRecord(reason="infra", decision="restart", progressed=False, end=2.0),
    ]
    assert history_of(recorded) == history(attempts=2, consecutive_failures=2, failed_hosts=())


# --- an error at start-up is the user's only on a run that never trained (issue 25, item 3) ---------------

STALE_FILE_HANDLE = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/swift/llm/train/sft.py", line 120, in _prepare_model_tokenizer
[rank0]:     with open(os.path.join(model_dir, 'config.json')) as f:
[rank0]: OSError: [Errno 116] Stale file handle: '/models/Qwen3-8B/config.json'
"""

HUB_CONNECTION_ERROR = """\
Traceback (most recent call last):
  File "/opt/conda/lib/python3.11/site-packages/requests/adapters.py", line 700, in send
    raise ConnectionError(e, request=request)
requests.exceptions.ConnectionError: HTTPSConnectionPool(host='www.modelscope.cn', port=443): Max retries exceeded
"""


@pytest.mark.parametrize(
    ("log_tail", "trained_before", "reason"),
    [
        (STALE_FILE_HANDLE, False, Reason.USER_ERROR),
        (STALE_FILE_HANDLE, True, Reason.INFRA),  # resumed after days of training: the same files worked
        (HUB_CONNECTION_ERROR, False, Reason.USER_ERROR),
        (HUB_CONNECTION_ERROR, True, Reason.INFRA),
        (MISSING_DATASET, True, Reason.INFRA),
        (CUDA_OOM, True, Reason.USER_ERROR),  # the same batch on the same GPUs runs out of memory again
    ],
    ids=["stale-handle-new", "stale-handle-trained", "hub-new", "hub-trained", "dataset-trained", "oom-trained"],
)
def test_an_error_at_start_up_is_a_user_error_only_on_a_run_that_never_trained(
    log_tail: str, trained_before: bool, reason: Reason
) -> None:
    classified, why = classify(facts(log_tail=log_tail, elapsed_s=35.0, trained_before=trained_before))
    assert classified is reason, why
    decision = decide(classified, why, history(), Budget())
    assert decision.action is (Action.STOP if reason is Reason.USER_ERROR else Action.REQUEUE)
    if reason is Reason.INFRA:
        assert "the run trained before" in why


# --- stop signals that never let a checkpoint be committed (issue 25, item 5) -------------------------------


@pytest.mark.parametrize(
    ("reason", "stops", "action"),
    [
        (Reason.PREEMPTED, 1, Action.REQUEUE),
        (Reason.PREEMPTED, 10, Action.REQUEUE),
        (Reason.PREEMPTED, 11, Action.STOP),  # preemptions are unlimited only while they let the run progress
        (Reason.TIMED_OUT, 11, Action.STOP),
        (Reason.UNKNOWN_STOP, 11, Action.STOP),
        (Reason.INFRA, 11, Action.REQUEUE),  # infrastructure failures have their own count
    ],
)
def test_stop_signals_without_progress_stop_the_run_once_their_budget_is_spent(
    reason: Reason, stops: int, action: Action
) -> None:
    past = history(attempts=stops, preemptions=stops, stops_without_progress=stops, timeouts=1, unknown_stops=1)
    decision = decide(reason, f"{reason.value} before any training step", past, Budget())
    assert decision.action is action, decision.why
    if action is Action.STOP:
        assert decision.reason is reason
        assert decision.why.startswith(f"stopped: no progress: the last {stops} attempts were ended by a stop signal")
        assert "cluster.signal_lead_s" in decision.why and "resilience.max_stops_without_progress" in decision.why


@pytest.mark.parametrize(
    ("attempts", "stops"),
    [
        ([(Reason.PREEMPTED, False, None)] * 3, 3),
        ([(Reason.PREEMPTED, False, None), (Reason.TIMED_OUT, False, None), (Reason.UNKNOWN_STOP, False, None)], 3),
        ([(Reason.PREEMPTED, False, None), (Reason.PREEMPTED, True, None), (Reason.PREEMPTED, False, None)], 1),
        ([(Reason.PREEMPTED, False, None), (Reason.INFRA, False, None), (Reason.PREEMPTED, False, None)], 2),
        ([(Reason.PREEMPTED, False, None), (Reason.INFRA, True, None)], 0),
    ],
    ids=["preemptions", "any-stop-signal", "a-commit-resets", "a-failure-keeps", "a-failure-with-commit-resets"],
)
def test_history_counts_stop_signals_in_a_row_without_progress(
    attempts: list[tuple[Reason, bool, str | None]], stops: int
) -> None:
    assert fold(*attempts).stops_without_progress == stops
    records = [record(reason, Action.REQUEUE, committed) for reason, committed, _ in attempts]
    assert history_of(records) == fold(*attempts)


def test_a_run_whose_last_step_was_restored_says_so_not_zero_steps_this_attempt() -> None:
    """A new run dir of a run name trained before: the restore brings its last step, no trainer starts."""
    url = "s3://b/swiftslurm/moved/checkpoint-120"
    reason, why = classify(facts(reached_last_step=True, steps_done=0, restored_from=url))
    assert (reason, why) == (Reason.FINISHED, f"nothing left to train: its last step was restored from {url}")
    assert "steps this attempt" in classify(facts(reached_last_step=True, steps_done=0))[1]
