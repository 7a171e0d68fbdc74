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


# What the command line refuses (exit status 2, one line naming the setting and the fix, nothing written or
# submitted); tests/data/bad_inputs.yaml holds one example or more of each.
REFUSED = [
    "## What is refused before anything is written",
    "",
    "`python -m swiftslurm ...` plans the whole run before it writes the run dir or calls sbatch. A mistake ends it",
    "with exit status 2 and one line, `swiftslurm: error: <setting> ... HINT: <fix>`, and nothing written:",
    "",
    "- keys the schema lacks, also when added with `+`/`++` (only `swift.*`, `cluster.env.*` and `cluster.sbatch.*`",
    "  take new keys); command-line flags other than Hydra's (`--dry-run`: write `dry_run=true`);",
    "- Hydra's own errors: an override without `=`, unclosed brackets or unquoted special characters (quote the",
    "  value: `'swift.system=\"a; b\"'`), a value of the wrong type, an unknown group option, `cluster=X` without",
    "  `+`, several values without `-m`, an unset `${oc.env:VAR}` or a `${...}` naming no setting;",
    "- ms-swift arguments the installed ms-swift lacks, and values its parser would refuse: the type and choices",
    "  of its argument dataclasses are recorded in `swiftslurm/data/swift_args-<version>.json`;",
    "- `swift.*` copies of what swiftslurm plans (batch sizes, parallel degrees, seed, dataset, output dir) and",
    "  `cluster.sbatch.*` copies of the `#SBATCH` options it writes (`nodes`, `time`, `signal`, `output`, ...);",
    "- negative or zero counts and sizes, layouts that do not tile the GPUs, batch sizes that are not a whole",
    "  number of micro-batches, SLURM times it cannot read (`UNLIMITED` is accepted), a `signal_lead_s` past the",
    "  limit, `master_port_base` whose ports would pass 65535;",
    "- a model other than `tiny` with no `dataset=` (the built-in tiny data is the tiny model's default only);",
    "- relative paths (ms-swift runs in the run dir, other nodes elsewhere) and absolute ones missing on a",
    "  filesystem this machine sees; credentials anywhere in the config; invalid storage settings;",
    "- a run dir that is a file, cannot be created, or holds an unreadable or different plan.json.",
    "",
    "A sweep (`-m`) is planned point by point: a point refused after others were planned leaves those run dirs.",
    "A job-array sbatch that fails exits 2 and names the points not submitted; the same command submits them.",
    "",
]


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
        *REFUSED,
        "## `recipe/`",
        "",
        "Whole scenarios (see docs/recipes.md): " + ", ".join(f"`{r}`" for r in recipes) + ".",
    ]
    return "\n".join([*head, *body, *tail]) + "\n"


if __name__ == "__main__":
    print(render(), end="")
