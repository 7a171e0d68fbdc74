"""Unit tests are hermetic (tests/unit/hermetic.py), never reach SLURM, and plan with a pinned cache path so
renderings do not depend on $HOME."""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence

import pytest

from swiftslurm import slurm
from tests.conftest import FIXED_CACHE
from tests.unit.hermetic import Guard, install

GUARD = Guard()


@pytest.fixture(scope="session", autouse=True)
def hermetic_guard() -> Iterator[Guard]:
    """Installed before any other fixture of the session, so session fixtures are guarded too."""
    with pytest.MonkeyPatch.context() as patch:
        install(GUARD, patch)
        yield GUARD


_CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    elif report.when == "setup" and report.failed:
        GUARD.take()  # a fixture's refusal failed this setup and is reported with it, not with the next test
    return report


@pytest.fixture(autouse=True)
def _hermetic(hermetic_guard: Guard, request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test for every process or socket it attempted, even one whose HermeticityError it swallowed
    (a test that failed already, on the HermeticityError itself most often, is not failed twice)."""
    yield
    attempted = hermetic_guard.take()
    if attempted and not request.node.stash.get(_CALL_FAILED, False):
        pytest.fail("not hermetic:\n" + "\n".join(attempted), pytrace=False)


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
