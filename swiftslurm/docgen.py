"""`python -m swiftslurm.docgen > docs/configuration.md`: the configuration reference, from the schemas."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

from swiftslurm import config

SECTIONS = [
    ("Top level", "", config.Config),
    ("`model/`", "model.", config.ModelConfig),
    ("`strategy/`", "strategy.", config.StrategyConfig),
    ("`task/`", "task.", config.TaskConfig),
    ("`cluster/`", "cluster.", config.ClusterConfig),
    ("`cluster.nccl`", "cluster.nccl.", config.NcclConfig),
    ("`resilience`", "resilience.", config.ResilienceConfig),
    ("`storage/`", "storage.", config.StorageConfig),
]
CONF = Path(__file__).resolve().parents[1] / "conf"


def _default(f: dataclasses.Field[object]) -> str:
    if f.default is not dataclasses.MISSING:
        return "required" if f.default == "???" else f"`{f.default!r}`".replace("None", "null")
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return "" if dataclasses.is_dataclass(value) else f"`{value!r}`"
    return "required"


def section(title: str, prefix: str, schema: type) -> list[str]:
    lines = [
        f"## {title}",
        "",
        " ".join(inspect.cleandoc(schema.__doc__ or "").split()),
        "",
        "| key | default | meaning |",
        "|---|---|---|",
    ]
    for f in dataclasses.fields(schema):
        text = f.metadata.get("doc")
        if text:
            lines.append(f"| `{prefix}{f.name}` | {_default(f)} | {text} |")
    group = prefix.rstrip(".")
    options = sorted(p.stem for p in (CONF / group).glob("*.yaml")) if group and "." not in group else []
    if options:
        lines += ["", "Options: " + ", ".join(f"`{o}`" for o in options) + "."]
    return [*lines, ""]


def render() -> str:
    head = [
        "# Configuration reference",
        "",
        "Generated from `swiftslurm/config.py` by `python -m swiftslurm.docgen`; do not edit by hand.",
        "Choose group options with `group=option` (`+cluster=NAME` for clusters, `+recipe=NAME` for recipes),",
        "set any field with `key=value`, and pass any ms-swift argument as `swift.<argument>=<value>`.",
        "",
    ]
    body = [line for title, prefix, schema in SECTIONS for line in section(title, prefix, schema)]
    recipes = sorted(p.stem for p in (CONF / "recipe").glob("*.yaml"))
    tail = [
        "## `recipe/`",
        "",
        "Whole scenarios (see docs/recipes.md): " + ", ".join(f"`{r}`" for r in recipes) + ".",
    ]
    return "\n".join([*head, *body, *tail]) + "\n"


if __name__ == "__main__":
    print(render(), end="")
