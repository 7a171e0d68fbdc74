"""Shared by every tier: composing real conf/ configurations and planning them without side effects; the S3
server; and the tier's time budget (SWIFTSLURM_TIER_BUDGET_S, set by scripts/test.sh) that fails the session
when exceeded."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from swiftslurm.__main__ import to_config
from swiftslurm.plan import JobPlan
from swiftslurm.planning.config import Config, open_dict_overrides, register_configs
from swiftslurm.planning.make import PlanContext, make_plan
from swiftslurm.testing.s3 import SeaweedServer, serve_for_tests, use_test_credentials

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"
FIXED_PYTHON = "/opt/venv/bin/python"
FIXED_CACHE = "/shared/cache/swiftslurm"


def compose_config(*overrides: str) -> Config:
    """The Config that `python -m swiftslurm OVERRIDES` would see."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return to_config(compose("config", overrides=open_dict_overrides(list(overrides))))


def plan_for(*overrides: str, cwd: Path = Path("/home/user/project")) -> JobPlan:
    """Plan with fixed outside facts (cwd, python, cache) so renderings are reproducible."""
    ctx = PlanContext(cwd=cwd, python=FIXED_PYTHON, env={"SWIFTSLURM_CACHE": FIXED_CACHE})
    return make_plan(compose_config(*overrides), ctx)


def file_rendezvous(folder: Path) -> str:
    """The init_method of a test's torch.distributed process group: a FileStore in ``folder``, a new file each
    call. A TCP port found free and released before rank 0 binds it can be taken meanwhile by any process on the
    machine (EADDRINUSE, seen with the cluster tier beside the component tier); a file cannot."""
    return f"file://{folder / f'rendezvous-{uuid.uuid4().hex}'}"


BUDGET_ENV = "SWIFTSLURM_TIER_BUDGET_S"
SLOWDOWN_ENV = "SWIFTSLURM_MACHINE_SLOWDOWN"  # swiftslurm/testing/speed.py
_session_start = time.monotonic()


def pytest_sessionstart(session: pytest.Session) -> None:
    global _session_start
    _session_start = time.monotonic()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A tier that outgrows its budget fails loudly, even when every test passed."""
    budget = os.environ.get(BUDGET_ENV)
    if not budget:
        return
    took = time.monotonic() - _session_start
    if took > float(budget):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        scale = os.environ.get(SLOWDOWN_ENV, "1")
        message = (
            f"this tier took {took:.0f} s, over its budget of {budget} s ({BUDGET_ENV}, set in scripts/test.sh, "
            f"already x {scale} for this machine's measured slowdown, {SLOWDOWN_ENV}): make the slow tests faster "
            "(--durations=15 names them), or raise the budget there saying why"
        )
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_sep("=", "TIER BUDGET EXCEEDED", red=True, bold=True)
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="module")
def s3_server(request: pytest.FixtureRequest) -> Iterator[SeaweedServer]:
    """SeaweedFS with the requesting module's BUCKET, listening on its S3_HOST (default 127.0.0.1; jobs on the
    local cluster need the bridge address)."""
    yield from serve_for_tests(getattr(request.module, "S3_HOST", "127.0.0.1"), request.module.BUCKET)


@pytest.fixture
def s3_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test server's credentials where boto3's chain finds them on a node: the environment."""
    use_test_credentials(monkeypatch)
