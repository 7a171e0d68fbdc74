"""Docs that are generated must match what generates them."""

from __future__ import annotations

from swiftslurm import docgen
from tests.conftest import REPO


def test_configuration_reference_is_current() -> None:
    current = (REPO / "docs" / "configuration.md").read_text()
    assert current == docgen.render(), "run: python -m swiftslurm.docgen > docs/configuration.md"


NESTED = {"model", "strategy", "task", "cluster", "nccl", "resilience", "storage"}  # documented as their own sections


def test_every_schema_field_is_documented() -> None:
    import dataclasses

    for _, _, schema in docgen.SECTIONS:
        for field in dataclasses.fields(schema):
            if field.name not in NESTED:
                assert field.metadata.get("doc"), f"{schema.__name__}.{field.name} has no doc"
