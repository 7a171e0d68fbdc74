"""StorageSpec: the storage section of a plan, checked before anything reaches the object store (the store
itself, against SeaweedFS: tests/component/test_store.py)."""

from __future__ import annotations

import pytest

from swiftslurm.errors import StorageError
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
