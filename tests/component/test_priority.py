"""Background uploads run at idle CPU priority, in their own threads only (swiftslurm.storage.priority)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority is Linux's")


AUTOGROUP = Path("/proc/self/autogroup")


AUTOGROUP_ENABLED = Path("/proc/sys/kernel/sched_autogroup_enabled")


def autogroups_on() -> bool:
    return AUTOGROUP.exists() and AUTOGROUP_ENABLED.exists() and AUTOGROUP_ENABLED.read_text().strip() == "1"


def session_nice(autogroup_text: str) -> str | None:
    """ "/autogroup-123 nice 19" -> "19"; None for a process in the first session's group, whose file is empty."""
    words = autogroup_text.split()
    return words[-1] if words else None


@pytest.mark.skipif(not autogroups_on(), reason="a kernel without autogroups, or with them switched off")
def test_idle_lowers_the_share_of_a_session_it_leads_and_no_other() -> None:
    """As under srun: the process leads a session of its own. This test's process does not lead its session
    (a shell's, or on CI the first session's, whose autogroup file is empty), and its session keeps its share
    (the other tests here lowered threads of this process)."""
    script = (
        "import pathlib; from swiftslurm.storage.priority import lower_this_thread; "
        "lower_this_thread('idle'); print(pathlib.Path('/proc/self/autogroup').read_text())"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, start_new_session=True
    )
    assert session_nice(done.stdout) == "19"
    if os.getsid(0) != os.getpid():
        assert session_nice(AUTOGROUP.read_text()) != "19"
