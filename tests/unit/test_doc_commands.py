"""Every `python -m swiftslurm ...` command in a code block of README.md and docs/*.md runs as documented.

The commands are found in the docs themselves (a new one is tested the day it is written) and run in this
process, through the same entry as `python -m swiftslurm` (swiftslurm.__main__.main), in a fresh directory,
without SLURM: its commands are taken out of PATH, so nothing can be submitted. To make a command runnable
here, and only this:
- a run (Hydra overrides) gets `dry_run=true`: it is planned, validated and its run dir written, not submitted;
- an elided sweep (`-m ...`) is completed with SWEEP_FILL;
- a placeholder (PLACEHOLDERS: `RUN_DIR`, `runs/sweeps/<date>_<time>`, ...) becomes a fixture: a finished run
  dir, or a sweep dir holding it;
- an optional argument written `[--timeout 60]` is passed;
- a command shown with its answer (`swiftslurm: error: ...` on the next line) must exit 2 with that answer.
Commands that cannot run without SLURM or object storage are listed in NOT_RUN with the test that runs them;
each entry must still match a command in the docs.
A failure names the doc file and line.
"""

from __future__ import annotations

import json
import re
import runpy
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import commit
from swiftslurm.cli import docgen
from swiftslurm.cli.help import COMMANDS as SUBCOMMANDS
from swiftslurm.rundir.sweepdir import record_points
from tests.conftest import REPO

COMMAND = re.compile(r"(?:^|\s|/)python -m (swiftslurm(?:\.\w+)*)\b(.*)$")
SWEEP_FILL = ["+cluster=a100x16", "seed=1,2"]
FIXTURE_RUN = "runs/finished"
FIXTURE_SWEEP = "runs/sweeps/2026-01-01_00-00-00"
PLACEHOLDERS = {"RUN_DIR": FIXTURE_RUN, "RUN": FIXTURE_RUN, "PATH": FIXTURE_RUN, "SWEEP_DIR": FIXTURE_SWEEP}
PLACEHOLDERS |= {"runs/sweeps/<date>_<time>": FIXTURE_SWEEP}
# Module -> why it is not run here, and where it is.
NOT_RUN = {
    "swiftslurm.submit.preflight": "submits a checks-only SLURM job (tests/cluster/test_preflight.py)",
    "swiftslurm.ops.storage_cli": "needs the object store it names (the CLI: tests/component/test_store.py, SeaweedFS)",
}


@dataclass(frozen=True)
class DocCommand:
    where: str  # doc file and line: `docs/operations.md:20`
    text: str  # as written
    module: str  # `swiftslurm`, or a submodule run with -m
    args: list[str]  # as the shell would pass them
    answer: str | None  # the error line the doc shows after it, if any


def doc_commands() -> list[DocCommand]:
    """Every `python -m swiftslurm...` line inside a fenced code block, continuation lines joined. In a ```text
    block (output shown, e.g. `--help`'s usage lines in docs/cli.md) only a line after a `$ ` prompt is one."""
    found = []
    for doc in docgen.docs():
        lines, fenced, shown = doc.read_text().splitlines(), False, False
        for i, line in enumerate(lines):
            if line.lstrip().startswith("```"):
                fenced, shown = not fenced, line.strip() == "```text"
                continue
            if not fenced or (shown and not line.startswith("$ ")) or not (match := COMMAND.search(line)):
                continue
            text, j = match.group(2), i
            while text.rstrip().endswith("\\"):
                j += 1
                text = text.rstrip()[:-1] + " " + lines[j].strip()
            after = lines[j + 1] if j + 1 < len(lines) else ""
            answer = after if after.startswith("swiftslurm: error:") else None
            where = f"{doc.relative_to(REPO)}:{i + 1}"
            found.append(DocCommand(where, line.strip(), match.group(1), shlex.split(text, comments=True), answer))
    return found


COMMANDS = doc_commands()


def runnable(command: DocCommand) -> list[str]:
    """The command's arguments, made runnable here as the module docstring says."""
    args = [optional(PLACEHOLDERS.get(a, a)) for a in command.args]
    if command.module != "swiftslurm" or (args and args[0] in SUBCOMMANDS):  # `status RUN_DIR`: not a run
        return args
    if "..." in args:
        args[args.index("...") : args.index("...") + 1] = SWEEP_FILL
    return args if "dry_run=true" in args else [*args, "dry_run=true"]


def optional(arg: str) -> str:
    """`[--timeout` and `60]` (an optional argument, as usage lines write it) pass; `dataset=[a,b]` is left alone."""
    return arg.removeprefix("[") if "]" not in arg else arg.removesuffix("]") if "[" not in arg else arg


def finished_run(run_dir: Path) -> None:
    """A run that trained 2 steps and finished: status.json, a committed checkpoint, ms-swift's records, a log."""
    (run_dir / "output").mkdir(parents=True)
    plan = {
        "run_name": run_dir.name,
        "topology": {"nodes": 1},
        "batch": {"micro": 1, "grad_accum": 1, "data_parallel": 1},
    }
    (run_dir / "plan.json").write_text(json.dumps(plan))
    steps = [{"loss": 2.0 - i / 2, "global_step/max_steps": f"{i + 1}/2", "train_speed(s/it)": 0.5} for i in range(2)]
    (run_dir / "output" / "logging.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    checkpoint = run_dir / "output" / "checkpoint-2"
    checkpoint.mkdir()
    (checkpoint / "adapter.bin").write_bytes(b"w")
    commit(checkpoint, world_size=1, swift_version="test")
    (run_dir / "logs" / "1").mkdir(parents=True)
    (run_dir / "logs" / "1" / "node0.log").write_text("{'loss': 1.5, 'global_step/max_steps': '2/2'}\n")
    (run_dir / "status.json").write_text(json.dumps({"state": "finished", "why": "trained every step"}))


def run_in_process(module: str, args: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """`python -m MODULE ARGS`, here: its exit status."""
    from swiftslurm.__main__ import main

    monkeypatch.setattr(sys, "argv", [module, *args])
    try:
        if module == "swiftslurm":
            main()
        else:
            runpy.run_module(module, run_name="__main__")
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    return 0


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_a_documented_command_runs(
    command: DocCommand, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    if command.module in NOT_RUN:
        pytest.skip(f"{command.where}: {NOT_RUN[command.module]}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SWIFTSLURM_RUNS", raising=False)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # no sbatch, squeue, sacct, scancel here
    finished_run(tmp_path / FIXTURE_RUN)
    record_points(tmp_path / FIXTURE_SWEEP, [{"num": 0, "run_dir": str(tmp_path / FIXTURE_RUN), "action": "planned"}])
    args = runnable(command)
    code = run_in_process(command.module, args, monkeypatch)
    out, err = capfd.readouterr()
    said = f"{command.where}: `{command.text}` (run as `{shlex.join(args)}`) exited {code}\n{out[-1500:]}{err[-1500:]}"
    if command.answer is not None:
        assert code == 2 and command.answer in err, said
    else:
        assert code == 0, said


def test_the_docs_commands_are_found_and_every_one_not_run_is_still_documented() -> None:
    modules = {c.module for c in COMMANDS}
    assert set(NOT_RUN) <= modules, f"NOT_RUN names commands no doc shows any more: {set(NOT_RUN) - modules}"
    wheres = {c.where.split(":")[0] for c in COMMANDS}
    assert {"README.md", "docs/getting-started.md", "docs/operations.md"} <= wheres
    assert any(c.answer for c in COMMANDS)
