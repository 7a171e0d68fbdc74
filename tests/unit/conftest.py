"""Unit tests plan with a pinned cache path so renderings do not depend on $HOME."""

from __future__ import annotations

import pytest

from tests.conftest import FIXED_CACHE


@pytest.fixture(autouse=True)
def _fixed_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny-model paths in plans come from SWIFTSLURM_CACHE; pin it so goldens do not depend on $HOME."""
    monkeypatch.setenv("SWIFTSLURM_CACHE", FIXED_CACHE)
