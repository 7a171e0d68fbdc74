"""`python -m swiftslurm --help` lists the commands, the common settings and examples; docs/cli.md is that text;
a mistyped command is named as one."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from swiftslurm.cli import help as cli_help
from swiftslurm.testing.cli import swiftslurm
from tests.conftest import REPO


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_command_the_common_settings_and_examples(tmp_path: Path, flag: str) -> None:
    done = swiftslurm(flag, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == cli_help.render()
    assert "Powered by Hydra" not in done.stdout
    for command in ("status", "logs", "cancel", "resume", "preflight"):
        assert f"\n  {command} " in done.stdout
    for setting in ("model=", "strategy=", "+cluster=", "+recipe=", "swift.", "dry_run=true", "wait=true", "-m "):
        assert setting in done.stdout
    assert "examples:" in done.stdout and "--hydra-help" in done.stdout


def test_the_cli_doc_is_the_help_output() -> None:
    current = (REPO / "docs" / "cli.md").read_text()
    assert current == cli_help.doc(), "run: python -m swiftslurm.cli.help > docs/cli.md"
    assert cli_help.render() in current


def test_the_dry_run_examples_of_the_help_plan(tmp_path: Path) -> None:
    examples = [command for command, _ in cli_help.EXAMPLES if "dry_run=true" in command]
    assert examples
    for i, command in enumerate(examples):
        args = shlex.split(command)[3:]  # after `python -m swiftslurm`
        done = swiftslurm(*args, f"run_dir={tmp_path / str(i)}", cwd=tmp_path)
        assert done.returncode == 0, f"{command}: {done.stderr}"


@pytest.mark.parametrize(("typed", "meant"), [("stauts", "status"), ("lgos", "logs"), ("cancle", "cancel")])
def test_a_mistyped_command_is_named_with_the_command_it_meant(tmp_path: Path, typed: str, meant: str) -> None:
    done = swiftslurm(typed, "runs", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == f"swiftslurm: error: unknown command '{typed}'; did you mean `{meant}`?\n"
    assert not (tmp_path / "runs").exists()


def test_a_bare_word_far_from_every_command_lists_them(tmp_path: Path) -> None:
    done = swiftslurm("train", cwd=tmp_path)
    assert done.returncode == 2
    assert "unknown command 'train'" in done.stderr and "status, logs, cancel, resume, preflight" in done.stderr
    assert "--help" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", list(cli_help.COMMANDS))
def test_every_command_keeps_its_own_help(tmp_path: Path, command: str) -> None:
    done = swiftslurm(command, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:") and done.stdout != cli_help.render()


def test_hydras_own_help_stays_reachable(tmp_path: Path) -> None:
    done = swiftslurm("--hydra-help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Hydra" in done.stdout and "--cfg" in done.stdout
