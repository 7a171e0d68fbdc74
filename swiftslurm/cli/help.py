"""`python -m swiftslurm --help`: the commands, the common settings and examples, written in this one place.

The command line prints `render()`; docs/cli.md is the same text (`python -m swiftslurm.cli.help > docs/cli.md`,
checked by tests/component/test_cli_help.py). The group options are read from conf/, so a new model or cluster is
listed without editing this file. Hydra's own help (its flags, the composed config) stays at `--hydra-help`.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

CONF = Path(__file__).resolve().parents[2] / "conf"

# Subcommand -> (module whose main() runs it, one line of help). ops.main reads its own subcommand name.
COMMANDS: dict[str, tuple[str, str]] = {
    "status": (
        "swiftslurm.ops.status",
        "runs' state, steps, loss, goodput: a run dir, a sweep dir or a folder of runs",
    ),
    "logs": (
        "swiftslurm.ops.control",
        "a run's node and wrapper logs; -f follows them, across requeues, until the run ends",
    ),
    "cancel": (
        "swiftslurm.ops.control",
        "stop a run (or every point of a sweep dir) for good, saving the current step",
    ),
    "resume": (
        "swiftslurm.ops.control",
        "submit a stopped run (or a sweep's unfinished points) again, from its checkpoint",
    ),
    "preflight": ("swiftslurm.submit.preflight", "run the pre-launch checks on a prepared run dir's allocation"),
    "advise": ("swiftslurm.ops.advise", "each strategy's estimated GPU memory for a run's settings, best first"),
}
HELP_FLAGS = ("-h", "--help")


def _options(group: str) -> str:
    return ", ".join(sorted(p.stem for p in (CONF / group).glob("*.yaml")))


def _settings() -> list[tuple[str, str]]:
    return [
        ("model=NAME", f"the model (default tiny): {_options('model')}"),
        ("strategy=NAME", f"how it is sharded (default ddp): {_options('strategy')}"),
        ("task=NAME", f"what is trained (default sft): {_options('task')}"),
        ("+cluster=NAME", f"where it runs (default: this machine): {_options('cluster')}"),
        ("+recipe=NAME", f"a whole field-guide scenario: {_options('recipe')}"),
        ("dataset=[ID,...]", "hub ids or absolute paths; every model but tiny must name its data"),
        ("swift.ARG=VALUE", "any ms-swift argument, e.g. swift.learning_rate=1e-4 swift.max_steps=100"),
        ("run_dir=PATH", "where the run lives (default runs/RUN_NAME); the same run dir resumes the run"),
        ("dry_run=true", "print the plan, sbatch script, node environment and command; submit nothing"),
        ("wait=true", "wait for the job (or every point of a sweep) and print the result"),
        ("-m A=x,y B=u,v", "a sweep: one run per combination (array_parallelism=N: one job array)"),
    ]


EXAMPLES = [
    ("python -m swiftslurm", "the default: the tiny model, LoRA, on this CPU"),
    (
        "python -m swiftslurm +cluster=a100x16 model=qwen3-8b strategy=zero3 "
        "dataset=[AI-ModelScope/alpaca-gpt4-data-en] dry_run=true",
        "",
    ),
    ("python -m swiftslurm +recipe=a100x16-zero3-lora swift.learning_rate=1e-4 dry_run=true", ""),
    ("python -m swiftslurm +cluster=local-slurm wait=true", "a 2-node job on the local SLURM cluster"),
    ("python -m swiftslurm -m +cluster=local-slurm swift.learning_rate=1e-4,2e-4 strategy=ddp,zero2", "a sweep"),
    ("python -m swiftslurm status RUN_DIR --json", "also SWEEP_DIR, --plot"),
    ("python -m swiftslurm logs -f RUN_DIR", ""),
    ("python -m swiftslurm cancel RUN_DIR", "then: resume RUN_DIR"),
]


def _table(rows: list[tuple[str, str]], width: int) -> list[str]:
    """Two columns; a long right column wraps under itself (the text stays under 100 columns)."""
    lines = []
    for left, right in rows:
        wrapped = textwrap.wrap(right, 96 - width, break_on_hyphens=False) or [""]
        lines.append(f"  {left:<{width}}  {wrapped[0]}".rstrip())
        lines += [f"  {'':<{width}}  {more}" for more in wrapped[1:]]
    return lines


def render() -> str:
    """The help text: usage, one line per subcommand, the common settings, examples, where the rest is."""
    commands = [(name, text) for name, (_, text) in COMMANDS.items()]
    examples = [(f"{command}  # {note}" if note else command, "") for command, note in EXAMPLES]
    lines = [
        "usage: python -m swiftslurm [KEY=VALUE ...]     plan one run, write its run dir, submit it",
        "   or: python -m swiftslurm -m [KEY=A,B ...]    a sweep: one run per combination",
        "   or: python -m swiftslurm COMMAND ARGS        operate runs (COMMAND --help: its options)",
        "",
        "commands:",
        *_table(commands, 9),
        "",
        "common settings (all: docs/configuration.md, or `python -m swiftslurm --cfg job`):",
        *_table(_settings(), 16),
        "",
        "examples:",
        *[f"  {command}" for command, _ in examples],
        "",
        "Bad input is refused before anything is written, with one line naming the fix (exit status 2).",
        "Hydra's own help (its flags, the composed config): python -m swiftslurm --hydra-help",
    ]
    return "\n".join(lines) + "\n"


def doc() -> str:
    """docs/cli.md: the same text as `--help`, under a title."""
    head = [
        "# The command line",
        "",
        "`python -m swiftslurm --help` prints the text below (generated from `swiftslurm/cli/help.py` by",
        "`python -m swiftslurm.cli.help > docs/cli.md`; do not edit by hand). Each command has its own",
        "`--help`; docs/operations.md covers status, logs, cancel, resume and preflight, docs/configuration.md",
        "every setting.",
        "",
        "```text",
        "$ python -m swiftslurm --help",
    ]
    return "\n".join(head) + "\n" + render() + "```\n"


if __name__ == "__main__":
    print(doc(), end="")
