"""StorageSpec: the storage section of a plan, checked before anything reaches the object store (the store
itself, against SeaweedFS: tests/component/test_store.py)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from swiftslurm.errors import StorageError
from swiftslurm.ops import storage_cli
from swiftslurm.ops.waiting import REPEAT_S, Narrator
from swiftslurm.plan import StorageSpec


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("addressing_style", "sideways", "Valid values are: auto, path, virtual"),
        ("part_size_mb", 1, "at least 5 MiB"),
        ("bucket", "", "storage.bucket is empty"),
        ("keep", -1, "storage.keep=-1"),
    ],
)
def test_spec_rejects_bad_values_with_a_fix(field: str, value: object, message: str) -> None:
    with pytest.raises(StorageError, match=message):
        StorageSpec.from_dict({"bucket": "b", "prefix": "p", field: value})


def test_spec_from_plan_ignores_unknown_keys() -> None:
    spec = StorageSpec.from_dict({"bucket": "b", "prefix": "/runs/x/", "keep": 3, "from_the_future": 1})
    assert (spec.keep, spec.root, spec.url) == (3, "runs/x/", "s3://b/runs/x/")


def test_a_torn_plan_json_is_an_error_that_names_the_file(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "plan.json").write_text('{"storage": {"bucket": ')
    assert storage_cli.main(["list", "--run-dir", str(tmp_path)]) == 2
    assert f"{tmp_path / 'plan.json'} is not a whole JSON object" in capsys.readouterr().err


def test_a_transfer_says_its_size_and_retries_at_once_then_its_bytes_every_repeat_s() -> None:
    """The storage CLI's report of a download (store.TransferReport), on a fake clock: the ticker's looks in
    between say nothing until REPEAT_S has passed; bytes that stop moving are said as 'still ...' with the time."""
    now, out = [0.0], io.StringIO()
    spec = StorageSpec(bucket="b", prefix="p", max_attempts=10, timeout_s=60)
    progress = storage_cli.Progress(Narrator(out=out, clock=lambda: now[0]), spec)
    progress.tick()  # nothing started yet: nothing to say
    progress.started("downloading checkpoint-20 from s3://b/p/", 3 << 30)
    for second in range(1, 46):
        now[0] = float(second)
        progress.moved(1 << 30 if second in (10, 20) else 0)
        progress.tick()
    assert [line.split("  ", 1)[1] for line in out.getvalue().splitlines()] == [
        "downloading checkpoint-20 from s3://b/p/: 3.0 GiB (each request up to 10 tries, 60 s timeouts)...",
        "downloading checkpoint-20 from s3://b/p/ (1.0 of 3.0 GiB, 33%)",
        "downloading checkpoint-20 from s3://b/p/ (2.0 of 3.0 GiB, 67%)",
        f"still downloading checkpoint-20 from s3://b/p/ (2.0 of 3.0 GiB, 67%) ({3 * REPEAT_S:.0f} s)",
    ]
