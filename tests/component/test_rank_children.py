"""What a training rank starts never acts on a stop signal; the rank still gets it.

SLURM signals every process of the job step (`--signal=USR2@N`, `scancel --signal`; TERM at a cancel or a
preemption). Here a rank-like process (the stop handler installed as StopRequest does, the children blocked as the
plugins do at import) starts children in every way a rank does, and the test signals its whole process group, as
SLURM signals the step's cgroup. A child that answers a ping sent after the signal survived it: a pending signal
is acted on before a process runs again. The children's /proc status shows the mechanism: blocked and pending."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from swiftslurm.signals import RANK_STOP_SIGNALS

REPO = Path(__file__).resolve().parents[2]

# Every kind of child a rank starts: multiprocessing's three start methods (data loader workers, engines made by
# multiprocessing), and exec'ed programs through subprocess's fork_exec and its posix_spawn path (close_fds=False).
# Each answers a ping; an mp child also says how often the rank's handler ran in it (a forked one inherits it).
RANK = """
import json, multiprocessing as mp, os, subprocess, sys, time
from swiftslurm.signals import RANK_STOP_SIGNALS, children_never_see_stop_signals, install

got = []
ECHO = "import sys\\nfor line in sys.stdin: print(line.strip(), flush=True)"


def child(conn):
    while conn.recv() is not None:
        conn.send(len(got))


def ping_mp(conn, proc):
    try:
        conn.send(0)
        if conn.poll(30):
            return {"answered": True, "handler_ran": conn.recv()}
    except (EOFError, OSError):
        pass
    proc.join(10)
    return {"answered": False, "exit": proc.exitcode}


def ping_exec(proc):
    try:
        proc.stdin.write(b"ping\\n")
        proc.stdin.flush()
        if proc.stdout.readline() == b"ping\\n":
            return {"answered": True}
    except OSError:
        pass
    return {"answered": False, "exit": proc.wait(10)}


if __name__ == "__main__":
    children_never_see_stop_signals()  # as swift_plugin / megatron_plugin at import
    install(lambda signum, _frame: got.append(signum), RANK_STOP_SIGNALS)  # as StopRequest
    mp_children = {}
    for method in ("spawn", "fork", "forkserver"):
        mine, theirs = mp.Pipe()
        proc = mp.get_context(method).Process(target=child, args=(theirs,), daemon=True)
        proc.start()
        theirs.close()
        mp_children[method] = (mine, proc)
    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    exec_children = {
        "popen": subprocess.Popen([sys.executable, "-c", ECHO], **pipes),
        "popen_posix_spawn": subprocess.Popen([sys.executable, "-c", ECHO], close_fds=False, **pipes),
    }
    pids = {name: proc.pid for name, (_, proc) in mp_children.items()}
    pids.update({name: proc.pid for name, proc in exec_children.items()})
    print(json.dumps(pids), flush=True)
    for line in sys.stdin:  # the test has signalled the group, then sends the signal's number
        signum = int(line)
        while signum not in got:
            time.sleep(0.01)
        report = {name: ping_mp(conn, proc) for name, (conn, proc) in mp_children.items()}
        report.update({name: ping_exec(proc) for name, proc in exec_children.items()})
        print(json.dumps({"rank_got": got, "children": report}), flush=True)
    for proc in exec_children.values():
        proc.kill()
"""


def start_rank(script: str, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    path = tmp_path / "rank.py"  # a file, not -c: spawned children import the main module
    path.write_text(script)
    return subprocess.Popen(
        [sys.executable, str(path), *args],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: the test signals all of it, never itself
    )


def read_line(rank: subprocess.Popen[str], timeout_s: float = 120) -> Any:
    assert rank.stdout is not None
    ready, _, _ = select.select([rank.stdout], [], [], timeout_s)
    line = rank.stdout.readline() if ready else ""
    if not line:
        rank.kill()
        pytest.fail(f"the rank said nothing (exit {rank.wait()}): {errors(rank)[:4000]}")
    return json.loads(line)


def errors(rank: subprocess.Popen[str]) -> str:
    assert rank.stderr is not None
    return rank.stderr.read()


def tell(rank: subprocess.Popen[str], line: str) -> None:
    assert rank.stdin is not None
    rank.stdin.write(line + "\n")
    rank.stdin.flush()


def blocked_and_pending(pid: int, signum: int) -> bool:
    """Whether ``pid`` blocks ``signum`` and has it pending: it was sent and the process never acts on it."""
    fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return all(int(fields[name], 16) >> (signum - 1) & 1 for name in ("SigBlk", "ShdPnd"))


def end(rank: subprocess.Popen[str]) -> None:
    """KILL what the test started: the rank's whole group."""
    if rank.poll() is None:
        os.killpg(rank.pid, signal.SIGKILL)
        rank.wait()


def test_what_a_rank_starts_outlives_every_stop_signal_sent_to_the_whole_step(tmp_path: Path) -> None:
    rank = start_rank(RANK, tmp_path)
    try:
        pids = read_line(rank)
        for signum in RANK_STOP_SIGNALS:
            os.killpg(rank.pid, signum)  # every process of the group, as SLURM signals every process of the step
            tell(rank, str(int(signum)))
            report = read_line(rank)

            name = signal.Signals(signum).name
            survived = {child: {"answered": True} for child in ("popen", "popen_posix_spawn")}
            survived.update({child: {"answered": True, "handler_ran": 0} for child in ("spawn", "fork", "forkserver")})
            assert report["children"] == survived, f"after {name}"
            assert signum in report["rank_got"], f"the rank did not see {name}"
            assert all(blocked_and_pending(pid, signum) for pid in pids.values()), name
        rank.stdin.close()  # type: ignore[union-attr]
        assert rank.wait(60) == 0, errors(rank)[-3000:]
    finally:
        end(rank)


# A rank's data loader as ms-swift builds it: 2 workers, persistent (ms-swift's default), still referenced at exit.
LOADER_RANK = """
import json, sys, time
from torch.utils.data import DataLoader
from swiftslurm.signals import RANK_STOP_SIGNALS, children_never_see_stop_signals, install

got = []
if __name__ == "__main__":
    children_never_see_stop_signals()
    install(lambda signum, _frame: got.append(signum), RANK_STOP_SIGNALS)
    loader = DataLoader(
        list(range(64)), batch_size=4, num_workers=2, persistent_workers=True, multiprocessing_context=sys.argv[1]
    )
    batches = iter(loader)
    seen = [next(batches)]
    print(json.dumps([worker.pid for worker in batches._workers]), flush=True)
    for line in sys.stdin:
        signum = int(line)
        while signum not in got:
            time.sleep(0.01)
        seen += [next(batches) for _ in range(3)]
        print(json.dumps({"rank_got": got, "batches": len(seen)}), flush=True)
    seen += list(batches) + list(loader)  # the rest of this epoch and a second one, on the same workers
    print(json.dumps({"batches": len(seen)}), flush=True)
"""


@pytest.mark.parametrize("context", ["spawn", "fork"])
def test_a_data_loader_keeps_its_workers_through_the_stop_signals(tmp_path: Path, context: str) -> None:
    pytest.importorskip("torch")
    rank = start_rank(LOADER_RANK, tmp_path, context)
    try:
        workers = read_line(rank)
        never_acted_on = []
        for count, signum in enumerate((signal.SIGUSR2, signal.SIGTERM)):
            os.killpg(rank.pid, signum)
            tell(rank, str(int(signum)))
            report = read_line(rank)  # the next batches came: both workers are alive
            assert report["batches"] == 4 + 3 * count and signum in report["rank_got"]
            never_acted_on.append(all(blocked_and_pending(pid, signum) for pid in workers))
        assert never_acted_on == [True, True]
        rank.stdin.close()  # type: ignore[union-attr]
        assert read_line(rank) == {"batches": 32}
        # The workers never see multiprocessing's TERM at exit either: without a stand-in it would wait forever.
        assert rank.wait(60) == 0
        logged = errors(rank)
        assert "killed by signal" not in logged and "exited unexpectedly" not in logged, logged[-3000:]
    finally:
        end(rank)
