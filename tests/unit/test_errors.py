"""One formatter for what a command says when it refuses: `swiftslurm: error: <message> HINT: <fix>`, in one
write, with the error's exit status; library code raises, only entry points print and exit."""

from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest

from swiftslurm.errors import (
    USER_ERROR,
    ConfigError,
    NodeError,
    RunFailed,
    StorageError,
    SubmitError,
    SwiftSlurmError,
    format_error,
    report,
)

PACKAGE = Path(__file__).resolve().parents[2] / "swiftslurm"


class Writes(io.StringIO):
    """A stream that remembers each write() call, as a pipe's reader would see them arrive."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


@pytest.mark.parametrize(
    ("err", "line"),
    [
        (ConfigError("cluster.nodes=0 is not 1 or more. HINT: set cluster.nodes=1."), "cluster.nodes=0 is not"),
        (NodeError("  plan.json does not exist.\n"), "plan.json does not exist."),
        ("unknown command 'stauts'; did you mean `status`?", "unknown command 'stauts'; did you mean `status`?"),
        (KeyError(), "KeyError"),
    ],
    ids=["typed", "padded", "text", "no message"],
)
def test_an_error_is_one_line_with_the_prefix_and_its_hint_at_the_end(err: BaseException | str, line: str) -> None:
    formatted = format_error(err)
    assert formatted.startswith(f"swiftslurm: error: {line}") and "\n" not in formatted
    if isinstance(err, ConfigError):
        assert formatted.endswith("HINT: set cluster.nodes=1.")


@pytest.mark.parametrize(
    ("err", "status"),
    [
        (ConfigError("x"), 2),
        (SubmitError("x"), 2),
        (StorageError("x"), 2),
        (NodeError("x"), 2),
        ("x", 2),
        (RunFailed("job 5 failed"), 1),
    ],
)
def test_a_refusal_exits_2_and_a_failed_run_1(err: SwiftSlurmError | str, status: int) -> None:
    assert report(err, Writes()) == status
    assert USER_ERROR == 2


def test_the_line_arrives_in_one_write_newline_included() -> None:
    """print() writes the text and its newline apart; srun's own error line could land between them."""
    stream = Writes()
    report(SubmitError("sbatch refused the job. HINT: check cluster.partition."), stream)
    assert stream.calls == ["swiftslurm: error: sbatch refused the job. HINT: check cluster.partition.\n"]


def test_report_writes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    report(ConfigError("bad"))
    assert capsys.readouterr() == ("", "swiftslurm: error: bad\n")


def _string_constants(tree: ast.AST) -> list[tuple[str, int]]:
    return [(n.value, n.lineno) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_only_errors_py_spells_the_prefix() -> None:
    """cli/docgen.py describes it to the reader of docs/configuration.md; it prints nothing."""
    allowed = {PACKAGE / "errors.py", PACKAGE / "cli" / "docgen.py"}
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in allowed
        for text, line in _string_constants(ast.parse(path.read_text()))
        if "swiftslurm: error" in text
    ]
    assert found == [], "print with swiftslurm.errors.report instead:\n" + "\n".join(found)


def _is_main_guard(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test)


def _exits(tree: ast.AST, under_guard: bool = False) -> list[tuple[int, bool]]:
    """Each `sys.exit(...)` call: its line, and whether it sits under `if __name__ == "__main__":`."""
    found = []
    for node in ast.iter_child_nodes(tree):
        guarded = under_guard or _is_main_guard(node)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.exit":
            found.append((node.lineno, guarded))
        found.extend(_exits(node, guarded))
    return found


def test_library_code_never_exits() -> None:
    """Only a command's entry (a `__main__.py`, or a module's `if __name__ == "__main__":`) ends the process."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "__main__.py"
        for line, guarded in _exits(ast.parse(path.read_text()))
        if not guarded
    ]
    assert found == [], "raise a SwiftSlurmError instead:\n" + "\n".join(found)
