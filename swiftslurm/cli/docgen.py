"""`python -m swiftslurm.cli.docgen > docs/configuration.md`: the configuration reference, from the schemas.

`python -m swiftslurm.cli.docgen --blocks` rewrites, in README.md and docs/*.md, every block between
`<!-- docgen:NAME -->` and `<!-- /docgen -->` with BLOCKS[NAME]() (the config-group table of
getting-started.md: its options are conf/'s files, never a list typed by hand); tests/unit/test_docs.py fails
while one is stale.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from swiftslurm.planning import config

SECTIONS = [
    ("Top level", "", config.Config),
    ("`model/`", "model.", config.ModelConfig),
    ("`strategy/`", "strategy.", config.StrategyConfig),
    ("`task/`", "task.", config.TaskConfig),
    ("`cluster/`", "cluster.", config.ClusterConfig),
    ("`cluster.nccl`", "cluster.nccl.", config.NcclConfig),
    ("`resilience`", "resilience.", config.ResilienceConfig),
    ("`storage/`", "storage.", config.StorageConfig),
    ("`container/`", "container.", config.ContainerConfig),
]
REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"


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
# submitted); tests/data/bad_inputs/ holds one example or more of each.
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
    "- ms-swift settings with which a resumed run would not continue where it stopped (`save_only_model`,",
    "  `use_flash_ckpt`, `resume_only_model`; Megatron's `async_save`, `no_save_*`/`no_load_*`, `streaming`) and",
    "  ones ms-swift stops at start-up for (`packing` without flash attention, `streaming` without `max_steps`):",
    "  docs/resilience.md, 'What the adapters refuse';",
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
        "Generated from `swiftslurm/planning/config.py` by `python -m swiftslurm.cli.docgen`; do not edit by hand.",
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


# ------------------------------------------------------------------------------ blocks inside hand-written docs

# The groups a user chooses from, in the order a newcomer meets them: (group, how it is chosen).
GROUPS = [
    ("model", "model=NAME"),
    ("strategy", "strategy=NAME"),
    ("task", "task=NAME"),
    ("cluster", "+cluster=NAME"),
    ("storage", "storage=NAME"),
    ("container", "container=NAME"),
]


def defaults() -> dict[str, str]:
    """conf/config.yaml's default option of each group (`model: tiny`)."""
    entries = yaml.safe_load((CONF / "config.yaml").read_text())["defaults"]
    return {k: v for entry in entries if isinstance(entry, dict) for k, v in entry.items() if "/" not in k}


def option_summary(path: Path) -> str:
    """An option's first sentence, from the comment at the top of its YAML file; a model's hub id besides."""
    comment = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("# ").strip())
        if comment[-1].endswith((".", ":")):  # a sentence, or what introduces a command, ends here
            break
    sentence = re.split(r"(?<=\.)\s", " ".join(comment), maxsplit=1)[0].rstrip(":")
    model_id = yaml.safe_load(path.read_text()).get("id") if path.parent.name == "model" else None
    parts = [f"`{model_id}`" if model_id and model_id != "???" else "", sentence.replace("|", "\\|")]
    return ": ".join(p for p in parts if p)


def groups_table() -> str:
    chosen = defaults()
    lines = ["| choose with | what it is |", "|---|---|"]
    for group, how in GROUPS:
        for path in sorted((CONF / group).glob("*.yaml")):
            default = " (default)" if chosen.get(group) == path.stem else ""
            lines.append(f"| `{how.replace('NAME', path.stem)}`{default} | {option_summary(path)} |")
    recipes = ", ".join(f"`{p.stem}`" for p in sorted((CONF / "recipe").glob("*.yaml")))
    lines.append(f"| `+recipe=NAME` | a whole scenario ([recipes.md](recipes.md)): {recipes} |")
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {"config-groups": groups_table}
BLOCK = re.compile(r"(<!-- docgen:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /docgen -->)", re.S)


def with_blocks(text: str) -> str:
    """The doc with every generated block made current."""
    return BLOCK.sub(lambda m: m.group(1) + BLOCKS[m.group("name")]() + "\n" + m.group(4), text)


def docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


if __name__ == "__main__":
    if sys.argv[1:] == ["--blocks"]:
        for doc in docs():
            doc.write_text(with_blocks(doc.read_text()))
    else:
        print(render(), end="")
