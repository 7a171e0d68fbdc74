"""Strings bound for SLURM and S3 (issue 27, item 5) where the corpus (tests/data/bad_inputs/27-strings.yaml)
cannot reach: the submission's partition check, and the S3 naming rules' own table."""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftslurm import slurm as slurm_cli
from swiftslurm.errors import SubmitError
from swiftslurm.storage import naming
from swiftslurm.submit.jobs import check_cluster
from tests.conftest import plan_for


def test_a_partition_list_is_submitted_when_every_partition_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm_cli, "partitions", lambda: {"gpu", "gpu-long"})
    check_cluster(plan_for("+cluster=local-slurm", 'cluster.partition="gpu,gpu-long"', f"run_dir={tmp_path}"))
    plan = plan_for("+cluster=local-slurm", 'cluster.partition="gpu,nosuch"', f"run_dir={tmp_path}")
    with pytest.raises(SubmitError, match="'nosuch' does not exist"):
        check_cluster(plan)


@pytest.mark.parametrize(
    ("bucket", "ok"),
    [
        ("ckpt", True),
        ("my.bucket.name", True),
        ("a-1", True),
        ("x" * 63, True),
        ("ab", False),
        ("x" * 64, False),
        ("My_Bucket", False),
        ("-ckpt", False),
        ("ckpt.", False),
        ("a..b", False),
        ("192.168.1.1", False),
        ("xn--ckpt", False),
        ("ckpt-s3alias", False),
    ],
)
def test_bucket_names_follow_s3s_rules(bucket: str, ok: bool) -> None:
    assert (naming.bucket_refusal(bucket) is None) == ok


@pytest.mark.parametrize(
    ("check", "value"),
    [
        (naming.bucket_refusal, "My_Bucket"),
        (naming.bucket_refusal, "s3://ckpt/team/x"),
        (naming.endpoint_refusal, "http://s3:0"),
        (naming.endpoint_refusal, "http://s3:99999"),
        (naming.endpoint_refusal, "https://[::1]:abc"),
        (naming.prefix_refusal, "/team/x"),
        (naming.prefix_refusal, "team//x/../y"),
    ],
)
def test_every_storage_hint_proposes_a_value_that_passes(check: object, value: str) -> None:
    """The HINT's `storage.X=VALUE` words, checked again by the same rule."""
    message = check(value)  # type: ignore[operator]
    assert message is not None
    hint = message.split("HINT: ", 1)[1]
    proposed = [w.rstrip(".,") for w in hint.split() if w.startswith("storage.") and "=" in w]
    assert proposed, message
    for word in proposed:
        field, _, fixed = word.partition("=")
        rule = {"storage.bucket": naming.bucket_refusal, "storage.endpoint_url": naming.endpoint_refusal}
        assert rule.get(field, naming.prefix_refusal)(fixed) is None, (word, message)
