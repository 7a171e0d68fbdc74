"""scripts/slurm-local.sh starts long-lived daemons: none of them may keep a lock its caller holds.

`flock FILE bash scripts/slurm-local.sh up --force` (how a bench reconfigures the shared cluster) ran the
daemons with the caller's lock fd open: munged, MariaDB and slurmdbd held FILE's lock for as long as they ran,
and every later `flock FILE` waited for ever."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm-local.sh"

# The script's own start_daemon and close_inherited_fds, run as the script runs them (its lock on fd 9).
START_ONE = """
set -euo pipefail
STATE=$1
mkdir -p "$STATE/log" "$STATE/pids"
eval "$(sed -n '/^start_daemon() {/,/^}/p;/^close_inherited_fds() {/,/^}/p' "$2")"
exec 9>"$STATE/own.lock"
flock 9
start_daemon sleeper sleep sleep 60
"""


def test_a_daemon_keeps_neither_the_scripts_lock_nor_its_callers(tmp_path: Path) -> None:
    caller_lock = tmp_path / "caller.lock"
    started = subprocess.run(
        ["flock", str(caller_lock), "bash", "-c", START_ONE, "start-one", str(tmp_path), str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 0, started.stderr
    pid = int((tmp_path / "pids" / "sleeper.pid").read_text().split()[0])
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}/comm").read_text().strip() != "sleep":  # the recorded PID becomes the daemon
            assert time.monotonic() < deadline, Path(f"/proc/{pid}/comm").read_text()
            time.sleep(0.01)
        assert sorted(int(fd.name) for fd in Path(f"/proc/{pid}/fd").iterdir()) == [0, 1, 2]
        for lock in (caller_lock, tmp_path / "own.lock"):
            free = subprocess.run(["flock", "--nonblock", str(lock), "true"], capture_output=True)
            assert free.returncode == 0, f"{lock.name} is still held while the daemon runs"
    finally:
        subprocess.run(["kill", str(pid)], check=False)
