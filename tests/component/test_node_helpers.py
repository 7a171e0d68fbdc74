"""Signal forwarding targets, progress parsing and run records."""

from __future__ import annotations

import subprocess
import sys
import time

from swiftslurm.signals import descendants


def test_descendants_include_children_that_started_their_own_session() -> None:
    # parent -> child in a new session (like torchrun's workers) -> grandchild
    code = (
        "import subprocess, sys, time;"
        "subprocess.Popen([sys.executable, '-c', 'import subprocess,sys,time;"
        'subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]); time.sleep(30)\'],'
        " start_new_session=True); time.sleep(30)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while len(descendants(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(descendants(parent.pid)) == 2
    finally:
        for pid in descendants(parent.pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        parent.kill()
        parent.wait()
