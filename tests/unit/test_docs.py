"""Docs that are generated must match what generates them."""

from __future__ import annotations

import itertools
import re

from swiftslurm.cli import docgen
from swiftslurm.rundir import layout as rundir
from tests.conftest import REPO


def test_configuration_reference_is_current() -> None:
    current = (REPO / "docs" / "configuration.md").read_text()
    assert current == docgen.render(), "run: python -m swiftslurm.cli.docgen > docs/configuration.md"


# documented as their own sections
NESTED = {"model", "strategy", "task", "cluster", "nccl", "resilience", "storage", "container"}


def test_every_schema_field_is_documented() -> None:
    import dataclasses

    for _, _, schema in docgen.SECTIONS:
        for field in dataclasses.fields(schema):
            if field.name not in NESTED:
                assert field.metadata.get("doc"), f"{schema.__name__}.{field.name} has no doc"


def test_generated_blocks_in_the_docs_are_current() -> None:
    """Hand-written docs hold generated blocks (the config-group table): each must be what conf/ gives now."""
    found = []
    for doc in docgen.docs():
        text = doc.read_text()
        found += [(doc.name, m.group("name")) for m in docgen.BLOCK.finditer(text)]
        assert text == docgen.with_blocks(text), f"{doc.name} is stale: run python -m swiftslurm.cli.docgen --blocks"
    assert ("getting-started.md", "config-groups") in found


def test_the_config_group_table_lists_every_option_in_conf() -> None:
    table = docgen.groups_table()
    for group, how in docgen.GROUPS:
        for path in (REPO / "conf" / group).glob("*.yaml"):
            assert f"`{how.replace('NAME', path.stem)}`" in table, f"{group}/{path.stem} missing from the table"
    for recipe in (REPO / "conf" / "recipe").glob("*.yaml"):
        assert f"`{recipe.stem}`" in table


def table_after(doc: str, heading: str) -> list[str]:
    """The rows of the first table under a heading of a doc."""
    lines = (REPO / "docs" / doc).read_text().splitlines()
    start = lines.index(heading)
    rows = list(itertools.dropwhile(lambda line: not line.startswith("|"), lines[start:]))
    return list(itertools.takewhile(lambda line: line.startswith("|"), rows))[2:]


def test_the_recipe_table_lists_every_recipe_and_no_other() -> None:
    listed = {
        row.split("|")[1].strip().strip("`")
        for row in table_after("recipes.md", "# Recipes: the field-guide scenarios, with real models and real flags")
    }
    assert listed == {p.stem for p in (REPO / "conf" / "recipe").glob("*.yaml")}


def name_pattern(name: str) -> str:
    """A rundir.py name as the docs write it: `{node}` and SLURM's `%j` become `<...>`, a prefix may end in `*`."""
    return re.sub(r"\\\{\w+\\\}|%j", "<[^>]+>", re.escape(name)) + r"\*?"


RUN_DIR_NAMES = {k: v for k, v in vars(rundir).items() if k.isupper() and isinstance(v, str)}


def test_the_run_dir_table_names_every_file_rundir_names() -> None:
    rows = table_after("getting-started.md", "## The run directory")
    text = "\n".join(rows)
    missing = [k for k, v in RUN_DIR_NAMES.items() if not re.search(name_pattern(v), text)]
    assert not missing, f"docs/getting-started.md's run-dir table lacks rundir.{', rundir.'.join(missing)}"


def test_the_run_dir_table_names_no_file_rundir_does_not() -> None:
    patterns = [name_pattern(v) for v in RUN_DIR_NAMES.values()] + ["<attempt>"]
    rows = table_after("getting-started.md", "## The run directory")
    paths = [p for row in rows for p in re.findall(r"`([^`]+)`", row.split("|")[1])]
    unknown = [
        path
        for path in paths
        for part in path.strip("/").split("/")
        if not any(re.fullmatch(pattern, part) for pattern in patterns)
    ]
    assert not unknown, (
        f"docs/getting-started.md's run-dir table names what swiftslurm/rundir/layout.py does not: {unknown}"
    )
