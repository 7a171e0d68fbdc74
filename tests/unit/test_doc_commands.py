"""A walkthrough of README.md and docs/*.md: every `python -m swiftslurm ...` command in a code block runs as
documented, and prints what the doc shows it printing.

The commands are found in the docs themselves (a new one is tested the day it is written) and run in this
process, through the same entry as `python -m swiftslurm` (swiftslurm.__main__.main), in a fresh directory,
without SLURM: its commands are taken out of PATH, and the one SLURM seam (swiftslurm.slurm.runner) answers only
`squeue` and `sacct` about the docs' running example job, so nothing can be submitted. To make a command runnable
here, and only this:
- a run (Hydra overrides) gets `dry_run=true`: it is planned, validated and its run dir written, not submitted;
- an elided sweep (`-m ...`) is completed with SWEEP_FILL;
- a placeholder (PLACEHOLDERS: `RUN_DIR`, `runs/sweeps/<date>_<time>`, ...) becomes a fixture: a finished run
  dir, or a sweep dir holding it; a path the docs' status examples show (doc_fixtures.DOC_RUNS, DOC_SWEEPS)
  becomes that run's (that sweep's) records, written only for a command that names it;
- an optional argument written `[--timeout 60]` is passed.
Commands that cannot run without SLURM or object storage are listed in NOT_RUN with the test that runs them;
each entry must still match a command in the docs.

What a doc shows a command printing (OUTPUT, the convention):
- A ```text block is a terminal transcript. A line starting with `$ ` is a command (a trailing backslash
  continues it); the lines after it, up to the next `$ ` line or the block's end, are its output: stdout and
  stderr together, as a terminal shows them. A command in any other block shows no output, and a `$ ` command
  that is not swiftslurm's is not run. Text that is not a command's output (a record's content, a SLURM job's
  report) goes in a plain ``` block, never a ```text one.
- Every line shown must be printed, in the order shown; other lines may come between (a transcript may be an
  excerpt). A shown line that begins with `swiftslurm: error:` means exit status 2; otherwise it is 0.
- A shown line is compared as written, but for these differences (and no other), all in `pattern`:
  1. spacing: runs of spaces count as one, leading and trailing ones not at all (a table's column widths follow
     its widest cell);
  2. `…` stands for any text (what differs on the reader's machine: `…/runs/NAME`, the Python the nodes run);
     a line that is `…` alone marks lines left out;
  3. only in the transcripts MEASURED lists (a real run's `status`, whose records the fixture has but not its
     times): a share (`71%`) stands for any share, and in an indented line (the goodput ledger's rows: seconds,
     shares, waits) each number for any number. Job ids, steps, losses, speeds and counts are compared.
  Blank lines are not compared.
A failure names the doc file and line; `test_a_documented_command_runs` also changes each shown line and
checks that the walkthrough then fails on that line.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import re
import runpy
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from swiftslurm import slurm
from swiftslurm.cli import docgen
from swiftslurm.cli.help import COMMANDS as SUBCOMMANDS
from tests.conftest import REPO
from tests.unit.doc_fixtures import FIXTURE_RUN, FIXTURE_SWEEP, slurm_answering, write_fixtures

COMMAND = re.compile(r"(?:^|\s|/)python -m (swiftslurm(?:\.\w+)*)\b(.*)$")
PROMPT = "$ "
ANY = "…"  # in a shown line: any text (OUTPUT, 2)
SHARE = re.compile(r"-?\d+(?:\.\d+)?%")  # in a MEASURED transcript: a share of the run's time (OUTPUT, 3)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")  # in a MEASURED transcript's indented lines: the ledger's amounts
SWEEP_FILL = ["+cluster=a100x16", "seed=1,2"]
PLACEHOLDERS = {"RUN_DIR": FIXTURE_RUN, "RUN": FIXTURE_RUN, "PATH": FIXTURE_RUN, "SWEEP_DIR": FIXTURE_SWEEP}
PLACEHOLDERS |= {"runs/sweeps/<date>_<time>": FIXTURE_SWEEP}
# Module -> why it is not run here, and where it is.
NOT_RUN = {
    "swiftslurm.submit.preflight": "submits a checks-only SLURM job (tests/cluster/test_preflight.py)",
    "swiftslurm.ops.storage_cli": "needs the object store it names (the CLI: tests/component/test_store.py, SeaweedFS)",
}
# A transcript (its command's arguments) that shows a real run's output -> whose: its numbers are not compared
# (OUTPUT, 3), everything else is. The fixture has the run's records (doc_fixtures.DOC_RUNS), not its times.
MEASURED = {
    "status runs/tiny-sft-ddp-local-slurm": "tests/cluster/test_goodput.py's run, 2026-12-01 (its ledger, measured)",
    "status runs/sweeps/2026-12-01_10-00-00": "a sweep on the local cluster, one point running (goodput: until now)",
}


@dataclass(frozen=True)
class Shown:
    """One line a doc shows a command printing."""

    where: str  # doc file and line: `docs/operations.md:143`
    text: str


@dataclass(frozen=True)
class DocCommand:
    where: str  # doc file and line: `docs/operations.md:20`
    text: str  # as written
    module: str  # `swiftslurm`, or a submodule run with -m
    args: list[str]  # as the shell would pass them
    shown: tuple[Shown, ...] = ()  # its output, as the doc shows it (OUTPUT)

    @property
    def refused(self) -> bool:
        """The doc shows it refused: exit status 2."""
        return bool(self.shown) and self.shown[0].text.startswith("swiftslurm: error:")

    @property
    def measured(self) -> bool:
        return " ".join(self.args) in MEASURED


def doc_commands() -> list[DocCommand]:
    return [c for doc in docgen.docs() for c in commands_in(str(doc.relative_to(REPO)), doc.read_text())]


def commands_in(name: str, text: str) -> list[DocCommand]:
    """Every `python -m swiftslurm...` line inside a fenced code block of the doc ``name``, continuation lines
    joined, with the output its ```text transcript shows (OUTPUT). In a transcript only a `$ ` line is a command."""
    found, lines = [], text.splitlines()
    fenced, transcript, indent = False, False, 0
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced, transcript = not fenced, not fenced and line.strip() == "```text"
            indent = len(line) - len(line.lstrip())  # a block inside a list item is indented
            continue
        body = line[indent:]
        if not fenced or (transcript and not body.startswith(PROMPT)) or not (match := COMMAND.search(body)):
            continue
        args, j = match.group(2), i
        while args.rstrip().endswith("\\"):
            j += 1
            args = args.rstrip()[:-1] + " " + lines[j].strip()
        shown = output_after(name, lines, j + 1, indent) if transcript else ()
        module, argv = match.group(1), shlex.split(args, comments=True)
        found.append(DocCommand(f"{name}:{i + 1}", line.strip(), module, argv, shown))
    return found


def output_after(name: str, lines: Sequence[str], start: int, indent: int) -> tuple[Shown, ...]:
    """The transcript's lines from ``start`` up to the next command or the block's end, blank ones left out."""
    shown = []
    for k in range(start, len(lines)):
        body = lines[k][indent:]
        if body.startswith((PROMPT, "```")):
            break
        if body.strip():
            shown.append(Shown(f"{name}:{k + 1}", body))
    return tuple(shown)


@functools.lru_cache(maxsize=4096)
def pattern(line: str, measured: bool = False) -> re.Pattern[str]:
    """What a shown line matches, after `spacing` on both sides: the line itself, `…` any text, and in a
    ``measured`` transcript any share for each share, in an indented line any number for each number (OUTPUT)."""
    varies = (NUMBER if line.startswith(" ") else SHARE) if measured else None
    parts = []
    for piece in spacing(line).split(ANY):
        literal = varies.split(piece) if varies else [piece]
        parts.append((varies.pattern if varies else "").join(re.escape(text) for text in literal))
    return re.compile(".*".join(parts))


def spacing(line: str) -> str:
    return " ".join(line.split())


def mismatch(command: DocCommand, output: str) -> str | None:
    """None when the output holds every line the doc shows, in order (OUTPUT); else what is missing, naming the
    doc line, with the printed line closest to it."""
    printed = [spacing(line) for line in output.splitlines()]
    at = 0
    for shown in command.shown:
        if shown.text.strip() == ANY:
            continue
        wanted = pattern(shown.text, command.measured)
        found = next((k for k in range(at, len(printed)) if wanted.fullmatch(printed[k])), None)
        if found is None:
            said = "no such line is printed"
            if any(map(wanted.fullmatch, printed[:at])):
                said = f"`{command.text}` ({command.where}) prints it before the lines shown above it"
            close = difflib.get_close_matches(spacing(shown.text), printed[at:], n=1, cutoff=0) or ["(nothing)"]
            return f"{shown.where}: the doc shows `{spacing(shown.text)}`; {said}; closest: `{close[0]}`"
        at = found + 1
    return None


def with_a_word_changed(line: str) -> str:
    """The shown line with its first word that is compared as written (no `…`) replaced."""
    words = line.split(" ")
    k = next((k for k, word in enumerate(words) if word and ANY not in word), None)
    return line if k is None else " ".join([*words[:k], "‹changed›", *words[k + 1 :]])


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


def run_in_process(module: str, args: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """`python -m MODULE ARGS`, here, its stderr written where its stdout goes (as a terminal shows both): its
    exit status."""
    from swiftslurm.__main__ import main

    monkeypatch.setattr(sys, "argv", [module, *args])
    try:
        with contextlib.redirect_stderr(sys.stdout):
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
    args = runnable(command)
    monkeypatch.setattr(slurm, "runner", slurm_answering(write_fixtures(tmp_path, args)))
    code = run_in_process(command.module, args, monkeypatch)
    out, err = capfd.readouterr()
    output = out + err
    said = f"{command.where}: `{command.text}` (run as `{shlex.join(args)}`) exited {code}\n{output[-3000:]}"
    assert code == (2 if command.refused else 0), said
    missing = mismatch(command, output)
    assert missing is None, f"{missing}\n{said}"
    for line in command.shown:
        if line.text.strip() != ANY:
            changed = tuple(replace(s, text=with_a_word_changed(s.text)) if s == line else s for s in command.shown)
            failed = mismatch(replace(command, shown=changed), output) or ""
            assert failed.startswith(f"{line.where}: "), f"{line.where}: the walkthrough cannot fail on it: {failed}"


def test_the_docs_commands_are_found_and_every_one_not_run_is_still_documented() -> None:
    modules = {c.module for c in COMMANDS}
    assert set(NOT_RUN) <= modules, f"NOT_RUN names commands no doc shows any more: {set(NOT_RUN) - modules}"
    wheres = {c.where.split(":")[0] for c in COMMANDS}
    assert {"README.md", "docs/getting-started.md", "docs/operations.md"} <= wheres
    transcripts = {" ".join(c.args) for c in COMMANDS if c.shown}
    assert set(MEASURED) <= transcripts, f"MEASURED names outputs no doc shows any more: {set(MEASURED) - transcripts}"
    shown = {c.where.split(":")[0] for c in COMMANDS if c.shown}
    assert {"docs/cli.md", "docs/getting-started.md", "docs/memory.md", "docs/operations.md"} <= shown
    assert any(c.refused for c in COMMANDS)


def test_every_text_block_is_the_transcript_of_a_command() -> None:
    """Output shown in a ```text block with no `$ ` command would be shown and never checked (OUTPUT)."""
    for doc in docgen.docs():
        lines = doc.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() == "```text":
                first = next((body.strip() for body in lines[i + 1 :] if body.strip()), "")
                assert first.startswith(PROMPT), (
                    f"{doc.relative_to(REPO)}:{i + 1}: a ```text block is a transcript, its first line a `$ ` command "
                    "(other text goes in a plain ``` block)"
                )


EXAMPLE = """\
Some prose.

```text
$ python -m swiftslurm status runs/a
run  state     job
a    finished  7
…
1 run(s): 1 finished
```
"""
PRINTED = "run  state     job\na    finished  7\ngoodput ledger of a (1 job run(s)):\n1 run(s): 1 finished\n"


def test_a_changed_doc_line_fails_naming_the_doc_file_and_line() -> None:
    (command,) = commands_in("docs/example.md", EXAMPLE)
    assert command.args == ["status", "runs/a"] and command.shown[0].where == "docs/example.md:5"
    assert mismatch(command, PRINTED) is None
    changed = commands_in("docs/example.md", EXAMPLE.replace("finished  7", "failed  7"))[0]
    said = mismatch(changed, PRINTED) or ""
    assert said.startswith("docs/example.md:6: the doc shows `a failed 7`") and "closest: `a finished 7`" in said
    swapped = commands_in(
        "docs/example.md", EXAMPLE.replace("run  state     job\na    finished  7", "a finished 7\nrun state job")
    )[0]
    assert (mismatch(swapped, PRINTED) or "").startswith("docs/example.md:6: the doc shows `run state job`; `")


def test_measured_numbers_vary_only_in_measured_transcripts_and_an_ellipsis_is_any_text() -> None:
    assert pattern("a    finished  7").fullmatch("a finished 7")
    assert not pattern("a finished 7").fullmatch("a finished 8")
    assert pattern("a finished 7 71%", measured=True).fullmatch("a finished 7 48%")
    assert not pattern("a finished 7 71%", measured=True).fullmatch("a finished 139 48%")
    assert pattern("  start-up 13 3.2%", measured=True).fullmatch("start-up 12 1.7%")
    assert not pattern("  start-up 13 3.2%", measured=True).fullmatch("restore 12 1.7%")
    assert pattern("run dir …/runs/a").fullmatch("run dir /tmp/x/runs/a")
    assert not pattern("run dir …/runs/a").fullmatch("run dir /tmp/x/runs/b")
    assert with_a_word_changed("…/swift sft \\") == "…/swift ‹changed› \\"
    assert with_a_word_changed("…") == "…"
