"""Fixtures of the component tier only: real servers on this machine, no SLURM."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.s3server import SeaweedServer, serve_for_tests


@pytest.fixture(scope="module")
def s3_server(request: pytest.FixtureRequest) -> Iterator[SeaweedServer]:
    """A SeaweedFS server for the test module, holding the bucket the module names in BUCKET."""
    yield from serve_for_tests(request, request.module.BUCKET)
