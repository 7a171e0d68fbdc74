"""Issue 14 item 6: the wrapper's one SignalLog decides what a stop signal means in every phase, not only while
the trainer runs. A signal before the resume point is published starts no trainer and ends the attempt as
signalled (the leader concludes and requeues it), the nodes waiting for the resume point and a restore stop
promptly, a signal during the upload drain cuts it short, and a signal is acted on once.

Signals here are real (sent to this process); the trainer is replaced (tests/cluster/test_signals.py runs
the real one on the SLURM cluster)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from swiftslurm.node.attempt import _DrainCut
from swiftslurm.node.resume import Interrupted, agree_on_resume
from swiftslurm.plan import StorageSpec
from swiftslurm.rundir.layout import RESUME, attempt_dir
from swiftslurm.signals import SignalLog
from swiftslurm.storage.store import CheckpointStore
from swiftslurm.storage.uploader import Uploader
from swiftslurm.testing.s3 import FaultProxy, Faults, SeaweedServer, use_test_credentials
from tests.unit.test_signal_ownership import LOCAL, PROMPT_S, committed_checkpoint, local_plan


def wait_for(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


BUCKET = "swiftslurm-signals"


STALL_S = 3.0


def test_a_signal_cuts_the_upload_drain_to_what_slurm_allows(tmp_path: Path) -> None:
    # Nothing listens on port 9: every upload fails and stays pending, so only the cut ends the drain early.
    unreachable = StorageSpec(bucket="b", prefix="p", endpoint_url="http://127.0.0.1:9", max_attempts=1, timeout_s=1)
    uploader = Uploader(CheckpointStore(unreachable))
    uploader.submit(committed_checkpoint(tmp_path, 10, last_step=20))
    log = SignalLog()
    cut = _DrainCut(LOCAL, log, seen=0)
    assert cut.left_s() == float("inf")  # no signal: the drain keeps its budget
    started = time.monotonic()
    with log.installed():
        signal.raise_signal(signal.SIGTERM)
        left = uploader.drain(600, cut.left_s)
    assert len(left) == 1 and time.monotonic() - started < PROMPT_S + unreachable.timeout_s + 5
    assert cut.left_s() <= 0  # SLURM cannot say when it ends (no SLURM here): nothing is left


def test_a_signal_cancels_a_real_restore_mid_download(
    tmp_path: Path, s3_server: SeaweedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_test_credentials(monkeypatch)
    direct = StorageSpec(bucket=BUCKET, prefix="restore", endpoint_url=s3_server.endpoint_url, part_size_mb=8)
    CheckpointStore(direct).upload(committed_checkpoint(tmp_path / "elsewhere", 10, last_step=20, mib=32))
    run_dir = tmp_path / "run"
    output = run_dir / "output"
    # Every request through the proxy stalls STALL_S: the download is still running when the signal comes,
    # whatever the machine's speed; the signal comes once the download has begun (its staging dir exists).
    with FaultProxy(s3_server.endpoint_url, Faults(stall_rate=1.0, stall_s=STALL_S)) as proxy:
        plan = replace(local_plan(run_dir), storage=replace(direct, endpoint_url=proxy.url))
        log = SignalLog()
        signalled: list[float] = []

        def signal_once_downloading() -> None:
            wait_for(lambda: any(output.glob(".checkpoint-10.download-*")), 120)
            signalled.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGUSR2)

        with log.installed(), pytest.raises(Interrupted, match="during the restore"):
            threading.Thread(target=signal_once_downloading, daemon=True).start()
            agree_on_resume(plan, attempt_dir(run_dir, "a1"), True, stopped=lambda: bool(log.received))
        took = time.monotonic() - signalled[0]
    # The part in flight ends (its request and reply each stall: 6 s measured), no new part starts.
    assert took < 2 * STALL_S + PROMPT_S, took
    assert sorted(p.name for p in output.iterdir()) == []  # nothing half-downloaded is left
    assert not (attempt_dir(run_dir, "a1") / RESUME).exists()


ENDED_CHILD = """
import signal, sys
from swiftslurm.errors import SwiftSlurmError
from swiftslurm.node.__main__ import main
from swiftslurm.node.supervise import submitit_entry

if sys.argv[1] == "sbatch":
    code = main([sys.argv[2]])  # no plan.json there: refused, after the wrapper installed its handlers
else:
    try:
        submitit_entry(sys.argv[2])
    except SwiftSlurmError:
        code = 2
status = open("/proc/self/status").read().splitlines()
ignored = int(next(line for line in status if line.startswith("SigIgn:")).split()[1], 16)
print(code, [bool(ignored >> (s - 1) & 1) for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)])
"""


@pytest.mark.parametrize("entry", ["sbatch", "submitit"])
def test_a_finished_wrapper_ignores_stop_signals_until_the_process_is_gone(tmp_path: Path, entry: str) -> None:
    """Interpreter shutdown puts SIG_DFL back for every signal with a Python handler, so a USR2 in a finished
    follower's last milliseconds killed it by default action; srun then killed the leader in its upload drain and
    SLURM called the finished run FAILED (seen in test_signals' drain test). Once a wrapper's work is done both
    entry points leave the stop signals ignored at the kernel, which shutdown does not undo."""
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    for key in [k for k in env if k.startswith("SLURM_")]:
        del env[key]
    done = subprocess.run(
        [sys.executable, "-c", ENDED_CHILD, entry, str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert done.stdout.strip().splitlines()[-1] == "2 [True, True, True]", (done.stdout, done.stderr)


# Imported by the interpreter at its start (sitecustomize on PYTHONPATH), before `-m swiftslurm.node` runs: holds
# the import of the wrapper's machinery (supervise.py and all it brings) until the test has sent its signal.
HELD_IMPORT = """
import os, sys, time
from pathlib import Path

HELD, RELEASE = Path(os.environ["HELD"]), Path(os.environ["RELEASE"])

class HoldSupervise:
    def find_spec(self, name, path=None, target=None):
        if name == "swiftslurm.node.supervise":
            HELD.write_text("importing")
            while not RELEASE.exists():
                time.sleep(0.01)
        return None

sys.meta_path.insert(0, HoldSupervise())
"""


def test_a_stop_signal_while_the_wrapper_still_imports_is_not_fatal(tmp_path: Path) -> None:
    """SLURM's USR2 can reach a node's wrapper while it imports (seconds from a shared file system, or with many
    nodes starting on loaded cores): the wrapper takes the stop signals over before it imports its machinery,
    so it lives on and ends as it would have (here: refused, no plan.json), not killed by the default action."""
    import subprocess
    import sys

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HELD_IMPORT)
    held, release = tmp_path / "held", tmp_path / "release"
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": f"{hook}:{root}", "HELD": str(held), "RELEASE": str(release)}
    for key in [k for k in env if k.startswith("SLURM_")]:
        del env[key]
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "swiftslurm.node", str(tmp_path / "no-run-dir")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(held.is_file, 60)
        wrapper.send_signal(signal.SIGUSR2)
        release.touch()
        out, err = wrapper.communicate(timeout=120)
    finally:
        wrapper.kill()
    assert wrapper.returncode == 2, (wrapper.returncode, out, err)
    assert "plan.json" in err + out, (out, err)
