"""Unit tests plan with a pinned cache path so renderings do not depend on $HOME, and never reach SLURM."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from swiftslurm import slurm
from tests.conftest import FIXED_CACHE


@pytest.fixture(autouse=True)
def _fixed_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny-model paths in plans come from SWIFTSLURM_CACHE; pin it so goldens do not depend on $HOME."""
    monkeypatch.setenv("SWIFTSLURM_CACHE", FIXED_CACHE)


def no_slurm_here(argv: Sequence[str], timeout_s: float) -> slurm.Answer:
    """The SLURM seam's runner as on a machine without SLURM: every command is missing from PATH."""
    raise FileNotFoundError(2, "No such file or directory", argv[0])


@pytest.fixture(autouse=True)
def _no_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests never start a SLURM command, whatever cluster is up: by default SLURM's commands are missing
    (what a laptop or CI sees); a test that needs SLURM's answers replaces slurm.runner (or slurm.run) itself."""
    monkeypatch.setattr(slurm, "runner", no_slurm_here)
