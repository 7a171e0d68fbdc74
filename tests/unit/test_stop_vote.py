"""StopVote: every rank reads the same vote at the same step, over a real two-process gloo group.

Step lengths come from a clock the test advances, so the mode (asynchronous for short steps, synchronous for
long ones) does not depend on how fast this machine runs the loop."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from swiftslurm.engines.stop_vote import StopVote  # noqa: E402


def test_one_process_decides_at_once() -> None:
    vote = StopVote()
    vote.join()  # torch.distributed not initialised: no group
    assert vote.step_end(False) is False
    assert vote.step_end(True) is True
    vote.finish()
