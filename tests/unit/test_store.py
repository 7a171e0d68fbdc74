"""StorageSpec: the storage section of a plan, checked before anything reaches the object store (the store
itself, against SeaweedFS: tests/component/test_store.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from swiftslurm.errors import StorageError
from swiftslurm.ops import storage_cli
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
